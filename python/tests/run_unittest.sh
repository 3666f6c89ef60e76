#!/usr/bin/env bash
# Runs one unittest file of python/tests with Debian's /usr/bin/python3 (torch
# 1.13 + numpy), the package from the runfiles (python/ucp and its extension)
# on PYTHONPATH. Usage (from the BUILD): run_unittest.sh TEST.py UCP_CLI
set -euo pipefail
test_file=$1
export UCP_CLI=$(readlink -f "$2")
root=$PWD  # the runfiles of the workspace (..../ucp)
export UCP_FIXTURES=$(readlink -f "$root/../shared/fixtures")
export UCP_README=$(readlink -f "$root/README.md")
export PYTHONPATH="$root/python"
export PYTHONDONTWRITEBYTECODE=1
export UCP_RUNFILES=$root
cd "$(dirname "$test_file")"
module=$(basename "$test_file" .py)
exec /usr/bin/python3 -m unittest -v "$module" 2>&1
