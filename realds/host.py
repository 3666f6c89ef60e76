# Host side of the real-DeepSpeed tests (realds/README.md): starts the workers
# (worker/zygote.py) in the Debian roots through tools/deepspeed_env.sh, talks to
# them, and runs ucp. Used by driver.py (the cases) and upstream_check.py (the
# goldens). Needs Debian's /usr/bin/python3 and python3-protobuf; no torch.
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def load_pb2(pb2_dir=None):
    """realds_pb2, generated from realds.proto by Bazel (//realds:realds_pb2) or,
    outside Bazel, by protoc into a cache folder."""
    for d in [pb2_dir, HERE]:
        if d and os.path.exists(os.path.join(d, "realds_pb2.py")):
            sys.path.insert(0, d)
            import realds_pb2
            return realds_pb2
    cache = os.path.join(cache_dir(), "realds_pb2")
    os.makedirs(cache, exist_ok=True)
    subprocess.run(["protoc", f"--proto_path={HERE}", f"--python_out={cache}", os.path.join(HERE, "realds.proto")],
                   check=True)
    sys.path.insert(0, cache)
    import realds_pb2
    return realds_pb2


def cache_dir():
    if os.environ.get("UCP_CACHE_DIR"):
        return os.environ["UCP_CACHE_DIR"]
    import pwd
    home = pwd.getpwuid(os.getuid()).pw_dir if os.environ.get("TEST_TMPDIR") else os.path.expanduser("~")
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "ucp")


def parse_version(v):
    """(major, minor, patch) of a DeepSpeed version name: '0.14.4', 'master-edaa72212'
    (0.19.6, master's version.txt), or a source folder's version.txt."""
    if os.path.isdir(v):
        with open(os.path.join(v, "version.txt")) as f:
            v = f.read().strip()
    if v.startswith("master"):
        return (0, 19, 6)
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", v)
    if not m:
        raise SystemExit(f"cannot tell the version of DeepSpeed '{v}'")
    return tuple(int(x) for x in m.groups())


def default_root(version):
    """Where a DeepSpeed version runs (../shared/docs/REAL-CLIENTS.md): master
    (0.19.6) imports only in sid; 0.14 - 0.17 import only under Python 3.13
    (trixie); 0.18.9 and 0.19.5 run in both (trixie by default)."""
    return "sid" if parse_version(version) >= (0, 19, 6) else "trixie"


class Env:
    """Where tools/deepspeed_env.sh and ../shared are."""

    def __init__(self, repo=None, script=None, shared=None):
        self.repo = repo or os.path.dirname(HERE)
        self.script = script or os.path.join(self.repo, "tools", "deepspeed_env.sh")
        self.shared = shared or os.environ.get("UCP_SHARED_DIR") or os.path.join(self.repo, "..", "shared")

    def environ(self):
        env = dict(os.environ)
        env["UCP_SHARED_DIR"] = os.path.abspath(self.shared)
        env.setdefault("UCP_CACHE_DIR", cache_dir())
        return env


class WorkerError(Exception):
    pass


class Worker:
    """One zygote in one root with one DeepSpeed: one import of DeepSpeed, any
    number of jobs."""

    def __init__(self, env, root, deepspeed, work, log, hash_seed=0):
        self.root, self.deepspeed, self.work = root, deepspeed, work
        wdir = os.path.join(work, "worker")
        if not os.path.exists(wdir):  # a real copy: runfiles are symlinks the root cannot follow
            shutil.copytree(os.path.join(HERE, "worker"), wdir, symlinks=False,
                            ignore=shutil.ignore_patterns("__pycache__"))
        self.log_path = log
        self.errlog = open(log, "w")
        t = time.time()
        cmd = [env.script, "run", f"--root={root}", f"--deepspeed={deepspeed}", f"--bind={work}",
               f"--env=PYTHONHASHSEED={hash_seed}", "--", "python3", os.path.join(wdir, "zygote.py")]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog,
                                  text=True, env=env.environ())
        self.t0 = t
        self.info = None

    def wait_ready(self):
        """The worker's first reply (it has imported DeepSpeed); starting several
        workers before waiting for any lets them import at once."""
        if self.info is None:
            self.info = self._read()
            self.info["start_s"] = round(time.time() - self.t0, 1)
            if not self.info.get("ready"):
                raise WorkerError(f"DeepSpeed {self.deepspeed} in {self.root}: {self.info.get('error')} "
                                  f"(log {self.log_path})")
        return self

    def _read(self):
        line = self.p.stdout.readline()
        if not line:
            self.errlog.flush()
            with open(self.log_path, errors="replace") as f:
                tail = [l for l in f.read().splitlines() if l.strip()][-3:]
            raise WorkerError(f"the worker (DeepSpeed {self.deepspeed} in {self.root}) exited: " + " | ".join(tail))
        return json.loads(line)

    def send(self, obj):
        self.p.stdin.write(json.dumps(obj) + "\n")
        self.p.stdin.flush()
        return self._read()

    def job(self, world, spec, log, timeout=900):
        return self.send({"op": "job", "world": world, "spec": spec, "log": log, "timeout": timeout})

    def call(self, module, function, args, log, timeout=900):
        return self.send({"op": "call", "module": module, "function": function, "args": args, "log": log,
                          "timeout": timeout})

    def close(self):
        try:
            if self.p.poll() is None:
                self.p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.p.stdin.close()
                self.p.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
        self.errlog.close()


