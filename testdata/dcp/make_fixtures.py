"""Real PyTorch Distributed Checkpoints for ucp's DCP reader tests, saved by torch itself.

Run in the Debian unstable root (torch >= 2.6 with FSDP2 on CPU/gloo):

  tools/deepspeed_env.sh run --root=sid --bind=$PWD --cwd=$PWD -- python3 testdata/dcp/make_fixtures.py testdata/dcp

Each case trains a tiny model a few steps under `fully_shard` (FSDP2) with torch's AdamW on gloo,
then `dcp.save`s its state as get_model_state_dict / get_optimizer_state_dict give it, and writes
beside the folder `ref.pt`: rank 0's full state (full_state_dict=True), flattened with DCP's own
flatten_state_dict, so its keys are the DCP keys. A reader is right when it gives `ref.pt`'s values.

  mlp_w3     world 3, {"model", "optim"} (torch's nested param groups); uneven dim-0 shards
             (33 rows -> 11/11/11, 7 -> 3/3/1, the (2, 5) param -> 1/1/0: rank 2 holds nothing)
  titan_w2   world 2, torchtitan's layout: model entries at the top (no prefix), the optimizer
             flattened (flatten_optimizer_state_dict: param groups per param) under "optimizer",
             lr_scheduler / train_state entries beside
  tied_w2    world 2, tied embeddings (both names in the model state dict, one param), a frozen
             param (requires_grad False: in no group), two param groups (decay / no decay)
  weights_w2       world 2, weights only: dcp.save(get_model_state_dict(model)), the entries at the
                   top (torchtitan's weights-only export), no optimizer state
  weights_bf16_w3  world 3, weights only under "model." (dcp.save({"model": ...})), cast to bfloat16

  python3 testdata/dcp/make_fixtures.py OUT [CASE ...]   (default: every case)
"""
import os
import shutil
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 33)
        self.norm = nn.LayerNorm(33)
        self.fc2 = nn.Linear(33, 7)
        self.scale = nn.Parameter(torch.randn(2, 5))

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))) + self.scale.sum()


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(13, 6)
        self.proj = nn.Linear(6, 6)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(6, 13, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.frozen(torch.tanh(self.proj(self.embed(x)))))


CASES = {
    "mlp_w3": dict(world=3, model="mlp", layout="nested"),
    "titan_w2": dict(world=2, model="mlp", layout="torchtitan"),
    "tied_w2": dict(world=2, model="tied", layout="nested"),
    "weights_w2": dict(world=2, model="mlp", layout="weights"),
    "weights_bf16_w3": dict(world=3, model="mlp", layout="weights", dtype=torch.bfloat16),
}


def loss_of(kind, model, step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank + 7)
    if kind == "mlp":
        x, y = torch.randn(4, 10, generator=g), torch.randn(4, 7, generator=g)
        return torch.nn.functional.mse_loss(model(x), y)
    ids = torch.randint(0, 13, (3, 5), generator=g)
    return torch.nn.functional.cross_entropy(model(ids).reshape(-1, 13), ids.reshape(-1))


def run(rank, name, case, out, port):
    from datetime import timedelta
    store = dist.TCPStore("127.0.0.1", port, case["world"], rank == 0, use_libuv=False, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=case["world"])
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1234)
    model = Mlp() if case["model"] == "mlp" else Tied()
    fully_shard(model, mesh=init_device_mesh("cpu", (case["world"],)))
    if case["model"] == "tied":
        decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() > 1]
        other = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() <= 1]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                                lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(2):
        loss_of(case["model"], model, step, rank).backward()
        opt.step()
        opt.zero_grad()
    titan = case["layout"] == "torchtitan"
    opts = StateDictOptions(flatten_optimizer_state_dict=titan)
    msd, osd = get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)
    extra = {"lr_scheduler": {"lr_scheduler_0": {"last_epoch": 2, "base_lrs": [0.01]}}, "train_state": {"step": 2}}
    weights, dtype = case["layout"] == "weights", case.get("dtype")
    if weights and dtype is not None:
        msd = {k: v.to(dtype) for k, v in msd.items()}
    if weights:
        state = {"model": msd} if dtype is not None else msd
    else:
        state = dict(msd, optimizer=osd, **extra) if titan else {"model": msd, "optim": osd}
    folder = os.path.join(out, name)
    dcp.save(state, checkpoint_id=folder)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True, flatten_optimizer_state_dict=titan)
    fm, fo = get_model_state_dict(model, options=full), get_optimizer_state_dict(model, opt, options=full)
    if weights and dtype is not None:
        fm = {k: v.to(dtype) for k, v in fm.items()}
    if rank == 0:
        if weights:
            ref = {"model": fm} if dtype is not None else fm
        else:
            ref = dict(fm, optimizer=fo, **extra) if titan else {"model": fm, "optim": fo}
        flat, _ = flatten_state_dict(ref)
        flat = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in flat.items()}
        torch.save(flat, os.path.join(out, name + ".ref.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    only = sys.argv[2:]
    for name, case in CASES.items():
        if only and name not in only:
            continue
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(run, args=(name, case, out, port), nprocs=case["world"], join=True)
        print(name, sorted(os.listdir(os.path.join(out, name))), flush=True)
    print("torch", torch.__version__)


if __name__ == "__main__":
    main()
