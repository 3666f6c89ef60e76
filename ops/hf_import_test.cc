// ucp reshard of a Hugging Face folder (formats/hf) to DeepSpeed ZeRO-1 at
// tp 2 pp 2 dp 2, read back by ucp's ZeRO reader: every param (merged over
// tp by the gpt-neox preset) is the HF tensor it came from, bitwise, in the
// module weights and the fp32 masters; the moments are zero. (Real DeepSpeed
// loading it: interop/hf:hf_import_test.)
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/safetensors/safetensors.h"
#include "formats/hf/hf_test_folder.h"
#include "gtest/gtest.h"
#include "ops/convert.h"
#include "ops/export.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"

namespace ucp::ops {
namespace {

bool Same(const tp::TensorPlan& a, const torch::Tensor& b) {
  absl::StatusOr<bool> s = tp::TensorPlan::BitwiseEqual(a, tp::TensorPlan::FromTensor(b));
  return s.ok() && *s;
}

TEST(HfImportTest, ReshardToTp2Pp2Dp2ReadsBackAsTheHfTensors) {
  const hf::testfolder::Tensors t = hf::testfolder::NeoX();
  const std::string in = hf::testfolder::Sharded("hf_import_src", t);
  const std::string root = testing::FreshTempDir("hf_import_out");
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = JoinPath(root, "global_step0");
  o.write.target = state::Topology{2, 2, 2};
  o.zero_source.rules.preset = "gpt-neox";
  absl::StatusOr<ReshardResult> r = Reshard(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source_kind, "hf");
  EXPECT_TRUE(PathExists(JoinPath(root, "latest")));
  EXPECT_TRUE(PathExists(JoinPath(root, "global_step0/layer_03-model_01-model_states.pt")));
  EXPECT_TRUE(PathExists(JoinPath(root, "global_step0/zero_pp_rank_1_mp_rank_03_optim_states.pt")));

  SourceOptions so;
  so.rules.preset = "gpt-neox";
  absl::StatusOr<std::unique_ptr<state::ModelState>> back = OpenModelState(root, so);
  ASSERT_TRUE(back.ok()) << back.status();
  // The gpt-neox names of GPTNeoXForCausalLM's tensors (README, "A Hugging Face folder into DeepSpeed").
  auto name_of = [](const std::string& hf) -> std::string {
    if (hf == "gpt_neox.embed_in.weight") return "0.word_embeddings.weight";
    if (hf == "embed_out.weight") return "6.final_linear.weight";
    if (hf.rfind("gpt_neox.final_layer_norm.", 0) == 0) return "5.norm." + hf.substr(26);
    const size_t dot = hf.find('.', 16);
    return std::to_string(std::stoi(hf.substr(16, dot - 16)) + 2) + hf.substr(dot);
  };
  ASSERT_EQ((*back)->info().params.size(), t.size());
  for (const auto& [hf, tensor] : t) {
    SCOPED_TRACE(hf);
    const state::ParamState* p = (*back)->info().Find(name_of(hf));
    ASSERT_NE(p, nullptr) << name_of(hf);
    for (const char* st : {"lp", "fp32"}) {
      absl::StatusOr<tp::TensorPlan> f = (*back)->Full(*p, st);
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_TRUE(Same(*f, tensor)) << st;
    }
    absl::StatusOr<tp::TensorPlan> m = (*back)->Full(*p, "exp_avg");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(Same(*m, torch::Tensor::Zeros(torch::DType::kFloat32, tensor.sizes())));
  }
}

// The Trainer's checkpoint-N holds config.json and model.safetensors beside
// `latest` and global_stepN/: it is the DeepSpeed checkpoint `latest` names,
// not a Hugging Face folder to import.
TEST(HfImportTest, AFolderWithLatestBesideTheWeightsIsTheDeepSpeedCheckpoint) {
  const hf::testfolder::Tensors t = hf::testfolder::NeoX();
  const std::string in = hf::testfolder::Folder("hf_import_trainer_src", t);
  const std::string root = testing::FreshTempDir("hf_import_trainer");
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = JoinPath(root, "global_step0");
  o.write.target = state::Topology{1, 1, 1};
  o.zero_source.rules.preset = "gpt-neox";
  absl::StatusOr<ReshardResult> r = Reshard(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root, "config.json"), hf::testfolder::kConfig).ok());
  hf::testfolder::WriteSafetensors(JoinPath(root, "model.safetensors"), t);
  ReshardOptions again;
  again.input_folder = root;
  again.output_folder = JoinPath(testing::FreshTempDir("hf_import_trainer_out"), "global_step0");
  again.write.target = state::Topology{1, 1, 2};
  again.zero_source.rules.preset = "gpt-neox";
  absl::StatusOr<ReshardResult> r2 = Reshard(again);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->source_kind, "zero");
}

