"""Reference results of torch 1.13 CPU ops for tensor_python_test.cc.

Run with /usr/bin/python3 (Debian's python3-torch). Reads a JSON list of
cases from argv[1]; each case names raw little-endian input files and writes
the raw result bytes to case["out"]:
  {"op": "cast", "in": path, "dtype": "float32", "offset": 0, "sizes": [..],
   "strides": [..], "to": "bfloat16", "out": path}
  {"op": "average", "ins": [paths], "dtype": "float32", "out": path}
The view (offset, sizes, strides) is applied with as_strided to the 1-D
tensor over the input file, so non-contiguous inputs take torch's own paths.
"""
import json
import sys

import numpy as np
import torch

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
BITS = {torch.float32: torch.int32, torch.float64: torch.int64,
        torch.float16: torch.int16, torch.bfloat16: torch.int16}


def load(path, dtype):
    raw = np.fromfile(path, dtype=np.uint8)
    bits = BITS[dtype]
    width = torch.tensor([], dtype=dtype).element_size()
    t = torch.from_numpy(raw.copy()).view(bits) if width > 1 else torch.from_numpy(raw.copy())
    return t.view(dtype)


def save(t, path):
    t = t.contiguous()
    t.view(BITS[t.dtype]).numpy().tofile(path)


def main():
    for case in json.load(open(sys.argv[1])):
        dtype = DTYPES[case["dtype"]]
        if case["op"] == "cast":
            base = load(case["in"], dtype)
            view = base.as_strided(case["sizes"], case["strides"], case["offset"])
            save(view.to(DTYPES[case["to"]]), case["out"])
        elif case["op"] == "average":
            slices = [load(p, dtype) for p in case["ins"]]
            save(sum(slices) / len(slices), case["out"])
        else:
            raise ValueError(case["op"])


if __name__ == "__main__":
    main()
