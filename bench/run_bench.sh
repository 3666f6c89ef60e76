#!/usr/bin/env bash
# ucp's performance benchmark: convert and reshard against the copy limit of
# this machine (cp -r of the same bytes), measured in one run, as ratios.
#
#   bench/run_bench.sh [--gb=3] [--runs=3] [--workdir=/tmp/ucp_bench] [--threads=0]
#
# Generates a GPT-NeoX-shaped tp=2 dp=2 ZeRO-1 checkpoint (fp32 weights, fp32
# master + Adam) of about --gb GB with the conformance writer, then times,
# --runs times each:
#   cp        cp -r of the source folder
#   convert   ucp convert  (ZeRO -> universal)
#   reshard-u ucp reshard  universal -> tp=1 dp=1
#   reshard-z ucp reshard  ZeRO -> ZeRO tp=1 dp=1, one pass
# and prints min and median seconds, MB/s of bytes read + written, peak RSS
# (/usr/bin/time), each one's throughput ratio to cp, and the checks of the
# targets: throughput >= 50% of cp; peak RSS <= largest input file + 256 MiB;
# every byte written once (the bytes the process wrote, getrusage's block
# outputs, equal its final output: no temporary files), and for convert and the
# ZeRO -> ZeRO reshard an output no larger than the input plus the manifest.
set -euo pipefail
cd "$(dirname "$0")/.."

GB=3
RUNS=3
WORK=/tmp/ucp_bench
THREADS=0
for arg in "$@"; do
  case "$arg" in
    --gb=*) GB="${arg#*=}" ;;
    --runs=*) RUNS="${arg#*=}" ;;
    --workdir=*) WORK="${arg#*=}" ;;
    --threads=*) THREADS="${arg#*=}" ;;
    *) echo "unknown argument $arg" >&2; exit 2 ;;
  esac
done

bazel build -c opt //tools:ucp //bench:make_checkpoint >/dev/null 2>&1 || bazel build -c opt //tools:ucp //bench:make_checkpoint
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)"
UCP="$BIN/tools/ucp"
MAKE="$BIN/bench/make_checkpoint"

rm -rf "$WORK"
mkdir -p "$WORK"
SRC="$WORK/src/global_step1"
echo "== generating a ~${GB} GB checkpoint (tp=2 pp=1 dp=2, ZeRO-1, fp32) in $WORK"
"$MAKE" --gb="$GB" --tp=2 --dp=2 --output_folder="$SRC"
sync

bytes_of() { du -sb "$1" | cut -f1; }
largest_file() { find "$1" -type f -printf '%s\n' | sort -n | tail -1; }
IN_BYTES=$(bytes_of "$SRC")
LARGEST=$(largest_file "$SRC")
echo "source: $IN_BYTES bytes in $(find "$SRC" -type f | wc -l) files, largest file $LARGEST bytes"

# run NAME OUTPUT CMD...: times CMD RUNS times (OUTPUT removed before each run),
# records seconds and peak RSS (KiB) per run in $WORK/NAME.times.
run() {
  local name="$1" out="$2"
  shift 2
  : >"$WORK/$name.times"
  for ((i = 1; i <= RUNS; i++)); do
    rm -rf "$out" "$(dirname "$out")/latest_universal"
    sync
    /usr/bin/time -f "%e %M %O" -o "$WORK/time.out" "$@" >"$WORK/$name.log" 2>&1
    cat "$WORK/time.out" >>"$WORK/$name.times"
  done
}

run cp "$WORK/cp_out" cp -r "$WORK/src" "$WORK/cp_out"
CP_READ=$IN_BYTES
CP_WRITE=$(bytes_of "$WORK/cp_out")

run convert "$WORK/src/global_step1_universal" \
  "$UCP" convert --input_folder="$SRC" --output_folder="$WORK/src/global_step1_universal" --num_threads="$THREADS"
UNI="$WORK/src/global_step1_universal"
UNI_BYTES=$(bytes_of "$UNI")
MANIFEST_BYTES=$(stat -c %s "$UNI/ucp_manifest.textproto")
# convert reads the optimizer files and the mp_rank files (copied); the
# layer files hold lp weights the universal format does not keep.
CONVERT_READ=$(find "$SRC" -type f \( -name '*optim_states.pt' -o -name 'mp_rank_*' \) -printf '%s\n' | awk '{s+=$1} END {print s}')

run reshard-u "$WORK/tp1_from_universal/global_step1" \
  "$UCP" reshard --input_folder="$UNI" --output_folder="$WORK/tp1_from_universal/global_step1" --tp=1 --pp=1 --dp=1 \
  --num_threads="$THREADS"