// A Llama folder imported at tp 2 under Megatron-DeepSpeed's names holds
// swiglu's fused dense_h_to_4h as [gate_r; up_r] per tp rank, which only the
// args (swiglu) say; the import records none (Megatron-DeepSpeed checks the args
// it finds against its own), so it declares each param's merge in
// universal_checkpoint_info, as Megatron-DeepSpeed does. Opened again with no
// flags, every param merges back to the tensor the tp 1 import holds whole;
// before the declaration, the preset (swiglu unknown: false) merged
// dense_h_to_4h as [gate_0; up_0; gate_1; up_1].
TEST(HfImportTest, ALlamaImportAtTp2MergesBackWithNoFlags) {
  const hf::testfolder::Tensors t = hf::testfolder::Llama();
  const std::string in = hf::testfolder::Folder("hf_import_llama_src", t, hf::testfolder::kLlamaConfig);
  std::map<int, std::unique_ptr<state::ModelState>> back;
  for (int tp : {1, 2}) {
    const std::string root = testing::FreshTempDir(absl::StrCat("hf_import_llama_tp", tp));
    ReshardOptions o;
    o.input_folder = in;
    o.output_folder = JoinPath(root, "global_step0");
    o.write.target = state::Topology{tp, 1, 1};
    absl::StatusOr<ReshardResult> r = Reshard(o);
    ASSERT_TRUE(r.ok()) << r.status();
    absl::StatusOr<std::unique_ptr<state::ModelState>> opened = OpenModelState(root, SourceOptions());
    ASSERT_TRUE(opened.ok()) << opened.status();
    back[tp] = *std::move(opened);
  }
  const state::ModelInfo& whole = back[1]->info();
  ASSERT_EQ(back[2]->info().params.size(), whole.params.size());
  for (const state::ParamState& p : whole.params) {
    SCOPED_TRACE(p.name);
    const state::ParamState* q = back[2]->info().Find(p.name);
    ASSERT_NE(q, nullptr);
    // Declared, except DeepSpeed's default (cat on dim 0), which the preset
    // then decides alike (the vocabulary: its unpadded size is unknown).
    if (q->rule.kind() != COLUMN) EXPECT_EQ(q->source, CHECKPOINT_INFO) << q->origin;
    if (p.name.find("dense_h_to_4h") != std::string::npos) EXPECT_EQ(q->rule.kind(), SUB_PARAMS) << q->origin;
    for (const char* st : {"lp", "fp32"}) {
      absl::StatusOr<tp::TensorPlan> a = back[1]->Full(p, st);
      absl::StatusOr<tp::TensorPlan> b = back[2]->Full(*q, st);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      absl::StatusOr<bool> same = tp::TensorPlan::BitwiseEqual(*a, *b);
      EXPECT_TRUE(same.ok() && *same) << st;
    }
  }
}

