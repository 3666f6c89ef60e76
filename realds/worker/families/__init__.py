# Model families of the real-DeepSpeed tests (runs in a Debian root; see
# realds/README.md, "Adding a model family"). A family is a module of this
# package that defines:
#
#   add_args(parser)        its knobs (a case's `model { args: "--hidden 32 ..." }`)
#   SPLITS                  [(regex, dim or None)]: how each param (and buffer) splits
#                           over tp, from the model's own code; None = replicated. The
#                           oracle merges tp slices with it, never with ucp's rules.
#   build(cfg, topo)        -> Built: the module for this rank, its optimizer param
#                           groups, and how to run it (pipeline or plain, mpu, loss)
#   client_state(cfg, topo, iteration)   what the training code passes to save_checkpoint
#
# and may define `global_name(name)` (MoE experts under their global ids).
# cfg is the parsed family args plus the case's `dtype` and `seed`; topo is a
# dict {tp, pp, dp, ep}.
import argparse
import importlib
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch


@dataclass
class Built:
    module: Any                      # nn.Module or deepspeed.pipe.PipelineModule
    param_groups: List[dict]         # for deepspeed.initialize(model_parameters=...)
    pipeline: bool = False           # PipelineModule: trained with engine.train_batch
    mpu: Any = None                  # passed to deepspeed.initialize (plain modules at tp > 1)
    loss: Optional[Callable] = None  # plain modules: loss(engine, inputs, labels)
    tp_rank: int = 0
    pp_rank: int = 0
    dp_rank: int = 0
    ep_rank: int = 0
    records_losses: bool = True      # this rank records the per-sample losses
    global_name: Callable = field(default=lambda n: n)


def get(name):
    try:
        return importlib.import_module(f"families.{name}")
    except ModuleNotFoundError as e:
        raise SystemExit(f"no model family '{name}' (realds/worker/families/{name}.py): {e}")


def common_args(ap):
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--seq", type=int, default=8)


def parse(family, args, dtype, seed):
    ap = argparse.ArgumentParser(prog=f"model family {family.__name__}", add_help=False)
    family.add_args(ap)
    cfg = ap.parse_args(shlex.split(args or ""))
    cfg.dtype = dtype or "fp32"
    cfg.seed = seed
    return cfg


def sample(cfg, data_seed, step, index):
    """The training sample `index` of step `step`: a function of the case's data
    seed only, so every topology sees the same global batch."""
    g = torch.Generator().manual_seed(data_seed * 1000003 + step * 1009 + index)
    s = torch.randint(0, cfg.vocab, (1, cfg.seq + 1), generator=g)
    return s[:, :-1], s[:, 1:]


def split_dim(splits, name):
    import re
    for pat, dim in splits:
        if re.search(pat, name):
            return dim
    raise KeyError(name)