RU_WRITE=$(bytes_of "$WORK/tp1_from_universal/global_step1")
RU_READ=$((UNI_BYTES - MANIFEST_BYTES))

run reshard-z "$WORK/tp1_from_zero/global_step1" \
  "$UCP" reshard --input_folder="$SRC" --output_folder="$WORK/tp1_from_zero/global_step1" --tp=1 --pp=1 --dp=1 \
  --num_threads="$THREADS"
RZ_WRITE=$(bytes_of "$WORK/tp1_from_zero/global_step1")
RZ_READ=$CONVERT_READ

# The two reshard paths give the same checkpoint.
if cmp -s <(cd "$WORK/tp1_from_universal/global_step1" && find . -type f -exec sha256sum {} + | sort -k2) \
          <(cd "$WORK/tp1_from_zero/global_step1" && find . -type f -exec sha256sum {} + | sort -k2); then
  SAME="identical"
else
  SAME="DIFFERENT"
fi

python_report() {
  /usr/bin/python3 - "$WORK" "$RUNS" "$GB" "$LARGEST" "$IN_BYTES" "$MANIFEST_BYTES" "$SAME" \
    "cp:$CP_READ:$CP_WRITE" "convert:$CONVERT_READ:$UNI_BYTES" "reshard-u:$RU_READ:$RU_WRITE" \
    "reshard-z:$RZ_READ:$RZ_WRITE" <<'EOF'
import statistics, sys
work, runs, gb, largest, in_bytes, manifest, same = sys.argv[1:8]
runs, largest, in_bytes, manifest = int(runs), int(largest), int(in_bytes), int(manifest)
rows = {}
for arg in sys.argv[8:]:
    name, rd, wr = arg.split(":")
    t, rss, out = [], [], []
    for line in open(f"{work}/{name}.times"):
        s, kb, blocks = line.split()
        t.append(float(s)); rss.append(int(kb)); out.append(int(blocks) * 512)
    rows[name] = dict(read=int(rd), write=int(wr), min=min(t), med=statistics.median(t), rss=max(rss) * 1024,
                      wrote=max(out))
cp = rows["cp"]
cp_rate = (cp["read"] + cp["write"]) / cp["med"]
print(f"\n== ucp benchmark: ~{gb} GB GPT-NeoX-shaped checkpoint, tp=2 dp=2 -> universal / tp=1 dp=1, {runs} runs each")
print(f"{'op':10} {'min s':>7} {'median s':>9} {'read MB':>8} {'written MB':>11} {'MB/s':>7} {'vs cp':>6} {'peak RSS MB':>12}")
for name, r in rows.items():
    rate = (r["read"] + r["write"]) / r["med"]
    print(f"{name:10} {r['min']:7.2f} {r['med']:9.2f} {r['read']/1e6:8.0f} {r['write']/1e6:11.0f} {rate/1e6:7.0f} "
          f"{rate/cp_rate:6.0%} {r['rss']/2**20:12.0f}")
budget = largest + 256 * 2**20
print(f"\ntargets (largest input file {largest/2**20:.0f} MiB -> RSS budget {budget/2**20:.0f} MiB; input {in_bytes/1e6:.0f} MB):")
ok = same == "identical"
for name in ("convert", "reshard-u", "reshard-z"):
    r = rows[name]
    rate = (r["read"] + r["write"]) / r["med"] / cp_rate
    rss_ok = r["rss"] <= budget
    once = r["wrote"] <= r["write"] * 1.01 + 2**20
    size_ok = name == "reshard-u" or r["write"] <= in_bytes + manifest
    print(f"  {name:10} throughput {rate:4.0%} of cp {'OK' if rate >= 0.5 else 'MISSED'}; "
          f"peak RSS {r['rss']/2**20:.0f} MiB {'OK' if rss_ok else 'MISSED'}; "
          f"wrote {r['wrote']/1e6:.0f} MB for a {r['write']/1e6:.0f} MB output {'OK' if once else 'MISSED'}"
          + ("" if name == "reshard-u" else f"; output <= input + manifest {'OK' if size_ok else 'MISSED'}"))
    ok &= rate >= 0.5 and rss_ok and once and size_ok
print(f"  reshard universal->tp1 and ZeRO->tp1 outputs: {same}")
print("all targets met" if ok else "SOME TARGETS MISSED")
EOF
}
python_report | tee "$WORK/report.txt"
