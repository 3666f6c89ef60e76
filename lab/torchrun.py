# `python3 -m torch.distributed.run` for the lab chroot. Debian 13's torch 2.6 is
# built without libuv, and the launcher's static rendezvous creates its TCPStore
# without passing use_libuv (the C++ default is True), so torch.distributed.run
# stops with "use_libuv was requested but PyTorch was build without libuv support".
# This wrapper makes that one TCPStore default to use_libuv=False and then runs
# torch.distributed.run's own main() unchanged. Workers get USE_LIBUV=0 from the
# environment (torch.distributed's env:// rendezvous honours it).
import os
import sys

import torch.distributed as dist
import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static_rdzv

os.environ["USE_LIBUV"] = "0"
_TCPStore = dist.TCPStore


def _tcp_store(*args, **kwargs):
    kwargs.setdefault("use_libuv", False)
    return _TCPStore(*args, **kwargs)


static_rdzv.TCPStore = _tcp_store

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
