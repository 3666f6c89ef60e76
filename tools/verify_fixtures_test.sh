#!/bin/bash
# `ucp verify` exits 0 on every valid checkpoint folder of the fixtures: the
# folders are discovered, not listed, so a new fixture is covered: under each
# ROOT argument, every folder named global_step*, resaved-* or *_universal*,
# and every folder holding a `latest` or `latest_universal` file (a root,
# verified through the tag it names). Fails when a folder does not verify, or
# when the walk finds fewer folders than the MIN_FOLDERS argument (the walk
# itself broken).
# Args: UCP MIN_FOLDERS ROOT...
set -u
UCP=$1; MIN=$2; shift 2
list=$(mktemp)
for root in "$@"; do
  if [ ! -d "$root" ]; then echo "FAIL: no folder $root"; exit 1; fi
  find -L "$root" -type d \( -name 'global_step*' -o -name 'resaved-*' -o -name '*_universal*' \) -print >> "$list"
  find -L "$root" \( -name latest -o -name latest_universal \) -type f -printf '%h\n' >> "$list"
done
sort -u "$list" -o "$list"
n=0; fails=0
while IFS= read -r d; do
  n=$((n + 1))
  out=$("$UCP" verify "$d" 2>&1); rc=$?
  if [ "$rc" != 0 ]; then
    echo "FAIL $d (exit $rc):"; echo "$out" | head -20; fails=$((fails + 1))
  else
    echo "ok   $d: $(echo "$out" | tail -1 | sed 's/.*: OK/OK/')"
  fi
done < "$list"
rm -f "$list"
echo "$n folders, $fails failed"
if [ "$n" -lt "$MIN" ]; then echo "FAIL: found $n folders, expected at least $MIN"; exit 1; fi
[ "$fails" = 0 ]
