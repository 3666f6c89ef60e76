#!/bin/bash
# `ucp verify FOLDER` as a user runs it: exit status and the lines it prints,
# on a good ZeRO folder, its universal conversion, and copies with one damaged
# byte (inside a tensor record, so only the CRC / digest can tell).
set -u
UCP="$1"
FIXTURES="$2"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/verify_cli"
rm -rf "$WORK"; mkdir -p "$WORK"
fails=0
check() {  # check NAME WANT_EXIT PATTERN... -- runs with $out/$rc set
  local name="$1" want="$2"; shift 2
  if [ "$rc" != "$want" ]; then echo "FAIL $name: exit $rc, want $want"; echo "$out"; fails=$((fails+1)); return; fi
  for p in "$@"; do
    if ! grep -q -- "$p" <<<"$out"; then echo "FAIL $name: no '$p' in:"; echo "$out"; fails=$((fails+1)); return; fi
  done
  echo "ok   $name"
}
# Flips one byte in the middle of the largest tensor record of a .pt file.
flip() {
  /usr/bin/python3 - "$1" <<'PY'
import sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
with open(path, "r+b") as f:
    f.seek(info.header_offset + 26)
    n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    at = info.header_offset + 30 + n + m + info.file_size // 2
    f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x40]))
print(f"flipped a byte of {info.filename} in {path}")
PY
}

cp -rL "$FIXTURES/neox-tp2-pp1-dp1" "$WORK/src"
TAG="$WORK/src/global_step4"
NFILES=$(ls "$TAG" | grep -c '\.pt$')
out=$("$UCP" verify "$TAG" 2>&1); rc=$?
check "good ZeRO folder" 0 "$TAG: OK (zero checkpoint, $NFILES files checked)"

out=$("$UCP" convert --input_folder="$TAG" --output_folder="$WORK/u/global_step4_universal" 2>&1); rc=$?
check "convert for the universal case" 0
U="$WORK/u/global_step4_universal"
out=$("$UCP" verify "$U" 2>&1); rc=$?
check "good universal folder" 0 ": OK (universal checkpoint"

OPT="$TAG/zero_pp_rank_0_mp_rank_01_optim_states.pt"
flip "$OPT" >/dev/null
out=$("$UCP" verify "$TAG" 2>&1); rc=$?
check "damaged optimizer file" 1 "^PROBLEM .*zero_pp_rank_0_mp_rank_01_optim_states.pt" "1 problem(s) (zero checkpoint"

Q="$U/zero/2.attention.dense.weight/exp_avg.pt"
flip "$Q" >/dev/null
out=$("$UCP" verify "$U" 2>&1); rc=$?
check "damaged universal file" 1 "^PROBLEM .*2.attention.dense.weight/exp_avg.pt" "problem(s) (universal checkpoint"

# ZeRO-3 and native MoE checkpoints of DeepSpeed 0.19.5 (refused before: "open it
# with readers::Zero3State", an internal name), and one damaged byte in each.
FX195="$(dirname "$FIXTURES")/deepspeed-0.19.5"
for fx in gpt-zero3-dp2:zero3 gpt-moe-ep2-zero2-dp2:moe; do
  name=${fx%%:*}; kind=${fx##*:}
  cp -rL "$FX195/$name" "$WORK/$name"
  T="$WORK/$name/global_step4"
  N=$(ls "$T" | grep -c '\.pt$')
  out=$("$UCP" verify "$T" 2>&1); rc=$?
  check "good $kind folder" 0 "$T: OK ($kind checkpoint, $N files checked)"
  F=$(ls "$T"/*optim_states.pt | tail -n 1)
  flip "$F" >/dev/null
  out=$("$UCP" verify "$T" 2>&1); rc=$?
  check "damaged $kind optimizer file" 1 "^PROBLEM .*$(basename "$F")" "problem(s) ($kind checkpoint"
done

# What `ucp convert` writes for a ZeRO-3 source (DeepSpeed's stage-3 universal
# layout, which ucp does not read back): verified by manifest and CRCs.
Z3U="$WORK/z3u/global_step4_universal"
out=$("$UCP" convert --input_folder="$FX195/gpt-zero3-dp2/global_step4" --output_folder="$Z3U" 2>&1); rc=$?
check "convert a ZeRO-3 checkpoint" 0
out=$("$UCP" verify "$Z3U" 2>&1); rc=$?
check "good ZeRO-3 universal folder" 0 ": OK (universal (ZeRO-3) checkpoint"
flip "$Z3U/zero/h.0.attn_qkv.weight/exp_avg.pt" >/dev/null
out=$("$UCP" verify "$Z3U" 2>&1); rc=$?
check "damaged ZeRO-3 universal file" 1 "^PROBLEM .*h.0.attn_qkv.weight/exp_avg.pt" "problem(s) (universal (ZeRO-3) checkpoint"

out=$("$UCP" verify 2>&1); rc=$?
check "no folder" 1 "usage: ucp verify FOLDER"
out=$("$UCP" verify "$WORK/does-not-exist" 2>&1); rc=$?
check "missing folder" 1 "does-not-exist"

[ "$fails" = 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
