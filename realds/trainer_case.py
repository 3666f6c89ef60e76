# Host side of the Hugging Face Trainer cases of the real-DeepSpeed tests
# (realds/README.md, "Hugging Face Trainer"): a case whose model family is
# `hf_trainer`. transformers' Trainer (worker/trainer_job.py, in the sid root)
# trains a tiny Llama at the source dp and saves `checkpoint-N/` every 3 steps;
# each hop takes the `checkpoint-N/` the previous run saved, has ucp reshard or
# convert its `global_stepN/`, puts the result into a copy of `checkpoint-N/`
# (what the Trainer needs around DeepSpeed's files: `latest` or
# `latest_universal`, one `rng_state_<i>.pth` per process, `rng_state.pth` for
# one), and resumes with `trainer.train(resume_from_checkpoint=...)` at the
# target dp. Then, as for every case (driver.py):
#   states  the state the resumed Trainer holds right after the load vs what
#           the saving run held at its save, bitwise (oracle.compare_states:
#           lp / fp32 / exp_avg / exp_avg_sq, hyper-parameters incl. the lr the
#           scheduler set, steps, global steps and samples; frozen params lp);
#   losses  (a) bitwise equal to a fresh resume from the Trainer's own save of
#           the loaded state (Trainer._save_checkpoint, DeepSpeed's
#           save_checkpoint inside), (b) within the tolerance of the saving run
#           going on uninterrupted, the first step bitwise;
#   export  (case.export) `ucp export` of the hop's input, loaded with
#           AutoModelForCausalLM.from_pretrained (full) or into the LoRA
#           look-alike: logits on a fixed batch bitwise equal to the saving run's.
# The next hop reads what the resumed Trainer saved 3 steps later.
import json
import os
import shutil

import driver
import host

SAVE_STEPS = 3  # the Trainer saves every 3 steps; every hop trains 3


def dp_of(stage):
    return stage.dp or 1


def assemble(src, dst, ds_dir_name, latest_name, tag, target_dp):
    """A copy of the Trainer's checkpoint folder `src` for a run at target_dp,
    with DeepSpeed's files left for ucp to write into dst/ds_dir_name: every
    Trainer file (trainer_state.json, scheduler.pt, model.safetensors, config,
    training_args.bin) as it is, `latest_name` naming `tag`, and one RNG file
    per process of the new run: rng_state_<i>.pth (rng_state.pth for one
    process), the source's file of process i, else its process 0's. (What the
    RNG holds does not reach the losses here: no dropout, a sequential sampler.)"""
    os.makedirs(dst)
    rng = {}
    for f in sorted(os.listdir(src)):
        p = os.path.join(src, f)
        if f.startswith("global_step") or f in ("latest", "latest_universal"):
            continue
        if f == "rng_state.pth":
            rng[0] = p
        elif f.startswith("rng_state_") and f.endswith(".pth"):
            rng[int(f[len("rng_state_"):-len(".pth")])] = p
        elif os.path.isdir(p):
            shutil.copytree(p, os.path.join(dst, f))
        else:
            shutil.copy2(p, os.path.join(dst, f))
    if 0 not in rng:
        raise RuntimeError(f"{src}: no rng_state_0.pth or rng_state.pth")
    names = ["rng_state.pth"] if target_dp == 1 else [f"rng_state_{i}.pth" for i in range(target_dp)]
    for i, name in enumerate(names):
        shutil.copy2(rng.get(i, rng[0]), os.path.join(dst, name))
    with open(os.path.join(dst, latest_name), "w") as f:
        f.write(tag)
    return os.path.join(dst, ds_dir_name)


