// HfState on Hugging Face folders written here with the safetensors format
// (one file, and shards with their index) under GPT-NeoX's transformers
// names: the checkpoint names and layers of the gpt-neox preset (written out
// below), every weight as the file holds it, the fresh optimizer state; the
// damaged or foreign folders are refused naming
// the file and the tensor.
#include "formats/hf/hf_state.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/safetensors/safetensors.h"
#include "format/torch/tensor.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"

namespace ucp::hf {
namespace {

using torch::DType;
using torch::Tensor;

constexpr char kConfig[] = R"({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
  "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2, "intermediate_size": 16,
  "vocab_size": 12, "max_position_embeddings": 32, "use_parallel_residual": true, "layer_norm_eps": 1e-05,
  "tie_word_embeddings": false})";

// A tensor whose elements are distinct per tensor (salt) and per position.
Tensor Filled(const std::vector<int64_t>& shape, int salt, DType dtype = DType::kFloat32) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::string bytes;
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kFloat32) {
      float v = static_cast<float>(salt) + static_cast<float>(i) * 0.001f;
      bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    } else {
      int64_t v = salt * 1000 + i;
      bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
  }
  return *Tensor::FromBytes(dtype, shape, bytes);
}

using Tensors = std::vector<std::pair<std::string, Tensor>>;

