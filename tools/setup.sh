#!/usr/bin/env bash
# Installs what ucp needs to build and test, from Debian 12's archive only.
# Idempotent: packages already present are skipped, Debian roots already built
# are kept; safe to run twice.
#
#   tools/setup.sh                    packages, Debian sources, and every Debian root
#   tools/setup.sh --roots=bullseye   only these roots (space- or comma-separated; none: no root)
#                                     .ci/run builds the other roots while Bazel compiles
set -euo pipefail

ROOTS=all
for arg in "$@"; do
  case $arg in
    --roots=*) ROOTS=${arg#--roots=}; ROOTS=${ROOTS//,/ } ;;
    *) echo "setup: unknown argument '$arg' (--roots=SUITE,...|all|none)" >&2; exit 2 ;;
  esac
done

PACKAGES=(
  bazel-bootstrap bazel-platforms          # Bazel 4.2.3 (WORKSPACE mode) + platforms
  g++ libtorch-dev libabsl-dev librapidcheck-dev
  libprotobuf-dev protobuf-compiler googletest libgtest-dev libgmock-dev
  python3-torch python3-numpy              # /usr/bin/python3 + torch 1.13 for interop tests
  pybind11-dev python3-dev python3-venv python3-pip   # `import ucp` (python/): extension, wheel, venv test
  clang libclang-rt-14-dev                 # libFuzzer + ASan/UBSan (tools/fuzz.sh)
  time unzip                               # /usr/bin/time -v for bench/, unzip for tests
  debootstrap util-linux xz-utils curl     # Debian roots for the real-DeepSpeed tests (tools/deepspeed_env.sh)
  openmpi-bin libopenmpi-dev               # mpirun -np N ucp ... (exec/, exec:mpi_test)
  libxxhash-dev                            # XXH3-128 manifest digests (base:digest)
  pybind11-dev python3-dev python3-venv python3-pip  # import ucp (python/), wheel test in a venv
  dpkg-dev binutils                        # Debian's abseil/protobuf sources (tools/debian_sources.sh), readelf/objdump
  python3-protobuf                         # realds/ driver (textproto cases, goldens)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: packages done"
fi

cd "$(dirname "$0")/.."
# Debian's sources of the archive members a shared object cannot hold (the
# portable artifacts, README "Install"), and the Debian roots: trixie and sid
# run real DeepSpeed (realds/), bullseye's glibc is linked against; each runs
# the binary and a wheel in the tests. Built once (debootstrap, 11-25 minutes,
# all at once), idempotent, cached outside the clone ($UCP_CACHE_DIR).
$SUDO tools/debian_sources.sh fetch
if [[ $ROOTS != none ]]; then
  # shellcheck disable=SC2086  # a list of suites
  $SUDO tools/deepspeed_env.sh create $ROOTS
fi
echo "setup: done"
