# The oracle of the real-DeepSpeed tests (runs in a Debian root with torch; see
# realds/README.md). Independent of ucp: it merges the per-rank dumps of a
# DeepSpeed job (dumps.py) into whole tensors with the model family's own split
# table (families/<family>.py SPLITS, written from the model's code and checked
# against the split each param was marked with), and compares:
#
#   compare_states(ref, got, family)   every param's lp / fp32 / exp_avg / exp_avg_sq
#                                      bitwise (dtype, shape, bits), buffers, each
#                                      group's hyper-parameters, every state's step
#   compare_losses(source, loaded, resumed, ...)   (a) loaded == resumed bitwise,
#                                      (b) loaded vs the uninterrupted run within a
#                                      tolerance (bitwise for the first step if asked)
#   compare_export(path, ref, family)  a `ucp export` safetensors file vs the fp32 masters
#                                      (frozen params: their lp weights)
#   compare_zero_to_fp32(ckpt, tag, path, ref, family)   `ucp export --format=torch` vs
#                                      DeepSpeed's zero_to_fp32: names, order, bytes
#   digests(ref, family)               the goldens: per param and state, shape, dtype,
#                                      sha256 of the bytes and a few sums
#
# Each returns a JSON-able report whose "problems" list is empty when all is well.
import glob
import hashlib
import json
import os
import re

import torch

import families

STATES = ("lp", "fp32", "exp_avg", "exp_avg_sq")

# A native MoE expert's param (global expert id): whole on every rank holding
# it. DeepSpeed builds the expert groups over global ranks, across tp (README,
# "Native MoE at tp > 1"), so at tp > 1 each tp rank holds other experts: they
# are gathered from every rank, not merged over tp.
EXPERT = re.compile(r"\.deepspeed_moe\.experts\.deepspeed_experts\.\d+\.")


def load_dumps(d):
    files = sorted(glob.glob(os.path.join(d, "rank*.pt")))
    if not files:
        raise SystemExit(f"no dumps (rank*.pt) in {d}")
    return [torch.load(f, weights_only=False) for f in files]


def split_of(splits, name, problems):
    for pat, dim in splits:
        if re.search(pat, name):
            return dim
    problems.append(f"{name}: no split in the family's table")
    return None


class Merged:
    """One job's state, whole: params[name][state], buffers, groups, steps."""

    def __init__(self, d, family):
        fam = families.get(family)
        self.problems = []
        dumps = load_dumps(d)
        self.meta = dumps[0]["meta"]
        tp = self.meta["tp"]
        per_tp = [dict() for _ in range(tp)]
        per_tp_buf = [dict() for _ in range(tp)]
        experts, order = {}, []  # order: first seen (tp rank 0's params and the experts), as before experts
        for du in dumps:
            t = du["meta"]["tp_rank"]
            for p in du.get("anomalies", []):
                self.problems.append(f"{d}: rank dump anomaly: {p}")
            for name, e in du["params"].items():
                if EXPERT.search(name):  # whole: every rank holding it must agree
                    if name in experts:
                        for s in _states(e):
                            if not _same(experts[name][s], e[s]):
                                self.problems.append(f"expert {name} {s} differs between the ranks holding it in {d}")
                    else:
                        experts[name] = e
                        order.append(name)
                    continue
                if t == 0 and name not in per_tp[0]:
                    order.append(name)
                if name in per_tp[t]:  # held by several dp ranks or pipeline stages (tied): must agree
                    for s in _states(e):
                        if not _same(per_tp[t][name][s], e[s]):
                            self.problems.append(f"{name} {s} differs between ranks of tp rank {t} in {d}")
                else:
                    per_tp[t][name] = e
            for name, b in du["buffers"].items():
                per_tp_buf[t].setdefault(name, b)
        self.params, self.buffers = {}, {}
        for name in order:
            if name in experts:
                e = experts[name]
                self.params[name] = {"frozen": True} if e.get("frozen") else {}
                for s in _states(e):
                    self.params[name][s] = e[s]
                continue
            dim = split_of(fam.SPLITS, name, self.problems)
            marked = per_tp[0][name].get("split")
            sub = None
            if isinstance(dim, tuple) and dim and dim[0] == "sub":  # fused sub-params: ("sub", dim, count)
                sub, dim = dim[2], dim[1]
            if isinstance(dim, tuple):  # the table allows several splits: the one the model marked
                dim = marked if marked in dim else dim[0]
            if tp > 1 and marked != dim:
                self.problems.append(f"{name}: the family's table splits it on {dim}, the model marked {marked}")
            missing = [t for t in range(tp) if name not in per_tp[t]]
            if missing:
                self.problems.append(f"{name}: missing on tp ranks {missing}")
                continue
            self.params[name] = {"frozen": True} if per_tp[0][name].get("frozen") else {}
            for s in _states(per_tp[0][name]):
                parts = [per_tp[t][name][s] for t in range(tp)]
                if any(p is None for p in parts):  # frozen: no such state
                    if not all(p is None for p in parts):
                        self.problems.append(f"{name} {s}: absent on some tp ranks only")
                    self.params[name][s] = None
                elif dim is None:
                    for t in range(1, tp):
                        if not _same(parts[0], parts[t]):
                            self.problems.append(f"replicated {name} {s} differs between tp ranks 0 and {t}")
                    self.params[name][s] = parts[0]
                elif sub is not None:
                    self.params[name][s] = _merge_sub_params(parts, dim, sub, name, self.problems)
                else:
                    self.params[name][s] = torch.cat(parts, dim=dim)
        for name in per_tp_buf[0]:
            dim = split_of(fam.SPLITS, name, self.problems)
            parts = [per_tp_buf[t].get(name) for t in range(tp)]
            if any(p is None for p in parts):
                continue
            self.buffers[name] = parts[0] if dim is None else torch.cat(parts, dim=dim)
        self.dumps = dumps


