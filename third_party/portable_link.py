#!/usr/bin/python3
"""The link of a portable artifact (third_party/portable.bzl): the `ucp` binary or a
wheel's extension module, needing of the system it runs on only glibc's libraries
(libc, libm, libpthread, libdl, librt) and libgcc_s.

    portable_link.py --out FILE [--shared] [--version-script FILE] [--sysroot DIR]
        [--archive A.a | --whole-archive A.a]... [--link-flag=FLAG]... [--extra FLAG]...

- Our code: the archives of the Bazel targets, in their order (dependents first),
  inside one --start-group; --whole-archive for `alwayslink` ones.
- The system libraries the targets ask for with `-lNAME` (Abseil, protobuf, xxhash,
  RapidCheck) become Debian's static archives /usr/lib/x86_64-linux-gnu/libNAME.a,
  plus libz.a (protobuf's gzip streams); glibc's own (-lpthread, -lm, -ldl, -lrt)
  stay shared. Any other flag from a target is refused: it would be silently lost.
- libstdc++ linked in statically (-Bstatic -lstdc++); a shared object exports only
  what its version script lists (the extension: PyInit__core).
- --sysroot: glibc's start files and libraries from that folder (an old Debian
  release's, see make_sysroot.sh) instead of the host's, so the symbol versions the
  output needs are at most that release's. gcc's own search paths still name the
  host's library folder, so the sysroot's folders come first (-B, -L).
"""

import argparse
import os
import subprocess
import sys

SYSTEM_LIBDIR = "/usr/lib/x86_64-linux-gnu"
GLIBC_LIBS = {"pthread", "m", "dl", "rt", "c"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shared", action="store_true")
    p.add_argument("--version-script")
    p.add_argument("--sysroot")
    p.add_argument("--archive", action="append", default=[])
    p.add_argument("--whole-archive", action="append", default=[])
    p.add_argument("--link-flag", action="append", default=[])
    p.add_argument("--extra", action="append", default=[])
    args = p.parse_args()

    static_libs, glibc_libs = [], []
    for flag in args.link_flag:
        if flag.startswith("-L"):
            continue  # search paths of the shared libraries we replace
        if not flag.startswith("-l"):
            sys.exit(f"portable_link: unexpected link flag {flag!r} from a dependency (only -lNAME is understood)")
        name = flag[2:]
        if name in GLIBC_LIBS:
            if name not in glibc_libs:
                glibc_libs.append(name)
            continue
        archive = os.path.join(SYSTEM_LIBDIR, f"lib{name}.a")
        if not os.path.exists(archive):
            sys.exit(f"portable_link: {flag} has no static archive {archive} to link in")
        static_libs.append(archive)
    if any(os.path.basename(a) == "libprotobuf.a" for a in static_libs):
        static_libs.append(os.path.join(SYSTEM_LIBDIR, "libz.a"))

    cmd = ["gcc", "-o", args.out, "-fuse-ld=gold", "-Wl,-S", "-Wl,-z,relro,-z,now", "-Wl,--as-needed"]
    if args.shared:
        cmd.append("-shared")
        # What the shared object exports: the version script's list, else nothing
        # from an archive (our code is archives too, so a version script is what
        # exports an entry point such as PyInit__core).
        if args.version_script:
            cmd.append(f"-Wl,--version-script={args.version_script}")
        else:
            cmd.append("-Wl,--exclude-libs=ALL")
    elif args.version_script:
        sys.exit("portable_link: --version-script is for shared objects")
    if args.sysroot:
        root = os.path.abspath(args.sysroot)
        lib = os.path.join(root, "usr/lib/x86_64-linux-gnu")
        cmd += [f"--sysroot={root}", f"-B{lib}/", f"-L{lib}", f"-L{os.path.join(root, 'lib/x86_64-linux-gnu')}"]
    # glibc_compat.c's log2 of version GLIBC_2.2.5.
    cmd += ["-Wl,--wrap=log2"] + args.extra
    if args.whole_archive:
        cmd += ["-Wl,--whole-archive"] + args.whole_archive + ["-Wl,--no-whole-archive"]
    cmd += ["-Wl,--start-group"] + args.archive + static_libs + ["-Wl,--end-group"]
    cmd += ["-Wl,-Bstatic", "-lstdc++", "-Wl,-Bdynamic"]
    cmd += [f"-l{name}" for name in glibc_libs + ["m", "pthread", "dl"] if f"-l{name}" not in cmd]
    res = subprocess.run(cmd)
    if res.returncode != 0:
        print("portable_link: failed: " + " ".join(cmd), file=sys.stderr)
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
