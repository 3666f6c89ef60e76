#!/usr/bin/env bash
# Two builds of ucp timed alternately on the same checkpoint: the A/B figures
# quoted in README "Performance" and docs/SCALE.md ("alternating two builds
# on the same input, outputs identical").
#
#   bench/ab.sh --a=OLD_UCP --b=NEW_UCP --source=GLOBAL_STEP_FOLDER
#               [--op=convert|reshard-z|export] [--ranks=1] [--runs=3]
#               [--cache=warm|cold] [--drop=1] [--workdir=/tmp/ucp_ab]
#               [--free_page_reporting=off|keep] [-- EXTRA_UCP_FLAGS...]
#
# Each run times A, then B (even runs: B, then A, so neither always goes
# first), each from the same page-cache state:
#   warm  sync, drop all caches, read the source folder once;
#   cold  sync, drop all caches.
# Dropping caches needs root: without it (or with --drop=0, which leaves a
# shared machine's caches alone) `--cache=cold` is refused and warm runs only
# read the source first (the report says so). The binaries are read
# before each run (drop_caches evicts them too). When it drops caches, it also
# turns free page reporting off for its runs and touches the free memory once
# first, as bench/run_bench.sh does (bench/pin_memory.sh; put back at the end;
# --free_page_reporting=keep leaves memory as it is).
#
# --op: convert (ZeRO -> universal), reshard-z (ZeRO -> ZeRO at tp 1 pp 1 dp 1
# unless EXTRA_UCP_FLAGS set another topology, e.g. -- --dp=8) or export.
# --ranks=R > 1 runs `mpirun -np R` with the settings of bench/run_bench.sh
# (bench/one_node_mpi.sh).
#
# Prints each build's seconds per run, their medians and B's median over
# A's, then compares the two builds' outputs of the first run (every file,
# byte for byte) and exits 1 when they differ. The source is never written; the work folder is removed at
# the end.
set -euo pipefail
cd "$(dirname "$0")/.."

A="" B="" SOURCE="" OP=convert RANKS=1 RUNS=3 CACHE=warm DROP=1 WORK=/tmp/ucp_ab FREE_PAGE_REPORTING=off
EXTRA=()
while (($#)); do
  case "$1" in
    --a=*) A="$(readlink -f "${1#*=}")" ;;
    --b=*) B="$(readlink -f "${1#*=}")" ;;
    --source=*) SOURCE="$(readlink -f "${1#*=}")" ;;
    --op=*) OP="${1#*=}" ;;
    --ranks=*) RANKS="${1#*=}" ;;
    --runs=*) RUNS="${1#*=}" ;;
    --cache=*) CACHE="${1#*=}" ;;
    --drop=*) DROP="${1#*=}" ;;
    --workdir=*) WORK="${1#*=}" ;;
    --free_page_reporting=*) FREE_PAGE_REPORTING="${1#*=}" ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "bench/ab.sh: unknown argument '$1' (see the comment at the top of the script)" >&2; exit 2 ;;
  esac
  shift
