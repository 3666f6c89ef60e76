#!/usr/bin/env python3
"""Prints the tensor payload of checkpoint folders or files (summed over the
arguments): `PAYLOAD FILES FRAMES`.

PAYLOAD is the bytes of tensor data (the storage records of every torch zip
file, the data region of every safetensors file), FILES the number of files,
FRAMES every other byte (zip and pickle frames, safetensors headers, text
files). run_bench.sh checks with it that an output holds no more tensor bytes
than its input: a universal checkpoint writes one file per param and state,
so its frames grow with the number of params while its tensors do not.

A universal folder's zero/optimizer_state.pt is left out of PAYLOAD (counted
in FRAMES): of a ZeRO-3 source it is rank 0's optimizer_state_dict whole, its
flat partitions included, as DeepSpeed's ds_to_universal.py
(_save_optimizer_state_stage3) writes it: a copy the format asks for.
"""
import json
import os
import struct
import sys
import zipfile


def payload(path):
    if path.endswith(".safetensors"):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return sum(i.file_size for i in z.infolist() if "/data/" in i.filename)
    return 0


def main():
    total = files = tensors = 0
    for path in sys.argv[1:]:
        if os.path.isfile(path):
            walked = [(os.path.dirname(path), [], [os.path.basename(path)])]
        else:
            walked = os.walk(path)
        for d, _, names in walked:
            for name in names:
                p = os.path.join(d, name)
                files += 1
                total += os.path.getsize(p)
                if not (name == "optimizer_state.pt" and os.path.basename(d) == "zero"):
                    tensors += payload(p)
    print(tensors, files, total - tensors)


if __name__ == "__main__":
    main()
