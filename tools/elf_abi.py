#!/usr/bin/python3
"""What an ELF file (the `ucp` binary, a wheel's extension module) asks of the system
it runs on, read from the file itself: the shared libraries it needs (DT_NEEDED) and
the symbol versions it needs from them (.gnu.version_r), then judged as auditwheel
judges a wheel (PEP 600, auditwheel's manylinux policy for x86_64):

  - the minimum glibc is the highest GLIBC_x.y version needed (the symbols needing it
    are what bounds it);
  - a manylinux_X_Y platform tag allows GLIBC_ versions <= X.Y, the C++ runtime's
    GLIBCXX_ / CXXABI_ and libgcc's GCC_ versions up to those of the tag's reference
    distribution, and only the shared libraries of the policy's list (glibc's, libgcc_s,
    libstdc++, libz, a few X11/GL ones); anything else must be inside the wheel.

    elf_abi.py show FILE...          the report (needed libraries, versions, bounds, tag)
    elf_abi.py min-glibc FILE        the minimum glibc, e.g. 2.17
    elf_abi.py platform-tag FILE...  the manylinux tag all FILEs allow, e.g. manylinux_2_17_x86_64
                                     (exit 1, naming each problem, when none does)
    elf_abi.py stamp FILE --out=X.cc a C++ source defining ucp::tools::kMinimumGlibc and
                                     kMinimumGlibcBound (what `ucp --version` prints)
    elf_abi.py check FILE [--max-glibc=X.Y] [--only-libs=a.so,b.so]
                                     exit 1 naming what exceeds the limits

Standard library only (it runs in Bazel genrules, tests and tools/release.sh); reads
64-bit little-endian ELF (x86_64).
"""

import argparse
import struct
import sys

# The shared libraries a manylinux wheel may need (auditwheel's lib_whitelist, the
# same for every manylinux policy from manylinux_2_5 on, libmvec and libexpat from
# later ones): every other library has to be inside the wheel or linked in.
MANYLINUX_LIBS = frozenset([
    "libatomic.so.1", "libgcc_s.so.1", "libstdc++.so.6", "libm.so.6", "libmvec.so.1",
    "libanl.so.1", "libdl.so.2", "librt.so.1", "libc.so.6", "libnsl.so.1", "libutil.so.1",
    "libpthread.so.0", "libX11.so.6", "libXext.so.6", "libXrender.so.1", "libICE.so.6",
    "libSM.so.6", "libGL.so.1", "libgobject-2.0.so.0", "libgthread-2.0.so.0",
    "libglib-2.0.so.0", "libresolv.so.2", "libexpat.so.1", "libz.so.1",
    "ld-linux-x86-64.so.2",
])

