# The worker of the real-DeepSpeed tests, in a Debian root (see realds/README.md):
# imports torch and DeepSpeed once, then serves the driver's commands, one JSON
# object a line on stdin, one JSON reply a line on stdout:
#
#   {"op": "job", "world": N, "spec": {...}, "log": PREFIX, "timeout": S}
#        forks N ranks of one DeepSpeed job (jobs.py; trainer_job.py for a spec
#        with "runner": "trainer") on a fresh gloo process group
#        (a FileStore, no port); each rank's output goes to PREFIX.rank<R>. If a
#        rank fails the others are killed. Reply: ok, seconds, error (the failing
#        rank's last exception line). With "ranks": [R...] and "abort": FILE, only
#        those ranks: the driver starts one worker per rank (own interpreter,
#        own hash seed) and sends each its rank.
#   {"op": "call", "module": M, "function": F, "args": {...}, "log": PATH}
#        forks one process that runs M.F(**args) (the oracle, DeepSpeed's own
#        converters) and replies with its return value as "result".
#   {"op": "quit"}
#
# The first reply says what runs: {"ready": true, "deepspeed": ..., "torch": ...}.
# Forking after the import makes every job start in about a second instead of the
# 10-20 s an import of DeepSpeed takes. DeepSpeed is not modified: the worker only
# turns off its JIT-built CPU shared-memory collective (no compiler in the root)
# through DeepSpeed's own table of compatible ops.
import gc
import json
import os
import re
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # DeepSpeed's MoE gate is torch.compile'd: no compiler here


def _ds_version_from_cwd():
    try:
        with open("version.txt") as f:
            return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", f.read().strip()).groups())
    except (OSError, AttributeError):
        return None


v = _ds_version_from_cwd()
if v is not None and v < (0, 16, 0):
    # DeepSpeed < 0.16 calls torch.load without weights_only, which torch >= 2.6
    # turns into weights_only=True: its own checkpoints (numpy rng states, loss
    # scalers) would not load. torch's switch restores the old default where the
    # caller did not choose.
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

REPLY = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # anything printed goes to stderr, never into the replies


def reply(obj):
    REPLY.write(json.dumps(obj) + "\n")


