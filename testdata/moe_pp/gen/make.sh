#!/usr/bin/env bash
# Remakes the saves of testdata/moe_pp with real DeepSpeed (tools/deepspeed_env.sh: the
# trixie root, built on first use) into OUT (default: a temporary folder), one at a time:
#   testdata/moe_pp/gen/make.sh [OUT]
# Each OUT/NAME holds global_step3/ and ref/rank{0..3}.pt, as the committed ones; then
# DeepSpeed itself loads each save at its own topology (moepp.py --mode load: every param
# equal to the snapshot, one more step), as a check that the save is whole.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
port=29650
make_one() {  # NAME VERSION moepp-args...
  local name=$1 version=$2
  shift 2
  local work="$OUT/work/$name"
  rm -rf "$work" "$OUT/$name"
  mkdir -p "$work/logs"
  for mode in save load; do
    port=$((port + 1))
    # The cwd stays the DeepSpeed source folder (its version.txt names the version).
    timeout 600 "$REPO/tools/deepspeed_env.sh" run --root=trixie --deepspeed="$version" --bind="$OUT" --bind="$HERE" -- \
      env MOEPP_LOGDIR="$work/logs/$mode" python3 "$HERE/launch.py" 4 "$port" "$HERE/moepp.py" "$@" \
      --dir "$work/ck" --mode "$mode" >"$work/logs/$mode.out" 2>&1 ||
      { echo "$name: $mode failed, see $work/logs/$mode.out" >&2; return 1; }
  done
  grep -h "after load: params equal\|step 4 loss" "$work/logs/load.out" | sort -u
  mkdir -p "$OUT/$name/ref"
  cp -r "$work/ck/global_step3" "$OUT/$name/"
  cp "$work/ck_snap/"rank*.pt "$OUT/$name/ref/"
  echo "$OUT/$name"
}
make_one ds0195_pp2_ep2_zero1_dp2_moe013 0.19.5 --pp 2 --dp 2 --ep 2 --moe_blocks 0,1,3
make_one ds0189_pp2_ep1_zero1_dp2 0.18.9 --pp 2 --dp 2 --ep 1 --moe_blocks 1,2
make_one ds0144_pp2_ep2_zero1_dp2 0.14.4 --pp 2 --dp 2 --ep 2 --moe_blocks 1,2