// GPT-NeoX's transformers names, 2 layers, hidden 8, vocab 12.
Tensors NeoX() {
  Tensors t;
  int salt = 1;
  auto add = [&](const std::string& n, std::vector<int64_t> s) { t.emplace_back(n, Filled(s, salt++)); };
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

std::string Folder(const std::string& name, const Tensors& tensors, const std::string& config = kConfig) {
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

bool Same(const tp::TensorPlan& a, const Tensor& b) {
  absl::StatusOr<bool> s = tp::TensorPlan::BitwiseEqual(a, tp::TensorPlan::FromTensor(b));
  return s.ok() && *s;
}

// The gpt-neox preset's names of GPTNeoXForCausalLM: layer 0 the embedding,
// transformer layer l at l + 2, the final norm at layers + 3, the output at + 4.
const std::map<std::string, std::string>& Expected() {
  static const auto* m = new std::map<std::string, std::string>{
      {"gpt_neox.embed_in.weight", "0.word_embeddings.weight"},
      {"gpt_neox.layers.0.input_layernorm.bias", "2.input_layernorm.bias"},
      {"gpt_neox.layers.0.attention.query_key_value.weight", "2.attention.query_key_value.weight"},
      {"gpt_neox.layers.1.attention.dense.bias", "3.attention.dense.bias"},
      {"gpt_neox.layers.1.mlp.dense_4h_to_h.weight", "3.mlp.dense_4h_to_h.weight"},
      {"gpt_neox.final_layer_norm.weight", "5.norm.weight"},
      {"embed_out.weight", "6.final_linear.weight"},
  };
  return *m;
}

void CheckState(const HfState& s, const Tensors& tensors) {
  const state::ModelInfo& info = s.info();
  ASSERT_EQ(info.params.size(), tensors.size());
  EXPECT_EQ(info.num_layers, 7);
  EXPECT_EQ(info.module_layers, (std::vector<int>{0, 2, 3, 5, 6}));
  EXPECT_EQ(info.partition_method, "type:transformer|mlp");
  EXPECT_EQ(info.state_keys, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(info.source_topology.tp, 1);
  for (const auto& [hf, name] : Expected()) {
    SCOPED_TRACE(hf);
    const state::ParamState* p = info.Find(name);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->layer, std::stoi(name.substr(0, name.find('.'))));
    EXPECT_EQ(p->local_name, name.substr(name.find('.') + 1));
    const Tensor* want = nullptr;
    for (const auto& [n, t] : tensors) want = n == hf ? &t : want;
    ASSERT_NE(want, nullptr);
    EXPECT_EQ(p->full_shape, want->sizes());
    for (const char* st : {"lp", "fp32"}) {
      absl::StatusOr<std::vector<tp::TensorPlan>> sl = s.Slices(*p, 0, st);
      ASSERT_TRUE(sl.ok()) << sl.status();
      ASSERT_EQ(sl->size(), 1u);
      EXPECT_TRUE(Same((*sl)[0], *want)) << st;
    }
    absl::StatusOr<std::vector<tp::TensorPlan>> m = s.Slices(*p, 0, "exp_avg_sq");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(Same((*m)[0], Tensor::Zeros(DType::kFloat32, want->sizes())));
  }
  // Checkpoint order: by pipeline layer.
  for (size_t i = 1; i < info.params.size(); ++i) EXPECT_LE(info.params[i - 1].layer, info.params[i].layer);
  absl::StatusOr<state::FileValue> step = s.GroupScalar(0, "step");
  ASSERT_TRUE(step.ok() && step->value != nullptr);
}

TEST(HfStateTest, OneFileUnderGptNeoxNames) {
  const Tensors t = NeoX();
  absl::StatusOr<std::unique_ptr<HfState>> s = HfState::Open(Folder("hf_one", t), {"gpt-neox"});
  ASSERT_TRUE(s.ok()) << s.status();
  CheckState(**s, t);
  EXPECT_EQ((*s)->architecture(), "GPTNeoXForCausalLM");
}

TEST(HfStateTest, ShardsWithTheirIndex) {
  const Tensors t = NeoX();
  const std::string dir = Sharded("hf_shards", t);
  absl::StatusOr<std::unique_ptr<HfState>> s = HfState::Open(dir, {"gpt-neox"});
  ASSERT_TRUE(s.ok()) << s.status();
  CheckState(**s, t);
  EXPECT_EQ((*s)->Files().size(), 3u);
}

// The refusal of `dir` names every piece of `want`.
void ExpectRefused(const std::string& dir, const std::vector<std::string>& want, const std::string& preset = "gpt-neox") {
  absl::StatusOr<std::unique_ptr<HfState>> s = HfState::Open(dir, {preset});
  ASSERT_FALSE(s.ok());
  for (const std::string& w : want) EXPECT_TRUE(absl::StrContains(s.status().message(), w)) << s.status() << "\nwant: " << w;
}

TEST(HfStateTest, RefusesWithoutAPreset) {
  ExpectRefused(Folder("hf_nopreset", NeoX()), {"--preset", "gpt-neox (GPTNeoXForCausalLM)"}, "");
}

TEST(HfStateTest, RefusesAnotherArchitecture) {
  std::string config = kConfig;
  config.replace(config.find("GPTNeoXForCausalLM"), 18, "LlamaForCausalLM");
  ExpectRefused(Folder("hf_arch", NeoX(), config), {"config.json", "LlamaForCausalLM", "gpt-neox"});
}

TEST(HfStateTest, RefusesTiedEmbeddings) {
  std::string config = kConfig;
  config.replace(config.find("\"tie_word_embeddings\": false"), 28, "\"tie_word_embeddings\": true");
  Tensors t = NeoX();
  t.pop_back();  // save_pretrained leaves the tied output out
  ExpectRefused(Folder("hf_tied", t, config), {"config.json", "tie_word_embeddings", "not imported yet"});
}

TEST(HfStateTest, RefusesANameThePresetDoesNotImport) {
  Tensors t = NeoX();
  t.emplace_back("gpt_neox.layers.0.attention.rotary.extra", Filled({4}, 99));
  ExpectRefused(Folder("hf_unknown", t), {"gpt_neox.layers.0.attention.rotary.extra", "imports no checkpoint name"});
}

TEST(HfStateTest, RefusesAnIntegerTensor) {
  Tensors t = NeoX();
  t.emplace_back("gpt_neox.layers.0.attention.masked_bias", Filled({2}, 7, DType::kInt64));
  ExpectRefused(Folder("hf_int", t), {"model.safetensors", "gpt_neox.layers.0.attention.masked_bias", "int64"});
}

TEST(HfStateTest, RefusesADamagedIndex) {
  const Tensors t = NeoX();
  {
    const std::string dir = Sharded("hf_escape", t);
    std::string idx = *ReadFileToString(JoinPath(dir, kIndexFile));
    idx.replace(idx.find("model-00001-of-00003"), 20, "../model-00001-of-3");
    ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, kIndexFile), idx).ok());
    ExpectRefused(dir, {kIndexFile, "../model-00001-of-3", "expected a file name in the folder"});
  }
  {
    // The index puts a tensor in a shard that does not hold it.
    const std::string dir = Sharded("hf_moved", t);
    std::string idx = *ReadFileToString(JoinPath(dir, kIndexFile));
    const std::string key = "\"embed_out.weight\": \"model-00003-of-00003.safetensors\"";
    ASSERT_NE(idx.find(key), std::string::npos) << idx;
    idx.replace(idx.find(key), key.size(), "\"embed_out.weight\": \"model-00001-of-00003.safetensors\"");
    ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, kIndexFile), idx).ok());
    ExpectRefused(dir, {"embed_out.weight", "model-00001-of-00003.safetensors", "has no such tensor"});
  }
  {
    // A shard holds a tensor the index does not list.
    const std::string dir = Sharded("hf_unlisted", t);
    std::string idx = *ReadFileToString(JoinPath(dir, kIndexFile));
    const std::string key = "\"embed_out.weight\": \"model-00003-of-00003.safetensors\", ";
    const size_t at = idx.find("\"embed_out.weight\"");
    ASSERT_NE(at, std::string::npos);
    const size_t end = idx.find(", ", at);
    idx.erase(at, end + 2 - at);
    ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, kIndexFile), idx).ok());
    ExpectRefused(dir, {"embed_out.weight", "is not in", kIndexFile});
  }
}

TEST(HfStateTest, RefusesAFolderWithoutSafetensors) {
  const std::string dir = testing::FreshTempDir("hf_bin");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, kConfigFile), kConfig).ok());
  ExpectRefused(dir, {kSingleFile, kIndexFile, "pytorch_model.bin"});
}

}  // namespace
}  // namespace ucp::hf
