#!/usr/bin/env bash
# Builds the release into dist/: the portable `ucp` binary and one wheel per
# Python (the host's 3.11, Debian 13's 3.13, unstable's 3.14), with SHA256SUMS.
#
#   tools/release.sh [--out=DIR]      (default dist/ in the checkout)
#
# Refuses to release what is not portable: the Debian roots and Debian's
# sources must be there (tools/setup.sh makes them), so that the binary and
# the extensions are linked against the oldest root's glibc; then checks each
# artifact with tools/elf_abi.py: only glibc's libraries and libgcc_s needed,
# at most the oldest root's glibc, the wheel's tag the one its files allow.
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist
for arg in "$@"; do
  case $arg in
    --out=*) out=${arg#--out=} ;;
    *) echo "usage: tools/release.sh [--out=DIR]" >&2; exit 2 ;;
  esac
done
die() { echo "release: $*" >&2; exit 1; }

# What the portable link needs, before Bazel reads it.
oldest=bullseye
tools/deepspeed_env.sh root "$oldest" >/dev/null ||
  die "the $oldest root is missing: run tools/deepspeed_env.sh create $oldest (or tools/setup.sh)"
for suite in trixie sid; do
  tools/deepspeed_env.sh root "$suite" >/dev/null ||
    die "the $suite root is missing: run tools/deepspeed_env.sh create $suite (or tools/setup.sh)"
done
tools/debian_sources.sh dir abseil >/dev/null && tools/debian_sources.sh dir protobuf >/dev/null ||
  die "Debian's sources are missing: run tools/debian_sources.sh fetch (or tools/setup.sh)"
# Bazel reads the roots when its server starts: make it read them now.
bazel sync --configure >/dev/null 2>&1 || die "bazel sync --configure failed"
bazel build //tools:ucp //python:wheels
bin=$(bazel info bazel-bin 2>/dev/null)
version=$(sed -n 's/^UCP_VERSION = "\(.*\)"$/\1/p' tools/version.bzl)
oldest_glibc=$(tools/deepspeed_env.sh run --root="$oldest" -- ldd --version | sed -n '1s/.* //p')
glibc_libs=libc.so.6,libm.so.6,libpthread.so.0,libdl.so.2,librt.so.1,libgcc_s.so.1,ld-linux-x86-64.so.2

rm -rf "$out.tmp"
mkdir -p "$out.tmp"
binary=ucp-$version-linux-x86_64
cp "$bin/tools/ucp" "$out.tmp/$binary"
chmod 755 "$out.tmp/$binary"
/usr/bin/python3 tools/elf_abi.py check "$out.tmp/$binary" --max-glibc="$oldest_glibc" --only-libs="$glibc_libs" ||
  die "$binary is not portable (see above)"
wheels=0
for dir in wheel wheel_trixie wheel_sid; do
  whl=$(ls "$bin/python/$dir"/*.whl 2>/dev/null || true)
  [[ -n $whl ]] || die "no wheel in $bin/python/$dir"
  cp "$whl" "$out.tmp/"
  wheels=$((wheels + 1))
done
((wheels == 3)) || die "expected 3 wheels, got $wheels"
(cd "$out.tmp" && sha256sum -- * >SHA256SUMS)
rm -rf "$out"
mv "$out.tmp" "$out"

min_glibc=$(/usr/bin/python3 tools/elf_abi.py min-glibc "$out/$binary")
echo "release: $out/ (minimum glibc $min_glibc; linked against $oldest's $oldest_glibc)"
(cd "$out" && ls -l -- * | awk '{printf "  %10d  %s\n", $5, $NF}')
