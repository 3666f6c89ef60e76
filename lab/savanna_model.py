# A savanna-shaped (StripedHyena 2 / Evo 2) model with real tensor parallelism,
# for the real-DeepSpeed lab (see lab/README.md). Not savanna's code: a small
# re-implementation whose parameter NAMES, SHAPES and tp SPLITS follow savanna
# (github.com/Zymrael/savanna, read with `git show HEAD:savanna/...`):
#
#   model/backbone.py   PipelineModule specs: [EmbeddingPipe (tied "embed" or not),
#                       _pre_mixer_block (a function), ParallelBlockPipe x num_layers,
#                       _post_mixer_block (function), NormPipe, tied EmbeddingPipe or
#                       ParallelLinearPipe]; pp=1 runs use to_sequential() -> "sequential.N".
#   model/block.py      ParallelBlock: input_layernorm, post_attention_layernorm,
#                       pre_mlp_layernorm, outer_mlp_layernorm (norm(hidden)), mixer =
#                       ParallelSequenceMixer (dense_projection column [3h, h] no bias,
#                       hyena_proj_conv ParallelCausalDepthwiseConv1d [3h/tp, 1, short_conv_L],
#                       mixer = ParallelHyenaOperator / ParallelShortHyenaOperator, dense row
#                       [h, h] with whole bias), attention: rotary_emb (buffer inv_freq);
#                       interleaved projections "b l (g dg p)"; mlp = ParallelGLU.
#   operators/hyena/hyena.py  ParallelHyenaOperator: filter (num_groups / tp groups),
#                       conv_bias [h/tp] (partition_dim 0); ParallelShortHyenaOperator:
#                       short_conv [G/tp, 1, hyena_se_len] (repeat_h_dg=False), pre/post gate.
#   parametrization/explicit_filter.py  ExplicitSingleDecayFilter: h [G/tp, L],
#                       buffer decay [G/tp, L] = rank's rows of the global decay domain.
#   parametrization/implicit_modal.py   ImplicitModalFilter: gamma, R, p [G/tp, order],
#                       buffer t [1, 1, L].
#   operators/local/base.py  ParallelGLU: w1, w2 column [ff/tp, h], w3 row [h, ff/tp], no
#                       bias; ff = multiple_of * ceil(int(2*h*4/3) / multiple_of).
#   operators/local/norms.py RMSNorm: ".scale".
#   mpu/layers.py       VocabParallelEmbedding rows, ColumnParallelLinear dim 0,
#                       RowParallelLinear dim 1 (bias whole, added after the all-reduce).
#
# The forward is plain torch (no savanna kernels), but every tp rank computes with
# only its own slice, and row-parallel outputs / the embedding are all-reduced over
# the tp group, so a wrongly merged slice changes the loss.

import functools
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- mpu