class Workers:
    """Workers started on demand, one per (root, DeepSpeed) (hash seed 0); for
    jobs whose ranks must be separate interpreters, rank r forked by worker r
    (hash seed r)."""

    def __init__(self, env, work):
        self.env, self.work, self.pool = env, work, {}

    def get(self, root, deepspeed, slot=0, wait=True):
        key = (root, deepspeed, slot)
        if key not in self.pool:
            name = re.sub(r"[^\w.-]", "_", f"{root}-{os.path.basename(deepspeed.rstrip('/'))}") + \
                (f"-{slot}" if slot else "")
            self.pool[key] = Worker(self.env, root, deepspeed, self.work,
                                    os.path.join(self.work, f"worker-{name}.log"), hash_seed=slot)
        w = self.pool[key]
        if wait and w.info is None:
            w.wait_ready()
            print(f"  worker: DeepSpeed {w.info['deepspeed']} in {root} (torch {w.info['torch']}, Python "
                  f"{w.info['python']})" + (f", hash seed {slot}" if slot else "") +
                  f", ready in {w.info['start_s']} s", flush=True)
        return w

    def job(self, root, deepspeed, world, spec, log, independent=False, timeout=900):
        """One job; independent: each rank forked by a worker of its own (its own
        interpreter and hash seed, as a launcher starts ranks: DeepSpeed 0.14
        then lists optimizer states in a set's order, which differs by rank; in
        Python 3.13 hash seeds 0 and 1 order {exp_avg, exp_avg_sq} differently)."""
        if not independent:
            return self.get(root, deepspeed).job(world, spec, log, timeout)
        workers = [self.get(root, deepspeed, slot=r, wait=False) for r in range(world)]
        workers = [self.get(root, deepspeed, slot=r) for r in range(world)]
        for f in (f"{log}.store", f"{log}.abort"):
            if os.path.exists(f):
                os.remove(f)
        for r, w in enumerate(workers):
            w.p.stdin.write(json.dumps({"op": "job", "world": world, "ranks": [r], "spec": spec, "log": log,
                                        "timeout": timeout, "abort": f"{log}.abort"}) + "\n")
            w.p.stdin.flush()
        replies = [w._read() for w in workers]
        out = {"ok": all(x["ok"] for x in replies), "seconds": max(x.get("seconds", 0) for x in replies)}
        if not out["ok"]:
            bad = [x for x in replies if not x["ok"]]
            first = next((x for x in bad if x.get("error") and "gloo" not in x["error"]), bad[0])
            out["error"], out["log"] = first.get("error"), first.get("log")
        return out

    def close(self):
        for w in self.pool.values():
            w.close()


def run_ucp(ucp, args, log):
    """ucp on the host; (ok, the last line or the error)."""
    t = time.time()
    quiet = [] if args[0] in ("verify", "inspect", "rules") else ["--progress=never"]
    p = subprocess.run([ucp] + args + quiet, capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(" ".join([ucp] + args) + "\n" + p.stdout + p.stderr)
    lines = [l for l in (p.stdout + p.stderr).splitlines() if l.strip()]
    return p.returncode == 0, (lines[-1] if lines else ""), round(time.time() - t, 2)
