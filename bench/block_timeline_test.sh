#!/usr/bin/env bash
# bench/block_timeline.sh --from_trace on a hand-written trace: requests are
# summed per step, reads, writes and flushes apart, another device's are left
# out with --device; bad arguments are refused. The expected figures below
# were worked out by hand from the trace. (Running a command needs root and
# tracefs, which a test does not get: that path is not run here.)
set -euo pipefail
BT=$(readlink -f "$1")
W=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
checks=0

# Sectors are 512 bytes: 8192 sectors = 4194304 bytes = 4.2 MB, 2048 = 1.0 MB.
# The last request is a FUA write (WFS): a flush too.
# No time falls on a step's edge (floating point would decide its row).
cat >"$W/trace" <<'T'
# tracer: nop
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
        ucp-head-24641   [000] ..... 100.000000: block_rq_issue: 254,0 RA 4194304 () 1000 + 8192 be,0,4 [ucp-head]
        ucp-head-24641   [001] ..... 100.040000: block_rq_issue: 254,0 R 1048576 () 9000 + 2048 be,0,4 [ucp-head]
     kworker/u8:1-77     [001] ..... 100.120000: block_rq_issue: 254,0 WS 4194304 () 20000 + 8192 be,0,4 [kworker/u8:1]
        ucp-head-24641   [000] ..... 100.160000: block_rq_issue: 254,0 FF 0 () 0 + 0 be,0,4 [ucp-head]
          <idle>-0       [001] ..s1. 100.165000: block_rq_complete: 254,0 WS () 20000 + 8192 be,0,4 [0]
        ucp-head-24641   [000] ..... 100.170000: block_rq_issue: 8,16 W 4194304 () 5000 + 8192 be,0,4 [ucp-head]
        jbd2/vda-8-120   [000] ..... 100.360000: block_rq_issue: 254,0 WSM 1048576 () 30000 + 2048 be,0,4 [jbd2/vda-8]
        jbd2/vda-8-120   [000] ..... 100.370000: block_rq_issue: 254,0 WFS 4096 () 40000 + 8 be,0,4 [jbd2/vda-8]
T

# summarizes WHAT EXPECTED ARGS...: block_timeline.sh ARGS prints EXPECTED, exactly.
summarizes() {
  local what=$1 expected=$2 out
  shift 2
  out=$("$BT" "$@")
  [[ "$out" == "$expected" ]] || { diff <(echo "$expected") <(echo "$out") || true; fail "$what"; }
  checks=$((checks + 1))
}

summarizes "every device, step 0.1" "  from s    ios   read MB  write MB flushes
    0.00      2       5.2       0.0       0
    0.10      3       0.0       8.4       1
    0.30      2       0.0       1.1       1
total: 7 requests, 5.2 MB read, 9.4 MB written, 2 flushes" --from_trace="$W/trace"

summarizes "device 254,0, step 0.05" "  from s    ios   read MB  write MB flushes
    0.00      2       5.2       0.0       0
    0.10      1       0.0       4.2       0
    0.15      1       0.0       0.0       1
    0.35      2       0.0       1.1       1
total: 6 requests, 5.2 MB read, 5.2 MB written, 2 flushes" --from_trace="$W/trace" --device=254,0 --step=0.05

# No request of the device: the header and a zero total.
out=$("$BT" --from_trace="$W/trace" --device=9,9)
[[ "$out" == *"total: 0 requests, 0.0 MB read, 0.0 MB written, 0 flushes" ]] || { echo "$out"; fail "no request"; }
checks=$((checks + 1))

# Refused, with exit 2 and a message.
refused() {
  local want=$1; shift
  local rc=0 err
  err=$("$BT" "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc == 2 ]] || fail "$* exited $rc, not 2"
  [[ "$err" == *"$want"* ]] || fail "$*: message '$err' does not say '$want'"
  checks=$((checks + 1))
}
refused "--step must be a positive number" --from_trace="$W/trace" --step=0
refused "--step must be a positive number" --from_trace="$W/trace" --step=x
refused "--cache must be warm or cold" --cache=hot --from_trace="$W/trace"
refused "no block device 'nope'" --device=nope --from_trace="$W/trace"
refused "no block device '../x'" --device=../x --from_trace="$W/trace"
refused "cannot read trace" --from_trace="$W/missing"
refused "--from_trace runs no command" --from_trace="$W/trace" -- true
refused "--cache is for a command it runs" --cache=cold --from_trace="$W/trace"
refused "unknown option --bogus" --bogus
refused "no command" --step=0.1
[[ -f "$W/trace" ]] || fail "the trace given was removed"
echo "PASS: $checks checks"
