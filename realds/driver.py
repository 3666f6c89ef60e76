#!/usr/bin/python3
# Runs real-DeepSpeed cases against ucp (realds/README.md): real DeepSpeed trains a
# small model at the source topology and saves; for each hop ucp converts or
# reshards what DeepSpeed saved last, DeepSpeed loads it at the target, saves
# (its own plain save), trains on and saves again for the next hop. Checked per
# hop, by the oracle in the root (independent of ucp):
#   states  every param's lp / fp32 / exp_avg / exp_avg_sq bitwise equal to the
#           saving job's (tp slices merged by the family's own split table),
#           each group's hyper-parameters, every optimizer state's step;
#   losses  (a) bitwise equal to a fresh resume from DeepSpeed's own save of the
#           loaded state, (b) within the tolerance of the uninterrupted run (the
#           previous job going on without a checkpoint), the first step bitwise
#           where tp and the arithmetic are unchanged;
#   ucp verify of every ucp output, and (case.export) ucp export vs the masters,
#   (case.zero_to_fp32) ucp export vs DeepSpeed's own zero_to_fp32.
#
#   realds/driver.py --cases=realds/cases/trixie_0195.textproto [--only=NAME,...]
#   realds/driver.py --random=SEED [--count=K] [--versions=0.19.5,0.16.4] [--print]
#   realds/driver.py --cases=FILE --list
#   realds/driver.py --cases=FILE --deepspeed_src=DIR    every case with a DeepSpeed tree of your own
# Options: --ucp=PATH (default bazel-bin/tools/ucp), --work=DIR (default a
# temporary folder, removed when all passed unless --keep).
# Exit status 0 when every case passed.
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import host  # noqa: E402

pb = None  # realds_pb2, loaded in main


def topo(stage):
    return {"tp": stage.tp or 1, "pp": stage.pp or 1, "dp": stage.dp or 1, "ep": stage.ep or 1}


def world(stage):
    t = topo(stage)
    return t["tp"] * t["pp"] * t["dp"]


def zstage(stage):
    """The stage's ZeRO stage: 0 (no_zero), else zero_stage (0 means 1)."""
    return 0 if stage.no_zero else (stage.zero_stage or 1)


def describe(stage):
    t = topo(stage)
    s = f"tp{t['tp']} pp{t['pp']} dp{t['dp']}" + (f" ep{t['ep']}" if t["ep"] > 1 else "")
    return s + f" z{zstage(stage)}"


