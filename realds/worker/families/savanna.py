# Family `savanna`: a savanna-shaped (StripedHyena 2 / Evo 2) model with real
# tensor parallelism. Not savanna's code: a small re-implementation whose param
# NAMES, SHAPES and tp SPLITS follow savanna (github.com/Zymrael/savanna):
#
#   model/backbone.py   PipelineModule specs [EmbeddingPipe (tied "embed" or not),
#                       _pre_mixer_block, ParallelBlockPipe x layers, _post_mixer_block,
#                       NormPipe, tied EmbeddingPipe or ParallelLinearPipe]; pp = 1 runs use
#                       to_sequential() -> names "sequential.N.*" (--plain).
#   model/block.py      ParallelBlock: input_layernorm, post_attention_layernorm,
#                       pre_mlp_layernorm, outer_mlp_layernorm; mixer = ParallelSequenceMixer
#                       (dense_projection column [3h, h], hyena_proj_conv [3h/tp, 1, L],
#                       mixer = ParallelHyenaOperator / ParallelShortHyenaOperator, dense row
#                       [h, h/tp] + whole bias; attention: rotary_emb.inv_freq buffer);
#                       interleaved projections "b l (g dg p)"; mlp = ParallelGLU.
#   operators/hyena/hyena.py  filter groups / tp; conv_bias [h/tp]; short conv [G/tp, 1, L].
#   parametrization/explicit_filter.py  ExplicitSingleDecayFilter: h [G/tp, L], buffer decay.
#   parametrization/implicit_modal.py   ImplicitModalFilter: gamma, R, p [G/tp, order], buffer t.
#   operators/local/base.py  ParallelGLU: w1, w2 column, w3 row, no bias.
#   operators/local/norms.py RMSNorm ".scale".
# From the lab of issue 14 (savanna_model.py).
import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import mpu
from families import Built, common_args

# savanna's splits; 0 = column / per group, 1 = row, None = whole on every tp rank
SPLITS = [
    (r"\.mixer\.dense_projection\.weight$", 0),
    (r"\.hyena_proj_conv\.short_conv_weight$", 0),
    (r"\.mixer\.mixer\.short_conv\.short_conv_weight$", 0),
    (r"\.mixer\.mixer\.conv_bias$", 0),
    (r"\.filter\.h$", 0),
    (r"\.filter\.decay$", 0),                 # buffer: the rank's rows of the global decay
    (r"\.filter\.(gamma|R|p)$", 0),
    (r"\.mlp\.w[12]\.weight$", 0),
    (r"word_embeddings\.weight$", 0),
    (r"final_linear\.weight$", 0),
    (r"\.mixer\.dense\.weight$", 1),
    (r"\.mlp\.w3\.weight$", 1),
    (r"\.(input_layernorm|post_attention_layernorm|pre_mlp_layernorm|outer_mlp_layernorm)\.scale$", None),
    (r"(^|\.)norm\.scale$", None),
    (r"\.mixer\.dense\.bias$", None),
    (r"\.filter\.t$", None),                  # buffer
    (r"\.rotary_emb\.inv_freq$", None),       # buffer
]


# savanna's default pipe_partition_method (its checkpoints do not record it).
PARTITION_METHOD = "type:ParallelBlockPipe"


def add_args(ap):
    common_args(ap)
    ap.set_defaults(hidden=64, vocab=128, seq=16)
    ap.add_argument("--groups", type=int, default=8, help="num_groups_hyena")
    ap.add_argument("--groups_mr", type=int, default=8, help="num_groups_hyena_medium")
    ap.add_argument("--groups_se", type=int, default=8, help="num_groups_hyena_short")
    ap.add_argument("--order", type=int, default=8, help="hyena_filter_order")
    ap.add_argument("--operators", default="hyena_se,hyena_mr,hyena,flash")
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--plain", action="store_true", help="pp = 1 module named as savanna's to_sequential()")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.01)


def _gen(cfg, salt):
    return torch.Generator().manual_seed(cfg.seed * 1000 + salt)


def _tp():
    return mpu.MPU.tp


class ColumnParallelLinear(nn.Module):
    def __init__(self, gen, inp, out):
        super().__init__()
        self.weight = mpu.mark_split(nn.Parameter(mpu.my_slice(mpu.randn(gen, (out, inp), 0.02), 0)), 0)

    def forward(self, x):
        return F.linear(mpu.copy_to_tp(x), self.weight)


