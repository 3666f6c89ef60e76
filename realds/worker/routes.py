# DeepSpeed's own checkpoint routes for tools/upstream_check.sh (runs in a
# Debian root, in a process forked by zygote.py; see realds/README.md): each
# runs the DeepSpeed tree under test, unmodified or patched, and compares what
# it gives with a golden case's expected merged tensors (digests):
#
#   ds_to_universal(src, out, inject)        deepspeed/checkpoint/ds_to_universal.py, as a user runs it
#   compare_universal_files(out, expected)   its zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt
#   compare_zero_to_fp32(src, tag, expected) zero_to_fp32's get_fp32_state_dict_from_zero_checkpoint
#   compare_dump(ref, family, expected)      what a job held after load_universal or a plain load
#                                            (dumps.py, merged by the oracle)
#   compare_universal_folders(ours, theirs)  two universal folders (ucp convert's and
#                                            ds_to_universal.py's of one checkpoint), field by field
#
# Each compare returns {"pass": bool, "detail": the first problem, "checked": n}.
import glob
import os
import runpy
import sys

import torch

import oracle

DS_STATES = ("fp32", "exp_avg", "exp_avg_sq")
HYPER_PARAMETERS = ("lr", "betas", "eps", "weight_decay")


def ds_to_universal(src, out, inject):
    """Runs the tree's ds_to_universal.py script in this process (its own
    argument parsing, its worker pools), with one worker of each kind."""
    import deepspeed
    script = os.path.join(os.path.dirname(deepspeed.__file__), "checkpoint", "ds_to_universal.py")
    argv = ["ds_to_universal.py", "--input_folder", src, "--output_folder", out,
            "--num_extract_workers", "1", "--num_merge_workers", "1"]
    if inject:
        with open(script) as f:
            if "--inject_missing_state" in f.read():
                argv.append("--inject_missing_state")
    sys.argv = argv
    runpy.run_path(script, run_name="__main__")
    return {"ok": True}


def _fmt(x):
    return f"{x:.6g}"


def _describe(name, state, got, want):
    """How a tensor differs from its digest: shape / dtype, else whether the
    values are permuted (same sums) or changed (by how much in L2 and max)."""
    if list(got["shape"]) != list(want["shape"]) or got["dtype"] != want["dtype"]:
        return (f"{name} {state}: {tuple(got['shape'])} {got['dtype']}, expected {tuple(want['shape'])} "
                f"{want['dtype']}")
    same_sums = got["sum"] == want["sum"] and got["l2"] == want["l2"] and got["absmax"] == want["absmax"]
    if same_sums:
        return f"{name} {state}: the same values in another order (sum, L2 and max equal, bytes differ)"
    return (f"{name} {state}: values differ: L2 {_fmt(got['l2'])} vs {_fmt(want['l2'])} "
            f"(|diff| {_fmt(abs(got['l2'] - want['l2']))}), max |x| {_fmt(got['absmax'])} vs {_fmt(want['absmax'])}, "
            f"sum {_fmt(got['sum'])} vs {_fmt(want['sum'])}")


def _compare(got, expected, states, what):
    """got: name -> state -> digest (or a string: why it is missing)."""
    checked = 0
    for name in sorted(expected["tensors"]):
        for state in states:
            want = expected["tensors"][name][state]
            g = got.get(name, {}).get(state) if isinstance(got.get(name), dict) else None
            if g is None:
                why = got.get(name) if isinstance(got.get(name), str) else f"missing from {what}"
                return {"pass": False, "checked": checked, "detail": f"{name} {state}: {why}"}
            if isinstance(g, str):
                return {"pass": False, "checked": checked, "detail": f"{name} {state}: {g}"}
            if g["sha256"] != want["sha256"] or list(g["shape"]) != list(want["shape"]) or g["dtype"] != want["dtype"]:
                return {"pass": False, "checked": checked, "detail": _describe(name, state, g, want)}
            checked += 1
    return {"pass": True, "checked": checked, "detail": f"{checked} tensors bitwise"}


