"""`import ucp` against the real DeepSpeed fixtures: inspect, open/load, convert/reshard/export, progress,
the GIL, errors."""

import gc
import json
import os
import shutil
import struct
import threading
import time
import unittest
import warnings

import numpy as np
import torch

import ucp
import testutil
from testutil import fixture

NEOX_TP2 = fixture("neox-tp2-pp1-dp1/global_step4")
NEOX_TP2_EXPECTED = fixture("neox-tp2-pp1-dp1/global_step4_universal_expected")
NEOX_TP1_PP2 = fixture("neox-tp1-pp2-dp1/global_step4")
NEOX_TP1_PP2_DEEPSPEED = fixture("neox-tp1-pp2-dp1/global_step4_universal_deepspeed")
BF16_TP2 = fixture("neox-bf16-tp2-pp1-dp2/global_step4")
BF16_RESAVED_TP1 = fixture("neox-bf16-tp2-pp1-dp2/resaved-tp1-pp1-dp1/global_step4")
STATES = ("fp32", "exp_avg", "exp_avg_sq")


def torch_param(universal, name, state):
    """What torch.load gives for a param's state file of a universal folder."""
    return torch.load(os.path.join(universal, "zero", name, f"{state}.pt"), map_location="cpu")["param"]


def param_dirs(universal):
    """The params of a universal folder: the folders under zero/ (beside zero/optimizer_state.pt)."""
    zero = os.path.join(universal, "zero")
    return sorted(n for n in os.listdir(zero) if os.path.isdir(os.path.join(zero, n)))


def from_numpy(a):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        return torch.from_numpy(a)


def mapping_of(address):
    """The file /proc/self/maps says `address` lies in ('' for anonymous memory)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5] if len(parts) > 5 else ""
    return None


class InspectTest(unittest.TestCase):

    def assert_matches_textproto(self, d, fields, where):
        """Every field of the textproto has the dict's value; every other dict field is a default."""
        self.assertEqual(set(fields) - set(d), set(), f"{where}: fields missing from the dict")
        for key, value in d.items():
            got = fields.get(key, [])
            at = f"{where}.{key}"
            if isinstance(value, list):
                self.assertEqual(len(value), len(got), at)
                for i, (v, g) in enumerate(zip(value, got)):
                    if isinstance(v, dict):
                        self.assert_matches_textproto(v, g, f"{at}[{i}]")
                    else:
                        self.assertEqual(v, g, f"{at}[{i}]")
            elif isinstance(value, dict):
                self.assertEqual(len(got), 1, at)
                self.assert_matches_textproto(value, got[0], at)
            elif value is None:
                self.assertEqual(got, [], at)
            elif got:
                self.assertEqual([value], got, at)
                self.assertEqual(type(value), type(got[0]), at)
            else:
                self.assertIn(value, (0, "", False, 0.0), f"{at}: not in the textproto, so a default")

    def test_same_facts_as_cli_textproto(self):
        paths = [NEOX_TP2, NEOX_TP2_EXPECTED, BF16_TP2, fixture("gpt-zero2-nopipe-tp2-dp2/global_step4"),
                 os.path.join(NEOX_TP2, "mp_rank_00_model_states.pt"),
                 os.path.join(NEOX_TP2, "zero_pp_rank_0_mp_rank_01_optim_states.pt")]
        for path in paths:
            with self.subTest(path=path):
                d = ucp.inspect(path)
                text = testutil.run_cli("inspect", "--format=textproto", path).stdout
                fields = testutil.parse_textproto(text)
                self.assertGreater(len(fields), 3)
                self.assert_matches_textproto(d, fields, os.path.basename(path))

    def test_facts_against_torch_load(self):
        d = ucp.inspect(NEOX_TP2)
        self.assertEqual(d["kind"], "zero")
        self.assertEqual(d["tag"], "global_step4")
        self.assertEqual(d["topology"], {"tp": 2, "pp": 1, "dp": 1})
        self.assertEqual(d["zero_stage"], 1)
        self.assertTrue(d["pipeline"])
        ms = torch.load(os.path.join(NEOX_TP2, "mp_rank_00_model_states.pt"), map_location="cpu")
        shapes = {n: list(s) for group in ms["param_shapes"] for n, s in group.items()}
        params = {p["name"]: p for p in d["param"]}
        self.assertEqual(set(shapes), set(params))
        for name, shape in shapes.items():
            self.assertEqual(params[name]["shape"], shape, name)
            self.assertEqual(params[name]["dtype"], "float32", name)
            self.assertEqual(params[name]["layer"], int(name.split(".")[0]), name)
            self.assertGreater(len(params[name]["fragment"]), 0, name)
        self.assertEqual(len(d["group"]), len(ms["param_shapes"]))
        self.assertEqual(d["ds_version"], ms["ds_version"])

    def test_single_file_tree(self):
        path = os.path.join(NEOX_TP2_EXPECTED, "zero", "2.attention.dense.weight", "fp32.pt")
        d = ucp.inspect(path)
        self.assertEqual(d["kind"], "file")
        keys = {n["key"] for n in d["node"] if n["depth"] == 1}
        on_disk = torch.load(path, map_location="cpu")
        self.assertEqual(keys, set(on_disk))


