#!/usr/bin/python3
# Golden regression for DeepSpeed patches (tools/upstream_check.sh; see
# realds/README.md). Runs DeepSpeed's *own* checkpoint routes, from the tree
# given, on the golden cases of testdata/upstream/ (checkpoints real DeepSpeed
# saved, with their expected merged tensors as digests):
#   ds_to_universal          ds_to_universal.py; its zero/<param>/*.pt files
#   universal_load <topo>    ds_to_universal.py, then load_universal at that topology
#   zero_to_fp32             get_fp32_state_dict_from_zero_checkpoint
#   plain_load <topo>        load_checkpoint of the checkpoint itself at that topology
# and prints one table: case, route, PASS or FAIL (the first error line, or the
# first tensor that differs and how), and the change against the recorded
# baseline of a release (testdata/upstream/baselines/): FIXED, REGRESSED or
# unchanged. Exit status 1 on any REGRESSED (or an error of the check itself),
# 0 otherwise, FAIL rows included: they are DeepSpeed's known bugs.
#
#   tools/upstream_check.sh --deepspeed_src=DIR [--baseline=VERSION|none] [--root=trixie|sid]
#                           [--cases=NAME,...] [--record_baseline] [--keep]
#   tools/upstream_check.sh --make_golden=NAME   (the saving run of a golden case; see README)
#
# --baseline defaults to the release named by the tree's version.txt (a 0.19.6
# tree is master's, master-edaa72212). --record_baseline writes the table as
# the baseline of that release (run it on the unmodified release only).
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import host  # noqa: E402

GOLDEN = "testdata/upstream"
pb = None


def topo(stage):
    return {"tp": stage.tp or 1, "pp": stage.pp or 1, "dp": stage.dp or 1, "ep": stage.ep or 1}


def topo_name(stage):
    t = topo(stage)
    return f"tp{t['tp']} pp{t['pp']} dp{t['dp']}" + (f" ep{t['ep']}" if t["ep"] > 1 else "")


def route_name(r):
    kind = pb.GoldenRoute.Kind.Name(r.kind).lower()
    name = kind if r.kind in (pb.GoldenRoute.DS_TO_UNIVERSAL, pb.GoldenRoute.ZERO_TO_FP32) else \
        f"{kind} {topo_name(r.target)}"
    return f"{name} {r.label}" if r.label else name


def read_text(path, msg):
    from google.protobuf import text_format
    with open(path) as f:
        return text_format.Parse(f.read(), msg)


def write_text(path, msg):
    from google.protobuf import text_format
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text_format.MessageToString(msg))
    os.replace(tmp, path)


def expected_json(exp):
    tensors = {}
    for t in exp.tensor:
        tensors.setdefault(t.param, {})[t.state] = {"shape": list(t.shape), "dtype": t.dtype, "sha256": t.sha256,
                                                    "sum": t.sum, "l2": t.l2, "absmax": t.absmax}
    return {"tensors": tensors, "groups": [json.loads(g) for g in exp.group_json], "step": exp.step}


def golden_cases(only):
    out = []
    for name in sorted(os.listdir(GOLDEN)):
        p = os.path.join(GOLDEN, name, "case.textproto")
        if os.path.exists(p) and (not only or name in only):
            c = read_text(p, pb.GoldenCase())
            if c.name != name:
                raise SystemExit(f"{p}: name '{c.name}' is not its folder's")
            out.append(c)
    if only and len(out) != len(only):
        raise SystemExit(f"no such golden cases: {sorted(set(only) - {c.name for c in out})}")
    return out


def spec(case, stage, actions, universal=False):
    return {"family": case.model.family, "model_args": case.model.args, "seed": case.model.seed or 1,
            "data_seed": case.model.seed or 1, "dtype": case.model.dtype or "fp32", "topology": topo(stage),
            "zero_stage": stage.zero_stage or 1, "sub_group_size": stage.sub_group_size or None,
            "global_batch": case.global_batch or 4, "config": json.loads(stage.config_json or "{}"),
            "universal": universal, "actions": actions}


