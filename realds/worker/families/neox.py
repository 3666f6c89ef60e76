# Family `neox`: a GPT-NeoX-shaped PipelineModule with Megatron tensor
# parallelism, named and split as GPT-NeoX names and splits them (the model of the
# original tp 2 -> 1 bug report; ../shared/fixtures/deepspeed-0.14.4/README.md):
#
#   0   EmbeddingPipe          word_embeddings.weight [V/tp, h]           vocab rows (dim 0)
#   1   a block without params (GPT-NeoX's _pre_transformer_block as a module)
#   2.. ParallelTransformerLayerPipe x layers:
#         input_layernorm.scale, post_attention_layernorm.scale [h]     replicated (RMSNorm)
#         attention.query_key_value.{weight [3h/tp, h], bias}           column (dim 0)
#         attention.dense.weight [h, h/tp]                              row (dim 1)
#         attention.dense.bias [h]                                      replicated
#         mlp.dense_h_to_4h.{weight [4h/tp, h], bias}                   column (dim 0)
#         mlp.dense_4h_to_h.weight [h, 4h/tp]                           row (dim 1)
#         mlp.dense_4h_to_h.bias [h]                                    replicated
#   .   a function (_post_transformer_block)
#   .   NormPipe               norm.scale [h]                             replicated
#   .   ParallelLinearPipe     final_linear.weight [V/tp, h]              vocab rows (dim 0)
#
# or, with --tied, the output uses the embedding (`tied_modules.embed.word_embeddings.weight`).
# Param groups as GPT-NeoX's get_params_for_weight_decay_optimization: weights,
# then norms and biases (weight decay 0). --plain builds the same layers as one
# nn.Sequential (`sequential.N.*`, pp = 1, DeepSpeed's engine given the mpu).
# --declare_patterns saves `universal_checkpoint_info` with the patterns
# ds_to_universal.py needs for these names (as Megatron-DeepSpeed does); by
# default it is `{}`, as GPT-NeoX's fork of the bug report saved it.
# --moe_layers makes those blocks' MLP DeepSpeed's native MoE
# (`mlp.deepspeed_moe.experts.deepspeed_experts.E.{0,2}.*`, `mlp.deepspeed_moe.gate.wg.weight`):
# plain experts and gate, replicated over tp (enable_expert_tensor_parallelism
# False), experts over the topology's `ep`; in the plain module or in the
# PipelineModule, where every stage must hold a MoE block (README, "Native MoE
# at pp > 1": with MoE in one stage only, DeepSpeed 0.19.5 hangs).
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

import mpu
from families import Built, common_args

SPLITS = [
    (r"word_embeddings\.weight$", 0),
    (r"final_linear\.weight$", 0),
    (r"\.attention\.query_key_value\.(weight|bias)$", 0),
    (r"\.mlp\.dense_h_to_4h\.(weight|bias)$", 0),
    (r"\.attention\.dense\.weight$", 1),
    (r"\.mlp\.dense_4h_to_h\.weight$", 1),
    (r"\.attention\.dense\.bias$", None),
    (r"\.mlp\.dense_4h_to_h\.bias$", None),
    (r"(layernorm|norm)\.scale$", None),
    (r"\.mlp\.deepspeed_moe\.", None),
]

# What a Megatron-DeepSpeed-style client would declare for these names
# (deepspeed/checkpoint/constants.py keys).
DECLARED = {
    "tp_replicated_parameter_patterns": [r".*norm\.scale$", r".*attention\.dense\.bias$", r".*mlp\.dense_4h_to_h\.bias$"],
    "parameter_with_row_parallelism_patterns": [r".*attention\.dense\.weight$", r".*mlp\.dense_4h_to_h\.weight$"],
}


# GPT-NeoX's default pipe_partition_method (its checkpoints do not record it).
PARTITION_METHOD = "type:transformer|mlp"


def add_args(ap):
    common_args(ap)
    ap.add_argument("--tied", action="store_true", help="output layer tied to the embedding")
    ap.add_argument("--plain", action="store_true", help="one nn.Sequential instead of a PipelineModule")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--groups", type=int, default=2, choices=(1, 2),
                    help="2: weights / no-decay params as GPT-NeoX; 1: one group (DeepSpeed's stage-3 universal loader)")
    ap.add_argument("--declare_patterns", action="store_true",
                    help="save universal_checkpoint_info with the tp patterns of these names")
    ap.add_argument("--moe_layers", default="", help="comma list of blocks whose MLP is a native MoE layer")
    ap.add_argument("--experts", type=int, default=4)


def _gen(cfg, salt):
    return torch.Generator().manual_seed(cfg.seed * 1000 + salt)


class EmbeddingPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = mpu.VocabParallelEmbedding(_gen(cfg, 999), cfg.vocab, cfg.hidden)

    @property
    def word_embeddings_weight(self):
        return self.word_embeddings.weight

    def forward(self, ids):
        return self.word_embeddings(ids)


