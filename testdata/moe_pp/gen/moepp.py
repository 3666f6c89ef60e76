# One rank: PipelineModule with native DeepSpeed MoE blocks, fp32 ZeRO-1 on CPU/gloo.
#   moepp.py --pp 2 --dp 1 --ep 1 --moe_blocks 1,2 --dir CKPT --mode save|load
# save: train 3 steps, snapshot params + fp32 partitions to CKPT/../snap, save_checkpoint(tag=global_step3)
# load: build (different seed), load_checkpoint(CKPT), compare with snapshot, train 1 step.
import argparse, os, sys, traceback
import torch, torch.nn as nn, torch.nn.functional as F
import faulthandler
if os.environ.get("MOEPP_HANG_DUMP"):  # dump every thread's stack and exit after N s (find hangs)
    faulthandler.dump_traceback_later(int(os.environ["MOEPP_HANG_DUMP"]), exit=True)

ap = argparse.ArgumentParser()
ap.add_argument("--pp", type=int, default=2)
ap.add_argument("--dp", type=int, default=1)
ap.add_argument("--ep", type=int, default=1)
ap.add_argument("--moe_blocks", default="1,2")
ap.add_argument("--blocks", type=int, default=4)
ap.add_argument("--experts", type=int, default=4)
ap.add_argument("--hidden", type=int, default=16)
ap.add_argument("--vocab", type=int, default=32)
ap.add_argument("--seq", type=int, default=8)
ap.add_argument("--dir", required=True)
ap.add_argument("--mode", choices=["save", "load"], default="save")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

import deepspeed
import deepspeed.comm as dist
from deepspeed.moe.layer import MoE
from deepspeed.pipe import PipelineModule, LayerSpec
from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

if hasattr(deepspeed.ops, "__compatible_ops__"):  # no ninja in the root (as realds/worker/zygote.py)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
H = args.hidden
MOE = [int(x) for x in args.moe_blocks.split(",") if x]


def log(*a):
    print(f"[rank {rank}]", *a, flush=True)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(args.vocab, H)

    def forward(self, ids):
        return self.emb(ids)


class Block(nn.Module):
    """A residual block whose MLP is dense or a native MoE; passes on the tensor only
    (MoE returns (out, l_aux, exp_counts): l_aux is dropped)."""

    def __init__(self, i):
        super().__init__()
        self.ln = nn.LayerNorm(H)
        self.is_moe = i in MOE
        if self.is_moe:
            expert = nn.Sequential(nn.Linear(H, 2 * H), nn.GELU(), nn.Linear(2 * H, H))
            self.mlp = MoE(H, expert, num_experts=args.experts, ep_size=args.ep, k=1, use_rts=False,
                           drop_tokens=False)
        else:
            self.mlp = nn.Sequential(nn.Linear(H, 2 * H), nn.GELU(), nn.Linear(2 * H, H))

    def forward(self, x):
        m = self.mlp(self.ln(x))
        if self.is_moe:
            m = m[0]
        return x + m


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(H, args.vocab)

    def forward(self, x):
        return self.out(x)


