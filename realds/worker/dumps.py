# What a DeepSpeed job holds, dumped per rank for the oracle (runs in a Debian
# root; see realds/README.md): every param's lp weight, fp32 master, exp_avg and
# exp_avg_sq (each gathered whole over its dp group, still this tp rank's
# slice; a frozen param: its lp weight only, marked "frozen"), its tp split as the model marked it, the module's buffers, each param
# group's hyper-parameters, every optimizer state's `step` (and whether states
# share one `step` tensor), global steps / samples and the fp16 loss scaler.
#
# Read from the optimizer's own flat buffers, not from DeepSpeed's accessors
# where those are unreliable: after `load_universal`, `safe_get_full_fp32_param`
# returns exp_avg (`map_to_flat_opt_states` re-points the fragment), right after
# a plain load the state fragments are not linked yet, and DeepSpeed < 0.14.5
# maps only a window of an expert group at ep > 1. ZeRO-3 uses DeepSpeed's
# accessors (its partitions are per param) and GatheredParameters. Without
# ZeRO (stage 0) the optimizer holds each param whole: the torch optimizer
# itself (fp32: the master is the param) or FP16_UnfusedOptimizer (fp32_groups
# beside the lp params, states keyed by the masters).
#
#   dump_state(engine, built, path, meta)   -> path/rank{R}.pt
import os
import re

import torch
import torch.distributed as dist


def _version(v):
    return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", v).groups())


def _flat_partitions(opt):
    for name in ("single_partition_of_fp32_groups", "fp32_groups_flat_partition"):
        if getattr(opt, name, None) is not None:
            return getattr(opt, name)
    raise RuntimeError(f"{type(opt).__name__}: no flat fp32 partitions found")


def _bit16_groups(opt):
    for name in ("bit16_groups", "bf16_groups"):
        if getattr(opt, name, None) is not None:
            return getattr(opt, name)
    raise RuntimeError(f"{type(opt).__name__}: no bit16 groups found")


def _bit16_flat(opt):
    for name in ("bit16_groups_flat", "bf16_groups_flat"):
        if getattr(opt, name, None) is not None:
            return getattr(opt, name)
    raise RuntimeError(f"{type(opt).__name__}: no flat bit16 groups found")


def _full_by_partition(opt, p, key, anomalies):
    """p's `key` ('fp32' or an optimizer state) from the group's real partition:
    p's offset in its flat bit16 group, partition = flat numel / the group's dp
    size (DeepSpeed < 0.14.5 sized every group's mapping by the whole world)."""
    buf = torch.zeros(p.numel(), dtype=torch.float32)
    for gi, group in enumerate(_bit16_groups(opt)):
        offset = 0
        for q in group:
            if q is p:
                break
            offset += q.numel()
        else:
            continue
        pg = opt.real_dp_process_group[gi]
        size = _bit16_flat(opt)[gi].numel() // dist.get_world_size(group=pg)
        start = dist.get_rank(group=pg) * size
        lo, hi = max(offset, start), min(offset + p.numel(), start + size)
        flat = _flat_partitions(opt)[gi]
        t = flat if key == "fp32" else opt.optimizer.state[flat][key]
        if lo < hi:
            buf.narrow(0, lo - offset, hi - lo).copy_(t.narrow(0, lo - start, hi - lo))
        dist.all_reduce(buf, group=pg)
        return buf.reshape(p.shape)
    anomalies.append("a param in no bit16 group")
    return buf.reshape(p.shape)


def _full_by_mapping(opt, p, key, anomalies):
    buf = torch.zeros(p.numel(), dtype=torch.float32)
    m = p._hp_mapping
    if m is not None:
        flat = _flat_partitions(opt)[m.param_group_index]
        t = flat if key == "fp32" else opt.optimizer.state[flat][key]
        if t.shape != flat.shape:
            anomalies.append(f"group {m.param_group_index}: state {key} {tuple(t.shape)} vs partition {tuple(flat.shape)}")
        h, l = m.hp_fragment_address, m.lp_fragment_address
        buf.narrow(0, l.start, l.numel).copy_(t.narrow(0, h.start, h.numel))
    dist.all_reduce(buf, group=p._dp_group)
    return buf.reshape(p.shape)


