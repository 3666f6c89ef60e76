# One DeepSpeed 0.14.4 run of the savanna-shaped model (lab/savanna_model.py).
# Runs inside the chroot under torch.distributed.run (gloo, CPU). See lab/README.md.
#
#   --mode train   build at the topology given, train --steps steps, save
#                  global_step<steps> with savanna's client state, dump every rank's
#                  tensors (lp, fp32, exp_avg, exp_avg_sq, buffers, step), then
#                  continue --cont steps recording per-sample losses.
#   --mode load    build, load_checkpoint(--load_dir, --tag) with
#                  checkpoint.load_universal, dump tensors, save a plain checkpoint
#                  (DeepSpeed's own) to --save_dir, continue --cont steps.
#   --mode resume  build, load the plain checkpoint (--load_dir, --tag), continue.
import argparse
import json
import os
import random

import numpy as np
import torch
import torch.distributed as dist

import deepspeed
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

import savanna_model as sm

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True, choices=["train", "load", "resume"])
ap.add_argument("--tp", type=int, default=1)
ap.add_argument("--pp", type=int, default=1)
ap.add_argument("--plain", action="store_true", help="pp=1 run named like savanna's to_sequential()")
ap.add_argument("--bf16", action="store_true")
ap.add_argument("--zero", type=int, default=1)
ap.add_argument("--hidden", type=int, default=64)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--vocab", type=int, default=256)
ap.add_argument("--seq", type=int, default=16)
ap.add_argument("--groups", type=int, default=8, help="num_groups_hyena")
ap.add_argument("--groups_mr", type=int, default=8, help="num_groups_hyena_medium")
ap.add_argument("--groups_se", type=int, default=8, help="num_groups_hyena_short")
ap.add_argument("--order", type=int, default=8, help="hyena_filter_order")
ap.add_argument("--operators", default="hyena_se,hyena_mr,hyena,flash")
ap.add_argument("--untied", action="store_true")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--global_batch", type=int, default=4)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--cont", type=int, default=2)
ap.add_argument("--save_dir")
ap.add_argument("--load_dir")
ap.add_argument("--tag")
ap.add_argument("--dump")
ap.add_argument("--losses")
ap.add_argument("--plain_load", action="store_true",
                help="--mode load of a plain checkpoint (one ucp reshard wrote) instead of a universal one")
ap.add_argument("--local_rank", type=int, default=0)
a = ap.parse_args()

# torch.distributed's agent-store client ignores USE_LIBUV (Debian's torch has no
# libuv): connect to the launcher's store ourselves.
_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                       use_libuv=False)
dist.init_process_group("gloo", store=dist.PrefixStore("savanna_lab", _store),
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
# DeepSpeed's CPU shm collective op needs a JIT build (ninja, absent in the chroot);
# marking it not compatible makes TorchBackend use the plain torch.distributed collectives
# (its own fallback; no DeepSpeed code changed).
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo")  # adopts the process group above
torch.manual_seed(0)
assert not (a.plain and a.pp > 1)
sm.MPU = mpu = sm.Mpu(a.tp, a.pp)
cfg = dict(seed=a.seed, hidden=a.hidden, heads=a.heads, vocab=a.vocab, seq=a.seq, groups=a.groups,
           groups_mr=a.groups_mr, groups_se=a.groups_se, order=a.order, hyena_se_len=7, short_conv_L=3,
           multiple_of=64, operators=a.operators.split(","), tied=not a.untied)
gas = a.global_batch // mpu.dp
ds_config = {
    "train_batch_size": a.global_batch,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": gas,
    "zero_optimization": {"stage": a.zero},
    "bf16": {"enabled": a.bf16},
    "gradient_clipping": 1.0,
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
    "checkpoint": {"load_universal": a.mode == "load" and not a.plain_load},
}

if a.plain:
    model = sm.SequentialModel(cfg)
    engine_mpu = mpu
else:
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    model = PipelineModule(layers=sm.build_specs(cfg), loss_fn=sm.loss_fn,
                           topology=PipeModelDataParallelTopology(num_pp=a.pp, num_mp=a.tp, num_dp=mpu.dp),
                           partition_method="type:ParallelBlockPipe")
    engine_mpu = None
opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config, mpu=engine_mpu)


def sample(step, idx):
    g = torch.Generator().manual_seed(a.seed * 7919 + step * 1000 + idx)
    s = torch.randint(0, a.vocab, (1, a.seq + 1), generator=g)
    return s[:, :-1], s[:, 1:]


records = []
is_last = (mpu.pp_rank == a.pp - 1) and mpu.tp_rank == 0


