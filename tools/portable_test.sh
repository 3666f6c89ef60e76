#!/usr/bin/env bash
# The portable `ucp` binary inside a Debian root (tools/deepspeed_env.sh): the
# oldest release the archive serves (bullseye, glibc 2.31), Debian 13 (trixie)
# and unstable (sid). In the root it prints the minimum glibc it was stamped
# with, which is what tools/elf_abi.py reads from the file and no more than the
# root's glibc; it runs `ucp demo`; it converts a DeepSpeed fixture and reshards
# the result to tp=1, byte for byte what the same binary writes on the host.
# It needs only glibc's libraries and libgcc_s.
#
#   portable_test.sh UCP ELF_ABI DEEPSPEED_ENV FIXTURES SUITE ROOT_DIR MISSING
#
# ROOT_DIR is the root's folder when Bazel found it (third_party/portable.bzl),
# else MISSING says what to run: the test fails with it.
set -euo pipefail
UCP=$(readlink -f "$1")
ELF_ABI=$(readlink -f "$2")
DEEPSPEED_ENV=$(readlink -f "$3")
FX=$(readlink -f "$4")
SUITE=$5
ROOT_DIR=$6
MISSING=$7

fail() { echo "FAIL ($SUITE): $*" >&2; exit 1; }
[[ -z $MISSING ]] || fail "$MISSING"
[[ -n $ROOT_DIR && -d $ROOT_DIR ]] || fail "the $SUITE root is missing: run tools/deepspeed_env.sh create $SUITE"
export UCP_CACHE_DIR=$(dirname "$(dirname "$ROOT_DIR")")
export PATH=/usr/sbin:/usr/bin:/sbin:/bin   # chroot, mount, unshare
W=${TEST_TMPDIR:-/tmp}/portable_$SUITE
rm -rf "$W"; mkdir -p "$W"
checks=0
in_root() { bash "$DEEPSPEED_ENV" run --root="$SUITE" --bind="$W" --cwd="$W" -- "$@"; }

# Everything the root sees is under $W: the binary and a copy of the fixture.
cp "$UCP" "$W/ucp"
fixture=neox-tp2-pp1-dp2
cp -rL "$FX/$fixture/global_step4" "$W/src"

# 1. What the binary needs: glibc's libraries and libgcc_s, nothing else.
/usr/bin/python3 "$ELF_ABI" check "$W/ucp" \
  --only-libs=libc.so.6,libm.so.6,libpthread.so.0,libdl.so.2,librt.so.1,libgcc_s.so.1,ld-linux-x86-64.so.2 ||
  fail "the binary needs a library beyond glibc and libgcc_s"
checks=$((checks + 1))

# 2. --version in the root: the stamped minimum glibc is the file's, and the root has it.
min_glibc=$(/usr/bin/python3 "$ELF_ABI" min-glibc "$W/ucp")
version=$(in_root "$W/ucp" --version) || fail "ucp --version failed in the root: $version"
grep -qx "minimum glibc: $min_glibc (needed by .*)" <<<"$version" ||
  fail "ucp --version says '$version', the file needs glibc $min_glibc"
ldd_version=$(in_root ldd --version) || fail "ldd --version failed in the root"
root_glibc=$(sed -n '1s/.* //p' <<<"$ldd_version")
[[ $(printf '%s\n%s\n' "$min_glibc" "$root_glibc" | sort -V | tail -n 1) == "$root_glibc" ]] ||
  fail "the binary needs glibc $min_glibc, the $SUITE root has $root_glibc"
echo "$SUITE: glibc $root_glibc, the binary needs $min_glibc"
checks=$((checks + 1))

# 3. ucp demo in the root.
demo=$(in_root "$W/ucp" demo --workdir="$W/demo" 2>&1) || { echo "$demo"; fail "ucp demo failed"; }
grep -q "all bitwise equal" <<<"$demo" || { echo "$demo"; fail "ucp demo did not verify its checkpoint"; }
checks=$((checks + 1))

# 4. A fixture converted and resharded in the root == the same on the host.
for where in host root; do
  out=$W/$where
  if [[ $where == host ]]; then run=("$W/ucp"); else run=(in_root "$W/ucp"); fi
  "${run[@]}" convert --input_folder="$W/src" --output_folder="$out/u" --progress=never >/dev/null ||
    fail "convert on the $where failed"
  "${run[@]}" reshard --input_folder="$out/u" --output_folder="$out/r/global_step4" --tp=1 --dp=1 \
    --progress=never >/dev/null || fail "reshard on the $where failed"
done
diff -r "$W/host" "$W/root" >/dev/null || { diff -r "$W/host" "$W/root" | head; fail "the $SUITE root wrote other bytes"; }
[[ $(find "$W/root/r" -type f | wc -l) -gt 3 ]] || fail "the reshard wrote almost nothing"
checks=$((checks + 1))

echo "PASS: $checks checks in the $SUITE root"