class RowParallelLinear(nn.Module):
    """savanna's: returns (output, bias) and the caller adds the whole bias."""

    def __init__(self, gen, inp, out, bias):
        super().__init__()
        self.weight = mpu.mark_split(nn.Parameter(mpu.my_slice(mpu.randn(gen, (out, inp), 0.02), 1)), 1)
        self.bias = nn.Parameter(mpu.randn(gen, (out,), 0.02)) if bias else None

    def forward(self, x):
        return mpu.reduce_from_tp(F.linear(x, self.weight)), self.bias


class ParallelCausalDepthwiseConv1d(nn.Module):
    def __init__(self, gen, global_groups, kernel, group_dim=1):
        super().__init__()
        self.kernel, self.group_dim = kernel, group_dim
        b = math.sqrt(1 / kernel)
        w = (torch.rand((global_groups, 1, kernel), generator=gen) * 2 - 1) * b
        self.short_conv_weight = mpu.mark_split(nn.Parameter(mpu.my_slice(w, 0)), 0)

    def forward(self, x):  # [b, d, l]
        w = self.short_conv_weight.repeat_interleave(self.group_dim, dim=0)
        L = x.shape[-1]
        return F.conv1d(F.pad(x, (self.kernel - 1, 0)), w, groups=x.shape[1])[..., :L]


class ExplicitSingleDecayFilter(nn.Module):
    def __init__(self, gen, global_groups, L_cache):
        super().__init__()
        h = torch.randn((global_groups, L_cache), generator=gen) / math.sqrt(L_cache)
        self.h = mpu.mark_split(nn.Parameter(mpu.my_slice(h, 0)), 0)
        t = torch.linspace(0, 1, L_cache)[None]
        d = global_groups // _tp()
        r = mpu.MPU.tp_rank
        decay_domain = torch.logspace(0, 2, global_groups)[:, None][r * d:(r + 1) * d, :]
        self.register_buffer("decay", torch.exp(-decay_domain * t))

    def forward(self, L):
        return self.h[:, :L] * self.decay[:, :L]


class ImplicitModalFilter(nn.Module):
    def __init__(self, gen, global_groups, order, L_cache, gamma_min=0.01, gamma_max=0.1):
        super().__init__()
        gamma = (torch.rand((global_groups, order), generator=gen) * (gamma_max - gamma_min) + gamma_min).log()
        R = 1e-1 * torch.randn((global_groups, order), generator=gen) / math.sqrt(order)
        p = -torch.ones(global_groups, order) + 0.01 * torch.randn((global_groups, order), generator=gen)
        self.gamma = mpu.mark_split(nn.Parameter(mpu.my_slice(gamma, 0)), 0)
        self.R = mpu.mark_split(nn.Parameter(mpu.my_slice(R, 0)), 0)
        self.p = mpu.mark_split(nn.Parameter(mpu.my_slice(p, 0)), 0)
        self.register_buffer("t", torch.arange(L_cache, dtype=torch.float32)[None, None])

    def forward(self, L):
        t = self.t[..., :L]
        logp = -torch.exp(self.p.float())
        glogp = logp * torch.exp(self.gamma.float())
        h = torch.exp(glogp[..., None] * t)
        return torch.einsum("do,dot->dt", self.R.float(), h)[None]


def fftconv(u, k, D):
    L = u.shape[-1]
    n = 2 * L
    y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n, norm="backward")[..., :L]
    return y + u * D.float().unsqueeze(-1)


class ParallelHyenaOperator(nn.Module):
    def __init__(self, gen, cfg, kind):
        super().__init__()
        h = cfg.hidden
        G = cfg.groups_mr if kind == "hyena_mr" else cfg.groups
        self.width = h // _tp()
        self.num_groups = G // _tp()
        self.group_dim = self.width // self.num_groups
        if kind == "hyena_mr":
            self.filter = ExplicitSingleDecayFilter(gen, G, cfg.seq)
        else:
            self.filter = ImplicitModalFilter(gen, G, cfg.order, cfg.seq)
        self.conv_bias = mpu.mark_split(nn.Parameter(mpu.my_slice(torch.randn((h,), generator=gen), 0)), 0)

    def forward(self, x1, x2, v):
        B, L, G, DG = x1.shape
        x1, x2, v = [t.reshape(B, L, G * DG).transpose(1, 2) for t in (x1, x2, v)]
        h = self.filter(L)
        if h.dim() == 3:
            h = h[0]
        h = h.repeat_interleave(self.group_dim, dim=-2)
        z = fftconv((x2 * v).float(), h.float(), self.conv_bias).to(v.dtype)
        return (x1 * z).transpose(1, 2)


