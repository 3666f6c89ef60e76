# Host side of the Hugging Face Trainer cases of the real-DeepSpeed tests
# (realds/README.md, "Hugging Face Trainer"): a case whose model family is
# `hf_trainer`. transformers' Trainer (worker/trainer_job.py, in the sid root)
# trains a tiny Llama at the source dp and saves `checkpoint-N/` every 3 steps;
# each hop gives the `checkpoint-N/` the previous run saved to `ucp reshard
# --dp=T` or `ucp convert`, which write a whole new `checkpoint-N/` (DeepSpeed's
# folder, `latest` or `latest_universal`, the Trainer's files with one RNG file
# per process of the new run), and the Trainer resumes from it as it is with
# `trainer.train(resume_from_checkpoint=...)` at the target dp (after convert,
# with "checkpoint": {"load_universal": true} in its DeepSpeed config). Then,
# as for every case (driver.py):
#   states  the state the resumed Trainer holds right after the load vs what
#           the saving run held at its save, bitwise (oracle.compare_states:
#           lp / fp32 / exp_avg / exp_avg_sq, hyper-parameters incl. the lr the
#           scheduler set, steps, global steps and samples; frozen params lp);
#   rng     each resumed process's RNG states (python, numpy, torch) right after
#           the Trainer's _load_rng_state vs the source's file that ucp's
#           summary says it gave that process (none: none of the source's);
#   losses  (a) bitwise equal to a fresh resume from the Trainer's own save of
#           the loaded state (Trainer._save_checkpoint, DeepSpeed's
#           save_checkpoint inside), (b) within the tolerance of the saving run
#           going on uninterrupted, the first step bitwise;
#   export  (case.export) `ucp export` of the hop's input as it is: --names=hf
#           loaded with AutoModelForCausalLM.from_pretrained (full), the
#           checkpoint's names into the LoRA look-alike: logits on a fixed batch
#           bitwise equal to the saving run's.
# The next hop reads what the resumed Trainer saved 3 steps later.
import json
import os
import re
import shutil

import driver
import host

SAVE_STEPS = 3  # the Trainer saves every 3 steps; every hop trains 3


def dp_of(stage):
    return stage.dp or 1


def zero_of(stage):
    """The Trainer's ZeRO stage: 0 (no_zero), else zero_stage (0 means 2, the Trainer cases' default)."""
    return 0 if stage.no_zero else (stage.zero_stage or 2)


RNG_GIVEN = re.compile(r"^\s+(rng_state(?:_\d+)?\.pth): the source's (rng_state(?:_\d+)?\.pth)\b")


def rng_files_given(log):
    """What ucp's summary (its output, in the command's log) says it wrote of the
    Trainer's RNG files: {file in the new folder: the source's file}."""
    given = {}
    with open(log) as f:
        for line in f:
            m = RNG_GIVEN.match(line)
            if m:
                given[m.group(1)] = m.group(2)
    return given


