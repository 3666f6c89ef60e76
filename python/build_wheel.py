#!/usr/bin/python3
"""Builds ucp's wheel (PEP 427) from the package's files, the extension module and
the `ucp` binary (python/wheel.bzl).

    build_wheel.py --out-dir DIR --version 0.1.0 --python-tag cp313 --elf-abi tools/elf_abi.py \
        --binary ucp [--readme README.md] [--strip] python/ucp/__init__.py ... X_core.so

writes DIR/ucp-0.1.0-cp313-cp313-PLATFORM.whl, PLATFORM being the manylinux tag that the
extension's and the binary's symbol versions and needed libraries allow, computed by
tools/elf_abi.py as auditwheel would (the build fails, naming the problem, when they
allow none). The .py files go into ucp/ under their own names; the extension (the
file ending in .so) as ucp/_core.<ext suffix>.so for the tag's interpreter; the
binary as ucp/_bin/ucp, which the `ucp` console command runs (ucp/_cli.py). The
archive is reproducible: entries sorted, fixed timestamps and modes. numpy is a
requirement; nothing else is needed of the system but glibc.
"""

import argparse
import base64
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

_DATE = (2024, 1, 1, 0, 0, 0)


def _record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _ext_suffix(python_tag):
    # cp313 -> .cpython-313-x86_64-linux-gnu.so
    m = re.fullmatch(r"cp(\d)(\d+)", python_tag)
    if not m:
        raise SystemExit(f"build_wheel: unsupported python tag {python_tag}")
    return f".cpython-{m.group(1)}{m.group(2)}-x86_64-linux-gnu.so"


def _stripped(path, strip):
    if not strip:
        with open(path, "rb") as f:
            return f.read()
    with tempfile.TemporaryDirectory() as t:
        out = os.path.join(t, os.path.basename(path))
        subprocess.run(["strip", "--strip-debug", "-o", out, path], check=True)
        with open(out, "rb") as f:
            return f.read()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--python-tag", required=True, help="e.g. cp313")
    p.add_argument("--elf-abi", required=True, help="tools/elf_abi.py")
    p.add_argument("--binary", required=True, help="the ucp binary, shipped as ucp/_bin/ucp")
    p.add_argument("--readme", help="long description (Markdown)")
    p.add_argument("--strip", action="store_true", help="strip the extension's debug info")
    p.add_argument("files", nargs="+")
    args = p.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.abspath(args.elf_abi)))
    import elf_abi  # noqa: E402

    name = "ucp"
    m = re.fullmatch(r"cp(\d)(\d+)", args.python_tag)
    if not m:
        raise SystemExit(f"build_wheel: unsupported python tag {args.python_tag}")
    python_version = f"{m.group(1)}.{m.group(2)}"
    elf_files = [f for f in args.files if f.endswith(".so")] + [args.binary]
    try:
        platform, problems = elf_abi.platform_tag([elf_abi.read_elf(f) for f in elf_files])
    except elf_abi.ElfError as e:
        raise SystemExit(f"build_wheel: {e}")
    if platform is None:
        raise SystemExit("build_wheel: no manylinux tag fits:\n  " + "\n  ".join(problems))
    tag = f"{args.python_tag}-{args.python_tag}-{platform}"

    entries = {}  # archive name -> (bytes, executable)
    for path in args.files:
        base = os.path.basename(path)
        with open(path, "rb") as f:
            data = f.read()
        if base.endswith(".py"):
            entries[f"{name}/{base}"] = (data, False)
            if base == "__init__.py":
                v = re.search(rb'^__version__ = "([^"]+)"', data, re.M)
                if not v or v.group(1).decode() != args.version:
                    raise SystemExit(f"build_wheel: {path} has __version__ {v and v.group(1)}, expected {args.version}")
        elif base.endswith(".so"):
            # X_core.so -> ucp/_core.cpython-313-x86_64-linux-gnu.so
            entries[f"{name}/_core{_ext_suffix(args.python_tag)}"] = (_stripped(path, args.strip), True)
        else:
            raise SystemExit(f"build_wheel: unexpected file {path}")
    if f"{name}/__init__.py" not in entries or not any(k.endswith(".so") for k in entries):
        raise SystemExit("build_wheel: needs ucp/__init__.py and the extension module")
    entries[f"{name}/_bin/ucp"] = (_stripped(args.binary, args.strip), True)

    dist_info = f"{name}-{args.version}.dist-info"
    description = ""
    if args.readme:
        with open(args.readme, encoding="utf-8") as f:
            description = f.read()
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {args.version}",
        "Summary: DeepSpeed ZeRO checkpoints -> universal checkpoints, resharding and export (C++ core)",
        f"Requires-Python: =={python_version}.*",
        "Requires-Dist: numpy",
        "Description-Content-Type: text/markdown",
        "",
        description,
    ])
    wheel = "\n".join([
        "Wheel-Version: 1.0",
        "Generator: ucp build_wheel.py",
        "Root-Is-Purelib: false",
        f"Tag: {tag}",
        "",
    ])
    entries[f"{dist_info}/METADATA"] = (metadata.encode("utf-8"), False)
    entries[f"{dist_info}/WHEEL"] = (wheel.encode("utf-8"), False)
    entries[f"{dist_info}/top_level.txt"] = (f"{name}\n".encode(), False)
    # `ucp` on PATH: the bundled binary (every command, mpirun included).
    entries[f"{dist_info}/entry_points.txt"] = (b"[console_scripts]\nucp = ucp._cli:main\n", False)

    record_name = f"{dist_info}/RECORD"
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, (d, _) in sorted(entries.items()))
    record += f"{record_name},,\n"
    entries[record_name] = (record.encode("utf-8"), False)

    os.makedirs(args.out_dir, exist_ok=True)
    out = os.path.join(args.out_dir, f"{name}-{args.version}-{tag}.whl")
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        # dist-info last, RECORD at the very end, as wheel tools write it.
        order = sorted(entries, key=lambda n: (n.startswith(dist_info), n == record_name, n))
        for n in order:
            data, executable = entries[n]
            info = zipfile.ZipInfo(n, date_time=_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
            z.writestr(info, data)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