// Megatron gives each tp rank whole kv groups: the Llama folder's 2 kv heads
// do not split over tp 4 (its 4 query heads and the fused rows would).
TEST(HfImportTest, ATpThatDoesNotDivideTheKvHeadsIsRefused) {
  const std::string in = hf::testfolder::Folder("hf_import_llama_kv", hf::testfolder::Llama(), hf::testfolder::kLlamaConfig);
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = JoinPath(testing::FreshTempDir("hf_import_llama_kv_out"), "global_step0");
  o.write.target = state::Topology{4, 1, 1};
  absl::StatusOr<ReshardResult> r = Reshard(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--tp=4 does not divide the model's num_key_value_heads = 2"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos) << r.status();
  EXPECT_FALSE(PathExists(o.output_folder));
}

// Imports `in` at `t` into ROOT/global_step0 (ROOT a fresh folder); ROOT.
std::string Import(const std::string& in, const state::Topology& t, const std::string& name) {
  const std::string root = testing::FreshTempDir(name);
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = JoinPath(root, "global_step0");
  o.write.target = t;
  o.write.fsync = false;
  absl::StatusOr<ReshardResult> r = Reshard(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return root;
}

// `ucp export --names=hf` of `root` into a fresh folder; the folder.
absl::StatusOr<ExportResult> ExportHf(const std::string& root, const std::string& out) {
  ExportOptions e;
  e.input_folder = root;
  e.output_folder = out;
  e.names = "hf";
  e.write.fsync = false;
  return Export(e);
}

// The tensors of `dir`'s model.safetensors by name (the file kept open in `keep`).
std::map<std::string, torch::Tensor> ReadExport(const std::string& dir,
                                                std::unique_ptr<safetensors::SafetensorsFile>* keep) {
  std::map<std::string, torch::Tensor> out;
  auto f = safetensors::SafetensorsFile::Open(JoinPath(dir, "model.safetensors"));
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return out;
  for (const std::string& n : (*f)->header_order()) {
    absl::StatusOr<torch::Tensor> t = (*f)->GetTensor(n);
    EXPECT_TRUE(t.ok()) << n << ": " << t.status();
    if (t.ok()) out[n] = *t;
  }
  *keep = *std::move(f);
  return out;
}

// `got` = `factor` x `want` element by element (float32; x1 and x2 are exact).
bool Scaled(const torch::Tensor& got, const torch::Tensor& want, float factor) {
  if (got.sizes() != want.sizes() || got.dtype() != torch::DType::kFloat32) return false;
  const std::string a = got.ContiguousBytes(), b = want.ContiguousBytes();
  for (size_t i = 0; i + 4 <= a.size(); i += 4) {
    float x = 0, y = 0;
    std::memcpy(&x, a.data() + i, 4);
    std::memcpy(&y, b.data() + i, 4);
    if (x != factor * y) return false;
  }
  return true;
}

// The Hugging Face round trip: a Llama folder (config.json, safetensors,
// generation_config.json, tokenizer_config.json) imported at tp 2 and at tp
// 2 pp 2 keeps the folder's model files beside the tags, and `ucp export
// --names=hf` of the import gives back every HF tensor bitwise and
// config.json byte for byte (the import records no Megatron args: before
// the model files, the export stopped at args.swiglu). A reshard of the
// import to tp 1 dp 2 carries them along, and exports the same.
TEST(HfImportTest, ALlamaImportExportsBackToTheHfTensorsBitwise) {
  const hf::testfolder::Tensors t = hf::testfolder::Llama();
  const std::string in = hf::testfolder::Folder("hf_rt_llama_src", t, hf::testfolder::kLlamaConfig);
  ASSERT_TRUE(WriteFileAtomic(JoinPath(in, "generation_config.json"), "{\"bos_token_id\": 1}\n").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(in, "tokenizer_config.json"), "{\"model_max_length\": 32}\n").ok());
  for (const state::Topology& topo : {state::Topology{2, 1, 1}, state::Topology{2, 2, 1}}) {
    SCOPED_TRACE(absl::StrCat("tp ", topo.tp, " pp ", topo.pp));
    std::string root = Import(in, topo, absl::StrCat("hf_rt_llama_tp", topo.tp, "_pp", topo.pp));
    for (int hop = 0; hop < 2; ++hop) {
      SCOPED_TRACE(hop == 0 ? "the import" : "the import resharded to tp 1 dp 2");
      for (const char* f : {"config.json", "generation_config.json", "tokenizer_config.json"}) {
        EXPECT_EQ(ReadFileToString(JoinPath(root, f)).value_or("?"), ReadFileToString(JoinPath(in, f)).value_or("!"))
            << f;
      }
      const std::string out = JoinPath(testing::FreshTempDir("hf_rt_llama_export"), "hf");
      absl::StatusOr<ExportResult> r = ExportHf(root, out);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->architecture, "LlamaForCausalLM");
      std::unique_ptr<safetensors::SafetensorsFile> keep;
      const std::map<std::string, torch::Tensor> got = ReadExport(out, &keep);
      EXPECT_EQ(got.size(), t.size());
      for (const auto& [name, want] : t) {
        auto it = got.find(name);
        ASSERT_NE(it, got.end()) << name;
        EXPECT_TRUE(Scaled(it->second, want, 1.0f)) << name;
      }
      for (const char* f : {"config.json", "generation_config.json", "tokenizer_config.json"}) {
        EXPECT_EQ(ReadFileToString(JoinPath(out, f)).value_or("?"), ReadFileToString(JoinPath(in, f)).value_or("!"))
            << f;
      }
      if (hop == 1) break;
      const std::string next = testing::FreshTempDir("hf_rt_llama_resharded");
      ReshardOptions o;
      o.input_folder = root;
      o.output_folder = JoinPath(next, "global_step0");
      o.write.target = state::Topology{1, 1, 2};
      o.write.fsync = false;
      absl::StatusOr<ReshardResult> again = Reshard(o);
      ASSERT_TRUE(again.ok()) << again.status();
      root = next;
    }
  }
}

