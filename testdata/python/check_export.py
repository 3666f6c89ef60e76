"""Checks a `ucp export` folder with readers independent of ucp.

usage:
  check_export.py EXPORT_DIR FORMAT EXPECTED [--ordered] [--dtype-of-expected] [--tied ALIAS=OWNER ...]

  FORMAT    safetensors | torch
  EXPECTED  universal:DIR   every zero/<name>/fp32.pt 'param' of a universal folder
            zero:DIR        the fp32 masters merged here from a ZeRO-1/2 folder's
                            optimizer files (zero_to_fp32.py's walk of param_shapes
                            over the concatenated dp partitions, per tp rank), tp
                            slices merged by GPT-NeoX's layer kinds (norms and
                            row-parallel biases replicated, checked equal;
                            attention.dense / dense_4h_to_h weights on dim 1; the
                            rest on dim 0)
            pt:FILE         a state dict saved with torch.save (e.g. zero_to_fp32.py's)

Safetensors files are read with json + numpy only, checking the format as the
reference writer produces it: 8-byte little-endian header length, a header
padded with spaces to a multiple of 8, __metadata__ {"format": "pt"} first,
entries in data order = dtype descending then name, offsets tiling the buffer.
Torch files are read with torch.load(weights_only=True). A sharded export's
index json must be exactly json.dumps(index, indent=2, sort_keys=True) + "\\n"
with total_size = the sum of the distinct tensors' bytes.

--ordered: the export's names in file order equal EXPECTED's key order
(torch format; pt: only). Every tensor must equal EXPECTED's bitwise (dtype,
shape, bytes); --tied: ALIAS must be the same storage as OWNER (torch) or be
recorded in __metadata__ (safetensors). Prints problems, exits 1 on any.
"""
import glob
import json
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import ds_stubs  # noqa: F401,E402
import torch  # noqa: E402

# numpy 2 pickles name numpy._core; Debian's numpy 1.x has numpy.core.
import numpy.core.multiarray  # noqa: E402
sys.modules.setdefault("numpy._core", numpy.core)
sys.modules.setdefault("numpy._core.multiarray", numpy.core.multiarray)

PROBLEMS = []
files_of = {}  # export file -> its names in order


def problem(msg):
    PROBLEMS.append(msg)


ST_DTYPES = {  # name -> (numpy dtype, torch dtype, rank in safetensors' enum)
    "BOOL": ("?", torch.bool, 0), "U8": ("<u1", torch.uint8, 4), "I8": ("<i1", torch.int8, 5),
    "I16": ("<i2", torch.int16, 11), "F16": ("<f2", torch.float16, 13), "BF16": ("<u2", torch.bfloat16, 14),
    "I32": ("<i4", torch.int32, 15), "F32": ("<f4", torch.float32, 17), "F64": ("<f8", torch.float64, 19),
    "I64": ("<i8", torch.int64, 20),
}


