"""Damages a checkpoint file on purpose, for tests of ucp's error handling.

usage: mutate_checkpoint.py FILE add-to-element KEY.PATH INDEX DELTA
  Loads FILE with torch (DeepSpeed classes from ds_stubs), adds DELTA to
  element INDEX of the flat tensor at KEY.PATH (dots separate dict keys and
  list indices), and saves it back with torch.save.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: F401,E402  (registers the DeepSpeed classes)
import torch  # noqa: E402


def main(argv):
    path, op = argv[1], argv[2]
    obj = torch.load(path)
    if op == "add-to-element":
        keys, index, delta = argv[3].split("."), int(argv[4]), float(argv[5])
        node = obj
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, (list, tuple)) else node[k if k in node else int(k)]
        last = keys[-1]
        tensor = node[int(last)] if isinstance(node, (list, tuple)) else node[last if last in node else int(last)]
        with torch.no_grad():
            tensor.view(-1)[index] += delta
    else:
        raise SystemExit("unknown operation " + op)
    torch.save(obj, path)


if __name__ == "__main__":
    main(sys.argv)
