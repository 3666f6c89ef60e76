"""Writes torch.save files covering what ucp's torch reader/writer must handle.

Run with /usr/bin/python3 (Debian's python3-torch 1.13): make_cases.py OUTDIR
Writes OUTDIR/<case>.pt for every case below and prints their names.
"""
import argparse
import collections
import os
import sys

import numpy as np
import torch


def cases():
    g = torch.Generator().manual_seed(1234)
    out = {}

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    # Every storage dtype.
    out["dtypes"] = {
        "float32": rand(3, 4),
        "float16": rand(5, dtype=torch.float16),
        "float64": rand(2, 3, dtype=torch.float64),
        "bfloat16": rand(7, dtype=torch.bfloat16),
        "int8": torch.randint(-128, 127, (9,), dtype=torch.int8, generator=g),
        "int16": torch.randint(-30000, 30000, (4,), dtype=torch.int16, generator=g),
        "int32": torch.randint(-2**31, 2**31 - 1, (4,), dtype=torch.int32, generator=g),
        "int64": torch.tensor([-2**63, 2**63 - 1, 0, 12345678901234]),
        "uint8": torch.arange(256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "complex64": torch.complex(rand(3), rand(3)),
        "complex128": torch.complex(rand(2, dtype=torch.float64), rand(2, dtype=torch.float64)),
    }
    # Views into one storage: offsets, non-contiguous strides, transposes,
    # steps, an expanded (stride 0) view.
    base = torch.arange(60.0).reshape(6, 10)
    out["views"] = {
        "base": base,
        "row": base[2],
        "col": base[:, 3],
        "T": base.t(),
        "narrow": base[1:4, 2:7],
        "step": base[::2, ::3],
        "scalar_view": base[5, 9],
        "expanded": torch.arange(3.0).expand(4, 3),
    }
    # A DeepSpeed-style flat buffer saved through views only: the file holds
    # the whole storage.
    flat = rand(100)
    out["flat_views"] = [flat[:40].view(5, 8), flat[40:70], flat[95:]]
    # 0-dim and empty tensors.
    out["zero_dim_and_empty"] = {
        "scalar": torch.tensor(3.5),
        "int_scalar": torch.tensor(7),
        "empty": torch.zeros(0),
        "empty_3d": torch.zeros(3, 0, 2),
        "empty_bf16": torch.zeros(0, dtype=torch.bfloat16),
        "empty_view": torch.arange(10.0)[10:],
    }
    # More than ten storages: records sort as strings (data/10 before data/2).
    out["many_storages"] = [torch.full((i + 1,), float(i)) for i in range(13)]
    # The same tensor object twice, and two tensors sharing a storage.
    shared = rand(4)
    out["shared"] = {"a": shared, "b": shared, "c": shared[1:], "list": [shared, shared.view(2, 2)]}
    # Parameters and requires_grad.
    out["parameters"] = {
        "param": torch.nn.Parameter(rand(3)),
        "frozen": torch.nn.Parameter(rand(2), requires_grad=False),
        "grad_tensor": rand(2).requires_grad_(),
    }
    # A module state dict: OrderedDict with `_metadata`.
    torch.manual_seed(0)
    out["state_dict"] = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2)).state_dict()
    # Nested containers and scalars of every kind.
    out["nested"] = {
        "none": None, "true": True, "false": False,
        "ints": [0, 1, -1, 255, 256, 65535, 65536, 2**31 - 1, -2**31, 2**63 - 1, -2**63, 2**70, -2**65, 10**40],
        "floats": [0.0, -0.0, 1.0, 0.1, 1e-05, 0.0001, 1e16, 1e15, 123456789.125, 1e-300, 5e-324,
                   float("inf"), float("-inf"), float("nan"), 1.7976931348623157e308, 2.5e-08, 3.0e22],
        "strs": ["", "a", "quote\"back\\slash", "tab\tnewline\n", "caf\u00e9", "\U0001f600", "x" * 300],
        "bytes": [b"", b"\x00\xff", bytes(range(100))],
        "bytearray": bytearray(b"abc"),
        "tuple": (1, (2, (3,)), ()),
        "set": {3, 1, 2},
        "strset": {"b", "a", "c"},
        "frozenset": frozenset({("x", 1), ("y", 2)}),
        "odict": collections.OrderedDict([("z", 1), ("a", 2)]),
        "keys": {1: "int", (1, 2): "tuple", None: "none", 2.5: "float", b"k": "bytes", True: "bool?"},
        "tensor_in_list": [[rand(2)]],
    }
    # Objects the reader must keep as data.
    out["objects"] = {
        "namespace": argparse.Namespace(lr=0.1, name="run", layers=[1, 2]),
        "numpy": np.arange(12, dtype=np.uint32).reshape(3, 4),
        "numpy_f8": np.linspace(0, 1, 5),
        "numpy_scalar": np.float64(2.5),
        "rng": np.random.RandomState(3).get_state(),
        "dtype": torch.float16,
    }
    # A storage whose bytes are not a multiple of its element size (torch
    # writes the whole untyped storage, numel = floor(7 / 4)).
    odd = torch.storage.TypedStorage(wrap_storage=torch.UntypedStorage(7), dtype=torch.float32)
    odd_tensor = torch.tensor([], dtype=torch.float32).set_(odd, 0, (1,), (1,))
    odd_tensor.zero_()
    out["odd_storage"] = odd_tensor
    # A bigger tensor (several writer chunks when the chunk size is small).
    out["big"] = rand(300_000)
    # A bare tensor as root.
    out["bare_tensor"] = rand(2, 2)
    return out


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    for name, obj in cases().items():
        torch.save(obj, os.path.join(outdir, name + ".pt"))
        print(name)


if __name__ == "__main__":
    main()
