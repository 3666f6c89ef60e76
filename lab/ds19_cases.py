#!/usr/bin/env python3
"""Lab driver (host side, not run by CI): ucp against real DeepSpeed 0.19.5, case by case.

usage: python3 lab/ds19_cases.py [--ds /opt/ds-0.19.5] [--work /work/labdata/lab15]
                                [--routes ucp,uninterrupted,convert,dsroute,corrupt] [CASE ...]
       (no CASE: all of them; --list prints them; --routes runs only those routes and adds them to
       the case's earlier results, reusing the cached source run and the ucp output)

For each case:
  1. source: ds19_train.py trains a fresh model in DeepSpeed at the source topology (steps 1..6, save at
     4, dump of every state right after the save, losses of the uninterrupted run);
  2. ucp: `ucp reshard` (or `ucp convert`) of the source on the host, then a load in DeepSpeed at the
     target topology (plain load for reshard, load_universal for convert), dump, resume to step 6;
  3. ds19_compare.py: the loaded state against the source's dump, bitwise (counts);
  4. losses: probe (no_grad forward of the whole global batch before step 5: must be bit-identical), and
     steps 5, 6 against the source's continuation; optionally an uninterrupted run at the target
     topology (what dp alone changes) and DeepSpeed's own route (ds_to_universal.py + load_universal +
     save with the step un-aliased, then a plain load of that).
  5. a corrupt variant: the ucp output is damaged on purpose and the checks must fail.
Results: WORK/results/<case>.json and a table on stdout. DeepSpeed runs in the chroot
(/work/lab/trixie) through lab/ds19_launch.py; ucp is bazel-bin/tools/ucp of this worktree.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CHROOT = '/work/lab/trixie'
UCP = os.path.join(REPO, 'bazel-bin/tools/ucp')
DS = '/opt/ds-0.19.5'
WORK = '/work/labdata/lab15'
PORT = [29650]
ROUTES = None  # None: every route of the case; else a set of: ucp uninterrupted convert dsroute corrupt

# name: source args, source dp, target dp, target arg overrides, ucp flags, options
CASES = {
    # ZeRO-3 -> ZeRO-3
    'z3_fp32_2g_dp2_dp1': dict(src='--zero-stage 3 --groups 2 --wd0 0.01 --wd1 0.0 --lr1 5e-4 --sub-group-size 2000 --seed 11 --hidden 48 --layers 2',
                               sdp=2, tdp=1, tgt='--sub-group-size 3000', ucp='--sub_group_size 3000',
                               uninterrupted=True, dsroute=True, convert=True, corrupt=True),
    'z3_bf16_1g_dp1_dp2': dict(src='--zero-stage 3 --groups 1 --dtype bf16 --seed 12 --hidden 64 --layers 2 --vocab 101',
                               sdp=1, tdp=2, tgt='--sub-group-size 1500', ucp='--sub_group_size 1500',
                               uninterrupted=True, dsroute=True),
    'z3_fp32_2g_dp2_dp3': dict(src='--zero-stage 3 --groups 2 --wd0 0.1 --wd1 0.0 --sub-group-size 1000 --seed 13 --hidden 32 --layers 3 --vocab 89',
                               sdp=2, tdp=3, tgt='--sub-group-size 5000', ucp='--sub_group_size 5000',
                               uninterrupted=True),
    'z3_bf16_2g_dp2_dp1': dict(src='--zero-stage 3 --groups 2 --wd0 0.05 --wd1 0.0 --dtype bf16 --sub-group-size 4000 --seed 14 --hidden 40 --layers 2 --vocab 83',
                               sdp=2, tdp=1, tgt='--sub-group-size 2500', ucp='--sub_group_size 2500',
                               uninterrupted=True),
    'z3_fp32_1g_dp2_dp1': dict(src='--zero-stage 3 --groups 1 --sub-group-size 1500 --seed 16 --hidden 56 --layers 2 --vocab 93',
                               sdp=2, tdp=1, tgt='', ucp='', dsroute=True, convert=True),
    'z3_fp32_1g1sg_dp2_dp1': dict(src='--zero-stage 3 --groups 1 --seed 17 --hidden 48 --layers 2 --vocab 95',
                                  sdp=2, tdp=1, tgt='', ucp='', dsroute=True, convert=True),
    'z3_fp32_sgs_dp2_dp2': dict(src='--zero-stage 3 --groups 2 --wd0 0.01 --wd1 0.0 --sub-group-size 1000 --seed 15 --hidden 48 --layers 2',
                                sdp=2, tdp=2, tgt='--sub-group-size 7000', ucp='--sub_group_size 7000'),
    # stage changes
    'z3_to_z1_fp32_dp2_dp1': dict(src='--zero-stage 3 --groups 2 --wd0 0.01 --wd1 0.0 --sub-group-size 2000 --seed 21 --hidden 48 --layers 2',
                                  sdp=2, tdp=1, tgt='--zero-stage 1', ucp='--zero_stage 1', uninterrupted=True),
    'z3_to_z2_bf16_dp2_dp2': dict(src='--zero-stage 3 --groups 2 --wd0 0.01 --wd1 0.0 --dtype bf16 --seed 22 --hidden 32 --layers 2',
                                  sdp=2, tdp=2, tgt='--zero-stage 2', ucp='--zero_stage 2', uninterrupted=True),
    'z2_to_z3_fp32_odd_dp2_dp3': dict(src='--zero-stage 2 --groups 2 --wd0 0.01 --wd1 0.0 --odd 7 --seed 23 --hidden 48 --layers 2',
                                      sdp=2, tdp=3, tgt='--zero-stage 3 --sub-group-size 2000', ucp='--zero_stage 3 --sub_group_size 2000'),
    # ZeRO-1/2 with padding
    'z1_pad_bf16_dp3_dp2': dict(src='--zero-stage 1 --groups 2 --wd0 0.01 --wd1 0.0 --odd 5 --dtype bf16 --seed 31 --hidden 40 --layers 2 --vocab 91',
                                sdp=3, tdp=2, tgt='', ucp='', uninterrupted=True, convert=True),
    'z2_pad_fp32_dp2_dp1': dict(src='--zero-stage 2 --groups 2 --wd0 0.01 --wd1 0.0 --odd 3 --seed 32 --hidden 48 --layers 2 --vocab 97',
                                sdp=2, tdp=1, tgt='', ucp='', convert=True, dsroute=True),
    # fp16 (DeepSpeed's dynamic loss scaler; its state is compared too)
    'f16_z2_pad_dp2_dp1': dict(src='--zero-stage 2 --groups 2 --dtype fp16 --odd 3 --seed 51',
                               sdp=2, tdp=1, tgt='', ucp='', convert=True),
    'f16_z1_pad_dp2_dp1': dict(src='--zero-stage 1 --groups 2 --dtype fp16 --odd 5 --seed 52',
                               sdp=2, tdp=1, tgt='', ucp='', convert=True),
    'f16_z3_2g_dp2_dp1': dict(src='--zero-stage 3 --groups 2 --dtype fp16 --seed 53 --sub-group-size 2000',
                              sdp=2, tdp=1, tgt='', ucp=''),
    'f16_z3_to_z2_dp2_dp1': dict(src='--zero-stage 3 --groups 2 --dtype fp16 --seed 56 --sub-group-size 3000',
                                 sdp=2, tdp=1, tgt='--zero-stage 2', ucp='--zero_stage 2'),
    'f16_z1_to_z3_dp1_dp2': dict(src='--zero-stage 1 --groups 2 --dtype fp16 --seed 57',
                                 sdp=1, tdp=2, tgt='--zero-stage 3 --sub-group-size 1500',
                                 ucp='--zero_stage 3 --sub_group_size 1500'),
    # native MoE (ZeRO-2)
    'moe_ep2dp2_to_dp1': dict(src='--zero-stage 2 --groups 2 --wd0 0.01 --wd1 0.0 --moe-layers 1 --experts 4 --ep 2 --seed 41 --hidden 32 --layers 2 --global-batch 4',
                              sdp=2, tdp=1, tgt='--ep 1', ucp='--expert_parallel 1', uninterrupted=True),
    'moe_ep2dp2_to_ep4dp4': dict(src='--zero-stage 2 --groups 2 --wd0 0.01 --wd1 0.0 --moe-layers 1 --experts 4 --ep 2 --seed 41 --hidden 32 --layers 2 --global-batch 4',
                                 sdp=2, tdp=4, tgt='--ep 4', ucp='--expert_parallel 4', uninterrupted=True),
    'moe_bf16_ep2dp2_to_dp1': dict(src='--zero-stage 2 --groups 2 --wd0 0.01 --wd1 0.0 --moe-layers 1 --experts 4 --ep 2 --seed 61 --hidden 32 --layers 2 --global-batch 4 --dtype bf16',
                                   sdp=2, tdp=1, tgt='--ep 1', ucp='--expert_parallel 1', uninterrupted=True),
    'moe_bf16_ep2dp2_to_ep4dp4': dict(src='--zero-stage 2 --groups 2 --wd0 0.01 --wd1 0.0 --moe-layers 1 --experts 4 --ep 2 --seed 61 --hidden 32 --layers 2 --global-batch 4 --dtype bf16',
                                      sdp=2, tdp=4, tgt='--ep 4', ucp='--expert_parallel 4'),
    'moe_bf16_ep2dp2_same': dict(src='--zero-stage 2 --groups 2 --wd0 0.01 --wd1 0.0 --moe-layers 1 --experts 4 --ep 2 --seed 61 --hidden 32 --layers 2 --global-batch 4 --dtype bf16',
                                 sdp=2, tdp=2, tgt='', ucp='--expert_parallel 2', uninterrupted=True),
    'moe_z1_odd_ep2dp2_to_ep1dp2': dict(src='--zero-stage 1 --groups 2 --wd0 0.01 --wd1 0.0 --odd 3 --moe-layers 1 --experts 4 --ep 2 --seed 42 --hidden 32 --layers 2 --global-batch 4',
                                        sdp=2, tdp=2, tgt='--ep 1', ucp='--expert_parallel 1', uninterrupted=True),
}


def log(*a):
    print(time.strftime('%H:%M:%S'), *a, flush=True)


def old_torch_load_env():
    """DeepSpeed before 0.15 calls torch.load without weights_only; torch 2.6 then defaults to
    weights_only=True and refuses DeepSpeed's own pickled classes (LossScaler). This torch variable
    restores the old default only where the caller did not set weights_only (nothing in DeepSpeed
    changes)."""
    v = os.path.basename(DS.rstrip('/')).replace('ds-', '')
    old = tuple(int(x) for x in v.split('.')[:2]) < (0, 15) if v[:1].isdigit() else False
    return ['TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1'] if old else []


def ds(n, args, logf):
    PORT[0] += 1
    cmd = ['chroot', CHROOT, 'env', f'PYTHONPATH={DS}', 'DS_ACCELERATOR=cpu'] + old_torch_load_env() + ['python3',
           f'{HERE}/ds19_launch.py', str(n), str(PORT[0]), f'{HERE}/ds19_train.py'] + args
    with open(logf, 'w') as f:
        f.write(' '.join(cmd) + '\n')
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    return rc


def chpy(args, logf=None):
    cmd = ['chroot', CHROOT, 'env', f'PYTHONPATH={DS}', 'python3'] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = '\n'.join(l for l in (p.stdout + p.stderr).splitlines() if 'Warning' not in l and 'warn(' not in l)
    if logf:
        open(logf, 'w').write(' '.join(cmd) + '\n' + out)
    return p.returncode, out


def ucp(args, logf):
    cmd = [UCP] + args + ['--progress', 'never']
    p = subprocess.run(cmd, capture_output=True, text=True)
    open(logf, 'w').write(' '.join(cmd) + '\n' + p.stdout + p.stderr)
    return p.returncode, (p.stdout + p.stderr).strip()


def source(c, d):
    """The fresh DeepSpeed run; cached by its arguments."""
    key = c['src'].replace(' ', '') + f"_dp{c['sdp']}"
    root = os.path.join(WORK, 'src', hashlib.sha1(key.encode()).hexdigest()[:10])
    if os.path.exists(os.path.join(root, 'run.json')):
        return root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    rc = ds(c['sdp'], c['src'].split() + ['--out', root, '--result', f'{root}/run.json'], f'{d}/source.log')
    if rc:
        raise SystemExit(f'source run failed, see {d}/source.log')
    return root


def losses(path):
    r = json.load(open(path))
    return r


def cmp(ref, got, d, name):
    rc, out = chpy([f'{HERE}/ds19_compare.py', ref, got, '--json', f'{d}/{name}.cmp.json'], f'{d}/{name}.cmp.log')
    line = out.strip().splitlines()
    return rc, json.load(open(f'{d}/{name}.cmp.json')) if os.path.exists(f'{d}/{name}.cmp.json') else {'line': out}


def loss_diffs(src, got):
    """per resumed step: |got - source continuation|, and whether the probe is bit-identical"""
    out = {'probe_src': src['probe']['hex'] if src.get('probe') else None,
           'probe_got': got['probe']['hex'] if got.get('probe') else None}
    out['probe_identical'] = out['probe_src'] is not None and out['probe_src'] == out['probe_got']
    out['steps'] = {}
    for k, v in got['losses'].items():
        s = src['losses'][k]
        out['steps'][k] = {'src': s, 'got': v, 'absdiff': abs(v - s), 'identical': v == s}
    return out


def want(c, route):
    return (ROUTES is None or route in ROUTES) and (route == 'ucp' or c.get(route))


def run_case(name, c):
    d = os.path.join(WORK, 'cases', name)
    rfile = f'{WORK}/results/{name}.json'
    if ROUTES is None:
        shutil.rmtree(d, ignore_errors=True)
        res = {}
    else:  # add the chosen routes to an earlier result
        res = json.load(open(rfile)) if os.path.exists(rfile) else {}
    os.makedirs(d, exist_ok=True)
    res.update({'case': name, 'spec': c})
    root = source(c, d)
    res['source_root'] = root
    src = losses(f'{root}/run.json')
    res['source_losses'] = src['losses']
    tgt_args = c['src'].split() + c['tgt'].split()
    tag = 'global_step4'

    # ucp reshard -> plain load at the target
    out = f'{d}/ucp'
    rc, msg = (0, '') if not want(c, 'ucp') and os.path.exists(out) else ucp(['reshard', '--input_folder', f'{root}/{tag}', '--output_folder', f'{out}/{tag}',
                   '--dp', str(c['tdp'])] + c['ucp'].split(), f'{d}/ucp_reshard.log')
    if want(c, 'ucp'):
        res['ucp_reshard'] = {'rc': rc, 'msg': msg.splitlines()[-1] if msg else ''}
        log(name, 'ucp reshard:', rc, res['ucp_reshard']['msg'])
    if rc == 0 and want(c, 'ucp'):
        rc = ds(c['tdp'], tgt_args + ['--load', out, '--tag', tag, '--dump', f'{d}/ucp_dump', '--dump-end', f'{d}/ucp_end',
                                      '--result', f'{d}/ucp_run.json'], f'{d}/ucp_load.log')
        res['ucp_load_rc'] = rc
        if rc == 0:
            _, res['ucp_cmp'] = cmp(f'{root}/ref', f'{d}/ucp_dump', d, 'ucp')
            res['ucp_losses'] = loss_diffs(src, losses(f'{d}/ucp_run.json'))
            log(name, 'ucp plain load:', res['ucp_cmp'].get('line'), 'probe identical',
                res['ucp_losses']['probe_identical'],
                {k: v['absdiff'] for k, v in res['ucp_losses']['steps'].items()})

    if want(c, 'uninterrupted'):
        rc = ds(c['tdp'], tgt_args + ['--result', f'{d}/uninterrupted_run.json'], f'{d}/uninterrupted.log')
        if rc == 0:
            u = losses(f'{d}/uninterrupted_run.json')
            res['uninterrupted_vs_source'] = {k: abs(v - src['losses'][k]) for k, v in u['losses'].items()}
            log(name, 'uninterrupted target-dp run vs source:', res['uninterrupted_vs_source'])

    if want(c, 'convert'):
        uni = f'{d}/ucp_universal'
        shutil.rmtree(uni, ignore_errors=True)
        # A tp=1 ZeRO-1/2 source does not say how its params would split over tp, and ucp will not
        # guess (ds_to_universal.py writes cat_dim 0 for all). For a load at tp=1 the kind does not
        # change the files' tensors, so the lab says "replicated".
        kind = ['--default_kind', 'replicated'] if ' --zero-stage 3' not in ' ' + c['src'] else []
        rc, msg = ucp(['convert', '--input_folder', f'{root}/{tag}', '--output_folder', f'{uni}/{tag}_universal'] + kind,
                      f'{d}/ucp_convert.log')
        res['ucp_convert'] = {'rc': rc, 'msg': msg.splitlines()[-1] if msg else ''}
        log(name, 'ucp convert:', rc, res['ucp_convert']['msg'])
        if rc == 0:
            rc = ds(c['tdp'], tgt_args + ['--universal', '--load', uni, '--tag', f'{tag}_universal',
                                          '--dump', f'{d}/conv_dump', '--result', f'{d}/conv_run.json'],
                    f'{d}/conv_load.log')
            res['convert_load_rc'] = rc
            if rc == 0:
                _, res['convert_cmp'] = cmp(f'{root}/ref', f'{d}/conv_dump', d, 'convert')
                res['convert_losses'] = loss_diffs(src, losses(f'{d}/conv_run.json'))
                log(name, 'ucp convert + load_universal:', res['convert_cmp'].get('line'), 'probe identical',
                    res['convert_losses']['probe_identical'],
                    {k: v['absdiff'] for k, v in res['convert_losses']['steps'].items()})

    if want(c, 'dsroute'):
        uni = f'{d}/ds_universal'
        shutil.rmtree(uni, ignore_errors=True)
        shutil.rmtree(f'{d}/ds_stepfix', ignore_errors=True)
        rc, out_ = chpy([f'{DS}/deepspeed/checkpoint/ds_to_universal.py', '--input_folder', f'{root}/{tag}',
                         '--output_folder', f'{uni}/{tag}_universal', '--inject_missing_state', '--num_extract_workers', '1',
                         '--num_merge_workers', '1'], f'{d}/ds_to_universal.log')
        res['ds_to_universal_rc'] = rc
        if rc == 0:
            # universal load at the target, save at once with each state's step un-aliased (stepfix)
            rc = ds(c['tdp'], tgt_args + ['--universal', '--load', uni, '--tag', f'{tag}_universal',
                                          '--dump', f'{d}/dsuni_dump', '--dump-end', f'{d}/dsuni_end', '--resave', f'{d}/ds_stepfix',
                                          '--stepfix', '--result', f'{d}/dsuni_run.json'], f'{d}/dsuni_load.log')
            if rc == 0:
                _, res['dsuni_cmp'] = cmp(f'{root}/ref', f'{d}/dsuni_dump', d, 'dsuni')
                res['dsuni_losses'] = loss_diffs(src, losses(f'{d}/dsuni_run.json'))
                log(name, 'DeepSpeed ds_to_universal + load_universal:', res['dsuni_cmp'].get('line'),
                    {k: v['absdiff'] for k, v in res['dsuni_losses']['steps'].items()})
                rc = ds(c['tdp'], tgt_args + ['--load', f'{d}/ds_stepfix', '--tag', f'{tag}_universal',
                                              '--dump', f'{d}/dsfix_dump', '--dump-end', f'{d}/dsfix_end', '--result', f'{d}/dsfix_run.json'],
                        f'{d}/dsfix_load.log')
                if rc == 0:
                    _, res['dsfix_cmp'] = cmp(f'{root}/ref', f'{d}/dsfix_dump', d, 'dsfix')
                    res['dsfix_losses'] = loss_diffs(src, losses(f'{d}/dsfix_run.json'))
                    log(name, 'DeepSpeed route with stepfix, plain load:', res['dsfix_cmp'].get('line'),
                        {k: v['absdiff'] for k, v in res['dsfix_losses']['steps'].items()})
                    if os.path.exists(f'{d}/ucp_end'):
                        # both resumed at the target from the same state: after the last step every
                        # tensor should be the same bits
                        _, res['end_ucp_vs_dsfix'] = cmp(f'{d}/dsfix_end', f'{d}/ucp_end', d, 'end_ucp_vs_dsfix')
                        log(name, 'after step 6, ucp route vs DeepSpeed stepfix route:',
                            res['end_ucp_vs_dsfix'].get('line'))
        else:
            log(name, 'ds_to_universal failed', out_.splitlines()[-1:] if out_ else '')

    if want(c, 'corrupt') and res.get('ucp_load_rc') == 0:
        bad = f'{d}/ucp_corrupt'
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(out, bad)
        rc, msg = chpy([f'{HERE}/ds19_corrupt.py', f'{bad}/{tag}'], f'{d}/corrupt.log')
        res['corrupt_what'] = msg.strip().splitlines()[-1]
        rc = ds(c['tdp'], tgt_args + ['--load', bad, '--tag', tag, '--dump', f'{d}/corrupt_dump',
                                      '--result', f'{d}/corrupt_run.json'], f'{d}/corrupt_load.log')
        if rc == 0:
            crc, res['corrupt_cmp'] = cmp(f'{root}/ref', f'{d}/corrupt_dump', d, 'corrupt')
            res['corrupt_caught'] = crc != 0
            res['corrupt_losses'] = loss_diffs(src, losses(f'{d}/corrupt_run.json'))
            log(name, 'corrupted copy:', res['corrupt_what'], '->', res['corrupt_cmp'].get('line'),
                'caught:', res['corrupt_caught'])
    os.makedirs(f'{WORK}/results', exist_ok=True)
    json.dump(res, open(rfile, 'w'), indent=1)
    return res


def main():
    global DS, WORK, ROUTES
    args = sys.argv[1:]
    if '--routes' in args:
        i = args.index('--routes')
        ROUTES = set(args[i + 1].split(','))
        del args[i:i + 2]
    if '--ds' in args:
        i = args.index('--ds')
        DS = args[i + 1]
        del args[i:i + 2]
    if '--work' in args:
        i = args.index('--work')
        WORK = args[i + 1]
        del args[i:i + 2]
    if '--list' in args:
        for k, v in CASES.items():
            print(k, v)
        return
    names = args or list(CASES)
    for n in names:
        log('=== case', n)
        try:
            run_case(n, CASES[n])
        except SystemExit as e:
            log(n, 'FAILED:', e)


if __name__ == '__main__':
    main()