def compare_universal_files(out, expected):
    """zero/<param>/<state>.pt as ds_to_universal.py wrote them: a dict with
    'param' (ZeRO-1/2, the whole tensor) or a raw flat tensor (ZeRO-3, reshaped
    to the param's shape when its size fits, as the stage-3 loader does)."""
    zero = os.path.join(out, "zero")
    if not os.path.isdir(zero):
        return {"pass": False, "checked": 0, "detail": f"no zero/ folder in {out}"}
    got = {}
    for name, states in expected["tensors"].items():
        d = os.path.join(zero, name)
        if not os.path.isdir(d):
            got[name] = f"no zero/{name}/ folder"
            continue
        got[name] = {}
        for s in DS_STATES:
            f = os.path.join(d, f"{s}.pt")
            if not os.path.exists(f):
                got[name][s] = f"no zero/{name}/{s}.pt"
                continue
            v = torch.load(f, weights_only=False)
            t = v.get("param") if isinstance(v, dict) else v
            if not torch.is_tensor(t):
                got[name][s] = f"zero/{name}/{s}.pt holds {type(v).__name__}, no tensor"
                continue
            want = states[s]["shape"]
            if t.dim() == 1 and len(want) != 1 and t.numel() == _numel(want):
                t = t.reshape(want)
            got[name][s] = oracle.tensor_digest(t)
    r = _compare(got, expected, DS_STATES, "the universal folder")
    if r["pass"]:
        steps = set()
        for f in glob.glob(os.path.join(zero, "*", "step.pt")):
            v = torch.load(f, weights_only=False)
            steps.add(float(v) if torch.is_tensor(v) else float(v.get("param", v)) if isinstance(v, dict) else float(v))
        if steps and steps != {float(expected["step"])}:
            return {"pass": False, "checked": r["checked"],
                    "detail": f"step.pt: {sorted(steps)}, expected {expected['step']}"}
    return r


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def compare_zero_to_fp32(src, tag, expected):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    sd = get_fp32_state_dict_from_zero_checkpoint(src, tag=tag)
    got = {n: {"fp32": oracle.tensor_digest(t.contiguous() if hasattr(t, "contiguous") else t)} for n, t in sd.items()}
    return _compare(got, expected, ("fp32",), "zero_to_fp32's state dict")


def compare_dump(ref, family, expected):
    """A loading job's dump (tp slices merged by the oracle) vs the goldens:
    every state, the optimizer step, each group's hyper-parameters."""
    d = oracle.digests(ref, family)
    if d["problems"]:
        return {"pass": False, "checked": 0, "detail": d["problems"][0]}
    r = _compare(d["tensors"], expected, ("lp",) + DS_STATES, "the loaded job")
    if not r["pass"]:
        return r
    if d["steps"] != [float(expected["step"])]:
        return {"pass": False, "checked": r["checked"],
                "detail": f"optimizer step {d['steps']}, expected {expected['step']}"}
    groups = expected.get("groups")
    if groups is not None:  # the hyper-parameters (not torch's own flags, which change with its version)
        if len(groups) != len(d["groups"]):
            return {"pass": False, "checked": r["checked"],
                    "detail": f"{len(d['groups'])} param groups, expected {len(groups)}"}
        for i, (g, w) in enumerate(zip(d["groups"], groups)):
            diff = {k: (g.get(k), w[k]) for k in HYPER_PARAMETERS if k in w and g.get(k) != w[k]}
            if diff:
                return {"pass": False, "checked": r["checked"],
                        "detail": f"group {i} hyper-parameters (got, expected): {diff}"}
    return r


def _fields(v):
    """A value of a universal file as comparable data: tensors as (dtype, shape,
    bytes), objects (SubparamShape, LossScaler, ...) as their class and fields,
    dicts as their items in order, lists and tuples kept apart."""
    import dataclasses
    if torch.is_tensor(v):
        t = v.detach().contiguous()
        return ("tensor", str(t.dtype), tuple(t.shape), t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (f"{type(v).__module__}.{type(v).__qualname__}",
                _fields({f.name: getattr(v, f.name) for f in dataclasses.fields(v)}))
    if isinstance(v, dict):
        return ("dict", [(k, _fields(x)) for k, x in v.items()])
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_fields(x) for x in v])
    if hasattr(v, "__dict__") and not isinstance(v, type):
        return (f"{type(v).__module__}.{type(v).__qualname__}", _fields(vars(v)))
    return (type(v).__name__, v)


