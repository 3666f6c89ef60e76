"""Checks a `ucp export --names=hf` LlamaForCausalLM export of a Megatron-DeepSpeed
checkpoint written by make_ds_checkpoint.py: rebuilds every fused tensor from
the split Hugging Face tensors with Megatron-DeepSpeed's own layout, and
compares with the writer's model (expected.pt) bitwise.

usage: check_hf_llama.py EXPORT_DIR GENERATOR_ROOT SPEC_JSON LAYOUT TP
  LAYOUT grouped: query_key_value rows [nkv, q heads per kv head + 2, d]
                  (hf2megads_weight_converter.py's; tp-invariant)
         block:   per tp rank [Q_r; K_r; V_r] (Megatron-DeepSpeed 676a482c+)
  swiglu dense_h_to_4h: the model's full tensor is [gate; up] (its tp split
  takes each half's rows per rank, i.e. [gate_r; up_r] on rank r).
Also: config.json values against the spec's args, tied embeddings.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_export  # noqa: E402
import torch  # noqa: E402


def main(argv):
    out, root, spec_path, layout, tp = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    spec = json.load(open(spec_path))
    args = spec["args"]
    expected = torch.load(os.path.join(root, "expected.pt"))
    hf, _ = check_export.read_safetensors(os.path.join(out, "model.safetensors"))
    problems = list(check_export.PROBLEMS)
    cfg = json.load(open(os.path.join(out, "config.json")))
    nq, nkv = args["num_attention_heads"], args["num_key_value_heads"]
    d, h = args["kv_channels"], args["hidden_size"]
    for key, want in [("num_attention_heads", nq), ("num_key_value_heads", nkv), ("head_dim", d),
                      ("hidden_size", h), ("intermediate_size", args["ffn_hidden_size"]),
                      ("rms_norm_eps", args["layernorm_epsilon"]), ("rope_theta", args["rope_theta"]),
                      ("max_position_embeddings", args["max_position_embeddings"]),
                      ("architectures", ["LlamaForCausalLM"]), ("hidden_act", "silu"),
                      ("tie_word_embeddings", True), ("torch_dtype", "float32")]:
        if cfg.get(key) != want:
            problems.append(f"config.json {key} = {cfg.get(key)!r}, expected {want!r}")
    layers = [i for i, l in enumerate(spec["layers"]) if "module" in l and
              any(t["name"].startswith("self_attention") for t in l["module"])]
    if cfg.get("num_hidden_layers") != len(layers):
        problems.append(f"num_hidden_layers {cfg.get('num_hidden_layers')}, expected {len(layers)}")
    g = nq // nkv
    for i, idx in enumerate(layers):
        p = f"model.layers.{i}."
        q, k, v = (hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        if layout == "grouped":
            fused = torch.cat([q.view(nkv, g * d, h), k.view(nkv, d, h), v.view(nkv, d, h)], dim=1).reshape(-1, h)
        else:
            fused = torch.cat([torch.cat([a, b, c]) for a, b, c in zip(q.chunk(tp), k.chunk(tp), v.chunk(tp))])
        pairs = [(fused, f"{idx}.self_attention.query_key_value.weight"),
                 (torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]]),
                  f"{idx}.mlp.dense_h_to_4h.weight"),
                 (hf[p + "self_attn.o_proj.weight"], f"{idx}.self_attention.dense.weight"),
                 (hf[p + "mlp.down_proj.weight"], f"{idx}.mlp.dense_4h_to_h.weight"),
                 (hf[p + "input_layernorm.weight"], f"{idx}.input_layernorm.weight"),
                 (hf[p + "post_attention_layernorm.weight"], f"{idx}.post_attention_layernorm.weight")]
        for got, name in pairs:
            if not check_export.same_bits(got, expected[name]["fp32"].detach()):
                problems.append(f"{name} rebuilt from the HF tensors differs from the original")
    norm_layer = max(i for i, l in enumerate(spec["layers"]) if "module" in l)
    for got, name in [(hf["model.norm.weight"], f"{norm_layer}.weight"),
                      (hf["model.embed_tokens.weight"], "tied_modules.embed.word_embeddings.weight")]:
        if not check_export.same_bits(got, expected[name]["fp32"].detach()):
            problems.append(f"{name} differs")
    if "lm_head.weight" in hf:
        problems.append("lm_head.weight written although tied")
    for pr in problems:
        print(pr)
    print(f"checked {len(hf)} HF tensors: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
