# One rank of one DeepSpeed job (runs in a Debian root, forked by zygote.py; see
# realds/README.md): builds a model family at a topology, hands it to
# deepspeed.initialize, then runs the job's actions in order:
#
#   {"do": "train", "steps": N, "record": R}  N optimizer steps after engine.global_steps,
#                                             recording every sample's loss under R
#   {"do": "save", "dir": D, "tag": T}        engine.save_checkpoint with the family's client state
#   {"do": "load", "dir": D, "tag": T}        engine.load_checkpoint (plain, or universal when
#                                             the job has "universal": true; a plain load checks
#                                             the client state 'args' as GPT-NeoX does); "scramble_frozen":
#                                             frozen params overwritten first (a plain load
#                                             must restore them; a universal one never does)
#   {"do": "dump", "dir": D}                  dumps.dump_state -> D/rank{R}.pt
#
# and writes the recorded losses to <spec["losses"]>.<R>.rank<rank> (JSON: step,
# sample, loss as float hex). Every sample of step s is a function of (data seed, s,
# sample index); micro batches hold one sample, so every topology trains the same
# global batch and the first step after a load computes every sample's forward
# exactly as the uninterrupted run did (when tp is unchanged).
import json
import os

import torch
import torch.distributed as dist

import dumps
import families


def ds_config(spec, built):
    topo = spec["topology"]
    dp = topo["dp"]
    gb = spec.get("global_batch", 4)
    if gb % dp:
        raise SystemExit(f"global batch {gb} does not split over dp {dp}")
    opt = {"lr": spec["lr"], "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": spec["wd"],
           "torch_adam": True, "adam_w_mode": True}
    cfg = {
        "train_batch_size": gb,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gb // dp,
        "gradient_clipping": 1.0,
        "steps_per_print": 10 ** 9,
        "optimizer": {"type": "Adam", "params": opt},
        "zero_optimization": {"stage": spec.get("zero_stage", 1)},
        "checkpoint": {"load_universal": bool(spec.get("universal"))},
    }
    z = cfg["zero_optimization"]
    if z["stage"] in (1, 2):
        z.update({"overlap_comm": False, "contiguous_gradients": True, "reduce_bucket_size": 5e8,
                  "allgather_bucket_size": 5e8})
    if z["stage"] == 3:
        z.update({"stage3_param_persistence_threshold": spec.get("persistence_threshold", 100),
                  "sub_group_size": spec.get("sub_group_size") or 1000000000})
    dtype = spec.get("dtype", "fp32")
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        # DeepSpeed's CPU accelerator reports fp16 only where oneDNN has fp16
        # kernels; torch runs a tiny fp16 model on any CPU.
        from deepspeed.accelerator import get_accelerator
        get_accelerator().is_fp16_supported = lambda: True
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 2, "hysteresis": 1}
    # the family's own config (e.g. AutoTP's tensor_parallel), then the case's
    # extra config, each merged one level deep
    extra = [fam_cfg(spec) for fam_cfg in [getattr(built, "ds_config", None)] if fam_cfg] + [spec.get("config") or {}]
    for k, v in [kv for e in extra for kv in e.items()]:
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    return cfg


