#!/usr/bin/env bash
# `mpirun -np N ucp convert|reshard ...` with 1, 2 and 3 ranks (oversubscribed
# on this machine's cores) writes exactly what one process writes, byte for
# byte, manifest included: on the real DeepSpeed fixtures and on random
# conformance models. And one rank failing (an input only its units read is
# unreadable) makes every rank exit non-zero with that rank's message and
# leaves no output and no staging folder.
set -euo pipefail

UCP=$(readlink -f "$1")
FX=$(readlink -f "$2")   # the deepspeed-0.14.4 fixtures folder
CONFORMANCE=$(readlink -f "$3")   # ucp_conformance (its `fuzz` writes the random sources)
AUTOTP_Z3=$(readlink -f "$4")     # testdata/autotp_z3: real AutoTP ZeRO-3 tp 2 saves (master)
DCP=$(readlink -f "$5")           # testdata/dcp: real FSDP2 DCP saves (torch 2.14)
MAKE_CKPT=$(readlink -f "$6")     # bench/make_checkpoint: a generated checkpoint with large records
W=${TEST_TMPDIR:-/tmp}/mpi_test
rm -rf "$W"; mkdir -p "$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
# Loopback only, no daemons beyond this host, quiet about the missing fabrics.
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm=isolated OMPI_MCA_btl_base_warn_component_unused=0

checks=0
fail() { echo "FAIL: $*" >&2; exit 1; }
mpi() { local n=$1; shift; mpirun -np "$n" --oversubscribe "$UCP" "$@" --progress=never; }
flip_byte() {  # flip_byte FILE OFFSET: damages one byte of FILE in place (bit 4 flipped)
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys
path, at = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(at)
    b = f.read(1)
    f.seek(at)
    f.write(bytes([b[0] ^ 0x10]))
PY
}
same() {  # same DIR_A DIR_B: byte-identical trees
  diff -r "$1" "$2" >/dev/null || { diff -r "$1" "$2" | head -20; fail "$2 differs from $1"; }
  checks=$((checks + 1))
}
# expect_refused WHAT N OUTPUT PATTERN UCP_ARGS...: `mpi N UCP_ARGS...
# --output_folder=OUTPUT` fails with a message matching PATTERN (grep), and
# neither OUTPUT nor a staging folder beside it is left.
expect_refused() {
  local what=$1 n=$2 output=$3 pattern=$4 out rc
  shift 4
  set +e
  out=$(mpi "$n" "$@" --output_folder="$output" 2>&1)
  rc=$?
  set -e
  [[ $rc -ne 0 ]] || fail "$what: mpirun succeeded"
  grep -q "$pattern" <<<"$out" || { echo "$out"; fail "$what: no error matching '$pattern'"; }
  [[ ! -e "$output" ]] || fail "$what: an output was committed"
  ! ls -A "$(dirname "$output")" 2>/dev/null | grep -q "ucp-tmp" ||
    fail "$what: a staging folder was left behind: $(ls -A "$(dirname "$output")")"
  checks=$((checks + 1))
}

# 1. The fixtures: convert, then reshard the universal checkpoint and the
#    ZeRO folder, one process vs 1, 2, 3 ranks.
for fixture in neox-tp2-pp1-dp1 neox-tp2-pp1-dp2 neox-tp1-pp2-dp1 neox-bf16-tp2-pp1-dp2 gpt-zero2-nopipe-tp2-dp2; do
  src=$FX/$fixture/global_step4
  one=$W/$fixture/one
  "$UCP" convert --input_folder="$src" --output_folder="$one/u" --progress=never >/dev/null
  "$UCP" reshard --input_folder="$one/u" --output_folder="$one/r/global_step4" --tp=1 --progress=never >/dev/null
  "$UCP" reshard --input_folder="$src" --output_folder="$one/z/global_step4" --tp=1 --dp=2 --progress=never >/dev/null
  for n in 1 2 3; do
    many=$W/$fixture/np$n
    mpi "$n" convert --input_folder="$src" --output_folder="$many/u" >/dev/null
    same "$one/u" "$many/u"
    mpi "$n" reshard --input_folder="$one/u" --output_folder="$many/r/global_step4" --tp=1 >/dev/null
    same "$one/r" "$many/r"
    if [[ $n == 3 ]]; then
      mpi "$n" reshard --input_folder="$src" --output_folder="$many/z/global_step4" --tp=1 --dp=2 >/dev/null
      same "$one/z" "$many/z"
    fi
  done
