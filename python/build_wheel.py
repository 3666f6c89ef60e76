#!/usr/bin/python3
"""Builds ucp's wheel (PEP 427) from the package's files and the extension module.

    build_wheel.py --out ucp-0.1.0-cp311-cp311-linux_x86_64.whl --version 0.1.0 \
        --tag cp311-cp311-linux_x86_64 python/ucp/__init__.py ... python/ucp/_core.so

The .py files go into ucp/ under their own names; the extension (the file
ending in .so) as ucp/_core.<ext suffix>.so for the tag's interpreter. The
archive is reproducible: entries sorted, fixed timestamps and modes. libtorch
is not needed; libabsl, libprotobuf and libxxhash are Debian's system libraries
(the extension links them dynamically), numpy is a requirement.
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


def _ext_suffix(tag):
    # cp311-cp311-linux_x86_64 -> .cpython-311-x86_64-linux-gnu.so
    m = re.fullmatch(r"cp(\d)(\d+)-cp\d+-linux_(x86_64|aarch64)", tag)
    if not m:
        raise SystemExit(f"build_wheel: unsupported tag {tag}")
    return f".cpython-{m.group(1)}{m.group(2)}-{m.group(3)}-linux-gnu.so"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--readme", help="long description (Markdown)")
    p.add_argument("--strip", action="store_true", help="strip the extension's debug info")
    p.add_argument("files", nargs="+")
    args = p.parse_args()

    name = "ucp"
    expected = f"{name}-{args.version}-{args.tag}.whl"
    if os.path.basename(args.out) != expected:
        raise SystemExit(f"build_wheel: output must be named {expected}, not {os.path.basename(args.out)}")
    m = re.fullmatch(r"cp(\d)(\d+)-.*", args.tag)
    python_version = f"{m.group(1)}.{m.group(2)}"

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
            stem = base.split(".", 1)[0]
            if args.strip:  # drop the debug info (-g1) from the installed module
                with tempfile.TemporaryDirectory() as t:
                    stripped = os.path.join(t, base)
                    subprocess.run(["strip", "--strip-debug", "-o", stripped, path], check=True)
                    with open(stripped, "rb") as f:
                        data = f.read()
            entries[f"{name}/{stem}{_ext_suffix(args.tag)}"] = (data, True)
        else:
            raise SystemExit(f"build_wheel: unexpected file {path}")
    if f"{name}/__init__.py" not in entries or not any(k.endswith(".so") for k in entries):
        raise SystemExit("build_wheel: needs ucp/__init__.py and the extension module")

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
        f"Tag: {args.tag}",
        "",
    ])
    entries[f"{dist_info}/METADATA"] = (metadata.encode("utf-8"), False)
    entries[f"{dist_info}/WHEEL"] = (wheel.encode("utf-8"), False)
    entries[f"{dist_info}/top_level.txt"] = (f"{name}\n".encode(), False)

    record_name = f"{dist_info}/RECORD"
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, (d, _) in sorted(entries.items()))
    record += f"{record_name},,\n"
    entries[record_name] = (record.encode("utf-8"), False)

    tmp = args.out + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        # dist-info last, RECORD at the very end, as wheel tools write it.
        order = sorted(entries, key=lambda n: (n.startswith(dist_info), n == record_name, n))
        for n in order:
            data, executable = entries[n]
            info = zipfile.ZipInfo(n, date_time=_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
            z.writestr(info, data)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