class OpenLoadTest(unittest.TestCase):

    def test_zero_tp2_equals_expected_universal(self):
        ckpt = ucp.open(NEOX_TP2)
        self.assertEqual(ckpt.kind, "zero")
        self.assertEqual(ckpt.info["source_topology"], {"tp": 2, "pp": 1, "dp": 1})
        self.assertEqual(set(ckpt.info["state_keys"]), {"exp_avg", "exp_avg_sq"})
        names = param_dirs(NEOX_TP2_EXPECTED)
        trainable = sorted(n for n, p in ckpt.params.items() if p.role == "trainable")
        self.assertEqual(trainable, names)
        for name in names:
            for state in STATES:
                with self.subTest(name=name, state=state):
                    a = ckpt.load(name, state)
                    self.assertIsInstance(a, np.ndarray)
                    expected = torch_param(NEOX_TP2_EXPECTED, name, state)
                    self.assertTrue(torch.equal(from_numpy(a), expected))
                    self.assertEqual(a.shape, tuple(expected.shape))
                    self.assertEqual(ckpt.params[name].shape, tuple(expected.shape))

    def test_merge_kinds_agree_with_deepspeed_metadata(self):
        # The expected universal files carry what DeepSpeed's loader reads:
        # cat_dim 1 = row-parallel, cat_dim 0 = column (or vocab), none = replicated.
        ckpt = ucp.open(NEOX_TP2)
        for name in param_dirs(NEOX_TP2_EXPECTED):
            meta = torch.load(os.path.join(NEOX_TP2_EXPECTED, "zero", name, "fp32.pt"), map_location="cpu")
            p = ckpt.params[name]
            with self.subTest(name=name):
                if "cat_dim" not in meta:
                    self.assertEqual(p.kind, "REPLICATED")
                elif meta["cat_dim"] == 1:
                    self.assertEqual(p.kind, "ROW")
                else:
                    self.assertIn(p.kind, ("COLUMN", "VOCAB"))
                self.assertEqual(p.source, "PRESET")  # gpt-neox, detected from the names
                self.assertTrue(p.origin)
                self.assertEqual(p.rule["kind"], p.kind)
                self.assertEqual(p.dtype, "float32")
                self.assertEqual(p.group in (0, 1), True)

    def test_deepspeed_own_universal_output(self):
        # At tp=1 DeepSpeed's ds_to_universal.py output is right: ucp's reading of
        # the ZeRO folder, and of DeepSpeed's output itself, equal torch.load of it.
        zero = ucp.open(NEOX_TP1_PP2)
        universal = ucp.open(NEOX_TP1_PP2_DEEPSPEED)
        self.assertEqual(universal.kind, "universal")
        names = param_dirs(NEOX_TP1_PP2_DEEPSPEED)
        self.assertGreater(len(names), 10)
        for name in names:
            for state in STATES:
                with self.subTest(name=name, state=state):
                    expected = torch_param(NEOX_TP1_PP2_DEEPSPEED, name, state)
                    self.assertTrue(torch.equal(from_numpy(zero.load(name, state)), expected))
                    self.assertTrue(torch.equal(from_numpy(universal.load(name, state)), expected))

    def test_universal_load_is_a_view_of_the_mapped_file(self):
        ckpt = ucp.open(NEOX_TP2_EXPECTED)
        name = "2.attention.dense.weight"
        a = ckpt.load(name)
        self.assertFalse(a.flags.owndata)
        self.assertFalse(a.flags.writeable)
        self.assertTrue(a.flags.c_contiguous)
        path = mapping_of(a.ctypes.data)
        self.assertTrue(path.endswith(f"zero/{name}/fp32.pt"), path)
        b = ckpt.load(name)
        self.assertTrue(np.shares_memory(a, b))
        c = ckpt.load(name, copy=True)
        self.assertTrue(c.flags.owndata and c.flags.writeable)
        self.assertFalse(np.shares_memory(a, c))
        self.assertTrue(np.array_equal(a, c))
        with self.assertRaises(ValueError):
            a[0, 0] = 1.0  # read-only: the mapping is never written
        # The array keeps the mapping alive after the checkpoint is gone.
        t = from_numpy(a)
        del ckpt, b
        gc.collect()
        self.assertTrue(torch.equal(t, torch_param(NEOX_TP2_EXPECTED, name, "fp32")))
        self.assertEqual(mapping_of(a.ctypes.data), path)

    def test_zero_single_fragment_is_a_view_merged_tp_is_a_copy(self):
        one = ucp.open(NEOX_TP1_PP2)  # dp=1, tp=1: every param is one run of its flat partition
        name = "2.attention.dense.weight"
        a = one.load(name, "exp_avg")
        self.assertFalse(a.flags.owndata)
        self.assertIn("optim_states.pt", mapping_of(a.ctypes.data))
        two = ucp.open(NEOX_TP2)  # a row-parallel weight of two tp slices: assembled
        b = two.load(name, "fp32")
        self.assertTrue(b.flags.owndata)
        self.assertTrue(b.flags.writeable)

    def test_lp_weights_equal_deepspeed_tp1_save(self):
        # DeepSpeed's own save at tp=1 after loading the verified universal checkpoint: its layer files hold
        # the module weights, which ucp assembles from the tp=2 layer files.
        for source, resaved, lp_dtype in ((BF16_TP2, BF16_RESAVED_TP1, "bfloat16"),
                                          (NEOX_TP2, fixture("neox-tp2-pp1-dp1/resaved-tp1-pp1-dp1/global_step4"),
                                           "float32")):
            ckpt = ucp.open(source)
            self.assertEqual(ckpt.info["lp_dtype"], lp_dtype)
            checked = 0
            for name, p in ckpt.params.items():
                layer, local = name.split(".", 1)
                path = os.path.join(resaved, f"layer_{int(layer):02d}-model_00-model_states.pt")
                expected = torch.load(path, map_location="cpu")[local]
                with self.subTest(source=source, name=name):
                    self.assertEqual(p.dtype, lp_dtype)
                    raw = ckpt.load(name, "lp")
                    t = ckpt.load_torch(name, "lp")
                    self.assertEqual(t.dtype, expected.dtype)
                    self.assertTrue(torch.equal(t, expected))
                    if lp_dtype == "bfloat16":
                        self.assertEqual(raw.dtype, np.int16)  # numpy has no bfloat16: the bits
                        self.assertTrue(torch.equal(from_numpy(raw).view(torch.bfloat16), expected))
                    else:
                        self.assertTrue(torch.equal(from_numpy(raw), expected))
                    checked += 1
            self.assertGreater(checked, 10)

    def test_dtype_conversion_is_torchs(self):
        ckpt = ucp.open(BF16_TP2)
        name = "2.attention.query_key_value.weight"
        expected = ckpt.load_torch(name, "lp").to(torch.float32)
        a = ckpt.load(name, "lp", dtype="float32")
        self.assertEqual(a.dtype, np.float32)
        self.assertTrue(a.flags.writeable)
        self.assertTrue(torch.equal(torch.from_numpy(a), expected))
        b = ckpt.load_torch(name, "fp32", dtype="bf16")
        self.assertEqual(b.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(b, ckpt.load_torch(name, "fp32").to(torch.bfloat16)))

    def test_open_flags_decide_the_merge(self):
        ckpt = ucp.open(NEOX_TP2, preset="none", default_kind="column")
        p = ckpt.params["2.attention.dense.weight"]
        self.assertNotEqual(p.source, "PRESET")
        self.assertIn("2.attention.dense.weight", ckpt)
        self.assertEqual(len(ckpt), len(list(ckpt)))


