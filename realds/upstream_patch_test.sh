#!/bin/bash
# Proves that tools/upstream_check.sh can tell (realds/README.md, "Upstream
# check"): a real patch is applied to a copy of DeepSpeed 0.19.5 and the check
# runs against 0.19.5's recorded baseline. Each CASE:ROUTE named must show WANT
# (FIXED or REGRESSED), every other row "unchanged", and the exit status must be
# 0 for FIXED, 1 for REGRESSED.
# Args: PATCH WANT CASE:ROUTE...
set -uo pipefail
patch_file=$1; want=$2; shift 2
UCP_SHARED_DIR=$(tools/deepspeed_env.sh shared) || exit 1
export UCP_SHARED_DIR
src=$(tools/deepspeed_env.sh deepspeed 0.19.5) || exit 1
copy=$TEST_TMPDIR/deepspeed-0.19.5-patched
rm -rf "$copy"
cp -r "$src" "$copy"
if ! patch -p1 --no-backup-if-mismatch -d "$copy" <"$patch_file"; then
  echo "FAIL: $patch_file does not apply to DeepSpeed 0.19.5"
  exit 1
fi
out=$TEST_TMPDIR/check.out
/usr/bin/python3 realds/upstream_check.py --deepspeed_src="$copy" --deepspeed_env=tools/deepspeed_env.sh >"$out" 2>&1
rc=$?
cat "$out"
fail=0
want_rc=0
[[ $want == REGRESSED ]] && want_rc=1
if [[ $rc != "$want_rc" ]]; then
  echo "FAIL: exit status $rc, want $want_rc"
  fail=1
fi
# the table: case | route | result | change | detail
table=$TEST_TMPDIR/table
sed -n '/^case  .*| route/,/^$/p' "$out" | tail -n +2 | awk -F' *[|] *' 'NF >= 4 {print $1 "\t" $2 "\t" $3 "\t" $4}' >"$table"
for row in "$@"; do
  case=${row%%:*}; route=${row#*:}
  if awk -F'\t' -v c="$case" -v r="$route" -v w="$want" '$1 == c && $2 == r && $4 == w {f=1} END {exit !f}' "$table"; then
    echo "ok   $case / $route: $want"
  else
    echo "FAIL $case / $route: not $want"
    fail=1
  fi
done
if [[ ! -s $table ]]; then
  echo "FAIL: no result table"
  fail=1
fi
changed=$(awk -F'\t' '$4 != "unchanged"' "$table" | wc -l)
if [[ $changed != "$#" ]]; then
  echo "FAIL: $changed rows changed against the baseline, want exactly the $# named"
  fail=1
fi
exit $fail