class PreTransformerBlock(nn.Module):
    def forward(self, x):
        return x


def post_transformer_block(x):
    return x


class Attention(nn.Module):
    def __init__(self, gen, cfg):
        super().__init__()
        h = cfg.hidden
        if cfg.heads % mpu.MPU.tp:
            raise SystemExit(f"family neox: {cfg.heads} heads do not split over tp {mpu.MPU.tp}")
        self.heads = cfg.heads // mpu.MPU.tp
        self.hn = h // cfg.heads
        self.query_key_value = mpu.ColumnParallelLinear(gen, h, 3 * h, bias=True)
        self.dense = mpu.RowParallelLinear(gen, h, h, bias=True)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.query_key_value(x).view(b, s, self.heads, 3 * self.hn)  # GPT-NeoX: per head [q k v]
        q, k, v = qkv.split(self.hn, dim=-1)
        z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.dense(z.transpose(1, 2).reshape(b, s, self.heads * self.hn))


class MLP(nn.Module):
    def __init__(self, gen, cfg):
        super().__init__()
        h = cfg.hidden
        self.dense_h_to_4h = mpu.ColumnParallelLinear(gen, h, 4 * h, bias=True)
        self.dense_4h_to_h = mpu.RowParallelLinear(gen, 4 * h, h, bias=True)

    def forward(self, x):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


def gloo_gather_tokens():
    """DeepSpeed's MoE gathers tokens over tp (moe/mappings.py _gather_tokens) into
    a flat buffer, which gloo's all_gather_into_tensor refuses ("invalid tensor
    size"); the same memory viewed as [tp x rows, ...] is accepted. Wrapped once."""
    import deepspeed.comm as dcomm
    inner = dcomm.all_gather_into_tensor
    if getattr(inner, "ucp_flat_ok", False):
        return

    def gather(output_tensor, input_tensor, *args, **kwargs):
        if output_tensor.dim() == 1 and input_tensor.dim() > 1:
            n = output_tensor.numel() // input_tensor.numel()
            output_tensor = output_tensor.view(n * input_tensor.shape[0], *input_tensor.shape[1:])
        return inner(output_tensor, input_tensor, *args, **kwargs)

    gather.ucp_flat_ok = True
    dcomm.all_gather_into_tensor = gather


def moe_mlp(cfg, layer, ep):
    """DeepSpeed's MoE over plain experts (the same on every tp rank: built from
    a generator of the seed and layer); top-1, no random token selection, no
    dropped tokens."""
    from deepspeed.moe.layer import MoE
    gloo_gather_tokens()
    h = cfg.hidden
    torch.manual_seed(cfg.seed * 1000 + 500 + layer)
    expert = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))
    return MoE(h, expert, num_experts=cfg.experts, ep_size=ep, k=1, use_rts=False, drop_tokens=False)


class ParallelTransformerLayerPipe(nn.Module):
    def __init__(self, cfg, layer, ep=1):
        super().__init__()
        gen = _gen(cfg, layer)
        self.input_layernorm = mpu.RMSNorm(gen, cfg.hidden)
        self.attention = Attention(gen, cfg)
        self.post_attention_layernorm = mpu.RMSNorm(gen, cfg.hidden)
        self.moe = str(layer) in cfg.moe_layers.split(",")
        self.mlp = moe_mlp(cfg, layer, ep) if self.moe else MLP(gen, cfg)

    def forward(self, x):
        x = x + self.attention(self.input_layernorm(x))
        m = self.mlp(self.post_attention_layernorm(x))
        return x + (m[0] if self.moe else m)


class NormPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = mpu.RMSNorm(_gen(cfg, 998), cfg.hidden)

    def forward(self, x):
        return self.norm(x)


class ParallelLinearPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        gen = _gen(cfg, 997)
        self.final_linear = mpu.ColumnParallelLinear(gen, cfg.hidden, cfg.vocab)

    def forward(self, x):
        return mpu.gather_from_tp(self.final_linear(x))


def tied_logits(embedding, x):
    return mpu.parallel_logits(x, embedding.word_embeddings_weight)


