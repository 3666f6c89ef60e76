#!/usr/bin/env bash
# Runs every test of the repository (the README's test command). Extra
# arguments go to `bazel test`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bazel test //... --test_output=errors "$@"