def read_safetensors(path):
    """name -> torch tensor; metadata dict. Independent of ucp: json + numpy."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header_bytes = data[8:8 + n]
    if n % 8 != 0:
        problem(f"{path}: header length {n} not a multiple of 8")
    text = header_bytes.decode("utf-8")
    stripped = text.rstrip(" ")
    if len(text) - len(stripped) >= 8:
        problem(f"{path}: more than 7 padding spaces")
    def no_duplicates(pairs):
        if len({k for k, _ in pairs}) != len(pairs):
            problem(f"{path}: duplicate keys in the header")
        return dict(pairs)

    header = json.loads(text, object_pairs_hook=no_duplicates)
    keys = list(header)
    meta = header[keys[0]] if keys and keys[0] == "__metadata__" else None
    if meta is None or meta.get("format") != "pt":
        problem(f"{path}: __metadata__ with format 'pt' missing or not first: {keys[:1]}")
    if json.dumps(header, separators=(",", ":"), ensure_ascii=False) != stripped:
        # serde_json's compact form equals Python's with these separators when
        # every value is a str, int or list.
        problem(f"{path}: header is not in compact JSON form")
    entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
    want_order = sorted(entries, key=lambda e: (-ST_DTYPES[e[1]["dtype"]][2], e[0].encode()))
    if [e[0] for e in entries] != [e[0] for e in want_order]:
        problem(f"{path}: entries not in safetensors' data order")
    out = {}
    at = 0
    buf = data[8 + n:]
    for name, e in entries:
        if list(e.keys()) != ["dtype", "shape", "data_offsets"]:
            problem(f"{path}: {name}: fields {list(e.keys())}")
        b, end = e["data_offsets"]
        if b != at:
            problem(f"{path}: {name} starts at {b}, expected {at}")
        np_dtype, t_dtype, _ = ST_DTYPES[e["dtype"]]
        count = int(np.prod(e["shape"], dtype=np.int64)) if e["shape"] else 1
        if end - b != count * np.dtype(np_dtype).itemsize:
            problem(f"{path}: {name} extent {end - b} for shape {e['shape']}")
        arr = np.frombuffer(buf[b:end], dtype=np_dtype).copy().reshape(e["shape"])
        t = torch.from_numpy(arr)
        if t_dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[name] = t
        at = end
    if at != len(buf):
        problem(f"{path}: tensors cover {at} of {len(buf)} buffer bytes")
    return out, meta or {}


def load_export(folder, fmt):
    """Returns (ordered list of (name, tensor)), alias metadata."""
    base = "model.safetensors" if fmt == "safetensors" else "pytorch_model.bin"
    index_path = os.path.join(folder, base + ".index.json")
    if os.path.exists(index_path):
        raw = open(index_path, encoding="utf-8").read()
        index = json.loads(raw)
        if raw != json.dumps(index, indent=2, sort_keys=True) + "\n":
            problem(f"{index_path}: not json.dumps(indent=2, sort_keys=True) + newline")
        files = sorted(set(index["weight_map"].values()))
        n = len(files)
        stem, ext = base.rsplit(".", 1)
        want = [f"{stem}-{k + 1:05d}-of-{n:05d}.{ext}" for k in range(n)]
        if files != want:
            problem(f"{index_path}: shard files {files}, expected {want}")
    else:
        index = None
        files = [base]
    items, meta, seen = [], {}, {}
    global files_of
    files_of = {}
    for f in files:
        path = os.path.join(folder, f)
        if fmt == "safetensors":
            tensors, m = read_safetensors(path)
            meta.update({k: v for k, v in m.items() if k != "format"})
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
            if type(tensors) is not dict:
                problem(f"{path}: top-level {type(tensors).__name__}, expected dict")
        for k, v in tensors.items():
            if k in seen:
                problem(f"{k} in {seen[k]} and {f}")
            seen[k] = f
            items.append((k, v))
            files_of.setdefault(f, []).append(k)
            if index is not None and index["weight_map"].get(k) != f:
                problem(f"{k}: in {f}, index says {index['weight_map'].get(k)}")
    if index is not None:
        if set(index["weight_map"]) != set(seen):
            problem("index weight_map names differ from the files' names")
        storages, total = set(), 0
        for _, v in items:
            key = v.storage().data_ptr() if fmt == "torch" else id(v)
            if key not in storages:
                storages.add(key)
                total += v.numel() * v.element_size()
        if index["metadata"]["total_size"] != total:
            problem(f"index total_size {index['metadata']['total_size']}, tensors hold {total}")
    return items, meta


def natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def expected_universal(folder):
    out = {}
    for d in sorted(glob.glob(os.path.join(folder, "zero", "*", "fp32.pt"))):
        name = os.path.basename(os.path.dirname(d))
        v = torch.load(d, map_location="cpu")
        out[name] = v["param"] if isinstance(v, dict) else v
    return out


REPLICATED = re.compile(r"(.*\.)?((input_layernorm|post_attention_layernorm|norm)\.(scale|weight|bias)"
                        r"|attention\.dense\.bias|mlp\.dense_4h_to_h\.bias)$")
ROW = re.compile(r".*(attention\.dense|mlp\.dense_4h_to_h)\.weight$")


def expected_zero(folder):
    """fp32 masters of a ZeRO-1/2 folder, merged over tp (see the usage)."""
    mp_files = sorted(glob.glob(os.path.join(folder, "mp_rank_*_model_states.pt")), key=natural_key)
    slices = {}  # name -> [tp slices]
    for mp_path in mp_files:
        mp = int(re.search(r"mp_rank_(\d+)", mp_path).group(1))
        sd = torch.load(mp_path, map_location="cpu")
        optim = sorted(glob.glob(os.path.join(folder, f"*zero_pp_rank_*_mp_rank_{mp:02d}_optim_states.pt")),
                       key=natural_key)
        parts = [torch.load(p, map_location="cpu")["optimizer_state_dict"]["single_partition_of_fp32_groups"]
                 for p in optim]
        for g, shapes in enumerate(sd["param_shapes"]):
            flat = torch.cat([p[g].flatten() for p in parts])
            off = 0
            for name, shape in shapes.items():
                n = int(np.prod(list(shape), dtype=np.int64)) if len(shape) else 1
                slices.setdefault(name, []).append(flat[off:off + n].view(shape).clone())
                off += n
            if off != flat.numel():
                problem(f"{mp_path}: group {g} has {flat.numel()} elements, params take {off}")
    out = {}
    for name, s in slices.items():
        if len(s) == 1:
            out[name] = s[0]
        elif REPLICATED.match(name):
            for k in s[1:]:
                if not torch.equal(k, s[0]):
                    problem(f"{name}: tp copies differ")
            out[name] = s[0]
        elif ROW.match(name):
            out[name] = torch.cat(s, dim=1)
        else:
            out[name] = torch.cat(s, dim=0)
    return out


def same_bits(a, b):
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return a.contiguous().view(torch.uint8 if a.element_size() == 1 else
                               {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]).equal(
        b.contiguous().view(torch.uint8 if b.element_size() == 1 else
                            {2: torch.int16, 4: torch.int32, 8: torch.int64}[b.element_size()]))


def main(argv):
    folder, fmt, expected = argv[0], argv[1], argv[2]
    ordered = "--ordered" in argv
    tied = [a.split("=", 1) for i, a in enumerate(argv) if i > 0 and argv[i - 1] == "--tied"]
    kind, _, path = expected.partition(":")
    if kind == "universal":
        want = expected_universal(path)
    elif kind == "zero":
        want = expected_zero(path)
    elif kind == "pt":
        want = torch.load(path, map_location="cpu")
    else:
        raise SystemExit(f"unknown EXPECTED {expected}")
    items, meta = load_export(folder, fmt)
    got = dict(items)
    alias_names = {a for a, _ in tied}
    if fmt == "safetensors":
        for a, o in tied:
            if meta.get(a) != o:
                problem(f"__metadata__ does not map tied {a} -> {o}: {meta}")
        want_names = [k for k in want if k not in alias_names]
    else:
        want_names = list(want)
        for a, o in tied:
            if a in got and o in got and got[a].storage().data_ptr() != got[o].storage().data_ptr():
                problem(f"{a} and {o} do not share a storage")
    if set(got) != set(want_names):
        problem(f"names differ: missing {sorted(set(want_names) - set(got))[:8]}, "
                f"unexpected {sorted(set(got) - set(want_names))[:8]}")
    if ordered:
        # Within each file, the names follow EXPECTED's order (shards split it).
        for f, names in files_of.items():
            want_in_file = [k for k in want_names if k in set(names)]
            if names != want_in_file:
                problem(f"{f}: order {names[:6]} ... differs from {want_in_file[:6]} ...")
    for k in want_names:
        if k in got and not same_bits(got[k], want[k]):
            problem(f"{k}: {got[k].dtype} {tuple(got[k].shape)} differs from expected "
                    f"{want[k].dtype} {tuple(want[k].shape)}")
    for p in PROBLEMS[:40]:
        print(p)
    print(f"checked {len(want_names)} tensors of {folder}: {len(PROBLEMS)} problems")
    return 1 if PROBLEMS else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
