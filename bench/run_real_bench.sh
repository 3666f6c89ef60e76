#!/usr/bin/env bash
# The benchmark (bench/run_bench.sh) on checkpoints real DeepSpeed writes:
# every shape of bench/real_checkpoints.py (made once by unmodified DeepSpeed
# in a Debian root and cached; needs root and tools/deepspeed_env.sh's roots),
# then on the generated checkpoint, each report kept as WORKDIR-SHAPE.report.txt
# and all of them printed together at the end.
#
#   bench/run_real_bench.sh [--shapes=a,b|all] [--gb=3] [run_bench.sh flags...]
#
# As root, free page reporting is turned off once for all the shapes
# (bench/pin_memory.sh; --free_page_reporting=keep leaves it) and put back at
# the end; each run_bench.sh touches the free memory once more before its
# timings.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/pin_memory.sh

SHAPES=all
GB=3
WORK=/tmp/ucp_bench
FREE_PAGE_REPORTING=off
PASS=()
for arg in "$@"; do
  case "$arg" in
    --shapes=*) SHAPES="${arg#*=}" ;;
    --gb=*) GB="${arg#*=}" ;;
    --workdir=*) WORK="${arg#*=}" ;;
    --free_page_reporting=*) FREE_PAGE_REPORTING="${arg#*=}"; PASS+=("$arg") ;;
    *) PASS+=("$arg") ;;
  esac
done
check_free_page_reporting_flag "$FREE_PAGE_REPORTING"

mapfile -t NAMES < <(/usr/bin/python3 bench/real_checkpoints.py --shapes="$SHAPES" --list | cut -d: -f1)
mapfile -t FOLDERS < <(/usr/bin/python3 bench/real_checkpoints.py --shapes="$SHAPES")
if [[ -w /proc/sys/vm/drop_caches ]]; then
  trap unpin_memory EXIT
  pin_memory "$FREE_PAGE_REPORTING"
fi
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
