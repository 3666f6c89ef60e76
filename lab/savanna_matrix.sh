#!/bin/bash
# The lab's case matrix (sizes picked by hand to vary every dimension savanna's splits
# depend on: hidden incl. 768, heads, hyena groups of each kind, filter order, vocab,
# sequence length, operator order, tied/untied, fp32/bf16, pipeline or sequential names).
# Usage: lab/savanna_matrix.sh OUT_DIR [case ...]   (default: all cases). Each case prints
# its bitwise counts and loss comparisons; OUT_DIR/<case>/check.json has the details.
LAB=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?OUT_DIR}; shift
FP32TOL=1e-4; BF16TOL=2e-2
declare -A M S T TOL X
M[c01]="--seed 1"
S[c01]="--tp 2"; T[c01]="--tp 1"; TOL[c01]=$FP32TOL
M[c02]="--hidden 768 --heads 12 --groups 16 --groups_mr 32 --groups_se 64 --order 16 --vocab 512 --seq 32 --seed 2"
S[c02]="--tp 2 --pp 2"; T[c02]="--tp 1"; TOL[c02]=$FP32TOL
M[c03]="--hidden 96 --heads 6 --groups 12 --groups_mr 24 --groups_se 48 --order 8 --vocab 384 --seq 24 --seed 3 --bf16 --operators hyena,flash,hyena_se,hyena_mr,hyena_se"
S[c03]="--tp 1"; T[c03]="--tp 2"; TOL[c03]=$BF16TOL
M[c04]="--hidden 128 --heads 8 --groups 8 --groups_mr 16 --groups_se 32 --order 12 --vocab 256 --seed 4 --untied --operators flash,hyena_mr,hyena_se,hyena"
S[c04]="--tp 1 --pp 2"; T[c04]="--tp 1 --pp 1"; TOL[c04]=$FP32TOL
M[c05]="--plain --hidden 64 --heads 4 --groups 4 --groups_mr 8 --groups_se 16 --seed 5 --bf16"
S[c05]="--tp 1 --dp 2"; T[c05]="--tp 1 --dp 1"; TOL[c05]=$BF16TOL
M[c06]="--plain --hidden 192 --heads 6 --groups 6 --groups_mr 12 --groups_se 24 --order 10 --seq 20 --seed 6"
S[c06]="--tp 1"; T[c06]="--tp 2 --dp 2"; TOL[c06]=$FP32TOL
M[c07]="--hidden 768 --heads 8 --groups 32 --groups_mr 16 --groups_se 8 --vocab 256 --seed 7 --bf16 --operators hyena_mr,hyena,flash,hyena_se"
S[c07]="--tp 2 --dp 2"; T[c07]="--tp 1 --pp 2 --dp 2"; TOL[c07]=$BF16TOL
M[c08]="--plain --hidden 768 --heads 12 --groups 48 --groups_mr 24 --groups_se 96 --vocab 512 --seed 8 --bf16 --untied"
S[c08]="--tp 2"; T[c08]="--tp 1"; TOL[c08]=$BF16TOL
M[c09]="--plain --hidden 160 --heads 10 --groups 10 --groups_mr 20 --groups_se 40 --order 6 --seq 12 --seed 9 --operators hyena_se,flash,hyena,hyena_mr,flash"
S[c09]="--tp 2 --dp 2"; T[c09]="--tp 2 --dp 1"; TOL[c09]=$FP32TOL
M[c10]="--hidden 64 --heads 4 --groups 8 --groups_mr 4 --groups_se 16 --seed 10 --untied"
S[c10]="--tp 1 --pp 2 --dp 2"; T[c10]="--tp 2 --pp 2"; TOL[c10]=$FP32TOL
M[c11]="--plain --hidden 64 --heads 4 --groups 8 --groups_mr 4 --groups_se 16 --seed 11 --bf16 --untied"
S[c11]="--tp 2 --dp 2"; T[c11]="--tp 2 --dp 1"; TOL[c11]=$BF16TOL
# c08 with the universal load replaced by ucp reshard + a plain load (see README: DeepSpeed
# 0.14.4 cannot universal-load a plain module's copied mp_rank files at a smaller tp); reuses
# c08's source. c08s: c08 converted with --single_mp_rank_file (now the default), universal-loaded at tp=1.
CASES=${*:-c01 c02 c03 c04 c05 c06 c07 c08 c09 c10 c11}
fail=0
for c in $CASES; do
  if [ $c = c08s ]; then  # c08 with one mp_rank file in the universal folder
    python3 $LAB/savanna_case.py --case $OUT/c08s --reuse_source $OUT/c08 --model "${M[c08]}" --src "${S[c08]}" \
      --dst "${T[c08]}" --tol ${TOL[c08]} --convert_args=--single_mp_rank_file || fail=1
    continue
  fi
  if [ $c = c08r ]; then
    python3 $LAB/savanna_case.py --case $OUT/c08r --reuse_source $OUT/c08 --model "${M[c08]}" --src "${S[c08]}" \
      --dst "${T[c08]}" --tol ${TOL[c08]} --via_reshard || fail=1
    continue
  fi
  python3 $LAB/savanna_case.py --case $OUT/$c --model "${M[$c]}" --src "${S[$c]}" --dst "${T[$c]}" --tol ${TOL[$c]} || fail=1
done
exit $fail
