"""Loads a `ucp export --names=hf` folder with transformers' from_pretrained and
compares it with a reference model folder, bitwise.

usage: check_hf_from_pretrained.py EXPORTED REFERENCE [--seq 16]

REFERENCE is a folder from_pretrained loads independently of ucp, e.g. the
Hugging Face Trainer's checkpoint-N (Trainer.save_model wrote its
model.safetensors and config.json). Both are loaded in float32 on the CPU;
the check fails (exit 1) unless
  - the exported folder loads with no missing, unexpected or mismatched keys,
  - every tensor of the two state dicts has the same name, dtype, shape and bytes,
  - the logits of both models on the same token ids are bitwise equal.
Prints one line per check. Needs torch and transformers (the sid root has
transformers 5.12).
"""
import argparse
import sys

import torch
from transformers import AutoModelForCausalLM


def load(path):
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    model.eval()
    return model, info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exported")
    ap.add_argument("reference")
    ap.add_argument("--seq", type=int, default=16)
    a = ap.parse_args()
    ok = True
    exported, info = load(a.exported)
    reference, _ = load(a.reference)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(key):
            print(f"FAIL load {a.exported}: {key} = {info[key]}")
            ok = False
    print(f"loaded {type(exported).__name__} from {a.exported}")
    es, rs = exported.state_dict(), reference.state_dict()
    if list(es) != list(rs):
        print(f"FAIL state dict names differ: {sorted(set(es) ^ set(rs))}")
        ok = False
    same = 0
    for name in rs:
        if name not in es:
            continue
        x, y = es[name], rs[name]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.view(torch.uint8) if x.dim() else x, y.view(torch.uint8) if y.dim() else y):
            print(f"FAIL {name}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}, max diff {(x.float() - y.float()).abs().max().item()}")
            ok = False
        else:
            same += 1
    print(f"{same} of {len(rs)} tensors bitwise equal")
    vocab = reference.config.vocab_size
    ids = torch.randint(0, vocab, (2, a.seq), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        le = exported(input_ids=ids).logits
        lr = reference(input_ids=ids).logits
    if not torch.equal(le, lr):
        print(f"FAIL logits differ: max diff {(le - lr).abs().max().item()}")
        ok = False
    else:
        print(f"logits bitwise equal, shape {list(le.shape)}, mean {le.mean().item():.6f}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
