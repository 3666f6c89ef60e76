// SyntheticModelState and save(M, T) on their own: the state is what the
// header promises, and for the fixtures' model at the fixtures' topologies
// the writer lays files out exactly as DeepSpeed 0.14.4 did (file names, dict
// keys, param_slice_mappings, group_paddings, partition sizes, tensor shapes
// and dtypes; the values differ: another model, another run).
#include "conformance/synthetic_state.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "conformance/layout_diff.h"
#include "conformance/neox_model.h"
#include "conformance/spec_rules.h"
#include "testing/compare.h"
#include "format/pickle/accessors.h"
#include "format/torch/torch_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/reshard.h"
#include "testing/fixtures.h"

namespace ucp::conformance {
namespace {

using ::testing::IsEmpty;
using pickle::Kind;
using pickle::Value;
using ucp::testing::FixturePath;
using ucp::testing::VersionFixturePath;
using ucp::testing::FreshTempDir;

absl::StatusOr<std::unique_ptr<SyntheticModelState>> FixtureModel(const std::string& lp_dtype,
                                                                  state::OptimizerKind kind) {
  NeoxShape shape;  // the fixtures' model
  shape.lp_dtype = lp_dtype;
  return SyntheticModelState::Make(NeoxSpec(shape), /*seed=*/4, /*zero_stage=*/1, kind);
}

class FixtureLayoutTest : public ::testing::TestWithParam<std::tuple<std::string, state::Topology, bool>> {};

TEST_P(FixtureLayoutTest, SaveLaysOutFilesAsDeepSpeedDid) {
  const auto& [fixture, topology, bf16] = GetParam();
  auto m = FixtureModel(bf16 ? "bf16" : "fp32", bf16 ? state::OptimizerKind::kBf16 : state::OptimizerKind::kZero);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string out = JoinPath(FreshTempDir(absl::StrCat("layout_", fixture)), "global_step4");
  auto saved = SaveZero(**m, out, topology, 2);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::vector<std::string> diffs = LayoutDiffs(out, FixturePath(fixture + "/global_step4"));
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
  // The comparison sees what it must: a fixture is not the layout of another topology.
  if (topology.dp == 1) {
    const std::vector<std::string> other = LayoutDiffs(out, FixturePath("neox-tp2-pp1-dp2/global_step4"));
    EXPECT_THAT(other, Not(IsEmpty()));
  }
  // ... nor that of another model: one bias in the other param group.
  NeoxShape shape;
  shape.lp_dtype = bf16 ? "bf16" : "fp32";
  ModelSpec moved = NeoxSpec(shape);
  for (ModelParam& p : *moved.mutable_param()) {
    if (p.name() == "5.attention.dense.bias") p.set_group(0);
  }
  auto m2 = SyntheticModelState::Make(moved, 4, 1, (*m)->info().optimizer_kind);
  ASSERT_TRUE(m2.ok()) << m2.status();
  const std::string out2 = JoinPath(FreshTempDir(absl::StrCat("layout_moved_", fixture)), "global_step4");
  ASSERT_TRUE(SaveZero(**m2, out2, topology, 2).ok());
  EXPECT_THAT(LayoutDiffs(out2, FixturePath(fixture + "/global_step4")), Not(IsEmpty()));
}

// The same model saved as DeepSpeed 0.16.4 and 0.19.5 (numpy 2, torch 2.6 as
// the fixtures' jobs ran) against those versions' files: checkpoint_parallel_dimensions
// in 0.19.5 only, torch 2's param_groups keys, ds_version.
class VersionFixtureLayoutTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, state::Topology, bool>> {};

TEST_P(VersionFixtureLayoutTest, SaveLaysOutFilesAsThatVersionDid) {
  const auto& [version, fixture, topology, bf16] = GetParam();
  NeoxShape shape;
  shape.layers = 4;  // these fixtures' model
  shape.lp_dtype = bf16 ? "bf16" : "fp32";
  SyntheticVersion v;
  v.ds_version = version;
  v.numpy2 = true;
  auto m = SyntheticModelState::Make(NeoxSpec(shape), 4, 1,
                                     bf16 ? state::OptimizerKind::kBf16 : state::OptimizerKind::kZero, v);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string out = JoinPath(FreshTempDir(absl::StrCat("layout_", version, fixture)), "global_step4");
  ASSERT_TRUE(SaveZero(**m, out, topology, 2).ok());
  const std::string theirs = VersionFixturePath(version, fixture + "/global_step4");
  std::vector<std::string> diffs = LayoutDiffs(out, theirs);
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
  // The same model saved as 0.14.4 is not that layout.
  auto old = SyntheticModelState::Make(NeoxSpec(shape), 4, 1, (*m)->info().optimizer_kind);
  ASSERT_TRUE(old.ok());
  const std::string out_old = JoinPath(FreshTempDir(absl::StrCat("layout_old_", version, fixture)), "global_step4");
  ASSERT_TRUE(SaveZero(**old, out_old, topology, 2).ok());
  EXPECT_THAT(LayoutDiffs(out_old, theirs), Not(IsEmpty()));
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, VersionFixtureLayoutTest,
    ::testing::Values(std::make_tuple("0.19.5", "neox-tp2-pp1-dp1", state::Topology{2, 1, 1}, false),
                      std::make_tuple("0.19.5", "neox-bf16-tp2-pp1-dp2", state::Topology{2, 1, 2}, true),
                      std::make_tuple("0.16.4", "neox-tp2-pp1-dp1", state::Topology{2, 1, 1}, false),
                      std::make_tuple("0.16.4", "neox-bf16-tp2-pp1-dp2", state::Topology{2, 1, 2}, true)));

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureLayoutTest,
                         ::testing::Values(std::make_tuple("neox-tp2-pp1-dp1", state::Topology{2, 1, 1}, false),
                                           std::make_tuple("neox-tp2-pp1-dp2", state::Topology{2, 1, 2}, false),
                                           std::make_tuple("neox-tp1-pp2-dp1", state::Topology{1, 2, 1}, false),
                                           std::make_tuple("neox-bf16-tp2-pp1-dp2", state::Topology{2, 1, 2}, true)));

TEST(SyntheticModelStateTest, TensorsFollowTheHeader) {
  auto m = FixtureModel("fp32", state::OptimizerKind::kZero);
  ASSERT_TRUE(m.ok()) << m.status();
  const state::ModelInfo& info = (*m)->info();
  EXPECT_EQ(info.num_groups, 2);
  // Flatten order: group 0 then group 1, module order within.
  EXPECT_EQ(info.params.front().name, "0.word_embeddings.weight");
  EXPECT_EQ(info.params[1].name, "2.attention.query_key_value.weight");
  const std::string name = "2.attention.dense.weight";
  const state::ParamState* p = info.Find(name);
  ASSERT_NE(p, nullptr);
  auto fp32 = (*m)->Tensor(name, "fp32");
  auto avg = (*m)->Tensor(name, "exp_avg");
  auto sq = (*m)->Tensor(name, "exp_avg_sq");
  ASSERT_TRUE(fp32.ok() && avg.ok() && sq.ok());
  EXPECT_EQ(fp32->sizes(), (std::vector<int64_t>{64, 64}));
  EXPECT_FALSE(fp32->BitwiseEqual(*avg));
  EXPECT_FALSE(avg->BitwiseEqual(*sq));
  const float* v = reinterpret_cast<const float*>(sq->data());
  for (int64_t i = 0; i < sq->numel(); ++i) ASSERT_GE(v[i], 0.0f);
  // Deterministic from the seed, different for another seed.
  auto again = FixtureModel("fp32", state::OptimizerKind::kZero);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->Tensor(name, "fp32")->BitwiseEqual(*fp32));
  NeoxShape shape;
  auto other = SyntheticModelState::Make(NeoxSpec(shape), 5, 1, state::OptimizerKind::kZero);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)->Tensor(name, "fp32")->BitwiseEqual(*fp32));
  // Trainable params have no lp weight of their own.
  EXPECT_EQ((*m)->Full(*p, "lp").status().code(), absl::StatusCode::kNotFound);
  // step: a 0-dim float32 tensor per group.
  auto step = (*m)->GroupScalar(1, "step");
  ASSERT_TRUE(step.ok() && step->value && step->file);
  auto t = step->file->GetTensor(*step->value);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dim(), 0);
  EXPECT_EQ(t->dtype(), torch::DType::kFloat32);
  EXPECT_EQ(*reinterpret_cast<const float*>(t->data()), static_cast<float>((*m)->Step(1)));
  // The vocabulary is held unpadded.
  EXPECT_EQ(info.Find("0.word_embeddings.weight")->full_shape[0], 96);
}