def world(stage):
    t = topo(stage)
    return t["tp"] * t["pp"] * t["dp"]


class Check:
    def __init__(self, worker, work):
        self.w, self.work = worker, work
        self.rows = []

    def fail_line(self, r):
        return (r.get("error") or "failed").replace(self.work + "/", "")

    def run_case(self, c):
        d = os.path.join(self.work, c.name)
        os.makedirs(d)
        src_root = os.path.join(d, "ckpt")  # a copy: DeepSpeed's tools never touch the committed files
        shutil.copytree(os.path.join(GOLDEN, c.name), src_root,
                        ignore=shutil.ignore_patterns("*.textproto", "README*"))
        exp = expected_json(read_text(os.path.join(GOLDEN, c.name, "expected.textproto"), pb.Expected()))
        src = os.path.join(src_root, c.tag)
        uni = os.path.join(d, "universal", c.tag + "_universal")
        uni_state = None  # None: not run yet; else (ok, error line)
        # ds_to_universal.py >= 0.15 wants --inject_missing_state for a checkpoint without
        # universal_checkpoint_info (plain DeepSpeed users); it injects only what is missing
        inject = True
        for i, r in enumerate(c.route):
            name = route_name(r)
            t = time.time()
            log = os.path.join(d, f"route{i}")
            if r.kind in (pb.GoldenRoute.DS_TO_UNIVERSAL, pb.GoldenRoute.UNIVERSAL_LOAD) and uni_state is None:
                x = self.w.call("routes", "ds_to_universal", {"src": src, "out": uni, "inject": inject},
                                log + ".ds_to_universal.log")
                uni_state = (x["ok"], "ds_to_universal.py: " + self.fail_line(x) if not x["ok"] else "")
            if r.kind == pb.GoldenRoute.DS_TO_UNIVERSAL:
                if not uni_state[0]:
                    res = {"pass": False, "detail": uni_state[1]}
                else:
                    res = self.call("compare_universal_files", {"out": uni, "expected": exp}, log)
            elif r.kind == pb.GoldenRoute.ZERO_TO_FP32:
                res = self.call("compare_zero_to_fp32", {"src": src_root, "tag": c.tag, "expected": exp}, log)
            else:
                universal = r.kind == pb.GoldenRoute.UNIVERSAL_LOAD
                if universal and not uni_state[0]:
                    res = {"pass": False, "detail": uni_state[1]}
                else:
                    dump = os.path.join(d, f"dump{i}")
                    load_dir, tag = (os.path.dirname(uni), c.tag + "_universal") if universal else (src_root, c.tag)
                    j = self.w.job(world(r.target), spec(c, r.target, [{"do": "load", "dir": load_dir, "tag": tag},
                                                                       {"do": "dump", "dir": dump}], universal), log)
                    if not j["ok"]:
                        res = {"pass": False, "detail": "DeepSpeed's load: " + self.fail_line(j)}
                    else:
                        res = self.call("compare_dump", {"ref": dump, "family": c.model.family, "expected": exp}, log)
            self.rows.append({"case": c.name, "route": name, "pass": bool(res["pass"]), "detail": res["detail"],
                              "seconds": round(time.time() - t, 1)})
            print(f"  {c.name:<24} {name:<30} {'PASS' if res['pass'] else 'FAIL'}  {res['detail']}", flush=True)

    def call(self, function, args, log):
        x = self.w.call("routes", function, args, log + f".{function}.log")
        if not x["ok"]:
            return {"pass": False, "detail": self.fail_line(x)}
        return x["result"]


def baseline_name(ds_dir):
    v = host.parse_version(ds_dir)
    return "master-edaa72212" if v >= (0, 19, 6) else ".".join(map(str, v))


