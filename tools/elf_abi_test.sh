#!/usr/bin/env bash
# Runs tools/elf_abi_test.py with Debian's /usr/bin/python3 (binutils' readelf and objdump are the oracle).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/elf_abi_test.py" "$@" -v 2>&1
