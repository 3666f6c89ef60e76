"""A wheel of //python (python/wheel.bzl) installs with `pip install --no-index` into a
fresh venv of its Python, on the host (Debian 12's 3.11) or inside its Debian root
(tools/deepspeed_env.sh: trixie's 3.13, sid's 3.14), and works there: the README's
example converts a fixture and loads one tensor (checked against torch.load of the
verified universal file), `python -m ucp` and the `ucp` command (the bundled binary)
run. The archive is checked as pip and auditwheel would: file names, RECORD hashes,
the WHEEL tag equal to the file name's, a manylinux tag no higher than the oldest
Debian root's glibc, and extension and binary needing only glibc and libgcc_s.

Environment (python/BUILD): UCP_WHEEL_DIR (the folder holding the .whl),
UCP_WHEEL_MISSING (why the wheel could not be built: the test fails with it),
UCP_WHEEL_SUITE (host, trixie, sid), UCP_WHEEL_PYTHON (e.g. 3.13), UCP_ROOT_DIR (the
root's folder, whose cache holds the roots), UCP_OLDEST_ROOT_DIR / UCP_OLDEST_MISSING
(the bullseye root, in which the extension's needs are checked by its dynamic loader).
"""

import base64
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

import testutil

WHEEL_DIR = os.environ.get("UCP_WHEEL_DIR", "")  # relative to the runfiles
MISSING = os.environ.get("UCP_WHEEL_MISSING", "")
SUITE = os.environ.get("UCP_WHEEL_SUITE", "host")
PYTHON_VERSION = os.environ.get("UCP_WHEEL_PYTHON", "")
ROOT_DIR = os.environ.get("UCP_ROOT_DIR", "")
OLDEST_ROOT_DIR = os.environ.get("UCP_OLDEST_ROOT_DIR", "")
OLDEST_MISSING = os.environ.get("UCP_OLDEST_MISSING", "")
README = os.environ.get("UCP_README", "")
RUNFILES = os.environ.get("UCP_RUNFILES", os.getcwd())
DEEPSPEED_ENV = os.path.join(RUNFILES, "tools", "deepspeed_env.sh")
ELF_ABI = os.path.join(RUNFILES, "tools", "elf_abi.py")

# The glibc of the oldest Debian root (bullseye), which the wheels are linked against.
OLDEST_GLIBC = (2, 31)
GLIBC_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libgcc_s.so.1",
              "ld-linux-x86-64.so.2"}
FIXTURE = "neox-tp2-pp1-dp1"


