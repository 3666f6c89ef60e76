# launch.py N PORT script.py args...   -- N ranks as subprocesses, env-based rendezvous.
import os, subprocess, sys, time
n, port = int(sys.argv[1]), sys.argv[2]
cmd = [sys.executable] + sys.argv[3:]
procs = []
extra = {}
try:  # DeepSpeed < 0.16 calls torch.load without weights_only (as realds/worker/zygote.py)
    v = tuple(int(x) for x in open("version.txt").read().strip().split(".")[:3])
    if v < (0, 16, 0):
        extra["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
except OSError:
    print("launch.py: no version.txt in cwd: DeepSpeed will call itself 0.0.0", flush=True)
logdir = os.environ["MOEPP_LOGDIR"]
os.makedirs(logdir, exist_ok=True)
for r in range(n):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r), WORLD_SIZE=str(n),
               LOCAL_RANK=str(r), LOCAL_SIZE=str(n), USE_LIBUV="0", MOEPP_HANG_DUMP=os.environ.get("MOEPP_HANG_DUMP", ""), TORCHDYNAMO_DISABLE="1", **extra)
    f = open(f"{logdir}/rank{r}.log", "w")
    procs.append((subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT), f))
rcs = [p.wait() for p, f in procs]
for r in range(n):
    print(f"===== rank {r} rc={rcs[r]} =====")
    print(open(f"{logdir}/rank{r}.log").read())
sys.exit(max(abs(x) for x in rcs))
