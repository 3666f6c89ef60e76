#!/usr/bin/python3
# Checkpoints that real DeepSpeed writes, for the benchmark (bench/run_bench.sh
# --source=DIR, bench/run_real_bench.sh): each shape trained one step by
# unmodified DeepSpeed on CPU in a Debian root (the realds harness:
# realds/host.py, tools/deepspeed_env.sh) and saved as DeepSpeed saves it.
# Made once and cached in ${UCP_CACHE_DIR:-~/.cache/ucp}/bench/SHAPE/ (a shape
# is made in a temporary folder and renamed when complete).
#
#   bench/real_checkpoints.py [--shapes=a,b|all] [--list]
# prints, per shape, the folder of its tag (SHAPE/ckpt/global_step1).
import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "realds"))
import host  # noqa: E402

# name: (DeepSpeed, family, model args, tp, pp, dp, ep, ZeRO stage, dtype, what it shows)
BIG_NEOX = "--hidden 1024 --heads 16 --layers 12 --vocab 8192 --seq 8"
SHAPES = {
    "neox-tp2-z1": ("0.14.4", "neox", BIG_NEOX, 2, 1, 1, 1, 1, "fp32",
                    "issue 28's shape: GPT-NeoX tp 2, dp 1, two ~1.1 GB optimizer files, 36 files"),
    "neox-dp4-z1": ("0.19.5", "neox", "--hidden 768 --heads 12 --layers 8 --vocab 8192 --seq 8 --plain", 1, 1, 4, 1, 1,
                    "fp32", "dp 4: many smaller optimizer files, plain module"),
    "neox-pp2-z1": ("0.19.5", "neox", BIG_NEOX, 1, 2, 1, 1, 1, "fp32", "pipeline: layer files over 2 stages"),
    "gpt-bf16-z2": ("0.19.5", "gpt", "--hidden 1024 --heads 16 --layers 8 --vocab 8192 --ffn 4", 1, 1, 2, 1, 2, "bf16",
                    "bf16 ZeRO-2, dp 2"),
    "gpt-z3": ("0.19.5", "gpt", "--hidden 1024 --heads 16 --layers 8 --vocab 8192 --ffn 4", 1, 1, 2, 1, 3, "fp32",
               "ZeRO-3, dp 2"),
    "gpt-moe-z1": ("0.19.5", "gpt", "--hidden 512 --heads 8 --layers 4 --vocab 8192 --moe_layers 1,3 --experts 8", 1,
                   1, 2, 2, 1, "fp32", "native MoE, 8 experts over ep 2, dp 2"),
    "gpt-dp8-z2": ("0.16.4", "gpt", "--hidden 512 --heads 8 --layers 6 --vocab 8192 --ffn 4", 1, 1, 8, 1, 2, "fp32",
                   "ZeRO-2 dp 8 (DeepSpeed 0.16.4): eight small optimizer files beside one large module file"),
    "neox-3d-bf16": ("0.19.5", "neox", "--hidden 1024 --heads 16 --layers 8 --vocab 8192 --seq 8", 2, 2, 2, 1, 1, "bf16",
                     "tp 2, pp 2, dp 2, bf16 ZeRO-1: every kind of parallelism at once, eight optimizer files"),
    "gpt-z0": ("0.19.5", "gpt", "--hidden 1024 --heads 16 --layers 8 --vocab 8192 --ffn 4", 1, 1, 1, 1, 0, "fp32",
               "ZeRO-0 (no ZeRO), fp32: the module and the optimizer in one model-states file"),
    "neox-deep-tp2": ("0.19.5", "neox", "--hidden 256 --heads 4 --layers 64 --vocab 8192 --seq 8", 2, 1, 2, 1, 1, "fp32",
                      "many small params: 64 layers at hidden 256, tp 2, dp 2 (136 layer files, 643 params; "
                      "a universal checkpoint of about 2600 files)"),
}


def global_batch(dp):
    # 4 samples a step, or the fewest multiple of dp above that (the batch
    # splits over the data-parallel ranks).
    return -(-4 // dp) * dp


def cache_root():
    return os.path.join(host.cache_dir(), "bench")


def make(name, out):
    ds, family, args, tp, pp, dp, ep, z, dtype, _ = SHAPES[name]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=os.path.dirname(out))
    workers = host.Workers(host.Env(), tmp)
    try:
        spec = {"family": family, "model_args": args, "seed": 1, "data_seed": 1, "dtype": dtype,
                "topology": {"tp": tp, "pp": pp, "dp": dp, "ep": ep}, "zero_stage": z, "sub_group_size": None,
                "global_batch": global_batch(dp), "config": {}, "universal": False, "losses": None,
                "actions": [{"do": "train", "steps": 1},
                            {"do": "save", "dir": os.path.join(tmp, "ckpt"), "tag": "global_step1"}]}
        r = workers.job(host.default_root(ds), ds, tp * pp * dp, spec, os.path.join(tmp, "job.log"), timeout=3600)
        if not r["ok"]:
            raise SystemExit(f"{name}: DeepSpeed failed: {r.get('error')} (log {r.get('log')}; kept)")
    finally:
        workers.close()
    for f in os.listdir(tmp):  # keep the checkpoint only
        if f != "ckpt":
            p = os.path.join(tmp, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    os.rename(tmp, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    names = list(SHAPES) if a.shapes == "all" else a.shapes.split(",")
    for n in names:
        if n not in SHAPES:
            raise SystemExit(f"unknown shape {n} (known: {', '.join(SHAPES)})")
    os.chdir(REPO)
    for n in names:
        out = os.path.join(cache_root(), n)
        if a.list:
            print(f"{n}: {SHAPES[n][-1]} (DeepSpeed {SHAPES[n][0]})", flush=True)
            continue
        if not os.path.isdir(out):
            print(f"making {n}: {SHAPES[n][-1]} (DeepSpeed {SHAPES[n][0]})", file=sys.stderr, flush=True)
            make(n, out)
        print(os.path.join(out, "ckpt", "global_step1"), flush=True)


if __name__ == "__main__":
    main()