def _first_difference(a, b, path):
    if a == b:
        return None
    if a[0] != b[0]:
        return f"{path}: {a[0]} vs {b[0]}"
    if a[0] == "tensor":
        what = "bytes" if a[1:3] == b[1:3] else f"{a[1]}{list(a[2])} vs {b[1]}{list(b[2])}"
        return f"{path}: tensors differ ({what})"
    if a[0] == "dict":
        ka, kb = [k for k, _ in a[1]], [k for k, _ in b[1]]
        if ka != kb:
            return f"{path}: keys {ka} vs {kb}"
        for (k, x), (_, y) in zip(a[1], b[1]):
            d = _first_difference(x, y, f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a[1], list) and isinstance(b[1], list) and len(a[1]) == len(b[1]):
        for j, (x, y) in enumerate(zip(a[1], b[1])):
            d = _first_difference(x, y, f"{path}[{j}]")
            if d:
                return d
        return None
    return f"{path}: {str(a[1])[:160]} vs {str(b[1])[:160]} ({a[0]})"


def compare_universal_folders(ours, theirs):
    """ucp's universal folder vs DeepSpeed's for the same checkpoint: the same
    zero/ files, each equal field by field (keys in order, metadata values,
    tensors bitwise), and the same universal_checkpoint_info in mp_rank_00
    (ucp writes one mp_rank_00 for a plain module of any tp, DeepSpeed copies
    every rank's: the files themselves are not compared)."""
    def files(root):
        z = os.path.join(root, "zero")
        return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(z) for f in fs)
    fa, fb = files(ours), files(theirs)
    if fa != fb:
        return {"pass": False, "checked": 0,
                "detail": f"zero/ files: only ucp's {sorted(set(fa) - set(fb))[:4]}, only DeepSpeed's "
                          f"{sorted(set(fb) - set(fa))[:4]}"}
    if not fa:
        return {"pass": False, "checked": 0, "detail": f"no zero/ files in {theirs}"}
    checked = 0
    for f in fa:
        d = _first_difference(_fields(torch.load(os.path.join(ours, f), weights_only=False)),
                              _fields(torch.load(os.path.join(theirs, f), weights_only=False)), f)
        if d:
            return {"pass": False, "checked": checked, "detail": d}
        checked += 1
    ms = "mp_rank_00_model_states.pt"
    if not os.path.exists(os.path.join(theirs, ms)):
        # The stage-3 layout: zero_pp_rank_D_mp_rank_TT files. At tp > 1 ucp writes
        # mp rank 0's as a tp=1 job's (mp_world_size 1, tp_degree 1): every other
        # field of each dp rank's file equal to DeepSpeed's copy.
        ms = "zero_pp_rank_0_mp_rank_00_model_states.pt"
        d = 0
        while os.path.exists(os.path.join(theirs, f"zero_pp_rank_{d}_mp_rank_00_model_states.pt")):
            name = f"zero_pp_rank_{d}_mp_rank_00_model_states.pt"
            sd = [torch.load(os.path.join(r, name), weights_only=False) for r in (ours, theirs)]
            for x in sd:
                x.pop("mp_world_size", None)
                (x.get("checkpoint_parallel_dimensions") or {}).pop("tp_degree", None)
            diff = _first_difference(_fields(sd[0]), _fields(sd[1]), name)
            if diff:
                return {"pass": False, "checked": checked, "detail": diff}
            checked += 1
            d += 1
    info = [torch.load(os.path.join(r, ms), weights_only=False).get("universal_checkpoint_info") for r in (ours, theirs)]
    d = _first_difference(_fields(info[0]), _fields(info[1]), f"{ms}['universal_checkpoint_info']")
    if d:
        return {"pass": False, "checked": checked, "detail": d}
    version = (info[1] or {}).get("universal_checkpoint_version")
    return {"pass": True, "checked": checked + 1,
            "detail": f"{checked} files (zero/, stage-3 model states) and universal_checkpoint_info (version {version}) "
                      "equal field by field"}
