"""Damages a checkpoint file on purpose, for tests of ucp's error handling.

usage: mutate_checkpoint.py FILE OPERATION KEY.PATH [ARGS]
  Loads FILE with torch (DeepSpeed classes from ds_stubs), changes the value
  at KEY.PATH (dots separate dict keys and list indices) and saves it back
  with torch.save. Operations:
    add-to-element KEY.PATH INDEX DELTA  add DELTA to element INDEX of the tensor
    overlap KEY.PATH                     replace the 1-D tensor of n elements by
                                         a view of n elements of a storage of
                                         n // 2 (stride 0: overlapping)
    rename-key KEY.PATH OLD NEW          rename key OLD of the dict at KEY.PATH
    clear KEY.PATH                       empty the list or dict at KEY.PATH
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: F401,E402  (registers the DeepSpeed classes)
import torch  # noqa: E402


def child(node, k):
    if isinstance(node, (list, tuple)):
        return int(k)
    return k if k in node else int(k)


def walk(obj, path):
    """(container, key) of the value at the dotted path."""
    keys = path.split(".")
    node = obj
    for k in keys[:-1]:
        node = node[child(node, k)]
    return node, child(node, keys[-1])


def main(argv):
    path, op, key_path = argv[1], argv[2], argv[3]
    obj = torch.load(path)
    node, key = walk(obj, key_path)
    if op == "add-to-element":
        index, delta = int(argv[4]), float(argv[5])
        with torch.no_grad():
            node[key].view(-1)[index] += delta
    elif op == "overlap":
        n = node[key].numel()
        base = torch.zeros(max(1, n // 2), dtype=node[key].dtype)
        node[key] = base.as_strided((n,), (0,))
    elif op == "rename-key":
        old, new = argv[4], argv[5]
        d = node[key]
        items = [(new if k == old else k, v) for k, v in d.items()]
        d.clear()
        d.update(items)
    elif op == "clear":
        node[key].clear()
    else:
        raise SystemExit("unknown operation " + op)
    torch.save(obj, path)


if __name__ == "__main__":
    main(sys.argv)