done

# 1b. DeepSpeed 0.19.5 layouts: ZeRO-3 (sub-groups), native MoE and per-rank
#     paddings resharded to dp=1, and ZeRO-3 converted, by 2 and 3 ranks.
V195=$(readlink -f "$FX/../deepspeed-0.19.5")
for fixture in gpt-zero3-subgroups-dp2 gpt-moe-ep2-zero2-dp2 gpt-zero1-padding-dp2; do
  src=$V195/$fixture/global_step4
  one=$W/v0195-$fixture/one
  "$UCP" reshard --input_folder="$src" --output_folder="$one/z/global_step4" --dp=1 --progress=never >/dev/null
  for n in 2 3; do
    many=$W/v0195-$fixture/np$n
    mpi "$n" reshard --input_folder="$src" --output_folder="$many/z/global_step4" --dp=1 >/dev/null
    same "$one/z" "$many/z"
  done
done
# The native MoE target's plan says what each file holds (the bytes its units
# are split by over ranks, and the plan's total): each within 25% of the file
# written above (frames and padding are not estimated). A constant per unit
# left every file on one rank.
moe_one=$W/v0195-gpt-moe-ep2-zero2-dp2/one/z/global_step4
plan=$("$UCP" reshard --input_folder="$V195/gpt-moe-ep2-zero2-dp2/global_step4" \
  --output_folder="$W/v0195-moe-plan/global_step4" --dp=1 --dry_run=2 --dry_run_units)
estimates=$(awk '/^  unit [0-9]+ file /{sub(":", "", $4); print $4, $5}' <<<"$plan")
[[ $(wc -l <<<"$estimates") -ge 3 ]] || { echo "$plan"; fail "MoE plan: fewer than 3 file units"; }
while read -r file bytes; do
  real=$(stat -c %s "$moe_one/$file")
  ((bytes * 4 >= real * 3 && bytes * 4 <= real * 5)) ||
    fail "MoE plan: $file estimated at $bytes bytes, written $real"
done <<<"$estimates"
checks=$((checks + 1))
src=$V195/gpt-zero3-dp2/global_step4
"$UCP" convert --input_folder="$src" --output_folder="$W/v0195-zero3-convert/one/u" --progress=never >/dev/null
mpi 2 convert --input_folder="$src" --output_folder="$W/v0195-zero3-convert/np2/u" >/dev/null
same "$W/v0195-zero3-convert/one/u" "$W/v0195-zero3-convert/np2/u"
# ... and that stage-3 universal folder read back: resharded to dp 3 by 2 and
#     3 ranks.
u3=$W/v0195-zero3-convert/one/u
"$UCP" reshard --input_folder="$u3" --output_folder="$W/v0195-zero3-u/one/z/global_step4" --dp=3 --progress=never >/dev/null
for n in 2 3; do
  mpi "$n" reshard --input_folder="$u3" --output_folder="$W/v0195-zero3-u/np$n/z/global_step4" --dp=3 >/dev/null
  same "$W/v0195-zero3-u/one/z" "$W/v0195-zero3-u/np$n/z"
done

# 1c. Other formats, by 2 and 3 ranks: a ZeRO-3 checkpoint saved at tp 2
#     (AutoTP, uneven widths) converted; a DCP saved by FSDP2 (torchtitan
#     style) resharded to ZeRO-1 dp 2; a DeepSpeed checkpoint written as DCP.
one=$W/other/one
"$UCP" convert --input_folder="$AUTOTP_Z3/master_z3_tp2_uneven/source" --output_folder="$one/z3tp" --progress=never >/dev/null 2>&1
"$UCP" reshard --input_folder="$DCP/titan_w2" --output_folder="$one/fromdcp/global_step1" --dp=2 --progress=never >/dev/null 2>&1
"$UCP" convert --input_folder="$FX/neox-tp2-pp1-dp2/global_step4" --output_folder="$one/todcp" --to=dcp --progress=never >/dev/null
for n in 2 3; do
  many=$W/other/np$n
  mpi "$n" convert --input_folder="$AUTOTP_Z3/master_z3_tp2_uneven/source" --output_folder="$many/z3tp" >/dev/null 2>&1
  same "$one/z3tp" "$many/z3tp"
  mpi "$n" reshard --input_folder="$DCP/titan_w2" --output_folder="$many/fromdcp/global_step1" --dp=2 >/dev/null 2>&1
  same "$one/fromdcp" "$many/fromdcp"
  mpi "$n" convert --input_folder="$FX/neox-tp2-pp1-dp2/global_step4" --output_folder="$many/todcp" --to=dcp >/dev/null
  same "$one/todcp" "$many/todcp"
