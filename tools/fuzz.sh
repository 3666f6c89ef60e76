#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (pickle_fuzzer, torch_file_fuzzer,
# folder_fuzzer) with clang, ASan and UBSan, straight from the sources (no
# Bazel: Bazel's toolchain here is gcc), and runs each one after the other
# for $FUZZ_SECONDS, then prints executions, coverage and corpus size.
#
# folder_fuzzer (whole checkpoint folders through formats/, inspect, verify;
# not in the default FUZZERS) also compiles the packages under them (base/,
# deepspeed/, state/, formats/, rules/, writers/, tp/, ops/) and the code Bazel
# generates: run `bazel build //proto:ucp_cc_proto //rules:presets_data` first
# (it reads bazel-bin/proto/ucp.pb.cc and bazel-bin/rules/presets_data.cc).
# It reads the fixtures from ../shared (UCP_FUZZ_FIXTURES) and writes its
# folders under /dev/shm (UCP_FUZZ_TMP).
#
# Needs only what tools/setup.sh installs (clang, libclang-rt-14-dev,
# libabsl-dev). Everything goes to fuzz/out/ (gitignored):
#   fuzz/out/obj/...             instrumented objects (rebuilt when stale)
#   fuzz/out/<fuzzer>            the fuzzer binaries
#   fuzz/out/corpus/<fuzzer>/    the corpus the runs grow (kept between runs)
#   fuzz/out/hostile/            testdata/hostile cases (read-only input corpus)
#   fuzz/out/<fuzzer>.log        the libFuzzer output of the last run
#   fuzz/out/artifacts/          crash-*, leak-*, timeout-*, oom-* reproducers
# The committed seeds (fuzz/seeds/pickle/, fuzz/seeds/torch_file/, written by
# fuzz/make_seeds.py) and the hostile corpus (testdata/hostile/) are read
# as extra corpus folders; new inputs are written to fuzz/out/corpus only.
#
# Environment:
#   FUZZ_SECONDS   seconds per fuzzer (default 600)
#   FUZZERS        which fuzzers to build and run (default: both)
#   FUZZ_SEED      libFuzzer -seed (default 1, so a run is repeatable up to
#                  timing: -max_total_time stops by the clock)
#   FUZZ_JOBS      parallel compiles (default 2)
#   FUZZ_FLAGS     extra libFuzzer flags, e.g. "-use_value_profile=1"
#   FUZZ_BUILD_ONLY=1  build, do not run
#   CXX            the compiler (default clang++)
#
# Exit status: 0 when every run ended without a finding; 1 otherwise (the
# reproducer is in fuzz/out/artifacts/; replay it with
# `fuzz/out/<fuzzer> <file>` or, without sanitizers, `bazel run //fuzz:<fuzzer> -- <file>`).
#
# Examples:
#   tools/fuzz.sh                                   # 10 minutes each
#   FUZZ_SECONDS=60 FUZZERS=pickle_fuzzer tools/fuzz.sh
set -euo pipefail
# The whole script is one function, read before it runs, so that editing
# this file while a long run is under way cannot change the running script.
main() {
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-600}
FUZZERS=${FUZZERS:-"pickle_fuzzer torch_file_fuzzer"}
FUZZ_SEED=${FUZZ_SEED:-1}
FUZZ_JOBS=${FUZZ_JOBS:-2}
FUZZ_FLAGS=${FUZZ_FLAGS:-}
CXX=${CXX:-clang++}
OUT=fuzz/out

if ! command -v "$CXX" >/dev/null; then
  echo "fuzz: $CXX not found (run tools/setup.sh)" >&2
  exit 1
fi