class TrainerCase(driver.Case):
    def __init__(self, c, ctx):
        super().__init__(c, ctx)
        self.dtype = c.model.dtype or "fp32"
        if self.dtype not in ("fp32", "bf16") or (self.dtype == "bf16" and (c.root or "sid") == "sid"):
            # sid's gloo has no bf16/fp16 collectives ("Invalid scalar type"); bf16 runs
            # in trixie-hf: trixie (torch 2.6, whose gloo has them) with sid's
            # transformers, accelerate, huggingface-hub and tokenizers unpacked
            # (tools/deepspeed_env.sh OVERLAY_PACKAGES)
            raise SystemExit(f"case {c.name}: the Trainer cases run fp32 in sid, bf16 in trixie-hf")
        dps = [dp_of(c.source)] + [dp_of(h.target) for h in c.hop]
        import math
        m = math.lcm(*dps)
        self.gb = c.global_batch or m * -(-4 // m)
        self.mode = "lora" if "--mode lora" in (c.model.args or "") or "--mode=lora" in (c.model.args or "") else "full"
        self.total = (c.steps or SAVE_STEPS) + SAVE_STEPS * len(c.hop)  # the LR schedule: equal in every run

    def tjob(self, stage, name, world, **spec):
        full = {"runner": "trainer", "model_args": self.c.model.args, "seed": self.c.model.seed or 1,
                "zero_stage": zero_of(stage), "global_batch": self.gb, "max_steps": self.total,
                "save_steps": SAVE_STEPS, "universal": False, "dtype": self.dtype}
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
        label = f"hop {i + 1} {route.lower()} dp{dp_of(prev)} -> dp{dp_of(T)} z{zero_of(T)} (Trainer)"
        print(f"  {label}", flush=True)
        if zero_of(T) != zero_of(prev) or (T.tp or 1) != 1 or (T.pp or 1) != 1:
            raise SystemExit(f"case {c.name}: Trainer hops change dp only")
        flags = hop.ucp_flags.split()
        # ucp writes the whole checkpoint-N the Trainer resumes from (DeepSpeed's
        # folder, latest or latest_universal, the Trainer's files with one RNG file
        # per process): the harness adds nothing to it.
        ck = f"{d}/in{i}/checkpoint-{n}"
        universal = hop.route == pb.Hop.CONVERT
        if universal:
            # What the harness still does for load_universal: the resumed job's
            # DeepSpeed config says "checkpoint": {"load_universal": true} (a setting
            # of the loading job, not of any file: DeepSpeed then reads
            # latest_universal).
            what, args = "convert", ["convert", f"--input_folder={src}", f"--output_folder={ck}"]
        elif hop.route == pb.Hop.RESHARD:
            what, args = "reshard", ["reshard", f"--input_folder={src}", f"--output_folder={ck}", f"--dp={dp_of(T)}"]
        else:
            raise SystemExit(f"case {c.name}: Trainer hops are CONVERT or RESHARD")
        if not self.ucp_step(i, hop, what, args + flags, f"{what}{i}"):
            return self.passed_negative
        rng_given = rng_files_given(os.path.join(d, f"{what}{i}.log"))
        # verify reads the source's format as the command did (--source_option)
        ok, last = self.ucp(["verify", ck] + [f for f in flags if f.startswith("--source_option")], f"verify{i}")
        self.row(f"hop {i + 1} ucp verify", ok, last)
        if not ok:
            return False
        if c.export:
            # ucp export of the Trainer's folder as it is, loaded as it is: full models
            # with --names=hf (config.json and generation_config.json from the
            # checkpoint), the LoRA look-alike under the checkpoint's (peft's) names.
            exp = f"{d}/export{i}"
            names = "hf" if self.mode == "full" else "checkpoint"
            ok, last = self.ucp(["export", f"--input_folder={src}", f"--output_folder={exp}", f"--names={names}"],
                                f"export{i}")
            if ok:
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
                "rng_dump": f"{d}/rng{i}",
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
        # Which rng_state file each process of the resumed run got (ucp's summary
        # says) vs the RNG states that process holds right after the Trainer's
        # _load_rng_state.
        rg = self.call(T, "check_rng", {"given": rng_given, "source": src, "folder": ck, "got": f"{d}/rng{i}",
                                        "world": dp_of(T)}, f"rng{i}", module="trainer_job")
        if rg is None:
            return False
        problems += rg["problems"]
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
        self.row(f"hop {i + 1} rng states", not rg["problems"], rg["line"] + "".join("; " + p for p in rg["problems"][:3]))
        self.row(f"hop {i + 1} losses", not lo["problems"],
                 lo["line"] + (" (first step bitwise)" if bitwise else "") + "".join("; " + p for p in lo["problems"][:3]))
        return not problems

    def ucp(self, args, name):
        """driver.Case.ucp, the row showing what was written ("resharded ...",
        "wrote ...") rather than the last line of the Trainer files' summary."""
        ok, last = super().ucp(args, name)
        if ok and args[0] in ("reshard", "convert"):
            with open(os.path.join(self.dir, name + ".log")) as f:
                main = [l.strip() for l in f if l.startswith(("resharded ", "wrote "))]
            if main:
                last = main[-1]
        return ok, last

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
