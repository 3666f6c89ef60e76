# Turns one lab case into a CI fixture (testdata/savanna_ds0144/<name>/), run in the chroot:
#   global_step3/   the checkpoint DeepSpeed 0.14.4 wrote at the source topology (as is,
#                   minus zero_to_fp32.py)
#   expected.pt     per param, what a universal checkpoint must hold, computed from the
#                   SOURCE ranks' dumps (DeepSpeed's safe_get_full_optimizer_state and the
#                   flat fp32 master) merged with lab/savanna_check.py's split table (from
#                   savanna's code; independent of ucp): {"params": {name: {"fp32", "exp_avg",
#                   "exp_avg_sq", "split_dim" (-1 = whole)}}, "step": float}
# Usage: python3 make_ci_fixture.py CASE_DIR OUT_DIR
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import savanna_check as sc  # noqa: E402

case, out = sys.argv[1], sys.argv[2]
problems = []
full, _, steps = sc.merged(sc.load_dumps(os.path.join(case, "dumpS")), problems, "source")
assert not problems, problems
assert len(steps) == 1, steps
exp = {"params": {}, "step": next(iter(steps))}
for name, e in full.items():
    d = sc.split_dim(name)
    exp["params"][name] = {"fp32": e["fp32_master"].clone(), "exp_avg": e["exp_avg"].clone(),
                           "exp_avg_sq": e["exp_avg_sq"].clone(), "split_dim": -1 if d is None else d}
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
shutil.copytree(os.path.join(case, "ckpt", "global_step3"), os.path.join(out, "global_step3"),
                ignore=shutil.ignore_patterns("zero_to_fp32.py"))
torch.save(exp, os.path.join(out, "expected.pt"))
print(f"{out}: {len(exp['params'])} params, step {exp['step']}")
