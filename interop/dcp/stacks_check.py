"""A training state moved between stacks by ucp, resumed by the real clients (run in the Debian
unstable root: torch 2.14, transformers, DeepSpeed on PYTHONPATH; CPU, gloo).

The model is a tiny LlamaForCausalLM from a LlamaConfig (random init, vocabulary 131 so that every
shard is uneven), trained with torch's AdamW on per-(step, rank) batches; fp32 everywhere.

  python3 stacks_check.py fsdp2-save  --out DIR --world W
      FSDP2 (fully_shard per layer and the root) trains 2 steps and dcp.saves {"model", "optim"} as
      get_model_state_dict / get_optimizer_state_dict give them to DIR/dcp, and its weights alone
      (dcp.save(get_model_state_dict(m)), the entries at the top) to DIR/dcp_weights; DIR/ref.pt is its full
      state under the DCP keys; DIR/cont.json its continuation: per rank the loss of batch 2 (next)
      and, after one more step, of batch 3 (after).
  python3 stacks_check.py ds-save     --out DIR --world W --stage S
      DeepSpeed ZeRO-S (torch AdamW, the same hyper-parameters) trains 2 steps, save_checkpoint to
      DIR/ds; DIR/ref.pt its full state under the DCP keys (safe_get_full_*), DIR/cont.json likewise.
  python3 stacks_check.py plain-fresh  --world W --ref REF --out JSON
      One process, no parallelism: REF's weights, a fresh torch AdamW stepping on the mean of the W
      ranks' losses; the continuation of each rank's batches (the reference of a weights-only load).
  python3 stacks_check.py fsdp2-resume --ckpt DCP --world W --ref REF --out JSON [--weights_only]
  python3 stacks_check.py ds-resume    --ckpt DIR --world W --stage S --ref REF --out JSON [--universal]
                                       [--weights_only]
      A model of another seed (so that whatever the load misses shows) is built, sharded and given
      its optimizer; the checkpoint is loaded the client's own way (dcp.load + set_*_state_dict;
      engine.load_checkpoint, with checkpoint.load_universal for --universal); the full state is
      compared with REF bitwise (every model tensor, exp_avg, exp_avg_sq, step, lr/betas/eps/
      weight_decay); then the continuation losses are written to JSON. --weights_only: the weights
      alone are loaded (dcp.load of the model state dict; load_checkpoint(load_module_only=True)),
      the optimizer stays fresh, and only the weights are compared.
Every command prints one JSON line; a state difference is listed and makes it exit 1.
"""
import argparse
import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SEED = 1234
STEPS = 2
HP = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def build_model(seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, attn_implementation="eager")
    return LlamaForCausalLM(cfg).float()


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank + 7)
    return torch.randint(0, 131, (2, 16), generator=g)


def loss_of(model, step, rank):
    ids = batch(step, rank)
    return model(input_ids=ids, labels=ids).loss


def init(rank, world, port):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, use_libuv=False, timeout=timedelta(seconds=600))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


def fsdp2(world, seed):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    m = build_model(seed)
    mesh = init_device_mesh("cpu", (world,))
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, torch.optim.AdamW(m.parameters(), **HP)


def ds_engine(world, stage, seed, extra=None):
    import deepspeed
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": world,
           "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": dict(HP, betas=list(HP["betas"]), torch_adam=True)},
           "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0, "steps_per_print": 100000}
    cfg.update(extra or {})
    m = build_model(seed)
    engine, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
    return engine


def continuation(model, step_fn, rank):
    """The loss of batch STEPS with the current weights, then one step, then the loss of batch STEPS+1."""
    with torch.no_grad():
        nxt = loss_of(model, STEPS, rank).item()
    step_fn(loss_of(model, STEPS, rank))
    with torch.no_grad():
        after = loss_of(model, STEPS + 1, rank).item()
    return dict(next=nxt, after=after)


def fsdp2_full_state(m, opt):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    flat, _ = flatten_state_dict({"model": get_model_state_dict(m, options=o), "optim": get_optimizer_state_dict(m, opt, options=o)})
    return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in flat.items()}