TEST(SyntheticModelStateTest, OptimizerCommonAndRootAreShapedLikeDeepSpeeds) {
  auto zero = FixtureModel("fp16", state::OptimizerKind::kZero);
  ASSERT_TRUE(zero.ok()) << zero.status();
  auto common = (*zero)->OptimizerCommon();
  ASSERT_TRUE(common.ok());
  std::vector<std::string> keys;
  for (const auto& [k, v] : common->value->dict_items()) keys.push_back(k->str());
  EXPECT_EQ(keys, (std::vector<std::string>{"loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", "zero_stage",
                                            "group_paddings", "partition_count", "ds_version", "param_groups"}));
  auto scaler = pickle::AsLossScaler(*common->value->DictGet("loss_scaler"));
  ASSERT_TRUE(scaler.ok());
  EXPECT_EQ(scaler->class_name, "DynamicLossScaler");
  EXPECT_TRUE(scaler->dynamic);
  EXPECT_EQ(*pickle::AsZeroStage(*common->value->DictGet("zero_stage")), 1);

  auto bf16 = FixtureModel("bf16", state::OptimizerKind::kBf16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  keys.clear();
  for (const auto& [k, v] : (*bf16)->OptimizerCommon()->value->dict_items()) keys.push_back(k->str());
  EXPECT_EQ(keys, (std::vector<std::string>{"clip_grad", "group_paddings", "partition_count", "ds_version",
                                            "param_groups"}));
  keys.clear();
  for (const auto& [k, v] : (*bf16)->ModelStatesRoot(0, 0).value->dict_items()) keys.push_back(k->str());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
                      "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
                      "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples", "dp_world_size",
                      "mp_world_size", "ds_config", "ds_version", "iteration", "args", "random_rng_state",
                      "np_rng_state", "torch_rng_state", "rng_tracker_states", "universal_checkpoint_info"}));
}

