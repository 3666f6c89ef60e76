#!/bin/bash
# A Hugging Face folder into DeepSpeed (issue 26 part 3), proven with the real clients in the Debian
# unstable root (torch 2.14, transformers 5.12, DeepSpeed 0.19.5; CPU, gloo; fp32;
# hf_import_check.py says what each command runs):
#   1. transformers builds a tiny GPTNeoXForCausalLM from its config (seeded random init) and
#      save_pretrained's it, as one model.safetensors and as shards with their index;
#   2. ucp reshard --preset=gpt-neox imports it at tp 1 pp 1, tp 1 pp 2, tp 2 pp 1, tp 2 pp 2 (and the
#      sharded folder at tp 2 pp 2);
#   3. DeepSpeed loads each with load_checkpoint(load_module_only=True) into a GPT-NeoX PipelineModule
#      with Megatron tp: every weight equals its slice of the HF tensor bitwise; the logits equal
#      transformers' bitwise at tp 1, within 1e-5 at tp 2 (the row-parallel partial sums are added in
#      another order by the all-reduce);
#   4. the next step equals bitwise the step of a fresh engine given the HF weights directly (same
#      topology, every param after the step);
#   5. negative control: a folder with one weight changed is reported as differing.
# The same for a LlamaForCausalLM from a LlamaConfig (GQA 4 query / 2 kv heads, SwiGLU, RMSNorm),
# imported with --preset=megatron-deepspeed into Megatron-DeepSpeed's GPTModelPipe layout
# (query_key_value fused grouped per kv head, dense_h_to_4h [gate; up] as 2 sub-params): tp 1 pp 1
# (logits bitwise), tp 1 pp 2, tp 2 pp 1, tp 2 pp 2 (and from the shards), the step at tp 2 pp 2; and
# with tie_word_embeddings (GPTModelPipe's TiedLayerSpec 'embed' at the embedding and the head) at tp 1
# pp 1 and tp 2 pp 2. A MistralForCausalLM likewise (tp 1 pp 1, tp 2 pp 2). The way back: `ucp export
# --names=hf` of imports (GPT-NeoX tp 1 pp 2 and tp 2 pp 2, Llama tp 2 pp 1 and tp 2 pp 2, tied Llama and
# Mistral tp 2 pp 2) loaded by transformers' from_pretrained, every tensor and the logits bitwise (GPT-NeoX's
# parallel-residual row-parallel biases at tp 2: doubled, as that DeepSpeed model uses them). A
# Qwen2ForCausalLM is refused, naming why.
# Args: UCP CHECKER MPU
set -u
UCP=$(pwd)/$1
ENV=$(pwd)/tools/deepspeed_env.sh
W=$TEST_TMPDIR
# The runfiles are symlinks out of the root's reach: run copies from the bound folder.
cp "$2" "$W/hf_import_check.py"
cp "$3" "$W/mpu.py"
fail=0
run() {  # hf_import_check.py ARGS... (FAMILY=llama: --family llama): its JSON line on stdout, the rest in $W/log
  "$ENV" run --root=sid --deepspeed=0.19.5 --bind="$W" --cwd="$W" -- python3 "$W/hf_import_check.py" "$@" --family "${FAMILY:-neox}" ${TIED:+--tied} > "$W/out" 2>> "$W/log"
  local rc=$?
  grep '^{' "$W/out" | tail -1
  [[ $rc == 0 ]] || { echo "  (exit $rc; last lines:)"; grep -v -e gloo -e Warning "$W/out" "$W/log" | tail -5; }
  return $rc
}
ucp() { "$UCP" "$@" >> "$W/ucp.log" 2>&1 || { echo "FAIL ucp $*"; tail -5 "$W/ucp.log"; fail=1; return 1; }; }
judge() {  # NAME JSON-LINE TOLERANCE
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
name, r, tol = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
ok = r["compared"] > 0 and r["differ"] == [] and r["logits_max_diff"] <= tol and (tol > 0 or r["logits_bitwise"])
print(f"{'PASS' if ok else 'FAIL'} {name}: {r['compared']} weights bitwise (differ {r['differ'][:4]}), logits max |diff| "
      f"{r['logits_max_diff']:.3g} (bitwise {r['logits_bitwise']}, allowed {tol:g})")
sys.exit(0 if ok else 1)
PY
}
same_step() {  # NAME A B WORLD: every param after the step, per rank, bitwise
  "$ENV" run --root=sid --deepspeed=0.19.5 --bind="$W" -- python3 - "$@" <<'PY'
import sys, torch
name, a, b, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cnt, bad = 0, []
for r in range(n):
    x, y = torch.load(f"{a}.rank{r}"), torch.load(f"{b}.rank{r}")
    bad += [f"rank{r}:{k} (only one side)" for k in set(x) ^ set(y)]
    for k, v in y.items():
        cnt += 1
        if k not in x or x[k].shape != v.shape or not torch.equal(x[k].reshape(-1).view(torch.int32), v.reshape(-1).view(torch.int32)):
            bad.append(f"rank{r}:{k}")
ok = cnt > 0 and not bad
print(f"{'PASS' if ok else 'FAIL'} {name}: {cnt} params after one step, {len(bad)} differ {bad[:4]}")
sys.exit(0 if ok else 1)
PY
}

