#!/usr/bin/env bash
# The real-DeepSpeed runtime: Debian roots made with debootstrap, cached outside
# the clone, and unmodified DeepSpeed sources from ../shared/deepspeed-src.
#
#   tools/deepspeed_env.sh create [SUITE...|all]          build the roots (trixie, sid, bullseye, trixie-hf;
#                                                         idempotent, at once; default all)
#   tools/deepspeed_env.sh root SUITE                     print a root's folder (fails if not built)
#   tools/deepspeed_env.sh deepspeed VERSION|DIR          print the DeepSpeed source folder to use
#   tools/deepspeed_env.sh run [--root=SUITE] [--deepspeed=VERSION|DIR] [--bind=HOST_DIR]... [--env=K=V]...
#                              [--cwd=DIR] -- CMD...
#                                                         run CMD inside a root, DeepSpeed importable
#   tools/deepspeed_env.sh status                         what is cached
#   tools/deepspeed_env.sh shared                         print the ../shared folder in use (tests:
#                                                         export UCP_SHARED_DIR=$(tools/deepspeed_env.sh shared))
#
# Roots (Debian's own packages, nothing from PyPI; see ../shared/docs/REAL-CLIENTS.md):
#   trixie  Debian 13: Python 3.13, torch 2.6, numpy 2, pydantic 2 (DeepSpeed 0.14.4 - 0.19.5)
#   sid     Debian unstable: Python 3.14, torch 2.14, transformers, accelerate
#           (DeepSpeed 0.18.9, 0.19.5, master; Hugging Face Trainer, FSDP2 / DCP)
#   both    also safetensors, python3-dev, -venv, -pip, pybind11-dev (wheels of the ucp package)
#   trixie-hf trixie with sid's transformers, accelerate, huggingface-hub and tokenizers
#           unpacked into it (pure Python; tokenizers an abi3 extension) and their
#           dependencies from trixie: the Hugging Face Trainer in bf16 (trixie's gloo has
#           the bf16 collectives sid's lacks)
#   bullseye Debian 11, the oldest release the archive still serves: glibc 2.31 and
#           libc6-dev only, no Python. The portable `ucp` binary and the wheels' extensions
#           are linked against its glibc (third_party/debian_roots.bzl) and run in it
#           (tools:portable_test).
# The packages come from the archive the host's apt already uses (read from its
# sources, never written here). The cache is $UCP_CACHE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/ucp); a root is built in a temporary folder and
# renamed into place when complete, so an interrupted run leaves nothing half-made.
#
# `run` executes CMD in a private mount namespace (unshare -m): /proc, /dev, /sys
# and each --bind folder are bind-mounted into the root (a --bind folder at the same
# path it has on the host), and vanish with the namespace, so concurrent jobs
# sharing one root never unmount each other's. Inside: DS_ACCELERATOR=cpu,
# DS_BUILD_OPS=0, OMP_NUM_THREADS=1, PYTHONPATH=<DeepSpeed source>:<dist-info shim>
# (transformers and accelerate look for an installed DeepSpeed; the shim is a
# minimal deepspeed-<version>.dist-info, no code). Needs root (debootstrap, chroot).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # chroot, debootstrap (not on PATH under bazel test)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# ../shared: $UCP_SHARED_DIR, else beside the clone, or in a test's runfiles
# (@shared: external/shared, or ../shared beside the workspace).
SHARED=${UCP_SHARED_DIR:-}
if [[ -z $SHARED ]]; then
  SHARED=$REPO/../shared
  for d in "$REPO/external/shared" "$REPO/../shared"; do
    if [[ -d $d/deepspeed-src ]]; then SHARED=$(cd "$d" && pwd); break; fi
  done
fi
# Under `bazel test` HOME is the test's temporary folder: the cache stays in the
# user's own home (from the password database) unless UCP_CACHE_DIR says otherwise.
if [[ -n ${TEST_TMPDIR:-} ]]; then
  USER_HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
else
  USER_HOME=$HOME
fi
CACHE=${UCP_CACHE_DIR:-${XDG_CACHE_HOME:-$USER_HOME/.cache}/ucp}

