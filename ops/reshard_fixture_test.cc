// Acceptance tests of `ucp reshard` against what DeepSpeed 0.14.4 itself saved
// after loading the correct universal checkpoint at a new topology
// (the fixtures' resaved-* folders).
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "ops/convert.h"
#include "readers/compare.h"
#include "readers/zero_checkpoint.h"
#include "format/torch/torch_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/reshard.h"
#include "testing/fixtures.h"

namespace ucp::ops {
namespace {

using ::testing::IsEmpty;
using ucp::testing::FixturePath;
using ucp::testing::FreshTempDir;

// What differs between two checkpoints of the same model state at the same
// topology written by different jobs: the loading job's config and random
// states, which ucp carries over from the source instead.
const std::vector<std::string> kJobState = {"ds_config",     "args",           "random_rng_state",
                                            "np_rng_state",  "torch_rng_state", "rng_tracker_states"};

// DeepSpeed's Adam state dicts list `step` first when saved by a training run
// (ucp writes that order) and last when resaved right after a universal load
// (the resaved-* fixtures): both load the same.
bool IsAdamStateOrder(const std::string& diff) {
  return absl::StrContains(diff, "base_optimizer_state.state.") && absl::EndsWith(diff, "keys in a different order");
}

absl::StatusOr<ReshardResult> DoReshard(const std::string& in, const std::string& out, deepspeed::Topology t) {
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.target = t;
  o.write.num_threads = 2;
  return Reshard(o);
}

// Compares two ZeRO checkpoint folders file by file; in model-state and
// optimizer files the job state above is skipped.
std::vector<std::string> CompareCheckpoints(const std::string& ours, const std::string& theirs) {
  std::vector<std::string> diffs;
  auto fa = readers::ListFilesRecursive(ours);
  auto fb = readers::ListFilesRecursive(theirs);
  if (!fa.ok() || !fb.ok()) return {"cannot list"};
  if (*fa != *fb) {
    diffs.push_back(absl::StrCat("files differ: [", absl::StrJoin(*fa, ", "), "] vs [", absl::StrJoin(*fb, ", "), "]"));
    return diffs;
  }
  for (const auto& f : *fa) {
    auto a = torch::TorchFile::Open(JoinPath(ours, f));
    auto b = torch::TorchFile::Open(JoinPath(theirs, f));
    if (!a.ok() || !b.ok()) {
      diffs.push_back(absl::StrCat(f, ": cannot open"));
      continue;
    }
    const pickle::Value& ra = *(*a)->root();
    const pickle::Value& rb = *(*b)->root();
    // Keys in the same order.
    std::vector<std::string> ka, kb;
    for (const auto& [k, v] : ra.dict_items()) ka.push_back(k->DebugString());
    for (const auto& [k, v] : rb.dict_items()) kb.push_back(k->DebugString());
    if (ka != kb) diffs.push_back(absl::StrCat(f, ": keys [", absl::StrJoin(ka, ", "), "] vs [", absl::StrJoin(kb, ", "), "]"));
    for (const auto& [k, v] : ra.dict_items()) {
      const std::string key = k->is(pickle::Kind::kStr) ? k->str() : "";
      if (std::find(kJobState.begin(), kJobState.end(), key) != kJobState.end()) continue;
      const pickle::Value* w = rb.DictGet(k);
      if (w == nullptr) continue;
      for (const auto& d : readers::CompareTrees(**a, *v, **b, *w)) {
        if (!IsAdamStateOrder(d)) diffs.push_back(absl::StrCat(f, ": ", key, ".", d));
      }
    }
  }
  return diffs;
}

class ReshardFixtureTest : public ::testing::TestWithParam<std::tuple<std::string, deepspeed::Topology>> {};

TEST_P(ReshardFixtureTest, MatchesWhatDeepSpeedSaved) {
  const auto& [fixture, t] = GetParam();
  const std::string name = absl::StrCat("tp", t.tp, "-pp", t.pp, "-dp", t.dp);
  const std::string root = FreshTempDir(absl::StrCat("reshard_", fixture, "_", name));
  auto result = DoReshard(FixturePath(fixture + "/global_step4"), JoinPath(root, "global_step4"), t);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<std::string> diffs =
      CompareCheckpoints(JoinPath(root, "global_step4"), FixturePath(fixture + "/resaved-" + name + "/global_step4"));
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
  auto latest = ReadFileToString(JoinPath(root, "latest"));
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, "global_step4");
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ReshardFixtureTest,
    ::testing::Values(std::make_tuple("neox-tp2-pp1-dp1", deepspeed::Topology{1, 1, 1}),
                      std::make_tuple("neox-tp2-pp1-dp1", deepspeed::Topology{1, 1, 2}),
                      std::make_tuple("neox-tp2-pp1-dp1", deepspeed::Topology{2, 1, 2}),
                      std::make_tuple("neox-tp2-pp1-dp1", deepspeed::Topology{1, 2, 1}),
                      std::make_tuple("neox-bf16-tp2-pp1-dp2", deepspeed::Topology{1, 1, 1})));

}  // namespace
}  // namespace ucp::ops
