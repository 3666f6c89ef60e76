// Round trips and DeepSpeed-written universal sources for `ucp reshard`.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "testing/compare.h"
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

std::string DoReshard(const std::string& in, const std::string& out, state::Topology t) {
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.target = t;
  o.write.num_threads = 2;
  auto r = Reshard(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return out;
}

std::vector<std::string> Diff(const std::string& a, const std::string& b, const std::vector<std::string>& ignore = {},
                              bool ignore_key_order = false) {
  testing::CompareOptions o;
  o.ignore_key_order = ignore_key_order;
  auto d = testing::CompareFolders(a, b, ignore, o);
  if (!d.ok()) return {d.status().ToString()};
  return *d;
}

// The random states of model-parallel ranks that an intermediate topology
// does not have cannot survive it (a checkpoint holds one per rank); every
// other key and tensor must.
std::vector<std::string> WithoutLostRngStates(const std::vector<std::string>& diffs,
                                              const std::vector<std::string>& lost_files) {
  std::vector<std::string> out;
  for (const auto& d : diffs) {
    bool lost = false;
    for (const auto& f : lost_files) {
      for (const char* key : {"random_rng_state", "np_rng_state", "torch_rng_state", "rng_tracker_states"}) {
        lost |= absl::StartsWith(d, absl::StrCat(f, ": ", key));
      }
    }
    if (!lost) out.push_back(d);
  }
  return out;
}

// tp=1 -> tp=2 -> tp=1 and pp=2 -> pp=1 -> pp=2 give back the original files,
// every key and tensor, bitwise.
TEST(ReshardRoundTripTest, Tp1ToTp2ToTp1IsIdentity) {
  const std::string src = FixturePath("neox-tp1-pp2-dp1/global_step4");
  const std::string root = FreshTempDir("rt_tp");
  DoReshard(src, JoinPath(root, "tp2/global_step4"), {2, 2, 1});
  DoReshard(JoinPath(root, "tp2/global_step4"), JoinPath(root, "back/global_step4"), {1, 2, 1});
  EXPECT_THAT(Diff(JoinPath(root, "back/global_step4"), src), IsEmpty());
}

TEST(ReshardRoundTripTest, Pp2ToPp1ToPp2IsIdentity) {
  const std::string src = FixturePath("neox-tp1-pp2-dp1/global_step4");
  const std::string root = FreshTempDir("rt_pp");
  DoReshard(src, JoinPath(root, "pp1/global_step4"), {1, 1, 1});
  DoReshard(JoinPath(root, "pp1/global_step4"), JoinPath(root, "back/global_step4"), {1, 2, 1});
  EXPECT_THAT(WithoutLostRngStates(Diff(JoinPath(root, "back/global_step4"), src), {"mp_rank_01_model_states.pt"}),
              IsEmpty());
}

TEST(ReshardRoundTripTest, DpAndTpRoundTripThroughEveryShape) {
  const std::string src = FixturePath("neox-tp2-pp1-dp2/global_step4");
  const std::string root = FreshTempDir("rt_mix");
  DoReshard(src, JoinPath(root, "a/global_step4"), {1, 2, 3});
  DoReshard(JoinPath(root, "a/global_step4"), JoinPath(root, "b/global_step4"), {4, 1, 1});
  DoReshard(JoinPath(root, "b/global_step4"), JoinPath(root, "back/global_step4"), {2, 1, 2});
  EXPECT_THAT(WithoutLostRngStates(Diff(JoinPath(root, "back/global_step4"), src), {"mp_rank_01_model_states.pt"}),
              IsEmpty());
}

// A plain-module ZeRO-2 checkpoint (module state dict in the mp_rank files,
// with its _metadata) survives a round trip through tp=1, dp=3.
TEST(ReshardRoundTripTest, Zero2PlainModuleRoundTrip) {
  const std::string src = FixturePath("gpt-zero2-nopipe-tp2-dp2/global_step4");
  const std::string root = FreshTempDir("rt_zero2");
  DoReshard(src, JoinPath(root, "tp1/global_step4"), {1, 1, 3});
  DoReshard(JoinPath(root, "tp1/global_step4"), JoinPath(root, "back/global_step4"), {2, 1, 2});
  EXPECT_THAT(WithoutLostRngStates(Diff(JoinPath(root, "back/global_step4"), src), {"mp_rank_01_model_states.pt"}),
              IsEmpty());
}

// The layout of a reshard to tp=2/dp=2 is that of a separate DeepSpeed run at
// tp=2/dp=2: same files and keys, partition sizes, param_slice_mappings and
// group_paddings (only the trained values differ).
TEST(ReshardLayoutTest, MatchesSeparateRunAtThatTopology) {
  const std::string root = FreshTempDir("layout_tp2_dp2");
  const std::string ours =
      DoReshard(FixturePath("neox-tp2-pp1-dp1/global_step4"), JoinPath(root, "global_step4"), {2, 1, 2});
  const std::string theirs = FixturePath("neox-tp2-pp1-dp2/global_step4");
  auto fa = testing::ListFilesRecursive(ours);
  auto fb = testing::ListFilesRecursive(theirs);
  ASSERT_TRUE(fa.ok() && fb.ok());
  EXPECT_EQ(*fa, *fb);
  int checked_mappings = 0;
  for (const auto& f : *fa) {
    auto a = torch::TorchFile::Open(JoinPath(ours, f));
    auto b = torch::TorchFile::Open(JoinPath(theirs, f));
    ASSERT_TRUE(a.ok() && b.ok()) << f;
    for (const auto& d : testing::CompareTrees(**a, *(*a)->root(), **b, *(*b)->root(), {1000, false})) {
      // Values differ (another training run); nothing else may.
      const bool values = absl::StrContains(d, "tensor bytes differ") ||
                          absl::StartsWith(d, "random_rng_state") || absl::StartsWith(d, "np_rng_state") ||
                          absl::StartsWith(d, "args.") || absl::StartsWith(d, "ds_config.");
      EXPECT_TRUE(values) << f << ": " << d;
    }
    if (absl::StrContains(f, "optim_states")) {
      const pickle::Value* osd = (*a)->root()->DictGet("optimizer_state_dict");
      const pickle::Value* osd_b = (*b)->root()->DictGet("optimizer_state_dict");
      ASSERT_NE(osd, nullptr);
      for (const char* key : {"param_slice_mappings", "group_paddings", "partition_count"}) {
        EXPECT_TRUE(pickle::DeepEqual(*osd->DictGet(key), *osd_b->DictGet(key))) << f << " " << key;
        ++checked_mappings;
      }
    }
  }
  EXPECT_EQ(checked_mappings, 4 * 3);
}

// DeepSpeed's own universal output where it is correct (tp=1, pp=2) reshards
// to the original checkpoint; DeepSpeed's universal folder records no layer
// structure, so ucp also writes (empty) files for function layers, which
// DeepSpeed never reads.
TEST(ReshardUniversalTest, DeepSpeedUniversalReshardsToTheOriginal) {
  const std::string root = FreshTempDir("ds_universal_tp1");
  const std::string ours = DoReshard(FixturePath("neox-tp1-pp2-dp1/global_step4_universal_deepspeed"),
                                     JoinPath(root, "global_step4"), {1, 2, 1});
  const std::string original = FixturePath("neox-tp1-pp2-dp1/global_step4");
  // Nor does it record the key order inside layer files (load_state_dict
  // matches keys by name).
  EXPECT_THAT(Diff(ours, original, {"layer_10-model_00-model_states.pt"}, /*ignore_key_order=*/true), IsEmpty());
  auto extra = torch::TorchFile::Open(JoinPath(ours, "layer_10-model_00-model_states.pt"));
  ASSERT_TRUE(extra.ok());
  EXPECT_TRUE((*extra)->root()->dict_items().empty());
}

// Raising tp from DeepSpeed's tp=1 universal output: its metadata says cat_dim
// 0 for row-parallel weights (DeepSpeed then loads them scrambled); the
// gpt-neox preset re-merges them, so the result equals resharding the ZeRO
// checkpoint itself.
TEST(ReshardUniversalTest, DeepSpeedUniversalRaisesTpCorrectly) {
  const std::string root = FreshTempDir("ds_universal_raise_tp");
  const std::string from_universal = DoReshard(FixturePath("neox-tp1-pp2-dp1/global_step4_universal_deepspeed"),
                                               JoinPath(root, "u/global_step4"), {2, 1, 1});
  const std::string from_zero =
      DoReshard(FixturePath("neox-tp1-pp2-dp1/global_step4"), JoinPath(root, "z/global_step4"), {2, 1, 1});
  EXPECT_THAT(Diff(from_universal, from_zero, {"layer_10-model_00-model_states.pt", "layer_10-model_01-model_states.pt"},
                   /*ignore_key_order=*/true),
              IsEmpty());
}

// DeepSpeed's broken tp=2 universal output (replicated params doubled,
// row-parallel weights stacked on dim 0) reshards correctly to tp=1: equal,
// bitwise, to resharding the ZeRO checkpoint.
TEST(ReshardUniversalTest, RepairsDeepSpeedsBrokenTp2Output) {
  const std::string root = FreshTempDir("ds_universal_repair");
  const std::string repaired = DoReshard(FixturePath("neox-tp2-pp1-dp1/global_step4_universal_deepspeed"),
                                         JoinPath(root, "u/global_step4"), {1, 1, 1});
  const std::string from_zero =
      DoReshard(FixturePath("neox-tp2-pp1-dp1/global_step4"), JoinPath(root, "z/global_step4"), {1, 1, 1});
  EXPECT_THAT(Diff(repaired, from_zero, {"layer_10-model_00-model_states.pt"}, /*ignore_key_order=*/true), IsEmpty());
}

}  // namespace
}  // namespace ucp::ops