class CommandTest(unittest.TestCase):

    def test_convert_writes_what_the_cli_writes(self):
        out = testutil.fresh_dir("convert_api")
        s = ucp.convert(input_folder=NEOX_TP2, output_folder=os.path.join(out, "py", "global_step4_universal"),
                        explain=True)
        cli = testutil.run_cli("convert", f"--input_folder={NEOX_TP2}",
                               f"--output_folder={os.path.join(out, 'cli', 'global_step4_universal')}", "--explain",
                               "--progress=never")
        testutil.assert_same_tree(self, os.path.join(out, "py"), os.path.join(out, "cli"))
        self.assertIsInstance(s, ucp.Summary)
        self.assertEqual(s.command, "convert")
        self.assertEqual(s.params, len(param_dirs(os.path.join(out, "py", "global_step4_universal"))))
        files, _ = testutil.tree(os.path.join(out, "py", "global_step4_universal"))
        self.assertEqual(s.files, len(files))
        self.assertEqual(str(s), cli.stdout.replace("/cli/", "/py/"))
        self.assertIn("2.attention.dense.weight", s.explain)
        # And the result loads as what DeepSpeed verified.
        ckpt = ucp.open(os.path.join(out, "py", "global_step4_universal"))
        for name in ("2.attention.dense.weight", "11.norm.scale"):
            self.assertTrue(torch.equal(from_numpy(ckpt.load(name, "exp_avg_sq")),
                                        torch_param(NEOX_TP2_EXPECTED, name, "exp_avg_sq")))

    def test_reshard_writes_what_the_cli_writes(self):
        out = testutil.fresh_dir("reshard_api")
        s = ucp.reshard(input_folder=NEOX_TP2_EXPECTED, output_folder=os.path.join(out, "py", "global_step4"), tp=1,
                        dp=2)
        cli = testutil.run_cli("reshard", f"--input_folder={NEOX_TP2_EXPECTED}",
                               f"--output_folder={os.path.join(out, 'cli', 'global_step4')}", "--tp=1", "--dp=2",
                               "--progress=never")
        testutil.assert_same_tree(self, os.path.join(out, "py"), os.path.join(out, "cli"))
        self.assertEqual(s.source_kind, "universal")
        self.assertEqual(s.source_topology, {"tp": 2, "pp": 1, "dp": 1})
        self.assertEqual(s.target_topology, {"tp": 1, "pp": 1, "dp": 2})
        self.assertEqual(str(s), cli.stdout.replace("/cli/", "/py/"))
        files, _ = testutil.tree(os.path.join(out, "py", "global_step4"))
        self.assertEqual(s.files, len(files))
        self.assertEqual(s.bytes, sum(len(b) for b in files.values()))
        ckpt = ucp.open(os.path.join(out, "py", "global_step4"))
        self.assertEqual(ckpt.info["source_topology"], {"tp": 1, "pp": 1, "dp": 2})
        name = "2.attention.dense.weight"
        self.assertTrue(torch.equal(from_numpy(ckpt.load(name)), torch_param(NEOX_TP2_EXPECTED, name, "fp32")))

    def test_export_writes_what_the_cli_writes(self):
        out = testutil.fresh_dir("export_api")
        s = ucp.export(input_folder=NEOX_TP2, output_folder=os.path.join(out, "py"), format="torch")
        cli = testutil.run_cli("export", f"--input_folder={NEOX_TP2}", f"--output_folder={os.path.join(out, 'cli')}",
                               "--format=torch", "--progress=never")
        testutil.assert_same_tree(self, os.path.join(out, "py"), os.path.join(out, "cli"))
        self.assertEqual(str(s), cli.stdout.replace(os.path.join(out, "cli"), os.path.join(out, "py")))
        sd = torch.load(os.path.join(out, "py", "pytorch_model.bin"), map_location="cpu")
        self.assertEqual(s.tensors, len(sd))
        name = "2.attention.dense.weight"
        self.assertTrue(torch.equal(sd[name], torch_param(NEOX_TP2_EXPECTED, name, "fp32")))

    def test_kwargs_are_the_cli_flags(self):
        out = testutil.fresh_dir("kwargs")
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'input'"):
            ucp.convert(input=NEOX_TP2, output_folder=out)
        with self.assertRaises(ucp.InvalidArgumentError) as e:
            ucp.convert(input_folder=NEOX_TP2, output_folder=os.path.join(out, "x"), digest="md5")
        self.assertIn("--digest=md5", e.exception.message)
        with self.assertRaises(ucp.InvalidArgumentError) as e:
            ucp.convert(output_folder=os.path.join(out, "x"))
        self.assertIn("--input_folder is required", e.exception.message)
        self.assertFalse(os.path.exists(os.path.join(out, "x")))
        # Every flag of `ucp convert --help` is a keyword argument, and documented.
        help_text = testutil.run_cli("convert", "--help").stdout
        for flag in ("input_folder", "num_extract_workers", "no_strict", "inject_missing_state", "preset"):
            self.assertIn(f"--{flag}", help_text)
            self.assertIn(f"--{flag}", ucp.convert.__doc__)
        for fn in (ucp.inspect, ucp.convert, ucp.reshard, ucp.export, ucp.open, ucp.Checkpoint.load):
            self.assertGreater(len(fn.__doc__), 200, fn.__name__)

    def test_allow_unsafe_pickle_holds_for_one_call(self):
        out = testutil.fresh_dir("unsafe")
        src = os.path.join(out, "src")
        shutil.copytree(NEOX_TP2, src)
        for root, dirs, files in os.walk(src):
            for n in files:
                os.chmod(os.path.join(root, n), 0o644)
        mp0 = os.path.join(src, "mp_rank_00_model_states.pt")
        edit = os.path.join(os.environ["UCP_RUNFILES"], "testdata/python/edit_checkpoint.py")
        import subprocess
        subprocess.run([testutil.PYTHON, edit, mp0, "set", "evil", "os.system"], check=True)
        with self.assertRaises(ucp.FailedPreconditionError) as e:
            ucp.convert(input_folder=src, output_folder=os.path.join(out, "a"))
        self.assertIn("UNSAFE pickle", e.exception.message)
        self.assertIn("posix.system", e.exception.message)
        self.assertFalse(os.path.exists(os.path.join(out, "a")))
        ucp.convert(input_folder=src, output_folder=os.path.join(out, "b"), allow_unsafe_pickle=True)
        self.assertTrue(os.path.isdir(os.path.join(out, "b")))
        # The permission does not outlive the call that asked for it.
        with self.assertRaises(ucp.FailedPreconditionError):
            ucp.convert(input_folder=src, output_folder=os.path.join(out, "c"))

    def test_strict_and_no_strict(self):
        out = testutil.fresh_dir("strict")
        rules = os.path.join(out, "rules.textproto")
        with open(rules, "w") as f:
            f.write('rule { pattern: "no_such_param" kind: ROW }\n')
        with self.assertRaises(ucp.Error) as e:
            ucp.convert(input_folder=NEOX_TP2, output_folder=os.path.join(out, "a"), rules=rules)
        self.assertIn("no_such_param", e.exception.message)
        cli = testutil.run_cli("convert", f"--input_folder={NEOX_TP2}", f"--output_folder={os.path.join(out, 'c')}",
                               f"--rules={rules}", check=False)
        self.assertEqual(cli.stderr, f"ucp: {e.exception}\n")
        for kwargs in ({"strict": False}, {"no_strict": True}):
            target = os.path.join(out, "b" + "".join(kwargs))
            ucp.convert(input_folder=NEOX_TP2, output_folder=target, rules=rules, **kwargs)
            self.assertTrue(os.path.isdir(target))
        with self.assertRaises(ucp.Error):  # no_strict=False is strict
            ucp.convert(input_folder=NEOX_TP2, output_folder=os.path.join(out, "d"), rules=rules, no_strict=False)

    def test_dry_run(self):
        out = testutil.fresh_dir("dry_run")
        s = ucp.convert(input_folder=NEOX_TP2, output_folder=os.path.join(out, "u"), dry_run=2)
        self.assertTrue(s.dry_run)
        self.assertIn("rank", s.plan)
        self.assertEqual(os.listdir(out), [])
        cli = testutil.run_cli("convert", f"--input_folder={NEOX_TP2}", f"--output_folder={os.path.join(out, 'u')}",
                               "--dry_run=2", "--progress=never")
        self.assertEqual(s.plan, cli.stdout)