def readme_example():
    """The Python lines between the README's example markers."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"<!-- python-example -->\n(.*?)<!-- /python-example -->", text, re.S)
    assert m, "README.md has no <!-- python-example --> block"
    return [line[4:] for line in m.group(1).splitlines() if line.startswith("    ")]


def in_root(suite, root_dir, work, *args):
    """Runs ARGS in a Debian root with `work` bound into it; the CompletedProcess (text)."""
    env = dict(os.environ, UCP_CACHE_DIR=os.path.dirname(os.path.dirname(root_dir)),
               PATH="/usr/sbin:/usr/bin:/sbin:/bin")  # chroot, mount: the sbin folders Bazel's PATH lacks
    cmd = ["bash", DEEPSPEED_ENV, "run", f"--root={suite}", f"--bind={work}", f"--cwd={work}", "--"] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def the_wheel():
    if MISSING:
        raise AssertionError(f"the {SUITE} wheel cannot be built here: {MISSING}")
    wheels = glob.glob(os.path.join(RUNFILES, WHEEL_DIR, "*.whl"))
    if len(wheels) != 1:
        raise AssertionError(f"{WHEEL_DIR} holds {len(wheels)} wheels, expected 1: {wheels}")
    return wheels[0]


class WheelTest(unittest.TestCase):

    def test_archive(self):
        wheel = the_wheel()
        tag = "cp" + PYTHON_VERSION.replace(".", "")
        m = re.fullmatch(rf"ucp-(\d+\.\d+\.\d+)-{tag}-{tag}-((?:manylinux\w+\.)?manylinux_(\d+)_(\d+)_x86_64)\.whl",
                         os.path.basename(wheel))
        self.assertIsNotNone(m, os.path.basename(wheel))
        platform, glibc = m.group(2), (int(m.group(3)), int(m.group(4)))
        self.assertLessEqual(glibc, OLDEST_GLIBC, f"{platform}: above the oldest Debian root's glibc")
        ext = f"ucp/_core.cpython-{tag[2:]}-x86_64-linux-gnu.so"
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            dist = [n.split("/")[0] for n in names if n.endswith(".dist-info/WHEEL")][0]
            for n in ("ucp/__init__.py", "ucp/__main__.py", "ucp/_errors.py", "ucp/_cli.py", "ucp/_bin/ucp", ext,
                      f"{dist}/METADATA", f"{dist}/RECORD", f"{dist}/entry_points.txt"):
                self.assertIn(n, names)
            wheel_meta = z.read(f"{dist}/WHEEL").decode()
            self.assertIn("Root-Is-Purelib: false", wheel_meta)
            self.assertIn(f"Tag: {tag}-{tag}-{platform}\n", wheel_meta)
            metadata = z.read(f"{dist}/METADATA").decode()
            self.assertIn("Name: ucp", metadata)
            self.assertIn("Requires-Dist: numpy", metadata)
            self.assertIn(f"Requires-Python: =={PYTHON_VERSION}.*", metadata)
            self.assertIn("ucp = ucp._cli:main", z.read(f"{dist}/entry_points.txt").decode())
            for n in (ext, "ucp/_bin/ucp"):
                self.assertEqual((z.getinfo(n).external_attr >> 16) & 0o111, 0o111, f"{n} is not executable")
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
            # What the extension and the binary need of the system: glibc's libraries and libgcc_s,
            # at versions no higher than the platform tag says.
            work = testutil.fresh_dir("archive")
            for n in (ext, "ucp/_bin/ucp"):
                path = z.extract(n, work)
                p = subprocess.run([sys.executable, ELF_ABI, "check", path, f"--max-glibc={glibc[0]}.{glibc[1]}",
                                    "--only-libs=" + ",".join(sorted(GLIBC_LIBS))], capture_output=True, text=True)
                self.assertEqual(p.returncode, 0, p.stderr)
            # The dynamic loader of the oldest Debian root (glibc 2.31) finds every library and
            # symbol version the extension needs (Python's own symbols come from the interpreter).
            if OLDEST_MISSING:
                raise AssertionError(OLDEST_MISSING)
            p = in_root("bullseye", OLDEST_ROOT_DIR, work, "ldd", os.path.join(work, ext))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertNotIn("not found", p.stdout + p.stderr)
            self.assertIn("libc.so.6", p.stdout)

    def test_installs_into_a_venv_and_runs_the_readme_example(self):
        wheel = the_wheel()
        work = testutil.fresh_dir("venv")
        # Everything the venv sees lives under `work` (bound into the root at the same path): the
        # wheel, and the fixture where the README's relative path finds it from `checkout`.
        local_wheel = os.path.join(work, os.path.basename(wheel))
        shutil.copy(wheel, local_wheel)
        checkout = os.path.join(work, "checkout")
        os.makedirs(checkout)
        src = testutil.fixture(f"{FIXTURE}/global_step4")
        dst = os.path.join(work, "shared", "fixtures", "deepspeed-0.14.4", FIXTURE, "global_step4")
        shutil.copytree(src, dst, symlinks=False)
        expected = os.path.join(testutil.fixture(f"{FIXTURE}/global_step4_universal_expected"), "zero",
                                "2.attention.dense.weight", "fp32.pt")
        local_expected = os.path.join(work, "expected_fp32.pt")
        shutil.copy(expected, local_expected)
        venv = os.path.join(work, "venv")

        def run(*args, cwd=work):
            env_vars = {"HOME": work, "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
            if SUITE == "host":
                env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
                env.update(env_vars)
                cmd = list(args)
            else:
                # chroot, mount: tools/deepspeed_env.sh needs the sbin folders Bazel's PATH lacks.
                env = dict(os.environ, UCP_CACHE_DIR=os.path.dirname(os.path.dirname(ROOT_DIR)),
                           PATH="/usr/sbin:/usr/bin:/sbin:/bin")
                cmd = ["bash", DEEPSPEED_ENV, "run", f"--root={SUITE}", f"--bind={work}", f"--cwd={cwd}"]
                cmd += [f"--env={k}={v}" for k, v in env_vars.items()] + ["--"] + list(args)
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
            self.assertEqual(p.returncode, 0, f"{' '.join(cmd)}:\n{p.stdout}{p.stderr}")
            return p

        python = "/usr/bin/python3"
        run(python, "-m", "venv", "--system-site-packages", venv)
        vpython = os.path.join(venv, "bin", "python")
        version = run(vpython, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
        self.assertEqual(version, PYTHON_VERSION)
        install = run(vpython, "-m", "pip", "install", "--no-index", local_wheel)
        self.assertIn("Successfully installed ucp", install.stdout)
        where = run(vpython, "-c", "import ucp, numpy; print(ucp.__file__); print(ucp._core.__file__)")
        site = os.path.join(venv, "lib", f"python{PYTHON_VERSION}", "site-packages", "ucp")
        tag = PYTHON_VERSION.replace(".", "")
        self.assertEqual(where.stdout.split(), [os.path.join(site, "__init__.py"),
                                                os.path.join(site, f"_core.cpython-{tag}-x86_64-linux-gnu.so")])
        # The README's three lines, from `checkout` (../shared/fixtures beside it), writing under
        # this test's folder instead of /tmp, then a check against torch.load of the verified file.
        lines = readme_example()
        self.assertEqual(len(lines), 3, lines)
        code = "\n".join(lines).replace("/tmp/", work + "/")
        code += ("\nimport torch, warnings\nwarnings.simplefilter('ignore')\n"
                 f"assert torch.equal(torch.from_numpy(w), torch.load({local_expected!r})['param'])\n"
                 "print('ok', w.shape)\n")
        out = run(vpython, "-c", code, cwd=checkout)
        self.assertIn("ok (64, 64)", out.stdout)
        usage = run(vpython, "-m", "ucp", "ds_to_universal", "--help")
        self.assertIn("--num_extract_workers", usage.stdout)
        # The console command: the bundled binary, every command.
        ucp_cmd = os.path.join(venv, "bin", "ucp")
        self.assertIn("minimum glibc: ", run(ucp_cmd, "--version").stdout)
        converted = os.path.join(work, "cli", "global_step4_universal")
        run(ucp_cmd, "convert", f"--input_folder=../shared/fixtures/deepspeed-0.14.4/{FIXTURE}/global_step4",
            f"--output_folder={converted}", "--progress=never", cwd=checkout)
        inspect = run(ucp_cmd, "inspect", converted)
        self.assertIn("universal", inspect.stdout)
        # The Python API and the CLI wrote the same bytes.
        api_files, _ = testutil.tree(os.path.join(work, "ucp-example", "global_step4_universal"))
        cli_files, _ = testutil.tree(converted)
        self.assertEqual(sorted(api_files), sorted(cli_files))
        self.assertEqual([k for k in api_files if api_files[k] != cli_files[k]], [])


if __name__ == "__main__":
    unittest.main()