def _merge_sub_params(parts, dim, count, name, problems):
    """A fused param of `count` equal sub-params (Phi-3's qkv_proj, gate_up_proj):
    each tp rank's part is one piece of every sub-param, side by side and of
    equal width, so the whole tensor is, per sub-param, its pieces over the ranks."""
    pieces = []
    for t, p in enumerate(parts):
        if p.shape[dim] % count:
            problems.append(f"{name}: tp rank {t} holds {p.shape[dim]} rows on dim {dim}, not {count} equal pieces")
            return parts[0]
        pieces.append(p.chunk(count, dim=dim))
    return torch.cat([torch.cat([pc[i] for pc in pieces], dim=dim) for i in range(count)], dim=dim)


def _states(e):
    """The states a dumped param has: a frozen param its lp weight only."""
    return ("lp",) if e.get("frozen") else STATES


def _same(a, b):
    if a is None or b is None:  # a frozen param's master and optimizer states: absent on both sides
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def describe_difference(a, b):
    if a is None or b is None:
        return f"{'absent' if b is None else 'present'} (frozen param), expected {'absent' if a is None else 'present'}"
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{tuple(b.shape)} {str(b.dtype).replace('torch.', '')}, expected {tuple(a.shape)} {str(a.dtype).replace('torch.', '')}"
    d = (a.double() - b.double()).abs()
    n = int((a != b).sum())
    return f"{n} of {a.numel()} elements differ, max |diff| {float(d.max()):.3g}"


def _hp_equal(a, b):
    ka, kb = {k for k in a if k != "name"}, {k for k in b if k != "name"}
    ea = re.fullmatch(r"ep_size_\d+", str(a.get("name")))
    eb = re.fullmatch(r"ep_size_\d+", str(b.get("name")))
    if not (ea and eb) and a.get("name") != b.get("name"):  # an expert group is named after the job's ep
        return False, {"name": (a.get("name"), b.get("name"))}
    diff = {k: (a.get(k), b.get(k)) for k in ka & kb if a.get(k) != b.get(k)}
    return not diff, diff


