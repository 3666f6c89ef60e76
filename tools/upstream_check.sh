#!/usr/bin/env bash
# Golden regression for DeepSpeed patches: runs DeepSpeed's own checkpoint
# routes (ds_to_universal.py + load_universal, zero_to_fp32, plain loads) from
# the tree given on the golden cases of testdata/upstream/, and prints one table:
# case, route, PASS / FAIL, and FIXED / REGRESSED / unchanged against the
# recorded baseline of a release. Exit status 1 on any REGRESSED.
#
#   tools/upstream_check.sh --deepspeed_src=DIR [--baseline=VERSION|none] [--root=trixie|sid]
#                           [--cases=NAME,...] [--record_baseline] [--keep]
#
# DIR is a DeepSpeed checkout (deepspeed/ and version.txt), or a version of
# ../shared/deepspeed-src (0.14.4 ... master). Needs the Debian roots
# (tools/setup.sh, or tools/deepspeed_env.sh create) and root. See
# realds/README.md, "Upstream check".
set -euo pipefail
exec /usr/bin/python3 "$(cd "$(dirname "$0")/.." && pwd)/realds/upstream_check.py" "$@"
