#!/bin/bash
# A training state moved between FSDP2 (PyTorch DCP) and DeepSpeed by ucp, resumed by the real
# clients in the Debian unstable root (torch 2.14, transformers, DeepSpeed 0.19.5; CPU, gloo;
# stacks_check.py says what each step runs). Issue 26:
#   1. FSDP2 at world 2 saves a DCP folder and continues (the reference continuation);
#   2. ucp reshard DCP -> ZeRO-1 dp 2: DeepSpeed loads it, its full state equals FSDP2's bitwise,
#      its next loss and the loss after one more step equal FSDP2's continuation (within 1e-6);
#   3. ucp reshard DCP -> ZeRO-3 dp 3: DeepSpeed at 3 resumes as FSDP2 at 3 does from the same DCP;
#   4. ucp convert DCP -> universal: DeepSpeed's load_universal at dp 2, as in 2;
#   5. DeepSpeed ZeRO-1 at 2 saves and continues; ucp convert --to=dcp; FSDP2 at 2 loads it: state
#      bitwise equal to DeepSpeed's, losses equal to DeepSpeed's continuation (within 1e-6); and
#      again with --names=hf;
#   6. negative control: a reference with one element changed is reported as differing;
#   7. FSDP2's weights alone (a weights-only DCP) -> ucp reshard -> ZeRO-1 dp 2: DeepSpeed loads it
#      with load_module_only, its weights equal FSDP2's bitwise, its losses (next, and after a step of
#      its fresh AdamW) equal one plain process's with those weights and a fresh AdamW (within 1e-6);
#      FSDP2 loads the same weights (bitwise) from the folder itself.
# Args: UCP CHECKER
set -u
UCP=$(pwd)/$1; CHECK_SRC=$(pwd)/$2
UCP_SHARED_DIR=$(tools/deepspeed_env.sh shared) || exit 1
export UCP_SHARED_DIR
ENV=$(pwd)/tools/deepspeed_env.sh
W=$TEST_TMPDIR
# The runfiles are symlinks out of the root's reach: run a copy from the bound folder.
cp "$CHECK_SRC" "$W/stacks_check.py"
fail=0
run() {  # stacks_check.py ARGS...: its JSON line on stdout, the rest in $W/log
  "$ENV" run --root=sid --deepspeed=0.19.5 --bind="$W" -- python3 "$W/stacks_check.py" "$@" > "$W/out" 2>> "$W/log"
  local rc=$?
  grep '^{' "$W/out" | tail -1
  [[ $rc == 0 ]] || { echo "  (exit $rc; last lines:)"; grep -v -e gloo -e Warning "$W/out" "$W/log" | tail -5; }
  return $rc
}
ucp() { "$UCP" "$@" >> "$W/ucp.log" 2>&1 || { echo "FAIL ucp $*"; tail -5 "$W/ucp.log"; fail=1; return 1; }; }
same_losses() {  # NAME GOT.json WANT.json: next and after per rank within 1e-6
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
name, got, want = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
d = max(abs(a - b) for k in ("next", "after") for a, b in zip(got[k], want[k]))
n = len(got["next"]) == len(want["next"])
ok = n and d <= 1e-6 and got.get("differ", []) == [] and got.get("compared", 1) > 0
print(f"{'PASS' if ok else 'FAIL'} {name}: state {got.get('compared', '-')} entries, differ {got.get('differ', [])}; "
      f"losses next {got['next']} after {got['after']} vs {want['next']} {want['after']}: max |diff| {d:.3g}")
sys.exit(0 if ok else 1)
PY
}
step() { if "$@"; then :; else fail=1; fi; }

# 1. FSDP2 saves.
run fsdp2-save --out "$W/f" --world 2 || { echo "FAIL fsdp2-save"; exit 1; }
# 2. DCP -> ZeRO-1 dp 2 -> DeepSpeed.
ucp reshard --input_folder="$W/f/dcp" --output_folder="$W/z1/global_step2" --dp=2 --zero_stage=1 &&
  run ds-resume --ckpt "$W/z1" --world 2 --stage 1 --ref "$W/f/ref.pt" --out "$W/z1.json" &&
  step same_losses "DCP -> ZeRO-1 dp 2, DeepSpeed resumes" "$W/z1.json" "$W/f/cont.json" || fail=1
