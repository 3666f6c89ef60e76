"""A Hugging Face folder imported into DeepSpeed by ucp, loaded by real DeepSpeed (run in the Debian
unstable root: torch 2.14, transformers 5.12, DeepSpeed 0.19.5 on PYTHONPATH; CPU, gloo; fp32).

  python3 hf_import_check.py save --out DIR [--family neox|llama]
      transformers builds a tiny GPTNeoXForCausalLM from a GPTNeoXConfig (random init, seeded; partial
      rotary 0.25, parallel residual, exact GELU, LayerNorm, untied output, eager attention) or, with
      --family llama, a LlamaForCausalLM from a LlamaConfig (GQA: 4 query heads, 2 kv heads; RMSNorm,
      SwiGLU, rotary, untied output, eager attention), and
      save_pretrained's it (every bias, zero at transformers' init, given random values) to DIR/hf (one
      model.safetensors) and DIR/hf_sharded (shards + index);
      DIR/ref.pt holds its state dict and its logits for fixed input ids. --family mistral: a
      MistralForCausalLM from a MistralConfig of the same sizes (Llama's tensors; its default
      sliding_window 4096 is wider than max_position_embeddings 64, so the window never applies);
      --family qwen2: a Qwen2ForCausalLM (saved only: its import is refused).
  python3 hf_import_check.py load --ckpt CKPT --tp T --pp P --ref REF --out PT [--init ckpt|hf] [--family F]
      T x P processes build a GPT-NeoX PipelineModule (--family llama: Megatron-DeepSpeed's GPTModelPipe
      layout, fused query_key_value grouped per kv head and swiglu dense_h_to_4h) with Megatron-style
      tp (mpu.py) whose math is transformers' (the same functions for rotary, attention and norms),
      named as the gpt-neox (megatron-deepspeed) preset names it, from another seed; DeepSpeed (ZeRO-1, torch Adam) initializes it. --init ckpt:
      engine.load_checkpoint(CKPT, load_module_only=True). --init hf: the HF weights copied into the
      module before deepspeed.initialize (a fresh optimizer over them: the reference for the step).
      Then: every param against its slice of the HF tensor (bitwise; a fused tensor is rebuilt here
      from the HF parts in Megatron-DeepSpeed's layout, as hf2megads_weight_converter.py fuses them), the logits of the fixed ids
      (stage by stage over the pipeline, gathered over tp) against transformers' (max |diff|), one
      train_batch, and every param after it saved to PT (per rank, for the step's comparison).
  python3 hf_import_check.py reload --hf DIR --ref REF [--family F]
      transformers' AutoModelForCausalLM.from_pretrained(DIR) (a folder `ucp export --names=hf` wrote):
      every tensor of its state dict against REF's (bitwise, the same names), and its logits of the fixed
      ids against REF's.
Prints one JSON line (rank 0); exits 1 when a weight differs.
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
import torch.nn as nn
import torch.nn.functional as F

SEED = 4321
SEQ = 12
# (regex over the checkpoint name, the split dim over tp or None when whole), as the gpt-neox preset splits
SPLITS = [
    (r"word_embeddings\.weight$", 0), (r"final_linear\.weight$", 0),
    (r"attention\.query_key_value\.(weight|bias)$", 0), (r"mlp\.dense_h_to_4h\.(weight|bias)$", 0),
    (r"attention\.dense\.weight$", 1), (r"mlp\.dense_4h_to_h\.weight$", 1),
    (r"(attention\.dense|mlp\.dense_4h_to_h)\.bias$", None), (r"(layernorm|norm)\.(weight|bias)$", None),
]


FAMILY = "neox"  # neox, llama or mistral (Llama's tensors and, here, its math)
TIED = False  # --tied (llama): tie_word_embeddings, GPTModelPipe's TiedLayerSpec 'embed' at 0 and at the head
# Megatron-DeepSpeed's GPTModelPipe trained as Llama, as the megatron-deepspeed preset names it.
LLAMA_SPLITS = [
    (r"word_embeddings\.weight$", 0), (r"lm_head\.weight$", 0),
    (r"self_attention\.query_key_value\.weight$", 0), (r"mlp\.dense_h_to_4h\.weight$", "gate_up"),
    (r"self_attention\.dense\.weight$", 1), (r"mlp\.dense_4h_to_h\.weight$", 1),
    (r"(layernorm\.weight|^\d+\.weight)$", None),
]


def llama_like():
    return FAMILY in ("llama", "mistral")


def config():
    if FAMILY == "qwen2":  # saved only: its import is refused (q/k/v biases alone)
        from transformers import Qwen2Config
        return Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                           rms_norm_eps=1e-5, tie_word_embeddings=TIED, attn_implementation="eager")
    if FAMILY == "mistral":
        from transformers import MistralConfig
        return MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                             rms_norm_eps=1e-5, tie_word_embeddings=TIED, hidden_act="silu",
                             attn_implementation="eager")
    if FAMILY == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                           rms_norm_eps=1e-5, tie_word_embeddings=TIED, hidden_act="silu", attention_bias=False,
                           mlp_bias=False, attn_implementation="eager")
    from transformers import GPTNeoXConfig
    return GPTNeoXConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                         num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.25,
                         use_parallel_residual=True, tie_word_embeddings=False, hidden_act="gelu",
                         layer_norm_eps=1e-5, attn_implementation="eager")


def ids():
    g = torch.Generator().manual_seed(99)
    return torch.randint(0, 96, (2, SEQ), generator=g)


def llama_full(name, hf, cfg):
    """The full tensor of a megatron-deepspeed checkpoint name, from the HF tensors (the mapping written
    out for the check): query_key_value grouped per kv head [nkv, q heads per kv head + 2, d];
    dense_h_to_4h [gate; up]."""
    if name == "tied_modules.embed.word_embeddings.weight":
        return hf["model.embed_tokens.weight"]
    i, rest = name.split(".", 1)
    L = cfg.num_hidden_layers
    if rest == "word_embeddings.weight":
        return hf["model.embed_tokens.weight"]
    if int(i) == L + 3 and rest == "weight":
        return hf["model.norm.weight"]
    if rest == "lm_head.weight":
        return hf["lm_head.weight"]
    p = f"model.layers.{int(i) - 2}."
    if rest == "self_attention.query_key_value.weight":
        nq, nkv, d, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        g = nq // nkv
        q, k, v = (hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        return torch.cat([q.view(nkv, g * d, h), k.view(nkv, d, h), v.view(nkv, d, h)], dim=1).reshape(-1, h)
    if rest == "mlp.dense_h_to_4h.weight":
        return torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
    return hf[p + {"self_attention.dense.weight": "self_attn.o_proj.weight",
                   "mlp.dense_4h_to_h.weight": "mlp.down_proj.weight"}.get(rest, rest)]


def hf_name(name, layers):
    """The checkpoint name's HF tensor (the gpt-neox preset's mapping, written out for the check)."""
    i, rest = name.split(".", 1)
    i = int(i)
    if rest == "word_embeddings.weight":
        return "gpt_neox.embed_in.weight"
    if rest.startswith("norm."):
        return "gpt_neox.final_layer_norm." + rest.split(".")[1]
    if rest == "final_linear.weight":
        return "embed_out.weight"
    return f"gpt_neox.layers.{i - 2}.{rest}"


def run_save(a):
    from transformers import GPTNeoXForCausalLM, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
    torch.manual_seed(SEED)
    cls = {"llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM}.get(FAMILY, GPTNeoXForCausalLM)
    m = cls(config()).float().eval()
    with torch.no_grad():  # transformers zeroes biases at init: give them values, so that each is seen
        g = torch.Generator().manual_seed(SEED + 1)
        for n, p in m.named_parameters():
            if n.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    m.save_pretrained(os.path.join(a.out, "hf"))
    m.save_pretrained(os.path.join(a.out, "hf_sharded"), max_shard_size="100KB")
    with torch.no_grad():
        logits = m(input_ids=ids()).logits
    torch.save({"state": {k: v.clone() for k, v in m.state_dict().items()}, "logits": logits}, os.path.join(a.out, "ref.pt"))
    print(json.dumps({"cmd": "save", "tensors": len(m.state_dict()),
                      "files": sorted(os.listdir(os.path.join(a.out, "hf_sharded")))}))


def run_reload(a):
    """transformers loads a folder ucp exported: the state dict and the logits against the saved model's."""
    from transformers import AutoModelForCausalLM
    ref = torch.load(a.ref, weights_only=False)
    m = AutoModelForCausalLM.from_pretrained(a.hf, attn_implementation="eager").float().eval()
    got, want = m.state_dict(), ref["state"]
    bad = sorted(set(got) ^ set(want))
    bad += [k for k in sorted(set(got) & set(want)) if got[k].shape != want[k].shape or
            not torch.equal(got[k].reshape(-1).view(torch.int32), want[k].reshape(-1).view(torch.int32))]
    with torch.no_grad():
        logits = m(input_ids=ids()).logits
    out = dict(cmd="reload", architecture=type(m).__name__, compared=len(want), differ=bad,
               logits_max_diff=(logits - ref["logits"]).abs().max().item(),
               logits_bitwise=torch.equal(logits, ref["logits"]))
    print(json.dumps(out), flush=True)
    return 1 if bad else 0


