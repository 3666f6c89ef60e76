"""The wheel of //python:wheel installs with `pip install --no-index` into a fresh venv of /usr/bin/python3 and
works there: the README's example converts a fixture and loads one tensor."""

import base64
import hashlib
import os
import re
import subprocess
import sys
import unittest
import zipfile

import testutil

WHEEL = os.environ.get("UCP_WHEEL", "")
README = os.environ.get("UCP_README", "")
RUNFILES = os.environ.get("UCP_RUNFILES", os.getcwd())


def readme_example():
    """The Python lines between the README's example markers."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"<!-- python-example -->\n(.*?)<!-- /python-example -->", text, re.S)
    assert m, "README.md has no <!-- python-example --> block"
    lines = [line[4:] for line in m.group(1).splitlines() if line.startswith("    ")]
    return lines


class WheelTest(unittest.TestCase):

    def test_archive(self):
        self.assertRegex(os.path.basename(WHEEL), r"^ucp-\d+\.\d+\.\d+-cp311-cp311-linux_x86_64\.whl$")
        with zipfile.ZipFile(WHEEL) as z:
            names = z.namelist()
            dist = [n.split("/")[0] for n in names if n.endswith(".dist-info/WHEEL")][0]
            for n in ("ucp/__init__.py", "ucp/__main__.py", "ucp/_errors.py",
                      "ucp/_core.cpython-311-x86_64-linux-gnu.so", f"{dist}/METADATA", f"{dist}/RECORD"):
                self.assertIn(n, names)
            wheel = z.read(f"{dist}/WHEEL").decode()
            self.assertIn("Root-Is-Purelib: false", wheel)
            self.assertIn("Tag: cp311-cp311-linux_x86_64", wheel)
            metadata = z.read(f"{dist}/METADATA").decode()
            self.assertIn("Name: ucp", metadata)
            self.assertIn("Requires-Dist: numpy", metadata)
            record = z.read(f"{dist}/RECORD").decode().splitlines()
            self.assertEqual(sorted(r.split(",")[0] for r in record), sorted(names))
            for row in record:
                path, digest, size = row.rsplit(",", 2)
                if path.endswith("RECORD"):
                    self.assertEqual((digest, size), ("", ""))
                    continue
                data = z.read(path)
                expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual(digest, f"sha256={expected}", path)
                self.assertEqual(int(size), len(data), path)

    def test_installs_into_a_venv_and_runs_the_readme_example(self):
        work = testutil.fresh_dir("venv")
        venv = os.path.join(work, "venv")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(HOME=work, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")

        def run(*args, cwd=work):
            p = subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=cwd)
            self.assertEqual(p.returncode, 0, f"{' '.join(args)}:\n{p.stdout}{p.stderr}")
            return p

        run(testutil.PYTHON, "-m", "venv", "--system-site-packages", venv)
        python = os.path.join(venv, "bin", "python")
        install = run(python, "-m", "pip", "install", "--no-index", WHEEL)
        self.assertIn("Successfully installed ucp", install.stdout)
        where = run(python, "-c", "import ucp, numpy; print(ucp.__file__); print(ucp._core.__file__)")
        site = os.path.join(venv, "lib", "python3.11", "site-packages", "ucp")
        self.assertEqual(where.stdout.split(), [os.path.join(site, "__init__.py"),
                                                os.path.join(site, "_core.cpython-311-x86_64-linux-gnu.so")])
        # The README's three lines, from the checkout's root (where ../shared/fixtures is), writing under
        # this test's folder instead of /tmp, then a check against torch.load of the verified universal file.
        lines = readme_example()
        self.assertEqual(len(lines), 3, lines)
        code = "\n".join(lines).replace("/tmp/", work + "/")
        expected = os.path.join(testutil.fixture("neox-tp2-pp1-dp1/global_step4_universal_expected"), "zero",
                                "2.attention.dense.weight", "fp32.pt")
        code += ("\nimport torch, warnings\nwarnings.simplefilter('ignore')\n"
                 f"assert torch.equal(torch.from_numpy(w), torch.load({expected!r})['param'])\nprint('ok', w.shape)\n")
        out = run(python, "-c", code, cwd=RUNFILES)
        self.assertIn("ok (64, 64)", out.stdout)
        usage = run(python, "-m", "ucp", "ds_to_universal", "--help")
        self.assertIn("--num_extract_workers", usage.stdout)


if __name__ == "__main__":
    unittest.main()