# 3. DCP -> ZeRO-3 dp 3 -> DeepSpeed at 3, against FSDP2 resuming at 3.
ucp reshard --input_folder="$W/f/dcp" --output_folder="$W/z3/global_step2" --dp=3 --zero_stage=3 &&
  run ds-resume --ckpt "$W/z3" --world 3 --stage 3 --ref "$W/f/ref.pt" --out "$W/z3.json" &&
  run fsdp2-resume --ckpt "$W/f/dcp" --world 3 --ref "$W/f/ref.pt" --out "$W/f3.json" &&
  step same_losses "DCP -> ZeRO-3 dp 3, DeepSpeed resumes as FSDP2 at 3" "$W/z3.json" "$W/f3.json" || fail=1
# 4. DCP -> universal -> load_universal at dp 2.
ucp convert --input_folder="$W/f/dcp" --output_folder="$W/u/global_step2_universal" &&
  echo global_step2_universal > "$W/u/latest_universal" &&
  run ds-resume --ckpt "$W/u" --world 2 --stage 1 --universal --ref "$W/f/ref.pt" --out "$W/u.json" &&
  step same_losses "DCP -> universal, DeepSpeed load_universal at dp 2" "$W/u.json" "$W/f/cont.json" || fail=1
# 5. DeepSpeed ZeRO-1 -> DCP -> FSDP2.
run ds-save --out "$W/d" --world 2 --stage 1 &&
  ucp convert --input_folder="$W/d/ds" --output_folder="$W/d/dcp" --to=dcp &&
  run fsdp2-resume --ckpt "$W/d/dcp" --world 2 --ref "$W/d/ref.pt" --out "$W/d.json" &&
  step same_losses "DeepSpeed ZeRO-1 -> DCP, FSDP2 resumes" "$W/d.json" "$W/d/cont.json" || fail=1
# 5b. The same with Hugging Face names (--names=hf: the hf-llama preset, the model's own names here,
#     its config.json beside the tags), which the FSDP2 LlamaForCausalLM loads the same way.
ucp convert --input_folder="$W/d/ds" --output_folder="$W/d/dcp_hf" --to=dcp --names=hf &&
  run fsdp2-resume --ckpt "$W/d/dcp_hf" --world 2 --ref "$W/d/ref.pt" --out "$W/d_hf.json" &&
  step same_losses "DeepSpeed ZeRO-1 -> DCP --names=hf, FSDP2 resumes" "$W/d_hf.json" "$W/d/cont.json" || fail=1
# 6. Negative control: one exp_avg element of the reference changed.
"$ENV" run --root=sid --bind="$W" -- python3 -c "
import torch, sys
r = torch.load('$W/f/ref.pt', weights_only=False)
k = sorted(k for k in r if k.endswith('.exp_avg'))[0]
r[k].view(-1)[0] += 1.0
torch.save(r, '$W/bad_ref.pt')
print(k)" > "$W/bad_key" 2>> "$W/log"
if run fsdp2-resume --ckpt "$W/f/dcp" --world 2 --ref "$W/bad_ref.pt" --out "$W/bad.json" > "$W/bad.out"; then
  echo "FAIL negative control: a changed reference passed"; fail=1
elif grep -q "\"differ\": \[\"$(cat "$W/bad_key")\"\]" "$W/bad.out"; then
  echo "PASS negative control: $(cat "$W/bad_key") reported as differing"
else
  echo "FAIL negative control: not reported as expected:"; cat "$W/bad.out"; fail=1
fi
# 7. A weights-only DCP -> ZeRO-1 dp 2 -> DeepSpeed load_module_only, against one plain process.
#    (FSDP2 itself, loading the folder's weights into its sharded model with a fresh AdamW, gives
#    the same next losses and after one step 4.939 / 4.893 where the plain process and DeepSpeed give
#    4.959 / 4.927 (measured): its fresh step is not the reference here.)
ucp reshard --input_folder="$W/f/dcp_weights" --output_folder="$W/zw/global_step0" --dp=2 --zero_stage=1 &&
  run ds-resume --ckpt "$W/zw" --world 2 --stage 1 --weights_only --ref "$W/f/ref.pt" --out "$W/zw.json" &&
  run plain-fresh --world 2 --ref "$W/f/ref.pt" --out "$W/pw.json" &&
  step same_losses "weights-only DCP -> ZeRO-1 dp 2, DeepSpeed load_module_only as one process with a fresh AdamW" \
    "$W/zw.json" "$W/pw.json" || fail=1
run fsdp2-resume --ckpt "$W/f/dcp_weights" --world 2 --weights_only --ref "$W/f/ref.pt" --out "$W/fw.json" > "$W/fw.out" &&
  grep -q '"differ": \[\]' "$W/fw.out" && echo "PASS FSDP2 loads the weights-only DCP: weights bitwise" ||
  { echo "FAIL FSDP2 load of the weights-only DCP"; cat "$W/fw.out"; fail=1; }
exit $fail
