"""Loads a DCP folder written by `ucp convert --to=dcp` with torch's own
torch.distributed.checkpoint at a world size, and compares every entry with
the same checkpoint's universal folder (written by `ucp convert`, whose
tensors DeepSpeed's own loader reads bitwise: realds/), bitwise.

usage: dcp_load_check.py DCP_DIR UNIVERSAL_DIR WORLD[,WORLD...]
  Each world size in turn, in one interpreter (one import of torch): the forked
  ones first, world 1 last (OpenMP's threads, once started, do not survive a fork).
  WORLD 1: dcp.load into plain tensors, no process group.
  WORLD > 1: WORLD processes (gloo, FileStore), every tensor entry of two or
  more dims or of more than WORLD elements loaded as a DTensor sharded on dim
  0 over the WORLD ranks (as FSDP2 holds it), then gathered (full_tensor) and
  compared on every rank.
Prints one line per world size and exits 1 on any difference.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata


PARAMS = object()


def universal_tensor(udir, name, state):
    path = os.path.join(udir, "zero", name, state + ".pt")
    if not os.path.exists(path):
        path = os.path.join(udir, "module", name + ".pt")  # frozen params and buffers
    obj = torch.load(path, weights_only=False)
    t = obj["param"] if isinstance(obj, dict) else obj
    return t


def expected(udir, key, md):
    """The universal folder's value of DCP key `key`."""
    if key.startswith("model."):
        name = key[len("model."):]
        return universal_tensor(udir, name, "fp32").reshape(md.size)
    if key.startswith("optim.state."):
        rest = key[len("optim.state."):]
        name, state = rest.rsplit(".", 1)
        if state == "step":
            path = os.path.join(udir, "zero", name, "step.pt")
            if os.path.exists(path):
                s = torch.load(path, weights_only=False)
            else:  # a ZeRO-3 universal folder: per sub-group steps in optimizer_state.pt, all equal
                osd = torch.load(os.path.join(udir, "zero", "optimizer_state.pt"), weights_only=False)
                steps = {float(v["step"]) for v in osd["optimizer_state_dict"]["state"].values()}
                assert len(steps) == 1, steps
                s = steps.pop()
            return torch.tensor(float(s), dtype=torch.float32)
        return universal_tensor(udir, name, state).reshape(md.size)
    if key.startswith("optim.param_groups."):
        g, hp = key[len("optim.param_groups."):].split(".", 1)
        osd = torch.load(os.path.join(udir, "zero", "optimizer_state.pt"), weights_only=False)
        groups = osd["optimizer_state_dict"]["param_groups"] if "optimizer_state_dict" in osd else osd["param_groups"]
        if hp == "params":
            return PARAMS  # names: checked against the model entries
        return groups[int(g)][hp]
    raise SystemExit("unexpected key " + key)


def bitwise_equal(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.numel() == 0 or torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                         b.contiguous().reshape(-1).view(torch.uint8))


def build_state(meta, world, rank, mesh):
    state = {}
    for key, md in meta.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            full = torch.zeros(md.size, dtype=md.properties.dtype)
            if mesh is not None and len(md.size) > 0 and md.size[0] >= world:
                from torch.distributed.tensor import Shard, distribute_tensor
                state[key] = distribute_tensor(full, mesh, [Shard(0)])
            else:
                state[key] = full
        else:
            state[key] = None
    return state


def check(dcp_dir, udir, world, rank, mesh):
    meta = dcp.FileSystemReader(dcp_dir).read_metadata()
    state = build_state(meta, world, rank, mesh)
    dcp.load(state, checkpoint_id=dcp_dir, no_dist=(mesh is None))
    bad = []
    names = {k[len("model."):] for k in meta.state_dict_metadata if k.startswith("model.")}
    for key, md in meta.state_dict_metadata.items():
        got = state[key]
        if hasattr(got, "full_tensor"):
            got = got.full_tensor()
        want = expected(udir, key, md)
        if isinstance(md, TensorStorageMetadata):
            if not bitwise_equal(got, want):
                bad.append(key)
        elif want is PARAMS:  # a group's param names: names of model entries, each once
            if not isinstance(got, list) or len(set(got)) != len(got) or not set(got) <= names:
                bad.append("%s: %r" % (key, got))
        elif got != want:
            bad.append("%s: %r != %r" % (key, got, want))
    return len(meta.state_dict_metadata), bad


def worker(rank, world, store_path, dcp_dir, udir, out):
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    n, bad = check(dcp_dir, udir, world, rank, mesh)
    with open("%s.%d" % (out, rank), "w") as f:
        f.write("%d\n%s" % (n, "\n".join(bad)))
    dist.destroy_process_group()


def check_world(dcp_dir, udir, world):
    if world == 1:
        n, bad = check(dcp_dir, udir, 1, 0, None)
        results = [(n, bad)]
    else:
        import torch.multiprocessing as mp
        tmp = tempfile.mkdtemp()
        out = os.path.join(tmp, "result")
        mp.start_processes(worker, args=(world, os.path.join(tmp, "store"), dcp_dir, udir, out), nprocs=world,
                           start_method="fork")
        results = []
        for r in range(world):
            lines = open("%s.%d" % (out, r)).read().split("\n")
            results.append((int(lines[0]), [l for l in lines[1:] if l]))
    ok = all(not bad for _, bad in results)
    print("world %d: %d entries, %s" % (world, results[0][0],
                                       "all bitwise equal" if ok else "DIFFER: " + "; ".join(sum((b for _, b in results), []))),
          flush=True)
    return ok


def main(argv):
    dcp_dir, udir = argv[1], argv[2]
    worlds = sorted((int(w) for w in argv[3].split(",")), key=lambda w: (w == 1, w))
    ok = True
    for world in worlds:
        ok = check_world(dcp_dir, udir, world) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