class ParallelShortHyenaOperator(nn.Module):
    def __init__(self, gen, cfg):
        super().__init__()
        width = cfg.hidden // _tp()
        self.group_dim = width // (cfg.groups_se // _tp())
        self.short_conv = ParallelCausalDepthwiseConv1d(gen, cfg.groups_se, 7, self.group_dim)

    def forward(self, x1, x2, v):
        B, L, G, DG = x1.shape
        x1, x2, v = [t.reshape(B, L, G * DG).transpose(1, 2) for t in (x1, x2, v)]
        return (x1 * self.short_conv(x2 * v)).transpose(1, 2)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def forward(self, L):
        freqs = torch.einsum("i,j->ij", torch.arange(L, dtype=self.inv_freq.dtype), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class ParallelSequenceMixer(nn.Module):
    def __init__(self, gen, cfg, kind):
        super().__init__()
        h = cfg.hidden
        self.kind = kind
        self.dense_projection = ColumnParallelLinear(gen, h, 3 * h)
        if kind == "flash":
            self.heads = cfg.heads // _tp()
            self.hn = h // cfg.heads
            self.rotary_emb = RotaryEmbedding(self.hn)
        else:
            G = {"hyena_se": cfg.groups_se, "hyena_mr": cfg.groups_mr, "hyena": cfg.groups}[kind]
            self.num_groups_per_tp_rank = G // _tp()
            self.hyena_proj_conv = ParallelCausalDepthwiseConv1d(gen, 3 * h, 3)
            self.mixer = ParallelShortHyenaOperator(gen, cfg) if kind == "hyena_se" else ParallelHyenaOperator(gen, cfg, kind)
        self.dense = RowParallelLinear(gen, h, h, bias=True)

    def forward(self, u):
        features = self.dense_projection(u)
        B, L, D = features.shape
        if self.kind != "flash":
            f = self.hyena_proj_conv(features.transpose(1, 2))[..., :L].transpose(1, 2)
            g = self.num_groups_per_tp_rank
            x1, x2, v = f.reshape(B, L, g, D // (3 * g), 3).unbind(dim=-1)  # "b l (g dg p)"
            z = self.mixer(x1, x2, v)
        else:
            q, k, v = features.reshape(B, L, self.heads, 3 * self.hn).split(self.hn, dim=-1)
            cos, sin = self.rotary_emb(L)
            cos, sin = cos[None, :, None].to(q.dtype), sin[None, :, None].to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            z = z.transpose(1, 2).reshape(B, L, self.heads * self.hn)
        return self.dense(z)


class ParallelGLU(nn.Module):
    def __init__(self, gen, cfg):
        super().__init__()
        h, m = cfg.hidden, 64
        ff = m * ((int(2 * h * 4 / 3) + m - 1) // m)
        self.w1 = ColumnParallelLinear(gen, h, ff)
        self.w2 = ColumnParallelLinear(gen, h, ff)
        self.w3 = RowParallelLinear(gen, ff, h, bias=False)

    def forward(self, x):
        return self.w3(F.gelu(self.w1(x)) * self.w2(x))[0]


class ParallelBlockPipe(nn.Module):
    # prenorm, pre_mlp_norm and outer_mlp_norm on, postnorm off:
    # post_attention_layernorm exists but gets no gradient (as in savanna).
    def __init__(self, cfg, layer_number):
        super().__init__()
        gen = _gen(cfg, layer_number)
        h = cfg.hidden
        kind = cfg.operators.split(",")[layer_number]
        self.input_layernorm = mpu.RMSNorm(gen, h)
        self.post_attention_layernorm = mpu.RMSNorm(gen, h)
        self.pre_mlp_layernorm = mpu.RMSNorm(gen, h)
        self.outer_mlp_layernorm = mpu.RMSNorm(gen, h)
        self.mixer = ParallelSequenceMixer(gen, cfg, kind)
        self.mlp = ParallelGLU(gen, cfg)

    def forward(self, x):
        y, bias = self.mixer(self.input_layernorm(x))
        mixer_output = x + (y + bias)
        mlp_output = self.mlp(self.pre_mlp_layernorm(mixer_output))
        return self.outer_mlp_layernorm(mixer_output + mlp_output)


class EmbeddingPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = mpu.VocabParallelEmbedding(_gen(cfg, 999), cfg.vocab, cfg.hidden)

    @property
    def word_embeddings_weight(self):
        return self.word_embeddings.weight

    def forward(self, ids):
        return self.word_embeddings(ids)


class NormPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = mpu.RMSNorm(_gen(cfg, 998), cfg.hidden)

    def forward(self, x):
        return self.norm(x)


class ParallelLinearPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.final_linear = ColumnParallelLinear(_gen(cfg, 997), cfg.hidden, cfg.vocab)

    def forward(self, x):
        return mpu.gather_from_tp(self.final_linear(x))


def logits_helper(embedding, x):
    return mpu.parallel_logits(x, embedding.word_embeddings_weight)


def pre_mixer_block(x):
    return x


def post_mixer_block(x):
    return x


def specs(cfg):
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    tied = not cfg.untied
    out = [TiedLayerSpec("embed", EmbeddingPipe, cfg, tied_weight_attr="word_embeddings_weight") if tied
           else LayerSpec(EmbeddingPipe, cfg), pre_mixer_block]
    out += [LayerSpec(ParallelBlockPipe, cfg, i) for i in range(len(cfg.operators.split(",")))]
    out += [post_mixer_block, LayerSpec(NormPipe, cfg)]
    out.append(TiedLayerSpec("embed", EmbeddingPipe, cfg, forward_fn=logits_helper,
                             tied_weight_attr="word_embeddings_weight") if tied else LayerSpec(ParallelLinearPipe, cfg))
    return out


class Lambda(nn.Module):
    def __init__(self, func):
        super().__init__()
        self.func = func

    def forward(self, x):
        return self.func(x)


class SequentialModel(nn.Module):
    """What savanna's to_sequential() gives a pp = 1 run: one nn.Sequential
    "sequential" holding the same layers; the tied head is a Lambda over the
    embedding, so the tied weight is registered once."""

    def __init__(self, cfg):
        super().__init__()
        emb = EmbeddingPipe(cfg)
        layers = [emb, Lambda(pre_mixer_block)]
        layers += [ParallelBlockPipe(cfg, i) for i in range(len(cfg.operators.split(",")))]
        layers += [Lambda(post_mixer_block), NormPipe(cfg)]
        layers.append(ParallelLinearPipe(cfg) if cfg.untied else Lambda(functools.partial(logits_helper, emb)))
        self.sequential = nn.Sequential(*layers)

    def forward(self, ids):
        return self.sequential(ids)


def build(cfg, topo):
    m = mpu.setup(topo["tp"], topo["pp"])
    if cfg.plain:
        if topo["pp"] != 1:
            raise SystemExit("family savanna --plain: pp must be 1")
        module = SequentialModel(cfg)
        groups = [{"params": list(module.parameters()), "weight_decay": cfg.wd}]
        return Built(module=module, param_groups=groups, pipeline=False, mpu=m,
                     loss=lambda engine, x, y: mpu.cross_entropy(engine(x), y), tp_rank=m.tp_rank,
                     dp_rank=m.dp_rank, records_losses=m.tp_rank == 0)
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    module = PipelineModule(layers=specs(cfg), loss_fn=mpu.cross_entropy,
                            topology=PipeModelDataParallelTopology(num_pp=topo["pp"], num_mp=topo["tp"], num_dp=m.dp),
                            partition_method=PARTITION_METHOD)
    groups = [{"params": list(module.parameters()), "weight_decay": cfg.wd}]
    return Built(module=module, param_groups=groups, pipeline=True, tp_rank=m.tp_rank, pp_rank=m.pp_rank,
                 dp_rank=m.dp_rank, records_losses=m.tp_rank == 0 and m.pp_rank == topo["pp"] - 1)


def client_state(cfg, topo, iteration):
    """What savanna's checkpointing.save_ds_checkpoint passes as client_state
    (rng states included: DeepSpeed < 0.15 needs TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
    under torch >= 2.6 to load them)."""
    import random
    import numpy as np
    return {
        "iteration": iteration,
        "args": {"num_layers": len(cfg.operators.split(",")), "hidden_size": cfg.hidden,
                 "num_attention_heads": cfg.heads, "max_position_embeddings": cfg.seq,
                 "make_vocab_size_divisible_by": 8, "padded_vocab_size": cfg.vocab,
                 "tokenizer_type": "CharLevelTokenizer", "model_parallel_size": topo["tp"]},
        "data_loading": {"train_data_token_index": None, "train_val_test_num_samples": [400, 0, 0]},
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
    }
