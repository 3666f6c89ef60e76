// HfState on Hugging Face folders written here with the safetensors format
// (one file, and shards with their index) under GPT-NeoX's transformers
// names: the checkpoint names and layers of the gpt-neox preset (written out
// below), every weight as the file holds it, the fresh optimizer state; the
// damaged or foreign folders are refused naming
// the file and the tensor.
#include "formats/hf/hf_state.h"

#include "formats/hf/hf_test_folder.h"

#include <cstring>
#include <map>
#include <string>
#include <tuple>
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

using testfolder::Filled;
using testfolder::Folder;
using testfolder::kConfig;
using testfolder::NeoX;
using testfolder::Sharded;
using testfolder::Tensors;

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
  // The row-parallel biases GPT-NeoX's parallel residual would want divided by tp: said, not done.
  int said = 0;
  for (const std::string& n : (*s)->info().notes) {
    said += absl::StrContains(n, "use_parallel_residual true") && absl::StrContains(n, "divided by tp");
  }
  EXPECT_EQ(said, 2);
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

// bf16 weights: the lp state as the file holds them, the fp32 masters their
// exact upcast (each bf16 the upper half of a float's bits).
TEST(HfStateTest, Bf16WeightsGiveUpcastMasters) {
  const Tensors t = NeoX(DType::kBFloat16);
  absl::StatusOr<std::unique_ptr<HfState>> s = HfState::Open(Folder("hf_bf16", t), {"gpt-neox"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->info().lp_dtype, DType::kBFloat16);
  int checked = 0;
  for (const auto& [hf, name] : Expected()) {
    const Tensor* w = nullptr;
    for (const auto& [n, v] : t) w = n == hf ? &v : w;
    const std::string half = w->ContiguousBytes();
    std::string full;
    for (size_t i = 0; i + 1 < half.size(); i += 2) {
      uint16_t top = 0;
      std::memcpy(&top, half.data() + i, 2);
      const uint32_t bits = static_cast<uint32_t>(top) << 16;
      full.append(reinterpret_cast<const char*>(&bits), 4);
    }
    const Tensor want = *Tensor::FromBytes(DType::kFloat32, w->sizes(), full);
    const state::ParamState* p = (*s)->info().Find(name);
    ASSERT_NE(p, nullptr) << name;
    absl::StatusOr<std::vector<tp::TensorPlan>> lp = (*s)->Slices(*p, 0, "lp");
    absl::StatusOr<std::vector<tp::TensorPlan>> fp = (*s)->Slices(*p, 0, "fp32");
    ASSERT_TRUE(lp.ok() && fp.ok());
    EXPECT_TRUE(Same((*lp)[0], *w)) << name;
    EXPECT_TRUE(Same((*fp)[0], want)) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 7);
}

TEST(HfStateTest, WithoutAPresetTheOneThatImportsTheArchitecture) {
  const Tensors t = NeoX();
  absl::StatusOr<std::unique_ptr<HfState>> s = HfState::Open(Folder("hf_nopreset", t), {""});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->preset(), "gpt-neox");
  CheckState(**s, t);
}

TEST(HfStateTest, RefusesWithoutAPresetWhenNoneImportsTheArchitecture) {
  std::string config = kConfig;
  config.replace(config.find("GPTNeoXForCausalLM"), 18, "Qwen2ForCausalLM");
  ExpectRefused(Folder("hf_nopreset_qwen", NeoX(), config),
                {"--preset", "gpt-neox (GPTNeoXForCausalLM)", "megatron-deepspeed (LlamaForCausalLM, MistralForCausalLM)",
                 "'Qwen2ForCausalLM'", "Qwen2ForCausalLM is not imported by preset 'megatron-deepspeed'",
                 "q/k/v projections have biases", "args.add_bias_linear"},
                "");
}