// A MistralForCausalLM (Llama's tensors) imported at tp 2 exports back as
// itself: its config.json as is, every tensor bitwise.
TEST(HfImportTest, AMistralImportExportsBackAsMistral) {
  const hf::testfolder::Tensors t = hf::testfolder::Llama();
  std::string config = hf::testfolder::kLlamaConfig;
  const std::string from = "\"LlamaForCausalLM\"], \"model_type\": \"llama\"";
  config.replace(config.find(from), from.size(), "\"MistralForCausalLM\"], \"model_type\": \"mistral\", \"sliding_window\": null");
  const std::string in = hf::testfolder::Folder("hf_rt_mistral_src", t, config);
  const std::string root = Import(in, state::Topology{2, 1, 1}, "hf_rt_mistral");
  const std::string out = JoinPath(testing::FreshTempDir("hf_rt_mistral_export"), "hf");
  absl::StatusOr<ExportResult> r = ExportHf(root, out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->architecture, "MistralForCausalLM");
  EXPECT_EQ(ReadFileToString(JoinPath(out, "config.json")).value_or("?"), config);
  std::unique_ptr<safetensors::SafetensorsFile> keep;
  const std::map<std::string, torch::Tensor> got = ReadExport(out, &keep);
  EXPECT_EQ(got.size(), t.size());
  for (const auto& [name, want] : t) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(Scaled(it->second, want, 1.0f)) << name;
  }
}

