#!/usr/bin/env python3
"""Lab script (not run by CI): train / load / resume a small GPT-like model with UNMODIFIED DeepSpeed.

Runs inside the chroot under torch.distributed.run (gloo, CPU). Three things, picked by flags:

  fresh run    --out ROOT --save-at S --steps N : trains steps 1..N from a seeded init, saves
               ROOT/global_stepS after step S, and right after the save dumps (from DeepSpeed's own
               engine, independent of ucp) every param's full fp32 master, exp_avg, exp_avg_sq and lp
               weight, each param group's hyper-parameters and every optimizer state's `step` to
               ROOT/ref/dump_rank{R}.pt.
  load         --load ROOT --tag TAG [--universal] : a plain (or universal) load_checkpoint at this
               job's topology; dumps the same things to --dump DIR/dump_rank{R}.pt, optionally
               re-saves (--resave ROOT2 [--stepfix]) and resumes to step N.
  both         record per-step losses (mean over dp ranks of the per-rank mean cross-entropy, i.e. the
               global batch's loss) and a "probe" loss before the first step after S: a no_grad forward
               of the WHOLE global batch on every rank, so it does not depend on dp.

Results (losses, probe, classes) go to --result JSON (rank 0).

The data of step s is a deterministic function of (--seed, s) and the global batch is fixed, each dp
rank taking its contiguous slice, so any dp sees the same global batch. No DeepSpeed code is copied or
patched; --stepfix only replaces each optimizer state's `step` by a clone of itself before saving (the
work-around for DeepSpeed 0.18+'s shared `step` after a stage-3 universal load).
"""
import argparse
import json
import os
import re
import sys

# DeepSpeed's MoE gate wraps a helper in torch.compile, which needs a C++ compiler the chroot does not
# have. With dynamo disabled (a torch setting, not a DeepSpeed change) the helper runs eagerly.
os.environ.setdefault('TORCHDYNAMO_DISABLE', '1')

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument('--hidden', type=int, default=48)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--layers', type=int, default=2)
    ap.add_argument('--vocab', type=int, default=97)
    ap.add_argument('--seq', type=int, default=12)
    ap.add_argument('--ffn', type=int, default=2)
    ap.add_argument('--odd', type=int, default=0, help='add a 1-D param of this many elements (padding)')
    ap.add_argument('--global-batch', type=int, default=6)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--dtype', choices=['fp32', 'bf16', 'fp16'], default='fp32')
    ap.add_argument('--zero-stage', type=int, default=3)
    ap.add_argument('--sub-group-size', type=int, default=1000000000)
    ap.add_argument('--persist', type=int, default=100, help='stage3_param_persistence_threshold')
    ap.add_argument('--groups', type=int, default=2, choices=[1, 2])
    ap.add_argument('--wd0', type=float, default=0.01)
    ap.add_argument('--wd1', type=float, default=0.0)
    ap.add_argument('--lr1', type=float, default=None, help='lr of group 1 (default the same as group 0)')
    ap.add_argument('--moe-layers', type=str, default='', help='comma list of block indices with an MoE MLP')
    ap.add_argument('--experts', type=int, default=4)
    ap.add_argument('--ep', type=int, default=1)
    ap.add_argument('--steps', type=int, default=6)
    ap.add_argument('--save-at', type=int, default=4)
    ap.add_argument('--out', default=None)
    ap.add_argument('--load', default=None)
    ap.add_argument('--tag', default=None)
    ap.add_argument('--universal', action='store_true')
    ap.add_argument('--dump', default=None)
    ap.add_argument('--dump-end', default=None, help='dump the state again after the last step')
    ap.add_argument('--resave', default=None)
    ap.add_argument('--stepfix', action='store_true')
    ap.add_argument('--result', default=None)
    ap.add_argument('--local_rank', type=int, default=0)
    return ap.parse_args()