def loss_fn(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


seed = args.seed if args.mode == "save" else args.seed + 100  # load: start from different params
torch.manual_seed(seed)
specs = [LayerSpec(Embed)] + [LayerSpec(Block, i) for i in range(args.blocks)] + [LayerSpec(Head)]
topo = PipeDataParallelTopology(num_pp=args.pp, num_dp=args.dp)
model = PipelineModule(layers=specs, loss_fn=loss_fn, topology=topo, partition_method="type:Block")
log("stage", model.stage_id, "local layers", model._local_start, model._local_stop,
    "param names", [n for n, _ in model.named_parameters()][:3], "...")

groups = [{"name": "decay", "params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.01},
          {"name": "no_decay", "params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
groups = split_params_into_different_moe_groups_for_optimizer(groups)

gb = 4
cfg = {
    "train_batch_size": gb, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": gb // args.dp,
    "steps_per_print": 10 ** 9, "gradient_clipping": 1.0,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True, "adam_w_mode": True}},
    "zero_optimization": {"stage": 1, "overlap_comm": False, "contiguous_gradients": True,
                          "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8},
}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
# DeepSpeed 0.18.x's ZeRO step on gloo needs no_grad (as realds/worker/jobs.py)
_take = engine._take_model_step


def _take_nograd(*a, **k):
    with torch.no_grad():
        return _take(*a, **k)


engine._take_model_step = _take_nograd
_ce_save = engine.checkpoint_engine.save


def _logged_save(state_dict, path, *a, **k):  # record which rank writes which file
    log("WRITES", os.path.relpath(path, args.dir))
    return _ce_save(state_dict, path, *a, **k)


engine.checkpoint_engine.save = _logged_save
from deepspeed.utils import groups as G
for gn in G._get_expert_parallel_group_dict():
    log("expert group", gn, "ep ranks", list(getattr(G, "_EXPERT_PARALLEL_GROUP_RANKS", {}).get(gn, [])),
        "ep_rank", G._get_expert_parallel_rank(gn), "edp_rank", G._get_expert_data_parallel_rank(gn),
        "edp ranks", list(getattr(G, "_EXPERT_DATA_PARALLEL_GROUP_RANKS", {}).get(gn, [])))
log("mpu model_parallel_rank", engine.mpu.get_model_parallel_rank(), "dp rank", G._get_data_parallel_rank(),
    "has_moe_layers", engine.has_moe_layers, "num_experts", engine.num_experts)


def batch(step, i):
    g = torch.Generator().manual_seed(1000 * step + i)
    x = torch.randint(0, args.vocab, (1, args.seq), generator=g)
    return x, torch.roll(x, 1, dims=1)


def train_step(step):
    dpr = engine.grid.data_parallel_id
    gas = gb // args.dp
    data = [batch(step, m * args.dp + dpr) for m in range(gas)]
    loss = engine.train_batch(iter(data))
    log(f"step {engine.global_steps} loss {float(loss):.6f}")


def snapshot():
    params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    fp32 = [t.detach().clone() for t in engine.optimizer.single_partition_of_fp32_groups]
    return {"params": params, "fp32": fp32}


snapdir = os.path.join(os.path.dirname(os.path.abspath(args.dir)), os.path.basename(args.dir) + "_snap")
try:
    if args.mode == "save":
        for s in range(1, args.steps + 1):
            train_step(s)
        os.makedirs(snapdir, exist_ok=True)
        torch.save(snapshot(), f"{snapdir}/rank{rank}.pt")
        engine.save_checkpoint(args.dir, tag=f"global_step{engine.global_steps}")
        log("saved", args.dir)
    else:
        snap = torch.load(f"{snapdir}/rank{rank}.pt")
        before = snapshot()
        ndiff = sum(not torch.equal(before["params"][n], t) for n, t in snap["params"].items())
        log(f"before load: {ndiff}/{len(snap['params'])} params differ from the saved ones")
        path, cs = engine.load_checkpoint(args.dir)
        log("load_checkpoint returned", path, "client_state keys", sorted(cs) if cs else cs,
            "global_steps", engine.global_steps)
        after = snapshot()
        bad = [n for n, t in snap["params"].items() if not torch.equal(after["params"][n], t)]
        log(f"after load: params equal {len(snap['params']) - len(bad)}/{len(snap['params'])}; unequal: {bad}")
        badf = [i for i, t in enumerate(snap["fp32"]) if not torch.equal(after["fp32"][i], t)]
        log(f"after load: fp32 partitions equal {len(snap['fp32']) - len(badf)}/{len(snap['fp32'])}; unequal groups {badf}")
        train_step(engine.global_steps + 1)
        log("train step after load: OK")
except Exception:
    log("EXCEPTION\n" + traceback.format_exc())
    sys.stdout.flush()
    os._exit(3)
dist.barrier()
log("done")
os._exit(0)
