# One rank of a Hugging Face Trainer run with DeepSpeed (runs in the sid root,
# forked by zygote.py; see realds/README.md, "Hugging Face Trainer"): a tiny
# random-init LlamaForCausalLM built from LlamaConfig, or GPT2LMHeadModel from
# GPT2Config (--arch gpt2; nothing downloaded), optionally with a LayerScale per
# block (--layer_scale), trained by transformers' Trainer with a DeepSpeed
# config, fp32, ZeRO-0, 2 or 3,
# full or LoRA-like (a peft look-alike: peft is not packaged in Debian), saved
# as the Trainer saves (`checkpoint-N/` with `global_stepN/`), and resumed with
# `trainer.train(resume_from_checkpoint=...)`. Nothing of transformers,
# accelerate or DeepSpeed is patched; the three settings the Trainer needs on
# CPU here (../shared/docs/REAL-CLIENTS.md) are: ranks started as a launcher
# starts them (zygote.py forks them with RANK/LOCAL_RANK/WORLD_SIZE, the
# process group already up, USE_LIBUV=0), a `deepspeed` dist-info on
# PYTHONPATH (tools/deepspeed_env.sh), and ACCELERATE_USE_DEEPSPEED=true +
# PartialState(backend="gloo") + accelerator_config use_configured_state.
#
# The spec (driver.py's TrainerCase):
#   mode full|lora, zero_stage, global_batch, seed, model_args, max_steps (the LR
#   schedule's length, equal in every run), save_steps, out (output_dir),
#   resume (a checkpoint-N folder), universal (DeepSpeed's load_universal),
#   stop_at (last step trained), dump_at {step: dir} (state and logits at that
#   step's save), dump_begin (state right after the resume's load),
#   save_begin (the Trainer's own checkpoint right after that load),
#   losses (prefix), records [[last step, name], ...], rng_dump (the RNG states
#   right after the Trainer's _load_rng_state, per process).
#
# Data: sample i is a function of (seed, i); one sample per micro batch, the
# Trainer's sequential sampler, gradient accumulation global_batch / dp: step k
# trains samples [k*B, (k+1)*B) at every dp. Every micro batch's loss is recorded
# (our own cross entropy of the model's logits, float hex) by (step, sample), as
# jobs.py records them, for the oracle's compare_losses.
import json
import math
import os
import random

import numpy as np

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import transformers

import dumps

# Imported once by the worker (its first Trainer job), then shared by every fork:
# transformers loads its modules lazily, so touch what a run uses.
from accelerate import Accelerator, PartialState  # noqa: E402,F401
from transformers import (AutoModelForCausalLM, LlamaForCausalLM, Trainer, TrainerCallback,  # noqa: E402,F401
                          TrainingArguments)
import transformers.integrations.deepspeed  # noqa: E402,F401
import transformers.models.llama.modeling_llama  # noqa: E402,F401

SEQ = 16
# --arch values built by other_config: their config classes
OTHER_ARCHS = {"qwen2": "Qwen2Config", "mistral": "MistralConfig", "gemma": "GemmaConfig",
               "phi3": "Phi3Config", "gpt_neox": "GPTNeoXConfig"}


def add_args(ap):
    ap.add_argument("--mode", default="full", choices=["full", "lora"])
    # llama: LlamaForCausalLM; gpt2: GPT2LMHeadModel (LayerNorms named ln_*,
    # Conv1D weights, lm_head tied to wte; --inter is n_inner, --kv_heads unused);
    # the other decoder families by their own config classes (full mode): qwen2
    # (q/k/v biases), mistral, gemma (tied embeddings, head_dim), phi3 (fused
    # qkv_proj and gate_up_proj), gpt_neox (fused query_key_value, parallel
    # residual; --kv_heads unused)
    ap.add_argument("--arch", default="llama", choices=["llama", "gpt2"] + sorted(OTHER_ARCHS))
    # A LayerScale (DINOv2's layer_scale.lambda1, a 1-D weight) on every block's
    # MLP output: a param the Trainer decays of the shape of the norms it does not
    # (ZeRO-0: only the Trainer's rule settles the param order).
    ap.add_argument("--layer_scale", action="store_true")
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv_heads", type=int, default=2)