def specs(cfg, ep=1):
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    out = [TiedLayerSpec("embed", EmbeddingPipe, cfg, tied_weight_attr="word_embeddings_weight") if cfg.tied
           else LayerSpec(EmbeddingPipe, cfg), LayerSpec(PreTransformerBlock)]
    out += [LayerSpec(ParallelTransformerLayerPipe, cfg, i, ep) for i in range(cfg.layers)]
    out += [post_transformer_block, LayerSpec(NormPipe, cfg)]
    out.append(TiedLayerSpec("embed", EmbeddingPipe, cfg, forward_fn=tied_logits,
                             tied_weight_attr="word_embeddings_weight") if cfg.tied else LayerSpec(ParallelLinearPipe, cfg))
    return out


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class Sequential(nn.Module):
    """The same layers as one module (names sequential.N.*), for pp = 1 runs
    without a PipelineModule."""

    def __init__(self, cfg, ep=1):
        super().__init__()
        emb = EmbeddingPipe(cfg)
        layers = [emb, PreTransformerBlock()] + [ParallelTransformerLayerPipe(cfg, i, ep) for i in range(cfg.layers)]
        layers += [Lambda(post_transformer_block), NormPipe(cfg)]
        if cfg.tied:
            import functools
            layers.append(Lambda(functools.partial(tied_logits, emb)))
        else:
            layers.append(ParallelLinearPipe(cfg))
        self.sequential = nn.Sequential(*layers)

    def forward(self, ids):
        return self.sequential(ids)


def weight_decay_groups(module, cfg):
    if cfg.groups == 1:
        return [{"params": list(module.parameters()), "weight_decay": cfg.wd}]
    decay = [p for n, p in module.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in module.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.wd}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.moe_layers:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        for i, g in enumerate(groups):  # the MoE splitter keys groups by name
            g["name"] = f"group{i}"
        groups = split_params_into_different_moe_groups_for_optimizer(groups)
    return groups


def moe_built(built, cfg, ep):
    """Experts under their global ids (ep rank x local experts + local id)."""
    nloc = cfg.experts // ep

    def ep_rank():  # the expert groups exist once deepspeed.initialize has run
        from deepspeed.utils import groups as ds_groups
        return ds_groups._get_expert_parallel_rank(f"ep_size_{ep}")

    def global_name(n):
        m = re.search(r"deepspeed_experts\.(\d+)\.", n)
        if not m:
            return n
        return n[:m.start(1)] + str(ep_rank() * nloc + int(m.group(1))) + n[m.end(1):]

    built.global_name = global_name
    built.ep_rank_fn = ep_rank
    return built


def build(cfg, topo):
    m = mpu.setup(topo["tp"], topo["pp"])
    ep = topo.get("ep", 1)
    if cfg.plain:
        if topo["pp"] != 1:
            raise SystemExit("family neox --plain: pp must be 1")
        module = Sequential(cfg, ep)
        built = Built(module=module, param_groups=weight_decay_groups(module, cfg), pipeline=False, mpu=m,
                      loss=lambda engine, x, y: mpu.cross_entropy(engine(x), y), tp_rank=m.tp_rank,
                      dp_rank=m.dp_rank, records_losses=m.tp_rank == 0)
        return moe_built(built, cfg, ep) if cfg.moe_layers else built
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    module = PipelineModule(layers=specs(cfg, ep), loss_fn=mpu.cross_entropy,
                            topology=PipeModelDataParallelTopology(num_pp=topo["pp"], num_mp=topo["tp"], num_dp=m.dp),
                            partition_method=PARTITION_METHOD)
    if cfg.moe_layers:
        moe_in_every_stage(module)
    built = Built(module=module, param_groups=weight_decay_groups(module, cfg), pipeline=True, tp_rank=m.tp_rank,
                  pp_rank=m.pp_rank, dp_rank=m.dp_rank, records_losses=m.tp_rank == 0 and m.pp_rank == topo["pp"] - 1)
    return moe_built(built, cfg, ep) if cfg.moe_layers else built


def moe_in_every_stage(module):
    """A PipelineModule whose stages do not all hold a MoE layer: DeepSpeed 0.19.5
    hangs in its first step (the stages' per-param-group collectives differ; README,
    "Native MoE at pp > 1"), so every rank stops here instead, having agreed by an
    all-reduce (stage ids counted from 1, 0 for a stage with MoE)."""
    import torch.distributed as dist
    from deepspeed.moe.layer import MoE
    has = any(isinstance(x, MoE) for x in module.modules())
    flag = torch.tensor([0 if has else module.stage_id + 1], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if int(flag):
        raise SystemExit(f"family neox --moe_layers: pipeline stage {int(flag) - 1} holds no MoE block "
                         "(DeepSpeed hangs unless every stage has one; choose --moe_layers by the stage partition)")


def client_state(cfg, topo, iteration):
    info = dict(DECLARED) if cfg.declare_patterns else {}
    # DeepSpeed's MoE save refuses a client_state with universal_checkpoint_info (a reserved key there)
    uci = {} if cfg.moe_layers else {"universal_checkpoint_info": info}
    return {"iteration": iteration, **uci,
            "args": {"num_layers": cfg.layers, "hidden_size": cfg.hidden, "num_attention_heads": cfg.heads,
                     "padded_vocab_size": cfg.vocab, "model_parallel_size": topo["tp"],
                     "pipe_parallel_size": topo["pp"], "seq_length": cfg.seq}}