def compare_states(ref, got, family, check_buffers=True):
    """ref: the saving job's dump dir; got: the loading job's."""
    R, G = Merged(ref, family), Merged(got, family)
    rep = {"params": len(R.params), "problems": R.problems + G.problems, "unequal": []}
    for s in STATES:
        rep[f"{s}_equal"] = 0
    for n in sorted(set(R.params) - set(G.params)):
        rep["problems"].append(f"param {n} not in the loading job")
    for n in sorted(set(G.params) - set(R.params)):
        rep["problems"].append(f"param {n} not in the saving job")
    rep["frozen"] = sum(1 for n in R.params if R.params[n].get("frozen"))
    for n in sorted(set(R.params) & set(G.params)):
        if R.params[n].get("frozen") != G.params[n].get("frozen"):
            rep["problems"].append(f"param {n}: frozen in {'the saving' if R.params[n].get('frozen') else 'the loading'}"
                                   " job only")
            continue
        for s in _states(R.params[n]):
            if _same(R.params[n][s], G.params[n][s]):
                rep[f"{s}_equal"] += R.params[n][s] is not None  # a frozen param's absent states: not counted
            else:
                rep["unequal"].append(f"{n} {s}: {describe_difference(R.params[n][s], G.params[n][s])}")
    if rep["unequal"]:
        rep["problems"].append(f"{len(rep['unequal'])} tensors differ, first: {rep['unequal'][0]}")
    if check_buffers:
        rep["buffers"] = len(R.buffers)
        rep["buffers_equal"] = sum(1 for n in R.buffers if n in G.buffers and _same(R.buffers[n], G.buffers[n]))
        if rep["buffers_equal"] != rep["buffers"]:
            bad = [n for n in R.buffers if not (n in G.buffers and _same(R.buffers[n], G.buffers[n]))]
            rep["problems"].append(f"buffers: {rep['buffers_equal']} of {rep['buffers']} equal (first: {bad[0]})")
    # groups and steps: every rank holds every group
    r0, g0 = R.dumps[0], G.dumps[0]
    rep["groups"] = len(r0["groups"])
    rep["hparams_equal"] = 0
    if len(r0["groups"]) != len(g0["groups"]):
        rep["problems"].append(f"{len(g0['groups'])} param groups loaded, the source had {len(r0['groups'])}")
    for i, (a, b) in enumerate(zip(r0["groups"], g0["groups"])):
        ok, diff = _hp_equal(a, b)
        if ok:
            rep["hparams_equal"] += 1
        else:
            rep["problems"].append(f"group {i} hyper-parameters differ (source, loaded): {diff}")
    rep["step_states"] = rep["steps_equal"] = 0
    for ri, du in enumerate(G.dumps):
        for gi, steps in enumerate(du["steps"]):
            want = {s for r in R.dumps if gi < len(r["steps"]) for s in r["steps"][gi] if s is not None}
            if len(want) != 1:
                rep["problems"].append(f"the source's group {gi} has steps {sorted(want)}")
                continue
            w = want.pop()
            for j, s in enumerate(steps):
                rep["step_states"] += 1
                if s == w:
                    rep["steps_equal"] += 1
                else:
                    rep["problems"].append(f"rank {ri} group {gi} state {j}: step {s}, the source's {w}")
        if du["distinct_step_objects"] != du["step_states"]:
            rep["problems"].append(f"rank {ri}: {du['step_states']} optimizer states share "
                                   f"{du['distinct_step_objects']} step tensor(s)")
    if r0.get("loss_scaler") != g0.get("loss_scaler"):
        rep["problems"].append(f"loss scaler: source {r0.get('loss_scaler')}, loaded {g0.get('loss_scaler')}")
    for k in ("global_steps", "global_samples"):
        if r0[k] != g0[k]:
            rep["problems"].append(f"{k}: loaded {g0[k]}, the source's {r0[k]}")
    n = rep["params"]
    nt = n - rep["frozen"]  # frozen params have an lp weight only
    rep["line"] = (" ".join(f"{s} {rep[s + '_equal']}/{n if s == 'lp' else nt}" for s in STATES) +
                   (f" ({rep['frozen']} frozen)" if rep["frozen"] else "") +
                   f"; hparams {rep['hparams_equal']}/{rep['groups']}; steps {rep['steps_equal']}/{rep['step_states']}" +
                   (f"; buffers {rep['buffers_equal']}/{rep['buffers']}" if check_buffers else ""))
    rep.pop("unequal") if not rep["unequal"] else None
    return rep


def read_losses(prefix):
    out = {}
    for f in sorted(glob.glob(prefix + ".rank*")):
        with open(f) as fh:
            for r in json.load(fh):
                out[(r["step"], r["sample"])] = float.fromhex(r["loss"])
    return out


def compare_losses(source, loaded, resumed, tolerance, first_step_bitwise):
    """source: the uninterrupted run's losses prefix; loaded: the run that loaded
    ucp's output; resumed: the run that loaded DeepSpeed's own save of that state."""
    S, L, P = read_losses(source), read_losses(loaded), read_losses(resumed)
    rep = {"problems": [], "records": len(L)}
    if not L:
        rep["problems"].append("no losses recorded after the load")
        return rep
    equal = sum(1 for k in L if k in P and L[k] == P[k])
    rep["a_equal"] = equal
    if set(L) != set(P) or equal != len(L):
        first = next((k for k in sorted(L) if P.get(k) != L[k]), None)
        rep["problems"].append(f"(a) {equal} of {len(L)} losses equal to the resume from DeepSpeed's own save"
                               + (f"; step {first[0]} sample {first[1]}: {L[first]!r} vs {P.get(first)!r}" if first else ""))
    steps = sorted({k[0] for k in L})
    rep["steps"] = steps
    rep["b_max_abs_diff"] = {}
    for s in steps:
        keys = [k for k in L if k[0] == s]
        if any(k not in S for k in keys):
            rep["problems"].append(f"(b) the uninterrupted run has no losses of step {s}")
            continue
        d = max(abs(L[k] - S[k]) for k in keys)
        rep["b_max_abs_diff"][str(s)] = d
        if s == steps[0] and first_step_bitwise and d != 0.0:
            rep["problems"].append(f"(b) first resumed step {s}: losses differ from the uninterrupted run by {d:.3g} "
                                   "(expected bitwise: same tp, same weights)")
        elif d > tolerance:
            rep["problems"].append(f"(b) step {s}: losses differ from the uninterrupted run by {d:.3g} > {tolerance:g}")
    diffs = rep["b_max_abs_diff"]
    rep["line"] = (f"(a) {equal}/{len(L)} bitwise; (b) " +
                   ", ".join(f"s{s} {'=' if d == 0 else format(d, '.2g')}" for s, d in diffs.items()))
    return rep


