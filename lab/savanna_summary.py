#!/usr/bin/env python3
# One line per case directory (under the given roots) from its check.json and the flags it ran with.
import glob
import json
import os
import re
import sys

for root in sys.argv[1:]:
    for cj in sorted(glob.glob(os.path.join(root, "*", "check.json"))):
        c = os.path.dirname(cj)
        r = json.load(open(cj))
        b = r["b_max_abs_diff"]
        print(f"{os.path.basename(c):14s} tensors {r['tensors_equal']:3d}/{r['tensors_compared']:3d} "
              f"buffers {r['buffers_equal']}/{r['buffers']} step {r['steps_source']}->{r['steps_target']} "
              f"(a) {r['a_universal_vs_plain_equal']}/{r['a_records']} "
              f"(b) max|d| {b:.3g} tp_changed={r['tp_changed']} "
              f"safe_get_fp32 {r.get('safe_get_full_fp32_param_equal', '?')}/{r['params']} "
              f"{'OK' if r['ok'] else 'PROBLEMS: ' + '; '.join(r['problems'])}")
