#!/usr/bin/env bash
# What the disk was asked to do while a command ran: the block layer's
# requests (the kernel's block_rq_issue trace events) summed per time step,
# reads, writes and cache flushes apart. It shows how a job's reads, writes
# and flushes overlap, which its wall time alone cannot: e.g. whether a
# "cold" read came from the disk at its own speed or from a cache under it
# (a VM host's page cache serves a guest's dropped pages at memory speed).
#
#   bench/block_timeline.sh [--cache=warm|cold] [--step=0.1] [--device=NAME] -- CMD [ARGS...]
#   bench/block_timeline.sh [--step=0.1] [--device=NAME] --from_trace=FILE
#
#   --cache=cold   sync and drop all caches first (default warm: sync only)
#   --step=S       seconds per row (default 0.1)
#   --device=NAME  only requests of this block device (a name such as vda, or
#                  MAJOR,MINOR as the trace writes it; default: every device)
#   --from_trace=FILE  summarize a saved trace (the text of tracefs's `trace`
#                  file with block_rq_issue events, e.g. recorded on another
#                  machine) instead of running a command: no root needed
#
# Prints, per step from the first request, the requests issued, megabytes
# read and written, and flushes (a request with F in its flags: a cache
# flush such as an fdatasync's, or a write with a preflush or FUA), then
# totals and the command's wall time and exit status (it exits with the
# command's status).
# The command's own output goes to stderr. Needs root and tracefs (mounted
# at /sys/kernel/tracing if it is not); tracing is switched off, the event
# disabled and the trace buffer given back its size on exit, even on error. Nothing here is timed by a
# test: it is a tool to look with.
set -euo pipefail

usage_error() { echo "block_timeline.sh: $*" >&2; exit 2; }  # bad arguments: exit 2

CACHE=warm CACHE_SET=0 STEP=0.1 DEVICE="" FROM=""
while (($#)); do
  case "$1" in
    --cache=*) CACHE="${1#*=}" CACHE_SET=1 ;;
    --step=*) STEP="${1#*=}" ;;
    --device=*) DEVICE="${1#*=}" ;;
    --from_trace=*) FROM="${1#*=}" ;;
    --) shift; break ;;
    *) usage_error "unknown option $1 (usage: see the head of $0)" ;;
  esac
  shift
done
[[ "$CACHE" == warm || "$CACHE" == cold ]] || usage_error "--cache must be warm or cold"
[[ "$STEP" =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v s="$STEP" 'BEGIN{exit !(s > 0)}' ||
  usage_error "--step must be a positive number of seconds, not '$STEP'"
DEVNUM=""
if [[ "$DEVICE" =~ ^[0-9]+,[0-9]+$ ]]; then
  DEVNUM=$DEVICE
elif [[ -n "$DEVICE" ]]; then
  [[ "$DEVICE" != */* && -r /sys/class/block/$DEVICE/dev ]] || usage_error "no block device '$DEVICE'"
  DEVNUM=$(cat "/sys/class/block/$DEVICE/dev")  # MAJOR:MINOR, as the trace writes MAJOR,MINOR
  DEVNUM=${DEVNUM/:/,}
fi

if [[ -n "$FROM" ]]; then
  (($# == 0)) || usage_error "--from_trace runs no command"
  ((CACHE_SET == 0)) || usage_error "--cache is for a command it runs; --from_trace summarizes a saved trace"
  [[ -r "$FROM" ]] || usage_error "cannot read trace '$FROM'"
  TRACE=$FROM wall="" rc=0
else
  (($#)) || usage_error "no command (usage: ... -- CMD [ARGS...])"
  [[ $(id -u) == 0 ]] || { echo "block_timeline.sh: needs root (tracefs and drop_caches)" >&2; exit 1; }
  T=/sys/kernel/tracing
  if [[ ! -d $T/events/block ]]; then
    mount -t tracefs nodev "$T" 2>/dev/null || true
  fi
  [[ -d $T/events/block/block_rq_issue ]] || { echo "block_timeline.sh: no block_rq_issue event under $T" >&2; exit 1; }
  TRACE=$(mktemp)
  # The ring buffer's size per CPU before this run ("1408", or "7 (expanded:
  # 1408)" before first use), given back on exit: 64 MiB per CPU of kernel
  # memory is not left behind.
  buffer_kb=$(awk '{print $1; exit}' "$T/buffer_size_kb")
  restore() {
    echo 0 >"$T/tracing_on" || true
    echo 0 >"$T/events/block/block_rq_issue/enable" || true
    echo >"$T/trace" || true
    echo "$buffer_kb" >"$T/buffer_size_kb" || true
    rm -f "$TRACE"
  }
  trap restore EXIT

  sync
  if [[ "$CACHE" == cold ]]; then echo 3 >/proc/sys/vm/drop_caches; fi
  echo 0 >"$T/tracing_on"
  echo >"$T/trace"
  echo 65536 >"$T/buffer_size_kb"
  echo 1 >"$T/events/block/block_rq_issue/enable"
  echo 1 >"$T/tracing_on"
  start=$(date +%s.%N)
  rc=0
  "$@" >&2 || rc=$?
  end=$(date +%s.%N)
  echo 0 >"$T/tracing_on"
  cat "$T/trace" >"$TRACE"
  wall=$(echo "$end - $start" | bc)
fi

# A line: TASK-PID [CPU] FLAGS SECONDS: block_rq_issue: MAJ,MIN RWBS BYTES () SECTOR + SECTORS ...
awk -v step="$STEP" -v dev="$DEVNUM" -v wall="$wall" -v rc="$rc" '
  / block_rq_issue: / {
    for (i = 1; i <= NF; i++) if ($i == "block_rq_issue:") break
    t = $(i - 1); sub(":", "", t)
    d = $(i + 1); rw = $(i + 2); n = 0
    for (j = i; j <= NF; j++) if ($j == "+") { n = $(j + 1); break }
    if (dev != "" && d != dev) next
    if (t0 == "") t0 = t
    k = int((t - t0) / step); if (k > last) last = k
    ios[k]++
    if (rw ~ /R/) { rd[k] += n * 512; trd += n * 512 }
    if (rw ~ /W/) { wr[k] += n * 512; twr += n * 512 }
    if (rw ~ /F/) { fl[k]++; tfl++ }
    tios++
  }
  END {
    printf "%8s %6s %9s %9s %7s\n", "from s", "ios", "read MB", "write MB", "flushes"
    for (k = 0; k <= last && tios > 0; k++) {
      if (!ios[k]) continue
      printf "%8.2f %6d %9.1f %9.1f %7d\n", k * step, ios[k], rd[k] / 1e6, wr[k] / 1e6, fl[k]
    }
    printf "total: %d requests, %.1f MB read, %.1f MB written, %d flushes", tios, trd / 1e6, twr / 1e6, tfl
    if (wall != "") printf "; command %.2f s wall, exit %d", wall, rc
    printf "\n"
  }' "$TRACE"
exit "$rc"