def parse_args(text):
    import argparse
    import shlex
    ap = argparse.ArgumentParser(prog="hf_trainer", add_help=False)
    add_args(ap)
    return ap.parse_args(shlex.split(text or ""))


class LoraLinear(nn.Module):
    """Look-alike of peft.tuners.lora.layer.Linear: the same child names
    (base_layer, lora_dropout.default, lora_A.default, lora_B.default), so the
    checkpoint holds peft's exact param names."""

    def __init__(self, base, r=4, alpha=8):
        super().__init__()
        self.base_layer = base
        self.lora_dropout = nn.ModuleDict({"default": nn.Identity()})
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base.in_features, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, base.out_features, bias=False)})
        self.scaling = {"default": alpha / r}
        nn.init.kaiming_uniform_(self.lora_A["default"].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B["default"].weight)  # as peft starts it

    def forward(self, x, *args, **kwargs):
        d = "default"
        return self.base_layer(x, *args, **kwargs) + \
            self.lora_B[d](self.lora_A[d](self.lora_dropout[d](x))) * self.scaling[d]


class LoraModelLike(nn.Module):  # peft.tuners.lora.LoraModel: holds .model
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


class PeftModelLike(nn.Module):  # peft.PeftModel: holds .base_model
    def __init__(self, model):
        super().__init__()
        self.base_model = LoraModelLike(model)
        self.config = model.config

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        return self.base_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)


def llama_config(m):
    return transformers.LlamaConfig(vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.inter,
                                    num_hidden_layers=m.layers, num_attention_heads=m.heads,
                                    num_key_value_heads=m.kv_heads, max_position_embeddings=64,
                                    tie_word_embeddings=False)


def other_config(m):
    """The config of --arch qwen2 / mistral / gemma / phi3 / gpt_neox."""
    common = dict(vocab_size=m.vocab, hidden_size=m.hidden, intermediate_size=m.inter,
                  num_hidden_layers=m.layers, num_attention_heads=m.heads, max_position_embeddings=64)
    if m.arch == "gpt_neox":
        return transformers.GPTNeoXConfig(**common, hidden_dropout=0.0, attention_dropout=0.0,
                                          tie_word_embeddings=False)
    common["num_key_value_heads"] = m.kv_heads
    if m.arch == "gemma":
        return transformers.GemmaConfig(**common, head_dim=m.hidden // m.heads)
    if m.arch == "phi3":
        common["pad_token_id"] = 0  # Phi3Config's default (32000) is past a tiny vocabulary
    return getattr(transformers, OTHER_ARCHS[m.arch])(**common, tie_word_embeddings=False)


def gpt2_config(m):
    return transformers.GPT2Config(vocab_size=m.vocab, n_embd=m.hidden, n_inner=m.inter, n_layer=m.layers,
                                   n_head=m.heads, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                   attn_pdrop=0.0)


class LayerScale(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(h))


def add_layer_scale(model, blocks, h):
    """block.layer_scale.lambda1 scales block.mlp's output (a forward hook: the
    model's own names and code are kept)."""
    for b in blocks:
        b.layer_scale = LayerScale(h)
        b.mlp.register_forward_hook(lambda mod, inp, out, s=b.layer_scale: out * s.lambda1)
    return model


def build_model(m, seed):
    """The same weights at every dp and in every run (the init is a function of
    the seed); the resumed runs overwrite them with the checkpoint's."""
    torch.manual_seed(seed)
    if m.arch == "gpt2":
        if m.mode == "lora":
            raise SystemExit("--arch gpt2: full mode only")
        model = transformers.GPT2LMHeadModel(gpt2_config(m))
        return add_layer_scale(model, model.transformer.h, m.hidden) if m.layer_scale else model
    if m.arch in OTHER_ARCHS:
        if m.mode == "lora" or m.layer_scale:
            raise SystemExit(f"--arch {m.arch}: full mode only, no --layer_scale")
        return transformers.AutoModelForCausalLM.from_config(other_config(m))
    model = transformers.LlamaForCausalLM(llama_config(m))
    if m.layer_scale:
        add_layer_scale(model, model.model.layers, m.hidden)
    if m.mode == "lora":
        for _, mod in list(model.named_modules()):
            for t in ("q_proj", "v_proj"):
                if isinstance(getattr(mod, t, None), nn.Linear):
                    setattr(mod, t, LoraLinear(getattr(mod, t)))
        for n, p in model.named_parameters():
            p.requires_grad = ".lora_A." in n or ".lora_B." in n
        model = PeftModelLike(model)
    return model


def sample(m, seed, i):
    g = torch.Generator().manual_seed(seed * 1000003 + i)
    return torch.randint(0, m.vocab, (SEQ,), generator=g)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, m, seed, n):
        self.m, self.seed, self.n = m, seed, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = sample(self.m, self.seed, i)
        return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x.clone(),
                "idx": torch.tensor(i)}


