"""Writes the committed seed corpora of the fuzz targets (fuzz/seeds/).

Run with Debian's /usr/bin/python3 (python3-torch 1.13, python3-numpy) from
the repository root:

    /usr/bin/python3 fuzz/make_seeds.py

seeds/torch_file/: a few tiny real torch.save files (every dtype, views on
  shared storages, 0-dim and empty tensors, a Parameter, a state dict with
  _metadata, an optimizer-like tree, a bare storage, a numpy array), and the
  data.pkl of some of them, which torch_file_fuzzer wraps in an archive of
  its own (storages 0..3 of 16, 0, 7 and 64 bytes: `tensors.pt` is made to
  match that layout, so its data.pkl seed loads).
  Also hand-made archives for layouts torch 1.13 does not write for small
  files: zip64 (tensors_zip64.pt) and a byteorder record with .data/version
  (tensors_byteorder.pt).
seeds/pickle/: the data.pkl of each .pt file, pickle.dumps of small trees at
  every protocol 0-5 (text opcodes, frames, memo, sets, bytes, big ints,
  OrderedDict, objects), and hand-made pickles of what Python 3 no longer
  writes (Python 2's OrderedDict([[k, v]]) and byte strs, copy_reg
  __newobj_ex__ at protocol 2, protocol 0 INST). torch_size.data.pkl (in
  both) is a tensor whose size is a torch.Size object.

The output is deterministic for a given torch/Python version; the files are
committed so that fuzzing does not need torch.

found_*: inputs the fuzzers found that broke an assumption of the fuzz
targets (not the readers), kept as seeds so that the replay tests cover those
paths; this script does not write them:
  pickle/found_inst_written_as_reduce.pkl: an OBJ object, which the writer
    writes back as REDUCE (fuzz_checks.h: RoundTripsExactly);
  torch_file/found_python2_str_not_utf8.data.pkl: a SHORT_BINSTRING that is
    not UTF-8, which the writer refuses (HasValueTheWriterRefuses).
"""

import argparse
import collections
import io
import os
import pickle
import struct
import sys
import zipfile
import zlib

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def torch_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def data_pkl(pt_bytes):
    with zipfile.ZipFile(io.BytesIO(pt_bytes)) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name)


class Opaque:
    """An object pickled as NEWOBJ + BUILD of a __main__ class."""

    def __init__(self):
        self.a = 1
        self.b = [1, 2]


def torch_cases():
    # Storages 0..3 of 16, 0, 7 and 64 bytes: torch_file_fuzzer's wrapper.
    tensors = collections.OrderedDict()
    tensors["f32"] = torch.arange(4, dtype=torch.float32)
    tensors["empty"] = torch.zeros(0)
    tensors["u8"] = torch.arange(7, dtype=torch.uint8)
    tensors["f64"] = torch.arange(8, dtype=torch.float64)

    base = torch.arange(12, dtype=torch.float32)
    views = {
        "base": base,
        "narrow": base[2:5],
        "transposed": base.view(3, 4).t(),
        "strided": base[::3],
        "scalar": torch.tensor(3.5),
        "empty2d": torch.zeros(0, 3),
        "same": base,
    }

    dtypes = {
        str(dt): torch.ones(2, dtype=dt)
        for dt in (torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32, torch.int64,
                   torch.bool, torch.complex64)
    }

    linear = torch.nn.Linear(2, 2)
    with torch.no_grad():
        linear.weight.copy_(torch.arange(4, dtype=torch.float32).view(2, 2))
        linear.bias.fill_(0.5)
    module = {"module": linear.state_dict(), "param": torch.nn.Parameter(torch.ones(3))}

    optimizer = {
        "optimizer_state_dict": {
            "state": {0: {"step": 3, "exp_avg": torch.zeros(2), "exp_avg_sq": torch.ones(2)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}],
        },
        "args": argparse.Namespace(lr=0.1, tp=2, name="x"),
        "ds_version": "0.14.4",
        "tags": {"a", "b"},
        "frozen": frozenset([1, 2]),
        "blob": b"\x00\x01\xff",
        "big": 2**70,
        "neg": -(2**40),
        "nan": float("nan"),
        "none": None,
        "flag": True,
    }

    storage = torch.arange(5, dtype=torch.int32).storage()
    array = {"array": np.arange(6, dtype=np.float32).reshape(2, 3)}
    return [
        ("tensors", tensors),
        ("views", views),
        ("dtypes", dtypes),
        ("module", module),
        ("optimizer", optimizer),
        ("storage", storage),
        ("numpy", array),
    ]


def pickle_cases():
    shared = [1, 2]
    trees = {
        "scalars": [None, True, False, 0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31, 2**63, -2**63 - 1,
                    1.5, float("inf"), "", "é", "\U0001f600"],
        "containers": {"t0": (), "t1": (1,), "t2": (1, 2), "t3": (1, 2, 3), "t4": (1, 2, 3, 4), "l": [[], [1]],
                       "d": {1: "a", (1, 2): "b"}, "s": {1, 2}, "f": frozenset(["x"])},
        "shared": {"a": shared, "b": shared, "c": (shared, shared)},
        "objects": {"od": collections.OrderedDict([("x", 1), ("y", 2)]), "ns": argparse.Namespace(k=1),
                    "bytes": b"abc", "bytearray": bytearray(b"xyz"), "obj": Opaque()},
    }
    out = []
    for name, tree in trees.items():
        for protocol in range(0, 6):
            out.append(("p%d_%s" % (protocol, name), pickle.dumps(tree, protocol=protocol)))
    return out


