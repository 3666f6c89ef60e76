"""tools/elf_abi.py against binutils (readelf, objdump) on real files: the portable
`ucp` binary, Debian 12's libprotobuf and libstdc++, the host's Python; the platform
tags it gives and refuses; its errors on files that are not ELF or are cut short.

    elf_abi_test.py UCP_BINARY ELF_ABI
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

UCP = os.path.abspath(sys.argv.pop(1))
ELF_ABI = os.path.abspath(sys.argv.pop(1))
sys.path.insert(0, os.path.dirname(ELF_ABI))
import elf_abi  # noqa: E402

LIBDIR = "/usr/lib/x86_64-linux-gnu"
FILES = [UCP, f"{LIBDIR}/libprotobuf.so.32", f"{LIBDIR}/libstdc++.so.6", "/usr/bin/python3"]


def readelf_needed(path):
    out = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def objdump_versions(path):
    """{(family, version tuple): set of undefined symbols} from objdump -T."""
    out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True, check=True).stdout
    versions = {}
    for line in out.splitlines():
        m = re.search(r"\*UND\*\s+[0-9a-f]+\s+\(?([A-Z]+)_([0-9.]+)\)?\s+(\S+)$", line)
        if m:
            key = (m.group(1), tuple(int(p) for p in m.group(2).split(".")))
            versions.setdefault(key, set()).add(m.group(3))
    return versions


class ElfAbiTest(unittest.TestCase):

    def test_needed_libraries_as_readelf_reads_them(self):
        for path in FILES:
            with self.subTest(path=path):
                self.assertEqual(elf_abi.read_elf(path)["needed"], readelf_needed(path))

    def test_symbol_versions_as_objdump_reads_them(self):
        for path in FILES:
            with self.subTest(path=path):
                ours = {k: set(v) for k, v in elf_abi.read_elf(path)["versions"].items() if v}
                self.assertEqual(ours, objdump_versions(path))

    def test_minimum_glibc_and_what_bounds_it(self):
        for path in FILES:
            with self.subTest(path=path):
                theirs = objdump_versions(path)
                top = max(v for (fam, v) in theirs if fam == "GLIBC")
                out = subprocess.run([sys.executable, ELF_ABI, "min-glibc", path], capture_output=True, text=True)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertEqual(out.stdout.strip(), ".".join(map(str, top)))
                self.assertEqual(elf_abi.max_version([elf_abi.read_elf(path)], "GLIBC")[1],
                                 sorted(theirs[("GLIBC", top)]))

    def test_platform_tags(self):
        # The portable binary: glibc's libraries only, no C++ runtime versions.
        ucp = elf_abi.read_elf(UCP)
        glibc = max(v for (fam, v) in objdump_versions(UCP) if fam == "GLIBC")
        tag, problems = elf_abi.platform_tag([ucp])
        self.assertEqual(problems, [])
        self.assertTrue(tag.endswith(f"manylinux_{glibc[0]}_{glibc[1]}_x86_64"), tag)
        # Debian 12's libprotobuf: GLIBCXX_3.4.29 is newer than any tag's list here allows.
        tag, problems = elf_abi.platform_tag([elf_abi.read_elf(f"{LIBDIR}/libprotobuf.so.32")])
        self.assertIsNone(tag)
        self.assertTrue(any(p.startswith("GLIBCXX_3.4.") for p in problems), problems)
        # The host's Python needs only libraries of the policy's list (libm, libz, libexpat, libc).
        self.assertEqual(elf_abi.platform_tag([elf_abi.read_elf("/usr/bin/python3")])[1], [])
        # A library no policy allows.
        fake = dict(ucp, needed=ucp["needed"] + ["libabsl_base.so.20220623"])
        tag, problems = elf_abi.platform_tag([fake])
        self.assertIsNone(tag)
        self.assertIn("libabsl_base.so.20220623", problems[0])
        # Legacy aliases for the PEP 513/599 glibc versions.
        old = dict(ucp, needed=["libc.so.6"], versions={("GLIBC", (2, 17)): ["clock_gettime"]})
        self.assertEqual(elf_abi.platform_tag([old]), ("manylinux2014_x86_64.manylinux_2_17_x86_64", []))

    def test_check_limits(self):
        ok = subprocess.run([sys.executable, ELF_ABI, "check", UCP, "--max-glibc=2.31",
                             "--only-libs=libc.so.6,libm.so.6,libpthread.so.0,libdl.so.2,libgcc_s.so.1,"
                             "ld-linux-x86-64.so.2"], capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        bad = subprocess.run([sys.executable, ELF_ABI, "check", UCP, "--max-glibc=2.5", "--only-libs=libc.so.6"],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("above 2.5", bad.stderr)
        self.assertIn("libgcc_s.so.1", bad.stderr)

    def test_bad_files_are_errors_naming_them(self):
        with tempfile.TemporaryDirectory() as d:
            text = os.path.join(d, "notes.txt")
            with open(text, "w") as f:
                f.write("not an ELF file\n")
            short = os.path.join(d, "short.so")
            with open(UCP, "rb") as f:
                head = f.read(4096)
            with open(short, "wb") as f:
                f.write(head)
            for path, words in ((text, "not an ELF file"), (short, "past the end of the file")):
                p = subprocess.run([sys.executable, ELF_ABI, "min-glibc", path], capture_output=True, text=True)
                self.assertEqual(p.returncode, 2, p.stdout)
                self.assertIn(path, p.stderr)
                self.assertIn(words, p.stderr)


if __name__ == "__main__":
    unittest.main()