done

# 1d. Optimizer files written in pieces (--piece_bytes: several units, on
#     different ranks, each writing a byte range of one file, rank 0 writing
#     the headers with the combined CRCs): the same bytes as one unit per
#     file in one process, from a universal and a ZeRO source, 2 and 3 ranks.
for fixture in neox-tp2-pp1-dp2 neox-bf16-tp2-pp1-dp2 gpt-zero2-nopipe-tp2-dp2; do
  one=$W/$fixture/one
  for from in r z; do
    if [[ $from == r ]]; then in=$one/u; else in=$FX/$fixture/global_step4; fi
    ref=$W/$fixture/pieces/$from-ref
    "$UCP" reshard --input_folder="$in" --output_folder="$ref/global_step4" --tp=1 --dp=1 --piece_bytes=-1 \
      --progress=never >/dev/null
    plan=$("$UCP" reshard --input_folder="$in" --output_folder="$W/$fixture/pieces/$from-dry" --tp=1 --dp=1 \
      --piece_bytes=65536 --dry_run=2 --dry_run_units)
    grep -q "optim_states.pt piece 2 of" <<<"$plan" || fail "$fixture: --piece_bytes=65536 cuts no optimizer file"
    rank1=$(awk '/^rank 1:/{r=1} r' <<<"$plan")
    grep -q " piece " <<<"$rank1" || fail "$fixture: rank 1 of 2 writes no piece"
    for n in 2 3; do
      many=$W/$fixture/pieces/$from-np$n
      mpi "$n" reshard --input_folder="$in" --output_folder="$many/global_step4" --tp=1 --dp=1 \
        --piece_bytes=65536 >/dev/null
      same "$ref" "$many"
    done
  done
done

# ... and the ZeRO-3 target's optimizer files (a ZeRO-3 source with several
#     sub-groups to dp 1; a ZeRO-2 tp-2 source to ZeRO-3 at tp 2).
z3pieces() {  # name input tp
  local ref=$W/zero3-pieces/$1-ref dry
  "$UCP" reshard --input_folder="$2" --output_folder="$ref/global_step4" --tp="$3" --dp=1 --zero_stage=3 \
    --piece_bytes=-1 --progress=never >/dev/null 2>&1
  dry=$("$UCP" reshard --input_folder="$2" --output_folder="$W/zero3-pieces/$1-dry" --tp="$3" --dp=1 --zero_stage=3 \
    --piece_bytes=65536 --dry_run=2 --dry_run_units 2>/dev/null)
  grep -q "optim_states.pt piece 2 of" <<<"$dry" || fail "$1: --piece_bytes=65536 cuts no ZeRO-3 optimizer file"
  grep -q " piece " <<<"$(awk '/^rank 1:/{r=1} r' <<<"$dry")" || fail "$1: rank 1 of 2 writes no ZeRO-3 piece"
  for n in 2 3; do
    mpi "$n" reshard --input_folder="$2" --output_folder="$W/zero3-pieces/$1-np$n/global_step4" --tp="$3" --dp=1 \
      --zero_stage=3 --piece_bytes=65536 >/dev/null 2>&1
    same "$ref" "$W/zero3-pieces/$1-np$n"
  done
}
z3pieces subgroups "$V195/gpt-zero3-subgroups-dp2/global_step4" 1
z3pieces nopipe-tp2 "$FX/gpt-zero2-nopipe-tp2-dp2/global_step4" 2

# 2. Random conformance models (any tp/pp/dp, every merge kind, ZeRO 1/2,
#    bf16/fp16, pipelines and plain modules, tied, frozen, buffers).
"$CONFORMANCE" fuzz --write_sources="$W/random" --cases=6 --seed=11 >/dev/null
for case_dir in "$W"/random/case_*; do
  src=$(cat "$case_dir/source_dir")
  read -r -a flags <<<"$(cat "$case_dir/source_flags")"
  read -r -a target <<<"$(cat "$case_dir/target_flags")"
  "$UCP" convert --input_folder="$src" --output_folder="$case_dir/one/u" "${flags[@]}" --progress=never >/dev/null
  "$UCP" reshard --input_folder="$case_dir/one/u" --output_folder="$case_dir/one/r/global_step1" "${target[@]}" \
    --progress=never >/dev/null
  for n in 2 3; do
    mpi "$n" convert --input_folder="$src" --output_folder="$case_dir/np$n/u" "${flags[@]}" >/dev/null
    same "$case_dir/one/u" "$case_dir/np$n/u"
    mpi "$n" reshard --input_folder="$case_dir/one/u" --output_folder="$case_dir/np$n/r/global_step1" "${target[@]}" >/dev/null
    same "$case_dir/one/r" "$case_dir/np$n/r"
  done
