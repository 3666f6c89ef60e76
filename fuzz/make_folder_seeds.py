"""Writes the seed corpus of fuzz/folder_fuzzer.cc into fuzz/seeds/folder/.

usage: python3 fuzz/make_folder_seeds.py [FIXTURES]   (default ../shared/fixtures/deepspeed-0.14.4)

Each fixture (in the harness's order) unchanged, and, for its mp_rank_00,
first optimizer and first layer files, an edit that puts the file's own
data.pkl back (kind 0), so that libFuzzer mutates real DeepSpeed pickles;
plus a `latest` edit and a swap of two optimizer files.
"""
import os
import struct
import sys
import zipfile

FIXTURES = ["neox-tp2-pp1-dp2", "neox-tp1-pp2-dp1", "gpt-zero2-nopipe-tp2-dp2", "neox-bf16-tp2-pp1-dp2"]


def edit(kind, file_index, payload):
    return bytes([kind, file_index]) + struct.pack("<H", len(payload)) + payload


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "../shared/fixtures/deepspeed-0.14.4"
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "folder")
    os.makedirs(out, exist_ok=True)
    for i, fx in enumerate(FIXTURES):
        tag = os.path.join(root, fx, "global_step4")
        names = sorted(os.listdir(tag))
        seeds = {"plain": bytes([i])}
        picks = [n for n in names if n.startswith("mp_rank_00")][:1]
        picks += [n for n in names if "optim_states" in n][:1]
        picks += [n for n in names if n.startswith("layer_")][:1]
        for n in picks:
            with zipfile.ZipFile(os.path.join(tag, n)) as z:
                pkl = [z.read(r) for r in z.namelist() if r.endswith("/data.pkl")][0]
            if len(pkl) > 60000:
                continue
            seeds["pkl_" + n.split(".")[0]] = bytes([i]) + edit(0, names.index(n), pkl)
        seeds["latest"] = bytes([i]) + edit(4, 0, b"global_step4\n")
        optim = [k for k, n in enumerate(names) if "optim_states" in n]
        if len(optim) >= 2:
            seeds["swap"] = bytes([i]) + edit(5, optim[0], bytes([optim[1]]))
        for k, v in seeds.items():
            with open(os.path.join(out, "%s_%s" % (fx, k)), "wb") as f:
                f.write(v)


if __name__ == "__main__":
    main()
