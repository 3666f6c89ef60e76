# Family `gpt`: a small GPT-like plain nn.Module (tp = 1; no mpu), for ZeRO-1/2/3,
# param groups with their own hyper-parameters, alignment padding (an odd-sized
# 1-D param) and DeepSpeed's native MoE (`deepspeed.moe.layer.MoE`, experts over
# the topology's `ep`). Names: wte, wpe, h.N.{ln_1,qkv,proj,ln_2,mlp}, ln_f, head,
# odd; MoE blocks h.N.mlp.deepspeed_moe.experts.deepspeed_experts.E.{0,2}.*.
# Frozen params (requires_grad False, left out of the optimizer's groups as
# the Hugging Face Trainer does; a group left empty stays in the list):
# --freeze emb (wte, wpe), --freeze lora (everything but LoRA-style adapters
# h.N.qkv_lora_{A,B} of rank --lora_rank beside each qkv, B zero-initialized);
# --tie ties head.weight to wte.weight (DeepSpeed's shared_params).
# From the lab's ds19_train.py (issue 15).
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from families import Built, common_args

# tp = 1 only: nothing is split.
SPLITS = [(r".", None)]


def add_args(ap):
    common_args(ap)
    ap.add_argument("--ffn", type=int, default=2, help="MLP width / hidden")
    ap.add_argument("--odd", type=int, default=0, help="a 1-D param of this many elements (alignment padding)")
    ap.add_argument("--groups", type=int, default=2, choices=[1, 2],
                    help="1: one param group; 2: matrices, and vectors (norms, biases)")
    ap.add_argument("--odd_group", action="store_true",
                    help="the --odd param in a group of its own (with --odd 1 at dp 2, a rank whose partition "
                         "holds nothing but padding)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.01, help="weight decay of group 0")
    ap.add_argument("--lr1", type=float, default=None, help="lr of group 1 (default: --lr)")
    ap.add_argument("--wd1", type=float, default=0.0, help="weight decay of group 1")
    ap.add_argument("--moe_layers", default="", help="comma list of blocks whose MLP is an MoE layer")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--freeze", default="", choices=["", "emb", "lora"],
                    help="emb: freeze wte and wpe; lora: freeze all but adapters beside each qkv")
    ap.add_argument("--lora_rank", type=int, default=2)
    ap.add_argument("--tie", action="store_true", help="head.weight is wte.weight")
    ap.add_argument("--empty", default="", choices=["", "first", "last", "middle"],
                    help="a trained param of zero elements [0, hidden] (DeepSpeed master edaa72212, #8280): first: "
                         "`empty`, offset 0 of group 0; last: `tail.empty`, the end of group 0; middle: `h.0.empty`, "
                         "inside a ZeRO partition (DeepSpeed's link_hp_params asserts at initialize)")