class ProgressTest(unittest.TestCase):

    def test_callback_gets_the_json_fields(self):
        out = testutil.fresh_dir("progress")
        events = []
        threads = set()

        def on_progress(p):
            events.append(p)
            threads.add(threading.get_ident())

        ucp.convert(input_folder=NEOX_TP2, output_folder=os.path.join(out, "py"), progress=on_progress,
                    progress_interval=0)
        self.assertGreater(len(events), 3)
        cli = testutil.run_cli("convert", f"--input_folder={NEOX_TP2}", f"--output_folder={os.path.join(out, 'cli')}",
                               "--progress=json")
        lines = [json.loads(line) for line in cli.stderr.splitlines() if line.startswith("{")]
        self.assertGreater(len(lines), 0)
        for p in events:
            self.assertIsInstance(p, ucp.Progress)
            self.assertEqual(set(p.as_dict()), set(lines[0]))
            self.assertEqual(p.command, "convert")
            self.assertLessEqual(p.bytes_done, p.bytes_total)
            self.assertLessEqual(p.units_done, p.units_total)
            self.assertGreaterEqual(p.elapsed_s, 0)
        phases = list(dict.fromkeys(p.phase for p in events))
        self.assertEqual(phases, list(dict.fromkeys(line["phase"] for line in lines)))
        for phase in phases:  # each phase ends with its last event, complete
            last = [p for p in events if p.phase == phase][-1]
            self.assertEqual(last.units_done, last.units_total, phase)
            self.assertEqual(last.bytes_done, last.bytes_total, phase)
            self.assertEqual(last.eta_s, 0, phase)
        # Unthrottled, the events within a phase come too, not just its ends.
        self.assertTrue(any(0 < p.units_done < p.units_total for p in events))

    def test_interval_throttles_within_a_phase(self):
        out = testutil.fresh_dir("progress_throttle")
        every, throttled = [], []
        ucp.convert(input_folder=NEOX_TP2, output_folder=os.path.join(out, "a"), progress=every.append,
                    progress_interval=0)
        ucp.convert(input_folder=NEOX_TP2, output_folder=os.path.join(out, "b"), progress=throttled.append,
                    progress_interval=3600)
        phases = list(dict.fromkeys(p.phase for p in every))
        self.assertGreater(len(every), len(throttled))
        self.assertLessEqual(len(throttled), 2 * len(phases))  # first and last of each phase

    def test_callback_exception_is_raised_after_the_run(self):
        out = testutil.fresh_dir("progress_raise")
        calls = []

        def bad(p):
            calls.append(p)
            raise KeyError("from the callback")

        with self.assertRaisesRegex(KeyError, "from the callback"):
            ucp.reshard(input_folder=NEOX_TP2_EXPECTED, output_folder=os.path.join(out, "r", "global_step4"), tp=1,
                        progress=bad, progress_interval=0)
        self.assertEqual(len(calls), 1)  # no call after the first exception