// Llama's config with `from` replaced by `to`.
std::string LlamaConfigWith(const std::string& from, const std::string& to) {
  std::string config = testfolder::kLlamaConfig;
  const size_t at = config.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) config.replace(at, from.size(), to);
  return config;
}

// MistralForCausalLM holds Llama's tensors: the same import, its
// architecture kept (sliding_window 32 = max_position_embeddings: a window
// no sequence of the model exceeds).
TEST(HfStateTest, MistralImportsAsLlamaDoes) {
  const Tensors t = testfolder::Llama();
  const std::string config = LlamaConfigWith(
      "\"LlamaForCausalLM\"], \"model_type\": \"llama\"",
      "\"MistralForCausalLM\"], \"model_type\": \"mistral\", \"sliding_window\": 32");
  absl::StatusOr<std::unique_ptr<HfState>> s = HfState::Open(Folder("hf_mistral", t, config), {""});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->preset(), "megatron-deepspeed");
  EXPECT_EQ((*s)->architecture(), "MistralForCausalLM");
  absl::StatusOr<std::unique_ptr<HfState>> llama =
      HfState::Open(Folder("hf_mistral_llama", t, testfolder::kLlamaConfig), {""});
  ASSERT_TRUE(llama.ok()) << llama.status();
  ASSERT_EQ((*s)->info().params.size(), (*llama)->info().params.size());
  for (const state::ParamState& p : (*llama)->info().params) {
    SCOPED_TRACE(p.name);
    const state::ParamState* q = (*s)->info().Find(p.name);
    ASSERT_NE(q, nullptr);
    absl::StatusOr<std::vector<tp::TensorPlan>> a = (*llama)->Slices(p, 0, "lp");
    absl::StatusOr<std::vector<tp::TensorPlan>> b = (*s)->Slices(*q, 0, "lp");
    ASSERT_TRUE(a.ok() && b.ok());
    absl::StatusOr<bool> same = tp::TensorPlan::BitwiseEqual((*a)[0], (*b)[0]);
    EXPECT_TRUE(same.ok() && *same);
  }
}

// What Megatron-DeepSpeed's GPTModelPipe cannot represent is refused, naming
// the config.json key and its value.
TEST(HfStateTest, RefusesConfigValuesMegatronDeepSpeedCannotRepresent) {
  const Tensors t = testfolder::Llama();
  const std::string mistral = "\"MistralForCausalLM\"], \"model_type\": \"mistral\"";
  const std::string llama = "\"LlamaForCausalLM\"], \"model_type\": \"llama\"";
  struct Case {
    std::string from, to;
    std::vector<std::string> want;
  };
  for (const Case& c : std::vector<Case>{
           {llama, mistral + ", \"sliding_window\": 16",
            {"config.json: sliding_window = 16, max_position_embeddings = 32", "no sliding window"}},
           {llama, mistral, {"sliding_window = 4096 (absent: the default)", "no sliding window"}},
           {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", {"config.json: hidden_act = \"gelu\"", "SiLU"}},
           {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"silu\", \"attention_bias\": true",
            {"config.json: mlp_bias = false (absent: the default), attention_bias = true", "args.add_bias_linear"}},
           {"\"hidden_act\": \"silu\"",
            "\"hidden_act\": \"silu\", \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0}",
            {"config.json: rope_parameters.rope_type = \"llama3\"", "no scaling"}},
           {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"silu\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}",
            {"config.json: rope_scaling = {", "no scaling"}},
       }) {
    SCOPED_TRACE(c.to);
    std::vector<std::string> want = c.want;
    want.push_back("not imported");
    ExpectRefused(Folder("hf_llama_refused", t, LlamaConfigWith(c.from, c.to)), want, "megatron-deepspeed");
  }
}

TEST(HfStateTest, RefusesAnotherArchitecture) {
  std::string config = kConfig;
  config.replace(config.find("GPTNeoXForCausalLM"), 18, "LlamaForCausalLM");
  ExpectRefused(Folder("hf_arch", NeoX(), config), {"config.json", "LlamaForCausalLM", "gpt-neox"});
}

