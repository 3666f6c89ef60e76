#!/bin/bash
# ucp against the goldens of tools/upstream_check.sh (realds/check_goldens.py):
# no DeepSpeed, the host's python3-torch. Args: UCP
set -euo pipefail
exec /usr/bin/python3 realds/check_goldens.py "$1" "$TEST_TMPDIR/goldens"