# Library sources: every non-test .cc of format/pickle and format/torch, and
# the base/ sources whose headers they include.
LIB_SRCS=()
for f in format/pickle/*.cc format/pickle/internal/*.cc format/torch/*.cc; do
  case "$f" in
    *_test.cc | *test_util.cc | *_bench.cc | *_fuzzer.cc | *_main.cc) ;;
    *) LIB_SRCS+=("$f") ;;
  esac
done
for h in $(grep -ho '#include "base/[a-z0-9_]*\.h"' "${LIB_SRCS[@]}" | sort -u | sed 's/#include "\(.*\)\.h"/\1/'); do
  if [[ -f "$h.cc" ]]; then LIB_SRCS+=("$h.cc"); fi
done
LIB_SRCS+=(fuzz/fuzz_checks.cc)
EXTRA_INCLUDES=()
EXTRA_LIBS=()
if [[ " $FUZZERS " == *" folder_fuzzer "* ]]; then
  if [[ ! -f bazel-bin/proto/ucp.pb.cc || ! -f bazel-bin/rules/presets_data.cc ]]; then
    echo "fuzz: folder_fuzzer needs bazel-bin/proto/ucp.pb.cc and bazel-bin/rules/presets_data.cc" \
      "(bazel build //proto:ucp_cc_proto //rules:presets_data)" >&2
    exit 1
  fi
  mkdir -p "$OUT/gen/proto"
  cp -fp bazel-bin/proto/ucp.pb.cc bazel-bin/proto/ucp.pb.h "$OUT/gen/proto/"
  for f in base/*.cc deepspeed/*.cc state/*.cc formats/*.cc formats/*/*.cc rules/*.cc writers/*.cc tp/*.cc ops/*.cc; do
    case "$f" in
      *_test.cc | *test_util.cc | *_bench.cc | *_main.cc) ;;
      *) [[ " ${LIB_SRCS[*]} " == *" $f "* ]] || LIB_SRCS+=("$f") ;;
    esac
  done
  LIB_SRCS+=("$OUT/gen/proto/ucp.pb.cc" bazel-bin/rules/presets_data.cc)
  EXTRA_INCLUDES=(-I"$OUT/gen")
  EXTRA_LIBS=(-lprotobuf -lxxhash)
fi

# Sanitized, coverage-instrumented; UBSan findings abort (no recovery).
# Include paths: -I. for the project; Abseil (libabsl-dev) lives in
# /usr/include, a system directory already (an explicit -isystem /usr/include
# would break libstdc++'s #include_next <stdlib.h>); ABSL_INCLUDE adds
# -isystem for an Abseil installed elsewhere.
CXXFLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer -I. "${EXTRA_INCLUDES[@]}"
  -fsanitize=address,undefined -fno-sanitize-recover=undefined)
if [[ -n "${ABSL_INCLUDE:-}" ]]; then CXXFLAGS+=(-isystem "$ABSL_INCLUDE"); fi
COMPILE_FLAGS=("${CXXFLAGS[@]}" -fsanitize=fuzzer-no-link)
LINK_FLAGS=("${CXXFLAGS[@]}" -fsanitize=fuzzer)
# The Abseil libraries, as //third_party:absl links them.
mapfile -t ABSL_LIBS < <(grep -o '"-labsl_[a-z0-9_]*"' third_party/BUILD | tr -d '"')
LIBS=("${ABSL_LIBS[@]}" "${EXTRA_LIBS[@]}" -lpthread)

mkdir -p "$OUT/obj" "$OUT/artifacts" "$OUT/hostile"

# An object is stale when older than its source, than any header of the
# packages, or when the flags changed.
FLAGS_STAMP="$OUT/obj/flags"
FLAGS_LINE="$CXX ${COMPILE_FLAGS[*]}"
if [[ ! -f "$FLAGS_STAMP" || "$(cat "$FLAGS_STAMP")" != "$FLAGS_LINE" ]]; then
  rm -rf "$OUT/obj"
  mkdir -p "$OUT/obj"
  echo "$FLAGS_LINE" >"$FLAGS_STAMP"
fi
NEWEST_HEADER=$(ls -t base/*.h format/pickle/*.h format/pickle/internal/*.h format/torch/*.h fuzz/*.h deepspeed/*.h state/*.h formats/*.h formats/*/*.h rules/*.h writers/*.h tp/*.h ops/*.h | head -1)

object_of() { local s=${1#"$OUT"/}; echo "$OUT/obj/${s%.cc}.o"; }

compile() {
  local src=$1 obj
  obj=$(object_of "$src")
  if [[ -f "$obj" && "$obj" -nt "$src" && "$obj" -nt "$NEWEST_HEADER" ]]; then return 0; fi
  mkdir -p "$(dirname "$obj")"
  echo "fuzz: compiling $src"
  "$CXX" "${COMPILE_FLAGS[@]}" -c "$src" -o "$obj.tmp" && mv "$obj.tmp" "$obj"
}

SRCS=("${LIB_SRCS[@]}")
for fuzzer in $FUZZERS; do
  if [[ ! -f "fuzz/$fuzzer.cc" ]]; then
    echo "fuzz: no fuzz/$fuzzer.cc" >&2
    exit 1
  fi
  SRCS+=("fuzz/$fuzzer.cc")
done
# At most FUZZ_JOBS compiles at once; a failed one leaves a marker.
rm -f "$OUT/obj/FAILED"
for src in "${SRCS[@]}"; do
  while (($(jobs -rp | wc -l) >= FUZZ_JOBS)); do wait -n || true; done
  (compile "$src" || touch "$OUT/obj/FAILED") &
done
wait
if [[ -f "$OUT/obj/FAILED" ]]; then
  echo "fuzz: compilation failed" >&2
  exit 1
fi

LIB_OBJS=()
for src in "${LIB_SRCS[@]}"; do LIB_OBJS+=("$(object_of "$src")"); done
for fuzzer in $FUZZERS; do
  echo "fuzz: linking $OUT/$fuzzer"
  "$CXX" "${LINK_FLAGS[@]}" "$(object_of "fuzz/$fuzzer.cc")" "${LIB_OBJS[@]}" "${LIBS[@]}" -o "$OUT/$fuzzer"
done
if [[ "${FUZZ_BUILD_ONLY:-0}" == 1 ]]; then return 0; fi

# The hostile cases (without their .expect files) as a read-only corpus.
rm -f "$OUT"/hostile/*
for f in testdata/hostile/*; do
  case "$f" in
    *.expect | */BUILD | *.py | *.md) ;;
    *) cp "$f" "$OUT/hostile/" ;;
  esac
