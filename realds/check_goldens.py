#!/usr/bin/python3
# ucp against the goldens of tools/upstream_check.sh, with no DeepSpeed (runs on
# the host: Debian's python3-torch and python3-protobuf; see realds/README.md).
# For every golden case of testdata/upstream/: `ucp convert`'s universal files
# (fp32, exp_avg, exp_avg_sq of every param, and the step) and `ucp export`'s
# fp32 weights must carry the expected digests, so the goldens the upstream check
# holds DeepSpeed to are what ucp writes. Native MoE, which ucp converts by
# reshard only, is checked through export.
#   check_goldens.py UCP WORK     (WORK relative to $TEST_TMPDIR under bazel test)
import hashlib
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import host  # noqa: E402

GOLDEN = "testdata/upstream"


def digest(t):
    t = t.detach().contiguous()
    return list(t.shape), str(t.dtype).replace("torch.", ""), hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()


def main():
    ucp = os.path.abspath(sys.argv[1])
    work = os.path.join(os.environ.get("TEST_TMPDIR", ""), sys.argv[2]) if os.environ.get("TEST_TMPDIR") else \
        os.path.abspath(sys.argv[2])
    pb = host.load_pb2()
    os.chdir(os.path.dirname(HERE))
    from google.protobuf import text_format
    fails, checked = 0, 0
    for name in sorted(os.listdir(GOLDEN)):
        if not os.path.exists(os.path.join(GOLDEN, name, "case.textproto")):
            continue
        case = text_format.Parse(open(os.path.join(GOLDEN, name, "case.textproto")).read(), pb.GoldenCase())
        exp = text_format.Parse(open(os.path.join(GOLDEN, name, "expected.textproto")).read(), pb.Expected())
        want = {(t.param, t.state): (list(t.shape), t.dtype, t.sha256) for t in exp.tensor}
        src = os.path.join(GOLDEN, name, case.tag)
        problems = []
        moe = "--moe_layers" in case.model.args
        if not moe:
            uni = os.path.join(work, name, case.tag + "_universal")
            flags = []  # a tp=1 source converts with no flags (undecided params kept whole)
            p = subprocess.run([ucp, "convert", f"--input_folder={src}", f"--output_folder={uni}", "--progress=never"]
                               + flags, capture_output=True, text=True)
            if p.returncode:
                problems.append(f"ucp convert: {p.stderr.strip().splitlines()[-1:]}")
            else:
                for (param, state), (shape, dtype, sha) in sorted(want.items()):
                    if state == "lp":
                        continue  # a universal checkpoint holds no lp weights
                    v = torch.load(os.path.join(uni, "zero", param, f"{state}.pt"))
                    t = v["param"] if isinstance(v, dict) else v.reshape(shape)  # ZeRO-3: flat
                    checked += 1
                    if digest(t) != (shape, dtype, sha):
                        problems.append(f"universal {param} {state}: {digest(t)[:2]} differs from the golden {shape} {dtype}")
                steps = {float(torch.load(f) if not isinstance(torch.load(f), dict) else torch.load(f)["param"])
                         for f in [os.path.join(uni, "zero", p_, "step.pt") for p_ in {k[0] for k in want}]
                         if os.path.exists(f)}
                if steps and steps != {exp.step}:
                    problems.append(f"universal step.pt {sorted(steps)}, golden {exp.step}")
        out = os.path.join(work, name, "export")
        p = subprocess.run([ucp, "export", f"--input_folder={src}", f"--output_folder={out}", "--format=torch",
                            "--progress=never"], capture_output=True, text=True)
        if p.returncode:
            problems.append(f"ucp export: {p.stderr.strip().splitlines()[-1:]}")
        else:
            sd = torch.load(os.path.join(out, "pytorch_model.bin"))
            for (param, state), w in sorted(want.items()):
                if state != "fp32":
                    continue
                checked += 1
                if param not in sd:
                    problems.append(f"export: no {param}")
                elif digest(sd[param]) != w:
                    problems.append(f"export {param}: {digest(sd[param])[:2]} differs from the golden {w[:2]}")
        print(f"{'FAIL' if problems else 'ok  '} {name}" + "".join(f"\n     {x}" for x in problems[:5]))
        fails += bool(problems)
    print(f"{checked} tensors checked, {fails} golden cases failed")
    return 1 if fails or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
