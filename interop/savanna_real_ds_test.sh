#!/bin/bash
# ucp convert with NO rule flags on savanna-shaped checkpoints written by real DeepSpeed
# 0.14.4 (testdata/savanna_ds0144, made by the lab of issue 14, since folded into realds/) must give universal
# tensors bitwise equal to what DeepSpeed reported for the source ranks, merged with
# savanna's splits (check_savanna_universal.py). Negative control: the same conversion with
# a rules file that calls the row-parallel mixer.dense.weight COLUMN must fail the check.
# Args: UCP CHECKER FIXTURE_DIR... (each holding global_step3/ and expected.pt)
set -u
UCP=$1; CHECK=$2; shift 2
PY=/usr/bin/python3
fail=0
for fx in "$@"; do
  name=$(basename "$fx")
  out=$TEST_TMPDIR/$name/global_step3_universal
  if ! "$UCP" convert --input_folder="$fx/global_step3" --output_folder="$out" > "$TEST_TMPDIR/$name.log" 2>&1; then
    echo "FAIL $name: ucp convert failed:"; cat "$TEST_TMPDIR/$name.log"; fail=1; continue
  fi
  if ! grep -q "preset: savanna (detected from param names)" "$TEST_TMPDIR/$name.log"; then
    echo "FAIL $name: the savanna preset was not detected:"; cat "$TEST_TMPDIR/$name.log"; fail=1
  fi
  if "$PY" "$CHECK" "$out" "$fx/expected.pt"; then echo "PASS $name"; else echo "FAIL $name"; fail=1; fi
  # negative control
  rules=$TEST_TMPDIR/wrong_$name.textproto
  echo 'rule { pattern: ".*\\.mixer\\.dense\\.weight$" kind: COLUMN }' > "$rules"
  wrong=$TEST_TMPDIR/wrong_$name/global_step3_universal
  "$UCP" convert --input_folder="$fx/global_step3" --output_folder="$wrong" --rules="$rules" > /dev/null 2>&1 || true
  if "$PY" "$CHECK" "$wrong" "$fx/expected.pt" > "$TEST_TMPDIR/wrong_$name.check" 2>&1; then
    echo "FAIL $name: a wrong merge (mixer.dense.weight COLUMN) passed the check"; fail=1
  else
    echo "PASS $name negative control: $(tail -1 "$TEST_TMPDIR/wrong_$name.check")"
  fi
done
exit $fail
