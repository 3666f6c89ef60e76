#!/usr/bin/env python3
"""Lab script (not run by CI): one markdown table from WORK/results/*.json written by ds19_cases.py.

usage: python3 lab/ds19_report.py [WORK]   (default /work/labdata/lab15)
"""
import glob
import json
import os
import sys

work = sys.argv[1] if len(sys.argv) > 1 else '/work/labdata/lab15'


def counts(c):
    if not c or 'params' not in c:
        return (c or {}).get('line', '-')
    n = c['params']
    s = '/'.join(str(c[f'{k}_equal']) for k in ('fp32', 'exp_avg', 'exp_avg_sq', 'lp'))
    s += f" of {n}; hp {c['hparams_equal']}/{c['groups']}; step {c['steps_equal']}/{c['step_states']}"
    if not c['ok']:
        s += ' **BAD**: ' + '; '.join(p for p in c['problems'][:3])
    return s


def ld(l):
    if not l:
        return '-'
    s = 'probe ' + ('=' if l['probe_identical'] else '!=')
    for k, v in sorted(l['steps'].items(), key=lambda kv: int(kv[0])):
        s += f" s{k} " + ('=' if v['identical'] else f"{v['absdiff']:.3g}")
    return s


print('| case | route | tensors fp32/exp_avg/exp_avg_sq/lp equal; hyper-params; steps | losses vs source continuation |')
print('|---|---|---|---|')
for f in sorted(glob.glob(os.path.join(work, 'results', '*.json'))):
    r = json.load(open(f))
    n = r['case']
    sp = r['spec']
    head = f"{n} (dp{sp['sdp']}->dp{sp['tdp']})"
    if 'ucp_reshard' not in r and 'ucp_cmp' not in r:
        pass
    elif r.get('ucp_reshard', {}).get('rc'):
        print(f"| {head} | ucp reshard | FAILED: {r['ucp_reshard']['msg']} | |")
    else:
        print(f"| {head} | ucp reshard + plain load | {counts(r.get('ucp_cmp'))} | {ld(r.get('ucp_losses'))} |")
    if 'uninterrupted_vs_source' in r:
        u = r['uninterrupted_vs_source']
        print(f"| | uninterrupted run at target dp (no checkpoint) | | " +
              ' '.join(f's{k} ' + ('=' if v == 0 else f'{v:.3g}') for k, v in sorted(u.items(), key=lambda kv: int(kv[0]))) + ' |')
    if 'ucp_convert' in r:
        if r['ucp_convert']['rc']:
            print(f"| | ucp convert | refused: {r['ucp_convert']['msg']} | |")
        elif r.get('convert_load_rc'):
            print(f"| | ucp convert + load_universal | load_universal FAILED in DeepSpeed (conv_load.log) | |")
        else:
            print(f"| | ucp convert + load_universal | {counts(r.get('convert_cmp'))} | {ld(r.get('convert_losses'))} |")
    if 'ds_to_universal_rc' in r:
        if r['ds_to_universal_rc']:
            print('| | ds_to_universal.py | FAILED | |')
        else:
            print(f"| | ds_to_universal + load_universal | {counts(r.get('dsuni_cmp'))} | {ld(r.get('dsuni_losses'))} |")
            print(f"| | ... + stepfix resave + plain load | {counts(r.get('dsfix_cmp'))} | {ld(r.get('dsfix_losses'))} |")
            if r.get('end_ucp_vs_dsfix'):
                print(f"| | state after step 6: ucp route vs DeepSpeed stepfix route | {counts(r['end_ucp_vs_dsfix'])} | |")
    if 'corrupt_cmp' in r:
        print(f"| | corrupted ucp output ({r['corrupt_what'].split(': ', 1)[-1]}) | {counts(r['corrupt_cmp'])}; caught: {r['corrupt_caught']} | {ld(r.get('corrupt_losses'))} |")