def _unfused(opt):
    return getattr(opt, "fp32_groups", None) is not None and getattr(opt, "fp16_groups", None) is not None


def _full_zero0(opt, p, key, anomalies):
    """Stage 0: p's `key` from the optimizer that holds it whole."""
    if _unfused(opt):
        for g16, g32 in zip(opt.fp16_groups, opt.fp32_groups):
            for lp, hp in zip(g16, g32):
                if lp is p:
                    t = hp if key == "fp32" else opt.optimizer.state.get(hp, {}).get(key)
                    break
            else:
                continue
            break
        else:
            t = None
    else:
        t = p.detach() if key == "fp32" else opt.state.get(p, {}).get(key)
    if t is None:
        if p.requires_grad:
            anomalies.append(f"stage 0: a trainable param has no {key}")
        return torch.zeros(p.shape, dtype=torch.float32)
    return t.detach().clone().float().reshape(p.shape)


def dump_state(engine, built, path, meta):
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    opt = engine.optimizer
    zero3 = hasattr(opt, "fp32_partitioned_groups_flat")
    zero0 = engine.zero_optimization_stage() == 0 and not hasattr(opt, "bf16_groups")
    old_mapping = _version(deepspeed.__version__) < (0, 14, 5)
    out = {"params": {}, "buffers": {}, "groups": [], "steps": [], "anomalies": [],
           "global_steps": engine.global_steps, "global_samples": engine.global_samples,
           "optimizer": type(opt).__name__, "meta": dict(meta)}
    for n, p in engine.module.named_parameters():
        e = {"split": getattr(p, "partition_dim", None)}
        if hasattr(built, "split_of_param"):  # AutoTP marks its splits in its own metadata
            e["split"] = built.split_of_param(p)
        if not p.requires_grad:  # a frozen param: in no optimizer group, its module weight only
            e["frozen"] = True
            if zero3:
                with deepspeed.zero.GatheredParameters([p]):
                    e["lp"] = p.data.detach().clone()
            else:
                e["lp"] = p.data.detach().clone()
        elif zero3:
            e["fp32"] = safe_get_full_fp32_param(p).clone()
            for key in ("exp_avg", "exp_avg_sq"):
                e[key] = safe_get_full_optimizer_state(p, key).clone()
            with deepspeed.zero.GatheredParameters([p]):
                e["lp"] = p.data.detach().clone()
        elif zero0:
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                e[key] = _full_zero0(opt, p, key, out["anomalies"])
            e["lp"] = p.data.detach().clone()
        else:
            full = _full_by_partition if old_mapping else _full_by_mapping
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                e[key] = full(opt, p, key, out["anomalies"])
            e["lp"] = p.data.detach().clone()
        out["params"][built.global_name(n)] = e
    for n, b in engine.module.named_buffers():
        out["buffers"][n] = b.detach().clone()
    base = opt.optimizer if not (zero0 and not _unfused(opt)) else opt
    if zero3:  # a sub-group's fp32 tensor sits in its param group only while it steps
        members = [[] for _ in base.param_groups]
        for sg, fp32 in enumerate(opt.fp32_partitioned_groups_flat):
            members[opt.sub_group_to_group_id[sg]].append(fp32)
    else:
        members = [g["params"] for g in base.param_groups]
    ids, nstates = set(), 0
    for gi, g in enumerate(base.param_groups):
        out["groups"].append({k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"})
        steps = []
        for p in members[gi]:
            s = base.state.get(p, {}).get("step")
            if s is None:
                steps.append(None)
                continue
            nstates += 1
            ids.add(id(s))
            steps.append(float(s))
        out["steps"].append(steps)
    out["distinct_step_objects"], out["step_states"] = len(ids), nstates
    ls = getattr(opt, "loss_scaler", None)
    if ls is not None and engine.fp16_enabled():
        out["loss_scaler"] = {k: (float(v) if torch.is_tensor(v) else v) for k, v in vars(ls).items()
                              if isinstance(v, (int, float, bool)) or torch.is_tensor(v)}
    os.makedirs(path, exist_ok=True)
    torch.save(out, os.path.join(path, f"rank{dist.get_rank()}.pt"))
