"""Runs DeepSpeed's own zero_to_fp32.py (the copy a checkpoint ships) on Debian's
/usr/bin/python3 + python3-torch, where DeepSpeed, tqdm, huggingface_hub and
safetensors are not installed.

The script needs DeepSpeed only for a logger and the names of checkpoint keys
(deepspeed.checkpoint.constants), tqdm for progress bars, and, for its
sharded / safetensors output, huggingface_hub.split_torch_state_dict_into_shards
and safetensors.torch.save_file. This harness provides each as a stand-in:
the key names as DeepSpeed writes them into checkpoints (FORMAT.md), a
pass-through tqdm, and the two hub functions re-implemented here from their
documented behaviour (huggingface_hub serialization/_base.py and _torch.py:
greedy split in insertion order, storage-id aliasing, an oversized tensor in a
shard of its own, decimal size units; safetensors: header of compact JSON with
__metadata__ first, entries sorted by dtype descending then name, padded with
spaces to a multiple of 8).

usage:
  run_zero_to_fp32.py SCRIPT CHECKPOINT_ROOT OUTPUT_DIR [--safe] [--max_shard_size SIZE]
                      [--exclude_frozen_parameters] [--state_dict FILE]
  --state_dict FILE: also torch.save the dict get_fp32_state_dict_from_zero_checkpoint
  returns (keys in its order) to FILE.
"""
import importlib.util
import json
import logging
import os
import struct
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: F401,E402
import numpy.core.multiarray  # noqa: E402
import torch  # noqa: E402

sys.modules.setdefault("numpy._core", numpy.core)
sys.modules.setdefault("numpy._core.multiarray", numpy.core.multiarray)

# torch 1.13's load has no mmap= (torch >= 2.1): a loading strategy that does
# not change what is loaded, so it is dropped here.
_torch_load = torch.load


def _load(*args, mmap=None, **kwargs):
    return _torch_load(*args, **kwargs)


torch.load = _load


def _module(name, **attrs):
    m = sys.modules.get(name) or types.ModuleType(name)
    for k, v in attrs.items():
        setattr(m, k, v)
    sys.modules[name] = m
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(_module(parent), child, m)
    return m


# deepspeed.utils.logger and deepspeed.checkpoint.constants: the key names
# DeepSpeed writes into checkpoints.
_module("deepspeed.utils", logger=logging.getLogger("zero_to_fp32"))
_module("deepspeed.checkpoint.constants", DS_VERSION="ds_version", OPTIMIZER_STATE_DICT="optimizer_state_dict",
        SINGLE_PARTITION_OF_FP32_GROUPS="single_partition_of_fp32_groups", FP32_FLAT_GROUPS="fp32_flat_groups",
        ZERO_STAGE="zero_stage", PARTITION_COUNT="partition_count", PARAM_SHAPES="param_shapes",
        BUFFER_NAMES="buffer_names", FROZEN_PARAM_SHAPES="frozen_param_shapes",
        FROZEN_PARAM_FRAGMENTS="frozen_param_fragments", AUTOEP_LAYERS_KEY="ds_autoep_layers",
        AUTOEP_LAYERS_KEY_LEGACY="autoep_layers", AUTOEP_ZERO3_EXPERT_STATE_FORMAT_KEY="expert_state_format",
        AUTOEP_ZERO3_PARTITIONED_EXPERT_STATE_FORMAT="partitioned")
_module("tqdm", tqdm=lambda it, *a, **k: it)


def _storage(t):
    """untyped_storage() (torch >= 2.0), or 1.13's storage(): same data_ptr and nbytes."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def parse_size(size):
    if isinstance(size, int):
        return size
    s = size.strip()
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    if s[-2:].upper() not in units:
        raise ValueError(f"bad size {size}")
    return int(float(s[:-2].strip()) * units[s[-2:].upper()])


class StateDictSplit:
    def __init__(self, is_sharded, metadata, filename_to_tensors, tensor_to_filename):
        self.is_sharded = is_sharded
        self.metadata = metadata
        self.filename_to_tensors = filename_to_tensors
        self.tensor_to_filename = tensor_to_filename


def split_torch_state_dict_into_shards(state_dict, filename_pattern="model{suffix}.safetensors",
                                       max_shard_size="5GB"):
    max_size = parse_size(max_shard_size)
    shards, current, current_size, total = [], {}, 0, 0
    first_of_storage, followers = {}, {}
    for key, tensor in state_dict.items():
        if isinstance(tensor, str):
            continue
        st = _storage(tensor)
        sid = (tensor.device, st.data_ptr(), st.nbytes())
        if sid in first_of_storage:
            followers.setdefault(first_of_storage[sid], []).append(key)
            continue
        first_of_storage[sid] = key
        size = st.nbytes()
        if size > max_size:
            total += size
            shards.append({key: tensor})
            continue
        if current_size + size > max_size:
            shards.append(current)
            current, current_size = {}, 0
        current[key] = tensor
        current_size += size
        total += size
    if current:
        shards.append(current)
    for first, keys in followers.items():
        for shard in shards:
            if first in shard:
                for k in keys:
                    shard[k] = state_dict[k]
    n = len(shards)
    names = [filename_pattern.format(suffix="" if n == 1 else f"-{k + 1:05d}-of-{n:05d}") for k in range(n)]
    f2t = {names[k]: list(s.keys()) for k, s in enumerate(shards)}
    t2f = {t: f for f, ts in f2t.items() for t in ts}
    return StateDictSplit(n > 1, {"total_size": total}, f2t, t2f)


_module("huggingface_hub", split_torch_state_dict_into_shards=split_torch_state_dict_into_shards)

ST_NAMES = {torch.float64: ("F64", 19), torch.float32: ("F32", 17), torch.bfloat16: ("BF16", 14),
            torch.float16: ("F16", 13), torch.int64: ("I64", 20), torch.int32: ("I32", 15),
            torch.int16: ("I16", 11), torch.int8: ("I8", 5), torch.uint8: ("U8", 4), torch.bool: ("BOOL", 0)}


def save_file(tensors, path, metadata=None):
    items = sorted(tensors.items(), key=lambda kv: (-ST_NAMES[kv[1].dtype][1], kv[0].encode()))
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    ptrs = {}
    for name, t in items:
        key = (_storage(t).data_ptr(), t.storage_offset(), t.numel())
        if t.numel() and key in ptrs:
            raise RuntimeError(f"Some tensors share memory: {name} and {ptrs[key]}")
        ptrs[key] = name
        b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": ST_NAMES[t.dtype][0], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


_module("safetensors.torch", save_file=save_file)


def main(argv):
    script, root, out = argv[:3]
    safe = "--safe" in argv
    exclude = "--exclude_frozen_parameters" in argv
    size = argv[argv.index("--max_shard_size") + 1] if "--max_shard_size" in argv else "5GB"
    spec = importlib.util.spec_from_file_location("zero_to_fp32_under_test", script)
    z = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(z)
    z.convert_zero_checkpoint_to_fp32_state_dict(root, out, max_shard_size=size, safe_serialization=safe,
                                                 exclude_frozen_parameters=exclude)
    if "--state_dict" in argv:
        sd = z.get_fp32_state_dict_from_zero_checkpoint(root, exclude_frozen_parameters=exclude)
        torch.save(sd, argv[argv.index("--state_dict") + 1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