done

# 3. One rank fails: an input that only rank 1's unit reads is unreadable
#    (a dangling symlink). Resharding to pp=2 writes one optimizer file per
#    stage, the two largest units: rank 0 gets one, rank 1 the other.
bad=$W/failure/u
mkdir -p "$W/failure"
cp -rL "$W/neox-tp2-pp1-dp2/one/u" "$bad"
plan=$("$UCP" reshard --input_folder="$bad" --output_folder="$W/failure/out/global_step4" --tp=1 --pp=2 \
  --dry_run=3 --dry_run_units)
victim=$(awk '/^rank 1:/{r=1;next} /^rank 2:/{r=0} r && /reads .*exp_avg\.pt$/{print $2; exit}' <<<"$plan")
[[ -n "$victim" ]] || { echo "$plan"; fail "no exp_avg.pt input in rank 1's units"; }
grep -q "reads $victim\$" <(awk '/^rank 0:/{r=1;next} /^rank 1:/{r=0} r' <<<"$plan") && fail "$victim is read by rank 0 too"
rm "$victim"; ln -s "$W/failure/nothing_here" "$victim"
expect_refused "an unreadable input of rank 1" 3 "$W/failure/out/global_step4" "rank 1: .*$victim" \
  reshard --input_folder="$bad" --tp=1 --pp=2

# 4. A damaged byte inside an optimizer file's flat partition: each record is
#    CRC-checked by one rank only (the one reading most of it), and that is
#    enough: the job fails with a data-loss error naming the file and commits
#    nothing.
flip=$W/failure/flip/global_step4
mkdir -p "$(dirname "$flip")"
# -L: the fixtures are symlinks in the runfiles; the copy must be real files
# (a write through a symlink would damage the shared fixture itself).
cp -rL "$FX/neox-tp2-pp1-dp2/global_step4" "$flip"
victim=$flip/zero_pp_rank_1_mp_rank_01_optim_states.pt
[[ -f "$victim" && ! -L "$victim" ]] || fail "$victim is not a copy"
size=$(stat -c %s "$victim")
flip_byte "$victim" $((size / 2))
expect_refused "a damaged optimizer file" 3 "$W/failure/flip_out/u" "$victim.*CRC-32 mismatch" \
  convert --input_folder="$flip"

# 5. Records of 1 MiB and more (the fixtures' are smaller) are checked from
#    the bytes the units read: in one process by the process itself, under
#    mpirun by rank 0 joining every rank's ranges and reading the rest. The
#    outputs are the same at 1, 2 and 3 ranks, and a damaged byte anywhere in
#    an optimizer file read by the units fails every rank count, naming the
#    file and the record, with nothing committed.
big=$W/large/src/global_step1
"$MAKE_CKPT" --gb=0.04 --hidden=256 --vocab=4096 --tp=2 --dp=2 --output_folder="$big" >/dev/null
"$UCP" convert --input_folder="$big" --output_folder="$W/large/one/u" --progress=never >/dev/null
"$UCP" reshard --input_folder="$big" --output_folder="$W/large/one/z/global_step1" --tp=1 --dp=1 --progress=never >/dev/null
for n in 2 3; do
  mpi "$n" convert --input_folder="$big" --output_folder="$W/large/np$n/u" >/dev/null
  same "$W/large/one/u" "$W/large/np$n/u"
  mpi "$n" reshard --input_folder="$big" --output_folder="$W/large/np$n/z/global_step1" --tp=1 --dp=1 >/dev/null
  same "$W/large/one/z" "$W/large/np$n/z"
