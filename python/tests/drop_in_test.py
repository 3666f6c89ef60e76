"""`python3 -m ucp ds_to_universal` is a drop-in for DeepSpeed's ds_to_universal.py command line and writes
byte for byte what `ucp convert` writes with the same flags."""

import os
import subprocess
import sys
import unittest

import testutil
from testutil import fixture

# The flags of deepspeed/checkpoint/ds_to_universal.py, as pipelines pass them.
DS_FLAGS = ["--num_extract_workers", "4", "--num_merge_workers", "2", "--keep_temp_folder", "--no_strict",
            "--inject_missing_state"]


def run_module(*args):
    env = dict(os.environ)
    return subprocess.run([testutil.PYTHON, "-m", "ucp"] + list(args), capture_output=True, text=True, env=env)


class DropInTest(unittest.TestCase):

    def compare(self, name, source, ds_args, cli_args):
        work = testutil.fresh_dir(name)
        py_out = os.path.join(work, "py", "global_step4_universal")
        cli_out = os.path.join(work, "cli", "global_step4_universal")
        py = run_module("ds_to_universal", "--input_folder", source, "--output_folder", py_out, *ds_args)
        self.assertEqual(py.returncode, 0, py.stderr)
        cli = testutil.run_cli("convert", "--input_folder", source, "--output_folder", cli_out, *cli_args)
        # The whole roots: the universal folder and latest_universal beside it.
        testutil.assert_same_tree(self, os.path.join(work, "py"), os.path.join(work, "cli"))
        self.assertTrue(os.path.exists(os.path.join(work, "py", "latest_universal")))
        self.assertEqual(py.stdout, cli.stdout.replace("/cli/", "/py/"))
        return py

    def test_deepspeed_flags_on_every_fixture(self):
        for fx in ("neox-tp2-pp1-dp1", "neox-tp2-pp1-dp2", "neox-tp1-pp2-dp1", "neox-bf16-tp2-pp1-dp2",
                   "gpt-zero2-nopipe-tp2-dp2"):
            with self.subTest(fixture=fx):
                py = self.compare(f"ds_{fx}", fixture(f"{fx}/global_step4"), DS_FLAGS, DS_FLAGS)
                self.assertIn("--inject_missing_state is not needed", py.stderr)

    def test_plain_command_line(self):
        self.compare("plain", fixture("neox-tp2-pp1-dp1/global_step4"), [], [])

    def test_equals_sign_prefixes_and_strict(self):
        # argparse forms: --flag=value, unambiguous prefixes; --strict is the default.
        source = fixture("neox-tp2-pp1-dp1/global_step4")
        self.compare("forms", source, ["--num_extract=2", "--keep", "--strict"],
                     ["--num_extract_workers=2", "--keep_temp_folder"])

    def test_root_folder_with_latest(self):
        self.compare("root", fixture("neox-tp2-pp1-dp1"), DS_FLAGS, DS_FLAGS)

    def test_ucp_flags_pass_through(self):
        source = fixture("neox-tp2-pp1-dp1/global_step4")
        py = self.compare("extra", source, DS_FLAGS + ["--preset=gpt-neox", "--explain", "--digest", "sha256"],
                          DS_FLAGS + ["--preset=gpt-neox", "--explain", "--digest=sha256"])
        self.assertIn("attention.dense.weight", py.stdout)

    def test_progress_json_on_stderr(self):
        work = testutil.fresh_dir("progress")
        py = run_module("ds_to_universal", "--input_folder", fixture("neox-tp2-pp1-dp1/global_step4"),
                        "--output_folder", os.path.join(work, "u"), "--progress=json")
        self.assertEqual(py.returncode, 0, py.stderr)
        self.assertIn('"command": "convert"', py.stderr)

    def test_errors_exit_like_the_cli(self):
        work = testutil.fresh_dir("errors")
        missing = os.path.join(work, "nope")
        py = run_module("ds_to_universal", "--input_folder", missing, "--output_folder", missing + "_u")
        cli = testutil.run_cli("convert", "--input_folder", missing, "--output_folder", missing + "_u", check=False)
        self.assertEqual((py.returncode, cli.returncode), (1, 1))
        self.assertEqual(py.stderr, cli.stderr)
        self.assertIn("[NOT_FOUND]", py.stderr)
        # A bad command line is argparse's usage error, as with DeepSpeed's script.
        usage = run_module("ds_to_universal", "--input_folder", missing)
        self.assertEqual(usage.returncode, 2)
        self.assertIn("--output_folder", usage.stderr)
        unknown = run_module("ds_to_universal", "--input_folder", missing, "--output_folder", missing, "--bogus=1")
        self.assertEqual(unknown.returncode, 2)
        self.assertIn("bogus", unknown.stderr)
        self.assertEqual(os.listdir(work), [])


if __name__ == "__main__":
    unittest.main()
