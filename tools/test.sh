#!/usr/bin/env bash
# Runs every test of the repository (the README's test command). Extra
# arguments go to `bazel test`. The fixtures in ../shared are real DeepSpeed
# checkpoints every test reads through its runfiles (symlinks to them): they
# are hashed before and after, and a test that wrote into one fails the run,
# naming the file.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=../shared/fixtures
sums() { (cd "$shared" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
before=""
if [[ -d $shared ]]; then before=$(sums); fi
rc=0
bazel test //... --test_output=errors "$@" || rc=$?
if [[ -n $before ]]; then
  if ! changed=$(diff <(echo "$before") <(sums)); then
    echo "test.sh: the tests changed fixtures in $shared (a test wrote through a runfiles symlink):" >&2
    echo "$changed" >&2
    exit 1
  fi
  echo "test.sh: the fixtures in $shared are unchanged"
fi
exit "$rc"
