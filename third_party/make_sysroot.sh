#!/usr/bin/env bash
# Copies what linking against a Debian root's glibc needs (start files, libc,
# libm, libpthread, libdl, librt, the dynamic loader, libgcc_s) into a small
# sysroot for `gcc --sysroot=`: third_party/portable.bzl calls it when Bazel
# reads the glibc_sysroot repository.
#
#   make_sysroot.sh ROOT OUT
#
# Symlinks are resolved inside ROOT (Debian's point to absolute paths such as
# /lib/x86_64-linux-gnu/libpthread.so.0, which on this machine would be the
# build host's own newer glibc), and the files are copied, never linked, so that
# nothing of the host leaks into the link.
set -euo pipefail
root=$1
out=$2
multiarch=x86_64-linux-gnu

# Resolves PATH (absolute, inside the root) through symlinks, each hop read
# relative to the root, directories included.
resolve() {
  local path=$1 hops=0 done="" rest part target
  while :; do
    done=""
    rest=${path#/}
    local changed=0
    IFS=/ read -r -a parts <<<"$rest"
    for part in "${parts[@]}"; do
      [[ -z $part ]] && continue
      if [[ -L $root$done/$part ]]; then
        target=$(readlink "$root$done/$part")
        if [[ $target == /* ]]; then
          path=$target
        else
          path=$done/$target
        fi
        # Append what follows this component.
        local after=${rest#*"$part"}
        rest=""
        path=$path$after
        changed=1
        break
      fi
      done=$done/$part
      rest=${rest#"$part"}
      rest=${rest#/}
    done
    if ((changed == 0)); then
      echo "$root$done"
      return 0
    fi
    hops=$((hops + 1))
    ((hops < 40)) || { echo "make_sysroot: too many symlinks resolving $1 in $root" >&2; exit 1; }
  done
}

copy() {  # copy ROOT_PATH DEST_RELATIVE
  local src
  src=$(resolve "$1")
  [[ -f $src ]] || { echo "make_sysroot: $1 is missing from $root (libc6-dev installed there?)" >&2; exit 1; }
  mkdir -p "$(dirname "$out/$2")"
  cp "$src" "$out/$2"
}

rm -rf "$out"
mkdir -p "$out"
for f in Scrt1.o crt1.o crti.o crtn.o libc.so libc_nonshared.a libm.so libpthread.so libdl.so librt.so; do
  copy "/usr/lib/$multiarch/$f" "usr/lib/$multiarch/$f"
done
# Present from some glibc versions on only.
for f in libmvec.so libpthread_nonshared.a; do
  if [[ -e $(resolve "/usr/lib/$multiarch/$f") ]]; then copy "/usr/lib/$multiarch/$f" "usr/lib/$multiarch/$f"; fi
done
for f in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2 libgcc_s.so.1; do
  copy "/lib/$multiarch/$f" "lib/$multiarch/$f"
done
if [[ -e $(resolve "/lib/$multiarch/libmvec.so.1") ]]; then copy "/lib/$multiarch/libmvec.so.1" "lib/$multiarch/libmvec.so.1"; fi
copy /lib64/ld-linux-x86-64.so.2 lib64/ld-linux-x86-64.so.2
# The glibc version, for the build's record (e.g. 2.31).
ls "$(dirname "$(resolve "/lib/$multiarch/libc.so.6")")" >/dev/null
version=$(basename "$(readlink "$root/lib/$multiarch/libc.so.6" 2>/dev/null || readlink "$root/usr/lib/$multiarch/libc.so.6")" |
  sed -n 's/^libc-\([0-9.]*\)\.so$/\1/p')
if [[ -z $version ]]; then
  version=$(strings "$out/lib/$multiarch/libc.so.6" | sed -n 's/^GNU C Library .* version \([0-9.]*\).*/\1/p' | head -n 1)
fi
echo "$version" >"$out/GLIBC_VERSION"