done
die() { echo "bench/ab.sh: $*" >&2; exit 2; }
[[ -n "$A" && -x "$A" ]] || die "--a=UCP: not an executable: '${A}'"
[[ -n "$B" && -x "$B" ]] || die "--b=UCP: not an executable: '${B}'"
[[ -n "$SOURCE" && -d "$SOURCE" ]] || die "--source=FOLDER: not a folder: '${SOURCE}'"
[[ "$OP" =~ ^(convert|reshard-z|export)$ ]] || die "--op=$OP: expected convert, reshard-z or export"
[[ "$RANKS" =~ ^[1-9][0-9]*$ ]] || die "--ranks=$RANKS: expected a positive integer"
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "--runs=$RUNS: expected a positive integer"
[[ "$CACHE" =~ ^(warm|cold)$ ]] || die "--cache=$CACHE: expected warm or cold"
CAN_DROP=0
[[ "$DROP" != 0 && -w /proc/sys/vm/drop_caches ]] && CAN_DROP=1
((CAN_DROP)) || [[ "$CACHE" == warm ]] || die "--cache=cold needs root (writing /proc/sys/vm/drop_caches) and --drop=1"
case "$WORK" in "$SOURCE" | "$SOURCE"/*) die "--workdir=$WORK is inside the source" ;; esac

source bench/one_node_mpi.sh  # Open MPI's settings, as bench/run_bench.sh's
source bench/pin_memory.sh
check_free_page_reporting_flag "$FREE_PAGE_REPORTING"
launcher "$RANKS"

rm -rf "$WORK"
mkdir -p "$WORK"
# Each run's folder placed as a new top-level folder, away from the inodes
# earlier runs deleted (bench/run_bench.sh, "Output placement").
chattr +T "$WORK" 2>/dev/null || true
trap 'unpin_memory; rm -rf "$WORK"' EXIT
MEMORY_NOTE="memory: as it is (caches not dropped)"
if ((CAN_DROP)); then pin_memory "$FREE_PAGE_REPORTING" >/dev/null; fi

# One timed run of build $1 ("a" or "b") into $WORK/$1-$2; prints seconds.
run_one() {
  local name=$1 i=$2 bin out args
  if [[ $name == a ]]; then bin=$A; else bin=$B; fi
  out=$WORK/$name-$i
  rm -rf "$out"
  mkdir -p "$out"
  case "$OP" in
    convert) args=(convert --input_folder="$SOURCE" --output_folder="$out/u") ;;
    reshard-z) args=(reshard --input_folder="$SOURCE" --output_folder="$out/z/global_step1" --tp=1 --pp=1 --dp=1) ;;
    export) args=(export --input_folder="$SOURCE" --output_folder="$out/e") ;;
  esac
  sync
  if ((CAN_DROP)); then echo 3 >/proc/sys/vm/drop_caches; fi
  if [[ "$CACHE" == warm ]]; then cat "$SOURCE"/* >/dev/null 2>&1 || true; fi
  cat "$bin" >/dev/null
  local t0 t1
  t0=$(date +%s.%N)
  if ! "${launch[@]}" "$bin" "${args[@]}" "${EXTRA[@]}" --progress=never >/dev/null 2>"$out.err"; then
    cat "$out.err" >&2
    echo "bench/ab.sh: build $name ($bin) failed on run $i" >&2
    exit 1
  fi
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f\n", b - a}'
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

times_a="" times_b=""
for ((i = 1; i <= RUNS; i++)); do
  if ((i % 2)); then order=(a b); else order=(b a); fi
  for name in "${order[@]}"; do
    t=$(run_one "$name" "$i")
    if [[ $name == a ]]; then times_a+=" $t"; else times_b+=" $t"; fi
    # Keep only the first run's outputs (compared below): the disk stays as free as at the start.
    ((i == 1)) || rm -rf "${WORK:?}/$name-$i"
  done
done

med_a=$(median <<<"$times_a")
med_b=$(median <<<"$times_b")
echo "== bench/ab.sh: $OP, $RANKS rank(s), $CACHE, $RUNS run(s) each, source $SOURCE ${EXTRA[*]}"
((CAN_DROP)) || echo "   (page caches were not dropped between runs: not root, or --drop=0)"
echo "   $MEMORY_NOTE"
echo "a $A:$times_a s (median $med_a)"
echo "b $B:$times_b s (median $med_b)"
awk -v a="$med_a" -v b="$med_b" 'BEGIN {printf "median b / a: %.0f%%\n", 100 * b / a}'

# The outputs of run 1, every file byte for byte.
if ! diff -r "$WORK/a-1" "$WORK/b-1" >"$WORK/diff.txt" 2>&1; then
  head -20 "$WORK/diff.txt"
  echo "outputs: DIFFERENT"
  exit 1
fi
echo "outputs: identical"
