#!/bin/bash
# `--timings` as a user runs it: convert, reshard and export of a real
# DeepSpeed checkpoint print, on stderr, where the time went by phase; the
# phases each one must pass through are listed with their calls and bytes, and
# without the flag nothing of it is printed (and the outputs are the same).
set -u
UCP="$1"
FIXTURES="$2"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/timings_cli"
rm -rf "$WORK"; mkdir -p "$WORK"
fails=0
TAG="$FIXTURES/neox-tp2-pp1-dp1/global_step4"
# has NAME PHASE...: every PHASE is a row of $err with calls > 0
has() {
  local name="$1"; shift
  if [ "$rc" != 0 ]; then echo "FAIL $name: exit $rc"; echo "$err"; fails=$((fails+1)); return; fi
  for p in "$@"; do
    if ! grep -qE "^  $p +[1-9][0-9]* " <<<"$err"; then
      echo "FAIL $name: no row '$p' with calls in:"; echo "$err"; fails=$((fails+1)); return
    fi
  done
  echo "ok   $name"
}
err=$("$UCP" convert --input_folder="$TAG" --output_folder="$WORK/u" --progress=never --timings 2>&1 >/dev/null); rc=$?
# This checkpoint's records are all under 1 MiB: each is read again whole for
# its CRC check (a flat partition of 1 MiB or more is checked from what the
# units read of it: "input CRC", which exec:mpi_test looks at).
has "convert --timings" "open, parse and plan" "units \(waiting for them\)" "read and merge" "input re-read \(CRC\)" "output CRC" \
  "digest" "write" "writeback" "fsync" "commit"
grep -q "^ucp convert timings: [0-9.]* s wall" <<<"$err" || { echo "FAIL convert: no title in: $err"; fails=$((fails+1)); }
# The written bytes of the write row are the output's bytes, to the MB (the tensors and pickles; the
# manifest is written by another path).
mb=$(grep -E "^  write " <<<"$err" | awk '{print $NF}')
out_mb=$(du -sb "$WORK/u" | awk '{printf "%.0f", $1 / 1e6}')
if [ "$(( mb > out_mb + 1 || mb < out_mb - 2 ))" = 1 ]; then
  echo "FAIL convert: the write row says $mb MB, the output is $out_mb MB"; fails=$((fails+1))
else
  echo "ok   convert: write row $mb MB for an output of $out_mb MB"
fi
err=$("$UCP" convert --input_folder="$TAG" --output_folder="$WORK/u_nf" --progress=never --timings --fsync=false 2>&1 >/dev/null); rc=$?
has "convert --timings --fsync=false" "write" "commit"
if grep -qE "^  (fsync|writeback) " <<<"$err"; then echo "FAIL --fsync=false: fsync or writeback rows: $err"; fails=$((fails+1)); else echo "ok   --fsync=false: no fsync, no writeback"; fi
err=$("$UCP" reshard --input_folder="$TAG" --output_folder="$WORK/r" --tp=1 --progress=never --timings 2>&1 >/dev/null); rc=$?
has "reshard --timings" "open, parse and plan" "read and merge" "write" "fsync" "commit"
err=$("$UCP" export --input_folder="$TAG" --output_folder="$WORK/e" --progress=never --timings 2>&1 >/dev/null); rc=$?
has "export --timings" "open, parse and plan" "read and merge" "write" "writeback" "fsync" "commit"
# The export starts the writeback of every byte it writes (so the fsync finds little left).
wb=$(grep -E "^  writeback " <<<"$err" | awk '{print $NF}')
wr=$(grep -E "^  write " <<<"$err" | awk '{print $NF}')
if [ -n "$wb" ] && [ "$wb" = "$wr" ]; then echo "ok   export: writeback of all $wr MB"; else
  echo "FAIL export: writeback row '$wb' MB, write row '$wr' MB: $err"; fails=$((fails+1)); fi
err=$("$UCP" export --input_folder="$TAG" --output_folder="$WORK/e_nf" --progress=never --timings --fsync=false 2>&1 >/dev/null); rc=$?
has "export --timings --fsync=false" "write" "commit"
if grep -qE "^  (fsync|writeback) " <<<"$err"; then echo "FAIL export --fsync=false: fsync or writeback rows: $err"; fails=$((fails+1)); else echo "ok   export --fsync=false: no fsync, no writeback"; fi
if cmp -s "$WORK/e/model.safetensors" "$WORK/e_nf/model.safetensors"; then echo "ok   export: same bytes with and without --fsync"; else echo "FAIL export: bytes differ with --fsync=false"; fails=$((fails+1)); fi
# Without the flag: no table, and the same bytes.
err=$("$UCP" convert --input_folder="$TAG" --output_folder="$WORK/u2" --progress=never 2>&1 >/dev/null); rc=$?
if grep -q "timings" <<<"$err"; then echo "FAIL without --timings: $err"; fails=$((fails+1)); else echo "ok   without --timings: no table"; fi
if diff -r "$WORK/u" "$WORK/u2" >/dev/null; then echo "ok   same output with and without --timings"; else echo "FAIL outputs differ"; fails=$((fails+1)); fi
rm -rf "$WORK"
echo "$fails failure(s)"
[ "$fails" = 0 ]
