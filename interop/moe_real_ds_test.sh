#!/bin/bash
# Native MoE checkpoints of DeepSpeed before 0.19.3, written by real DeepSpeed 0.14.4 / 0.16.4
# (testdata/moe_ds_old), read and resharded by ucp; every param's (every expert's) fp32, exp_avg,
# exp_avg_sq and lp weight must equal what the saving DeepSpeed job held (its ref/ dumps), read back
# with torch alone by check_moe_native.py:
#   1. reshard to dp1 / ep1;
#   2. reshard to dp D / ep E written for DeepSpeed 0.16.4 (full param_slice_mappings), checked directly;
#   3. reshard to dp D / ep E in the source's own version, then back to dp1 / ep1, checked;
#   4. `ucp export`: every param's fp32 master under its global name (model.safetensors);
#   5. `ucp convert` is refused (pointing to reshard) with nothing written;
#   6. negative control: the dp1 output with two experts' files swapped must fail the check.
# Args: UCP CHECKER FIXTURE:D:E[:0.19.3+] ... (0.19.3+: the fixture has the newer layout, with param_shapes)
set -u
UCP=$1; CHECK=$2; shift 2
PY=/usr/bin/python3
fail=0
run() {  # name, log, ucp args...
  local name=$1 log=$2; shift 2
  if ! "$UCP" reshard --progress never "$@" > "$log" 2>&1; then
    echo "FAIL $name: ucp reshard $*:"; cat "$log"; fail=1; return 1
  fi
}
check() {  # name, dir, ref, dp, ep
  if "$PY" "$CHECK" "$2" "$3" --dp "$4" --ep "$5"; then echo "PASS $1"; else echo "FAIL $1"; fail=1; fi
}
for arg in "$@"; do
  IFS=: read -r fx D E layout <<< "$arg"
  name=$(basename "$fx"); src=$fx/global_step4; ref=$fx/ref; t=$TEST_TMPDIR/$name
  if run "$name dp1" "$t.dp1.log" --input_folder "$src" --output_folder "$t/dp1/global_step4" --dp 1 --expert_parallel 1; then
    if [ "${layout:-}" != "0.19.3+" ]; then
      grep -q "before 0.19.3" "$t.dp1.log" || { echo "FAIL $name: the old layout was not named:"; cat "$t.dp1.log"; fail=1; }
    fi
    check "$name -> dp1 ep1" "$t/dp1/global_step4" "$ref" 1 1
  fi
  if run "$name dp$D ep$E (0.16.4)" "$t.new.log" --input_folder "$src" --output_folder "$t/new/global_step4" \
      --dp "$D" --expert_parallel "$E" --target_ds_version 0.16.4; then
    check "$name -> dp$D ep$E as 0.16.4" "$t/new/global_step4" "$ref" "$D" "$E"
  fi
  if run "$name dp$D ep$E" "$t.own.log" --input_folder "$src" --output_folder "$t/own/global_step4" \
      --dp "$D" --expert_parallel "$E" &&
     run "$name back" "$t.back.log" --input_folder "$t/own/global_step4" --output_folder "$t/back/global_step4" \
      --dp 1 --expert_parallel 1; then
    check "$name -> dp$D ep$E -> dp1 ep1" "$t/back/global_step4" "$ref" 1 1
  fi
  # export: one state dict, experts under their global ids
  if "$UCP" export --input_folder "$src" --output_folder "$t/export" > "$t.export.log" 2>&1; then
    if "$PY" "$CHECK" --export "$t/export/model.safetensors" "$ref"; then echo "PASS $name export"; else echo "FAIL $name export"; fail=1; fi
  else
    echo "FAIL $name: ucp export:"; cat "$t.export.log"; fail=1
  fi
  # convert is refused (no DeepSpeed universal loader places native experts), nothing written
  if "$UCP" convert --input_folder "$src" --output_folder "$t/universal" > "$t.convert.log" 2>&1 ||
     ! grep -q "ucp reshard" "$t.convert.log" || [ -e "$t/universal" ]; then
    echo "FAIL $name: convert was not refused cleanly:"; cat "$t.convert.log"; fail=1
  else
    echo "PASS $name convert refused, pointing to reshard"
  fi
  # negative control
  bad=$t/bad/global_step4
  mkdir -p "$bad" && cp "$t"/dp1/global_step4/* "$bad"/
  mv "$bad/layer_0_expert_0_mp_rank_00_model_states.pt" "$bad/x.pt"
  mv "$bad/layer_0_expert_1_mp_rank_00_model_states.pt" "$bad/layer_0_expert_0_mp_rank_00_model_states.pt"
  mv "$bad/x.pt" "$bad/layer_0_expert_1_mp_rank_00_model_states.pt"
  if "$PY" "$CHECK" "$bad" "$ref" > "$t.bad.log" 2>&1; then
    echo "FAIL $name: swapped expert files passed the check"; fail=1
  else
    echo "PASS $name negative control: $(tail -1 "$t.bad.log")"
  fi
done
exit $fail