run save --out "$W" || { echo "FAIL save"; exit 1; }
for t in "1 1 hf 0" "1 2 hf 0" "2 1 hf 1e-5" "2 2 hf 1e-5" "2 2 hf_sharded 1e-5"; do
  set -- $t
  tag=$3-tp$1-pp$2
  ucp reshard --input_folder="$W/$3" --output_folder="$W/$tag/global_step0" --tp=$1 --pp=$2 --dp=1 --preset=gpt-neox || continue
  line=$(run load --ckpt "$W/$tag" --tp $1 --pp $2 --ref "$W/ref.pt" --out "$W/$tag.after") || { echo "FAIL load $tag"; fail=1; continue; }
  judge "$3 -> ucp tp $1 pp $2 -> DeepSpeed" "$line" "$4" || fail=1
done
# The next step against a fresh optimizer over the same weights.
for t in "1 1" "2 2"; do
  set -- $t
  line=$(run load --init hf --tp $1 --pp $2 --ref "$W/ref.pt" --out "$W/fresh-tp$1-pp$2.after") || { echo "FAIL fresh tp $1 pp $2"; fail=1; continue; }
  same_step "tp $1 pp $2: the step after the import = a fresh optimizer's step" "$W/hf-tp$1-pp$2.after" "$W/fresh-tp$1-pp$2.after" $(($1 * $2)) || fail=1
done
# Llama (Megatron-DeepSpeed's layout), in $W/llama.
L=$W/llama
mkdir -p "$L"
if FAMILY=llama run save --out "$L" > /dev/null; then
  for t in "1 1 hf 0" "1 2 hf 0" "2 1 hf 1e-5" "2 2 hf 1e-5" "2 2 hf_sharded 1e-5"; do
    set -- $t
    tag=$3-tp$1-pp$2
    ucp reshard --input_folder="$L/$3" --output_folder="$L/$tag/global_step0" --tp=$1 --pp=$2 --dp=1 --preset=megatron-deepspeed || continue
    line=$(FAMILY=llama run load --ckpt "$L/$tag" --tp $1 --pp $2 --ref "$L/ref.pt" --out "$L/$tag.after") || { echo "FAIL load llama $tag"; fail=1; continue; }
    judge "llama $3 -> ucp tp $1 pp $2 -> DeepSpeed" "$line" "$4" || fail=1
  done
  if line=$(FAMILY=llama run load --init hf --tp 2 --pp 2 --ref "$L/ref.pt" --out "$L/fresh-tp2-pp2.after"); then
    same_step "llama tp 2 pp 2: the step after the import = a fresh optimizer's step" "$L/hf-tp2-pp2.after" "$L/fresh-tp2-pp2.after" 4 || fail=1
  else
    echo "FAIL llama fresh tp 2 pp 2"; fail=1
  fi
else
  echo "FAIL llama save"; fail=1
fi
# Tied Llama embeddings, in $W/llama_tied.
T=$W/llama_tied
mkdir -p "$T"
if FAMILY=llama TIED=1 run save --out "$T" > /dev/null; then
  for t in "1 1 0" "2 2 1e-5"; do
    set -- $t
    ucp reshard --input_folder="$T/hf" --output_folder="$T/tp$1-pp$2/global_step0" --tp=$1 --pp=$2 --dp=1 --preset=megatron-deepspeed || continue
    line=$(FAMILY=llama TIED=1 run load --ckpt "$T/tp$1-pp$2" --tp $1 --pp $2 --ref "$T/ref.pt" --out "$T/tp$1-pp$2.after") || { echo "FAIL load tied llama tp $1 pp $2"; fail=1; continue; }
    judge "tied llama -> ucp tp $1 pp $2 -> DeepSpeed" "$line" "$3" || fail=1
  done
else
  echo "FAIL tied llama save"; fail=1