class Mpu:
    """Megatron-style groups laid out like DeepSpeed's PipeModelDataParallelTopology
    (axes pipe, data, model; model fastest)."""

    def __init__(self, tp, pp):
        world = dist.get_world_size()
        rank = dist.get_rank()
        assert world % (tp * pp) == 0
        self.tp, self.pp, self.dp = tp, pp, world // (tp * pp)
        self.rank = rank
        self.pp_rank = rank // (self.dp * tp)
        self.dp_rank = (rank // tp) % self.dp
        self.tp_rank = rank % tp
        self.tp_group = self.dp_group = self.mp_group = None
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

    # the interface DeepSpeed's engine / ZeRO use (plain-module runs; pp == 1).
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


def mark_split(p, dim):
    # DeepSpeed counts these once per tp rank in the gradient norm.
    p.model_parallel = True
    p.tensor_model_parallel = True
    p.partition_dim = dim
    return p


def global_init(gen, shape, std):
    return torch.randn(shape, generator=gen) * std


class ColumnParallelLinear(nn.Module):
    def __init__(self, gen, inp, out, std=0.02):
        super().__init__()
        assert out % MPU.tp == 0, (out, MPU.tp)
        w = global_init(gen, (out, inp), std).chunk(MPU.tp, 0)[MPU.tp_rank]
        self.weight = mark_split(nn.Parameter(w.clone()), 0)

    def forward(self, x):
        return F.linear(_CopyToTP.apply(x), self.weight)


class RowParallelLinear(nn.Module):
    def __init__(self, gen, inp, out, bias, std=0.02):
        super().__init__()
        w = global_init(gen, (out, inp), std).chunk(MPU.tp, 1)[MPU.tp_rank]
        self.weight = mark_split(nn.Parameter(w.clone()), 1)
        self.bias = nn.Parameter(global_init(gen, (out,), 0.02)) if bias else None

    def forward(self, x):
        y = _ReduceFromTP.apply(F.linear(x, self.weight))
        return y, self.bias


class RMSNorm(nn.Module):
    def __init__(self, gen, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(1.0 + global_init(gen, (dim,), 0.1))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.scale.float() * y).to(x.dtype)


class ParallelCausalDepthwiseConv1d(nn.Module):
    # weight [num_groups (per tp rank), 1, kernel] (use_depthwise_short_conv_grouping)
    def __init__(self, gen, global_groups, kernel, group_dim=1):
        super().__init__()
        self.kernel, self.group_dim = kernel, group_dim
        b = math.sqrt(1 / kernel)
        w = (torch.rand((global_groups, 1, kernel), generator=gen) * 2 - 1) * b
        self.short_conv_weight = mark_split(nn.Parameter(w.chunk(MPU.tp, 0)[MPU.tp_rank].clone()), 0)

    def forward(self, x):  # x [b, d, l]
        w = self.short_conv_weight.repeat_interleave(self.group_dim, dim=0)
        L = x.shape[-1]
        y = F.conv1d(F.pad(x, (self.kernel - 1, 0)), w, groups=x.shape[1])
        return y[..., :L]


class ExplicitSingleDecayFilter(nn.Module):
    def __init__(self, gen, global_groups, L_cache):
        super().__init__()
        h = torch.randn((global_groups, L_cache), generator=gen) / math.sqrt(L_cache)
        self.h = mark_split(nn.Parameter(h.chunk(MPU.tp, 0)[MPU.tp_rank].clone()), 0)
        t = torch.linspace(0, 1, L_cache)[None]
        d = global_groups // MPU.tp
        decay_domain = torch.logspace(0, 2, global_groups)[:, None]
        decay_domain = decay_domain[MPU.tp_rank * d:(MPU.tp_rank + 1) * d, :]
        self.register_buffer("decay", torch.exp(-decay_domain * t))

    def forward(self, L):
        return self.h[:, :L] * self.decay[:, :L]


class ImplicitModalFilter(nn.Module):
    def __init__(self, gen, global_groups, order, L_cache, gamma_min=0.01, gamma_max=0.1):
        super().__init__()
        r = MPU.tp_rank
        gamma = (torch.rand((global_groups, order), generator=gen) * (gamma_max - gamma_min) + gamma_min).log()
        R = 1e-1 * torch.randn((global_groups, order), generator=gen) / math.sqrt(order)
        p = -torch.ones(global_groups, order) + 0.01 * torch.randn((global_groups, order), generator=gen)
        self.gamma = mark_split(nn.Parameter(gamma.chunk(MPU.tp, 0)[r].clone()), 0)
        self.R = mark_split(nn.Parameter(R.chunk(MPU.tp, 0)[r].clone()), 0)
        self.p = mark_split(nn.Parameter(p.chunk(MPU.tp, 0)[r].clone()), 0)
        self.register_buffer("t", torch.arange(L_cache, dtype=torch.float32)[None, None])

    def forward(self, L):
        t = self.t[..., :L]
        logp = -torch.exp(self.p.float())
        glogp = logp * torch.exp(self.gamma.float())
        h = torch.exp(glogp[..., None] * t)
        return torch.einsum("do,dot->dt", self.R.float(), h)[None]


def fftconv(u, k, D):
    # u [b, d, l] fp32, k [d, l], D [d]
    L = u.shape[-1]
    n = 2 * L
    y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n, norm="backward")[..., :L]
    return y + u * D.float().unsqueeze(-1)