class GilTest(unittest.TestCase):

    def assert_other_thread_runs(self, name, run):
        """run(out) writes out/<name> through a staging folder beside it, which exists only while run() works.
        A pure-Python thread listing `out` can see it only if run() let go of the GIL. A fast run may end
        before the thread is scheduled, so up to 20 tries; holding the GIL, no try can ever see it."""
        base = testutil.fresh_dir(f"gil_{name}")
        for attempt in range(20):
            out = os.path.join(base, str(attempt))
            os.makedirs(out)
            seen, stop = set(), threading.Event()

            def watch():
                while not stop.is_set():
                    seen.update(os.listdir(out))

            watcher = threading.Thread(target=watch)
            watcher.start()
            time.sleep(0.01)
            run(out)
            stop.set()
            watcher.join()
            final = set(os.listdir(out))
            self.assertIn(name, final)
            if any(".ucp-tmp-" in n for n in seen - final):
                return attempt
        self.fail(f"in 20 runs, another thread never ran while {name} was written")

    def test_another_thread_runs_while_converting(self):
        self.assert_other_thread_runs("u", lambda out: ucp.convert(
            input_folder=NEOX_TP2, output_folder=os.path.join(out, "u"), num_threads=1))

    def test_another_thread_runs_while_resharding(self):
        self.assert_other_thread_runs("global_step4", lambda out: ucp.reshard(
            input_folder=NEOX_TP2, output_folder=os.path.join(out, "global_step4"), tp=1, dp=2, num_threads=1))

    def test_another_thread_runs_while_exporting(self):
        self.assert_other_thread_runs("hf", lambda out: ucp.export(
            input_folder=NEOX_TP2, output_folder=os.path.join(out, "hf"), format="torch", num_threads=1))