class Block(nn.Module):
    def __init__(self, a, moe):
        super().__init__()
        h = a.hidden
        self.heads = a.heads
        self.ln_1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.moe = moe
        if moe:
            from deepspeed.moe.layer import MoE
            expert = nn.Sequential(nn.Linear(h, a.ffn * h), nn.GELU(), nn.Linear(a.ffn * h, h))
            # top-1, no random token selection and no token dropping: the routing is a pure function
            # of the weights and the tokens (no RNG, no capacity), so a resumed run can be exact.
            self.mlp = MoE(h, expert, num_experts=a.experts, ep_size=a.ep, k=1, use_rts=False,
                           drop_tokens=False)
        else:
            self.mlp = nn.Sequential(nn.Linear(h, a.ffn * h), nn.GELU(), nn.Linear(a.ffn * h, h))

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(h, dim=2)
        sh = lambda z: z.view(b, t, self.heads, h // self.heads).transpose(1, 2)
        q, k, v = sh(q), sh(k), sh(v)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (h // self.heads) ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float('-inf')).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(y)
        m = self.mlp(self.ln_2(x))
        if self.moe:
            m = m[0]
        return x + m


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        moe = set(int(i) for i in a.moe_layers.split(',') if i != '')
        self.wte = nn.Embedding(a.vocab, a.hidden)
        self.wpe = nn.Embedding(a.seq, a.hidden)
        self.h = nn.ModuleList([Block(a, i in moe) for i in range(a.layers)])
        self.ln_f = nn.LayerNorm(a.hidden)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)
        self.odd = nn.Parameter(torch.randn(a.odd) * 0.02) if a.odd else None

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        if self.odd is not None:
            x = x * (1 + self.odd.mean())
        for blk in self.h:
            x = blk(x)
        logits = self.head(self.ln_f(x)).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def batch(a, step):
    g = torch.Generator().manual_seed(a.seed * 100003 + step)
    toks = torch.randint(0, a.vocab, (a.global_batch, a.seq + 1), generator=g)
    return toks[:, :-1], toks[:, 1:]


def param_groups(a, model):
    if a.groups == 1:
        return [{'params': list(model.parameters()), 'weight_decay': a.wd0}]
    g0 = [p for p in model.parameters() if p.dim() >= 2]
    g1 = [p for p in model.parameters() if p.dim() < 2]
    second = {'params': g1, 'weight_decay': a.wd1}
    if a.lr1 is not None:
        second['lr'] = a.lr1
    return [{'params': g0, 'weight_decay': a.wd0}, second]


def expert_global_names(a, model):
    """name -> global name: experts get their global id (ep rank * local count + local index)."""
    names = {}
    if not a.moe_layers:
        return {n: n for n, _ in model.named_parameters()}
    from deepspeed.utils import groups
    ep_rank = groups._get_expert_parallel_rank(f'ep_size_{a.ep}')
    nloc = a.experts // a.ep
    for n, _ in model.named_parameters():
        m = re.search(r'deepspeed_experts\.(\d+)\.', n)
        if m:
            gid = ep_rank * nloc + int(m.group(1))
            n2 = n[:m.start(1)] + str(gid) + n[m.end(1):]
        else:
            n2 = n
        names[n] = n2
    return names


def _version_tuple(v):
    return tuple(int(x) for x in re.match(r'(\d+)\.(\d+)\.(\d+)', v).groups())


SIZED_BY_WORLD = _version_tuple(deepspeed.__version__) < (0, 14, 5)


def full_state_z12(opt, p, key, anomalies):
    """A ZeRO-1/2 param's full optimizer state `key`, gathered over its dp group.

    What safe_get_full_optimizer_state / safe_get_full_fp32_param do, without their limits in 0.19.5:
    right after load_checkpoint the optimizer-state views are linked only at the first step()
    (TypeError on None); with 2 param groups the views of groups >= 1 are linked before their state
    exists (ValueError 'exp_avg not found'); after a universal load the fp32 view is stale (it still
    shows the pre-load values although training uses the loaded ones). key 'fp32' reads the flat fp32
    partition itself, other keys the base optimizer's state of it, at the param's fragment."""
    buf = torch.zeros(p.numel(), dtype=torch.float32)
    if SIZED_BY_WORLD:
        # DeepSpeed < 0.14.5 links every group's _hp_mapping with the whole dp world's partition size,
        # so an expert group at ep > 1 (partitioned over dp / ep ranks) has wrong or no mappings
        # (stage_1_and_2.py _link_all_hp_params). Read the fragment from the group's real partition:
        # the param's offset in its bit16 group, partition size = flat numel / the group's dp size.
        # In fp32 training the fp32 fragment must then equal the lp weight bitwise (checked below).
        for gi, group in enumerate(opt.bit16_groups):
            offset = 0
            for q in group:
                if q is p:
                    break
                offset += q.numel()
            else:
                continue
            pg = opt.real_dp_process_group[gi]
            size = opt.bit16_groups_flat[gi].numel() // dist.get_world_size(group=pg)
            ws = dist.get_rank(group=pg) * size
            lo, hi = max(offset, ws), min(offset + p.numel(), ws + size)
            flat = opt.single_partition_of_fp32_groups[gi]
            t = flat if key == 'fp32' else opt.optimizer.state[flat][key]
            if lo < hi:
                buf.narrow(0, lo - offset, hi - lo).copy_(t.narrow(0, lo - ws, hi - lo))
            dist.all_reduce(buf, group=pg)
            if key == 'fp32' and p.dtype == torch.float32 and not torch.equal(buf.reshape(p.shape), p.data):
                anomalies.append(f'fp32 master of a param of group {gi} != its lp weight')
            return buf.reshape(p.shape)
        anomalies.append('a param in no bit16 group')
        return buf.reshape(p.shape)
    m = p._hp_mapping
    if m is not None:
        flats = getattr(opt, 'single_partition_of_fp32_groups', None) or opt.fp32_groups_flat_partition
        flat = flats[m.param_group_index]
        t = flat if key == 'fp32' else opt.optimizer.state[flat][key]
        if t.shape != flat.shape:
            anomalies.append(f'group {m.param_group_index}: state {key} {tuple(t.shape)} vs fp32 partition '
                             f'{tuple(flat.shape)}')
        h, l = m.hp_fragment_address, m.lp_fragment_address
        buf.narrow(0, l.start, l.numel).copy_(t.narrow(0, h.start, h.numel))
    dist.all_reduce(buf, group=p._dp_group)
    return buf.reshape(p.shape)


def dump_state(a, engine, path):
    """Everything the acceptance compares, read through DeepSpeed's own accessors."""
    model = engine.module
    names = expert_global_names(a, model)
    out = {'params': {}, 'groups': [], 'steps': [], 'global_steps': engine.global_steps,
           'global_samples': engine.global_samples, 'optimizer': type(engine.optimizer).__name__,
           'anomalies': []}
    for n, p in model.named_parameters():
        e = {'fp32': safe_get_full_fp32_param(p).clone()} if a.zero_stage == 3 else {}
        for key in ('exp_avg', 'exp_avg_sq') if a.zero_stage == 3 else ('fp32', 'exp_avg', 'exp_avg_sq'):
            if a.zero_stage == 3:
                e[key] = safe_get_full_optimizer_state(p, key).clone()
            else:
                e[key] = full_state_z12(engine.optimizer, p, key, out['anomalies'])
        if a.zero_stage == 3:
            with deepspeed.zero.GatheredParameters([p]):
                e['lp'] = p.data.detach().clone()
        else:
            e['lp'] = p.data.detach().clone()
        out['params'][names[n]] = e
    base = engine.optimizer.optimizer
    ids = set()
    nstates = 0
    opt = engine.optimizer
    if hasattr(opt, 'fp32_partitioned_groups_flat'):
        # ZeRO-3 puts a sub-group's fp32 tensor into its param group only while stepping it
        members = [[] for _ in base.param_groups]
        for sg, fp32 in enumerate(opt.fp32_partitioned_groups_flat):
            members[opt.sub_group_to_group_id[sg]].append(fp32)
    else:
        members = [g['params'] for g in base.param_groups]
    for gi, g in enumerate(base.param_groups):
        hp = {}
        for k, v in g.items():
            if k == 'params':
                continue
            hp[k] = list(v) if isinstance(v, tuple) else v
        out['groups'].append(hp)
        steps = []
        for p in members[gi]:
            st = base.state.get(p, {})
            s = st.get('step')
            if s is None:
                steps.append(None)
                continue
            nstates += 1
            ids.add(id(s))
            steps.append(float(s))
        out['steps'].append(steps)
    ls = getattr(opt, 'loss_scaler', None)
    if ls is not None:  # fp16: the dynamic loss scaler's state must survive the checkpoint too
        out['loss_scaler'] = {k: (float(v) if torch.is_tensor(v) else v) for k, v in vars(ls).items()
                              if isinstance(v, (int, float, bool)) or torch.is_tensor(v)}
    out['distinct_step_objects'] = len(ids)
    out['step_states'] = nstates
    os.makedirs(path, exist_ok=True)
    torch.save(out, os.path.join(path, f'dump_rank{dist.get_rank()}.pt'))


def main():
    a = parse()
    # The chroot has no ninja, so DeepSpeed's CPU shared-memory all-reduce op cannot be JIT-built and
    # init_distributed would fail. Mark it not compatible: DeepSpeed's own fallback (plain
    # torch.distributed over gloo) is used. This only edits DeepSpeed's table of available ops.
    deepspeed.ops.__compatible_ops__['deepspeed_shm_comm'] = False
    deepspeed.init_distributed(dist_backend='gloo')
    dp = dist.get_world_size()
    assert a.global_batch % dp == 0, 'global batch must divide by dp'
    mb = a.global_batch // dp
    torch.manual_seed(a.seed)
    model = GPT(a)
    if a.dtype == 'bf16':
        pass  # DeepSpeed casts the module
    cfg = {
        'train_micro_batch_size_per_gpu': mb,
        'gradient_accumulation_steps': 1,
        'gradient_clipping': 1.0,
        'steps_per_print': 1000,
        'optimizer': {'type': 'Adam', 'params': {'lr': 1e-3, 'betas': [0.9, 0.95], 'eps': 1e-8,
                                                 'weight_decay': a.wd0, 'torch_adam': True}},
        'zero_optimization': {'stage': a.zero_stage, 'overlap_comm': False, 'contiguous_gradients': True,
                              'reduce_bucket_size': 5e8, 'allgather_bucket_size': 5e8},
        'checkpoint': {'load_universal': bool(a.universal)},
    }
    if a.zero_stage == 3:
        cfg['zero_optimization'].update({'stage3_param_persistence_threshold': a.persist,
                                         'sub_group_size': a.sub_group_size})
    if a.dtype == 'bf16':
        cfg['bf16'] = {'enabled': True}
    if a.dtype == 'fp16':
        # DeepSpeed's CPU accelerator reports fp16 only where oneDNN has fp16 kernels; torch 2.6 runs
        # fp16 on any CPU (slowly), which is all a tiny model needs.
        from deepspeed.accelerator import get_accelerator
        get_accelerator().is_fp16_supported = lambda: True
        cfg['fp16'] = {'enabled': True, 'initial_scale_power': 12, 'loss_scale_window': 2, 'hysteresis': 1}
    groups = param_groups(a, model)
    if a.moe_layers:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        for i, g in enumerate(groups):  # the MoE splitter keys groups by name
            g['name'] = f'group{i}'
        groups = split_params_into_different_moe_groups_for_optimizer(groups)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    rank = dist.get_rank()
    res = {'argv': sys.argv, 'dp': dp, 'engine': type(engine).__name__,
           'optimizer': type(engine.optimizer).__name__, 'losses': {}, 'probe': None,
           'ds_version': deepspeed.__version__}
    start = 1
    if a.load:
        path, _ = engine.load_checkpoint(a.load, tag=a.tag)
        assert path is not None, f'load_checkpoint found nothing in {a.load} {a.tag}'
        start = engine.global_steps + 1
        res['loaded_global_steps'] = engine.global_steps
        if a.dump:
            dump_state(a, engine, a.dump)
        if a.resave:
            base = engine.optimizer.optimizer
            orig = {k: st['step'] for k, st in base.state.items() if 'step' in st}
            if a.stepfix:  # the saved files get one step tensor per state ...
                for k in orig:
                    if torch.is_tensor(orig[k]):
                        base.state[k]['step'] = orig[k].clone()
            engine.save_checkpoint(a.resave, tag=a.tag)
            for k, v in orig.items():  # ... but this run resumes with what DeepSpeed loaded
                base.state[k]['step'] = v
    for step in range(start, a.steps + 1):
        x, y = batch(a, step)
        if step == start and a.load or (a.out and step == a.save_at + 1):
            with torch.no_grad():
                pl = engine(x, y)
            res['probe'] = {'step': step, 'loss': float(pl), 'hex': float(pl).hex()}
        xs, ys = x[rank * mb:(rank + 1) * mb], y[rank * mb:(rank + 1) * mb]
        loss = engine(xs, ys)
        engine.backward(loss)
        engine.step()
        lt = loss.detach().float().clone()
        dist.all_reduce(lt)
        lt = lt / dp
        res['losses'][step] = float(lt)
        if a.out and step == a.save_at:
            engine.save_checkpoint(a.out, tag=f'global_step{step}')
            dump_state(a, engine, os.path.join(a.out, 'ref'))
    if a.dump_end:
        dump_state(a, engine, a.dump_end)
    if rank == 0 and a.result:
        res['losses_hex'] = {k: v.hex() for k, v in res['losses'].items()}
        with open(a.result, 'w') as f:
            json.dump(res, f, indent=1)
    dist.barrier()


if __name__ == '__main__':
    main()