class TrainerCase(driver.Case):
    def __init__(self, c, ctx):
        super().__init__(c, ctx)
        self.dtype = c.model.dtype or "fp32"
        if self.dtype != "fp32":
            # sid's gloo has no bf16/fp16 collectives ("Invalid scalar type"): no such run here
            raise SystemExit(f"case {c.name}: the Trainer cases run in sid, fp32 only")
        dps = [dp_of(c.source)] + [dp_of(h.target) for h in c.hop]
        import math
        m = math.lcm(*dps)
        self.gb = c.global_batch or m * -(-4 // m)
        self.mode = "lora" if "--mode lora" in (c.model.args or "") or "--mode=lora" in (c.model.args or "") else "full"
        self.total = (c.steps or SAVE_STEPS) + SAVE_STEPS * len(c.hop)  # the LR schedule: equal in every run

    def tjob(self, stage, name, world, **spec):
        full = {"runner": "trainer", "model_args": self.c.model.args, "seed": self.c.model.seed or 1,
                "zero_stage": stage.zero_stage or 2, "global_batch": self.gb, "max_steps": self.total,
                "save_steps": SAVE_STEPS, "universal": False}
        full.update(spec)
        w = self.worker(stage)
        r = self.ctx.workers.job(w.root, w.deepspeed, world, full, os.path.join(self.dir, name))
        self.seconds[name] = r.get("seconds")
        self.last_error = r.get("error")
        if not r["ok"]:
            self.row(f"{name} (Trainer, DeepSpeed {w.info['deepspeed']}, dp{world} z{full['zero_stage']})", False,
                     f"{r.get('error')} (log {r.get('log')})")
        return r["ok"]

    def run(self):
        import time
        c = self.c
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        d = self.dir
        t0 = time.time()
        n = c.steps or SAVE_STEPS
        if n % SAVE_STEPS or any((h.steps or SAVE_STEPS) != SAVE_STEPS for h in c.hop):
            raise SystemExit(f"case {c.name}: the Trainer saves every {SAVE_STEPS} steps: steps must be {SAVE_STEPS}")
        hops = list(c.hop)
        stop = n + (SAVE_STEPS if hops else 0)
        if not self.tjob(c.source, "source", dp_of(c.source), out=f"{d}/run.S", stop_at=stop,
                         dump_at={str(n): f"{d}/ref0"}, losses=f"{d}/loss.S", records=[[10 ** 9, "cont"]]):
            return False
        src = f"{d}/run.S/checkpoint-{n}"
        cont = f"{d}/loss.S.cont"
        prev = c.source
        ok = True
        for i, hop in enumerate(hops):
            ok &= self.trainer_hop(i, hop, n, prev, src, cont, i + 1 < len(hops))
            if not ok:
                break
            src = f"{d}/run.L{i}/checkpoint-{n + SAVE_STEPS}"
            cont = f"{d}/loss.L{i}.cont"
            n += SAVE_STEPS
            prev = hop.target
        self.seconds["total"] = round(time.time() - t0, 1)
        return ok

    def trainer_hop(self, i, hop, n, prev, src, cont, has_next):
        c, d, pb = self.c, self.dir, self.ctx.pb
        T = hop.target
        route = pb.Hop.Route.Name(hop.route)
        label = f"hop {i + 1} {route.lower()} dp{dp_of(prev)} -> dp{dp_of(T)} z{T.zero_stage or 2} (Trainer)"
        print(f"  {label}", flush=True)
        if (T.zero_stage or 2) != (prev.zero_stage or 2) or (T.tp or 1) != 1 or (T.pp or 1) != 1:
            raise SystemExit(f"case {c.name}: Trainer hops change dp only")
        tag = f"global_step{n}"
        inp = f"{src}/{tag}"
        flags = hop.ucp_flags.split()
        ck = f"{d}/in{i}/checkpoint-{n}"
        universal = hop.route == pb.Hop.CONVERT
        if universal:
            out = assemble(src, ck, f"{tag}_universal", "latest_universal", f"{tag}_universal", dp_of(T))
            if not self.ucp_step(i, hop, "convert", ["convert", f"--input_folder={inp}", f"--output_folder={out}"] +
                                 flags, f"convert{i}"):
                return self.passed_negative
        elif hop.route == pb.Hop.RESHARD:
            out = assemble(src, ck, tag, "latest", tag, dp_of(T))
            if not self.ucp_step(i, hop, "reshard", ["reshard", f"--input_folder={inp}", f"--output_folder={out}",
                                                     f"--dp={dp_of(T)}"] + flags, f"reshard{i}"):
                return self.passed_negative
        else:
            raise SystemExit(f"case {c.name}: Trainer hops are CONVERT or RESHARD")
        ok, last = self.ucp(["verify", out], f"verify{i}")
        self.row(f"hop {i + 1} ucp verify", ok, last)
        if not ok:
            return False
        if c.export:
            exp = f"{d}/export{i}"
            ok, last = self.ucp(["export", f"--input_folder={inp}", f"--output_folder={exp}"], f"export{i}")
            if ok:
                # what a from_pretrained folder needs beside the weights: the Trainer's config.json
                # (and generation_config.json) of the checkpoint (full models only)
                for f in ("config.json", "generation_config.json"):
                    if os.path.exists(os.path.join(src, f)) and not os.path.exists(os.path.join(exp, f)):
                        shutil.copy2(os.path.join(src, f), os.path.join(exp, f))
                r = self.call(prev, "check_export", {"folder": exp, "ref": f"{d}/ref{i}", "mode": self.mode,
                                                      "model_args": c.model.args, "seed": c.model.seed or 1},
                              f"export{i}.check", module="trainer_job")
                if r is None:
                    return False
                ok, last = not r["problems"], r["line"] + "".join("; " + p for p in r["problems"][:3])
            if not self.row(f"hop {i + 1} ucp export", ok, last):
                return False
        # The resumed Trainer: dump right after the load, the Trainer's own save of it,
        # 3 steps (and for the next hop 3 more, saved at the end of the first 3).
        end = n + SAVE_STEPS
        spec = {"out": f"{d}/run.L{i}", "resume": ck, "universal": universal, "dump_begin": f"{d}/got{i}",
                "save_begin": True, "stop_at": end + (SAVE_STEPS if has_next else 0), "losses": f"{d}/loss.L{i}",
                "records": [[end, "L"], [10 ** 9, "cont"]]}
        if has_next:
            spec["dump_at"] = {str(end): f"{d}/ref{i + 1}"}
        if not self.tjob(T, f"load{i}", dp_of(T), **spec):
            return self.expected(i, hop, [f"the Trainer's resume: {self.last_error}"])
        problems = []
        st = self.call(T, "compare_states", {"ref": f"{d}/ref{i}", "got": f"{d}/got{i}", "family": "hf_trainer"},
                       f"states{i}")
        if st is None:
            return False
        problems += st["problems"]
        tr = self.trainer_state(f"{d}/ref{i}", f"{d}/got{i}")
        problems += tr
        if hop.expect_problem and problems:
            # a negative control that already failed as it must: no resume run needed
            return self.expected(i, hop, problems, st["line"])
        if not self.tjob(T, f"resume{i}", dp_of(T), out=f"{d}/run.P{i}", resume=f"{d}/run.L{i}/checkpoint-{n}",
                         stop_at=end, losses=f"{d}/loss.P{i}", records=[[10 ** 9, "P"]]):
            return False
        bitwise = hop.first_step_bitwise if hop.HasField("first_step_bitwise") else True
        lo = self.call(T, "compare_losses", {"source": cont, "loaded": f"{d}/loss.L{i}.L",
                                             "resumed": f"{d}/loss.P{i}.P", "tolerance": self.tol,
                                             "first_step_bitwise": bitwise}, f"losses{i}")
        if lo is None:
            return False
        problems += lo["problems"]
        if hop.expect_problem:
            return self.expected(i, hop, problems, st["line"] + "; " + lo["line"])
        self.row(f"hop {i + 1} states", not st["problems"] and not tr,
                 st["line"] + "; trainer step and scheduler" + "".join("; " + p for p in (st["problems"] + tr)[:4]))
        self.row(f"hop {i + 1} losses", not lo["problems"],
                 lo["line"] + (" (first step bitwise)" if bitwise else "") + "".join("; " + p for p in lo["problems"][:3]))
        return not problems

    def call(self, stage, function, args, name, module="oracle"):
        r = self.worker(stage).call(module, function, args, os.path.join(self.dir, name + ".log"))
        if not r["ok"]:
            self.row(name, False, f"{module}: {r.get('error')} (log {r.get('log')})")
            return None
        return r["result"]

    def trainer_state(self, ref, got):
        """The Trainer's own state beside DeepSpeed's: its global step and its LR
        scheduler (scheduler.pt) as the resumed run holds them after the load."""
        try:
            with open(os.path.join(ref, "trainer.json")) as f:
                a = json.load(f)
            with open(os.path.join(got, "trainer.json")) as f:
                b = json.load(f)
        except OSError as e:
            return [f"trainer state: {e}"]
        return [f"trainer {k}: loaded {b.get(k)}, the saving run's {a.get(k)}" for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)]