BASE_PACKAGES=python3,python3-torch,python3-numpy,python3-psutil,python3-pydantic,python3-tqdm,python3-packaging,python3-yaml,python3-einops,python3-msgpack,python3-cpuinfo,python3-hjson,python3-safetensors,python3-dev,python3-venv,python3-pip,pybind11-dev
declare -A EXTRA_PACKAGES=(
  [trixie]=""
  [sid]=",python3-transformers,python3-accelerate"
  [trixie-hf]=",python3-regex,python3-httpx,python3-filelock,python3-fsspec,python3-requests,python3-typing-extensions,libonig5"
)
# Roots whose Debian suite is another name's (debootstrap's suite argument).
declare -A DEBIAN_SUITE=(
  [trixie-hf]="trixie"
)
# Packages of another suite unpacked into a root (dpkg -x, no maintainer scripts)
# after debootstrap. trixie-hf: trixie packages no transformers, accelerate,
# huggingface-hub or tokenizers, and its torch 2.6's gloo has the bf16
# collectives sid's lacks, so the Hugging Face Trainer runs in bf16 only in
# trixie with sid's (pure Python; tokenizers is an abi3 extension). Their
# dependencies are trixie's own (EXTRA_PACKAGES). Each .deb is checked against
# the suite's Packages index (SHA256). realds/cases/trainer_bf16.textproto runs
# there (realds/README.md, "Hugging Face Trainer").
declare -A OVERLAY_SUITE=(
  [trixie-hf]="sid"
)
declare -A OVERLAY_PACKAGES=(
  [trixie-hf]="python3-transformers python3-accelerate python3-huggingface-hub python3-tokenizers"
)
# Suites with a package list of their own instead of BASE_PACKAGES + EXTRA_PACKAGES.
declare -A OWN_PACKAGES=(
  [bullseye]="libc6-dev"
)
# What a new root must do before it is renamed into place.
declare -A ROOT_CHECK=(
  [trixie]='python3 -c "import torch, numpy, pydantic; print(\"torch\", torch.__version__, \"numpy\", numpy.__version__)"'
  [trixie-hf]='python3 -c "import torch, numpy, pydantic, transformers, accelerate, tokenizers; print(\"torch\", torch.__version__, \"numpy\", numpy.__version__, \"transformers\", transformers.__version__)"'
  [sid]='python3 -c "import torch, numpy, pydantic; print(\"torch\", torch.__version__, \"numpy\", numpy.__version__)"'
  [bullseye]='ldd --version | head -n 1'
)
SUITES=(trixie sid bullseye trixie-hf)

die() { echo "deepspeed_env: $*" >&2; exit 1; }

# The first Debian mirror of the host's apt sources (deb822 or one-line format),
# security archives excluded.
mirror() {
  local url=""
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    url=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' /etc/apt/sources.list.d/*.sources |
          grep -v -- '-security' | head -n 1 || true)
  fi
  if [[ -z $url && -f /etc/apt/sources.list ]]; then
    url=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break } }' \
          /etc/apt/sources.list | grep -v -- '-security' | head -n 1 || true)
  fi
  [[ -n $url ]] || die "no Debian mirror found in /etc/apt/sources.list{,.d/*.sources}"
  echo "$url"
}

packages() {  # the --include list of a suite
  if [[ -n ${OWN_PACKAGES[$1]+x} ]]; then
    echo "${OWN_PACKAGES[$1]}"
  else
    echo "$BASE_PACKAGES${EXTRA_PACKAGES[$1]}"
  fi
}

recipe() {  # what a root is made of; a root built from another recipe is rebuilt
  local overlay=""
  [[ -n ${OVERLAY_PACKAGES[$1]+x} ]] && overlay=" overlay=${OVERLAY_SUITE[$1]}:${OVERLAY_PACKAGES[$1]// /,}"
  echo "suite=$1 variant=minbase include=$(packages "$1")$overlay"
}

# Unpacks OVERLAY_PACKAGES[suite] of OVERLAY_SUITE[suite] into root folder $2,
# each .deb checked against that suite's Packages index; the versions go to the log.
overlay() {
  local suite=$1 root=$2 url=$3 log=$4 from index pkg meta file sum deb
  [[ -n ${OVERLAY_PACKAGES[$suite]+x} ]] || return 0
  from=${OVERLAY_SUITE[$suite]}
  index=$(mktemp)
  curl -fsS "$url/dists/$from/main/binary-amd64/Packages.xz" | xz -dc >"$index" ||
    die "cannot read $from's Packages index from $url"
  for pkg in ${OVERLAY_PACKAGES[$suite]}; do
    meta=$(awk -v p="$pkg" '$1 == "Package:" { cur = $2 } cur == p && /^(Version|Filename|SHA256):/ { print $2 } cur == p && /^$/ { exit }' "$index")
    file=$(sed -n 2p <<<"$meta"); sum=$(sed -n 3p <<<"$meta")
    [[ -n $file && -n $sum ]] || die "$pkg is not in $from's Packages index"
    deb="$CACHE/debs/$suite/$(basename "$file")"
    if [[ ! -f $deb ]] || ! sha256sum --status -c <<<"$sum  $deb"; then
      curl -fsS -o "$deb.part" "$url/$file" || die "cannot download $url/$file"
      sha256sum --status -c <<<"$sum  $deb.part" || die "$url/$file: SHA256 differs from $from's index"
      mv "$deb.part" "$deb"
    fi
    dpkg-deb -x "$deb" "$root"
    echo "overlay: $pkg $(sed -n 1p <<<"$meta") from $from" >>"$log"
  done
  rm -f "$index"
}