done
# The archive fuzzer reads data.pkl too, so it gets both dictionaries.
cat fuzz/zip.dict fuzz/pickle.dict >"$OUT/torch_file.dict"

status=0
summary=()
for fuzzer in $FUZZERS; do
  case "$fuzzer" in
    pickle_fuzzer) dict=fuzz/pickle.dict max_len=4096 ;;
    torch_file_fuzzer) dict="$OUT/torch_file.dict" max_len=16384 ;;
    folder_fuzzer) dict=fuzz/pickle.dict max_len=65536 ;;
    *) dict="" max_len=4096 ;;
  esac
  corpus="$OUT/corpus/$fuzzer"
  mkdir -p "$corpus"
  log="$OUT/$fuzzer.log"
  cmd=("$OUT/$fuzzer" -max_total_time="$FUZZ_SECONDS" -seed="$FUZZ_SEED" -max_len="$max_len"
    -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$fuzzer-")
  if [[ -n "$dict" ]]; then cmd+=(-dict="$dict"); fi
  # shellcheck disable=SC2206  # FUZZ_FLAGS is a list of flags
  cmd+=($FUZZ_FLAGS "$corpus" "fuzz/seeds/${fuzzer%_fuzzer}" "$OUT/hostile")
  echo "fuzz: ${cmd[*]}  (log: $log)"
  start=$(date +%s)
  rc=0
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "${cmd[@]}" >"$log" 2>&1 || rc=$?
  elapsed=$(($(date +%s) - start))
  last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
  corpus_files=$(find "$corpus" -type f | wc -l)
  line="$fuzzer: rc=$rc seconds=$elapsed execs=${execs:-?} exec/s=${rate:-?} cov=${cov:-?} ft=${ft:-?} corp=${corp:-?} corpus_files=$corpus_files peak_rss_mb=${rss:-?}"
  summary+=("$line")
  echo "fuzz: $line"
  echo "fuzz: last status line: $last"
  if [[ $rc -ne 0 ]]; then
    status=1
    echo "fuzz: $fuzzer reported a finding; the end of $log:" >&2
    tail -60 "$log" >&2
    ls -t "$OUT/artifacts" | head -5 | sed "s|^|fuzz: artifact $OUT/artifacts/|" >&2
  fi
done

echo "fuzz: summary"
printf 'fuzz:   %s\n' "${summary[@]}"
return $status
}
main "$@"
