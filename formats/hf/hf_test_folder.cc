#include "formats/hf/hf_test_folder.h"

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/safetensors/safetensors.h"
#include "formats/hf/hf_state.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"

namespace ucp::hf::testfolder {

using torch::DType;
using torch::Tensor;

const char kConfig[] = R"({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
  "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2, "intermediate_size": 16,
  "vocab_size": 12, "max_position_embeddings": 32, "use_parallel_residual": true, "layer_norm_eps": 1e-05,
  "tie_word_embeddings": false})";

const char kLlamaConfig[] = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2, "num_hidden_layers": 2,
  "intermediate_size": 6, "vocab_size": 12, "max_position_embeddings": 32, "rms_norm_eps": 1e-05,
  "hidden_act": "silu", "tie_word_embeddings": false})";

// A tensor whose elements are distinct per tensor (salt) and per position.
Tensor Filled(const std::vector<int64_t>& shape, int salt, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::string bytes;
  for (int64_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(salt) + static_cast<float>(i) * 0.001f;
    if (dtype == DType::kFloat32) {
      bytes.append(reinterpret_cast<const char*>(&f), sizeof f);
    } else if (dtype == DType::kBFloat16) {  // the upper half of the float's bits
      uint32_t bits = 0;
      std::memcpy(&bits, &f, sizeof bits);
      const uint16_t top = static_cast<uint16_t>(bits >> 16);
      bytes.append(reinterpret_cast<const char*>(&top), sizeof top);
    } else {
      int64_t v = salt * 1000 + i;
      bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
  }
  return *Tensor::FromBytes(dtype, shape, bytes);
}


// GPT-NeoX's transformers names, 2 layers, hidden 8, vocab 12.
Tensors NeoX(DType dtype) {
  Tensors t;
  int salt = 1;
  auto add = [&](const std::string& n, std::vector<int64_t> s) { t.emplace_back(n, Filled(s, salt++, dtype)); };
  add("gpt_neox.embed_in.weight", {12, 8});
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("gpt_neox.layers.", l, ".");
    add(p + "input_layernorm.weight", {8});
    add(p + "input_layernorm.bias", {8});
    add(p + "post_attention_layernorm.weight", {8});
    add(p + "post_attention_layernorm.bias", {8});
    add(p + "attention.query_key_value.weight", {24, 8});
    add(p + "attention.query_key_value.bias", {24});
    add(p + "attention.dense.weight", {8, 8});
    add(p + "attention.dense.bias", {8});
    add(p + "mlp.dense_h_to_4h.weight", {16, 8});
    add(p + "mlp.dense_h_to_4h.bias", {16});
    add(p + "mlp.dense_4h_to_h.weight", {8, 16});
    add(p + "mlp.dense_4h_to_h.bias", {8});
  }
  add("gpt_neox.final_layer_norm.weight", {8});
  add("gpt_neox.final_layer_norm.bias", {8});
  add("embed_out.weight", {12, 8});
  return t;
}

// LlamaForCausalLM's names, in save_pretrained's order.
Tensors Llama() {
  Tensors t;
  int salt = 1;
  auto add = [&](const std::string& n, std::vector<int64_t> s) { t.emplace_back(n, Filled(s, salt++)); };
  add("model.embed_tokens.weight", {12, 8});
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "self_attn.q_proj.weight", {8, 8});
    add(p + "self_attn.k_proj.weight", {4, 8});
    add(p + "self_attn.v_proj.weight", {4, 8});
    add(p + "self_attn.o_proj.weight", {8, 8});
    add(p + "mlp.gate_proj.weight", {6, 8});
    add(p + "mlp.up_proj.weight", {6, 8});
    add(p + "mlp.down_proj.weight", {8, 6});
    add(p + "input_layernorm.weight", {8});
    add(p + "post_attention_layernorm.weight", {8});
  }
  add("model.norm.weight", {8});
  add("lm_head.weight", {12, 8});
  return t;
}

void WriteSafetensors(const std::string& path, const Tensors& tensors) {
  std::vector<safetensors::TensorSpec> specs;
  for (const auto& [n, t] : tensors) specs.push_back({n, t.dtype(), t.sizes()});
  absl::StatusOr<safetensors::FileLayout> l = safetensors::Layout(specs, {{"format", "pt"}});
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_TRUE(safetensors::CreateFile(path, *l).ok());
  for (size_t i = 0; i < l->tensors.size(); ++i) {
    const std::string& name = l->tensors[i].spec.name;
    const Tensor* t = nullptr;
    for (const auto& [n, v] : tensors) t = n == name ? &v : t;
    const std::string bytes = t->ContiguousBytes();
    absl::Status s = safetensors::WriteTensor(path, *l, i, [&](uint64_t off, size_t len, uint8_t*) {
      return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()) + off, len);
    });
    ASSERT_TRUE(s.ok()) << s;
  }
}

std::string Folder(const std::string& name, const Tensors& tensors, const std::string& config) {
  const std::string dir = testing::FreshTempDir(name);
  EXPECT_TRUE(WriteFileAtomic(JoinPath(dir, kConfigFile), config).ok());
  WriteSafetensors(JoinPath(dir, kSingleFile), tensors);
  return dir;
}

// Shards of 10 tensors and their index (weight_map in name order, as transformers writes it).
std::string Sharded(const std::string& name, const Tensors& tensors) {
  const std::string dir = testing::FreshTempDir(name);
  EXPECT_TRUE(WriteFileAtomic(JoinPath(dir, kConfigFile), kConfig).ok());
  std::map<std::string, std::string> map;
  const size_t n = (tensors.size() + 9) / 10;
  for (size_t s = 0; s < n; ++s) {
    Tensors part(tensors.begin() + s * 10, tensors.begin() + std::min(tensors.size(), s * 10 + 10));
    const std::string file = absl::StrCat("model-0000", s + 1, "-of-0000", n, ".safetensors");
    WriteSafetensors(JoinPath(dir, file), part);
    for (const auto& [k, v] : part) map[k] = file;
  }
  std::string json = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
  bool first = true;
  for (const auto& [k, f] : map) {
    absl::StrAppend(&json, first ? "" : ", ", "\"", k, "\": \"", f, "\"");
    first = false;
  }
  json += "}}";
  EXPECT_TRUE(WriteFileAtomic(JoinPath(dir, kIndexFile), json).ok());
  return dir;
}

}  // namespace ucp::hf::testfolder
