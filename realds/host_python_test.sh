#!/bin/bash
# Runs a Python test of realds/ with Debian's /usr/bin/python3 (python3-torch,
# python3-protobuf) on the host, no DeepSpeed. Args: SCRIPT [ARGS...]
set -euo pipefail
exec /usr/bin/python3 "$@"