class ParallelHyenaOperator(nn.Module):
    def __init__(self, gen, cfg, kind):
        super().__init__()
        h = cfg["hidden"]
        G = cfg["groups_mr"] if kind == "hyena_mr" else cfg["groups"]
        self.width = h // MPU.tp
        self.num_groups = G // MPU.tp
        self.group_dim = self.width // self.num_groups
        if kind == "hyena_mr":
            self.filter = ExplicitSingleDecayFilter(gen, G, cfg["seq"])
        else:
            self.filter = ImplicitModalFilter(gen, G, cfg["order"], cfg["seq"])
        cb = torch.randn((h,), generator=gen)
        self.conv_bias = mark_split(nn.Parameter(cb.chunk(MPU.tp, 0)[MPU.tp_rank].clone()), 0)

    def forward(self, x1, x2, v):  # [b, l, g, dg]
        B, L, G, DG = x1.shape
        x1, x2, v = [t.reshape(B, L, G * DG).transpose(1, 2) for t in (x1, x2, v)]
        h = self.filter(L)
        if h.dim() == 3:
            h = h[0]
        h = h.repeat_interleave(self.group_dim, dim=-2)
        z = x2 * v
        z = fftconv(z.float(), h.float(), self.conv_bias).to(v.dtype)
        z = x1 * z
        return z.transpose(1, 2)


class ParallelShortHyenaOperator(nn.Module):
    def __init__(self, gen, cfg):
        super().__init__()
        G = cfg["groups_se"]
        width = cfg["hidden"] // MPU.tp
        self.group_dim = width // (G // MPU.tp)
        self.short_conv = ParallelCausalDepthwiseConv1d(gen, G, cfg["hyena_se_len"], self.group_dim)

    def forward(self, x1, x2, v):
        B, L, G, DG = x1.shape
        x1, x2, v = [t.reshape(B, L, G * DG).transpose(1, 2) for t in (x1, x2, v)]
        z = self.short_conv(x2 * v)
        return (x1 * z).transpose(1, 2)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def forward(self, L):
        t = torch.arange(L, dtype=self.inv_freq.dtype)
        freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class ParallelSequenceMixer(nn.Module):
    def __init__(self, gen, cfg, kind):
        super().__init__()
        h = cfg["hidden"]
        self.kind = kind
        self.dense_projection = ColumnParallelLinear(gen, h, 3 * h)
        if kind == "flash":
            self.heads = cfg["heads"] // MPU.tp
            self.hn = h // cfg["heads"]
            self.rotary_emb = RotaryEmbedding(self.hn)
        else:
            G = {"hyena_se": cfg["groups_se"], "hyena_mr": cfg["groups_mr"], "hyena": cfg["groups"]}[kind]
            self.num_groups_per_tp_rank = G // MPU.tp
            self.hyena_proj_conv = ParallelCausalDepthwiseConv1d(gen, 3 * h, cfg["short_conv_L"])
            if kind == "hyena_se":
                self.mixer = ParallelShortHyenaOperator(gen, cfg)
            else:
                self.mixer = ParallelHyenaOperator(gen, cfg, kind)
        self.dense = RowParallelLinear(gen, h, h, bias=True)

    def forward(self, u):
        features = self.dense_projection(u)  # [b, l, 3h/tp]
        B, L, D = features.shape
        if self.kind != "flash":
            f = self.hyena_proj_conv(features.transpose(1, 2))[..., :L].transpose(1, 2)
            g = self.num_groups_per_tp_rank
            f = f.reshape(B, L, g, D // (3 * g), 3)  # "b l (g dg p) -> b l g dg p"
            x1, x2, v = f.unbind(dim=-1)
            z = self.mixer(x1, x2, v)
        else:
            f = features.reshape(B, L, self.heads, 3 * self.hn)
            q, k, v = f.split(self.hn, dim=-1)
            cos, sin = self.rotary_emb(L)
            cos, sin = cos[None, :, None].to(q.dtype), sin[None, :, None].to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            z = z.transpose(1, 2).reshape(B, L, self.heads * self.hn)
        return self.dense(z)


class ParallelGLU(nn.Module):
    def __init__(self, gen, cfg):
        super().__init__()
        h, m = cfg["hidden"], cfg["multiple_of"]
        ff = int(2 * h * 4 / 3)
        ff = m * ((ff + m - 1) // m)
        self.w1 = ColumnParallelLinear(gen, h, ff)
        self.w2 = ColumnParallelLinear(gen, h, ff)
        self.w3 = RowParallelLinear(gen, ff, h, bias=False)

    def forward(self, x):
        y, _ = self.w3(F.gelu(self.w1(x)) * self.w2(x))
        return y


class ParallelBlockPipe(nn.Module):
    # prenorm, pre_mlp_norm and outer_mlp_norm on, postnorm off (savanna forbids
    # postnorm with either): post_attention_layernorm exists but gets no gradient.
    def __init__(self, cfg, layer_number):
        super().__init__()
        gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + layer_number)
        h = cfg["hidden"]
        kind = cfg["operators"][layer_number]
        self.input_layernorm = RMSNorm(gen, h)
        self.post_attention_layernorm = RMSNorm(gen, h)
        self.pre_mlp_layernorm = RMSNorm(gen, h)
        self.outer_mlp_layernorm = RMSNorm(gen, h)
        self.mixer = ParallelSequenceMixer(gen, cfg, kind)
        self.mlp = ParallelGLU(gen, cfg)

    def forward(self, x):
        residual = x
        y, bias = self.mixer(self.input_layernorm(x))
        mixer_output = residual + (y + bias)
        mlp_output = self.mlp(self.pre_mlp_layernorm(mixer_output))
        return self.outer_mlp_layernorm(mixer_output + mlp_output)


class EmbeddingPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + 999)
        V, h = cfg["vocab"], cfg["hidden"]
        self.per = V // MPU.tp
        self.start = MPU.tp_rank * self.per
        w = global_init(gen, (V, h), 0.02).chunk(MPU.tp, 0)[MPU.tp_rank]
        self.word_embeddings = nn.Module()
        self.word_embeddings.weight = mark_split(nn.Parameter(w.clone()), 0)

    @property
    def word_embeddings_weight(self):
        return self.word_embeddings.weight

    def forward(self, ids):
        local = ids - self.start
        mask = (local < 0) | (local >= self.per)
        local = local.masked_fill(mask, 0)
        e = F.embedding(local, self.word_embeddings.weight)
        e = e.masked_fill(mask[..., None], 0.0)
        return _ReduceFromTP.apply(e)


class NormPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + 998)
        self.norm = RMSNorm(gen, cfg["hidden"])

    def forward(self, x):
        return self.norm(x)


class ParallelLinearPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + 997)
        self.final_linear = ColumnParallelLinear(gen, cfg["hidden"], cfg["vocab"])

    def forward(self, x):
        return _GatherFromTP.apply(self.final_linear(x))


def logits_helper(embedding, x):
    return _GatherFromTP.apply(F.linear(_CopyToTP.apply(x), embedding.word_embeddings_weight))


def pre_mixer_block(x):
    return x


def post_mixer_block(x):
    return x


def loss_fn(logits, labels):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def build_specs(cfg):
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    specs = []
    if cfg["tied"]:
        specs.append(TiedLayerSpec("embed", EmbeddingPipe, cfg, tied_weight_attr="word_embeddings_weight"))
    else:
        specs.append(LayerSpec(EmbeddingPipe, cfg))
    specs.append(pre_mixer_block)
    for i in range(len(cfg["operators"])):
        specs.append(LayerSpec(ParallelBlockPipe, cfg, i))
    specs.append(post_mixer_block)
    specs.append(LayerSpec(NormPipe, cfg))
    if cfg["tied"]:
        specs.append(TiedLayerSpec("embed", EmbeddingPipe, cfg, forward_fn=logits_helper,
                                   tied_weight_attr="word_embeddings_weight"))
    else:
        specs.append(LayerSpec(ParallelLinearPipe, cfg))
    return specs


class Lambda(nn.Module):
    def __init__(self, func):
        super().__init__()
        self.func = func

    def forward(self, x):
        return self.func(x)


class SequentialModel(nn.Module):
    """What savanna's to_sequential() gives a pp=1 run: one nn.Sequential "sequential"
    holding the same layers (model/backbone.py to_sequential, SequentialWrapper)."""

    def __init__(self, cfg):
        super().__init__()
        layers = []
        emb = EmbeddingPipe(cfg)
        layers.append(emb)
        layers.append(Lambda(pre_mixer_block))
        for i in range(len(cfg["operators"])):
            layers.append(ParallelBlockPipe(cfg, i))
        layers.append(Lambda(post_mixer_block))
        layers.append(NormPipe(cfg))
        if cfg["tied"]:
            # PipelineModule keeps partial(forward_fn, tied module) in forward_funcs,
            # to_sequential wraps it in a Lambda: the tied weight is registered once.
            layers.append(Lambda(functools.partial(logits_helper, emb)))
        else:
            layers.append(ParallelLinearPipe(cfg))
        self.sequential = nn.Sequential(*layers)

    def forward(self, ids):
        return self.sequential(ids)
