// ucp reshard of a Hugging Face folder (formats/hf) to DeepSpeed ZeRO-1 at
// tp 2 pp 2 dp 2, read back by ucp's ZeRO reader: every param (merged over
// tp by the gpt-neox preset) is the HF tensor it came from, bitwise, in the
// module weights and the fp32 masters; the moments are zero. (Real DeepSpeed
// loading it: interop/hf:hf_import_test.)
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "formats/hf/hf_test_folder.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace ucp::ops
