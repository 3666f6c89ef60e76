#!/bin/bash
# The README's package map against the include graph of the sources
# (tools/package_map.py): fails when an include runs against the map, a
# package with sources is missing from it, or a line's `->` list is not what
# its sources include. The sources are read where README.md really lies
# (the test is tagged external: it runs every time, whatever changed). First,
# the check must catch a made-up tree whose lower package includes an upper one.
# Args: PACKAGE_MAP_PY README
set -u
script=$1
readme=$(readlink -f "$2")
root=$(dirname "$readme")

bad=$(mktemp -d)
trap 'rm -rf "$bad"' EXIT
mkdir -p "$bad/low" "$bad/high"
touch "$bad/low/BUILD" "$bad/high/BUILD"
printf '#include "high/h.h"\n' > "$bad/low/l.h"
printf '#include "low/l.h"\n' > "$bad/high/h.h"
printf '<!-- package map begin -->\n    high -> low\n    low -> high\n<!-- package map end -->\n' > "$bad/README.md"
out=$(/usr/bin/python3 "$script" "$bad"); rc=$?
if [ "$rc" = 0 ] || ! echo "$out" | grep -q "low includes high, on a line above it"; then
  echo "FAIL: the check passed a map with an include against it (exit $rc):"; echo "$out"; exit 1
fi

/usr/bin/python3 "$script" "$root"