def ds_full_state(engine, weights_only=False):
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    inner = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
    state = {}
    named = list(engine.module.named_parameters())
    for n, p in named:
        state[f"model.{n}"] = safe_get_full_fp32_param(p).detach().clone().cpu()
    if weights_only:  # a fresh optimizer: no state before its first step
        return state
    for n, p in named:
        for k in ("exp_avg", "exp_avg_sq"):
            state[f"optim.state.{n}.{k}"] = safe_get_full_optimizer_state(p, k).detach().clone().cpu()
    steps = [v["step"] for v in inner.state.values() if "step" in v]
    for n, _ in named:
        state[f"optim.state.{n}.step"] = steps[0].clone() if steps else None
    for k in ("lr", "betas", "eps", "weight_decay"):
        state[f"optim.param_groups.0.{k}"] = inner.param_groups[0][k]
    return state


def compare(state, ref, skip_masters=False):
    """The keys of ref's tensors and hyper-parameters a resume must restore, bitwise."""
    bad, n = [], 0
    for k, v in ref.items():
        if skip_masters and k.startswith("model."):
            continue
        if k.endswith(".params") or (k.startswith("optim.param_groups.") and k.rsplit(".", 1)[1] not in
                                     ("lr", "betas", "eps", "weight_decay")):
            continue
        n += 1
        got = state.get(k)
        if torch.is_tensor(v):
            ok = torch.is_tensor(got) and got.dtype == v.dtype and got.shape == v.shape and \
                torch.equal(got.view(-1).view(torch.uint8) if got.numel() else got,
                            v.view(-1).view(torch.uint8) if v.numel() else v)
        else:
            ok = tuple(got) == tuple(v) if isinstance(v, (list, tuple)) else got == v
        if not ok:
            bad.append(k)
    return n, bad