class ErrorTest(unittest.TestCase):

    def test_missing_folder_is_not_found(self):
        missing = os.path.join(testutil.fresh_dir("missing"), "nope")
        for call in (lambda: ucp.open(missing), lambda: ucp.inspect(missing),
                     lambda: ucp.convert(input_folder=missing, output_folder=missing + "_u")):
            with self.assertRaises(ucp.NotFoundError) as e:
                call()
            err = e.exception
            self.assertIsInstance(err, ucp.Error)
            self.assertIsInstance(err, FileNotFoundError)
            self.assertEqual((err.code, err.code_name), (5, "NOT_FOUND"))
            self.assertIn("nope", err.message)
            self.assertEqual(str(err), f"{err.message} [NOT_FOUND]")
        cli = testutil.run_cli("convert", f"--input_folder={missing}", f"--output_folder={missing}_u", check=False)
        with self.assertRaises(ucp.Error) as e:
            ucp.convert(input_folder=missing, output_folder=missing + "_u")
        self.assertEqual(cli.stderr, f"ucp: {e.exception}\n")  # the CLI's message, word for word

    def test_param_and_state_errors(self):
        ckpt = ucp.open(NEOX_TP2_EXPECTED)
        with self.assertRaises(ucp.NotFoundError) as e:
            ckpt.load("no.such.param")
        self.assertIn("no.such.param", e.exception.message)
        with self.assertRaises(ucp.InvalidArgumentError) as e:
            ckpt.load("2.attention.dense.weight", "momentum_buffer")
        self.assertIsInstance(e.exception, ValueError)
        self.assertEqual(e.exception.code, 3)
        self.assertIn("exp_avg_sq", e.exception.message)
        with self.assertRaises(ucp.InvalidArgumentError):
            ckpt.load("2.attention.dense.weight", dtype="float7")
        # A universal checkpoint has no module weights of trainable params; the masters rounded are a dtype away.
        with self.assertRaises(ucp.NotFoundError) as e:
            ckpt.load("2.attention.dense.weight", "lp")
        self.assertIn(NEOX_TP2_EXPECTED, e.exception.message)
        self.assertIn("lp", e.exception.message)
        half = ckpt.load_torch("2.attention.dense.weight", dtype="bf16")
        self.assertTrue(torch.equal(half, torch_param(NEOX_TP2_EXPECTED, "2.attention.dense.weight",
                                                      "fp32").to(torch.bfloat16)))

    def test_unimplemented_is_not_implemented_error(self):
        # A Hugging Face folder whose weights are of two dtypes (DeepSpeed keeps one).
        out = testutil.fresh_dir("hf_two_dtypes")
        hf = os.path.join(out, "hf")
        os.makedirs(hf)
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump({"architectures": ["LlamaForCausalLM"]}, f)
        header = json.dumps({"a.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(os.path.join(hf, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + bytes(12))
        with self.assertRaises(ucp.UnimplementedError) as e:
            ucp.reshard(input_folder=hf, output_folder=os.path.join(out, "r", "global_step0"), dp=1,
                        preset="megatron-deepspeed")
        self.assertIsInstance(e.exception, NotImplementedError)
        self.assertEqual(e.exception.code_name, "UNIMPLEMENTED")
        self.assertIn("several dtypes", e.exception.message)
        self.assertFalse(os.path.exists(os.path.join(out, "r")))

    def test_deepspeeds_zero3_universal_folder_reshards_as_its_source(self):
        # DeepSpeed's own ds_to_universal.py output of a ZeRO-3 checkpoint (the
        # stage-3 layout): resharded to dp 1, the same files as the checkpoint
        # it came from resharded to dp 1.
        out = testutil.fresh_dir("zero3_universal_input")
        src = os.path.join(testutil.V19, "gpt-zero3-dp2")
        ucp.reshard(input_folder=os.path.join(src, "global_step4_universal_deepspeed"),
                    output_folder=os.path.join(out, "u", "global_step4"), dp=1)
        ucp.reshard(input_folder=os.path.join(src, "global_step4"), output_folder=os.path.join(out, "z", "global_step4"),
                    dp=1)
        names = sorted(os.listdir(os.path.join(out, "z", "global_step4")))
        self.assertIn("zero_pp_rank_0_mp_rank_00_optim_states.pt", names)
        self.assertEqual(sorted(os.listdir(os.path.join(out, "u", "global_step4"))), names)
        for n in names:
            with open(os.path.join(out, "u", "global_step4", n), "rb") as a, \
                    open(os.path.join(out, "z", "global_step4", n), "rb") as b:
                self.assertEqual(a.read(), b.read(), n)

    def test_zero3_opens(self):
        ckpt = ucp.open(os.path.join(testutil.V19, "gpt-zero3-dp2", "global_step4"))
        self.assertGreater(len(ckpt.params), 0)

    def test_existing_output_is_already_exists(self):
        out = testutil.fresh_dir("exists")
        target = os.path.join(out, "u")
        ucp.convert(input_folder=NEOX_TP2, output_folder=target)
        with self.assertRaises(ucp.AlreadyExistsError) as e:
            ucp.convert(input_folder=NEOX_TP2, output_folder=target)
        self.assertIsInstance(e.exception, FileExistsError)
        s = ucp.convert(input_folder=NEOX_TP2, output_folder=target, overwrite=True)
        self.assertEqual(s.output_folder, target)

    def test_damaged_input_is_data_loss_and_writes_nothing(self):
        work = testutil.fresh_dir("damaged")
        src = os.path.join(work, "global_step4")
        shutil.copytree(NEOX_TP2, src)  # the fixture is never touched
        victim = os.path.join(src, "zero_pp_rank_0_mp_rank_01_optim_states.pt")
        size = os.path.getsize(victim)
        with open(victim, "r+b") as f:
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0xFF]))
        target = os.path.join(work, "out", "u")
        with self.assertRaises(ucp.DataLossError) as e:
            ucp.convert(input_folder=src, output_folder=target)
        self.assertEqual(e.exception.code, 15)
        self.assertIn("zero_pp_rank_0_mp_rank_01_optim_states.pt", e.exception.message)
        self.assertEqual(os.listdir(os.path.dirname(target)) if os.path.isdir(os.path.dirname(target)) else [], [])

    def test_every_code_has_its_class(self):
        names = ["CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                 "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"]
        classes = set()
        for code, name in enumerate(names, start=1):
            cls = ucp._errors.from_status(code, name, "m").__class__
            self.assertTrue(issubclass(cls, ucp.Error))
            self.assertEqual((cls.code, cls.code_name), (code, name))
            self.assertIs(getattr(ucp, cls.__name__), cls)
            classes.add(cls)
        self.assertEqual(len(classes), 16)


if __name__ == "__main__":
    unittest.main()
