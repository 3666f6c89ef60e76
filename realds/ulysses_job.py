# Real DeepSpeed with Ulysses sequence parallelism on CPU (gloo), for
# realds/ulysses_test.sh (issue 25): a tiny causal LM whose attention is
# DeepSpeed's own DistributedAttention (deepspeed.sequence.layer, all-to-all over
# the sequence-parallel group of deepspeed.runtime.sequence_parallel.parallel_state_sp,
# the mpu ALST / Arctic training passes), ZeRO-1 or 2, fp32, ranks forked here.
#
#   ulysses_job.py save DIR SP STAGE     train 2 steps at world SP (dp 1, sp SP), save DIR/t, dump
#   ulysses_job.py load DIR WORLD SP STAGE [universal]   load DIR/t at world WORLD with sp SP (1: no sp)
#                                       (universal: DIR/t is a universal checkpoint, load_universal), dump
#   ulysses_job.py compare A.pt B.pt    every param's fp32 master, exp_avg, exp_avg_sq and lp bitwise
#
# Each rank of sp group r trains on the r-th chunk of every sample's sequence
# with the loss sum(CE) / seq so that the ZeRO average over dp x sp / sp gives
# the gradient of the whole sequence's mean loss. A dump (DIR/dump.pt, rank 0)
# holds each param's full fp32 master, exp_avg, exp_avg_sq (every rank's ZeRO
# fragments gathered) and lp weight, and the step.
import os
import sys

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

H, HEADS, V, S = 16, 2, 32, 8


class Attn(nn.Module):
    def __init__(self, spg):
        super().__init__()
        self.qkv = nn.Linear(H, 3 * H)
        self.proj = nn.Linear(H, H)
        self.spg = spg
        if spg is not None:
            from deepspeed.sequence.layer import DistributedAttention
            self.dist = DistributedAttention(self.core, spg, scatter_idx=2, gather_idx=1)

    @staticmethod
    def core(q, k, v, *args, **kwargs):  # [b, s, heads, d]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, H // HEADS).unbind(2)
        o = self.dist(q, k, v, 0) if self.spg is not None else self.core(q, k, v)
        return self.proj(o.reshape(b, s, H))


class Model(nn.Module):
    def __init__(self, spg):
        super().__init__()
        self.wte = nn.Embedding(V, H)
        self.wpe = nn.Embedding(S, H)
        self.ln = nn.LayerNorm(H)
        self.attn = Attn(spg)
        self.head = nn.Linear(H, V)

    def forward(self, x, pos):
        h = self.wte(x) + self.wpe(pos)
        return self.head(h + self.attn(self.ln(h)))


def engine(world, sp, stage, universal=False):
    import deepspeed
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no compiler in the roots
    deepspeed.init_distributed("gloo")
    mpu, spg, sp_rank = None, None, 0
    if sp > 1:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu
        mpu.initialize_sequence_parallel(sp)
        spg, sp_rank = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()
    torch.manual_seed(1)
    model = Model(spg)
    cfg = {"train_batch_size": world // sp, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True, "adam_w_mode": True}}}
    if sp > 1:
        cfg["sequence_parallel_size"] = sp
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg, mpu=mpu)
    return eng, sp_rank


def train(eng, sp, sp_rank, dp_rank, steps):
    c = S // sp
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + dp_rank)
        s = torch.randint(0, V, (1, S + 1), generator=g)
        x, y, pos = s[:, :-1], s[:, 1:], torch.arange(S)[None]
        cut = slice(sp_rank * c, (sp_rank + 1) * c)
        loss = F.cross_entropy(eng(x[:, cut], pos[:, cut]).reshape(-1, V), y[:, cut].reshape(-1), reduction="sum") / S
        eng.backward(loss)
        with torch.no_grad():
            eng.step()


def dump(eng, path):
    """Each param's full lp, fp32 master, exp_avg and exp_avg_sq: every rank's
    fragments (the flat partition and its optimizer states through the param's
    hp fragment address, as DeepSpeed's own accessors read them; they need a
    step after a load) gathered to rank 0 and placed by their lp offsets."""
    opt = eng.optimizer
    mine = []
    for name, p in eng.module.named_parameters():
        m = getattr(p, "_hp_mapping", None)
        if m is None:
            continue
        flat = opt.single_partition_of_fp32_groups[m.param_group_index]
        srcs = {"fp32": flat, **{k: opt.optimizer.state[flat][k] for k in ("exp_avg", "exp_avg_sq")}}
        hp, lp = m.hp_fragment_address, m.lp_fragment_address
        for k, src in srcs.items():
            mine.append((name, k, lp.start, src.narrow(0, hp.start, hp.numel).clone()))
    got = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(got, mine)
    if torch.distributed.get_rank() != 0:
        return
    out = {"global_steps": eng.global_steps}
    for name, p in eng.module.named_parameters():
        out[name] = {"lp": p.detach().clone()}
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            full = torch.full((p.numel(), ), float("nan"))
            for n, key, start, vals in [x for r in got for x in r]:
                if n == name and key == k:
                    full[start:start + vals.numel()] = vals
            if torch.isnan(full).any():
                raise SystemExit(f"{name} {k}: not every element is in some rank's fragment")
            out[name][k] = full.view(p.shape)
    torch.save(out, path)


def rank_main(r, world, argv):
    os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("ULYSSES_PORT", "29533"), LOCAL_SIZE="1", USE_LIBUV="0")
    mode, d = argv[0], argv[1]
    if mode == "save":
        sp, stage = int(argv[2]), int(argv[3])
        eng, sp_rank = engine(world, sp, stage)
        train(eng, sp, sp_rank, r // sp, 2)
        eng.save_checkpoint(d, tag="t")
    else:
        sp, stage = int(argv[3]), int(argv[4])
        eng, sp_rank = engine(world, sp, stage, universal=argv[5:] == ["universal"])
        path, _ = eng.load_checkpoint(d, tag="t")
        if path is None:
            raise SystemExit(f"nothing loaded from {d}")
    dump(eng, os.path.join(d, "dump.pt"))


def compare(a, b):
    x, y = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
    bad = []
    if x.pop("global_steps") != y.pop("global_steps"):
        bad.append("global_steps")
    if sorted(x) != sorted(y):
        bad.append(f"params {sorted(x)} vs {sorted(y)}")
    n = 0
    for name in sorted(set(x) & set(y)):
        for k in ("lp", "fp32", "exp_avg", "exp_avg_sq"):
            s, t = x[name][k], y[name][k]
            n += 1
            if s.dtype != t.dtype or s.shape != t.shape or not torch.equal(s.view(-1).view(torch.int32),
                                                                           t.view(-1).view(torch.int32)):
                bad.append(f"{name} {k}")
    print(f"compare {a} {b}: {n - len(bad)}/{n} bitwise" + (f"; differ: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    world = int(sys.argv[3])  # save: SP (dp 1); load: WORLD
    # DeepSpeed imported once, then the ranks forked: spawned ranks would each import torch and DeepSpeed
    # again (seconds per rank on two cores).
    import deepspeed  # noqa: F401
    mp.start_processes(rank_main, args=(world, sys.argv[1:]), nprocs=world, start_method="fork")
