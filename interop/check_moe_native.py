#!/usr/bin/env python3
"""Checks a native DeepSpeed mixture-of-experts ZeRO-1/2 checkpoint (the layout of any version
0.14.5 to 0.19.5, or of any version at ep = 1) against reference dumps written by the DeepSpeed
job that saved the source (the lab of issue 15, whose ds19_train.py is now realds/worker/families/gpt.py and dumps.py: every param's fp32 master, exp_avg, exp_avg_sq and lp
weight, experts under their global ids).

Reads the checkpoint with torch alone, independently of ucp: every rank's param_slice_mappings
give each param's fragments of the flat fp32 / exp_avg / exp_avg_sq partitions (expert groups over
the expert data parallel ranks of each ep rank, DeepSpeed's E + D order: dp rank d is ep rank
d % ep), local expert ids become global ones (ep rank * local count + local id), lp weights come
from the module and the expert files. Every param must equal the reference bitwise, and every
reference param must be there.

usage: check_moe_native.py CHECKPOINT_TAG_DIR REF_DIR [--dp N] [--ep N]
       check_moe_native.py --export MODEL.safetensors REF_DIR
         (`ucp export` output: every reference param's fp32 master under its global name, bitwise)
"""
import json
import struct
import argparse
import glob
import importlib.abc
import importlib.machinery
import os
import re
import sys
import types

import torch


class _Any:
    def __init__(self, *a, **k):
        self.args = a

    def __setstate__(self, s):
        self.state = s


