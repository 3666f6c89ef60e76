#!/usr/bin/env bash
# Debian's source packages of the static libraries the wheels link in, in the
# versions installed here (libabsl-dev, libprotobuf-dev), fetched with apt and
# unpacked with Debian's patches applied, into the cache:
#
#   tools/debian_sources.sh fetch     download and unpack (idempotent)
#   tools/debian_sources.sh dir PKG   print the unpacked folder of abseil or protobuf (fails if missing)
#
# Why: Debian builds libabsl_*.a and libprotobuf.a as position-independent
# *executable* code. A program links them (the `ucp` binary does), but a shared
# object cannot hold six of their objects (local-exec TLS, copy relocations
# against stderr), so a Python extension module cannot link them as they are.
# third_party/portable.bzl compiles those six files again with -fPIC from these
# sources (the same version, the same patches) and links them ahead of the
# archives (third_party/portable.bzl; README, "Install").
#
# The cache is $UCP_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/ucp), as for
# tools/deepspeed_env.sh. apt runs with a private source list and index in the
# cache (deb-src lines made from the Debian entries of the host's apt sources), so
# the host's apt configuration is left as it is.
set -euo pipefail

CACHE=${UCP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ucp}
SRC=$CACHE/src
declare -A BINARY_OF=([abseil]=libabsl-dev [protobuf]=libprotobuf-dev)

die() { echo "debian_sources: $*" >&2; exit 1; }

source_version() {  # the source version of the installed binary package
  dpkg-query -W -f='${source:Version}' "${BINARY_OF[$1]}" 2>/dev/null ||
    die "${BINARY_OF[$1]} is not installed (tools/setup.sh installs it)"
}

upstream_version() {  # 20220623.1-1+deb12u2 -> 20220623.1
  local v=${1#*:}
  echo "${v%-*}"
}

dir_of() {
  local pkg=$1 v
  v=$(source_version "$pkg")
  echo "$SRC/$pkg-$v"
}

# deb-src lines for the Debian archives of the host's apt sources (deb822 and
# one-line formats); other vendors' repositories are left out.
deb_src_lines() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && uris != "") {
          n = split(uris, u, " "); m = split(suites, s, " ")
          for (i = 1; i <= n; i++) if (u[i] ~ /\/debian(-security)?\/?$/)
            for (j = 1; j <= m; j++) print "deb-src " u[i] " " s[j] " " comps
        }
        types = ""; uris = ""; suites = ""; comps = ""
      }
      /^[ \t]*$/ { flush(); next }
      /^Types:/ { sub(/^Types:[ \t]*/, ""); types = $0 }
      /^URIs:/ { sub(/^URIs:[ \t]*/, ""); uris = $0 }
      /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
      /^Components:/ { sub(/^Components:[ \t]*/, ""); comps = $0 }
      END { flush() }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    awk '$1 == "deb" {
      i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
      if ($i ~ /\/debian(-security)?\/?$/) { $1 = "deb-src"; line = "deb-src"; for (k = i; k <= NF; k++) line = line " " $k; print line }
    }' "$f"
  done
}

fetch() {
  local missing=() pkg
  for pkg in abseil protobuf; do
    [[ -f $(dir_of "$pkg")/.ucp-unpacked ]] || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    echo "debian_sources: abseil and protobuf sources ready in $SRC"
    return 0
  fi
  command -v dpkg-source >/dev/null || die "dpkg-source is missing (package dpkg-dev; tools/setup.sh installs it)"
  local apt="$SRC/.apt"
  mkdir -p "$apt/lists/partial" "$SRC"
  deb_src_lines >"$apt/sources.list"
  [[ -s $apt/sources.list ]] || die "no Debian archive in the host's apt sources to take deb-src lines from"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/none"
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
              -o "APT::Sandbox::User=root")
  apt-get "${opts[@]}" -qq update || die "apt-get update of the source index failed (sources: $apt/sources.list)"
  for pkg in "${missing[@]}"; do
    local v work
    v=$(source_version "$pkg")
    work=$(mktemp -d "$SRC/.$pkg.XXXXXX")
    (cd "$work" && apt-get "${opts[@]}" -qq source --download-only "$pkg=$v") ||
      die "apt-get source $pkg=$v failed"
    (cd "$work" && dpkg-source -x --no-check ./*.dsc "$pkg" >/dev/null) || die "dpkg-source -x of $pkg $v failed"
    touch "$work/$pkg/.ucp-unpacked"
    rm -rf "$(dir_of "$pkg")"
    mv "$work/$pkg" "$(dir_of "$pkg")"
    rm -rf "$work"
    echo "debian_sources: $pkg $v unpacked in $(dir_of "$pkg")"
  done
}

case ${1:-} in
  fetch) fetch ;;
  dir)
    pkg=${2:?abseil or protobuf}
    [[ -n ${BINARY_OF[$pkg]+x} ]] || die "unknown package '$pkg' (abseil or protobuf)"
    d=$(dir_of "$pkg")
    [[ -f $d/.ucp-unpacked ]] || die "the $pkg source is not fetched: run tools/debian_sources.sh fetch"
    echo "$d"
    ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; [[ -z ${1:-} ]] || exit 2 ;;
esac