class Block(nn.Module):
    def __init__(self, cfg, moe, ep):
        super().__init__()
        h = cfg.hidden
        self.heads = cfg.heads
        self.ln_1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.lora = cfg.freeze == "lora"
        if self.lora:  # qkv(x) + B(A(x)), B zero-initialized (LoRA)
            self.qkv_lora_A = nn.Linear(h, cfg.lora_rank, bias=False)
            self.qkv_lora_B = nn.Linear(cfg.lora_rank, 3 * h, bias=False)
            nn.init.zeros_(self.qkv_lora_B.weight)
        self.proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.moe = moe
        if moe:
            from deepspeed.moe.layer import MoE
            expert = nn.Sequential(nn.Linear(h, cfg.ffn * h), nn.GELU(), nn.Linear(cfg.ffn * h, h))
            # top-1, no random token selection, no dropped tokens: the routing is a
            # function of the weights and the tokens alone.
            self.mlp = MoE(h, expert, num_experts=cfg.experts, ep_size=ep, k=1, use_rts=False, drop_tokens=False)
        else:
            self.mlp = nn.Sequential(nn.Linear(h, cfg.ffn * h), nn.GELU(), nn.Linear(cfg.ffn * h, h))

    def forward(self, x):
        b, t, h = x.shape
        a = self.ln_1(x)
        qkv = self.qkv(a)
        if self.lora:
            qkv = qkv + self.qkv_lora_B(self.qkv_lora_A(a))
        q, k, v = qkv.split(h, dim=2)
        sh = lambda z: z.view(b, t, self.heads, h // self.heads).transpose(1, 2)
        q, k, v = sh(q), sh(k), sh(v)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (h // self.heads) ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(y)
        m = self.mlp(self.ln_2(x))
        if self.moe:
            m = m[0]
        return x + m


class GPT(nn.Module):
    def __init__(self, cfg, ep):
        super().__init__()
        moe = {int(i) for i in cfg.moe_layers.split(",") if i != ""}
        if cfg.empty == "first":
            self.empty = nn.Parameter(torch.zeros(0, cfg.hidden))
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.seq, cfg.hidden)
        self.h = nn.ModuleList([Block(cfg, i in moe, ep) for i in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.odd = nn.Parameter(torch.randn(cfg.odd) * 0.02) if cfg.odd else None
        if cfg.empty == "middle":
            self.h[0].empty = nn.Parameter(torch.zeros(0, cfg.hidden))
        if cfg.empty == "last":  # a module's own params come before its children's
            self.tail = nn.Module()
            self.tail.empty = nn.Parameter(torch.zeros(0, cfg.hidden))
        self.empty_param = {"first": lambda: self.empty, "middle": lambda: self.h[0].empty,
                            "last": lambda: self.tail.empty}.get(cfg.empty)
        if cfg.tie:
            self.head.weight = self.wte.weight
        for n, p in self.named_parameters():
            if (cfg.freeze == "emb" and n.split(".")[0] in ("wte", "wpe")) or (cfg.freeze == "lora" and "_lora_" not in n):
                p.requires_grad_(False)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        if self.odd is not None:
            x = x * (1 + self.odd.mean())
        if self.empty_param is not None:  # an empty gradient flows to it
            x = x + self.empty_param().sum()
        for blk in self.h:
            x = blk(x)
        logits = self.head(self.ln_f(x)).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def build(cfg, topo):
    import torch.distributed as dist
    if topo["tp"] != 1 or topo["pp"] != 1:
        raise SystemExit("family gpt: tp and pp must be 1 (a plain module without tensor parallelism)")
    ep = topo.get("ep", 1)
    torch.manual_seed(cfg.seed)
    model = GPT(cfg, ep)
    params = [p for p in model.parameters() if p.requires_grad and not (cfg.odd_group and p is model.odd)]
    if cfg.groups == 1:
        groups = [{"params": params, "weight_decay": cfg.wd}]
    else:
        g1 = {"params": [p for p in params if p.dim() < 2], "weight_decay": cfg.wd1}
        if cfg.lr1 is not None:
            g1["lr"] = cfg.lr1
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.wd}, g1]
    if cfg.odd_group and model.odd is not None:
        groups.append({"params": [model.odd], "weight_decay": 0.0})
    if cfg.moe_layers:
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        for i, g in enumerate(groups):  # the MoE splitter keys groups by name
            g["name"] = f"group{i}"
        groups = split_params_into_different_moe_groups_for_optimizer(groups)
    nloc = cfg.experts // ep

    def ep_rank():  # the expert groups exist once deepspeed.initialize has run
        from deepspeed.utils import groups as ds_groups
        return ds_groups._get_expert_parallel_rank(f"ep_size_{ep}") if cfg.moe_layers else 0

    def global_name(n):
        m = re.search(r"deepspeed_experts\.(\d+)\.", n)
        if not m:
            return n
        return n[:m.start(1)] + str(ep_rank() * nloc + int(m.group(1))) + n[m.end(1):]

    built = Built(module=model, param_groups=groups, pipeline=False, loss=lambda engine, x, y: engine(x, y),
                  dp_rank=dist.get_rank(), records_losses=True, global_name=global_name)
    built.ep_rank_fn = ep_rank
    return built


def client_state(cfg, topo, iteration):
    return {"iteration": iteration}
