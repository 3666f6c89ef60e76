// Version layouts on random models (RapidCheck): a synthetic ZeRO 1/2 model
// saved for DeepSpeed 0.14.4 / 0.16.3 (group_paddings on the last rank) or
// 0.16.4 / 0.19.5 (every rank its own) at a random dp, with tiny groups whose
// padding covers whole partitions, holds in every optimizer file the
// group_paddings and fp32 partition sizes computed here from DeepSpeed's
// formulas (stage_1_and_2.py at each tag), reads back as exactly its
// tensors, and reshards to another dp and version with the same tensors.
#include <string>
#include <vector>

#include "ops/training_state.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "conformance/synthetic_state.h"
#include "gtest/gtest.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "rapidcheck.h"
#include "rapidcheck/gtest.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"
#include "formats/deepspeed_zero/zero_writer.h"

namespace ucp::conformance {
namespace {

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// DeepSpeed's group_paddings entry of `rank` (independent of layout_math).
int64_t ExpectedPadding(int64_t numel, int dp, int rank, bool per_rank) {
  const int64_t align = 2 * dp;
  const int64_t padded = (numel + align - 1) / align * align;
  const int64_t part = padded / dp;
  if (!per_rank) return rank == dp - 1 ? padded - numel : 0;  // <= 0.16.3
  const int64_t left = rank * part;                            // >= 0.16.4
  if (numel <= left) return part;
  if (numel < left + part) return left + part - numel;
  return 0;
}

// Python's len(group[:part - padding]).
int64_t ExpectedLean(int64_t part, int64_t padding) {
  const int64_t stop = part - padding;
  return stop >= 0 ? stop : std::max<int64_t>(0, part + stop);
}

void CheckFiles(const state::ModelInfo& info, const std::string& dir, int dp, bool per_rank,
                const std::string& version) {
  std::vector<int64_t> numel(info.num_groups, 0);
  for (const auto& p : info.params) {
    if (p.trainable()) numel[p.group] += Numel(p.full_shape);
  }
  for (int d = 0; d < dp; ++d) {
    auto f = torch::TorchFile::Open(JoinPath(dir, absl::StrCat("zero_pp_rank_", d, "_mp_rank_00_optim_states.pt")));
    RC_ASSERT(f.ok());
    const pickle::Value* osd = (*f)->root()->DictGet("optimizer_state_dict");
    RC_ASSERT(osd->DictGet("ds_version")->str() == version);
    const auto& paddings = osd->DictGet("group_paddings")->items();
    const auto& fp32 = osd->DictGet("single_partition_of_fp32_groups")->items();
    RC_ASSERT(static_cast<int>(paddings.size()) == info.num_groups);
    for (int g = 0; g < info.num_groups; ++g) {
      const int64_t want = ExpectedPadding(numel[g], dp, d, per_rank);
      RC_ASSERT(paddings[g]->int_value() == want);
      auto t = (*f)->GetTensor(*fp32[g]);
      RC_ASSERT(t.ok());
      const int64_t align = 2 * dp;
      const int64_t part = (numel[g] + align - 1) / align * align / dp;
      RC_ASSERT(t->numel() == ExpectedLean(part, want));
    }
  }
}

void CheckTensors(const SyntheticModelState& m, const std::string& dir) {
  ops::SourceOptions whole;
  whole.tp1_whole_tensors = true;
  auto s = ops::OpenModelState(dir, whole, false);
  RC_ASSERT(s.ok());
  for (const auto& p : m.info().params) {
    if (!p.trainable()) continue;
    const state::ParamState* q = (*s)->info().Find(p.name);
    RC_ASSERT(q != nullptr);
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto want = m.Full(p, state);
      auto got = (*s)->Full(*q, state);
      RC_ASSERT(want.ok());
      RC_ASSERT(got.ok());
      auto eq = tp::TensorPlan::BitwiseEqual(*want, *got);
      RC_ASSERT(eq.ok());
      RC_ASSERT(*eq);
    }
  }
}

RC_GTEST_PROP(VersionConformanceTest, PaddingConventionsRoundTrip, ()) {
  const int n = *rc::gen::inRange(1, 6);
  const int groups = std::min(n, *rc::gen::inRange(1, 4));
  ModelSpec spec;
  spec.set_style("gpt-neox");
  spec.set_pipeline(false);
  spec.set_num_layers(1);
  spec.set_lp_dtype("fp32");
  spec.set_num_groups(groups);
  spec.set_rules_source("rules_file");
  for (int i = 0; i < n; ++i) {
    ModelParam* p = spec.add_param();
    p->set_name(absl::StrCat("blocks.", i, ".weight"));
    p->set_local_name(p->name());
    // Tiny params: groups smaller than a partition, padding over whole ranks.
    const int dims = *rc::gen::inRange(1, 3);
    for (int d = 0; d < dims; ++d) p->add_shape(*rc::gen::inRange(1, 6));
    p->mutable_rule()->set_pattern(p->name());
    p->mutable_rule()->set_kind(REPLICATED);
    p->set_group(i < groups ? i : *rc::gen::inRange(0, groups));
    p->set_role("trainable");
    p->set_layer(-1);
  }
  const int stage = *rc::gen::element(1, 2);
  auto m = SyntheticModelState::Make(spec, *rc::gen::inRange<uint64_t>(1, 1000000), stage,
                                     state::OptimizerKind::kZero);
  RC_ASSERT(m.ok());
  const std::vector<std::pair<std::string, bool>> versions = {
      {"0.14.4", false}, {"0.16.3", false}, {"0.16.4", true}, {"0.19.5", true}};
  const auto [v1, per1] = *rc::gen::elementOf(versions);
  const auto [v2, per2] = *rc::gen::elementOf(versions);
  const int dp1 = *rc::gen::inRange(1, 9);
  const int dp2 = *rc::gen::inRange(1, 9);
  const std::string root = testing::FreshTempDir("version_conformance");
  writers::ZeroWriteOptions o;
  o.target = state::Topology{1, 1, dp1};
  o.target_ds_version = v1;
  o.num_threads = 1;
  const std::string a = JoinPath(root, "a/global_step1");
  auto written = ops::WriteTrainingState(**m, a, o);
  RC_ASSERT(written.ok());
  CheckFiles((*m)->info(), a, dp1, per1, v1);
  CheckTensors(**m, a);
  ops::ReshardOptions r;
  r.input_folder = a;
  r.output_folder = JoinPath(root, "b/global_step1");
  r.write.target = state::Topology{1, 1, dp2};
  r.write.target_ds_version = v2;
  r.write.num_threads = 1;
  auto resharded = ops::Reshard(r);
  RC_ASSERT(resharded.ok());
  CheckFiles((*m)->info(), r.output_folder, dp2, per2, v2);
  CheckTensors(**m, r.output_folder);
}

}  // namespace
}  // namespace ucp::conformance
