# Checks a universal checkpoint ucp wrote from a savanna-shaped checkpoint that REAL
# DeepSpeed 0.14.4 saved (testdata/savanna_ds0144/*, made by the lab of issue 14, since folded into realds/),
# against expected.pt: per param the fp32 master / exp_avg / exp_avg_sq that DeepSpeed
# itself reported for each source rank, merged over tp with a split table taken from
# savanna's code (not from ucp). Every tensor must be bitwise equal, split params must
# carry DeepSpeed's cat_dim, and the step must match. Exit 1 with one line per problem.
# Usage: python3 check_savanna_universal.py UNIVERSAL_DIR EXPECTED_PT
import os
import sys

import torch

univ, expected_path = sys.argv[1], sys.argv[2]
exp = torch.load(expected_path)
zero = os.path.join(univ, "zero")
problems = []
names = sorted(n for n in os.listdir(zero) if os.path.isdir(os.path.join(zero, n)))
missing = sorted(set(exp["params"]) - set(names))
if missing:
    problems.append(f"params missing from {zero}: {missing}")
extra = sorted(set(names) - set(exp["params"]))
if extra:
    problems.append(f"params in {zero} the model does not have: {extra}")
equal = 0
for name, e in sorted(exp["params"].items()):
    if name not in names:
        continue
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        d = torch.load(os.path.join(zero, name, f"{key}.pt"))
        t = d["param"]
        want = e[key]
        if t.dtype != want.dtype or t.shape != want.shape or not torch.equal(t, want):
            diff = ""
            if t.shape == want.shape:
                diff = f", max |diff| {(t.double() - want.double()).abs().max().item():.3g}"
            problems.append(f"{name}/{key}.pt: {tuple(t.shape)} {t.dtype}, expected "
                            f"{tuple(want.shape)} {want.dtype}{diff}")
        else:
            equal += 1
        sd = e["split_dim"]
        if sd >= 0 and d.get("cat_dim", 0) != sd:
            problems.append(f"{name}/{key}.pt: cat_dim {d.get('cat_dim', 0)}, savanna splits dim {sd}")
    step = torch.load(os.path.join(zero, name, "step.pt"))
    if float(step) != float(exp["step"]):
        problems.append(f"{name}/step.pt: {float(step)}, expected {exp['step']}")
for p in problems:
    print(p)
print(f"{univ}: {equal} of {3 * len(exp['params'])} tensors equal, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