def run_fsdp2_save(rank, a, port):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    init(rank, a.world, port)
    m, opt = fsdp2(a.world, SEED)

    def step(loss):
        loss.backward()
        opt.step()
        opt.zero_grad()
    for s in range(STEPS):
        step(loss_of(m, s, rank))
    dcp.save({"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, opt)},
             checkpoint_id=os.path.join(a.out, "dcp"))
    dcp.save(get_model_state_dict(m), checkpoint_id=os.path.join(a.out, "dcp_weights"))
    ref = fsdp2_full_state(m, opt)
    cont = continuation(m, step, rank)
    finish(rank, a, cont, ref=ref)


def run_ds_save(rank, a, port):
    init(rank, a.world, port)
    engine = ds_engine(a.world, a.stage, SEED)

    def step(loss):
        engine.backward(loss)
        engine.step()
    for s in range(STEPS):
        step(loss_of(engine, s, rank))
    engine.save_checkpoint(os.path.join(a.out, "ds"))
    if rank == 0:  # the model's config.json beside the tags, as the Trainer's checkpoint-N holds it
        cfg = engine.module.config
        cfg.architectures = [type(engine.module).__name__]  # as save_pretrained sets it
        cfg.to_json_file(os.path.join(a.out, "ds", "config.json"))
    ref = ds_full_state(engine)
    cont = continuation(engine, step, rank)
    finish(rank, a, cont, ref=ref)


def run_fsdp2_resume(rank, a, port):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)
    init(rank, a.world, port)
    m, opt = fsdp2(a.world, SEED + 99)
    if a.weights_only:
        state = get_model_state_dict(m)
        dcp.load(state, checkpoint_id=a.ckpt)
        set_model_state_dict(m, state)
    else:
        state = {"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, opt)}
        dcp.load(state, checkpoint_id=a.ckpt)
        set_model_state_dict(m, state["model"])
        set_optimizer_state_dict(m, opt, state["optim"])
    got = fsdp2_full_state(m, opt)

    def step(loss):
        loss.backward()
        opt.step()
        opt.zero_grad()
    finish(rank, a, continuation(m, step, rank), got=got)


def run_ds_resume(rank, a, port):
    init(rank, a.world, port)
    extra = {"checkpoint": {"load_universal": True}} if a.universal else None
    engine = ds_engine(a.world, a.stage, SEED + 99, extra)
    path, _ = engine.load_checkpoint(a.ckpt, load_module_only=a.weights_only)
    if path is None:
        raise SystemExit(f"DeepSpeed loaded nothing from {a.ckpt}")
    # ZeRO-1/2 map each param to its optimizer-state fragment in its first
    # step (_lazy_init_hp_params_optimizer_state); after a load the state
    # exists already: map it now, as that step would, so that
    # safe_get_full_optimizer_state reads it.
    if hasattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state") and not a.weights_only:
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    got = ds_full_state(engine, a.weights_only)

    def step(loss):
        engine.backward(loss)
        engine.step()
    finish(rank, a, continuation(engine, step, rank), got=got)


def run_plain_fresh(a):
    """One process, no parallelism: REF's weights, a fresh torch AdamW stepping on the mean of the
    W ranks' losses (what data parallelism averages), the continuation of every rank's batches."""
    ref = torch.load(a.ref, weights_only=False)
    m = build_model(SEED + 99)
    m.load_state_dict({k[len("model."):]: v for k, v in ref.items() if k.startswith("model.")}, strict=True)
    opt = torch.optim.AdamW(m.parameters(), **HP)
    with torch.no_grad():
        nxt = [loss_of(m, STEPS, r).item() for r in range(a.world)]
    (sum(loss_of(m, STEPS, r) for r in range(a.world)) / a.world).backward()
    opt.step()
    with torch.no_grad():
        after = [loss_of(m, STEPS + 1, r).item() for r in range(a.world)]
    out = dict(cmd=a.cmd, world=a.world, next=nxt, after=after)
    with open(a.out, "w") as f:
        json.dump(out, f)
    print(json.dumps(out), flush=True)


def finish(rank, a, cont, ref=None, got=None):
    gathered = [None] * a.world
    dist.all_gather_object(gathered, cont)
    if rank == 0:
        out = dict(cmd=a.cmd, world=a.world, next=[g["next"] for g in gathered], after=[g["after"] for g in gathered])
        if ref is not None:
            os.makedirs(a.out, exist_ok=True)
            torch.save(ref, os.path.join(a.out, "ref.pt"))
            with open(os.path.join(a.out, "cont.json"), "w") as f:
                json.dump(out, f)
        if got is not None:
            # Right after load_universal, DeepSpeed 0.19.5's safe_get_full_fp32_param returns values
            # that are not the masters, for a universal folder of DeepSpeed's own checkpoint as well
            # (measured): there the masters are proven by the losses (the one after a step equal).
            ref = torch.load(a.ref, weights_only=False)
            if getattr(a, "weights_only", False):
                ref = {k: v for k, v in ref.items() if k.startswith("model.")}
            n, bad = compare(got, ref, skip_masters=getattr(a, "universal", False))
            out.update(compared=n, differ=bad)
            with open(a.out, "w") as f:
                json.dump(out, f)
        print(json.dumps(out), flush=True)
        if got is not None and (bad or n == 0):
            sys.stdout.flush()
            os._exit(1)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["fsdp2-save", "ds-save", "fsdp2-resume", "ds-resume", "plain-fresh"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--ref", default="")
    ap.add_argument("--universal", action="store_true")
    ap.add_argument("--weights_only", action="store_true")
    a = ap.parse_args()
    if a.cmd == "plain-fresh":
        return run_plain_fresh(a)
    fn = {"fsdp2-save": run_fsdp2_save, "ds-save": run_ds_save, "fsdp2-resume": run_fsdp2_resume,
          "ds-resume": run_ds_resume}[a.cmd]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    # Imported once, then the ranks forked: spawned ranks would each import torch, DeepSpeed and transformers
    # again (seconds per rank on two cores).
    import deepspeed  # noqa: F401
    import transformers  # noqa: F401
    mp.start_processes(fn, args=(a, port), nprocs=a.world, join=True, start_method="fork")


if __name__ == "__main__":
    main()