// Issue 10: the args record a real head count, and ucp refuses a tp that does
// not divide it, a single head at tp > 1 included.
TEST(SyntheticModelStateTest, HeadCountIsRecordedAndCheckedByReshard) {
  NeoxShape shape;
  ModelSpec spec = NeoxSpec(shape);
  spec.set_lp_dtype("fp32");
  auto heads_of = [](const SyntheticModelState& m) {
    return m.ModelStatesRoot(0, 0).value->DictGet("args")->DictGet("num_attention_heads")->int_value();
  };
  // Derived when the spec has none: the gcd of the partitioned dims.
  auto derived = SyntheticModelState::Make(spec, 1, 1, state::OptimizerKind::kZero);
  ASSERT_TRUE(derived.ok()) << derived.status();
  EXPECT_EQ(heads_of(**derived), SpecAttentionHeads(spec));
  EXPECT_GT(heads_of(**derived), 1);
  const std::string root = FreshTempDir("heads");
  auto reshard_to_tp2 = [&](int64_t heads, const std::string& name) {
    ModelSpec s = spec;
    s.set_num_attention_heads(heads);
    auto m = SyntheticModelState::Make(s, 1, 1, state::OptimizerKind::kZero);
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(heads_of(**m), heads);
    const std::string src = JoinPath(root, name + "/global_step1");
    EXPECT_TRUE(SaveZero(**m, src, state::Topology{1, 1, 1}).ok());
    ops::ReshardOptions o;
    o.input_folder = src;
    o.output_folder = JoinPath(root, name + "_tp2/global_step1");
    o.write.target = state::Topology{2, 1, 1};
    o.write.num_threads = 1;
    auto source = ZeroSourceOptionsFor(s, JoinPath(root, name));
    EXPECT_TRUE(source.ok()) << source.status();
    o.zero_source = *source;
    auto r = ops::Reshard(o);
    return std::make_pair(r.status(), o.output_folder);
  };
  {
    auto [s, out] = reshard_to_tp2(1, "one_head");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr("--tp=2 does not divide the model's num_attention_heads = 1"));
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("a single attention head cannot be split"));
    EXPECT_FALSE(PathExists(out));
  }
  {
    auto [s, out] = reshard_to_tp2(3, "three_heads");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_FALSE(PathExists(out));
  }
  {
    auto [s, out] = reshard_to_tp2(2, "two_heads");
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(PathExists(out));
  }
  // The reshard to tp=1 of a single-head model is fine.
  ModelSpec one = spec;
  one.set_num_attention_heads(1);
  auto m = SyntheticModelState::Make(one, 1, 1, state::OptimizerKind::kZero);
  ASSERT_TRUE(m.ok());
  const std::string src = JoinPath(root, "one_head_tp2src/global_step1");
  ASSERT_TRUE(SaveZero(**m, src, state::Topology{1, 1, 2}).ok());
  ops::ReshardOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(root, "one_head_tp1/global_step1");
  o.write.target = state::Topology{1, 1, 1};
  o.write.num_threads = 1;
  EXPECT_TRUE(ops::Reshard(o).ok());
}

TEST(SyntheticModelStateTest, RejectsInconsistentSpecs) {
  NeoxShape shape;
  ModelSpec spec = NeoxSpec(shape);
  spec.mutable_param(1)->set_group(5);
  EXPECT_EQ(SyntheticModelState::Make(spec, 1, 1, state::OptimizerKind::kZero).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec = NeoxSpec(shape);
  EXPECT_FALSE(SyntheticModelState::Make(spec, 1, 2, state::OptimizerKind::kZero).ok());  // stage 2 + pipeline
  EXPECT_FALSE(SyntheticModelState::Make(spec, 1, 1, state::OptimizerKind::kBf16).ok());  // bf16 needs bf16 weights
  spec.set_num_layers(spec.num_layers() + 1);  // a trailing function layer
  EXPECT_FALSE(SyntheticModelState::Make(spec, 1, 1, state::OptimizerKind::kZero).ok());
}

}  // namespace
}  // namespace ucp::conformance
