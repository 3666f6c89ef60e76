"""Edits one value of a checkpoint file, for tests of ucp's checks.

usage: edit_checkpoint.py FILE set KEY/PATH PYTHON_EXPR
  Loads FILE with torch (DeepSpeed classes from ds_stubs), sets the value at
  KEY/PATH ('/' separates dict keys and list indices; param names contain
  dots) to eval(PYTHON_EXPR) (torch and os in scope), and saves it back with
  torch.save. Example: set global_steps 5; set evil os.system.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: F401,E402  (registers the DeepSpeed classes)
import torch  # noqa: E402


def main(argv):
    path, op, keys, expr = argv[1], argv[2], argv[3].split("/"), argv[4]
    if op != "set":
        raise SystemExit("unknown operation " + op)
    obj = torch.load(path)
    node = obj
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, (list, tuple)) else node[k if k in node else int(k)]
    value = eval(expr, {"torch": torch, "os": os})
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    torch.save(obj, path)


if __name__ == "__main__":
    main(sys.argv)