need_root_user() {
  [[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot, mount): run it with sudo"
}

create_one() {
  local suite=$1 dir="$CACHE/roots/$1"
  if [[ -f $dir/.ucp-root && "$(cat "$dir/.ucp-root")" == "$(recipe "$suite")" ]]; then
    echo "deepspeed_env: root $suite is ready ($dir)"
    return 0
  fi
  need_root_user
  command -v debootstrap >/dev/null || die "debootstrap is missing (tools/setup.sh installs it)"
  mkdir -p "$CACHE/roots" "$CACHE/debs/$suite"
  exec 9>"$CACHE/roots/.$suite.lock"
  flock 9
  if [[ -f $dir/.ucp-root && "$(cat "$dir/.ucp-root")" == "$(recipe "$suite")" ]]; then
    echo "deepspeed_env: root $suite is ready ($dir)"
    return 0
  fi
  local url tmp log start
  url=$(mirror)
  tmp="$CACHE/roots/.$suite.tmp"
  log="$CACHE/roots/$suite.debootstrap.log"
  rm -rf "$tmp"
  start=$SECONDS
  echo "deepspeed_env: creating the $suite root with debootstrap (5-10 minutes; log $log)"
  # The sid script serves the testing release too (Debian 12's debootstrap has
  # none named after it). --cache-dir keeps the .debs for the next rebuild.
  if ! debootstrap --variant=minbase --cache-dir="$CACHE/debs/$suite" \
       --include="$(packages "$suite")" "${DEBIAN_SUITE[$suite]:-$suite}" "$tmp" "$url" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die "debootstrap of $suite failed (log: $log)"
  fi
  rm -rf "$tmp/var/cache/apt/archives/"*.deb
  overlay "$suite" "$tmp" "$url" "$log"
  mkdir -p "$tmp/ucp"
  chroot "$tmp" /bin/sh -c "${ROOT_CHECK[$suite]}" >>"$log" 2>&1 ||
    die "the $suite root fails its check '${ROOT_CHECK[$suite]}' (log: $log)"
  recipe "$suite" >"$tmp/.ucp-root"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  echo "deepspeed_env: root $suite ready in $((SECONDS - start)) s: $(tail -n 1 "$log")"
}

root_dir() {
  local dir="$CACHE/roots/$1"
  [[ -f $dir/.ucp-root ]] || die "the $1 root is not built: run tools/deepspeed_env.sh create $1"
  echo "$dir"
}

# DeepSpeed source folder: a version of ../shared/deepspeed-src (extracted once
# into the cache, again if the archive changes) or a folder holding deepspeed/
# and version.txt.
deepspeed_dir() {
  local want=$1
  if [[ -d $want ]]; then
    [[ -d $want/deepspeed && -f $want/version.txt ]] || die "$want holds no deepspeed/ and version.txt"
    (cd "$want" && pwd)
    return 0
  fi
  local tarball
  tarball=$(ls "$SHARED"/deepspeed-src/deepspeed-"$want"*.tar.xz 2>/dev/null | head -n 1 || true)
  [[ -n $tarball ]] || die "no DeepSpeed '$want' in $SHARED/deepspeed-src (have: $(ls "$SHARED"/deepspeed-src 2>/dev/null | sed -n 's/^deepspeed-\(.*\)\.tar\.xz$/\1/p' | tr '\n' ' '))"
  local name dir stamp
  name=$(basename "$tarball" .tar.xz)
  dir="$CACHE/deepspeed/$name"
  stamp=$(stat -L -c '%s %Y' "$tarball")
  if [[ ! -f $dir/.ucp-extracted || "$(cat "$dir/.ucp-extracted")" != "$stamp" ]]; then
    mkdir -p "$CACHE/deepspeed"
    exec 8>"$CACHE/deepspeed/.$name.lock"
    flock 8  # another job may be extracting it
    if [[ ! -f $dir/.ucp-extracted || "$(cat "$dir/.ucp-extracted")" != "$stamp" ]]; then
      local tmp top
      tmp=$(mktemp -d "$CACHE/deepspeed/.$name.XXXXXX")
      tar xJf "$tarball" -C "$tmp"
      top=$(ls "$tmp")
      [[ -d $tmp/$top/deepspeed ]] || die "$tarball holds no $top/deepspeed"
      echo "$stamp" >"$tmp/$top/.ucp-extracted"
      rm -rf "$dir"
      mv "$tmp/$top" "$dir"
      rmdir "$tmp"
    fi
    exec 8>&-
  fi
  echo "$dir"
}

# A folder with deepspeed-<version>.dist-info/METADATA only (no code): what
# transformers and accelerate check for an installed DeepSpeed.
dist_info_shim() {
  local ds=$1 version
  version=$(tr -d '[:space:]' <"$ds/version.txt")
  local shim="$CACHE/dist-info/$version"
  if [[ ! -f $shim/deepspeed-$version.dist-info/METADATA ]]; then
    mkdir -p "$shim/deepspeed-$version.dist-info"
    printf 'Metadata-Version: 2.1\nName: deepspeed\nVersion: %s\n' "$version" \
      >"$shim/deepspeed-$version.dist-info/METADATA"
  fi
  echo "$shim"
}

run_in_root() {
  local suite=sid ds="" binds=() envs=() cwd=""
  while (($#)); do
    case $1 in
      --cwd=*) cwd=${1#--cwd=} ;;
      --root=*) suite=${1#--root=} ;;
      --env=*) envs+=("${1#--env=}") ;;
      --deepspeed=*) ds=${1#--deepspeed=} ;;
      --bind=*) binds+=("${1#--bind=}") ;;
      --) shift; break ;;
      *) die "run: unknown option $1" ;;
    esac
    shift
  done
  (($#)) || die "run: no command (… -- CMD ARGS)"
  need_root_user
  local root pythonpath="" dsdir=""
  root=$(root_dir "$suite")
  if [[ -n $ds ]]; then
    dsdir=$(deepspeed_dir "$ds")
    binds+=("$dsdir")
    local shim
    shim=$(dist_info_shim "$dsdir")
    binds+=("$shim")
    pythonpath="$dsdir:$shim"
  fi
  local b
  for b in "${binds[@]}"; do
    [[ -d $b ]] || die "run: --bind=$b is not a folder"
  done
  # The working directory: --cwd, else the DeepSpeed source folder (DeepSpeed
  # reads its version from ./version.txt when it is not installed: elsewhere
  # it calls itself 0.0.0 and writes that into every checkpoint), else /.
  [[ -n $cwd ]] || cwd=${dsdir:-/}
  # In a private mount namespace: everything mounted here disappears with it.
  exec unshare -m --propagation private bash -c '
    set -e
    root=$1; pythonpath=$2; dsdir=$3; shift 3
    for d in proc dev sys; do mount --rbind "/$d" "$root/$d"; done
    while [[ $1 != -- ]]; do
      mkdir -p "$root$1"; mount --bind "$1" "$root$1"; shift
    done
    shift
    exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
      DS_ACCELERATOR=cpu DS_BUILD_OPS=0 OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo PYTHONHASHSEED=0 \
      PYTHONPATH="$pythonpath" "$@"
  ' ucp-root "$root" "$pythonpath" "$dsdir" "${binds[@]}" -- \
    bash -c 'cd "$0" || exit 2; exec "$@"' "$cwd" env "${envs[@]}" "$@"
}

status() {
  echo "cache: $CACHE"
  local s
  for s in "${SUITES[@]}"; do
    if [[ -f $CACHE/roots/$s/.ucp-root ]]; then
      echo "root $s: ready ($(du -sh "$CACHE/roots/$s" 2>/dev/null | cut -f1))"
    else
      echo "root $s: not built"
    fi
  done
  ls "$CACHE/deepspeed" 2>/dev/null | sed 's/^/deepspeed source: /' || true
}

cmd=${1:-}
shift || true
case $cmd in
  create)
    want=("$@")
    if ((${#want[@]} == 0)) || [[ ${want[0]} == all ]]; then want=("${SUITES[@]}"); fi
    for s in "${want[@]}"; do
      [[ -n ${ROOT_CHECK[$s]+x} ]] || die "unknown suite '$s' (${SUITES[*]} or all)"
    done
    # All at once: debootstrap waits on the network and the disk more than the CPU.
    pids=()
    for s in "${want[@]}"; do create_one "$s" & pids+=($!); done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    exit $rc
    ;;
  root) root_dir "${1:?suite}" ;;
  deepspeed) deepspeed_dir "${1:?version or folder}" ;;
  run) run_in_root "$@" ;;
  status) status ;;
  shared)
    [[ -d $SHARED/deepspeed-src ]] || die "no DeepSpeed sources in $SHARED/deepspeed-src (set UCP_SHARED_DIR)"
    echo "$SHARED"
    ;;
  mirror) mirror ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; [[ -z $cmd ]] || exit 2 ;;
esac