fi
# The way back: `ucp export --names=hf` of an import (its config.json is kept beside the tags), loaded by
# transformers' from_pretrained: every tensor and the logits bitwise. GPT-NeoX with use_parallel_residual at
# tp 2: the import holds the row-parallel biases whole on each rank, which that model adds per rank, and the
# export writes what that model is: those 6 biases doubled, every other tensor bitwise.
back() {  # NAME CKPT-ROOT REF [EXPECTED-DIFFER-REGEX]: FAMILY / TIED from the environment
  ucp export --input_folder="$2" --output_folder="$2.hf" --names=hf || return 1
  local line  # the JSON line (run adds the last log lines when reload exits 1: some tensor differs)
  line=$(run reload --hf "$2.hf" --ref "$3" | head -1)
  if [[ -z ${4:-} ]]; then
    judge "$1" "$line" 0
    return
  fi
  /usr/bin/python3 - "$1" "$line" "$4" <<'PY'
import json, re, sys
name, r, pat = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
ok = r["compared"] > 0 and len(r["differ"]) == 6 and all(re.search(pat, k) for k in r["differ"])
print(f"{'PASS' if ok else 'FAIL'} {name}: {r['compared']} tensors, differing {r['differ']} (expected 6 matching {pat})")
sys.exit(0 if ok else 1)
PY
}
back "neox tp 1 pp 2 -> ucp export --names=hf -> transformers" "$W/hf-tp1-pp2" "$W/ref.pt" || fail=1
back "neox (parallel residual) tp 2 pp 2 -> ucp export --names=hf -> transformers" "$W/hf-tp2-pp2" "$W/ref.pt" \
  'layers\.[0-2]\.(attention\.dense|mlp\.dense_4h_to_h)\.bias$' || fail=1
FAMILY=llama back "llama tp 2 pp 2 -> ucp export --names=hf -> transformers" "$L/hf-tp2-pp2" "$L/ref.pt" || fail=1
FAMILY=llama back "llama tp 2 pp 1 -> ucp export --names=hf -> transformers" "$L/hf-tp2-pp1" "$L/ref.pt" || fail=1
FAMILY=llama TIED=1 back "tied llama tp 2 pp 2 -> ucp export --names=hf -> transformers" "$T/tp2-pp2" "$T/ref.pt" || fail=1
# MistralForCausalLM (Llama's tensors; the preset found from config.json), in $W/mistral: DeepSpeed loads the
# import, and the export gives transformers back the Mistral.
M=$W/mistral
mkdir -p "$M"
if FAMILY=mistral run save --out "$M" > /dev/null; then
  for t in "1 1 0" "2 2 1e-5"; do
    set -- $t
    ucp reshard --input_folder="$M/hf" --output_folder="$M/tp$1-pp$2/global_step0" --tp=$1 --pp=$2 --dp=1 || continue
    line=$(FAMILY=mistral run load --ckpt "$M/tp$1-pp$2" --tp $1 --pp $2 --ref "$M/ref.pt" --out "$M/tp$1-pp$2.after") || { echo "FAIL load mistral tp $1 pp $2"; fail=1; continue; }
    judge "mistral -> ucp tp $1 pp $2 -> DeepSpeed" "$line" "$3" || fail=1
  done
  FAMILY=mistral back "mistral tp 2 pp 2 -> ucp export --names=hf -> transformers" "$M/tp2-pp2" "$M/ref.pt" || fail=1
else
  echo "FAIL mistral save"; fail=1
fi
# Qwen2ForCausalLM (q/k/v biases, no o_proj / MLP biases): refused, saying why, nothing written.
Q=$W/qwen2
mkdir -p "$Q"
if FAMILY=qwen2 run save --out "$Q" > /dev/null; then
  if "$UCP" reshard --input_folder="$Q/hf" --output_folder="$Q/out/global_step0" --tp=2 --dp=1 > "$Q/ucp.log" 2>&1; then
    echo "FAIL qwen2: imported"; fail=1
  elif grep -q "add_bias_linear" "$Q/ucp.log" && [[ ! -e $Q/out ]]; then
    echo "PASS qwen2 refused: $(grep -o 'Qwen2ForCausalLM is not imported[^;]*' "$Q/ucp.log" | head -1)"
  else
    echo "FAIL qwen2: refused without the reason, or wrote output:"; tail -2 "$Q/ucp.log"; fail=1
  fi
else
  echo "FAIL qwen2 save"; fail=1
fi
# Negative control: one element of one weight changed in the HF folder; the load must report it.
"$ENV" run --root=sid --deepspeed=0.19.5 --bind="$W" -- python3 - "$W" <<'PY' >> "$W/log" 2>&1
import sys, shutil
from safetensors.torch import load_file, save_file
d = sys.argv[1]
shutil.copytree(f"{d}/hf", f"{d}/hf_bad")
t = load_file(f"{d}/hf_bad/model.safetensors")
t["gpt_neox.layers.1.mlp.dense_4h_to_h.weight"][3, 5] += 1.0
save_file(t, f"{d}/hf_bad/model.safetensors", metadata={"format": "pt"})
PY
if ucp reshard --input_folder="$W/hf_bad" --output_folder="$W/bad/global_step0" --tp=2 --pp=2 --dp=1 --preset=gpt-neox; then
  if line=$(run load --ckpt "$W/bad" --tp 2 --pp 2 --ref "$W/ref.pt" --out "$W/bad.after"); then
    echo "FAIL negative control: a changed weight was not reported: $line"; fail=1
  else
    echo "PASS negative control: the changed weight is reported"
  fi
fi
exit $fail