def make_golden(name, env, work):
    """The saving run of golden case NAME (testdata/upstream/NAME/case.textproto):
    real DeepSpeed trains and saves; the oracle merges the job's own dump into the
    expected digests. Writes NAME/<tag>/, NAME/latest and NAME/expected.textproto."""
    c = read_text(os.path.join(GOLDEN, name, "case.textproto"), pb.GoldenCase())
    steps = int(c.tag.replace("global_step", ""))
    root = c.root or host.default_root(c.saved_by)
    w = host.Worker(env, root, c.saved_by, work, os.path.join(work, "worker.log")).wait_ready()
    try:
        out = os.path.join(work, "save")
        r = w.job(world(c.source), spec(c, c.source, [{"do": "train", "steps": steps, "record": "train"},
                                                      {"do": "save", "dir": out, "tag": c.tag},
                                                      {"do": "dump", "dir": os.path.join(work, "ref")}]),
                  os.path.join(work, "save"))
        if not r["ok"]:
            raise SystemExit(f"the saving run failed: {r.get('error')} ({r.get('log')})")
        x = w.call("oracle", "digests", {"ref": os.path.join(work, "ref"), "family": c.model.family},
                   os.path.join(work, "digests.log"))
        if not x["ok"] or x["result"]["problems"]:
            raise SystemExit(f"the oracle: {x.get('error') or x['result']['problems']}")
    finally:
        w.close()
    dg = x["result"]
    exp = pb.Expected(step=float(dg["steps"][0]), global_steps=dg["global_steps"])
    for g in dg["groups"]:
        exp.group_json.append(json.dumps({k: g[k] for k in ("lr", "betas", "eps", "weight_decay") if k in g},
                                         sort_keys=True))
    for param, states in dg["tensors"].items():
        for state, t in states.items():
            exp.tensor.add(param=param, state=state, shape=t["shape"], dtype=t["dtype"], sha256=t["sha256"],
                           sum=t["sum"], l2=t["l2"], absmax=t["absmax"])
    dst = os.path.join(GOLDEN, name)
    shutil.rmtree(os.path.join(dst, c.tag), ignore_errors=True)
    shutil.copytree(os.path.join(out, c.tag), os.path.join(dst, c.tag))
    shutil.copy(os.path.join(out, "latest"), os.path.join(dst, "latest"))
    write_text(os.path.join(dst, "expected.textproto"), exp)
    print(f"golden {name}: {len(exp.tensor)} digests, saved by DeepSpeed {w.info['deepspeed']} in {root}")


