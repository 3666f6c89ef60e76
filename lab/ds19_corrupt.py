#!/usr/bin/env python3
"""Lab script (not run by CI): damage a ZeRO-3 checkpoint on purpose, to show ds19_compare.py catches it.

usage: python3 ds19_corrupt.py TAG_FOLDER
In rank 0's optim_states file: the `step` of sub-group 0 becomes step+1, and the two halves of
sub-group 0's exp_avg are swapped (a misplaced fragment). The file is rewritten in place (a copy).
"""
import glob
import sys

import torch

f = sorted(glob.glob(f'{sys.argv[1]}/*zero_pp_rank_0_mp_rank_00_optim_states.pt'))[0]
sd = torch.load(f, weights_only=False)
osd = sd['optimizer_state_dict']['optimizer_state_dict']
st = osd['state'][0]
st['step'] = st['step'].clone() + 1
ea = st['exp_avg']
h = ea.numel() // 2
st['exp_avg'] = torch.cat([ea[h:2 * h], ea[:h], ea[2 * h:]])
torch.save(sd, f)
print(f'{f}: sub-group 0 step -> {float(st["step"])}, exp_avg halves of {h} elements swapped')
