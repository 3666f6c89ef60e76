#!/usr/bin/env bash
# The benchmark (bench/run_bench.sh) on checkpoints real DeepSpeed writes:
# every shape of bench/real_checkpoints.py (made once by unmodified DeepSpeed
# in a Debian root and cached; needs root and tools/deepspeed_env.sh's roots),
# then on the generated checkpoint, each report kept as WORKDIR-SHAPE.report.txt
# and all of them printed together at the end.
#
#   bench/run_real_bench.sh [--shapes=a,b|all] [--gb=3] [run_bench.sh flags...]
set -euo pipefail
cd "$(dirname "$0")/.."

SHAPES=all
GB=3
WORK=/tmp/ucp_bench
PASS=()
for arg in "$@"; do
  case "$arg" in
    --shapes=*) SHAPES="${arg#*=}" ;;
    --gb=*) GB="${arg#*=}" ;;
    --workdir=*) WORK="${arg#*=}" ;;
    *) PASS+=("$arg") ;;
  esac
done

mapfile -t NAMES < <(/usr/bin/python3 bench/real_checkpoints.py --shapes="$SHAPES" --list | cut -d: -f1)
mapfile -t FOLDERS < <(/usr/bin/python3 bench/real_checkpoints.py --shapes="$SHAPES")
REPORTS=()
for i in "${!NAMES[@]}"; do
  echo "=== ${NAMES[$i]}: ${FOLDERS[$i]}"
  bench/run_bench.sh --source="${FOLDERS[$i]}" --workdir="$WORK-${NAMES[$i]}" "${PASS[@]}"
  REPORTS+=("$WORK-${NAMES[$i]}.report.txt")
done
echo "=== generated (~$GB GB)"
bench/run_bench.sh --gb="$GB" --workdir="$WORK-generated" "${PASS[@]}"
REPORTS+=("$WORK-generated.report.txt")

echo
echo "=================== all reports ==================="
for r in "${REPORTS[@]}"; do
  echo "--- $r"
  cat "$r"
done
