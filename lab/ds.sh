#!/bin/bash
# ds.sh NPROC script.py args... : run a lab script in the chroot under DeepSpeed 0.14.4
# (torch.distributed.run via lab/torchrun.py, gloo on CPU). DS_VERSION_DIR overrides /opt/ds-0.14.4.
# TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: DeepSpeed 0.14.4 predates torch 2.6's weights_only=True default
# and calls torch.load(path) on files holding numpy rng states (savanna's client state).
LAB=$(cd "$(dirname "$0")" && pwd)
N=$1; shift
exec chroot /work/lab/trixie env PYTHONPATH=${DS_VERSION_DIR:-/opt/ds-0.14.4}:$LAB DS_ACCELERATOR=cpu \
  OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo PYTHONHASHSEED=0 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 \
  python3 $LAB/torchrun.py --master_port=${LAB_PORT:-29614} --nproc_per_node=$N "$@"
