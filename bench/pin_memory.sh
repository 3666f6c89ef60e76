# Sourced by bench/run_bench.sh, bench/run_real_bench.sh and bench/ab.sh:
# one memory state for every timed run, whatever ran before it.
#
# A VM guest that reports its free pages to the host (virtio-balloon free
# page reporting: /sys/module/page_reporting) has the host take back the
# memory behind every free block of page_reporting_order or more, a couple
# of seconds after it is freed; the next process to touch such memory waits
# for the host to back it again. On the VM this was measured on, `dd` of
# 1.1 GB into a new file (4 MiB writes, conv=fsync) took 0.66-0.90 s when the
# free memory it landed in was still backed and 3.3-9.4 s (sys time 2.7-8.4 s)
# when it had been reported, depending only on how long after the previous
# `drop_caches` it started (0, 1, 2, 3 or 5 s). Every benchmark run starts
# from a drop of the caches, so which row paid that, and how much, depended on
# the order of the round robin and the reporting worker's timing: the same
# convert of neox-dp4-z1 took 0.54-2.53 s in one protocol, 2.7 s of it system
# time in write() copying into new page-cache folios.
#
# pin_memory FLAG: with FLAG "off" (the default of the scripts), as root,
# where the kernel has free page reporting: sets page_reporting_order above
# the highest order the buddy allocator has (no free block qualifies, nothing
# more is reported), then touches all but 1 GiB of the available memory once
# (after sync and drop_caches), so that the memory the runs use is backed
# by the host, as a machine without a balloon always is. It prints what it
# did, and sets MEMORY_NOTE to a line for the report. unpin_memory (call it
# on EXIT) puts the order back as it was; a script that finds reporting
# already pinned by its caller leaves the order to the caller. With FLAG
# "keep", or without root or the kernel's reporting, memory is left as it is
# (and MEMORY_NOTE says so).

PAGE_REPORTING_ORDER=/sys/module/page_reporting/parameters/page_reporting_order
PINNED_FROM=""
MEMORY_NOTE="memory: as it is (free page reporting not changed)"

# Exits 2 unless $1 is a value of the scripts' --free_page_reporting flag:
# each script checks it before doing any work.
check_free_page_reporting_flag() {
  [[ "$1" =~ ^(off|keep)$ ]] || { echo "--free_page_reporting=$1: expected off or keep" >&2; exit 2; }
}

pin_memory() {
  local flag="${1:-off}" off current t0 t1 filled
  check_free_page_reporting_flag "$flag"
  if [[ ! -e $PAGE_REPORTING_ORDER ]]; then
    MEMORY_NOTE="memory: this kernel reports no free pages to a host (no /sys/module/page_reporting)"
    echo "== $MEMORY_NOTE"
    return 0
  fi
  current=$(cat "$PAGE_REPORTING_ORDER")
  # /proc/buddyinfo: "Node 0, zone DMA32 n0 n1 ... nMAX", one count per order.
  off=$(awk '{n = NF - 4; if (n > m) m = n} END {print m}' /proc/buddyinfo)
  if [[ $flag == keep ]]; then
    MEMORY_NOTE="memory: as it is (--free_page_reporting=keep: free page reporting on, page_reporting_order $current)"
    echo "== $MEMORY_NOTE"
    return 0
  fi
  if [[ ! -w $PAGE_REPORTING_ORDER ]]; then
    MEMORY_NOTE="memory: as it is (free page reporting on, page_reporting_order $current: not root)"
    echo "== $MEMORY_NOTE"
    return 0
  fi
  if ((current < off)); then
    if ! echo "$off" >"$PAGE_REPORTING_ORDER" 2>/dev/null || (($(cat "$PAGE_REPORTING_ORDER") != off)); then
      echo "$current" >"$PAGE_REPORTING_ORDER" 2>/dev/null || true
      MEMORY_NOTE="memory: as it is (free page reporting on: the kernel refused page_reporting_order $off)"
      echo "== $MEMORY_NOTE"
      return 0
    fi
    PINNED_FROM=$current
  fi
  sync
  echo 3 >/proc/sys/vm/drop_caches
  t0=$(date +%s.%N)
  filled=$(/usr/bin/python3 - <<'PY'
import mmap
avail = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemAvailable:")) * 1024
n = max(0, avail - (1 << 30)) // (64 << 20) * (64 << 20)
if n:
    m = mmap.mmap(-1, n)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    chunk = b"\1" * (64 << 20)
    for _ in range(n // len(chunk)):
        m.write(chunk)
    m.close()
print(n >> 20)
PY
)
  t1=$(date +%s.%N)
  local how="page_reporting_order $current, already above the highest order, left as it is"
  if [[ -n $PINNED_FROM ]]; then how="page_reporting_order $PINNED_FROM -> $off, put back at the end"; fi
  MEMORY_NOTE=$(awk -v mb="$filled" -v a="$t0" -v b="$t1" -v how="$how" \
    'BEGIN {printf "memory: free page reporting off for the run (%s); %d MiB of free memory touched once first (%.1f s)", how, mb, b - a}')
  echo "== $MEMORY_NOTE"
}

unpin_memory() {
  if [[ -n $PINNED_FROM ]]; then
    echo "$PINNED_FROM" >"$PAGE_REPORTING_ORDER" 2>/dev/null || echo "could not put page_reporting_order back to $PINNED_FROM" >&2
    PINNED_FROM=""
  fi
}