done
# The ranks check the optimizer files from what they read: the bytes read
# again for the check ("input re-read (CRC)" in --timings, all ranks) are
# well under the optimizer files' (each was read whole once more before).
optim_mb=$(( $(cat "$big"/*optim_states.pt | wc -c) / 1000000 ))
for n in 1 2; do
  out=$(mpi "$n" convert --input_folder="$big" --output_folder="$W/large/timings-np$n/u" --timings 2>&1 >/dev/null)
  crc_mb=$(awk '/^  input re-read \(CRC\) /{s += $NF} END {print s + 0}' <<<"$out")
  ((crc_mb * 2 < optim_mb)) || { echo "$out"; fail "np $n: $crc_mb MB read again to check $optim_mb MB of optimizer files"; }
  checks=$((checks + 1))
  # The same when each target file is written whole by record threads
  # (--piece_bytes=-1): they check what they read for the unit. (One rank
  # alone runs record threads here; two ranks on two cores run them inline.)
  out=$(mpi "$n" reshard --input_folder="$big" --output_folder="$W/large/timings-np$n/z/global_step1" --tp=1 --dp=1 \
    --piece_bytes=-1 --timings 2>&1 >/dev/null)
  crc_mb=$(awk '/^  input re-read \(CRC\) /{s += $NF} END {print s + 0}' <<<"$out")
  ((crc_mb * 2 < optim_mb)) ||
    { echo "$out"; fail "np $n reshard --piece_bytes=-1: $crc_mb MB read again to check $optim_mb MB"; }
  checks=$((checks + 1))
done
victim_name=zero_pp_rank_1_mp_rank_00_optim_states.pt
size=$(stat -c %s "$big/$victim_name")
for at in $((size / 3)) $((size / 2)) $((size * 9 / 10)); do
  dmg=$W/large/damaged-$at/global_step1
  mkdir -p "$(dirname "$dmg")"
  cp -r "$big" "$dmg"
  flip_byte "$dmg/$victim_name" "$at"
  for n in 1 2 3; do
    for op in convert reshard; do
      outdir=$W/large/damaged-$at/out-$op-np$n
      if [[ $op == convert ]]; then output=$outdir/u args=(convert); else
        output=$outdir/z/global_step1 args=(reshard --tp=1 --dp=1); fi
      expect_refused "np $n $op, a byte damaged at $at of $victim_name" "$n" "$output" \
        "$dmg/$victim_name: record '[^']*': CRC-32 mismatch" "${args[@]}" --input_folder="$dmg"
    done
  done
done

# A universal checkpoint as the source (reshard-u): the same output as the
# ZeRO route at 1 and 2 ranks, and a byte damaged in one of its state files
# fails 1-3 ranks, at tp 1 and 2, naming the file and the record, with
# nothing committed.
uni=$W/large/one/u
for n in 1 2; do
  mpi "$n" reshard --input_folder="$uni" --output_folder="$W/large/uni-np$n/z/global_step1" --tp=1 --dp=1 >/dev/null
  same "$W/large/one/z" "$W/large/uni-np$n/z"
done
dmg=$W/large/uni-damaged/u
mkdir -p "$(dirname "$dmg")"
cp -r "$uni" "$dmg"
victim=$dmg/zero/0.word_embeddings.weight/exp_avg.pt
size=$(stat -c %s "$victim")
flip_byte "$victim" $((size / 2))
for n in 1 2 3; do
  for tp in 1 2; do
    expect_refused "np $n tp $tp, a byte damaged in $victim" "$n" "$W/large/uni-damaged/out-np$n-tp$tp/global_step1" \
      "$victim: record '[^']*': CRC-32 mismatch" reshard --input_folder="$dmg" --tp="$tp" --dp=1
  done
done

# --timings under mpirun: every rank prints its table, with the time it spent
# waiting for the other ranks (the plan's broadcast, the results' gather) as
# a phase of its own; one process has no such phase.
src=$FX/neox-tp2-pp1-dp1/global_step4
out=$(mpi 2 convert --input_folder="$src" --output_folder="$W/timings/np2/u" --timings 2>&1 >/dev/null)
for r in 0 1; do
  grep -q "timings (rank $r of 2)" <<<"$out" || { echo "$out"; fail "no --timings table of rank $r"; }
done
[[ $(grep -c "waiting for other ranks" <<<"$out") == 2 ]] || { echo "$out"; fail "not two 'waiting for other ranks' rows"; }
out=$("$UCP" convert --input_folder="$src" --output_folder="$W/timings/one/u" --timings --progress=never 2>&1 >/dev/null)
grep -q "open, parse and plan" <<<"$out" || { echo "$out"; fail "no --timings table of one process"; }
! grep -q "waiting for other ranks" <<<"$out" || { echo "$out"; fail "one process waited for other ranks"; }
checks=$((checks + 1))

echo "PASS: $checks checks (fixtures x ranks 1-3, random models x ranks 2-3, a failing rank)"