class Case:
    def __init__(self, c, ctx):
        self.c, self.ctx = c, ctx
        self.dir = os.path.join(ctx.work, c.name)
        self.ds = c.deepspeed or "0.19.5"
        self.root = c.root or host.default_root(self.ds)
        self.dtype = c.model.dtype or "fp32"
        dps = [topo(c.source)["dp"]] + [topo(h.target)["dp"] for h in c.hop]
        m = math.lcm(*dps)
        self.gb = c.global_batch or m * -(-4 // m)  # the least multiple of every dp that is at least 4
        self.tol = c.tolerance or (1e-4 if self.dtype == "fp32" else 3e-2)
        self.rows = []  # (what, ok, detail)
        self.seconds = {}
        self.passed_negative = False  # a negative hop failed as it must
        self.last_error = None

    def worker(self, stage):
        ds = stage.deepspeed or self.ds
        root = stage.root or (self.root if not stage.deepspeed else host.default_root(ds))
        return self.ctx.workers.get(root, ds)

    def spec(self, stage, actions, losses, universal=False):
        c = self.c
        return {"family": c.model.family, "model_args": c.model.args, "seed": c.model.seed or 1,
                "data_seed": c.model.seed or 1, "dtype": self.dtype, "topology": topo(stage),
                "zero_stage": zstage(stage), "sub_group_size": stage.sub_group_size or None,
                "global_batch": self.gb, "config": json.loads(stage.config_json or "{}"),
                "universal": universal, "losses": losses, "actions": actions}

    def row(self, what, ok, detail):
        detail = str(detail).replace(self.ctx.work + "/", "")  # paths relative to the work folder
        self.rows.append((what, ok, detail))
        print(f"    {'ok  ' if ok else 'FAIL'} {what}: {detail}", flush=True)
        return ok

    def job(self, stage, actions, losses, name, universal=False, quiet=False):
        w = self.worker(stage)
        r = self.ctx.workers.job(w.root, w.deepspeed, world(stage), self.spec(stage, actions, losses, universal),
                                 os.path.join(self.dir, name), independent=self.c.independent_ranks)
        self.seconds[name] = r.get("seconds")
        self.last_error = r.get("error")
        if not r["ok"] and not quiet:
            self.row(f"{name} (DeepSpeed {w.info['deepspeed']}, {describe(stage)})", False,
                     f"{r.get('error')} (log {r.get('log')})")
        return r["ok"]

    def call(self, stage, function, args, name):
        r = self.worker(stage).call("oracle", function, args, os.path.join(self.dir, name + ".log"))
        if not r["ok"]:
            self.row(name, False, f"oracle: {r.get('error')} (log {r.get('log')})")
            return None
        return r["result"]

    def ucp(self, args, name):
        ok, last, secs = host.run_ucp(self.ctx.ucp, args, os.path.join(self.dir, name + ".log"))
        self.seconds[name] = secs
        return ok, last

    def ucp_step(self, i, hop, what, args, name):
        """A ucp command of hop i; a failure ends the hop (as expected, for a
        negative hop whose expect_problem matches the message)."""
        ok, last = self.ucp(args, name)
        if not ok and hop.expect_problem:
            self.expected(i, hop, [f"ucp {what}: {last}"])
            return False
        self.row(f"hop {i + 1} ucp {what}", ok, last)
        return ok

    def run(self):
        c = self.c
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        d = self.dir
        t0 = time.time()
        n = c.steps or 3
        hops = list(c.hop)
        acts = [{"do": "train", "steps": n, "record": "train"},
                {"do": "save", "dir": f"{d}/ckpt0", "tag": f"global_step{n}"},
                {"do": "dump", "dir": f"{d}/ref0"}]
        if hops:
            acts.append({"do": "train", "steps": hops[0].steps or 2, "record": "cont"})
        if not self.job(c.source, acts, f"{d}/loss.S", "source"):
            return False
        cont = f"{d}/loss.S.cont"
        prev = c.source
        ok = True
        for i, hop in enumerate(hops):
            ok &= self.hop(i, hop, n, prev, cont, hops[i + 1] if i + 1 < len(hops) else None)
            if not ok:
                break
            cont = f"{d}/loss.L{i}.cont"
            n += hop.steps or 2
            prev = hop.target
        self.seconds["total"] = round(time.time() - t0, 1)
        return ok

    def hop(self, i, hop, n, prev, cont, nxt):
        c, d = self.c, self.dir
        T = hop.target
        steps = hop.steps or 2
        route = pb.Hop.Route.Name(hop.route)
        label = f"hop {i + 1} {route.lower()} {describe(prev)} -> {describe(T)}"
        print(f"  {label}" + (f" (DeepSpeed {T.deepspeed})" if T.deepspeed else ""), flush=True)
        inp = f"{d}/ckpt{i}/global_step{n}"
        flags = hop.ucp_flags.split()
        t = topo(T)
        reshard_flags = [f"--tp={t['tp']}", f"--pp={t['pp']}", f"--dp={t['dp']}"]
        if t["ep"] > 1 or topo(prev)["ep"] > 1:
            reshard_flags.append(f"--expert_parallel={t['ep']}")
        if zstage(T) == 0:
            reshard_flags.append("--format=deepspeed_zero0")  # --zero_stage=0 means the source's
        elif zstage(T) != zstage(prev):
            reshard_flags.append(f"--zero_stage={zstage(T)}")
        if T.sub_group_size:
            reshard_flags.append(f"--sub_group_size={T.sub_group_size}")
        universal = hop.route in (pb.Hop.CONVERT, pb.Hop.DS_CONVERT)
        out_root = f"{d}/ucp{i}"
        problems = []
        if hop.route in (pb.Hop.CONVERT, pb.Hop.CONVERT_RESHARD, pb.Hop.DS_CONVERT_RESHARD, pb.Hop.DS_CONVERT):
            uni_root = out_root if universal else f"{d}/uni{i}"
            uni = f"{uni_root}/global_step{n}_universal"
            convert_flags = flags if universal else hop.convert_flags.split()
            if hop.route in (pb.Hop.DS_CONVERT_RESHARD, pb.Hop.DS_CONVERT):  # DeepSpeed's own converter
                r = self.worker(prev).call("routes", "ds_to_universal", {"src": inp, "out": uni, "inject": False},
                                           os.path.join(self.dir, f"ds_convert{i}.log"))
                if not self.row(f"hop {i + 1} ds_to_universal.py", r["ok"], r.get("error") or uni):
                    return False
            elif not self.ucp_step(i, hop, "convert", ["convert", f"--input_folder={inp}", f"--output_folder={uni}"] +
                                   convert_flags, f"convert{i}"):
                return self.passed_negative
            tag, out = f"global_step{n}_universal", uni
            if hop.compare_ds_universal and not self.compare_ds_universal(i, prev, inp, uni):
                return False
            if not universal:
                out = f"{out_root}/global_step{n}"
                if not self.ucp_step(i, hop, "reshard", ["reshard", f"--input_folder={uni}", f"--output_folder={out}"] +
                                     reshard_flags + flags, f"reshard{i}"):
                    return self.passed_negative
                tag = f"global_step{n}"
        else:
            out, tag = f"{out_root}/global_step{n}", f"global_step{n}"
            if not self.ucp_step(i, hop, "reshard", ["reshard", f"--input_folder={inp}", f"--output_folder={out}"] +
                                 reshard_flags + flags, f"reshard{i}"):
                return self.passed_negative
        ok, last = self.ucp(["verify", out], f"verify{i}")
        self.row(f"hop {i + 1} ucp verify", ok, last)
        if not ok and hop.route != pb.Hop.DS_CONVERT:
            return False
        if c.export:
            exp = f"{d}/export{i}"
            ok, last = self.ucp(["export", f"--input_folder={inp}", f"--output_folder={exp}"], f"export{i}")
            if ok:
                r = self.call(prev, "compare_export", {"path": f"{exp}/model.safetensors", "ref": f"{d}/ref{i}",
                                                       "family": c.model.family}, f"export{i}.check")
                if r is None:
                    return False
                ok, last = not r["problems"], r["line"] + ("; " + "; ".join(r["problems"][:3]) if r["problems"] else "")
            if not self.row(f"hop {i + 1} ucp export", ok, last):
                return False
        if c.zero_to_fp32:
            exp = f"{d}/export{i}.torch"
            ok, last = self.ucp(["export", f"--input_folder={inp}", f"--output_folder={exp}", "--format=torch"],
                                f"export{i}.torch")
            if ok:
                r = self.call(prev, "compare_zero_to_fp32", {"ckpt": f"{d}/ckpt{i}", "tag": f"global_step{n}",
                                                             "path": f"{exp}/pytorch_model.bin", "ref": f"{d}/ref{i}",
                                                             "family": c.model.family}, f"export{i}.zero_to_fp32")
                if r is None:
                    return False
                ok, last = not r["problems"], r["line"] + ("; " + "; ".join(r["problems"][:3]) if r["problems"] else "")
            if not self.row(f"hop {i + 1} ucp export = zero_to_fp32", ok, last):
                return False
        # The job that loads ucp's output: dump, DeepSpeed's own save, train on, and
        # for the next hop save again and go on (its uninterrupted continuation).
        acts = [{"do": "load", "dir": out_root, "tag": tag, "scramble_frozen": not universal},
                {"do": "dump", "dir": f"{d}/got{i}"},
                {"do": "save", "dir": f"{d}/own{i}", "tag": f"global_step{n}"},
                {"do": "train", "steps": steps, "record": "L"}]
        if nxt is not None:
            acts += [{"do": "save", "dir": f"{d}/ckpt{i + 1}", "tag": f"global_step{n + steps}"},
                     {"do": "dump", "dir": f"{d}/ref{i + 1}"},
                     {"do": "train", "steps": nxt.steps or 2, "record": "cont"}]
        if not self.job(T, acts, f"{d}/loss.L{i}", f"load{i}", universal=universal, quiet=bool(hop.expect_problem)):
            return self.expected(i, hop, [f"DeepSpeed's load: {self.last_error}"])
        if not self.job(T, [{"do": "load", "dir": f"{d}/own{i}", "tag": f"global_step{n}", "scramble_frozen": True},
                            {"do": "train", "steps": steps, "record": "P"}], f"{d}/loss.P{i}", f"resume{i}"):
            return False
        st = self.call(T, "compare_states", {"ref": f"{d}/ref{i}", "got": f"{d}/got{i}", "family": c.model.family},
                       f"states{i}")
        if st is None:
            return False
        problems += st["problems"]
        bitwise = hop.first_step_bitwise if hop.HasField("first_step_bitwise") else self.bitwise_default(prev, T)
        lo = self.call(T, "compare_losses", {"source": cont, "loaded": f"{d}/loss.L{i}.L",
                                             "resumed": f"{d}/loss.P{i}.P", "tolerance": self.tol,
                                             "first_step_bitwise": bitwise}, f"losses{i}")
        if lo is None:
            return False
        problems += lo["problems"]
        if hop.expect_problem:
            return self.expected(i, hop, problems, st["line"] + "; " + lo["line"])
        self.row(f"hop {i + 1} states", not st["problems"], st["line"] + "".join("; " + p for p in st["problems"][:4]))
        self.row(f"hop {i + 1} losses", not lo["problems"],
                 lo["line"] + (" (first step bitwise)" if bitwise else "") + "".join("; " + p for p in lo["problems"][:3]))
        return not problems

    def compare_ds_universal(self, i, prev, inp, uni):
        """DeepSpeed's own ds_to_universal.py of the same checkpoint, field by
        field against ucp's universal folder `uni`."""
        theirs = f"{self.dir}/dsuni{i}/{os.path.basename(uni)}"
        r = self.worker(prev).call("routes", "ds_to_universal", {"src": inp, "out": theirs, "inject": False},
                                   os.path.join(self.dir, f"ds_convert{i}.log"))
        if not self.row(f"hop {i + 1} ds_to_universal.py (for the comparison)", r["ok"], r.get("error") or theirs):
            return False
        r = self.worker(prev).call("routes", "compare_universal_folders", {"ours": uni, "theirs": theirs},
                                   os.path.join(self.dir, f"ds_compare{i}.log"))
        ok = r["ok"] and r["result"]["pass"]
        return self.row(f"hop {i + 1} ucp convert = ds_to_universal.py", ok,
                        r.get("error") or r["result"]["detail"])

    def expected(self, i, hop, problems, line=""):
        import re
        if not hop.expect_problem:
            return False
        hit = [p for p in problems if re.search(hop.expect_problem, p)]
        self.passed_negative = bool(hit)
        return self.row(f"hop {i + 1} negative control (must fail: /{hop.expect_problem}/)", bool(hit),
                        ("failed as expected: " + hit[0]) if hit else f"did not fail so: {problems[:2]} {line}")

    def bitwise_default(self, prev, T):
        same_tp = topo(prev)["tp"] == topo(T)["tp"]
        z_prev, z_t = zstage(prev), zstage(T)
        same_path = z_prev == z_t or (z_prev <= 2 and z_t <= 2)
        ep_changed = topo(prev)["ep"] != topo(T)["ep"]
        return same_tp and same_path and not (self.dtype != "fp32" and (ep_changed or z_prev != z_t))


class Ctx:
    pass


def load_cases(paths):
    from google.protobuf import text_format
    out = []
    for p in paths:
        with open(p) as f:
            cs = text_format.Parse(f.read(), pb.Cases())
        out += list(cs.case)
    names = [c.name for c in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"duplicate case names: {sorted(dup)}")
    for c in out:
        if not c.model.family:
            raise SystemExit(f"case {c.name}: no model family")
        if any(h.expect_problem for h in c.hop[:-1]):
            raise SystemExit(f"case {c.name}: only the last hop can be a negative control (expect_problem)")
    return out


def main(argv=None):
    global pb
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", action="append", default=[], help="a Cases textproto (repeatable)")
    ap.add_argument("--only", default="", help="comma list of case names")
    ap.add_argument("--random", default=None, metavar="SEED",
                    help="draw cases from this seed; 'auto': $UCP_REALDS_SEED, else a new seed each run")
    ap.add_argument("--count", type=int, default=2, help="random cases to draw")
    ap.add_argument("--versions", default="", help="random cases: DeepSpeed versions to draw from")
    ap.add_argument("--print", action="store_true", help="print the cases (textproto) and stop")
    ap.add_argument("--list", action="store_true", help="list the cases and stop")
    ap.add_argument("--deepspeed_src", default=None, metavar="DIR",
                    help="run every case (and every hop) with this DeepSpeed tree instead of the cases' versions")
    ap.add_argument("--root", default=None, help="with --deepspeed_src: the root (default: by its version.txt)")
    ap.add_argument("--ucp", default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--pb2", default=None, help="folder of realds_pb2.py")
    ap.add_argument("--deepspeed_env", default=None, help="tools/deepspeed_env.sh")
    a = ap.parse_args(argv)
    pb = host.load_pb2(a.pb2)
    user_cwd = os.getcwd()
    os.chdir(os.path.dirname(HERE))  # the repo (or runfiles) root: case paths are relative to it
    # case files relative to where the command ran, else to the repo
    cases = load_cases([os.path.join(user_cwd, p) if os.path.exists(os.path.join(user_cwd, p)) else p
                        for p in a.cases])
    if a.random is not None:
        import random_cases
        if a.random == "auto":
            seed = int(os.environ.get("UCP_REALDS_SEED") or (time.time_ns() // 1000) % 1000000007)
        else:
            seed = int(a.random)
        versions = [v for v in a.versions.split(",") if v] or None
        cases += random_cases.draw(pb, seed, a.count, versions)
        print(f"random cases: seed {seed}, {a.count} cases; replay with: realds/driver.py --random={seed} "
              f"--count={a.count}" + (f" --versions={a.versions}" if a.versions else "") +
              f" (or bazel test //realds:random_test --test_env=UCP_REALDS_SEED={seed})", flush=True)
    if a.deepspeed_src:
        base = os.environ.get("BUILD_WORKING_DIRECTORY") or user_cwd
        tree = os.path.join(base, a.deepspeed_src)  # a folder, else a version of ../shared/deepspeed-src
        tree = os.path.abspath(tree) if os.path.isdir(tree) else a.deepspeed_src
        for c in cases:
            c.deepspeed = tree
            c.root = a.root or ""
            for h in c.hop:
                h.target.deepspeed, h.target.root = "", ""
            c.source.deepspeed, c.source.root = "", ""
    if a.only:
        want = a.only.split(",")
        unknown = set(want) - {c.name for c in cases}
        if unknown:
            raise SystemExit(f"no such cases: {sorted(unknown)}")
        cases = [c for c in cases if c.name in want]
    if a.print or a.list:
        from google.protobuf import text_format
        for c in cases:
            print(text_format.MessageToString(pb.Cases(case=[c])) if a.print else f"{c.name}: {c.proves}")
        return 0
    if not cases:
        raise SystemExit("no cases (--cases FILE or --random SEED)")
    ctx = Ctx()
    ctx.pb = pb
    ctx.ucp = os.path.abspath(a.ucp or "bazel-bin/tools/ucp")
    if not os.access(ctx.ucp, os.X_OK):
        raise SystemExit(f"no ucp binary at {ctx.ucp} (bazel build //tools:ucp, or --ucp=PATH)")
    base = a.work or os.environ.get("TEST_TMPDIR") or None
    ctx.work = tempfile.mkdtemp(prefix="realds-", dir=base)
    ctx.workers = host.Workers(host.Env(script=a.deepspeed_env), ctx.work)
    results = []
    t0 = time.time()
    print(f"work folder: {ctx.work}", flush=True)
    try:
        for c in cases:
            print(f"case {c.name}: {c.model.family} {c.model.dtype or 'fp32'} [{c.model.args}] "
                  f"DeepSpeed {c.deepspeed or '0.19.5'}, {describe(c.source)}, {len(c.hop)} hop(s)", flush=True)
            if c.proves:
                print(f"  proves: {c.proves}", flush=True)
            if c.model.family == "hf_trainer":  # transformers' Trainer (trainer_case.py)
                import trainer_case
                k = trainer_case.TrainerCase(c, ctx)
            else:
                k = Case(c, ctx)
            try:
                ok = k.run()
            except host.WorkerError as e:
                ok = k.row("worker", False, str(e))
            results.append((c.name, ok, k.seconds.get("total")))
            print(f"  {'PASS' if ok else 'FAIL'} {c.name} ({k.seconds.get('total')} s: " +
                  ", ".join(f"{n} {s}" for n, s in k.seconds.items() if n != "total" and s is not None) + ")",
                  flush=True)
    finally:
        ctx.workers.close()
    bad = [n for n, ok, _ in results if not ok]
    print(f"\n{len(results) - len(bad)} of {len(results)} cases passed in {time.time() - t0:.0f} s" +
          (f"; failed: {', '.join(bad)}" if bad else ""))
    if bad or a.keep:
        print(f"work folder kept: {ctx.work}")
    else:
        shutil.rmtree(ctx.work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
