#!/usr/bin/env python3
# Random lab cases: sizes, operator order, precision, naming and source/target topologies
# drawn from --seed (so a case nobody has looked at is one command away), then run with
# lab/savanna_case.py. Usage: lab/savanna_random.py --out DIR --seed N [--count K] [--dry]
import argparse
import os
import random
import subprocess
import sys

LAB = os.path.dirname(os.path.abspath(__file__))


def draw(rng):
    tp_s, tp_t = rng.choice([(2, 1), (1, 2), (2, 2), (1, 1), (2, 1), (1, 2)])
    plain = rng.random() < 0.4

    def topo(tp):
        if plain:
            pp = 1
        else:
            pp = rng.choice([1, 2]) if tp * 2 <= 4 else 1
        dp = rng.choice([1, 2]) if tp * pp * 2 <= 4 else 1
        return tp, pp, dp

    while True:
        S, T = topo(tp_s), topo(tp_t)
        if S != T:
            break
    hidden = rng.choice([64, 96, 128, 192, 256, 384, 768, 768])
    heads = rng.choice([h for h in (2, 4, 6, 8, 12) if hidden % h == 0 and (hidden // h) % 2 == 0])
    gs = [g for g in (2, 4, 6, 8, 12, 16, 24, 32, 48, 64) if hidden % g == 0]
    ops = ["hyena_se", "hyena_mr", "hyena", "flash"]
    ops += rng.sample(ops, rng.randint(0, 2))
    rng.shuffle(ops)
    model = (f"--hidden {hidden} --heads {heads} --groups {rng.choice(gs)} --groups_mr {rng.choice(gs)} "
             f"--groups_se {rng.choice(gs)} --order {rng.choice([4, 6, 8, 16])} "
             f"--vocab {rng.choice([128, 256, 384, 512])} --seq {rng.choice([8, 12, 16, 24])} "
             f"--seed {rng.randint(1, 10**6)} --operators {','.join(ops)}")
    bf16 = rng.random() < 0.5
    if bf16:
        model += " --bf16"
    if rng.random() < 0.4:
        model += " --untied"
    if plain:
        model += " --plain"
    fmt = lambda t: f"--tp {t[0]} --pp {t[1]} --dp {t[2]}"
    # DeepSpeed 0.14.4 cannot universal-load a plain module at a smaller tp (README): such
    # a case goes through ucp reshard + a plain load instead.
    via_reshard = plain and T[0] < S[0]
    return model, fmt(S), fmt(T), ("2e-2" if bf16 else "1e-4"), via_reshard


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    fail = 0
    for i in range(a.count):
        model, S, T, tol, via_reshard = draw(rng)
        cmd = [sys.executable, os.path.join(LAB, "savanna_case.py"), "--case", os.path.join(a.out, f"r{a.seed}_{i}"),
               "--model", model, "--src", S, "--dst", T, "--tol", tol] + (["--via_reshard"] if via_reshard else [])
        print(" ".join(cmd[1:]), flush=True)
        if not a.dry:
            fail |= subprocess.run(cmd).returncode != 0
    sys.exit(fail)


if __name__ == "__main__":
    main()