# Per glibc version of a manylinux policy (x86_64), the highest GLIBCXX_, CXXABI_ and
# GCC_ versions its reference distribution's C++ runtime and libgcc_s provide
# (auditwheel's manylinux-policy.json). Newer tags are not listed: a file needing a
# C++ runtime version above manylinux_2_27's is refused rather than guessed at (ucp
# links libstdc++ in statically and needs none).
CXX_LIMITS = [
    ((2, 5), {"GLIBCXX": (3, 4, 8), "CXXABI": (1, 3, 1), "GCC": (4, 2, 0)}),
    ((2, 12), {"GLIBCXX": (3, 4, 13), "CXXABI": (1, 3, 3), "GCC": (4, 3, 0)}),
    ((2, 17), {"GLIBCXX": (3, 4, 19), "CXXABI": (1, 3, 7), "GCC": (4, 8, 0)}),
    ((2, 24), {"GLIBCXX": (3, 4, 22), "CXXABI": (1, 3, 10), "GCC": (4, 8, 0)}),
    ((2, 27), {"GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11), "GCC": (7, 0, 0)}),
]

# Legacy names of manylinux tags (PEP 513, 571, 599), which older pips need.
LEGACY_TAGS = {(2, 5): "manylinux1", (2, 12): "manylinux2010", (2, 17): "manylinux2014"}

DT_NEEDED = 1
DT_SONAME = 14
SHT_DYNSYM = 11
SHT_DYNAMIC = 6
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
SHN_UNDEF = 0


class ElfError(Exception):
    pass


def _version_tuple(text):
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return None


def _cstr(blob, offset):
    end = blob.index(b"\0", offset)
    return blob[offset:end].decode("utf-8", "replace")


def read_elf(path):
    """{'needed': [...], 'soname': str|None, 'versions': {(family, tuple): [symbols]},
    'version_libs': {version name: library}} of one ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file (magic {data[:4]!r})")
    if data[4] != 2 or data[5] != 1:
        raise ElfError(f"{path}: not a 64-bit little-endian ELF file (class {data[4]}, data {data[5]})")
    (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    if e_shoff == 0 or e_shnum == 0:
        raise ElfError(f"{path}: no section headers")
    if e_shoff + e_shentsize * e_shnum > len(data):
        raise ElfError(f"{path}: section headers at {e_shoff} run past the end of the file ({len(data)} bytes)")
    sections = []
    for i in range(e_shnum):
        (name, typ, flags, addr, offset, size, link, info, align, entsize) = struct.unpack_from(
            "<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
        if typ != 8 and offset + size > len(data):  # 8 = SHT_NOBITS
            raise ElfError(f"{path}: section {i} ({offset}+{size}) runs past the end of the file")
        sections.append({"type": typ, "offset": offset, "size": size, "link": link, "info": info,
                         "entsize": entsize})

    def blob(sec):
        return data[sec["offset"]:sec["offset"] + sec["size"]]

    needed, soname = [], None
    dynsym = versym = verneed = None
    for sec in sections:
        if sec["type"] == SHT_DYNAMIC:
            strtab = blob(sections[sec["link"]])
            raw = blob(sec)
            for off in range(0, len(raw) - 15, 16):
                tag, val = struct.unpack_from("<qQ", raw, off)
                if tag == 0:
                    break
                if tag == DT_NEEDED:
                    needed.append(_cstr(strtab, val))
                elif tag == DT_SONAME:
                    soname = _cstr(strtab, val)
        elif sec["type"] == SHT_DYNSYM:
            dynsym = sec
        elif sec["type"] == SHT_GNU_VERSYM:
            versym = sec
        elif sec["type"] == SHT_GNU_VERNEED:
            verneed = sec

    # Version index -> (name, library) from the version needs.
    index_names = {}
    version_libs = {}
    if verneed is not None:
        strtab = blob(sections[verneed["link"]])
        raw = blob(verneed)
        off = 0
        for _ in range(verneed["info"]):
            vn_version, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", raw, off)
            lib = _cstr(strtab, vn_file)
            aux = off + vn_aux
            for _ in range(vn_cnt):
                vna_hash, vna_flags, vna_other, vna_name, vna_next = struct.unpack_from("<IHHII", raw, aux)
                name = _cstr(strtab, vna_name)
                index_names[vna_other & 0x7FFF] = (name, lib)
                version_libs[name] = lib
                if vna_next == 0:
                    break
                aux += vna_next
            if vn_next == 0:
                break
            off += vn_next

    # Which undefined symbols need which version.
    versions = {}
    for name in version_libs:
        family, _, number = name.partition("_")
        v = _version_tuple(number)
        if v is not None:
            versions.setdefault((family, v), [])
    if dynsym is not None and versym is not None:
        strtab = blob(sections[dynsym["link"]])
        syms = blob(dynsym)
        vers = blob(versym)
        count = len(syms) // 24
        for i in range(1, count):
            st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", syms, i * 24)
            if st_shndx != SHN_UNDEF or 2 * i + 2 > len(vers):
                continue
            (idx,) = struct.unpack_from("<H", vers, 2 * i)
            entry = index_names.get(idx & 0x7FFF)
            if entry is None:
                continue
            family, _, number = entry[0].partition("_")
            v = _version_tuple(number)
            if v is not None:
                versions.setdefault((family, v), []).append(_cstr(strtab, st_name))
    return {"path": path, "needed": needed, "soname": soname, "versions": versions,
            "version_libs": version_libs}


def max_version(infos, family):
    """(version, [symbols needing it]) of the highest FAMILY_x.y over all files, or (None, [])."""
    best, symbols = None, []
    for info in infos:
        for (fam, v), syms in info["versions"].items():
            if fam != family:
                continue
            if best is None or v > best:
                best, symbols = v, list(syms)
            elif v == best:
                symbols += syms
    return best, sorted(set(symbols))


def vstr(v):
    return ".".join(str(p) for p in v) if v else "none"


def platform_tag(infos, arch="x86_64"):
    """(tag, problems): the manylinux tag the files allow, with its legacy alias first
    when there is one (`manylinux2014_x86_64.manylinux_2_17_x86_64`), or (None, problems)."""
    problems = []
    for info in infos:
        for lib in info["needed"]:
            if lib not in MANYLINUX_LIBS:
                problems.append(f"{info['path']} needs {lib}, which no manylinux policy allows "
                                "(it must be linked in or shipped inside the wheel)")
    glibc, _ = max_version(infos, "GLIBC")
    glibc = glibc or (2, 5)
    tag_glibc = (glibc[0], glibc[1]) if glibc >= (2, 5) else (2, 5)
    limits = None
    for policy_glibc, lim in CXX_LIMITS:
        if policy_glibc <= tag_glibc:
            limits = lim
    for family in ("GLIBCXX", "CXXABI", "GCC"):
        v, syms = max_version(infos, family)
        if v is None:
            continue
        if v > limits[family]:
            problems.append(f"{family}_{vstr(v)} ({', '.join(syms[:3])}) is above the "
                            f"{family}_{vstr(limits[family])} of manylinux_{tag_glibc[0]}_{tag_glibc[1]}")
    if problems:
        return None, problems
    name = f"manylinux_{tag_glibc[0]}_{tag_glibc[1]}_{arch}"
    if tag_glibc in LEGACY_TAGS:
        name = f"{LEGACY_TAGS[tag_glibc]}_{arch}.{name}"
    return name, []


def show(infos):
    lines = []
    for info in infos:
        lines.append(f"{info['path']}:")
        lines.append(f"  needs: {' '.join(info['needed']) or '(nothing)'}")
        by_family = {}
        for (fam, v), syms in info["versions"].items():
            by_family.setdefault(fam, []).append(v)
        for fam in sorted(by_family):
            vs = sorted(by_family[fam])
            lines.append(f"  {fam}: {' '.join(vstr(v) for v in vs)}")
    glibc, syms = max_version(infos, "GLIBC")
    lines.append(f"minimum glibc: {vstr(glibc)} (needed by {', '.join(syms) or 'nothing'})")
    tag, problems = platform_tag(infos)
    lines.append(f"platform tag: {tag or 'none'}")
    lines += [f"  problem: {p}" for p in problems]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show")
    s.add_argument("files", nargs="+")
    s = sub.add_parser("min-glibc")
    s.add_argument("file")
    s = sub.add_parser("platform-tag")
    s.add_argument("files", nargs="+")
    s = sub.add_parser("stamp")
    s.add_argument("file")
    s.add_argument("--out", required=True)
    s = sub.add_parser("check")
    s.add_argument("file")
    s.add_argument("--max-glibc")
    s.add_argument("--only-libs", help="comma-separated sonames the file may need")
    args = p.parse_args(argv)
    try:
        if args.cmd == "show":
            print(show([read_elf(f) for f in args.files]))
        elif args.cmd == "min-glibc":
            v, _ = max_version([read_elf(args.file)], "GLIBC")
            if v is None:
                raise ElfError(f"{args.file} needs no GLIBC_ symbol version (not linked against glibc?)")
            print(vstr(v))
        elif args.cmd == "platform-tag":
            tag, problems = platform_tag([read_elf(f) for f in args.files])
            if tag is None:
                for problem in problems:
                    print(f"elf_abi: {problem}", file=sys.stderr)
                return 1
            print(tag)
        elif args.cmd == "stamp":
            v, syms = max_version([read_elf(args.file)], "GLIBC")
            if v is None:
                raise ElfError(f"{args.file} needs no GLIBC_ symbol version (not linked against glibc?)")
            bound = ", ".join(syms)
            with open(args.out, "w") as out:
                out.write("// Generated by tools/elf_abi.py stamp from the unstamped ucp binary: the\n"
                          "// minimum glibc its symbol versions need, and the symbols that need it.\n"
                          "#include \"tools/build_info.h\"\n\n"
                          "namespace ucp::tools {\n"
                          f"const char kMinimumGlibc[] = \"{vstr(v)}\";\n"
                          f"const char kMinimumGlibcBound[] = \"{bound}\";\n"
                          "}  // namespace ucp::tools\n")
        elif args.cmd == "check":
            info = read_elf(args.file)
            errors = []
            if args.max_glibc:
                limit = _version_tuple(args.max_glibc)
                v, syms = max_version([info], "GLIBC")
                if v is not None and v > limit:
                    errors.append(f"needs GLIBC_{vstr(v)} ({', '.join(syms)}), above {args.max_glibc}")
            if args.only_libs is not None:
                allowed = set(filter(None, args.only_libs.split(",")))
                extra = [lib for lib in info["needed"] if lib not in allowed]
                if extra:
                    errors.append(f"needs {', '.join(extra)} (allowed: {', '.join(sorted(allowed))})")
            for e in errors:
                print(f"elf_abi: {args.file} {e}", file=sys.stderr)
            return 1 if errors else 0
    except (ElfError, OSError, struct.error, ValueError) as e:
        print(f"elf_abi: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
