// ZeRO-3 conformance on random models (RapidCheck): a synthetic model saved
// as ZeRO-3 by DeepSpeed V1 (0.12 to 0.19.5) at dp1 with sub_group_size s1
// reads back (formats/deepspeed_zero3/zero3_state.h) as exactly its tensors; resharded to dp2
// with s2 for V2 (--target_ds_version) it reads back the same; every
// sub-group's step is a tensor of its own; the sub-groups are the ones
// DeepSpeed cuts (Zero3SubGroups) at each dp; every file records its
// version, and checkpoint_parallel_dimensions from 0.19.5 on only. Converted
// for V3, the universal folder is written only for a loader that reads it
// (stage-3 universal loading from 0.15.0, several param groups from 0.18.0:
// stage3.py at each tag) and then holds every param's flat tensors; otherwise
// the refusal names the version and nothing is left behind.
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <string>
#include <vector>

#include "ops/training_state.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "conformance/synthetic_state.h"
#include "gtest/gtest.h"
#include "ops/convert.h"
#include "ops/reshard.h"
#include "rapidcheck.h"
#include "formats/deepspeed_zero3/zero3_state.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"
#include "formats/deepspeed_zero/zero_writer.h"
#include "writers/target_options.h"

namespace ucp::conformance {
namespace {

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Every trainable tensor of `dir` (a ZeRO-3 folder) equals the model's.
void CheckReadsBack(const SyntheticModelState& m, const std::string& dir, int dp, int64_t sub_group_size) {
  auto z = deepspeed_zero3::Zero3State::Open(dir);
  RC_ASSERT(z.ok());
  const state::ModelInfo& info = (*z)->info();
  RC_ASSERT(info.source_topology.dp == dp);
  int expected_sub_groups = 0;
  for (int g = 0; g < m.info().num_groups; ++g) {
    std::vector<int64_t> numels;
    for (const auto& p : m.info().params) {
      if (p.trainable() && p.group == g) numels.push_back(Numel(p.full_shape));
    }
    expected_sub_groups += static_cast<int>(deepspeed_zero3::Zero3SubGroups(numels, dp, sub_group_size).size());
  }
  RC_ASSERT((*z)->num_sub_groups() == expected_sub_groups);
  for (const auto& p : m.info().params) {
    if (!p.trainable()) continue;
    const state::ParamState* q = info.Find(p.name);
    RC_ASSERT(q != nullptr);
    RC_ASSERT(q->group == p.group);
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto want = m.Full(p, state);
      auto got = (*z)->Slices(*q, 0, state);
      RC_ASSERT(want.ok());
      RC_ASSERT(got.ok());
      RC_ASSERT(got->size() == 1u);
      auto eq = tp::TensorPlan::BitwiseEqual(*want, (*got)[0]);
      RC_ASSERT(eq.ok());
      RC_ASSERT(*eq);
    }
  }
  // Each sub-group's step: a tensor of its own.
  auto f = torch::TorchFile::Open(JoinPath(dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  RC_ASSERT(f.ok());
  const pickle::Value* state =
      (*f)->root()->DictGet("optimizer_state_dict")->DictGet("optimizer_state_dict")->DictGet("state");
  std::set<const torch::Storage*> steps;
  for (const auto& [k, v] : state->dict_items()) {
    auto t = (*f)->GetTensor(*v->DictGet("step"));
    RC_ASSERT(t.ok());
    steps.insert(t->storage().get());
  }
  RC_ASSERT(static_cast<int>(steps.size()) == expected_sub_groups);
}

std::tuple<int, int, int> Version(const std::string& v) {
  int a = 0, b = 0, c = 0;
  (void)sscanf(v.c_str(), "%d.%d.%d", &a, &b, &c);
  return {a, b, c};
}

// The version `dir`'s files record, and the 0.19.5 key only from 0.19.5 on.
void CheckVersion(const std::string& dir, int dp, const std::string& version) {
  const bool parallel_dims = Version(version) >= std::make_tuple(0, 19, 5);
  for (int d = 0; d < dp; ++d) {
    for (const std::string kind : {"model", "optim"}) {
      auto f = torch::TorchFile::Open(JoinPath(dir, absl::StrCat("zero_pp_rank_", d, "_mp_rank_00_", kind, "_states.pt")));
      RC_ASSERT(f.ok());
      const pickle::Value* v = (*f)->root()->DictGet("ds_version");
      RC_ASSERT(v != nullptr);
      RC_ASSERT(v->str() == version);
      if (kind == "model") {
        RC_ASSERT(((*f)->root()->DictGet("checkpoint_parallel_dimensions") != nullptr) == parallel_dims);
      }
    }
  }
}

const std::vector<std::string> kVersions = {"0.12.6", "0.14.4", "0.15.4", "0.16.4", "0.17.6",
                                            "0.18.0", "0.18.9", "0.19.4", "0.19.5"};

// How often each value was drawn, printed after the run.
std::map<std::string, std::map<std::string, int>> g_dist;

void SaveReadReshardConvert() {
  const int n = *rc::gen::inRange(1, 9);
  const int groups = std::min(n, *rc::gen::inRange(1, 4));
  ModelSpec spec;
  spec.set_style("gpt-neox");
  spec.set_pipeline(false);
  spec.set_num_layers(1);
  spec.set_lp_dtype(*rc::gen::element<std::string>("fp32", "fp16"));
  spec.set_num_groups(groups);
  spec.set_rules_source("rules_file");
  for (int i = 0; i < n; ++i) {
    ModelParam* p = spec.add_param();
    p->set_name(absl::StrCat("blocks.", i, ".weight"));
    p->set_local_name(p->name());
    const int dims = *rc::gen::inRange(1, 3);
    for (int d = 0; d < dims; ++d) p->add_shape(*rc::gen::inRange(1, 24));
    p->mutable_rule()->set_pattern(p->name());
    p->mutable_rule()->set_kind(REPLICATED);
    p->set_group(i < groups ? i : *rc::gen::inRange(0, groups));
    p->set_role("trainable");
    p->set_layer(-1);
  }
  const uint64_t seed = *rc::gen::inRange<uint64_t>(1, 1000000);
  SyntheticVersion v1;
  v1.ds_version = *rc::gen::elementOf(kVersions);
  v1.numpy2 = *rc::gen::arbitrary<bool>();
  const std::string v2 = *rc::gen::elementOf(kVersions);
  const std::string v3 = *rc::gen::elementOf(kVersions);
  ++g_dist["ds_version T1"][v1.ds_version];
  ++g_dist["ds_version T2"][v2];
  ++g_dist["groups"][groups > 1 ? ">1" : "1"];
  auto m = SyntheticModelState::Make(spec, seed, /*zero_stage=*/2, state::OptimizerKind::kZero, v1);
  RC_ASSERT(m.ok());
  const int dp1 = *rc::gen::inRange(1, 5);
  const int dp2 = *rc::gen::inRange(1, 5);
  const int64_t s1 = *rc::gen::element<int64_t>(1, 7, 40, 1000000000);
  const int64_t s2 = *rc::gen::element<int64_t>(1, 13, 100, 1000000000);
  const std::string root = testing::FreshTempDir("zero3_conformance");
  writers::ZeroWriteOptions o;
  o.target = state::Topology{1, 1, dp1};
  o.zero_stage = 3;
  o.sub_group_size = s1;
  o.num_threads = 1;
  // Some writes cut their optimizer files into pieces of 16 to 512 bytes,
  // written by separate units (writers::OptimPieces): they must read back
  // as exactly the model's tensors, their record CRCs intact.
  o.piece_bytes = *rc::gen::element<int64_t>(-1, 16, 64, 512);
  {
    // Whether rank 0's optimizer file (fp32 and 2 Adam states) is cut.
    int64_t numel = 0;
    for (const ModelParam& p : spec.param()) numel += Numel(std::vector<int64_t>(p.shape().begin(), p.shape().end()));
    ++g_dist["optimizer file at T1"][writers::OptimPieces(numel / dp1 * 12, o.piece_bytes) > 1 ? "in pieces" : "whole"];
  }
  const std::string a = JoinPath(root, "a/global_step1");
  auto written = ops::WriteTrainingState(**m, a, o);
  RC_ASSERT(written.ok());
  CheckReadsBack(**m, a, dp1, s1);
  CheckVersion(a, dp1, v1.ds_version);
  ops::ReshardOptions r;
  r.input_folder = a;
  r.output_folder = JoinPath(root, "b/global_step1");
  r.write.target = state::Topology{1, 1, dp2};
  r.write.sub_group_size = s2;
  r.write.target_ds_version = v2;
  r.write.num_threads = *rc::gen::inRange(1, 4);
  r.write.piece_bytes = *rc::gen::element<int64_t>(-1, 16, 64, 512);
  auto resharded = ops::Reshard(r);
  RC_ASSERT(resharded.ok());
  CheckReadsBack(**m, r.output_folder, dp2, s2);
  CheckVersion(r.output_folder, dp2, v2);
  // Convert for V3's stage-3 universal loader.
  ops::ConvertOptions c;
  c.input_folder = a;
  c.output_folder = JoinPath(root, "u/global_step1_universal");
  c.write.target_ds_version = v3;
  c.write.num_threads = 1;
  const absl::Status converted = ops::Convert(c).status();
  // Before 0.18 the loader reads one param group with one sub-group (rank
  // 0's group 0 as DeepSpeed cut it at dp1 with s1).
  std::vector<int64_t> group0;
  for (const auto& p : (*m).get()->info().params) {
    if (p.trainable() && p.group == 0) group0.push_back(Numel(p.full_shape));
  }
  const bool one_sub_group = groups == 1 && deepspeed_zero3::Zero3SubGroups(group0, dp1, s1).size() == 1;
  const bool loadable =
      Version(v3) >= std::make_tuple(0, 15, 0) && (one_sub_group || Version(v3) >= std::make_tuple(0, 18, 0));
  ++g_dist["convert"][absl::StrCat(loadable ? "written for " : "refused for ", v3)];
  if (!loadable) {
    RC_ASSERT(converted.code() == absl::StatusCode::kFailedPrecondition);
    RC_ASSERT(std::string(converted.message()).find(v3) != std::string::npos);
    RC_ASSERT(!PathExists(c.output_folder));
    return;
  }
  RC_ASSERT(converted.ok());
  // DeepSpeed's stage-3 universal files: each param's raw flat tensors.
  for (const auto& p : (*m).get()->info().params) {
    if (!p.trainable()) continue;
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto f = torch::TorchFile::Open(JoinPath(c.output_folder, absl::StrCat("zero/", p.name, "/", state, ".pt")));
      RC_ASSERT(f.ok());
      auto t = (*f)->GetTensor(*(*f)->root());
      RC_ASSERT(t.ok());
      auto want = (*m)->Tensor(p.name, state);
      RC_ASSERT(want.ok());
      RC_ASSERT(t->sizes() == std::vector<int64_t>{want->numel()});
      RC_ASSERT(t->ContiguousBytes() == want->ContiguousBytes());
    }
  }
}

TEST(Zero3ConformanceTest, SaveReadReshardConvert) {
  g_dist.clear();
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  rc::detail::TestMetadata metadata;
  metadata.id = "zero3_conformance";
  metadata.description = "ZeRO-3 save / read / reshard / convert across versions";
  const rc::detail::TestResult result = rc::detail::checkTestable(&SaveReadReshardConvert, metadata, params);
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  for (const auto& [dim, values] : g_dist) {
    std::cout << "  " << dim << " ";
    for (const auto& [k, n] : values) std::cout << " " << k << ":" << n;
    std::cout << "\n";
  }
  EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << os.str();
}

}  // namespace
}  // namespace ucp::conformance
