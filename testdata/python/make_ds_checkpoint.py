"""Writes a DeepSpeed 0.14.4 ZeRO checkpoint folder for a small synthetic model.

An independent writer for interop tests: it is derived from DeepSpeed 0.14.4's
source (read, not copied), never from ucp's C++, and runs on Debian's
/usr/bin/python3 + python3-torch without DeepSpeed (ds_stubs.py supplies the
classes DeepSpeed pickles). What it mirrors:

  deepspeed/runtime/engine.py        save_checkpoint, _save_checkpoint (mp_rank
      files: key order, param_shapes from the optimizer's flat groups,
      frozen_param_shapes / frozen_param_fragments only when gradients are
      partitioned (ZeRO-2), shared_params computed on global rank 0 only),
      _save_zero_checkpoint, _get_rank_zero_ckpt_name (`bf16_` prefix iff
      bf16 is enabled), `latest`
  deepspeed/runtime/pipe/module.py   PipelineModule: `tied_modules` registered
      before the layers, layer i registered as module "i", _partition_layers
      (uniform / parameters / type:), save_state_dict (dp rank 0 writes one
      file per layer that has a state_dict, tensors cloned; a TiedLayerSpec
      with forward_fn is a functools.partial and gets no file),
      ckpt_layer_path (`layer_XX-model_YY-model_states.pt`)
  deepspeed/runtime/utils.py          align_dense_tensors, partition_uniform,
      partition_balanced
  deepspeed/runtime/zero/stage_1_and_2.py  flat groups aligned to
      nccl_start_alignment_factor (2) * dp, padding recorded on the last rank
      only, lp params re-pointed into the flat buffer, fp32 partition a clone,
      state_dict (11 keys; single_partition_of_fp32_groups = group[:lean], a
      view; base_optimizer_state = the torch optimizer's state_dict since
      elastic_checkpoint is off)
  deepspeed/runtime/bf16_optimizer.py state_dict (7 keys; fp32 partitions
      saved whole, padding included)
  deepspeed/utils/mixed_precision_linkage.py, tensor_fragment.py
      (param_slice_mappings: fragment_address(numel, start) of every param
      overlapping a partition)
  deepspeed/runtime/fp16/loss_scaler.py  CreateLossScaler (LossScaler(1.0),
      DynamicLossScaler for fp16)
  deepspeed/checkpoint/ds_to_universal.py  what the universal files of each
      param hold (for expected.pt)

usage: make_ds_checkpoint.py SPEC OUTPUT_ROOT [--tp N] [--pp N] [--dp N] [--tag TAG]
                             [--set KEY=JSON ...]
  SPEC is a JSON file or inline JSON (starting with '{'); --tp/--pp/--dp
  override its topology and --set any value (by dotted path), so one model can be
  written at several topologies and in several layouts (values depend only on
  the seed and the tensor names, never on topology or layout).

Writes:
  OUTPUT_ROOT/<tag>/...                   the checkpoint
  OUTPUT_ROOT/latest                      the tag
  OUTPUT_ROOT/expected.pt                 name -> {kind, fp32, exp_avg, exp_avg_sq,
                                          step, keys, ...} for trainable params and
                                          name -> {kind, lp, role, keys} for frozen
                                          params and buffers: the full (tp-merged,
                                          unpartitioned, vocab padding stripped)
                                          tensors, computed from the model itself
  OUTPUT_ROOT/expected_optimizer_state.pt what ds_to_universal writes as
                                          zero/optimizer_state.pt
  OUTPUT_ROOT/rules.textproto             the spec's split kinds as a ucp
                                          MergeRules textproto
  OUTPUT_ROOT/expected_inspect.textproto  the InspectReport (proto/ucp.proto) of
                                          the folder, from this writer's bookkeeping
  OUTPUT_ROOT/layout.json                 topology, stage boundaries, group
                                          paddings, params straddling dp ranks

Spec (JSON):
  {
    "seed": 1234, "global_steps": 4, "skipped_steps": 0, "tag": "global_step4",
    "tp": 2, "pp": 1, "dp": 2,
    "micro_batch": 1, "train_batch_size": 12,   # ds_config; gas = tbs / (micro * dp)
    "zero_stage": 1,                  # 1 or 2
    "optimizer": "zero",              # "zero" (DeepSpeedZeroOptimizer) or "bf16"
                                      # (BF16_Optimizer: bf16 + ZeRO-1 + fp32 grad accum)
    "lp_dtype": "fp32",               # fp32, fp16 or bf16
    "make_vocab_size_divisible_by": 8,
    "vocab_padding": "zero",          # values of the vocab padding rows: zero or random
    "param_groups": [{}, {"weight_decay": 0.0}],   # client options per group
    "partition_method": "parameters", # PipelineModule partition_method
    "uc_info": "empty",               # universal_checkpoint_info: empty, none or patterns
    "layers": [...],                  # a PipelineModule, or
    "module": [...],                  # a plain nn.Module (its `module` state dict in
                                      # mp_rank files)
    "tied": {"embed": [...]},         # tied modules (pipeline only)
    "args": {"swiglu": true, ...}     # extra entries of the client state's args
  }
  A layer is {"module": [tensors], "type": "ClassName"}, {"function": "name"} or
  {"tied": "key", "forward_fn": bool}. A tensor is
  {"name": "attention.dense.weight", "shape": [16, 16], "split": "row",
   "group": 0, "frozen": false, "buffer": false}
  with split one of replicated, column, row, vocab (shape = unpadded vocab rows),
  sub2 (2 fused sub-params cut on dim 0); or {"name": "sequential.1",
  "empty_module": true} for a submodule without tensors, or {"name": "lm_head.weight",
  "tie": "embed.weight"} for a tied alias of an earlier tensor (plain modules). Tensor names are module
  paths; module order (state dicts, named_parameters, flatten order) is
  nn.Module's. The tp split of a tensor is Megatron's: column and vocab cut
  dim 0, row dim 1, sub2 cuts each half of dim 0; vocab rows are padded to a
  multiple of make_vocab_size_divisible_by * tp first.
"""
import argparse
import collections
import json
import os
import random
import re
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402  (registers DeepSpeed's pickled classes)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

DS_VERSION = "0.14.4"
NCCL_START_ALIGNMENT_FACTOR = 2  # stage_1_and_2.py / bf16_optimizer.py
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SPLITS = ("replicated", "column", "row", "vocab", "sub2")


# ---------------------------------------------------------------------------
# DeepSpeed's partition helpers (deepspeed/runtime/utils.py), re-written.

def partition_uniform(num_items, num_parts):
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk = num_items // num_parts
    residual = num_items - chunk * num_parts
    parts = [p * chunk for p in range(num_parts + 1)]
    for i in range(residual):
        for j in range(i + 1, num_parts + 1):
            parts[j] += 1
    return parts


def partition_balanced(weights, num_parts):
    """The linear partition DP, with DeepSpeed's tie-breaking (>= keeps the last k)."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = float("inf")
    dp_max = np.full((n + 1, m + 1), inf)
    dp_min = np.full((n + 1, m + 1), inf)
    dp_cost = np.full((n + 1, m + 1), inf)
    position = np.zeros((n + 1, m + 1), dtype=int)
    prefix = np.zeros(n + 1)
    prefix[1:] = np.cumsum(weights)
    dp_max[0, 0] = 0
    dp_cost[0, 0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                hi = max(dp_max[k, j - 1], prefix[i] - prefix[k])
                lo = min(dp_min[k, j - 1], prefix[i] - prefix[k])
                if dp_cost[i, j] >= hi - lo:
                    dp_cost[i, j] = hi - lo
                    dp_max[i, j] = hi
                    dp_min[i, j] = lo
                    position[i, j] = k
    parts = [n]
    for j in reversed(range(1, m + 1)):
        parts.append(int(position[parts[-1], j]))
    parts.reverse()
    return parts


# ---------------------------------------------------------------------------
# The model: full tensors per name, deterministic from (seed, name, state).

class Tensor:
    """One tensor of the spec, at full (tp=1) size."""

    def __init__(self, d, prefix=""):
        self.local = d["name"]
        self.name = prefix + d["name"]
        # A submodule without tensors of its own, declared for its place in the
        # module tree (state dict `_metadata`, e.g. a parameter-less block).
        self.empty_module = bool(d.get("empty_module", False))
        self.shape = list(d.get("shape", []))
        self.split = d.get("split", "replicated")
        if self.split not in SPLITS:
            raise SystemExit(f"{self.name}: unknown split {self.split!r}")
        self.group = int(d.get("group", 0))
        self.frozen = bool(d.get("frozen", False))
        self.buffer = bool(d.get("buffer", False))
        # A tied alias: the same nn.Parameter as the tensor named here,
        # registered under a second name (named_parameters() lists it once;
        # state_dict() and engine._get_shared_params see both names).
        self.tie = d.get("tie")

    @property
    def trainable(self):
        return not self.frozen and not self.buffer and not self.empty_module and not self.tie

    @property
    def role(self):
        return "buffer" if self.buffer else "frozen" if self.frozen else "trainable"


def _generator(seed, name, state):
    g = torch.Generator()
    g.manual_seed((seed * 1000003 + zlib.crc32(f"{name}/{state}".encode())) & 0x7FFFFFFFFFFF)
    return g


def padded_vocab(rows, divisible_by, tp):
    multiple = divisible_by * tp
    return ((rows + multiple - 1) // multiple) * multiple


class Model:
    def __init__(self, spec):
        self.spec = spec
        self.seed = int(spec.get("seed", 1234))
        self.divisible_by = int(spec.get("make_vocab_size_divisible_by", 8))
        self.vocab_padding = spec.get("vocab_padding", "zero")
        self.lp_dtype = DTYPES[spec.get("lp_dtype", "fp32")]
        self._full = {}

    def full(self, t, state, tp):
        """The full tensor of `t` for `state` at tp degree `tp` (vocab rows padded for tp)."""
        key = (t.name, state)
        if key not in self._full:
            g = _generator(self.seed, t.name, state)
            shape = list(t.shape)
            if state == "exp_avg_sq":
                v = torch.rand(shape, generator=g, dtype=torch.float32) * 1e-4
            elif state == "exp_avg":
                v = torch.randn(shape, generator=g, dtype=torch.float32) * 1e-2
            else:  # fp32 masters, and frozen params / buffers before the lp cast
                v = torch.randn(shape, generator=g, dtype=torch.float32) * 0.05
            self._full[key] = v
        v = self._full[key]
        if t.split == "vocab":
            rows = padded_vocab(t.shape[0], self.divisible_by, tp)
            extra = rows - t.shape[0]
            if self.vocab_padding == "random":
                g = _generator(self.seed, t.name, f"{state}/padding/{extra}")
                pad = torch.rand([extra] + t.shape[1:], generator=g, dtype=torch.float32) * 1e-3
            else:
                pad = torch.zeros([extra] + t.shape[1:], dtype=torch.float32)
            v = torch.cat([v, pad], dim=0)
        return v

    def value(self, t, state, tp):
        """`full` in the dtype the checkpoint holds it: lp for module tensors outside the optimizer."""
        v = self.full(t, "fp32" if state == "lp" else state, tp)
        return v.to(self.lp_dtype) if state == "lp" else v


def tp_slice(full, split, tp, rank):
    """The tp slice of rank `rank` (Megatron's column/row/vocab-parallel layers)."""
    if split == "replicated":
        return full.clone()
    if split in ("column", "vocab"):
        return full.chunk(tp, dim=0)[rank].clone()
    if split == "row":
        return full.chunk(tp, dim=1)[rank].clone()
    if split == "sub2":
        a, b = full.chunk(2, dim=0)
        return torch.cat([a.chunk(tp, dim=0)[rank], b.chunk(tp, dim=0)[rank]], dim=0)
    raise ValueError(split)


def slice_shape(t, tp, divisible_by):
    shape = list(t.shape)
    if t.split == "vocab":
        shape[0] = padded_vocab(shape[0], divisible_by, tp) // tp
    elif t.split in ("column", "sub2"):
        shape[0] //= tp
    elif t.split == "row":
        shape[1] //= tp
    return shape


# ---------------------------------------------------------------------------
# Modules.

def build_module(tensors, model, tp, rank):
    """An nn.Module holding `tensors` (local names are module paths) at tp rank `rank`."""
    root = nn.Module()
    for t in tensors:
        parts = t.local.split(".")
        mod = root
        for p in parts if t.empty_module else parts[:-1]:
            if p not in mod._modules:
                mod.add_module(p, nn.Module())
            mod = mod._modules[p]
        if t.empty_module:
            continue
        if t.tie:
            owner = root
            for q in t.tie.split("."):
                owner = getattr(owner, q)
            mod.register_parameter(parts[-1], owner)
            continue
        value = tp_slice(model.value(t, "fp32" if t.trainable else "lp", tp), t.split, tp, rank)
        if t.trainable:
            value = value.to(model.lp_dtype)  # replaced by a view into the flat buffer below
        if t.buffer:
            mod.register_buffer(parts[-1], value, persistent=True)
        else:
            mod.register_parameter(parts[-1], nn.Parameter(value, requires_grad=t.trainable))
    return root


class Layer:
    def __init__(self, index, d, tied):
        self.index = index
        if "module" in d:
            self.kind = "module"
            self.tensors = [Tensor(x, f"{index}.") for x in d["module"]]
            self.type = d.get("type", "Layer")
        elif "tied" in d:
            self.kind = "tied"
            self.key = d["tied"]
            if self.key not in tied:
                raise SystemExit(f"layer {index}: unknown tied module {self.key!r}")
            self.tensors = tied[self.key]
            self.forward_fn = bool(d.get("forward_fn", False))
            self.type = d.get("type", "TiedLayer")
        elif "function" in d:
            self.kind = "function"
            self.tensors = []
            self.type = d["function"]
        else:
            raise SystemExit(f"layer {index}: expected module, tied or function")


class StageModel:
    """The module a (pipeline stage, tp rank) holds: a PipelineModule slice or a plain module."""

    def __init__(self, ckpt, stage, rank):
        self.stage, self.rank = stage, rank
        model, tp = ckpt.model, ckpt.tp
        self.layer_modules = []  # (layer index, module or None for a partial), in layer order
        if ckpt.pipeline:
            # PipelineModule.__init__ assigns self.tied_modules before _build()
            # registers the layers, so tied params come first in named_parameters.
            self.root = nn.Module()
            self.root.add_module("tied_modules", nn.ModuleDict())
            start, stop = ckpt.parts[stage], ckpt.parts[stage + 1]
            for layer in ckpt.layers[start:stop]:
                if layer.kind == "module":
                    m = build_module(layer.tensors, model, tp, rank)
                    self.root.add_module(str(layer.index), m)
                    self.layer_modules.append((layer.index, m))
                elif layer.kind == "tied":
                    if layer.key not in self.root.tied_modules:
                        self.root.tied_modules[layer.key] = build_module(layer.tensors, model, tp, rank)
                    m = self.root.tied_modules[layer.key]
                    # forward_fn: functools.partial(forward_fn, module) has no state_dict.
                    self.layer_modules.append((layer.index, None if layer.forward_fn else m))
        else:
            self.root = build_module(ckpt.module_tensors, model, tp, rank)
        self.by_name = {}
        for name, p in self.root.named_parameters():
            self.by_name[name] = p
        self.tensor_of = {}  # full name -> Tensor spec
        for t in ckpt.all_tensors:
            self.tensor_of[t.name] = t


# ---------------------------------------------------------------------------
# The checkpoint.

class Checkpoint:
    def __init__(self, spec):
        self.spec = spec
        self.tp, self.pp, self.dp = int(spec.get("tp", 1)), int(spec.get("pp", 1)), int(spec.get("dp", 1))
        self.zero_stage = int(spec.get("zero_stage", 1))
        self.optimizer = spec.get("optimizer", "zero")
        self.lp_name = spec.get("lp_dtype", "fp32")
        if self.optimizer == "bf16":
            if self.lp_name != "bf16" or self.zero_stage != 1:
                raise SystemExit("BF16_Optimizer needs lp_dtype bf16 and zero_stage 1 (engine.py "
                                 "_do_optimizer_sanity_check)")
        elif self.optimizer != "zero":
            raise SystemExit(f"unknown optimizer {self.optimizer!r}")
        self.model = Model(spec)
        self.global_steps = int(spec.get("global_steps", 4))
        self.skipped_steps = int(spec.get("skipped_steps", 0))
        self.step = float(self.global_steps - self.skipped_steps)
        self.tag = spec.get("tag", f"global_step{self.global_steps}")
        self.pipeline = "layers" in spec
        tied = {k: [Tensor(x, f"tied_modules.{k}.") for x in v] for k, v in spec.get("tied", {}).items()}
        if self.pipeline:
            self.layers = [Layer(i, d, tied) for i, d in enumerate(spec["layers"])]
            self.module_tensors = []
            seen, self.all_tensors = set(), []
            for layer in self.layers:
                for t in layer.tensors:
                    if t.name not in seen and not t.empty_module:
                        seen.add(t.name)
                        self.all_tensors.append(t)
            self.parts = self._partition()
        else:
            if self.pp != 1:
                raise SystemExit("a plain nn.Module has no pipeline stages: pp must be 1")
            self.layers = []
            self.module_tensors = [Tensor(x) for x in spec["module"]]
            self.all_tensors = [t for t in self.module_tensors if not t.empty_module]
            self.parts = [0, 0]
        if self.pipeline and self.zero_stage == 2:
            raise SystemExit("ZeRO-2 cannot run under a PipelineModule (pipe/engine.py asserts stage < 2)")
        self.num_groups = 1 + max((t.group for t in self.all_tensors if t.trainable), default=0)
        self.group_options = spec.get("param_groups", [{} for _ in range(self.num_groups)])
        if len(self.group_options) != self.num_groups:
            raise SystemExit(f"param_groups lists {len(self.group_options)} groups, params use {self.num_groups}")
        self.stages = [[StageModel(self, s, r) for r in range(self.tp)] for s in range(self.pp)]
        self.config = self._ds_config()

    # PipelineModule._partition_layers / _count_layer_params.
    def _partition(self):
        method = self.spec.get("partition_method", "parameters").lower()
        n = len(self.layers)
        if method == "uniform":
            return partition_uniform(n, self.pp)
        if method == "parameters":
            weights = []
            for layer in self.layers:
                weights.append(sum(_numel(slice_shape(t, self.tp, self.model.divisible_by))
                                   for t in layer.tensors if t.trainable))
            return partition_balanced(weights, self.pp)
        if method.startswith("type:"):
            rx = re.compile(method.split(":", 1)[1], re.IGNORECASE)
            # _find_layer_type: a LayerSpec's class name, a function's __name__.
            weights = [1 if rx.search(layer.type) else 0 for layer in self.layers]
            return partition_balanced(weights, self.pp)
        raise SystemExit(f"partition method {method!r} not implemented")

    def _ds_config(self):
        micro = int(self.spec.get("micro_batch", 1))
        tbs = int(self.spec.get("train_batch_size", 12))
        if tbs % (micro * self.dp):
            raise SystemExit(f"train_batch_size {tbs} is not a multiple of micro batch {micro} x dp {self.dp}")
        c = {
            "train_batch_size": tbs,
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": tbs // (micro * self.dp),
            "gradient_clipping": 1.0,
            "steps_per_print": 1,
            "wall_clock_breakdown": False,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-08,
                                                      "weight_decay": 0.01}},
            "zero_optimization": {"stage": self.zero_stage, "allgather_partitions": True, "reduce_scatter": True,
                                  "overlap_comm": False, "contiguous_gradients": True,
                                  "allgather_bucket_size": 500000000.0, "reduce_bucket_size": 500000000.0},
            "checkpoint": {"load_universal": False},
        }
        if self.lp_name == "fp16":
            c["fp16"] = {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 1000, "hysteresis": 2,
                         "min_loss_scale": 1}
        elif self.lp_name == "bf16":
            c["bf16"] = {"enabled": True}
            if self.optimizer == "bf16":
                c["data_types"] = {"grad_accum_dtype": "fp32"}
        return c

    # ---- flat groups of one (stage, tp rank) --------------------------------
    def flat_groups(self, stage, rank):
        """Per group: its params (names, specs, nn.Parameters re-pointed into the flat
        lp buffer), the flat fp32/exp_avg/exp_avg_sq buffers, numel and padded numel."""
        sm = self.stages[stage][rank]
        groups = []
        for g in range(self.num_groups):
            names, specs, params = [], [], []
            # The client's param groups come from named_parameters(); the ZeRO /
            # bf16 optimizer keeps the params with requires_grad.
            for name, p in sm.root.named_parameters():
                t = sm.tensor_of[name]
                if t.trainable and t.group == g:
                    names.append(name)
                    specs.append(t)
                    params.append(p)
            if not params:
                raise SystemExit(f"stage {stage} has no params in group {g}: DeepSpeed cannot flatten an empty group")
            numel = sum(p.numel() for p in params)
            alignment = NCCL_START_ALIGNMENT_FACTOR * self.dp
            padded = numel + ((alignment - numel % alignment) if numel % alignment else 0)
            flats = {}
            for state in ("fp32", "exp_avg", "exp_avg_sq"):
                pieces = [tp_slice(self.model.full(t, state, self.tp), t.split, self.tp, rank).reshape(-1)
                          for t in specs]
                pieces.append(torch.zeros(padded - numel, dtype=torch.float32))
                flats[state] = torch.cat(pieces)
            # The lp flat buffer (bit16_groups_flat / bf16_groups_flat): after every
            # step the optimizer copies its fp32 partition into it.
            lp_flat = flats["fp32"].to(self.model.lp_dtype)
            # _update_model_bit16_weights / _update_storage_to_flattened_tensor.
            offset = 0
            for p in params:
                p.data = lp_flat.narrow(0, offset, p.numel()).view(p.shape)
                offset += p.numel()
            groups.append(dict(names=names, specs=specs, params=params, flats=flats, lp_flat=lp_flat,
                               numel=numel, padded=padded))
        return groups

    # ---- files ----------------------------------------------------------------
    def write(self, root):
        tag_dir = os.path.join(root, self.tag)
        os.makedirs(tag_dir, exist_ok=False)
        layout = {"topology": {"tp": self.tp, "pp": self.pp, "dp": self.dp}, "zero_stage": self.zero_stage,
                  "optimizer_layout": "bf16" if self.optimizer == "bf16" else "zero",
                  "lp_dtype": {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[self.lp_name],
                  "pipeline": self.pipeline, "parts": self.parts if self.pipeline else [],
                  "bf16_file_prefix": self.lp_name == "bf16", "groups": [], "straddling": [], "files": []}
        optim_common = None
        mappings = {}  # (stage, tp, dp) -> param_slice_mappings
        layer_keys = []  # (layer index, [(key, tensor)] of its tp rank 0 file)
        for s in range(self.pp):
            for r in range(self.tp):
                groups = self.flat_groups(s, r)
                mp_rank = s * self.tp + r
                sm = self.stages[s][r]
                # Layer files (PipelineModule.save_state_dict on dp rank 0).
                for index, m in sm.layer_modules:
                    if m is None:
                        continue
                    sd = _clone_for_save(m.state_dict())
                    name = f"layer_{index:02d}-model_{r:02d}-model_states.pt"
                    torch.save(sd, os.path.join(tag_dir, name))
                    layout["files"].append(name)
                    if r == 0:
                        layer_keys.append((index, list(sd.items())))
                # Model states (engine._save_checkpoint on dp rank 0).
                name = f"mp_rank_{mp_rank:02d}_model_states.pt"
                torch.save(self._model_states(s, r, groups), os.path.join(tag_dir, name))
                layout["files"].append(name)
                # Optimizer states, one file per dp rank.
                for d in range(self.dp):
                    osd = self._optimizer_state_dict(groups, d)
                    prefix = "bf16_" if self.lp_name == "bf16" else ""
                    name = f"{prefix}zero_pp_rank_{d}_mp_rank_{mp_rank:02d}_optim_states.pt"
                    torch.save({"optimizer_state_dict": osd, "ds_config": self.config, "ds_version": DS_VERSION},
                               os.path.join(tag_dir, name))
                    layout["files"].append(name)
                    if s == 0 and r == 0 and d == 0:
                        optim_common = osd
                    mappings[(s, r, d)] = osd["param_slice_mappings"]
                    for g, grp in enumerate(groups):
                        part = grp["padded"] // self.dp
                        for name_, frag in osd["param_slice_mappings"][g].items():
                            t_numel = _numel(sm.by_name[name_].shape)
                            if frag.numel < t_numel and d + 1 < self.dp and frag.start + frag.numel == part:
                                layout["straddling"].append({"stage": s, "tp": r, "group": g, "name": name_,
                                                             "ranks": [d, d + 1]})
                if s == 0 and r == 0:
                    for g, grp in enumerate(groups):
                        layout["groups"].append({"numel": grp["numel"], "padded": grp["padded"],
                                                 "partition": grp["padded"] // self.dp,
                                                 "padding": grp["padded"] - grp["numel"],
                                                 "params": len(grp["names"])})
        with open(os.path.join(root, "latest"), "w") as f:
            f.write(self.tag)
        torch.save(self._expected(), os.path.join(root, "expected.pt"))
        # ds_to_universal._save_optimizer_state, from (pp 0, tp 0, dp 0).
        sharded = ("base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups")
        out = {k: v for k, v in optim_common.items() if k not in sharded}
        out["param_groups"] = optim_common["base_optimizer_state"]["param_groups"]
        torch.save(out, os.path.join(root, "expected_optimizer_state.pt"))
        with open(os.path.join(root, "rules.textproto"), "w") as f:
            f.write(self._rules_textproto())
        with open(os.path.join(root, "layout.json"), "w") as f:
            json.dump(layout, f, indent=1)
        with open(os.path.join(root, "expected_inspect.textproto"), "w") as f:
            f.write(self._inspect_textproto(layout, mappings, layer_keys))
        return layout

    def _inspect_textproto(self, layout, mappings, layer_keys):
        """What `ucp inspect` should report (an InspectReport textproto, see
        proto/ucp.proto), from this writer's own bookkeeping: the layout, then
        the optimizer params as the stages list them (stage 0's groups in
        flatten order, then params first seen in later stages) with every
        fragment, then the module tensors outside the optimizer."""
        dtype_name = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
        out = ['kind: "zero"', f'tag: "{self.tag}"',
               f"topology {{ tp: {self.tp} pp: {self.pp} dp: {self.dp} }}",
               f"zero_stage: {self.zero_stage}", f'optimizer_layout: "{layout["optimizer_layout"]}"',
               f'lp_dtype: "{layout["lp_dtype"]}"', f"pipeline: {'true' if self.pipeline else 'false'}",
               # How `ucp inspect` prints the kind, and that fragments are
               # element ranges of the flat partitions.
               'kind_detail: "ZeRO stage %d, %s optimizer layout"'
               % (self.zero_stage, "BF16_Optimizer" if layout["optimizer_layout"] == "bf16" else "DeepSpeedZeroOptimizer"),
               "fragment_ranges: true"]
        stage_names = []  # [stage][group] -> names
        for s in range(self.pp):
            sm = self.stages[s][0]
            groups = [[] for _ in range(self.num_groups)]
            for name, p in sm.root.named_parameters():
                t = sm.tensor_of[name]
                if t.trainable:
                    groups[t.group].append(name)
            stage_names.append(groups)
        for g, info in enumerate(layout["groups"]):
            paddings = " ".join(f"padding: {info['padding'] if d == self.dp - 1 else 0}" for d in range(self.dp))
            count = sum(len(stage_names[s][g]) for s in range(self.pp))
            out.append(f"group {{ index: {g} numel: {info['numel']} num_params: {count} {paddings} "
                       f"partition_numel: {info['partition']} }}")
        seen = []
        for s in range(self.pp):
            for g in range(self.num_groups):
                for name in stage_names[s][g]:
                    if name not in seen:
                        seen.append(name)
        for name in seen:
            sm0 = next(self.stages[s][0] for s in range(self.pp) if name in self.stages[s][0].by_name)
            t = sm0.tensor_of[name]
            shape = " ".join(f"shape: {x}" for x in slice_shape(t, self.tp, self.model.divisible_by))
            layer = int(name.split(".")[0]) if name.split(".")[0].isdigit() else -1
            frags = []
            for s in range(self.pp):
                if name not in self.stages[s][0].by_name:
                    continue
                for r in range(self.tp):
                    for d in range(self.dp):
                        a = mappings[(s, r, d)][t.group].get(name)
                        if a is None:
                            continue
                        prefix = "bf16_" if self.lp_name == "bf16" else ""
                        frags.append(f'fragment {{ file: "{prefix}zero_pp_rank_{d}_mp_rank_{s * self.tp + r:02d}'
                                     f'_optim_states.pt" tp_rank: {r} pp_rank: {s} dp_rank: {d} '
                                     f"offset: {a.start} numel: {a.numel} }}")
            out.append(f'param {{ name: "{name}" {shape} dtype: "float32" group: {t.group} '
                       + " ".join(frags) + f" layer: {layer} }}")
        # Module tensors outside the optimizer, in file order.
        if self.pipeline:
            entries = []
            for index, items in sorted(layer_keys, key=lambda x: x[0]):
                for key, value in items:
                    full = f"{index}.{key}"
                    layer = next(l for l in self.layers if l.index == index)
                    if layer.kind == "tied":
                        full = f"tied_modules.{layer.key}.{key}"
                    t = next(x for x in self.all_tensors if x.name == full)
                    entries.append((t, index, [f"layer_{index:02d}-model_{r:02d}-model_states.pt"
                                               for r in range(self.tp)]))
        else:
            sd = self.stages[0][0].root.state_dict()
            entries = [(next(x for x in self.all_tensors if x.name == k), -1,
                        [f"mp_rank_{r:02d}_model_states.pt" for r in range(self.tp)]) for k in sd]
        for t, layer, files in entries:
            if t.trainable:
                continue
            # A tied alias has the shape and split of the tensor it names
            # (the same nn.Parameter); it is neither frozen nor a buffer.
            spec = next(x for x in self.all_tensors if x.name == t.tie) if t.tie else t
            shape = slice_shape(spec, self.tp, self.model.divisible_by)
            frags = " ".join(f'fragment {{ file: "{f}" tp_rank: {r} numel: {_numel(shape)} }}'
                             for r, f in enumerate(files))
            out.append(f'param {{ name: "{t.name}" ' + " ".join(f"shape: {x}" for x in shape)
                       + f' dtype: "{dtype_name[self.model.lp_dtype]}" group: -1 frozen: '
                       + ("true" if t.frozen else "false") + f" {frags} layer: {layer} }}")
        out.append(f'ds_version: "{DS_VERSION}"')
        return "\n".join(out) + "\n"

    def _model_states(self, stage, rank, groups):
        sm = self.stages[stage][rank]
        root = sm.root
        partition_gradients = self.zero_stage >= 2
        param_shapes = []
        for grp in groups:
            shapes = collections.OrderedDict()
            for name, p in zip(grp["names"], grp["params"]):
                shapes[name] = p.shape  # a torch.Size
            param_shapes.append(shapes)
        frozen_shapes = frozen_fragments = None
        if partition_gradients:
            frozen_shapes, frozen_fragments = collections.OrderedDict(), collections.OrderedDict()
            for name, p in root.named_parameters():
                if not p.requires_grad:
                    frozen_shapes[name] = p.shape
                    frozen_fragments[name] = p.detach().cpu()
        buffer_names = []

        def walk(module, prefix):
            for n, b in module.named_buffers(recurse=False):
                if b is not None and n not in module._non_persistent_buffers_set:
                    buffer_names.append(prefix + n)
            for n, child in module.named_children():
                walk(child, prefix + n + ".")

        walk(root, "")
        state = dict(
            module=None if self.pipeline else root.state_dict(),
            buffer_names=buffer_names,
            optimizer=None,
            param_shapes=param_shapes,
            frozen_param_shapes=frozen_shapes,
            shared_params=self._shared_params(stage, rank),
            frozen_param_fragments=frozen_fragments,
            lr_scheduler=None,
            data_sampler=None,
            random_ltd=None,
            sparse_tensor_module_names=set(),
            skipped_steps=self.skipped_steps,
            global_steps=self.global_steps,
            global_samples=self.global_steps * self.config["train_batch_size"],
            dp_world_size=self.dp,
            mp_world_size=self.tp * self.pp,
            ds_config=self.config,
            ds_version=DS_VERSION,
        )
        state.update(self._client_state())
        return state

    def _shared_params(self, stage, rank):
        # engine._get_shared_params: computed on global rank 0 only (pipe stage 0,
        # dp rank 0, tp rank 0), by data_ptr.
        if stage != 0 or rank != 0:
            return {}
        index, shared = {}, {}

        def walk(module, prefix):
            for n, p in module.named_parameters(recurse=False):
                key = prefix + n
                if p.data_ptr() in index:
                    shared[key] = index[p.data_ptr()]
                else:
                    index[p.data_ptr()] = key
            for n, child in module.named_children():
                walk(child, prefix + n + ".")

        walk(self.stages[0][0].root, "")
        return shared

    def _client_state(self):
        # Megatron-style client state, the same on every rank and topology (a
        # resharder cannot map per-rank RNG states across topologies).
        rng = random.Random(self.model.seed)
        np_rng = np.random.RandomState(self.model.seed)
        gen = torch.Generator()
        gen.manual_seed(self.model.seed)
        args = {"num_layers": len(self.layers), "seed": self.model.seed,
                "make_vocab_size_divisible_by": self.model.divisible_by}
        if self.pipeline and self.spec.get("partition_method"):
            args["pipe_partition_method"] = self.spec["partition_method"]
        args.update(self.spec.get("args", {}))  # the training's own (e.g. Megatron's swiglu, heads)
        out = {"iteration": self.global_steps, "args": args, "random_rng_state": rng.getstate(),
               "np_rng_state": np_rng.get_state(), "torch_rng_state": gen.get_state()}
        uc = self.spec.get("uc_info", "empty")
        if uc == "empty":
            out["universal_checkpoint_info"] = {}
        elif uc == "patterns":
            out["universal_checkpoint_info"] = self._uc_patterns()
        return out

    def _uc_patterns(self):
        """Megatron-DeepSpeed's universal_checkpoint_info, with exact-name patterns."""
        lists = collections.OrderedDict([("tp_replicated_parameter_patterns", []),
                                         ("parameter_with_row_parallelism_patterns", []),
                                         ("vocabulary_parameter_patterns", []),
                                         ("parameter_with_2_sub_params_cat_dim_0", [])])
        key = {"replicated": "tp_replicated_parameter_patterns", "row": "parameter_with_row_parallelism_patterns",
               "vocab": "vocabulary_parameter_patterns", "sub2": "parameter_with_2_sub_params_cat_dim_0"}
        vocab = 0
        for t in self.all_tensors:
            if t.split in key:
                lists[key[t.split]].append(re.escape(t.name) + "$")
            if t.split == "vocab":
                vocab = t.shape[0]
        out = dict(lists)
        out["pipeline_replicated_parameter_patterns"] = [re.escape(t.name) + "$" for t in self.all_tensors
                                                         if t.name.startswith("tied_modules.")]
        if vocab:
            out["original_vocab_size"] = vocab
        return out

    def _optimizer_state_dict(self, groups, d):
        dp = self.dp
        partitions, paddings, mappings = [], [], []
        for grp in groups:
            part = grp["padded"] // dp
            start, end = d * part, (d + 1) * part
            # The fp32 partition is a clone of this rank's slice of the flat buffer.
            fp32 = grp["flats"]["fp32"][start:end].clone().detach()
            fp32.requires_grad = True
            exp_avg = grp["flats"]["exp_avg"][start:end].clone()
            exp_avg_sq = grp["flats"]["exp_avg_sq"][start:end].clone()
            padding = grp["padded"] - grp["numel"] if d == dp - 1 else 0
            partitions.append((fp32, exp_avg, exp_avg_sq))
            paddings.append(padding)
            # _init_lp_to_hp_mapping + get_hp_fragment_mapping.
            mapping = collections.OrderedDict()
            offset = 0
            for name, p in zip(grp["names"], grp["params"]):
                lp_end = offset + p.numel()
                if offset < end and lp_end > start:
                    frag_start, frag_end = max(offset, start), min(lp_end, end)
                    assert frag_start < frag_end
                    mapping[name] = ds_stubs.fragment_address(numel=frag_end - frag_start, start=frag_start - start)
                offset = lp_end
            mappings.append(mapping)
        # The client's torch AdamW, its groups re-pointed at the fp32 partitions.
        cfg = self.config["optimizer"]["params"]
        client_groups = []
        for g, opts in enumerate(self.group_options):
            client_groups.append(dict({"params": [partitions[g][0]]}, **opts))
        opt = torch.optim.AdamW(client_groups, lr=cfg["lr"], betas=cfg["betas"], eps=cfg["eps"],
                                weight_decay=cfg["weight_decay"])
        for g, (fp32, exp_avg, exp_avg_sq) in enumerate(partitions):
            # torch.optim.AdamW._init_group: step, exp_avg, exp_avg_sq.
            opt.state[fp32] = {"step": torch.tensor(self.step), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        base = opt.state_dict()
        if self.optimizer == "bf16":
            # BF16_Optimizer.state_dict: 7 keys, fp32 partitions whole.
            state = {}
            state["clip_grad"] = self.config["gradient_clipping"]
            state["base_optimizer_state"] = base
            state["single_partition_of_fp32_groups"] = [p[0] for p in partitions]
            state["group_paddings"] = paddings
            state["partition_count"] = [dp] * len(groups)
            state["ds_version"] = DS_VERSION
            state["param_slice_mappings"] = mappings
            return state
        if self.lp_name == "fp16":
            # CreateLossScaler(dtype=half, dynamic_scaling=True, dynamic_loss_args from the fp16 config).
            fp16 = self.config["fp16"]
            scaler = ds_stubs.DynamicLossScaler(init_scale=2**fp16["initial_scale_power"],
                                                scale_window=fp16["loss_scale_window"],
                                                delayed_shift=fp16["hysteresis"], consecutive_hysteresis=False,
                                                min_scale=fp16["min_loss_scale"], dtype=torch.float16)
            scaler.cur_iter = self.global_steps
        else:
            scaler = ds_stubs.LossScaler(1.0)
        state = {}
        state["loss_scaler"] = scaler
        state["dynamic_loss_scale"] = self.lp_name == "fp16"
        state["overflow"] = False
        state["clip_grad"] = self.config["gradient_clipping"]
        state["base_optimizer_state"] = base
        # _get_groups_without_padding: group[:lean] of the padded partition.
        state["single_partition_of_fp32_groups"] = [p[0][:p[0].numel() - pad] for p, pad in zip(partitions, paddings)]
        state["zero_stage"] = (ds_stubs.ZeroStageEnum.gradients if self.zero_stage >= 2
                               else ds_stubs.ZeroStageEnum.optimizer_states)
        state["group_paddings"] = paddings
        state["partition_count"] = [dp] * len(groups)
        state["ds_version"] = DS_VERSION
        state["param_slice_mappings"] = mappings
        return state

    # ---- expectations -----------------------------------------------------------
    def _expected(self):
        out = {}
        for t in self.all_tensors:
            if t.tie:
                continue  # the owner's tensor
            e = {"kind": t.split, "role": t.role, "group": t.group if t.trainable else -1,
                 "keys": universal_keys(t.split)}
            if t.split in ("column", "vocab"):
                e["cat_dim"] = 0
            elif t.split == "row":
                e["cat_dim"] = 1
            elif t.split == "sub2":
                e["cat_dim"] = 0
                e["param_n_sub_params"] = 2
            rows = t.shape[0]
            if t.trainable:
                for state in ("fp32", "exp_avg", "exp_avg_sq"):
                    v = self.model.full(t, state, 1)[:rows].clone() if t.split == "vocab" \
                        else self.model.full(t, state, 1).clone()
                    if state == "fp32":
                        v.requires_grad_(True)  # DeepSpeed's fp32 masters keep requires_grad
                    e[state] = v
                e["step"] = torch.tensor(self.step)
            else:
                v = self.model.value(t, "lp", 1)
                e["lp"] = v[:rows].clone() if t.split == "vocab" else v.clone()
            out[t.name] = e
        return out

    def _rules_textproto(self):
        kinds = {"replicated": "REPLICATED", "column": "COLUMN", "row": "ROW", "vocab": "VOCAB",
                 "sub2": "SUB_PARAMS"}
        lines = ["# The split kinds of the spec, one exact-name rule per tensor."]
        for t in self.all_tensors:
            extra = ""
            if t.split == "sub2":
                extra = " num_sub_params: 2 cat_dim: 0"
            elif t.split == "vocab":
                extra = f" original_vocab_size: {t.shape[0]}"
            pattern = re.escape(t.name).replace("\\", "\\\\") + "$"
            lines.append(f'rule {{ pattern: "{pattern}" kind: {kinds[t.split]}{extra} }}')
        return "\n".join(lines) + "\n"


def universal_keys(split):
    """The dict keys ds_to_universal.merge_tp_slices writes for fp32/exp_avg/exp_avg_sq."""
    return {"replicated": ["param"], "column": ["cat_dim", "param"], "row": ["cat_dim", "param"],
            "vocab": ["cat_dim", "vocab_tensor", "param"], "sub2": ["cat_dim", "param_n_sub_params", "param"]}[split]


def _clone_for_save(item):
    # deepspeed/checkpoint/utils.py:clone_tensors_for_torch_save
    if torch.is_tensor(item):
        return item.detach().clone()
    if isinstance(item, dict):
        return type(item)({k: _clone_for_save(v) for k, v in item.items()})
    return item


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("output_root")
    ap.add_argument("--tp", type=int)
    ap.add_argument("--pp", type=int)
    ap.add_argument("--dp", type=int)
    ap.add_argument("--tag")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a spec value by its dotted path (list indices are numbers), e.g. "
                         "--set zero_stage=2 --set layers.6.forward_fn=false")
    a = ap.parse_args(argv[1:])
    if a.spec.lstrip().startswith("{"):
        spec = json.loads(a.spec)
    else:
        with open(a.spec) as f:
            spec = json.load(f)
    for item in a.set:
        key, _, value = item.partition("=")
        node, parts = spec, key.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = parts[-1]
        node[int(last) if isinstance(node, list) else last] = json.loads(value)
    for k in ("tp", "pp", "dp", "tag"):
        if getattr(a, k) is not None:
            spec[k] = getattr(a, k)
    torch.manual_seed(0)
    ckpt = Checkpoint(spec)
    layout = ckpt.write(a.output_root)
    print(json.dumps({"tag": ckpt.tag, "parts": layout["parts"], "groups": layout["groups"],
                      "straddling": len(layout["straddling"])}))


if __name__ == "__main__":
    main(sys.argv)