# ---- the run setup both families share ----

def pipeline(tp, pp, cfg, layers):
    """Megatron tp groups (mpu.py), a generator seeded otherwise than the HF model (the load must replace its
    init), the vocab-parallel EmbeddingPipe, and a PipelineModule over the specs `layers(gen, EmbeddingPipe)`
    returns with its partition method."""
    import mpu
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    m = mpu.setup(tp, pp)
    gen = torch.Generator().manual_seed(SEED + 7)

    class EmbeddingPipe(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings = mpu.VocabParallelEmbedding(gen, cfg.vocab_size, cfg.hidden_size)

        def forward(self, x):
            return self.word_embeddings(x)

    specs, method = layers(gen, EmbeddingPipe)
    module = PipelineModule(layers=specs, loss_fn=mpu.cross_entropy,
                            topology=PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=m.dp),
                            partition_method=method)
    return module, m


def identity(x):
    return x


# ---- the DeepSpeed model: GPT-NeoX's math, Megatron tp, named as the gpt-neox preset ----

def build(cfg, tp, pp):
    return pipeline(tp, pp, cfg, lambda gen, EmbeddingPipe: neox_layers(cfg, tp, gen, EmbeddingPipe))


def neox_layers(cfg, tp, gen, EmbeddingPipe):
    import mpu
    from deepspeed.pipe import LayerSpec
    from transformers.models.gpt_neox import modeling_gpt_neox as hfm
    h, heads, hn = cfg.hidden_size, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = heads // tp
            self.query_key_value = mpu.ColumnParallelLinear(gen, h, 3 * h, bias=True)
            self.dense = mpu.RowParallelLinear(gen, h, h, bias=True)
            self.rotary = hfm.GPTNeoXRotaryEmbedding(cfg)
            self.training = False

        def forward(self, x):
            b, s, _ = x.shape
            qkv = self.query_key_value(x).view(b, s, -1, 3 * hn).transpose(1, 2)
            q, k, v = qkv.chunk(3, dim=-1)
            pos = torch.arange(s).unsqueeze(0)
            cos, sin = self.rotary(x, pos)
            q, k = hfm.apply_rotary_pos_emb(q, k, cos, sin)
            mask = torch.full((s, s), torch.finfo(x.dtype).min).triu(1)[None, None]
            z, _ = hfm.eager_attention_forward(self, q, k, v, mask, scaling=hn ** -0.5, dropout=0.0)
            return self.dense(z.reshape(b, s, -1).contiguous())

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense_h_to_4h = mpu.ColumnParallelLinear(gen, h, cfg.intermediate_size, bias=True)
            self.dense_4h_to_h = mpu.RowParallelLinear(gen, cfg.intermediate_size, h, bias=True)

        def forward(self, x):
            return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))

    class ParallelTransformerLayerPipe(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
            self.post_attention_layernorm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
            self.attention = Attention()
            self.mlp = MLP()

        def forward(self, x):  # parallel residual, in transformers' order of the sum
            a = self.attention(self.input_layernorm(x))
            return self.mlp(self.post_attention_layernorm(x)) + a + x

    class NormPipe(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)

        def forward(self, x):
            return self.norm(x)

    class ParallelLinearPipe(nn.Module):
        def __init__(self):
            super().__init__()
            self.final_linear = mpu.ColumnParallelLinear(gen, h, cfg.vocab_size)

        def forward(self, x):
            return mpu.gather_from_tp(self.final_linear(x))

    specs = [LayerSpec(EmbeddingPipe), identity]
    specs += [LayerSpec(ParallelTransformerLayerPipe) for _ in range(cfg.num_hidden_layers)]
    specs += [identity, LayerSpec(NormPipe), LayerSpec(ParallelLinearPipe)]
    return specs, "type:transformer|mlp"


def build_llama(cfg, tp, pp):
    """Megatron-DeepSpeed's GPTModelPipe as Llama (its layer list and names: embedding, a lambda, the
    transformer layers, a lambda, the final RMSNorm whose own param is `weight`, the LM head), Megatron tp,
    with transformers' Llama functions for the norms, rotary and attention (GQA: repeat_kv)."""
    return pipeline(tp, pp, cfg, lambda gen, EmbeddingPipe: llama_layers(cfg, gen, EmbeddingPipe))


def llama_layers(cfg, gen, EmbeddingPipe):
    import mpu
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    from transformers.models.llama import modeling_llama as hfm
    h, nq, nkv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = nq // nkv

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            # rows grouped per kv head: [nkv, g + 2, d]; each tp rank holds whole kv groups
            self.query_key_value = mpu.ColumnParallelLinear(gen, h, (nq + 2 * nkv) * d)
            self.dense = mpu.RowParallelLinear(gen, nq * d, h, bias=False)
            self.rotary = hfm.LlamaRotaryEmbedding(cfg)
            self.num_key_value_groups = g
            self.training = False

        def forward(self, x):
            b, s, _ = x.shape
            qkv = self.query_key_value(x).view(b, s, -1, g + 2, d)
            q = qkv[:, :, :, :g].reshape(b, s, -1, d).transpose(1, 2)
            k = qkv[:, :, :, g].transpose(1, 2)
            v = qkv[:, :, :, g + 1].transpose(1, 2)
            cos, sin = self.rotary(x, torch.arange(s).unsqueeze(0))
            q, k = hfm.apply_rotary_pos_emb(q, k, cos, sin)
            mask = torch.full((s, s), torch.finfo(x.dtype).min).triu(1)[None, None]
            z, _ = hfm.eager_attention_forward(self, q, k, v, mask, scaling=d ** -0.5, dropout=0.0)
            return self.dense(z.reshape(b, s, -1).contiguous())

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense_h_to_4h = mpu.ColumnParallelLinear(gen, h, 2 * cfg.intermediate_size)
            self.dense_4h_to_h = mpu.RowParallelLinear(gen, cfg.intermediate_size, h, bias=False)

        def forward(self, x):  # swiglu: this rank's [gate_r; up_r]
            gate, up = self.dense_h_to_4h(x).chunk(2, dim=-1)
            return self.dense_4h_to_h(F.silu(gate) * up)

    class ParallelTransformerLayerPipe(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = hfm.LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
            self.self_attention = Attention()
            self.post_attention_layernorm = hfm.LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
            self.mlp = MLP()

        def forward(self, x):  # transformers' order of the residual sums
            x = x + self.self_attention(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class LMHeadPipe(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = mpu.ColumnParallelLinear(gen, h, cfg.vocab_size)

        def forward(self, x):
            return mpu.gather_from_tp(self.lm_head(x))

    def tied_logits(embed, x):  # the tied head: logits of the vocab-split embedding, gathered
        return mpu.parallel_logits(x, embed.word_embeddings.weight)

    first = TiedLayerSpec("embed", EmbeddingPipe, tied_weight_attr="word_embeddings.weight") if TIED else LayerSpec(EmbeddingPipe)
    specs = [first, identity]
    specs += [LayerSpec(ParallelTransformerLayerPipe) for _ in range(cfg.num_hidden_layers)]
    specs += [identity, LayerSpec(hfm.LlamaRMSNorm, h, eps=cfg.rms_norm_eps)]
    specs += [TiedLayerSpec("embed", EmbeddingPipe, forward_fn=tied_logits, tied_weight_attr="word_embeddings.weight")
              if TIED else LayerSpec(LMHeadPipe)]
    return specs, "type:transformer"


def split_of(name):
    import re
    for pat, dim in (LLAMA_SPLITS if llama_like() else SPLITS):
        if re.search(pat, name):
            return dim
    raise KeyError(name)


def expected(name, hf, m, layers, cfg=None):
    """This rank's slice of the HF tensor the checkpoint name `name` holds."""
    full = llama_full(name, hf, cfg) if llama_like() else hf[hf_name(name, layers)]
    dim = split_of(name)
    if dim == "gate_up":  # swiglu: this rank's rows of the gate and of the up projection
        return torch.cat([half.chunk(m.tp, 0)[m.tp_rank] for half in full.chunk(2, 0)])
    return full if dim is None else full.chunk(m.tp, dim)[m.tp_rank]


def run_load(rank, a, port):
    global FAMILY, TIED
    FAMILY, TIED = a.family, a.tied  # spawned processes import the module afresh
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    store = dist.TCPStore("127.0.0.1", port, a.world, rank == 0, use_libuv=False, timeout=timedelta(seconds=600))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=a.world)
    import deepspeed
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = config()
    ref = torch.load(a.ref, weights_only=False)
    hf = ref["state"]
    module, m = (build_llama if llama_like() else build)(cfg, a.tp, a.pp)
    layers = cfg.num_hidden_layers
    if a.init == "hf":
        with torch.no_grad():
            for n, p in module.named_parameters():
                p.copy_(expected(n, hf, m, layers, cfg))
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
          "zero_optimization": {"stage": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                                     "weight_decay": 0.1, "torch_adam": True}},
          "zero_allow_untested_optimizer": True, "gradient_clipping": 1.0, "steps_per_print": 100000}
    if a.file_hp:  # the hyper-parameters ucp's fresh optimizer state records (DeepSpeed's defaults)
        ds["optimizer"]["params"].update(lr=1e-3, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=ds)
    take = engine._take_model_step  # as realds/worker/jobs.py: the step under no_grad (gloo, autograd views)

    def take_model_step(*args, **kwargs):
        with torch.no_grad():
            return take(*args, **kwargs)
    engine._take_model_step = take_model_step
    if a.init == "ckpt":
        path, _ = engine.load_checkpoint(a.ckpt, load_module_only=not a.full_load)
        if path is None:
            raise SystemExit(f"DeepSpeed loaded nothing from {a.ckpt}")
    # 1. every loaded weight: its slice of the HF tensor, bitwise.
    bad, n = [], 0
    for name, p in engine.module.named_parameters():
        want = expected(name, hf, m, layers, cfg)
        n += 1
        if p.shape != want.shape or not torch.equal(p.detach().view(-1).view(torch.int32), want.reshape(-1).view(torch.int32)):
            bad.append(name)
    # 2. the logits, stage by stage (activations sent to the same tp rank of the next stage).
    x = ids()
    with torch.no_grad():
        h = x if m.pp_rank == 0 else None
        if m.pp_rank > 0:
            h = torch.empty(x.shape[0], x.shape[1], cfg.hidden_size)
            dist.recv(h, src=rank - m.tp * m.dp)
        out = engine.module(h)
        if m.pp_rank < m.pp - 1:
            dist.send(out.contiguous(), dst=rank + m.tp * m.dp)
    diff = None
    if m.pp_rank == m.pp - 1:
        diff = (out - ref["logits"]).abs().max().item()
        same = torch.equal(out, ref["logits"])
    # 3. one step on a fixed batch; every param after it.
    g = torch.Generator().manual_seed(5)
    seq = torch.randint(0, cfg.vocab_size, (1, SEQ + 1), generator=g)
    hp = {k: engine.optimizer.param_groups[0][k] for k in ("lr", "betas", "eps", "weight_decay")}
    loss = engine.train_batch(data_iter=iter([(seq[:, :-1], seq[:, 1:])]))
    after = {nm: p.detach().clone() for nm, p in engine.module.named_parameters()}
    torch.save(after, f"{a.out}.rank{rank}")
    res = dict(rank=rank, compared=n, differ=bad, logits_max_diff=diff, logits_bitwise=same if diff is not None else None,
               loss=float(loss), hp=str(hp))
    gathered = [None] * a.world
    dist.all_gather_object(gathered, res)
    if rank == 0:
        last = [r for r in gathered if r["logits_max_diff"] is not None]
        out = dict(cmd="load", init=a.init, tp=a.tp, pp=a.pp, compared=sum(r["compared"] for r in gathered),
                   differ=sorted(set(sum((r["differ"] for r in gathered), []))),
                   logits_max_diff=max(r["logits_max_diff"] for r in last),
                   logits_bitwise=all(r["logits_bitwise"] for r in last), loss=gathered[-1]["loss"],
                   hyper_parameters=gathered[0]["hp"])
        print(json.dumps(out), flush=True)
        if out["differ"] or out["compared"] == 0:
            sys.stdout.flush()
            os._exit(1)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["save", "load", "reload"])
    ap.add_argument("--out", default="")
    ap.add_argument("--hf", default="", help="reload: the folder ucp exported")
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--ref", default="")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--init", choices=["ckpt", "hf"], default="ckpt")
    ap.add_argument("--full_load", action="store_true", help="a plain load_checkpoint (optimizer state too)")
    ap.add_argument("--file_hp", action="store_true", help="the job's hyper-parameters = the file's (lr 1e-3, wd 0.01)")
    ap.add_argument("--family", choices=["neox", "llama", "mistral", "qwen2"], default="neox")
    ap.add_argument("--tied", action="store_true", help="llama, mistral: tie_word_embeddings")
    a = ap.parse_args()
    global FAMILY, TIED
    FAMILY, TIED = a.family, a.tied
    if a.cmd == "save":
        return run_save(a)
    if a.cmd == "reload":
        sys.exit(run_reload(a))
    a.world = a.tp * a.pp
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    # Imported once, then the ranks forked: spawned ranks would each import torch, DeepSpeed and transformers
    # again (seconds per rank on two cores).
    import deepspeed  # noqa: F401
    import transformers  # noqa: F401
    mp.start_processes(run_load, args=(a, port), nprocs=a.world, join=True, start_method="fork")


if __name__ == "__main__":
    main()