// A Llama with attention_bias and mlp_bias (Megatron-DeepSpeed's
// add_bias_linear: a bias on every linear layer): the q/k/v biases are fused
// into query_key_value.bias as the weights' rows are, gate/up into
// dense_h_to_4h.bias; imported at tp 2 pp 2 and exported back bitwise.
TEST(HfImportTest, ALlamaWithLinearBiasesRoundTripsBitwise) {
  hf::testfolder::Tensors t = hf::testfolder::Llama();
  int salt = 200;
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    for (const auto& [n, rows] : std::vector<std::pair<std::string, int64_t>>{
             {"self_attn.q_proj", 8}, {"self_attn.k_proj", 4}, {"self_attn.v_proj", 4}, {"self_attn.o_proj", 8},
             {"mlp.gate_proj", 6}, {"mlp.up_proj", 6}, {"mlp.down_proj", 8}}) {
      t.emplace_back(p + n + ".bias", hf::testfolder::Filled({rows}, salt++));
    }
  }
  std::string config = hf::testfolder::kLlamaConfig;
  config.replace(config.find("\"hidden_act\""), 0, "\"attention_bias\": true, \"mlp_bias\": true, ");
  const std::string in = hf::testfolder::Folder("hf_rt_llama_bias_src", t, config);
  const std::string root = Import(in, state::Topology{2, 2, 1}, "hf_rt_llama_bias");
  const std::string out = JoinPath(testing::FreshTempDir("hf_rt_llama_bias_export"), "hf");
  absl::StatusOr<ExportResult> r = ExportHf(root, out);
  ASSERT_TRUE(r.ok()) << r.status();
  std::unique_ptr<safetensors::SafetensorsFile> keep;
  const std::map<std::string, torch::Tensor> got = ReadExport(out, &keep);
  EXPECT_EQ(got.size(), t.size());
  for (const auto& [name, want] : t) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(Scaled(it->second, want, 1.0f)) << name;
  }
}

// `ucp convert --to=dcp --names=hf` of the import: every entry a Hugging
// Face tensor, its fp32 master the HF tensor bitwise, its moments zero.
TEST(HfImportTest, ALlamaImportConvertsToDcpUnderHfNames) {
  const hf::testfolder::Tensors t = hf::testfolder::Llama();
  const std::string in = hf::testfolder::Folder("hf_dcp_llama_src", t, hf::testfolder::kLlamaConfig);
  const std::string root = Import(in, state::Topology{2, 2, 1}, "hf_dcp_llama");
  ConvertOptions c;
  c.input_folder = root;
  c.output_folder = JoinPath(testing::FreshTempDir("hf_dcp_llama_out"), "dcp");
  c.to = "dcp";
  c.names = "hf";
  c.write.fsync = false;
  absl::StatusOr<ConvertResult> r = Convert(c);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<std::unique_ptr<state::ModelState>> dcp = OpenModelState(c.output_folder, SourceOptions());
  ASSERT_TRUE(dcp.ok()) << dcp.status();
  EXPECT_EQ((*dcp)->info().params.size(), t.size());
  for (const auto& [name, want] : t) {
    SCOPED_TRACE(name);
    const state::ParamState* p = (*dcp)->info().Find(name);
    ASSERT_NE(p, nullptr);
    absl::StatusOr<tp::TensorPlan> f = (*dcp)->Full(*p, "fp32");
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE(Same(*f, want));
    absl::StatusOr<tp::TensorPlan> m = (*dcp)->Full(*p, "exp_avg_sq");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(Same(*m, torch::Tensor::Zeros(torch::DType::kFloat32, want.sizes())));
  }
}