class Job:
    def __init__(self, spec):
        import deepspeed
        self.spec = spec
        self.topo = spec["topology"]
        self.family = families.get(spec["family"])
        self.cfg = families.parse(self.family, spec.get("model_args", ""), spec.get("dtype"), spec["seed"])
        self.built = self.family.build(self.cfg, self.topo)
        if hasattr(self.family, "ds_config"):
            self.built.ds_config = lambda spec: self.family.ds_config(self.cfg, self.topo)
        spec.setdefault("lr", getattr(self.cfg, "lr", 1e-3))
        spec.setdefault("wd", getattr(self.cfg, "wd", 0.0))
        self.engine, _, _, _ = deepspeed.initialize(model=self.built.module, model_parameters=self.built.param_groups,
                                                    config=ds_config(spec, self.built), mpu=self.built.mpu)
        self.records = {}
        if self.built.pipeline:
            # DeepSpeed 0.18.x's ZeRO step fails on gloo with autograd on ("Output 0 of
            # SplitBackward0 is a view and is being modified inplace"); the pipeline
            # engine steps inside train_batch, so its step runs under no_grad the same
            # way (the engine instance's method wrapped; DeepSpeed's code untouched).
            take = self.engine._take_model_step

            def take_model_step(*args, **kwargs):
                with torch.no_grad():
                    return take(*args, **kwargs)

            self.engine._take_model_step = take_model_step

    def train(self, steps, record):
        first = self.engine.global_steps + 1
        out = self.records.setdefault(record, [])
        for step in range(first, first + steps):
            self._step(step, out)

    def _step(self, step, out):
        dp = self.topo["dp"]
        gas = self.spec.get("global_batch", 4) // dp
        idxs = [m * dp + self.built.dp_rank for m in range(gas)]
        data_seed = self.spec["data_seed"]
        if self.built.pipeline:
            seen = iter(idxs)
            orig = self.engine.module.loss_fn

            def recording_loss(logits, labels):
                loss = orig(logits, labels)
                i = next(seen)
                if self.built.records_losses:
                    out.append({"step": step, "sample": i, "loss": loss.item().hex()})
                return loss

            self.engine.module.loss_fn = recording_loss
            try:
                self.engine.train_batch(iter([families.sample(self.cfg, data_seed, step, i) for i in idxs]))
            finally:
                self.engine.module.loss_fn = orig
            return
        for i in idxs:
            x, y = families.sample(self.cfg, data_seed, step, i)
            loss = self.built.loss(self.engine, x, y)
            if self.built.records_losses:
                out.append({"step": step, "sample": i, "loss": loss.item().hex()})
            self.engine.backward(loss)
            # DeepSpeed 0.18.x's ZeRO step fails on gloo with autograd on ("Output 0 of
            # Split is a view and is being modified inplace"); the step needs no grad.
            with torch.no_grad():
                self.engine.step()

    def save(self, d, tag):
        cs = self.family.client_state(self.cfg, self.topo, self.engine.global_steps)
        self.engine.save_checkpoint(d, tag=tag, client_state=cs)

    def load(self, d, tag, scramble_frozen=False):
        if scramble_frozen:
            # Frozen params equal to the saved ones already (the same seed builds the
            # same model): overwrite them, so that only a load that really restores
            # them from the checkpoint passes the oracle. ZeRO-3: the rank's
            # partition, and the whole of a persistent (never released) param.
            for p in self.engine.module.parameters():
                if not p.requires_grad:
                    if hasattr(p, "ds_tensor"):
                        p.ds_tensor.data.fill_(-3.0)
                    p.data.fill_(-3.0)
        path, cs = self.engine.load_checkpoint(d, tag=tag)
        if path is None:
            raise SystemExit(f"load_checkpoint found nothing to load in {d} (tag {tag})")
        if not self.spec.get("universal"):
            self.check_client_args(cs, d)

    def check_client_args(self, cs, d):
        """As GPT-NeoX's and savanna's load_checkpoint (megatron/checkpointing.py
        check_checkpoint_args): every key of the checkpoint's client state 'args'
        equals this job's own value (model_parallel_size, pipe_parallel_size, ...).
        A universal checkpoint is not checked: it holds the source job's args."""
        args = cs.get("args") if isinstance(cs, dict) else None
        if not isinstance(args, dict):
            return
        mine = self.family.client_state(self.cfg, self.topo, 0).get("args", {})
        bad = [f"{k}: checkpoint {v!r}, job {mine.get(k, '(none)')!r}" for k, v in args.items() if mine.get(k) != v]
        if bad:
            raise SystemExit(f"the client state 'args' of {d} is not this job's (GPT-NeoX's check_checkpoint_args "
                             "would refuse it): " + "; ".join(bad))

    def dump(self, d):
        b = self.built
        dumps.dump_state(self.engine, b, d, {"tp": self.topo["tp"], "pp": self.topo["pp"], "dp": self.topo["dp"],
                                             "ep": self.topo.get("ep", 1), "tp_rank": b.tp_rank, "pp_rank": b.pp_rank,
                                             "dp_rank": b.dp_rank,
                                             "ep_rank": b.ep_rank_fn() if hasattr(b, "ep_rank_fn") else b.ep_rank})

    def run(self):
        for a in self.spec["actions"]:
            do = a["do"]
            if do == "train":
                self.train(a["steps"], a.get("record", "train"))
            elif do == "save":
                self.save(a["dir"], a["tag"])
            elif do == "load":
                self.load(a["dir"], a["tag"], a.get("scramble_frozen", False))
            elif do == "dump":
                self.dump(a["dir"])
            else:
                raise SystemExit(f"unknown action {do}")
            dist.barrier()
        if self.spec.get("losses"):
            for name, recs in self.records.items():
                if recs:
                    with open(f"{self.spec['losses']}.{name}.rank{dist.get_rank()}", "w") as f:
                        json.dump(recs, f)


def main(spec, rank, world, store_path):
    import deepspeed
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    deepspeed.init_distributed(dist_backend="gloo")  # adopts the process group above
    Job(spec).run()
    dist.barrier()
    # no destroy_process_group(): the rank exits right after (os._exit), and
    # gloo's teardown can hang (trainer_job.py main)