def train_step(step):
    idxs = [m * mpu.dp + mpu.dp_rank for m in range(gas)]
    if a.plain:
        for i in idxs:
            ids, labels = sample(step, i)
            loss = sm.loss_fn(engine(ids), labels)
            if is_last:
                records.append(dict(step=step, sample=i, loss=loss.item().hex()))
            engine.backward(loss)
            engine.step()
    else:
        seen = iter(idxs)
        orig = engine.module.loss_fn

        def rec_loss(logits, labels):
            loss = orig(logits, labels)
            if is_last:
                records.append(dict(step=step, sample=next(seen), loss=loss.item().hex()))
            return loss

        engine.module.loss_fn = rec_loss
        engine.train_batch(iter([sample(step, i) for i in idxs]))
        engine.module.loss_fn = orig


def master_from_flat_partition(p, key=None):
    """The fp32 master of p read from the ZeRO optimizer's flat fp32 partition (the tensor
    the optimizer steps), through p's fragment addresses, gathered over dp like
    get_full_hp_param. DeepSpeed 0.14.4's universal load leaves p._hp_mapping.hp_fragment
    pointing into an optimizer-state buffer (map_to_flat_opt_states), so after that load
    safe_get_full_fp32_param returns an optimizer state, not the master (lab/README.md)."""
    buf = torch.zeros(p.numel(), dtype=torch.float32)
    m = p._hp_mapping
    if m is not None:
        flat = engine.optimizer.single_partition_of_fp32_groups[m.param_group_index]
        if key is not None:
            flat = engine.optimizer.optimizer.state[flat][key]
        buf.narrow(0, m.lp_fragment_address.start, m.lp_fragment_address.numel).copy_(
            flat.narrow(0, m.hp_fragment_address.start, m.hp_fragment_address.numel))
    dist.all_reduce(buf, group=p._dp_group)
    return buf.reshape(p.shape)


def dump(path):
    out = {"params": {}, "buffers": {}, "meta": {}}
    meta_extra = out["meta"]
    for name, p in engine.module.named_parameters():
        e = {"lp": p.detach().clone()}
        e["fp32"] = safe_get_full_fp32_param(p)
        for key in ("exp_avg", "exp_avg_sq"):
            if p._hp_mapping is not None and p._hp_mapping.optim_fragment is None:
                # right after a PLAIN load (before any step) DeepSpeed 0.14.4 has not linked the
                # optimizer-state fragments yet and safe_get_full_optimizer_state raises
                # TypeError; read the flat state instead (used only by the reshard experiment).
                e[key] = master_from_flat_partition(p, key)
                out["meta"]["optim_state_from_flat"] = True
            else:
                e[key] = safe_get_full_optimizer_state(p, key)
        e["fp32_master"] = master_from_flat_partition(p)
        out["params"][name] = e
    for name, b in engine.module.named_buffers():
        out["buffers"][name] = b.detach().clone()
    inner = engine.optimizer.optimizer
    steps = []
    for g in inner.param_groups:
        for p in g["params"]:
            s = inner.state[p].get("step")
            steps.append(s.item() if torch.is_tensor(s) else s)
    out["meta"] = dict(meta_extra, steps=steps, global_steps=engine.global_steps, tp=a.tp, pp=a.pp, dp=mpu.dp,
                       tp_rank=mpu.tp_rank, pp_rank=mpu.pp_rank)
    if mpu.dp_rank == 0:
        torch.save(out, os.path.join(path, f"pp{mpu.pp_rank}_tp{mpu.tp_rank}.pt"))


def client_state(iteration):
    # what savanna's checkpointing.save_ds_checkpoint passes as client_state
    return {
        "iteration": iteration,
        "args": {
            "num_layers": len(cfg["operators"]),
            "hidden_size": a.hidden,
            "num_attention_heads": a.heads,
            "max_position_embeddings": a.seq,
            "make_vocab_size_divisible_by": 8,
            "padded_vocab_size": a.vocab,
            "tokenizer_type": "CharLevelTokenizer",
            "model_parallel_size": a.tp,
        },
        "data_loading": {"train_data_token_index": None, "train_val_test_num_samples": [a.global_batch * 100, 0, 0]},
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
    }


if a.dump:
    os.makedirs(a.dump, exist_ok=True)
start = 0
if a.mode == "train":
    for s in range(a.steps):
        train_step(s)
    start = a.steps
    engine.save_checkpoint(a.save_dir, tag=f"global_step{a.steps}", client_state=client_state(a.steps))
    records.append(dict(marker="saved"))
    dump(a.dump)
else:
    path, cs = engine.load_checkpoint(a.load_dir, tag=a.tag)
    assert path is not None, f"nothing loaded from {a.load_dir} {a.tag}"
    start = cs["iteration"]
    if a.dump:
        dump(a.dump)
    if a.mode == "load":
        engine.save_checkpoint(a.save_dir, tag=f"global_step{start}", client_state=client_state(start))
for s in range(start, start + a.cont):
    train_step(s)
if is_last and a.losses:
    with open(f"{a.losses}.rank{dist.get_rank()}", "w") as f:
        json.dump(records, f)
dist.barrier()
