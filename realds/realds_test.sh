#!/bin/bash
# A real-DeepSpeed test target (realds/BUILD): runs realds/driver.py on the cases
# its args name, from the test's runfiles, with the ucp binary built by Bazel, the
# Debian roots of tools/deepspeed_env.sh (cached outside the clone; a missing root
# fails with the command that builds it) and DeepSpeed's sources from ../shared.
set -euo pipefail
# @shared's files in the runfiles (external/shared, or ../shared beside the workspace)
UCP_SHARED_DIR=$(tools/deepspeed_env.sh shared) || exit 1
export UCP_SHARED_DIR
exec /usr/bin/python3 realds/driver.py --ucp=tools/ucp --deepspeed_env=tools/deepspeed_env.sh "$@"
