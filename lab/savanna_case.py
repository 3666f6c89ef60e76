#!/usr/bin/env python3
# Runs one lab case end to end (host side; DeepSpeed runs in the chroot via lab/ds.sh):
#   train at the source topology S -> ucp convert (no rule flags unless --convert_args)
#   -> universal load at the target topology T (+ dump, + DeepSpeed's own plain save, + resume)
#   -> fresh-process resume from that plain checkpoint at T -> lab/savanna_check.py.
# Example:
#   lab/savanna_case.py --case /work/labdata/lab14/c1 --model "--hidden 768 --seed 3" \
#       --src "--tp 2 --pp 2" --dst "--tp 1"
import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time

LAB = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(LAB)


def nproc(flags, model):
    toks = shlex.split(flags)
    tp = int(toks[toks.index("--tp") + 1]) if "--tp" in toks else 1
    pp = int(toks[toks.index("--pp") + 1]) if "--pp" in toks else 1
    dp = int(toks[toks.index("--dp") + 1]) if "--dp" in toks else 1
    rest = [t for i, t in enumerate(toks) if t != "--dp" and (i == 0 or toks[i - 1] != "--dp")]
    return tp * pp * dp, " ".join(rest)


def run(cmd, log):
    t = time.time()
    with open(log, "w") as f:
        r = subprocess.run(cmd, shell=True, stdout=f, stderr=subprocess.STDOUT)
    print(f"  [{time.time() - t:5.1f}s rc={r.returncode}] {cmd}", flush=True)
    if r.returncode != 0:
        os.system(f"grep -v '^\\[20' {log} | grep -E 'rank0\\]|Error|error' | tail -30")
        sys.exit(f"failed: see {log}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True)
    ap.add_argument("--model", default="", help="model flags for savanna_run.py (sizes, seed, --bf16, --plain ...)")
    ap.add_argument("--src", required=True, help='source topology, e.g. "--tp 2 --pp 2 --dp 1"')
    ap.add_argument("--dst", required=True, help="target topology")
    ap.add_argument("--convert_args", default="", help="extra ucp convert flags (the wrong-merge case)")
    ap.add_argument("--tol", default="1e-5")
    ap.add_argument("--expect_fail", action="store_true")
    ap.add_argument("--ucp", default=os.path.join(REPO, "bazel-bin/tools/ucp"))
    ap.add_argument("--via_reshard", action="store_true",
                    help="ucp reshard the universal folder to T and load that plain checkpoint (for what "
                         "DeepSpeed 0.14.4's universal loader cannot load)")
    ap.add_argument("--reuse_source", help="copy ckpt/, dumpS/, lossS* from this case dir instead of training")
    a = ap.parse_args()
    c = a.case
    shutil.rmtree(c, ignore_errors=True)
    os.makedirs(c)
    ds = os.path.join(LAB, "ds.sh")
    run_py = os.path.join(LAB, "savanna_run.py")
    ns, src = nproc(a.src, a.model)
    nt, dst = nproc(a.dst, a.model)
    steps = 3
    print(f"case {c}: model [{a.model}] S [{a.src}] -> T [{a.dst}] {a.convert_args}", flush=True)
    if a.reuse_source:
        for n in os.listdir(a.reuse_source):
            if n in ("ckpt", "dumpS") or n.startswith("lossS") or n == "train.log":
                p = os.path.join(a.reuse_source, n)
                (shutil.copytree if os.path.isdir(p) else shutil.copy)(p, os.path.join(c, n))
        shutil.rmtree(os.path.join(c, "ckpt", f"global_step{steps}_universal"), ignore_errors=True)
    else:
        run(f"{ds} {ns} {run_py} --mode train {src} {a.model} --steps {steps} --save_dir {c}/ckpt "
            f"--dump {c}/dumpS --losses {c}/lossS", f"{c}/train.log")
    run(f"{a.ucp} convert --input_folder={c}/ckpt/global_step{steps} "
        f"--output_folder={c}/ckpt/global_step{steps}_universal {a.convert_args}", f"{c}/convert.log")
    os.system(f"grep -E '^(preset|kind|column|row|replicated|vocab|total|wrote)' {c}/convert.log | sed 's/^/    /'")
    if a.via_reshard:
        toks = shlex.split(a.dst)
        topo = {k: toks[toks.index(f"--{k}") + 1] if f"--{k}" in toks else "1" for k in ("tp", "pp", "dp")}
        run(f"{a.ucp} reshard --input_folder={c}/ckpt/global_step{steps}_universal "
            f"--output_folder={c}/reshardT/global_step{steps} --tp={topo['tp']} --pp={topo['pp']} --dp={topo['dp']}",
            f"{c}/reshard.log")
        run(f"{ds} {nt} {run_py} --mode load --plain_load {dst} {a.model} --load_dir {c}/reshardT "
            f"--tag global_step{steps} --save_dir {c}/plainT --dump {c}/dumpT --losses {c}/lossU", f"{c}/load.log")
    else:
        run(f"{ds} {nt} {run_py} --mode load {dst} {a.model} --load_dir {c}/ckpt --tag global_step{steps}_universal "
            f"--save_dir {c}/plainT --dump {c}/dumpT --losses {c}/lossU", f"{c}/load.log")
    run(f"{ds} {nt} {run_py} --mode resume {dst} {a.model} --load_dir {c}/plainT --tag global_step{steps} "
        f"--losses {c}/lossP", f"{c}/resume.log")
    chk = (f"chroot /work/lab/trixie python3 {LAB}/savanna_check.py --case {c} --tol {a.tol}"
           + (" --expect_fail" if a.expect_fail else ""))
    r = subprocess.run(chk, shell=True, capture_output=True, text=True)
    open(f"{c}/check.log", "w").write(r.stdout + r.stderr)
    import json
    rep = json.load(open(f"{c}/check.json"))
    print(f"  tensors equal {rep['tensors_equal']}/{rep['tensors_compared']} ({rep['params']} params x 4), "
          f"buffers {rep['buffers_equal']}/{rep['buffers']}, step S {rep['steps_source']} T {rep['steps_target']}, "
          f"safe_get_full_fp32_param equal {rep['safe_get_full_fp32_param_equal']}/{rep['params']}")
    print(f"  (a) resumed losses universal vs plain: {rep['a_universal_vs_plain_equal']}/{rep['a_records']} bitwise "
          f"(steps {rep['resumed_steps']}); (b) first resumed step {rep['b_first_step']}: max |diff| vs source "
          f"{rep['b_max_abs_diff']} (tp changed: {rep['tp_changed']})")
    print(f"  problems: {rep['problems'][:6]}")
    print(f"  {'EXPECTED FAILURE' if a.expect_fail else 'RESULT'}: {'checks failed' if rep['problems'] else 'ok'}")
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