class _Mod(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        c = type(name, (_Any,), {})
        setattr(self, name, c)
        return c


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """deepspeed.* classes pickled in the files (fragment_address, enums, loss scaler) as plain objects."""

    def find_spec(self, fullname, path, target=None):
        if fullname == 'deepspeed' or fullname.startswith('deepspeed.'):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _Mod(spec.name)

    def exec_module(self, m):
        m.__path__ = []


sys.meta_path.insert(0, _Finder())


def load(p):
    return torch.load(p, map_location='cpu')


def addr(a):
    s = a.state if isinstance(getattr(a, 'state', None), dict) else a.__dict__
    return int(s['start']), int(s['numel'])


INFIX = '.deepspeed_moe.experts.deepspeed_experts.'


def read_ref(ref_dir, errors):
    ref = {}
    ref_steps = {}
    for p in sorted(glob.glob(os.path.join(ref_dir, 'dump_rank*.pt'))):
        r = load(p)
        if r.get('anomalies'):
            errors.append(f'{p}: reference anomalies {r["anomalies"]}')
        for n, e in r['params'].items():
            if n in ref:
                for k in e:
                    if not torch.equal(ref[n][k], e[k]):
                        errors.append(f'{p}: {n} {k} differs between reference ranks')
            ref[n] = e
        for g, s in enumerate(r['steps']):
            ref_steps.setdefault(g, set()).update(x for x in s if x is not None)
    return ref, ref_steps


def check_export(path, ref_dir):
    """A safetensors file (torch alone: header JSON, little-endian data) against the references."""
    errors = []
    ref, _ = read_ref(ref_dir, errors)
    data = open(path, 'rb').read()
    n = struct.unpack('<Q', data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop('__metadata__', None)
    dtypes = {'F32': torch.float32, 'F16': torch.float16, 'BF16': torch.bfloat16}
    checked = 0
    for name in sorted(set(ref) | set(header)):
        if name not in header or name not in ref:
            errors.append(f'{name}: {"not exported" if name in ref else "not in the reference"}')
            continue
        h = header[name]
        lo, hi = h['data_offsets']
        t = torch.frombuffer(bytearray(data[8 + n + lo:8 + n + hi]), dtype=dtypes[h['dtype']]).reshape(h['shape'])
        if not torch.equal(t, ref[name]['fp32']):
            errors.append(f'{name}: exported tensor differs from the reference fp32 master')
        else:
            checked += 1
    for e in errors[:30]:
        print('  ' + e)
    print(f'{path}: {len(header)} tensors, {checked} equal to the reference, {len(errors)} differences')
    return 1 if errors or checked == 0 else 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == '--export':
        return check_export(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument('ckpt')
    ap.add_argument('ref')
    ap.add_argument('--dp', type=int, default=None)
    ap.add_argument('--ep', type=int, default=None)
    a = ap.parse_args()
    errors = []
    optim = sorted(glob.glob(os.path.join(a.ckpt, '*zero_pp_rank_*_mp_rank_00_optim_states.pt')),  # bf16_ too
                   key=lambda p: int(re.search(r'zero_pp_rank_(\d+)_', p).group(1)))
    dp = len(optim)
    osd = [load(p)['optimizer_state_dict'] for p in optim]
    mp = load(os.path.join(a.ckpt, 'mp_rank_00_model_states.pt'))
    num_experts = list(mp['num_experts'])
    pgs = osd[0]['base_optimizer_state']['param_groups']
    counts = osd[0]['partition_count']
    ep = 1
    for g, pg in enumerate(pgs):
        if pg.get('moe', False):
            ep = dp // counts[g]
    if a.dp is not None and dp != a.dp:
        errors.append(f'dp is {dp}, expected {a.dp}')
    if a.ep is not None and ep != a.ep:
        errors.append(f'ep is {ep}, expected {a.ep}')
    # MoE layer prefixes from the expert files.
    prefix_layer = {}
    lp = {k: v for k, v in mp['module'].items()}
    for p in glob.glob(os.path.join(a.ckpt, 'layer_*_expert_*_mp_rank_00_model_states.pt')):
        layer, expert = map(int, re.search(r'layer_(\d+)_expert_(\d+)_', p).groups())
        for k, v in load(p).items():
            prefix, rest = k.split(INFIX)
            if int(rest.split('.')[0]) != expert:
                errors.append(f'{p}: key {k} is not expert {expert}')
            prefix_layer[prefix] = layer
            lp[k] = v

    def global_name(name, e):
        prefix, rest = name.split(INFIX)
        local, suffix = rest.split('.', 1)
        n_local = num_experts[prefix_layer[prefix]] // ep
        return f'{prefix}{INFIX}{e * n_local + int(local)}.{suffix}'

    pieces = {}
    steps = {}
    for g, pg in enumerate(pgs):
        moe = pg.get('moe', False)
        owners = range(ep) if moe else [0]
        for e in owners:
            ranks = [e + k * ep for k in range(dp // ep)] if moe else list(range(dp))
            for d in ranks:
                fp32 = osd[d]['single_partition_of_fp32_groups'][g]
                st = osd[d]['base_optimizer_state']['state'][g]
                steps.setdefault(g, set()).add(float(st['step']))
                for name, ad in osd[d]['param_slice_mappings'][g].items():
                    start, numel = addr(ad)
                    gname = global_name(name, e) if moe else name
                    for key, t in (('fp32', fp32), ('exp_avg', st['exp_avg']), ('exp_avg_sq', st['exp_avg_sq'])):
                        pieces.setdefault((gname, key), []).append(t[start:start + numel])
    ref, ref_steps = read_ref(a.ref, errors)
    checked = 0
    names = {n for n, _ in pieces}
    for n in sorted(set(ref) | names | {k for k in lp if k in ref or INFIX in k}):
        if n not in ref:
            errors.append(f'{n}: in the checkpoint, not in the reference')
            continue
        for key in ('fp32', 'exp_avg', 'exp_avg_sq'):
            if (n, key) not in pieces:
                errors.append(f'{n}: no {key} in the optimizer files')
                continue
            got = torch.cat(pieces[(n, key)])
            want = ref[n][key]
            if got.numel() != want.numel() or not torch.equal(got.reshape(want.shape), want):
                errors.append(f'{n}: {key} differs from the reference')
            else:
                checked += 1
        if n not in lp:
            errors.append(f'{n}: no lp weight in the module or the expert files')
        elif lp[n].dtype != ref[n]['lp'].dtype or not torch.equal(lp[n], ref[n]['lp']):
            errors.append(f'{n}: lp weight differs from the reference')
        else:
            checked += 1
    for g in range(len(pgs)):
        if steps.get(g) != ref_steps.get(g):
            errors.append(f'group {g}: steps {steps.get(g)}, reference {ref_steps.get(g)}')
    for e in errors[:30]:
        print('  ' + e)
    print(f'{a.ckpt}: dp={dp} ep={ep}, {len(ref)} params, {checked} tensors equal to the reference, '
          f'{len(errors)} differences')
    return 1 if errors or checked == 0 else 0


if __name__ == '__main__':
    sys.exit(main())
