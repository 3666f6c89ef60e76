#!/usr/bin/python3
# Unit tests of the oracle of the real-DeepSpeed tests (realds/worker/oracle.py),
# on the host with Debian's python3-torch, no DeepSpeed: synthetic per-rank dumps
# of a tp 2 GPT-NeoX model, merged by the family's split table, must compare
# equal when they are, and every kind of damage must be reported: a tp slice
# merged on the wrong dim, a replicated param whose tp copies differ, a split
# table that disagrees with the model's marks, another step, hyper-parameters,
# states sharing one step tensor, and losses off in each way the checks know.
import json
import os
import shutil
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "worker"))
import oracle  # noqa: E402

H, V = 8, 16
# name -> (full shape, split dim or None), as the neox family marks them
PARAMS = {
    "0.word_embeddings.weight": ((V, H), 0),
    "2.attention.dense.weight": ((H, H), 1),
    "2.attention.dense.bias": ((H,), None),
    "2.input_layernorm.scale": ((H,), None),
    "2.mlp.dense_h_to_4h.weight": ((4 * H, H), 0),
}


def full_state(seed):
    g = torch.Generator().manual_seed(seed)
    return {n: {s: torch.randn(shape, generator=g) for s in oracle.STATES} for n, (shape, _) in PARAMS.items()}


def write_dumps(d, full, tp=2, step=3.0, groups=None, shared_step=False, mutate=None):
    os.makedirs(d, exist_ok=True)
    for t in range(tp):
        params = {}
        for n, (shape, dim) in PARAMS.items():
            e = {"split": dim}
            for s in oracle.STATES:
                x = full[n][s]
                e[s] = x.clone() if dim is None else x.chunk(tp, dim)[t].clone()
            params[n] = e
        if mutate:
            mutate(t, params)
        nstates = 2
        du = {"params": params, "buffers": {}, "groups": groups or [{"lr": 1e-3, "weight_decay": 0.01},
                                                                      {"lr": 1e-3, "weight_decay": 0.0}],
              "steps": [[step], [step]], "anomalies": [], "global_steps": 3, "global_samples": 12,
              "optimizer": "DeepSpeedZeroOptimizer", "distinct_step_objects": 1 if shared_step else nstates,
              "step_states": nstates, "meta": {"tp": tp, "pp": 1, "dp": 1, "ep": 1, "tp_rank": t, "pp_rank": 0,
                                               "dp_rank": 0, "ep_rank": 0}}
        torch.save(du, os.path.join(d, f"rank{t}.pt"))


def write_losses(prefix, values):
    with open(prefix + ".rank0", "w") as f:
        json.dump([{"step": s, "sample": i, "loss": float(v).hex()} for (s, i), v in values.items()], f)


class OracleTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.full = full_state(1)
        write_dumps(f"{self.tmp}/ref", self.full)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def compare(self, **kw):
        write_dumps(f"{self.tmp}/got", self.full, **kw)
        return oracle.compare_states(f"{self.tmp}/ref", f"{self.tmp}/got", "neox")

    def test_equal_states_pass(self):
        r = self.compare()
        self.assertEqual(r["problems"], [])
        self.assertEqual(r["fp32_equal"], len(PARAMS))

    def test_same_state_at_another_tp_passes(self):
        write_dumps(f"{self.tmp}/got", self.full, tp=1)
        r = oracle.compare_states(f"{self.tmp}/ref", f"{self.tmp}/got", "neox")
        self.assertEqual(r["problems"], [])

    def test_row_parallel_slices_merged_on_dim_0_are_caught(self):
        def cat0(t, params):  # each rank holds rows of the full tensor instead of columns
            x = self.full["2.attention.dense.weight"]
            for s in oracle.STATES:
                params["2.attention.dense.weight"][s] = x[s].chunk(2, 0)[t].clone().reshape(H, H // 2)
        r = self.compare(mutate=cat0)
        self.assertTrue(any("2.attention.dense.weight" in p for p in r["problems"]), r["problems"])

    def test_one_bit_off_is_caught(self):
        def flip(t, params):
            if t == 1:
                x = params["2.mlp.dense_h_to_4h.weight"]["exp_avg_sq"]
                x.view(torch.int32)[0, 0] ^= 1
        r = self.compare(mutate=flip)
        self.assertTrue(any("dense_h_to_4h.weight exp_avg_sq" in p for p in r["problems"]), r["problems"])

    def test_replicated_copies_that_differ_are_caught(self):
        def drift(t, params):
            if t == 1:
                params["2.input_layernorm.scale"]["fp32"] += 1e-3
        r = self.compare(mutate=drift)
        self.assertTrue(any("replicated 2.input_layernorm.scale fp32 differs" in p for p in r["problems"]),
                        r["problems"])

    def test_split_table_must_match_the_models_marks(self):
        def mark(t, params):
            params["2.attention.dense.bias"]["split"] = 0
        r = self.compare(mutate=mark)
        self.assertTrue(any("the model marked 0" in p for p in r["problems"]), r["problems"])

    def test_step_hyper_parameters_and_shared_steps_are_caught(self):
        self.assertTrue(any("step 4.0" in p for p in self.compare(step=4.0)["problems"]))
        r = self.compare(groups=[{"lr": 1e-3, "weight_decay": 0.01}, {"lr": 1e-3, "weight_decay": 0.01}])
        self.assertTrue(any("group 1 hyper-parameters differ" in p for p in r["problems"]), r["problems"])
        r = self.compare(shared_step=True)
        self.assertTrue(any("share 1 step tensor" in p for p in r["problems"]), r["problems"])

    def test_frozen_params_compare_their_weight_and_want_no_states(self):
        def freeze(t, params):  # a frozen param (LoRA's base), as dumps.py marks it: lp only
            e = params["2.input_layernorm.scale"]
            for s in ("fp32", "exp_avg", "exp_avg_sq"):
                del e[s]
            e["frozen"] = True
        write_dumps(f"{self.tmp}/ref", self.full, mutate=freeze)
        r = self.compare(mutate=freeze)
        self.assertEqual(r["problems"], [])
        self.assertEqual(r["unequal"] if "unequal" in r else [], [])
        self.assertIn("lp 5/5 fp32 4/4 exp_avg 4/4 exp_avg_sq 4/4 (1 frozen)", r["line"])

        def freeze_and_drift(t, params):
            freeze(t, params)
            params["2.input_layernorm.scale"]["lp"] += 1e-3
        r = self.compare(mutate=freeze_and_drift)
        self.assertTrue(any("2.input_layernorm.scale lp" in p for p in r.get("unequal", []) + r["problems"]),
                        (r["problems"], r.get("unequal")))
        r = self.compare()  # the loading job trains it: frozen in the saving job only
        self.assertIn("param 2.input_layernorm.scale: frozen in the saving job only", r["problems"])

    def test_digests_tell_permuted_from_changed(self):
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        a, b = oracle.tensor_digest(x), oracle.tensor_digest(x.flip(0).contiguous())
        self.assertNotEqual(a["sha256"], b["sha256"])
        self.assertEqual((a["sum"], a["l2"], a["absmax"]), (b["sum"], b["l2"], b["absmax"]))
        self.assertNotEqual(a["l2"], oracle.tensor_digest(x + 1)["l2"])


class SubParamMergeTest(unittest.TestCase):
    """A fused gate_up_proj [gate(5); up(5)] cut by AutoTP over tp 2 in widths
    3 + 2 per sub-param: rank 0 holds gate rows 0-2 and up rows 5-7, rank 1
    gate rows 3-4 and up rows 8-9 (written out by hand)."""

    def test_pieces_merge_per_sub_param(self):
        full = torch.arange(20.0).reshape(10, 2)
        parts = [full[[0, 1, 2, 5, 6, 7]], full[[3, 4, 8, 9]]]
        problems = []
        self.assertTrue(torch.equal(oracle._merge_sub_params(parts, 0, 2, "gate_up", problems), full))
        self.assertEqual(problems, [])
        # A plain concatenation would interleave them: the merge is not that.
        self.assertFalse(torch.equal(torch.cat(parts), full))

    def test_a_part_of_odd_rows_is_reported(self):
        problems = []
        oracle._merge_sub_params([torch.zeros(5, 2), torch.zeros(4, 2)], 0, 2, "gate_up", problems)
        self.assertTrue(problems and "tp rank 0" in problems[0], problems)


class LossesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.src = {(s, i): 4.0 + 0.01 * s + 0.001 * i for s in (4, 5) for i in range(4)}
        write_losses(f"{self.tmp}/S", self.src)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def check(self, loaded, resumed, tol=1e-4, bitwise=True):
        write_losses(f"{self.tmp}/L", loaded)
        write_losses(f"{self.tmp}/P", resumed)
        return oracle.compare_losses(f"{self.tmp}/S", f"{self.tmp}/L", f"{self.tmp}/P", tol, bitwise)["problems"]

    def test_identical_runs_pass(self):
        self.assertEqual(self.check(self.src, self.src), [])

    def test_a_resume_that_differs_by_one_ulp_is_caught(self):
        p = dict(self.src)
        p[(5, 1)] = torch.tensor(p[(5, 1)], dtype=torch.float64).nextafter(torch.tensor(10.0, dtype=torch.float64)).item()
        self.assertTrue(any(x.startswith("(a)") for x in self.check(self.src, p)))

    def test_first_step_must_be_bitwise_when_asked(self):
        l = dict(self.src)
        l[(4, 0)] += 1e-7
        self.assertTrue(any("first resumed step 4" in x for x in self.check(l, l)))
        self.assertEqual(self.check(l, l, bitwise=False), [])

    def test_later_steps_within_the_tolerance(self):
        l = dict(self.src)
        l[(5, 2)] += 1e-3
        self.assertTrue(any("step 5" in x and "> 0.0001" in x for x in self.check(l, l)))


if __name__ == "__main__":
    unittest.main()