def probe_input(m, seed):
    """The fixed batch whose logits the export check compares."""
    return torch.stack([sample(m, seed + 7, 100000 + i) for i in range(2)])


class Shim:  # what dumps.dump_state wants of a family's Built
    @staticmethod
    def global_name(n):
        return n


def ds_config(spec):
    z = {"stage": spec["zero_stage"]}
    if spec["zero_stage"] == 3:
        z["stage3_gather_16bit_weights_on_model_save"] = True
    cfg = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
           "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
           "zero_optimization": z, "bf16": {"enabled": spec.get("dtype") == "bf16"}, "fp16": {"enabled": False},
           "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    if spec.get("universal"):
        cfg["checkpoint"] = {"load_universal": True}
    return cfg


def mark(what, t0=[]):
    import time
    t0.append(time.time()) if not t0 else None
    print(f"[trainer_job] {time.time() - t0[0]:7.2f} s {what}", flush=True)


def run(spec, rank, world):
    mark("start")
    if os.environ.get("UCP_TRAINER_STACKS"):
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["UCP_TRAINER_STACKS"]), repeat=True)
    PartialState(backend="gloo")  # before TrainingArguments: adopts the process group (REAL-CLIENTS.md)
    m = parse_args(spec.get("model_args"))
    seed = spec["seed"]
    gb = spec["global_batch"]
    if gb % world:
        raise SystemExit(f"global batch {gb} does not split over dp {world}")
    records = {}
    bounds = spec.get("records") or [[10 ** 9, "all"]]

    def record(step, idx, loss):
        name = next(n for last, n in bounds if step <= last)
        records.setdefault(name, []).append({"step": step, "sample": idx, "loss": loss.hex()})

    class RecordingTrainer(transformers.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            idx = inputs.pop("idx")
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            with torch.no_grad():
                lg = outputs.logits.float()
                per = F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), inputs["labels"][:, 1:].reshape(-1))
            record(self.state.global_step + 1, int(idx.reshape(-1)[0]), per.item())
            return (loss, outputs) if return_outputs else loss

        def _load_rng_state(self, checkpoint):
            # The Trainer restores rng_state_<process_index>.pth (rng_state.pth for one
            # process) at the first step after a resume: what this process holds then.
            super()._load_rng_state(checkpoint)
            if spec.get("rng_dump") and checkpoint is not None:
                os.makedirs(spec["rng_dump"], exist_ok=True)
                torch.save(rng_states(), os.path.join(spec["rng_dump"], f"rng.rank{rank}.pt"))

    holder = {}

    def engine():
        return holder["trainer"].model_wrapped

    def dump(d, step):
        e = engine()
        dumps.dump_state(e, Shim, d, {"tp": 1, "pp": 1, "dp": world, "ep": 1, "tp_rank": 0, "pp_rank": 0,
                                      "dp_rank": rank, "ep_rank": 0})
        t = holder["trainer"]
        extra = {"trainer_global_step": t.state.global_step,
                 "scheduler": {k: v for k, v in t.lr_scheduler.state_dict().items() if k != "lr_lambdas"}}
        if rank == 0:
            with open(os.path.join(d, "trainer.json"), "w") as f:
                json.dump(extra, f, default=str)
        # the trained model's logits on a fixed batch (ZeRO-3: every rank takes part)
        mod = e.module
        with torch.no_grad():
            logits = mod(input_ids=probe_input(m, seed)).logits.detach().clone()
        if rank == 0:
            torch.save(logits, os.path.join(d, "logits.pt"))
        dist.barrier()

    class Hooks(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            mark("train begins (after the resume's load)")
            # after the resume's load (Trainer._prepare_for_training) and before any step
            if spec.get("dump_begin"):
                dump(spec["dump_begin"], state.global_step)
            if spec.get("save_begin"):
                # the Trainer's own save of what it loaded (DeepSpeed's save_checkpoint
                # inside): output_dir/checkpoint-<global_step>
                holder["trainer"]._save_checkpoint(holder["trainer"].model, None)

        def on_step_end(self, args, state, control, **kw):
            # Every process's RNG states its own (rank + 1 draws of each generator per
            # step, before the Trainer saves them), so that the RNG check tells the
            # rng_state_<i>.pth files apart; nothing here trains on random numbers.
            for _ in range(rank + 1):
                random.random()
                np.random.random()
                torch.rand(1)
            if state.global_step >= spec["stop_at"]:
                control.should_training_stop = True
            return control

        def on_save(self, args, state, control, **kw):
            d = (spec.get("dump_at") or {}).get(str(state.global_step))
            if d:
                dump(d, state.global_step)

    args = transformers.TrainingArguments(
        output_dir=spec["out"], max_steps=spec["max_steps"], save_steps=spec.get("save_steps", 3),
        save_strategy="steps", per_device_train_batch_size=1, gradient_accumulation_steps=gb // world,
        learning_rate=1e-3, weight_decay=0.01, warmup_steps=2, lr_scheduler_type="linear", max_grad_norm=1.0,
        logging_steps=1, report_to=[], seed=seed, optim="adamw_torch", deepspeed=ds_config(spec),
        remove_unused_columns=False, dataloader_num_workers=0, save_only_model=False, disable_tqdm=True,
        train_sampling_strategy="sequential", accelerator_config={"use_configured_state": True},
        # bf16 on CPU: TrainingArguments asks for use_cpu (else it wants a GPU)
        bf16=spec.get("dtype") == "bf16", use_cpu=spec.get("dtype") == "bf16")
    model = build_model(m, seed)
    # one epoch of max_steps steps: no epoch boundary, the same samples at every dp
    trainer = RecordingTrainer(model=model, args=args, train_dataset=Tokens(m, seed, gb * spec["max_steps"]),
                               callbacks=[Hooks()])
    holder["trainer"] = trainer
    mark("Trainer made")
    trainer.train(resume_from_checkpoint=spec.get("resume"))
    mark("trained")
    if spec.get("losses"):
        for name, recs in records.items():
            with open(f"{spec['losses']}.{name}.rank{rank}", "w") as f:
                json.dump(recs, f)


def main(spec, rank, world, store_path):
    import deepspeed
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    deepspeed.init_distributed(dist_backend="gloo")  # adopts the process group above
    run(spec, rank, world)
    dist.barrier()
    # No destroy_process_group(): the rank exits right after (zygote.py child(),
    # os._exit), and torch 2.6's gloo teardown here sometimes never returned on
    # one rank of a dp 3 Trainer job after every rank had passed the barrier
    # (a 900 s job timeout in CI; 2 of 12 runs of trainer_bf16's ZeRO-2 cases on
    # a loaded machine, the stuck rank's log last saying "destroy").


def rng_states():
    """This process's RNG states as the Trainer saves them (_save_rng_state, CPU)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}


def same_rng(a, b):
    """Whether two RNG state dicts (python, numpy, cpu) are equal."""
    if a["python"] != b["python"] or not torch.equal(a["cpu"], b["cpu"]):
        return False
    na, nb = a["numpy"], b["numpy"]
    return len(na) == len(nb) and all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
                                      for x, y in zip(na, nb))


def check_rng(given, source, folder, got, world):
    """The RNG states each process of a resumed Trainer run holds right after the
    Trainer's _load_rng_state (got/rng.rank<p>.pt) vs what ucp says it gave that
    process (`given`: {file of the new folder: the source's file}, from ucp's
    summary): the process reads rng_state_<p>.pth (rng_state.pth when alone);
    given one, its states are the source file's (python, numpy, torch CPU), and
    the folder's file is the source's byte for byte; given none, the folder has
    no such file and the process's states are none of the source's files'."""
    problems, parts = [], []
    sources = {f: torch.load(os.path.join(source, f), weights_only=False) for f in sorted(os.listdir(source))
               if f.startswith("rng_state") and f.endswith(".pth")}
    for p in range(world):
        name = "rng_state.pth" if world == 1 else f"rng_state_{p}.pth"
        mine = torch.load(os.path.join(got, f"rng.rank{p}.pt"), weights_only=False)
        have = os.path.isfile(os.path.join(folder, name))
        if name in given:
            src = given[name]
            if not have:
                problems.append(f"process {p}: ucp says it wrote {name} (the source's {src}), the folder has none")
                continue
            with open(os.path.join(folder, name), "rb") as f, open(os.path.join(source, src), "rb") as g:
                if f.read() != g.read():
                    problems.append(f"process {p}: {name} differs from the source's {src}")
            if src not in sources or not same_rng(mine, sources[src]):
                problems.append(f"process {p}: its RNG states after the Trainer's load are not the source's {src}")
            parts.append(f"process {p} <- {src}")
        else:
            if have:
                problems.append(f"process {p}: the folder has {name}, which ucp's summary does not list")
            same = [f for f, st in sources.items() if same_rng(mine, st)]
            if same:
                problems.append(f"process {p}: given no RNG file, it holds the states of the source's {same[0]}")
            parts.append(f"process {p}: none (fresh)")
    distinct = len({bytes(s["cpu"].numpy()) for s in sources.values()})
    line = (f"{', '.join(parts)}: the states each process holds after the Trainer's load "
            f"(source RNG files: {len(sources)}, distinct: {distinct})")
    if distinct < len(sources):
        problems.append(f"the source's {len(sources)} RNG files hold only {distinct} distinct states")
    return {"problems": problems, "line": line}


def check_export(folder, ref, mode, model_args, seed):
    """ucp export's folder (+ config.json) loaded as a user loads it: full models
    with AutoModelForCausalLM.from_pretrained, the LoRA look-alike (peft's names,
    no from_pretrained class without peft) by load_state_dict(strict=True) into
    the same module; its logits on the probe batch vs the trained model's
    (ref/logits.pt, written by the saving run), bitwise."""
    m = parse_args(model_args)
    want = torch.load(os.path.join(ref, "logits.pt"))
    problems = []
    if mode == "full":
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        how = f"AutoModelForCausalLM.from_pretrained -> {type(model).__name__}"
    else:
        from safetensors.torch import load_file
        model = build_model(m, seed + 1)  # other init: every tensor must come from the export
        sd = load_file(os.path.join(folder, "model.safetensors"))
        res = model.load_state_dict(sd, strict=False)
        if res.missing_keys or res.unexpected_keys:
            problems.append(f"missing {res.missing_keys[:3]}, unexpected {res.unexpected_keys[:3]}")
        how = "load_state_dict into the peft look-alike"
    model.eval()
    with torch.no_grad():
        got = model(input_ids=probe_input(m, seed)).logits
    if got.dtype != want.dtype or got.shape != want.shape:
        problems.append(f"logits {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}")
    elif not torch.equal(got, want):
        problems.append(f"logits: {int((got != want).sum())} of {got.numel()} differ, max |diff| "
                        f"{float((got.double() - want.double()).abs().max()):.3g}")
    return {"problems": problems, "line": f"{how}: logits {tuple(got.shape)} " +
            ("bitwise equal to the trained model's" if not problems else "DIFFER")}