def last_error(path):
    """The last exception line of a log (what a user would quote)."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    pat = re.compile(r"^([\w.]+(Error|Exception|Exit|Interrupt)|AssertionError|KeyError|SystemExit)\b")
    for line in reversed(lines):
        if pat.match(line.strip()):
            return line.strip()
    tail = [l for l in lines if l.strip()]
    return tail[-1].strip() if tail else ""


def child(log, fn):
    """In a forked child: output to log, run fn, exit without the parent's atexit."""
    rc = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        fn()
        rc = 0
    except SystemExit as e:
        if e.code not in (0, None):
            print(f"SystemExit: {e.code}", file=sys.stderr)
        else:
            rc = 0
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def wait_all(pids, timeout, abort=None):
    """Waits for the ranks; the first failure (or the timeout) kills the rest.
    `abort`: a file other workers' ranks of the same job watch (a job whose
    ranks come from several workers): written on a failure here, and a failure
    there when it appears."""
    rcs = {p: None for p in pids}
    deadline = time.time() + timeout
    kill_at = None
    while any(v is None for v in rcs.values()):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.time()
            if kill_at is None and abort and os.path.exists(abort):
                kill_at = now + 5
            if now > deadline or (kill_at is not None and now > kill_at):
                for p, r in rcs.items():
                    if r is None:
                        try:
                            os.kill(p, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                kill_at = now + 3600
            time.sleep(0.05)
            continue
        if pid in rcs:
            rcs[pid] = os.waitstatus_to_exitcode(status)
            if rcs[pid] != 0 and kill_at is None:
                kill_at = time.time() + 5  # the others are stuck in a collective
                if abort:
                    open(abort, "w").close()
    timed_out = time.time() > deadline
    return [rcs[p] for p in pids], timed_out


def run_job(cmd):
    """Forks the job's ranks: all of them, or those of cmd["ranks"] when the
    job's ranks come from several workers (each its own interpreter, with its own
    hash seed, as a launcher starts them); then the driver removes the store."""
    import jobs
    runner = jobs
    if cmd["spec"].get("runner") == "trainer":
        # transformers + accelerate imported here, in the worker, once: every
        # Trainer job after the first forks with them loaded
        import trainer_job as runner
    world, log = cmd["world"], cmd["log"]
    ranks = cmd.get("ranks") or list(range(world))
    store = f"{log}.store"
    if "ranks" not in cmd and os.path.exists(store):
        os.remove(store)
    t = time.time()
    # Everything imported so far into the permanent generation: a gc.collect() in a
    # rank (accelerate calls one at every train()) then skips the worker's millions
    # of objects instead of walking them all (30-40 s a job here, and copies of
    # every page the fork shared).
    gc.freeze()
    pids = []
    for r in ranks:
        env = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "USE_LIBUV": "0",
               # DeepSpeed 0.14's CPU accelerator counts NUMA nodes with numactl (absent) unless told
               "LOCAL_SIZE": "1"}
        pid = os.fork()
        if pid == 0:
            os.environ.update(env)
            child(f"{log}.rank{r}", lambda: runner.main(cmd["spec"], r, world, store))
        pids.append(pid)
    rcs, timed_out = wait_all(pids, cmd.get("timeout", 900), cmd.get("abort"))
    out = {"ok": all(rc == 0 for rc in rcs), "rcs": rcs, "seconds": round(time.time() - t, 2)}
    if not out["ok"]:
        bad = [r for r, rc in zip(ranks, rcs) if rc != 0]
        # the rank that failed first, not one that lost its peer ("Connection closed by peer")
        first = next((r for r in bad if last_error(f"{log}.rank{r}") and "gloo" not in last_error(f"{log}.rank{r}")),
                     next((r for r in bad if last_error(f"{log}.rank{r}")), bad[0]))
        out["error"] = ("timed out after %ss; " % cmd.get("timeout", 900) if timed_out else "") + \
            last_error(f"{log}.rank{first}")
        out["log"] = f"{log}.rank{first}"
    return out


def run_call(cmd):
    import importlib
    result = cmd["log"] + ".result.json"
    if os.path.exists(result):
        os.remove(result)
    t = time.time()
    gc.freeze()  # as in run_job
    pid = os.fork()
    if pid == 0:
        def fn():
            mod = importlib.import_module(cmd["module"])
            value = getattr(mod, cmd["function"])(**cmd.get("args", {}))
            with open(result, "w") as f:
                json.dump(value, f)
        child(cmd["log"], fn)
    rcs, timed_out = wait_all([pid], cmd.get("timeout", 900))
    out = {"ok": rcs[0] == 0, "seconds": round(time.time() - t, 2)}
    if out["ok"]:
        with open(result) as f:
            out["result"] = json.load(f)
    else:
        out["error"] = ("timed out; " if timed_out else "") + last_error(cmd["log"])
        out["log"] = cmd["log"]
    return out


def main():
    t = time.time()
    try:
        import torch
        import deepspeed
        if hasattr(deepspeed.ops, "__compatible_ops__"):
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    except BaseException as e:
        traceback.print_exc()
        reply({"ready": False, "error": f"import failed: {type(e).__name__}: {e}"})
        return 1
    reply({"ready": True, "deepspeed": deepspeed.__version__, "torch": torch.__version__,
           "python": sys.version.split()[0], "import_s": round(time.time() - t, 2)})
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "quit":
                break
            elif op == "job":
                reply(run_job(cmd))
            elif op == "call":
                reply(run_call(cmd))
            else:
                reply({"ok": False, "error": f"unknown op {op}"})
        except BaseException as e:
            reply({"ok": False, "error": f"worker: {type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