const Tensor& Hf(const Tensors& t, const std::string& name) {
  for (const auto& [n, v] : t) {
    if (n == name) return v;
  }
  static const Tensor none;
  ADD_FAILURE() << "no " << name;
  return none;
}

// Rows [start, start + n) of a 2-D float32 tensor's bytes.
std::string Rows(const Tensor& t, int64_t start, int64_t n) {
  const std::string b = t.ContiguousBytes();
  const size_t row = static_cast<size_t>(t.sizes()[1]) * sizeof(float);
  return b.substr(static_cast<size_t>(start) * row, static_cast<size_t>(n) * row);
}

// Megatron-DeepSpeed's names of LlamaForCausalLM (megatron-deepspeed preset):
// query_key_value grouped per kv head ([q of the 2 query heads of kv head 0;
// k0; v0; q of kv head 1; k1; v1], each head 2 rows, written out here), and
// dense_h_to_4h [gate; up]; layer l at l + 2, the final norm "5.weight", the
// output "6.lm_head.weight".
TEST(HfStateTest, LlamaUnderMegatronDeepSpeedNamesFusesQkvAndGateUp) {
  const Tensors t = testfolder::Llama();
  absl::StatusOr<std::unique_ptr<HfState>> s =
      HfState::Open(Folder("hf_llama", t, testfolder::kLlamaConfig), {""});
  ASSERT_TRUE(s.ok()) << s.status();
  const state::ModelInfo& info = (*s)->info();
  EXPECT_EQ((*s)->preset(), "megatron-deepspeed");
  EXPECT_EQ(info.params.size(), 15u);  // 21 HF tensors, q/k/v and gate/up fused: 6 per layer + 3
  EXPECT_EQ(info.num_layers, 7);
  EXPECT_EQ(info.module_layers, (std::vector<int>{0, 2, 3, 5, 6}));
  EXPECT_EQ(info.partition_method, "type:transformer");
  for (int l = 0; l < 2; ++l) {
    SCOPED_TRACE(l);
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const Tensor &q = Hf(t, p + "self_attn.q_proj.weight"), &k = Hf(t, p + "self_attn.k_proj.weight"),
                 &v = Hf(t, p + "self_attn.v_proj.weight");
    std::string qkv;
    for (int kv = 0; kv < 2; ++kv) qkv += Rows(q, kv * 4, 4) + Rows(k, kv * 2, 2) + Rows(v, kv * 2, 2);
    const std::string gate_up = Hf(t, p + "mlp.gate_proj.weight").ContiguousBytes() +
                                Hf(t, p + "mlp.up_proj.weight").ContiguousBytes();
    for (const auto& [name, rows, bytes] :
         std::vector<std::tuple<std::string, int64_t, std::string>>{
             {absl::StrCat(l + 2, ".self_attention.query_key_value.weight"), 16, qkv},
             {absl::StrCat(l + 2, ".mlp.dense_h_to_4h.weight"), 12, gate_up},
             {absl::StrCat(l + 2, ".self_attention.dense.weight"), 8, Hf(t, p + "self_attn.o_proj.weight").ContiguousBytes()},
             {absl::StrCat(l + 2, ".mlp.dense_4h_to_h.weight"), 8, Hf(t, p + "mlp.down_proj.weight").ContiguousBytes()}}) {
      SCOPED_TRACE(name);
      const state::ParamState* param = info.Find(name);
      ASSERT_NE(param, nullptr);
      EXPECT_EQ(param->full_shape[0], rows);
      for (const char* st : {"lp", "fp32"}) {
        absl::StatusOr<std::vector<tp::TensorPlan>> sl = (*s)->Slices(*param, 0, st);
        ASSERT_TRUE(sl.ok()) << sl.status();
        absl::StatusOr<Tensor> got = (*sl)[0].Materialize();
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->ContiguousBytes(), bytes) << st;
      }
    }
  }
  for (const char* n : {"0.word_embeddings.weight", "2.input_layernorm.weight", "3.post_attention_layernorm.weight",
                        "5.weight", "6.lm_head.weight"}) {
    EXPECT_NE(info.Find(n), nullptr) << n;
  }
  // The import's args: swiglu (the export's requirement), for the preset's 2 sub-params of dense_h_to_4h.
  const pickle::Value* args = (*s)->import_args();
  ASSERT_NE(args, nullptr);
  const pickle::Value* swiglu = args->DictGet("swiglu");
  ASSERT_NE(swiglu, nullptr);
  EXPECT_TRUE(swiglu->is(pickle::Kind::kBool) && swiglu->int_value() != 0);
}

