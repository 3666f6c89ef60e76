#!/bin/bash
# `ucp convert --to=dcp` read by torch's own torch.distributed.checkpoint (torch 2.14,
# Debian unstable root of tools/deepspeed_env.sh): each real DeepSpeed 0.19.5 fixture
# named in the args is converted to DCP and to universal, and dcp_load_check.py loads the
# DCP folder at world sizes 1, 2 and 3 (gloo; dim-0 shards as FSDP2 holds them) and
# compares every entry bitwise with the universal folder's (which DeepSpeed's own loader
# reads bitwise: realds/). Negative control: a DCP folder with one byte of one tensor
# changed must fail the check.
# Args: UCP CHECKER FIXTURE... (paths under @shared's fixtures/deepspeed-0.19.5)
set -u
UCP=$(pwd)/$1; CHECK=$(pwd)/$2; shift 2
UCP_SHARED_DIR=$(tools/deepspeed_env.sh shared) || exit 1
export UCP_SHARED_DIR
ENV=$(pwd)/tools/deepspeed_env.sh
# The runfiles are symlinks out of the root's reach: run a copy from the bound folder.
cp "$CHECK" "$TEST_TMPDIR/dcp_load_check.py"
CHECK=$TEST_TMPDIR/dcp_load_check.py
fail=0
check() {  # DCP UNIVERSAL WORLD[,WORLD...]: one line "world N: ..." per world size
  "$ENV" run --root=sid --deepspeed=0.19.5 --bind="$TEST_TMPDIR" -- \
    python3 "$CHECK" "$1" "$2" "$3" 2>&1 | grep -v -e gloo -e UserWarning -e 'return func'
  return "${PIPESTATUS[0]}"
}
for fx in "$@"; do
  name=$(basename "$fx")
  src=$UCP_SHARED_DIR/fixtures/deepspeed-0.19.5/$fx
  out=$TEST_TMPDIR/$name
  if ! "$UCP" convert --input_folder="$src" --output_folder="$out/dcp" --to=dcp > "$out.log" 2>&1 ||
     ! "$UCP" convert --input_folder="$src" --output_folder="$out/u" >> "$out.log" 2>&1; then
    echo "FAIL $name: ucp convert failed:"; cat "$out.log"; fail=1; continue
  fi
  check "$out/dcp" "$out/u" 1,2,3 > "$out.check" || fail=1
  for world in 1 2 3; do
    if grep -q "^world $world: [1-9][0-9]* entries, all bitwise equal$" "$out.check"; then
      echo "PASS $name world $world"
    else
      echo "FAIL $name world $world"; cat "$out.check"; fail=1
    fi
  done
done
# Negative control: flip one bit of the first model entry's storage: the first
# item of the first param's file (__0_0.distcp holds that param's entries back
# to back, each a torch.save archive; the model entry is the first), the first
# byte of its storage record "archive/data/0".
fx=$1; name=$(basename "$fx")
bad=$TEST_TMPDIR/bad
cp -r "$TEST_TMPDIR/$name/dcp" "$bad"
victim=$bad/__0_0.distcp
/usr/bin/python3 - "$victim" <<'PY'
import struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
off = data.index(b"archive/data/0") - 30  # the first item's local header of its storage record
assert data[off:off + 4] == b"PK\x03\x04", "no local header before archive/data/0"
n, m = struct.unpack("<HH", data[off + 26:off + 30])
data[off + 30 + n + m] ^= 1
open(path, "wb").write(bytes(data))
PY
check "$bad" "$TEST_TMPDIR/$name/u" 1 > "$TEST_TMPDIR/bad.log" 2>&1
if ! grep -q "^world 1: .* DIFFER: model\." "$TEST_TMPDIR/bad.log"; then
  echo "FAIL negative control: a changed DCP entry was not reported as differing"; cat "$TEST_TMPDIR/bad.log"; fail=1
else
  echo "PASS negative control: $(grep '^world' "$TEST_TMPDIR/bad.log" | cut -c1-200)"
fi
exit $fail
