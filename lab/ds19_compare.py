#!/usr/bin/env python3
"""Lab script (not run by CI): compare two state dumps written by ds19_train.py, bitwise.

usage: python3 ds19_compare.py REF_DIR GOT_DIR [--json OUT]

REF_DIR holds the source run's dump_rank*.pt (taken right after its save_checkpoint, by DeepSpeed's
own accessors), GOT_DIR the dump of the job that loaded the converted/resharded checkpoint. Ranks are
merged by (global) param name; a name seen on several ranks must be equal on all of them. Checked:
  * every param's fp32 master, exp_avg, exp_avg_sq and lp weight: torch.equal (dtype, shape and bits);
  * the set of param names;
  * each param group's hyper-parameters (every key but 'params'), exactly;
  * every optimizer state's `step` equals the source's (one value per group), and no two states share
    one `step` tensor object (DeepSpeed's stage-3 universal loader aliases them);
  * engine.global_steps / global_samples.
Exit 0 if everything matches, 1 otherwise; the counts go to stdout (and --json).
"""
import glob
import json
import math
import os
import re
import sys

import torch

KINDS = ('fp32', 'exp_avg', 'exp_avg_sq', 'lp')


def load(d):
    files = sorted(glob.glob(os.path.join(d, 'dump_rank*.pt')))
    if not files:
        raise SystemExit(f'no dump_rank*.pt in {d}')
    dumps = [torch.load(f, weights_only=False) for f in files]
    params, rank_conflicts = {}, []
    for i, du in enumerate(dumps):
        for n, e in du['params'].items():
            if n in params:
                for k in KINDS:
                    if not torch.equal(params[n][k], e[k]):
                        rank_conflicts.append(f'{n}.{k} differs between ranks of {d}')
            else:
                params[n] = e
    return dumps, params, rank_conflicts


def bits_differ(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return f'shape/dtype {tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}'
    d = (a.float() - b.float()).abs()
    return f'{int((a != b).sum())} of {a.numel()} elements differ, max |diff| {float(d.max()):.3g}'


def main():
    ref_dir, got_dir = sys.argv[1], sys.argv[2]
    out_json = sys.argv[sys.argv.index('--json') + 1] if '--json' in sys.argv else None
    rd, rp, rc = load(ref_dir)
    gd, gp, gc = load(got_dir)
    res = {'ref': ref_dir, 'got': got_dir, 'params': len(rp), 'problems': rc + gc}
    for k in KINDS:
        res[f'{k}_equal'] = 0
    missing = sorted(set(rp) - set(gp))
    extra = sorted(set(gp) - set(rp))
    for n in missing:
        res['problems'].append(f'param {n} missing in the loaded job')
    for n in extra:
        res['problems'].append(f'param {n} not in the source')
    for n in sorted(set(rp) & set(gp)):
        for k in KINDS:
            if torch.equal(rp[n][k], gp[n][k]) and rp[n][k].dtype == gp[n][k].dtype:
                res[f'{k}_equal'] += 1
            else:
                res['problems'].append(f'{n}.{k}: {bits_differ(rp[n][k], gp[n][k])}')
    # param groups: hyper-parameters and steps (rank 0 of each; every rank holds all groups)
    r0, g0 = rd[0], gd[0]
    res['groups'] = len(r0['groups'])
    res['hparams_equal'] = 0
    if len(r0['groups']) != len(g0['groups']):
        res['problems'].append(f"{len(g0['groups'])} param groups loaded, source had {len(r0['groups'])}")
    for i, (a, b) in enumerate(zip(r0['groups'], g0['groups'])):
        ren = {}
        if re.fullmatch(r'ep_size_\d+', str(a.get('name'))) and re.fullmatch(r'ep_size_\d+', str(b.get('name'))):
            # an expert group is named after its job's ep size, so an ep change renames it
            ren = {'name': (a['name'], b['name'])}
            a, b = dict(a, name=None), dict(b, name=None)
        if a == b:
            res['hparams_equal'] += 1
            if ren and ren['name'][0] != ren['name'][1]:
                res.setdefault('notes', []).append(f"group {i} renamed {ren['name'][0]} -> {ren['name'][1]}")
        else:
            diff = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
            res['problems'].append(f'group {i} hyper-parameters differ (source, loaded): {diff}')
    res['step_states'] = 0
    res['steps_equal'] = 0
    for du_i, du in enumerate(gd):
        for gi, steps in enumerate(du['steps']):
            want = set(s for r in rd for s in r['steps'][gi] if s is not None)
            if len(want) != 1:
                res['problems'].append(f'source group {gi} has steps {sorted(want)}')
                continue
            w = want.pop()
            for j, s in enumerate(steps):
                res['step_states'] += 1
                if s == w:
                    res['steps_equal'] += 1
                else:
                    res['problems'].append(f'rank {du_i} group {gi} state {j}: step {s}, source {w}')
        if du['distinct_step_objects'] != du['step_states']:
            res['problems'].append(f"rank {du_i}: {du['step_states']} optimizer states share "
                                   f"{du['distinct_step_objects']} step tensor(s)")
    if r0.get('loss_scaler') != g0.get('loss_scaler'):
        diff = {k: (r0.get('loss_scaler', {}).get(k), g0.get('loss_scaler', {}).get(k))
                for k in set(r0.get('loss_scaler') or {}) | set(g0.get('loss_scaler') or {})
                if (r0.get('loss_scaler') or {}).get(k) != (g0.get('loss_scaler') or {}).get(k)}
        res['problems'].append(f'loss scaler (source, loaded): {diff}')
    for k in ('global_steps', 'global_samples'):
        if r0[k] != g0[k]:
            res['problems'].append(f'{k}: loaded {g0[k]}, source {r0[k]}')
    res['ok'] = not res['problems']
    line = (f"{'OK ' if res['ok'] else 'BAD'} params {res['params']}: " +
            ' '.join(f"{k} {res[k + '_equal']}/{res['params']}" for k in KINDS) +
            f"; groups {res['hparams_equal']}/{res['groups']} hparams; steps {res['steps_equal']}/{res['step_states']}")
    print(line)
    for p in res['problems'][:12]:
        print('   ', p)
    if len(res['problems']) > 12:
        print(f"    ... {len(res['problems']) - 12} more")
    res['line'] = line
    if out_json:
        with open(out_json, 'w') as f:
            json.dump(res, f, indent=1)
    sys.exit(0 if res['ok'] else 1)


if __name__ == '__main__':
    main()