def main(argv=None):
    global pb
    ap = argparse.ArgumentParser(description="golden regression of DeepSpeed's checkpoint routes")
    ap.add_argument("--deepspeed_src", help="the DeepSpeed tree to check (a folder, or a version of ../shared)")
    ap.add_argument("--baseline", default=None, help="a release's recorded baseline, or 'none'")
    ap.add_argument("--root", default=None, help="trixie or sid (default: by the tree's version)")
    ap.add_argument("--cases", default="", help="comma list of golden cases (default all)")
    ap.add_argument("--record_baseline", action="store_true")
    ap.add_argument("--make_golden", default=None, metavar="NAME")
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--pb2", default=None)
    ap.add_argument("--deepspeed_env", default=None)
    a = ap.parse_args(argv)
    pb = host.load_pb2(a.pb2)
    user_cwd = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
    os.chdir(os.path.dirname(HERE))
    env = host.Env(script=a.deepspeed_env)
    work = tempfile.mkdtemp(prefix="upstream-", dir=a.work or os.environ.get("TEST_TMPDIR") or None)
    if a.make_golden:
        make_golden(a.make_golden, env, work)
        shutil.rmtree(work, ignore_errors=True)
        return 0
    if not a.deepspeed_src:
        raise SystemExit("--deepspeed_src=DIR (a DeepSpeed checkout) or a version of ../shared/deepspeed-src")
    ds = a.deepspeed_src
    if os.path.isdir(os.path.join(user_cwd, ds)):
        ds_dir = os.path.abspath(os.path.join(user_cwd, ds))
    else:  # a version of ../shared/deepspeed-src
        import subprocess
        p = subprocess.run([env.script, "deepspeed", ds], capture_output=True, text=True, env=env.environ())
        ds_dir = p.stdout.strip()
        if p.returncode or not ds_dir:
            raise SystemExit(f"no DeepSpeed tree '{ds}' (a folder with deepspeed/ and version.txt, or a version "
                             f"in ../shared/deepspeed-src): {p.stderr.strip()}")
    release = baseline_name(ds_dir)
    base_name = a.baseline or release
    baseline = {}
    if base_name != "none" and not a.record_baseline:
        p = os.path.join(GOLDEN, "baselines", f"{base_name}.textproto")
        if not os.path.exists(p):
            have = sorted(f[:-len(".textproto")] for f in os.listdir(os.path.join(GOLDEN, "baselines")))
            raise SystemExit(f"no recorded baseline for DeepSpeed {base_name} (have: {', '.join(have)}); "
                             "pass --baseline=VERSION or --baseline=none")
        for r in read_text(p, pb.Baseline()).row:
            baseline[(r.case, r.route)] = r.passed
    root = a.root or host.default_root(ds_dir)
    cases = golden_cases([c for c in a.cases.split(",") if c])
    print(f"DeepSpeed tree: {ds_dir} (version.txt: {open(os.path.join(ds_dir, 'version.txt')).read().strip()}); "
          f"root {root}; baseline {base_name}", flush=True)
    try:
        w = host.Worker(env, root, ds_dir, work, os.path.join(work, "worker.log")).wait_ready()
    except host.WorkerError as e:
        print(f"upstream_check: {e}", file=sys.stderr)
        return 2
    print(f"worker: DeepSpeed {w.info['deepspeed']}, torch {w.info['torch']}, Python {w.info['python']} "
          f"(ready in {w.info['start_s']} s)", flush=True)
    chk = Check(w, work)
    t0 = time.time()
    try:
        for c in cases:
            chk.run_case(c)
    except host.WorkerError as e:
        print(f"upstream_check: {e}", file=sys.stderr)
        return 2
    finally:
        w.close()
    regressed = 0
    print(f"\n{'case':<24} | {'route':<30} | {'result':<6} | {'vs ' + base_name:<12} | detail")
    for r in chk.rows:
        b = baseline.get((r["case"], r["route"]))
        if base_name == "none" or a.record_baseline:
            change = "-"
        elif b is None:
            change = "new"
        elif b == r["pass"]:
            change = "unchanged"
        else:
            change = "FIXED" if r["pass"] else "REGRESSED"
        regressed += change == "REGRESSED"
        print(f"{r['case']:<24} | {r['route']:<30} | {'PASS' if r['pass'] else 'FAIL':<6} | {change:<12} | "
              f"{'' if r['pass'] else r['detail']}")
    missing = [k for k in baseline if k not in {(r["case"], r["route"]) for r in chk.rows}] if not a.cases else []
    for k in missing:
        print(f"{k[0]:<24} | {k[1]:<30} | {'-':<6} | {'not run':<12} | in the baseline, not among the golden cases")
    npass = sum(r["pass"] for r in chk.rows)
    print(f"\n{npass} PASS, {len(chk.rows) - npass} FAIL, {regressed} REGRESSED against {base_name} "
          f"({time.time() - t0:.0f} s)")
    if a.record_baseline:
        b = pb.Baseline(deepspeed=release, root=root)
        path = os.path.join(GOLDEN, "baselines", f"{release}.textproto")
        if a.cases and os.path.exists(path):  # keep the rows of the cases not run
            run = {c.name for c in cases}
            for r in read_text(path, pb.Baseline()).row:
                if r.case not in run:
                    b.row.add().CopyFrom(r)
        for r in chk.rows:
            b.row.add(case=r["case"], route=r["route"], passed=r["pass"], detail=r["detail"])
        os.makedirs(os.path.join(GOLDEN, "baselines"), exist_ok=True)
        b.row.sort(key=lambda r: (r.case, r.route))
        write_text(path, b)
        print(f"baseline written: {GOLDEN}/baselines/{release}.textproto")
    if a.keep:
        print(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if regressed else 0


if __name__ == "__main__":
    sys.exit(main())
