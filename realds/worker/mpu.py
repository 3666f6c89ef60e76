# Megatron-style tensor parallelism for the real-DeepSpeed test models (runs in
# a Debian root, see realds/README.md): process groups laid out as DeepSpeed's
# PipeModelDataParallelTopology lays out ranks (axes pipe, data, model; model
# fastest), and the parallel layers GPT-NeoX and savanna build on (column- and
# row-parallel linears, vocab-parallel embedding, logits gathered over tp).
#
# Every tp rank computes with its own slice only, and row-parallel outputs and
# the embedding are all-reduced over the tp group, so a slice merged or split
# the wrong way changes the loss. Each parallel param records how it splits
# (`partition_dim`: 0 or 1; replicated params have none): the dumps carry it,
# and the oracle checks its family's split table against it.
#
#   mpu.setup(tp, pp)                 # once per job, after init_process_group
#   lin = mpu.ColumnParallelLinear(gen, 64, 192, bias=True)
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Mpu:
    """The tp / dp groups of one job, and the interface DeepSpeed's engine asks
    a plain (non-pipeline) module's `mpu` for."""

    def __init__(self, tp, pp):
        world = dist.get_world_size()
        rank = dist.get_rank()
        if world % (tp * pp):
            raise ValueError(f"world size {world} is not a multiple of tp {tp} x pp {pp}")
        self.tp, self.pp, self.dp = tp, pp, world // (tp * pp)
        self.rank = rank
        self.pp_rank = rank // (self.dp * tp)
        self.dp_rank = (rank // tp) % self.dp
        self.tp_rank = rank % tp
        self.tp_group = self.dp_group = None
        # every rank creates every group, in the same order (new_group is collective)
        for p in range(pp):
            for d in range(self.dp):
                ranks = [p * self.dp * tp + d * tp + m for m in range(tp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    self.tp_group = g
        for p in range(pp):
            for m in range(tp):
                ranks = [p * self.dp * tp + d * tp + m for d in range(self.dp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    self.dp_group = g

    def get_model_parallel_rank(self):
        return self.tp_rank

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_group(self):
        return self.tp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group
    get_slice_parallel_rank = get_model_parallel_rank
    get_slice_parallel_world_size = get_model_parallel_world_size
    get_slice_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self):
        return self.dp_rank

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_group(self):
        return self.dp_group


MPU = None


def setup(tp, pp):
    global MPU
    MPU = Mpu(tp, pp)
    return MPU


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        if MPU.tp > 1:
            g = g.contiguous()
            dist.all_reduce(g, group=MPU.tp_group)
        return g


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if MPU.tp > 1:
            x = x.contiguous()
            dist.all_reduce(x, group=MPU.tp_group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if MPU.tp == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(MPU.tp)]
        dist.all_gather(parts, x, group=MPU.tp_group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, g):
        if MPU.tp == 1:
            return g
        return g.chunk(MPU.tp, dim=-1)[MPU.tp_rank].contiguous()


copy_to_tp = _CopyToTP.apply
reduce_from_tp = _ReduceFromTP.apply
gather_from_tp = _GatherFromTP.apply


def mark_split(p, dim):
    """A tp-split param: DeepSpeed counts it once per tp rank in the gradient
    norm (`model_parallel`), and the dumps record its split dim."""
    p.model_parallel = True
    p.tensor_model_parallel = True
    p.partition_dim = dim
    return p


def my_slice(full, dim):
    """This tp rank's slice of a tensor initialised whole (so that the model is
    the same function at any tp)."""
    return full.chunk(MPU.tp, dim)[MPU.tp_rank].clone()


def randn(gen, shape, std):
    return torch.randn(shape, generator=gen) * std


class ColumnParallelLinear(nn.Module):
    """[out, in] split on dim 0 (and its bias); output stays split."""

    def __init__(self, gen, inp, out, bias=False, std=0.02):
        super().__init__()
        if out % MPU.tp:
            raise ValueError(f"ColumnParallelLinear: {out} outputs do not split over tp {MPU.tp}")
        self.weight = mark_split(nn.Parameter(my_slice(randn(gen, (out, inp), std), 0)), 0)
        self.bias = mark_split(nn.Parameter(my_slice(randn(gen, (out,), std), 0)), 0) if bias else None

    def forward(self, x):
        return F.linear(copy_to_tp(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """[out, in] split on dim 1; the partial outputs are all-reduced and the
    whole bias (replicated) is added after."""

    def __init__(self, gen, inp, out, bias=True, std=0.02):
        super().__init__()
        if inp % MPU.tp:
            raise ValueError(f"RowParallelLinear: {inp} inputs do not split over tp {MPU.tp}")
        self.weight = mark_split(nn.Parameter(my_slice(randn(gen, (out, inp), std), 1)), 1)
        self.bias = nn.Parameter(randn(gen, (out,), std)) if bias else None

    def forward(self, x):
        y = reduce_from_tp(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """[vocab, hidden] split on dim 0; tokens outside this rank's rows give 0,
    and the ranks' lookups are all-reduced."""

    def __init__(self, gen, vocab, hidden, std=0.02):
        super().__init__()
        if vocab % MPU.tp:
            raise ValueError(f"VocabParallelEmbedding: vocab {vocab} does not split over tp {MPU.tp}")
        self.per = vocab // MPU.tp
        self.start = MPU.tp_rank * self.per
        self.weight = mark_split(nn.Parameter(my_slice(randn(gen, (vocab, hidden), std), 0)), 0)

    def forward(self, ids):
        local = ids - self.start
        mask = (local < 0) | (local >= self.per)
        e = F.embedding(local.masked_fill(mask, 0), self.weight)
        return reduce_from_tp(e.masked_fill(mask[..., None], 0.0))


class RMSNorm(nn.Module):
    """GPT-NeoX's / savanna's RMSNorm: the weight is named `scale`, replicated."""

    def __init__(self, gen, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(1.0 + randn(gen, (dim,), 0.1))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.scale.float() * y).to(x.dtype)


def parallel_logits(x, weight):
    """Logits of a vocab-split output weight, gathered whole on every tp rank."""
    return gather_from_tp(F.linear(copy_to_tp(x), weight))


def cross_entropy(logits, labels):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
