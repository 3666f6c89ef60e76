#include "conformance/neox_model.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace ucp::conformance {
namespace {

void Add(ModelSpec& spec, int layer, const std::string& local, std::vector<int64_t> shape, MergeKind kind,
         int group) {
  ModelParam* p = spec.add_param();
  p->set_name(absl::StrCat(layer, ".", local));
  p->set_local_name(local);
  p->set_layer(layer);
  for (int64_t d : shape) p->add_shape(d);
  p->mutable_rule()->set_kind(kind);
  p->set_group(group);
  p->set_role("trainable");
}

}  // namespace

ModelSpec NeoxSpec(const NeoxShape& s) {
  ModelSpec spec;
  spec.set_style("gpt-neox");
  spec.set_pipeline(true);
  spec.set_lp_dtype(s.lp_dtype);
  spec.set_original_vocab_size(s.vocab);
  spec.set_make_vocab_size_divisible_by(s.make_vocab_size_divisible_by);
  spec.set_num_groups(2);
  spec.set_rules_source(s.rules_source);
  spec.set_preset("gpt-neox");
  spec.set_hidden_size(s.hidden);
  const int64_t h = s.hidden;
  Add(spec, 0, "word_embeddings.weight", {s.vocab, h}, VOCAB, 0);
  spec.add_module_layers(0);
  spec.add_module_layers(1);
  for (int i = 0; i < s.layers; ++i) {
    const int l = 2 + i;
    spec.add_module_layers(l);
    Add(spec, l, "input_layernorm.scale", {h}, REPLICATED, 1);
    Add(spec, l, "attention.query_key_value.weight", {3 * s.attention, h}, COLUMN, 0);
    Add(spec, l, "attention.query_key_value.bias", {3 * s.attention}, COLUMN, 1);
    Add(spec, l, "attention.dense.weight", {h, s.attention}, ROW, 0);
    Add(spec, l, "attention.dense.bias", {h}, REPLICATED, 1);
    Add(spec, l, "post_attention_layernorm.scale", {h}, REPLICATED, 1);
    Add(spec, l, "mlp.dense_h_to_4h.weight", {s.ffn, h}, COLUMN, 0);
    Add(spec, l, "mlp.dense_h_to_4h.bias", {s.ffn}, COLUMN, 1);
    Add(spec, l, "mlp.dense_4h_to_h.weight", {h, s.ffn}, ROW, 0);
    Add(spec, l, "mlp.dense_4h_to_h.bias", {h}, REPLICATED, 1);
  }
  const int norm = 3 + s.layers, head = 4 + s.layers;  // 2 + layers is a function
  spec.add_module_layers(norm);
  Add(spec, norm, "norm.scale", {h}, REPLICATED, 1);
  spec.add_module_layers(head);
  Add(spec, head, "final_linear.weight", {s.vocab, h}, VOCAB, 0);
  spec.set_num_layers(head + 1);
  return spec;
}

}  // namespace ucp::conformance