// GPT-NeoX with use_parallel_residual (the test folder's config.json): its
// trainer adds each tp rank's copy of the row-parallel biases before the
// all-reduce, and the import writes them whole on every rank, so the tp 2
// import is a model with those biases doubled. The export says what that
// model is, as for any GPT-NeoX training at tp 2 with gpt_j_residual:
// attention.dense.bias and mlp.dense_4h_to_h.bias = 2 x the HF tensor, the
// rest bitwise, with a note; at tp 1 all bitwise. Convert --to=dcp
// --names=hf has no optimizer state for a doubled tensor: refused.
TEST(HfImportTest, AParallelResidualNeoXImportExportsAsExportDoes) {
  const hf::testfolder::Tensors t = hf::testfolder::NeoX();
  const std::string in = hf::testfolder::Folder("hf_rt_neox_src", t);
  for (int tp : {1, 2}) {
    SCOPED_TRACE(tp);
    const std::string root = Import(in, state::Topology{tp, 2, 1}, absl::StrCat("hf_rt_neox_tp", tp));
    const std::string out = JoinPath(testing::FreshTempDir("hf_rt_neox_export"), "hf");
    absl::StatusOr<ExportResult> r = ExportHf(root, out);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->architecture, "GPTNeoXForCausalLM");
    bool noted = false;
    for (const std::string& n : r->notes) noted = noted || absl::StrContains(n, "use_parallel_residual: every tp rank");
    EXPECT_EQ(noted, tp == 2);
    std::unique_ptr<safetensors::SafetensorsFile> keep;
    const std::map<std::string, torch::Tensor> got = ReadExport(out, &keep);
    EXPECT_EQ(got.size(), t.size());
    int doubled = 0;
    for (const auto& [name, want] : t) {
      auto it = got.find(name);
      ASSERT_NE(it, got.end()) << name;
      const bool summed = absl::EndsWith(name, "attention.dense.bias") || absl::EndsWith(name, "dense_4h_to_h.bias");
      doubled += summed && tp == 2;
      EXPECT_TRUE(Scaled(it->second, want, summed ? static_cast<float>(tp) : 1.0f)) << name;
    }
    EXPECT_EQ(doubled, tp == 2 ? 4 : 0);
    ConvertOptions c;
    c.input_folder = root;
    c.output_folder = JoinPath(testing::FreshTempDir("hf_rt_neox_dcp"), "dcp");
    c.to = "dcp";
    c.names = "hf";
    c.write.fsync = false;
    absl::StatusOr<ConvertResult> d = Convert(c);
    if (tp == 1) {
      EXPECT_TRUE(d.ok()) << d.status();
    } else {
      ASSERT_FALSE(d.ok());
      EXPECT_NE(d.status().message().find("2 x the checkpoint's"), std::string::npos) << d.status();
    }
  }
}

// The import keeps the model's config.json beside the tags: a root that
// already holds another model's is refused before anything is written.
TEST(HfImportTest, ARootWithAnotherModelsConfigIsRefused) {
  const std::string in =
      hf::testfolder::Folder("hf_conflict_src", hf::testfolder::Llama(), hf::testfolder::kLlamaConfig);
  const std::string root = testing::FreshTempDir("hf_conflict_out");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root, "config.json"), hf::testfolder::kConfig).ok());
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = JoinPath(root, "global_step0");
  o.write.target = state::Topology{1, 1, 1};
  absl::StatusOr<ReshardResult> r = Reshard(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(r.status().message().find(JoinPath(root, "config.json")), std::string::npos) << r.status();
  EXPECT_FALSE(PathExists(o.output_folder));
  EXPECT_FALSE(PathExists(JoinPath(root, "latest")));
  EXPECT_EQ(ReadFileToString(JoinPath(root, "config.json")).value_or(""), hf::testfolder::kConfig);
}

// A checkpoint whose root holds a config.json that is not JSON reshards as
// ever: no model is named, nothing is carried.
TEST(HfImportTest, ABrokenConfigBesideTheTagsIsNotCarried) {
  const std::string in = hf::testfolder::Folder("hf_broken_cfg_src", hf::testfolder::NeoX());
  const std::string root = Import(in, state::Topology{1, 1, 1}, "hf_broken_cfg");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root, "config.json"), "not json").ok());
  const std::string out = testing::FreshTempDir("hf_broken_cfg_out");
  ReshardOptions o;
  o.input_folder = root;
  o.output_folder = JoinPath(out, "global_step0");
  o.write.target = state::Topology{1, 1, 2};
  o.write.fsync = false;
  absl::StatusOr<ReshardResult> r = Reshard(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(PathExists(JoinPath(out, "latest")));
  EXPECT_FALSE(PathExists(JoinPath(out, "config.json")));
}

}  // namespace
}  // namespace ucp::ops
