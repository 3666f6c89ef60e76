#!/usr/bin/env python3
"""Minimal stand-in for `python3 -m torch.distributed.run --nproc_per_node=N` (lab only).

Debian's torch 2.6 in the chroot is built without libuv, and torch.distributed.run's rendezvous
creates its TCPStore with use_libuv=True unconditionally (static and c10d backends both fail with
"use_libuv was requested but PyTorch was build without libuv support"). This launcher sets the same
environment torch.distributed.run would (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) plus USE_LIBUV=0, which the env:// rendezvous of init_process_group honours, and
LOCAL_SIZE=1 (see below), and starts N copies of the script. It exits non-zero if any rank fails.

usage: python3 ds19_launch.py N PORT script.py args...
"""
import os
import subprocess
import sys

n, port, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
procs = []
for r in range(n):
    env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
               MASTER_ADDR='127.0.0.1', MASTER_PORT=port, USE_LIBUV='0', OMP_NUM_THREADS='1',
               # DeepSpeed 0.14.4's CPU accelerator counts NUMA nodes with `numactl` (absent in the chroot)
               # unless LOCAL_SIZE says it; ZeRO-3's gradient scatter asks. 1: this machine's one node.
               LOCAL_SIZE='1')
    procs.append(subprocess.Popen([sys.executable, script] + sys.argv[4:], env=env))
rc = 0
for p in procs:
    rc = rc or p.wait()
sys.exit(rc)