def compare_export(path, ref, family):
    """A safetensors file of `ucp export` (fp32 masters, checkpoint names) vs the
    merged fp32 masters of the saving job."""
    from safetensors.torch import load_file
    R = Merged(ref, family)
    got = load_file(path)
    rep = {"problems": list(R.problems), "params": len(R.params), "equal": 0}
    for n, e in R.params.items():
        want = e["lp"] if e.get("frozen") else e["fp32"]  # a frozen param: its module weight, as stored
        if n not in got:
            rep["problems"].append(f"{n}: not in {os.path.basename(path)}")
        elif _same(want, got[n]):
            rep["equal"] += 1
        else:
            rep["problems"].append(f"{n}: {describe_difference(want, got[n])}")
    extra = sorted(set(got) - set(R.params) - set(R.buffers))
    if extra:
        rep["problems"].append(f"{len(extra)} tensors not in the model, first: {extra[0]}")
    rep["line"] = f"export {rep['equal']}/{rep['params']} fp32 bitwise"
    return rep


def compare_zero_to_fp32(ckpt, tag, path, ref, family):
    """`ucp export --format=torch` (path: its pytorch_model.bin) vs DeepSpeed's
    own zero_to_fp32 of the same checkpoint (get_fp32_state_dict_from_zero_checkpoint
    of the DeepSpeed this runs): the same names in the same order, every tensor
    bitwise (dtype, shape, bytes). The one difference allowed is ucp's on
    purpose: it also exports a ZeRO-1 checkpoint's frozen params, which
    zero_to_fp32 leaves out (their frozen_param_shapes is None); they must be
    frozen params of the saving job (ref), all missing from zero_to_fp32's."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    ds = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag=tag)
    got = torch.load(path, weights_only=False)
    R = Merged(ref, family)
    frozen = {n for n, e in R.params.items() if e.get("frozen")}
    rep = {"problems": list(R.problems), "tensors": len(ds), "equal": 0}
    extra = [n for n in got if n not in ds]
    dropped = frozen & set(extra)
    # Allowed: every frozen param, when zero_to_fp32 drops them all, and the tied
    # aliases of those (named_parameters lists a tied param once: not in the dump).
    allowed = frozen | {n for n in got if n not in R.params and n not in R.buffers}
    if extra and (not set(extra) <= allowed or not frozen <= set(extra)):
        rep["problems"].append(f"ucp exports {len(extra)} tensors zero_to_fp32 does not, first {extra[0]} "
                               f"(allowed: the frozen params, and their tied aliases, when zero_to_fp32 drops them all)")
    missing = [n for n in ds if n not in got]
    if missing:
        rep["problems"].append(f"{len(missing)} of zero_to_fp32's tensors not exported, first {missing[0]}")
    order = [n for n in got if n in ds]
    if not missing and order != list(ds):
        i = next(i for i, (a, b) in enumerate(zip(order, ds)) if a != b)
        rep["problems"].append(f"order differs at {i}: ucp {order[i]}, zero_to_fp32 {list(ds)[i]}")
    for n, t in ds.items():
        if n in got:
            if _same(t.contiguous(), got[n].contiguous()):
                rep["equal"] += 1
            else:
                rep["problems"].append(f"{n}: {describe_difference(t, got[n])} (vs zero_to_fp32)")
    rep["line"] = (f"zero_to_fp32 {rep['equal']}/{rep['tensors']} bitwise, same order" +
                   (f"; +{len(dropped)} frozen params it drops (ZeRO-1)" if dropped else ""))
    return rep


def tensor_digest(t):
    """Shape, dtype, sha256 of the row-major bytes, and sums that tell a permuted
    tensor (same sums) from changed values."""
    t = t.detach().contiguous().cpu()
    raw = t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)
    d = t.double()
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "sha256": hashlib.sha256(raw.numpy().tobytes()).hexdigest(),
            "sum": float(d.sum()), "l2": float(d.pow(2).sum().sqrt()), "absmax": float(d.abs().max()) if t.numel() else 0.0}


def digests(ref, family):
    R = Merged(ref, family)
    r0 = R.dumps[0]
    steps = sorted({s for du in R.dumps for g in du["steps"] for s in g if s is not None})
    return {"problems": R.problems,
            "tensors": {n: {s: tensor_digest(e[s]) for s in _states(e)} for n, e in sorted(R.params.items())},
            "groups": r0["groups"], "steps": steps, "global_steps": r0["global_steps"]}