// Tied embeddings (save_pretrained leaves lm_head out): Megatron-DeepSpeed's
// TiedLayerSpec 'embed', at layer 0 and at the LM head's layer 6 (no file
// of its own there).
TEST(HfStateTest, TiedLlamaEmbeddingsAreMegatronDeepSpeedsTiedModule) {
  std::string config = testfolder::kLlamaConfig;
  config.replace(config.find("\"tie_word_embeddings\": false"), 28, "\"tie_word_embeddings\": true");
  Tensors t = testfolder::Llama();
  t.pop_back();  // lm_head.weight
  absl::StatusOr<std::unique_ptr<HfState>> s = HfState::Open(Folder("hf_llama_tied", t, config), {"megatron-deepspeed"});
  ASSERT_TRUE(s.ok()) << s.status();
  const state::ModelInfo& info = (*s)->info();
  EXPECT_EQ(info.params.size(), 14u);
  EXPECT_EQ(info.Find("0.word_embeddings.weight"), nullptr);
  const state::ParamState* e = info.Find("tied_modules.embed.word_embeddings.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->tied_key, "embed");
  EXPECT_EQ(e->local_name, "word_embeddings.weight");
  EXPECT_EQ(e->layer, 0);
  EXPECT_EQ(e->tied_layers, (std::vector<int>{0, 6}));
  EXPECT_EQ(info.num_layers, 7);
  EXPECT_EQ(info.module_layers, (std::vector<int>{0, 2, 3, 5}));
  absl::StatusOr<std::vector<tp::TensorPlan>> sl = (*s)->Slices(*e, 0, "lp");
  ASSERT_TRUE(sl.ok()) << sl.status();
  EXPECT_TRUE(Same((*sl)[0], Hf(t, "model.embed_tokens.weight")));
}

TEST(HfStateTest, RefusesALlamaWithAFusedPartMissing) {
  Tensors t = testfolder::Llama();
  t.erase(t.begin() + 3);  // model.layers.0.self_attn.v_proj.weight
  ExpectRefused(Folder("hf_llama_nov", t, testfolder::kLlamaConfig),
                {"2.self_attention.query_key_value.weight", "model.layers.0.self_attn.v_proj.weight"}, "megatron-deepspeed");
}

TEST(HfStateTest, RefusesALlamaWithPartsOfOtherWidths) {
  Tensors t = testfolder::Llama();
  t[2].second = Filled({4, 6}, 77);  // model.layers.0.self_attn.k_proj.weight
  ExpectRefused(Folder("hf_llama_k", t, testfolder::kLlamaConfig),
                {"model.layers.0.self_attn.k_proj.weight", "2.self_attention.query_key_value.weight", "every dim but the first"},
                "megatron-deepspeed");
}

TEST(HfStateTest, RefusesTiedEmbeddings) {
  std::string config = kConfig;
  config.replace(config.find("\"tie_word_embeddings\": false"), 28, "\"tie_word_embeddings\": true");
  Tensors t = NeoX();
  t.pop_back();  // save_pretrained leaves the tied output out
  ExpectRefused(Folder("hf_tied", t, config), {"config.json", "tie_word_embeddings", "names no tied module"});
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