# ---- hand-made seeds for paths torch 1.13 and Python 3 do not write ----


def zip64_archive(records):
    """The records as a zip64 archive in the layout torch writes past 4 GiB
    (zip.h): data descriptors, zip64 extra fields for every size and offset,
    a zip64 end of central directory record and locator, saturated classic
    fields."""
    out = b""
    central = b""
    for name, data in records:
        n = name.encode()
        crc = zlib.crc32(data) & 0xFFFFFFFF
        offset = len(out)
        extra = struct.pack("<HHQQ", 0x0001, 16, len(data), 0)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0x0808, 0, 0, 0, 0, 0, 0, len(n), len(extra)) + n + extra
        out += data
        out += struct.pack("<IIQQ", 0x08074B50, crc, len(data), len(data))
        cextra = struct.pack("<HHQQQ", 0x0001, 24, len(data), len(data), offset)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0x031E, 45, 0x0808, 0, 0, 0, crc, 0xFFFFFFFF,
                               0xFFFFFFFF, len(n), len(cextra), 0, 0, 0, 0, 0xFFFFFFFF) + n + cextra
    cd_offset = len(out)
    out += central
    z64_offset = len(out)
    count = len(records)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 45, 0, 0, count, count, len(central), cd_offset)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64_offset, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return out


def records_of(pt_bytes):
    with zipfile.ZipFile(io.BytesIO(pt_bytes)) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def with_records(pt_bytes, replace):
    """A stored zip of the records of `pt_bytes` with `replace` applied
    ({name: bytes or None to drop}; new names are appended)."""
    records = [(n, replace.get(n, d)) for n, d in records_of(pt_bytes) if replace.get(n, d) is not None]
    names = {n for n, _ in records}
    records += [(n, d) for n, d in replace.items() if n not in names and d is not None]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


# Python 2 era pickles (protocol 2 as Python 2.7 writes them): OrderedDict as
# OrderedDict([[k, v], ...]), byte strs as BINSTRING/SHORT_BINSTRING (one not
# UTF-8), __builtin__ names.
PY2_PICKLES = {
    "py2_ordered_dict": b"\x80\x02ccollections\nOrderedDict\nq\x00]q\x01(]q\x02(U\x01aq\x03K\x01e]q\x04"
                        b"(U\x01bq\x05K\x02ee\x85q\x06Rq\x07.",
    "py2_strs": b"\x80\x02]q\x00(U\x03abcq\x01U\x02\xff\xfeq\x02T\x04\x00\x00\x00\xc3\xa9xyq\x03"
                b"c__builtin__\nset\nq\x04]q\x05K\x01a\x85q\x06Rq\x07e.",
    "py2_bytearray": b"\x80\x02c__builtin__\nbytearray\nq\x00X\x04\x00\x00\x00ab\xc3\xa9q\x01U\x07latin-1"
                     b"q\x02\x86q\x03Rq\x04.",
    "newobj_ex_protocol2": b"\x80\x02ccopy_reg\n__newobj_ex__\nq\x00cargparse\nNamespace\nq\x01)}q\x02"
                           b"X\x01\x00\x00\x00kq\x03K\x01s\x87q\x04Rq\x05.",
    "protocol0_text": b"(dp0\nS'a'\np1\nI01\nsS'b'\np2\nL123456789012345678901234567890L\nsS'c'\np3\nF-1.5e-3\n"
                      b"sVcaf\\u00e9\np4\n(lp5\nI-7\nag1\nasS'd'\np6\n(i__main__\nOld\np7\n(dp8\nS'x'\n"
                      b"I1\nsbs.",
}

# data.pkl for torch_file_fuzzer's wrapper (storage '0' is 16 bytes): a
# tensor whose size is a torch.Size object, as old torch versions pickled it.
TORCH_SIZE_PKL = (b"\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00"
                  b"storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06K\x04tq\x07"
                  b"QK\x00ctorch\nSize\nq\x08K\x02K\x02\x86q\t\x85q\nRq\x0bK\x02K\x01\x86q\x0c\x89ccollections\n"
                  b"OrderedDict\nq\r)Rq\x0etq\x0fRq\x10s.")


def main():
    torch.manual_seed(0)
    for name, obj in torch_cases():
        pt = torch_bytes(obj)
        write(os.path.join(ROOT, "torch_file", name + ".pt"), pt)
        write(os.path.join(ROOT, "pickle", name + ".data.pkl"), data_pkl(pt))
        if name in ("tensors", "views", "module"):
            write(os.path.join(ROOT, "torch_file", name + ".data.pkl"), data_pkl(pt))
    for name, data in pickle_cases():
        write(os.path.join(ROOT, "pickle", name + ".pkl"), data)
    for name, data in PY2_PICKLES.items():
        write(os.path.join(ROOT, "pickle", name + ".pkl"), data)
    write(os.path.join(ROOT, "pickle", "torch_size.data.pkl"), TORCH_SIZE_PKL)
    write(os.path.join(ROOT, "torch_file", "torch_size.data.pkl"), TORCH_SIZE_PKL)

    tensors = torch_bytes(torch_cases()[0][1])
    write(os.path.join(ROOT, "torch_file", "tensors_zip64.pt"), zip64_archive(records_of(tensors)))
    # torch >= 1.?? layouts: a byteorder record, version under .data/.
    write(os.path.join(ROOT, "torch_file", "tensors_byteorder.pt"),
          with_records(tensors, {"archive/version": None, "archive/.data/version": b"3\n",
                                 "archive/byteorder": b"little"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
