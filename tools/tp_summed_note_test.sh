#!/bin/bash
# GPT-NeoX with gpt_j_residual (Hugging Face's use_parallel_residual, Pythia)
# adds each tp rank's copy of the row-parallel biases before the all-reduce:
# the model uses tp x the stored value, so writing the stored value at another
# tp changes the model. ucp (like DeepSpeed's converter) writes it unchanged
# and must say so: a reshard to another tp and a convert to universal name the
# params; the same checkpoint without the flag, and a reshard to the same tp,
# say nothing of it. The flag is set in a copy of a real DeepSpeed 0.14.4
# checkpoint by torch itself (/usr/bin/python3, torch 1.13), not by ucp.
set -u
UCP="$1"
FIXTURES="$2"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/tp_summed"
rm -rf "$WORK"; mkdir -p "$WORK"
fails=0
SRC="$FIXTURES/neox-tp2-pp1-dp1/global_step4"
# -L: the runfiles are symlinks to the fixture's files, which must never be written.
cp -rL "$SRC" "$WORK/flag"
chmod -R u+w "$WORK/flag"
/usr/bin/python3 - "$WORK/flag" <<'PY' || { echo "FAIL: could not edit the args with torch"; exit 1; }
import glob, os, sys, torch
paths = sorted(glob.glob(sys.argv[1] + "/mp_rank_*_model_states.pt"))
assert len(paths) == 2, paths
for p in paths:
    assert not os.path.islink(p), p
    sd = torch.load(p, map_location="cpu")
    sd["args"]["gpt_j_residual"] = True
    os.makedirs(p + ".d")
    tmp = os.path.join(p + ".d", os.path.basename(p))  # torch names the archive after the file
    torch.save(sd, tmp)
    os.replace(tmp, p)
    os.rmdir(p + ".d")
PY
said() {  # NAME WANT(yes|no) OUTPUT
  local name=$1 want=$2 out=$3 got=no
  if grep -q "the model changes: 16 params ('2.attention.dense.bias'" <<<"$out" &&
     grep -q "gpt_j_residual (Hugging Face's use_parallel_residual) is true" <<<"$out"; then got=yes; fi
  if [ "$got" = "$want" ]; then echo "ok   $name: warned=$got"; else echo "FAIL $name: warned=$got, want $want:"; echo "$out"; fails=$((fails+1)); fi
}
out=$("$UCP" reshard --input_folder="$WORK/flag" --output_folder="$WORK/r1/global_step4" --tp=1 --progress=never 2>&1)
said "reshard tp 2 -> 1 with gpt_j_residual" yes "$out"
grep -q "becomes 1/2 of what it was" <<<"$out" || { echo "FAIL: no 1/2 in: $out"; fails=$((fails+1)); }
out=$("$UCP" reshard --input_folder="$WORK/flag" --output_folder="$WORK/r2/global_step4" --tp=2 --dp=2 --progress=never 2>&1)
said "reshard tp 2 -> 2 with gpt_j_residual" no "$out"
out=$("$UCP" convert --input_folder="$WORK/flag" --output_folder="$WORK/u" --progress=never 2>&1)
said "convert with gpt_j_residual" yes "$out"
out=$("$UCP" reshard --input_folder="$SRC" --output_folder="$WORK/r3/global_step4" --tp=1 --progress=never 2>&1)
said "reshard tp 2 -> 1 without the flag" no "$out"
# The warning changes nothing written: the same bytes as without the flag, but for the edited files.
if diff -r -x 'mp_rank_*' "$WORK/r1" "$WORK/r3" >/dev/null; then echo "ok   same optimizer files"; else echo "FAIL: outputs differ"; fails=$((fails+1)); fi
rm -rf "$WORK"
echo "$fails failure(s)"
[ "$fails" = 0 ]
