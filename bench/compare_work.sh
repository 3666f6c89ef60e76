#!/usr/bin/env bash
# "No slower" measured where wall time cannot tell: the work two builds of
# ucp do on the same checkpoint, counted, not timed, so a busy or noisy
# machine does not change the figures.
#
#   bench/compare_work.sh OLD_UCP [NEW_UCP] [--gb=0.1] [--workdir=/tmp/ucp_work] [--keep]
#
# NEW_UCP defaults to this tree's `bazel build -c opt //tools:ucp`. Generates
# a GPT-NeoX-shaped tp=2 dp=2 ZeRO-1 checkpoint (bench/make_checkpoint, as
# bench/run_bench.sh does, smaller), then runs convert, reshard-u (universal
# -> tp1 dp1), reshard-z (ZeRO -> tp1 dp1) and export with each binary, one
# thread (--num_threads=1: a deterministic schedule) and prints for each:
#   instructions  user-space instructions executed (valgrind --tool=callgrind)
#   syscalls      system calls made, and the counts of the I/O ones (strace -c)
#   bytes         bytes written to the output (identical outputs are checked)
# and the ratio new / old. Wall time on a quiet machine is bench/run_bench.sh's
# job; this one answers "does the new build do more work" on any machine.
# Needs valgrind and strace (Debian packages `valgrind`, `strace`). The work
# folder is removed when the script ends (--keep leaves it).
set -euo pipefail
cd "$(dirname "$0")/.."

GB=0.1
WORK=/tmp/ucp_work
OLD=""
NEW=""
KEEP=0
for arg in "$@"; do
  case "$arg" in
    --gb=*) GB="${arg#*=}" ;;
    --workdir=*) WORK="${arg#*=}" ;;
    --keep) KEEP=1 ;;
    -*) echo "unknown argument $arg" >&2; exit 2 ;;
    *) if [[ -z "$OLD" ]]; then OLD="$(readlink -f "$arg")"; else NEW="$(readlink -f "$arg")"; fi ;;
  esac
done
if [[ -z "$OLD" ]]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
for tool in valgrind strace; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed: apt-get install $tool" >&2; exit 2; }
done
bazel build -c opt //tools:ucp //bench:make_checkpoint >/dev/null 2>&1 || bazel build -c opt //tools:ucp //bench:make_checkpoint
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
[[ -n "$NEW" ]] || NEW="$BIN/tools/ucp"

rm -rf "$WORK"
mkdir -p "$WORK"
trap '((KEEP)) || rm -rf "$WORK"' EXIT
SRC="$WORK/src/global_step1"
UNI="$WORK/src/global_step1_universal"
"$BIN/bench/make_checkpoint" --gb="$GB" --tp=2 --dp=2 --output_folder="$SRC" | tail -1
"$NEW" convert --input_folder="$SRC" --output_folder="$UNI" --progress=never >/dev/null

# run OP UCP OUT: the command line of one operation.
op_args() {
  local op="$1" out="$2"
  case "$op" in
    convert) echo "convert --input_folder=$SRC --output_folder=$out/global_step1_universal" ;;
    reshard-u) echo "reshard --input_folder=$UNI --output_folder=$out/global_step1 --tp=1 --pp=1 --dp=1" ;;
    reshard-z) echo "reshard --input_folder=$SRC --output_folder=$out/global_step1 --tp=1 --pp=1 --dp=1" ;;
    export) echo "export --input_folder=$SRC --output_folder=$out/hf" ;;
  esac
}

# measure OP UCP TAG: prints "instructions syscalls writes fsyncs bytes".
measure() {
  local op="$1" ucp="$2" tag="$3"
  local out="$WORK/out-$tag-$op"
  # shellcheck disable=SC2046
  rm -rf "$out"
  valgrind --tool=callgrind --callgrind-out-file="$WORK/$tag-$op.cg" "$ucp" $(op_args "$op" "$out") \
    --num_threads=1 --progress=never >/dev/null 2>"$WORK/$tag-$op.vg"
  local ir
  ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$WORK/$tag-$op.vg")
  rm -rf "$out"
  # shellcheck disable=SC2046
  strace -f -c -o "$WORK/$tag-$op.st" "$ucp" $(op_args "$op" "$out") --num_threads=1 --progress=never >/dev/null
  local calls writes fsyncs bytes
  calls=$(awk '$NF=="total"{print $(NF-2)}' "$WORK/$tag-$op.st")
  writes=$(awk '$NF=="write"||$NF=="pwrite64"{n+=$4} END{print n+0}' "$WORK/$tag-$op.st")
  fsyncs=$(awk '$NF=="fsync"||$NF=="fdatasync"{n+=$4} END{print n+0}' "$WORK/$tag-$op.st")
  bytes=$(du -sb "$out" | cut -f1)
  echo "$ir $calls $writes $fsyncs $bytes"
}

echo "old: $OLD"
echo "new: $NEW"
printf '%-10s %15s %15s %7s %9s %9s %7s %7s %13s %s\n' op "old instr" "new instr" "ratio" "old calls" "new calls" \
  "writes" "fsyncs" "bytes" "outputs"
for op in convert reshard-u reshard-z export; do
  read -r oi oc ow of ob <<<"$(measure "$op" "$OLD" old)"
  read -r ni nc nw nf nb <<<"$(measure "$op" "$NEW" new)"
  same=identical
  if ! diff -r -q "$WORK/out-old-$op" "$WORK/out-new-$op" >/dev/null; then same=DIFFER; fi
  ratio=$(awk -v a="$ni" -v b="$oi" 'BEGIN{printf "%.4f", a / b}')
  printf '%-10s %15s %15s %7s %9s %9s %7s %7s %13s %s\n' "$op" "$oi" "$ni" "$ratio" "$oc" "$nc" "$ow/$nw" "$of/$nf" \
    "$ob/$nb" "$same"
done
