// MoeState on damaged copies of the real DeepSpeed 0.19.5 native MoE fixture:
// optimizer states the reader must refuse, naming the file, the group and the
// state, instead of reading past their storage or mixing states up.
#include "formats/deepspeed_moe/moe_state.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/pickle/value.h"
#include "gtest/gtest.h"
#include "testing/damage.h"
#include "testing/fixtures.h"

namespace ucp::deepspeed_moe {
namespace {

using ucp::testing::FreshTempDir;
using ucp::testing::VersionFixturePath;

constexpr char kFixture[] = "gpt-moe-ep2-zero2-dp2/global_step4";
constexpr char kOptim0[] = "zero_pp_rank_0_mp_rank_00_optim_states.pt";

// A copy of the fixture's tag folder with `op` (testdata/python/mutate_checkpoint.py)
// applied to rank 0's optimizer file.
std::string DamagedCopy(const std::string& name, const std::string& op) {
  const std::string dir = JoinPath(FreshTempDir(name), "global_step4");
  EXPECT_TRUE(CopyTree(VersionFixturePath("0.19.5", kFixture), dir).ok());
  auto out = ucp::testing::RunCommand(absl::StrCat(ucp::testing::kPython, " ",
                                                   ucp::testing::RunfilePath("testdata/python/mutate_checkpoint.py"),
                                                   " ", JoinPath(dir, kOptim0), " ", op));
  EXPECT_TRUE(out.ok()) << out.status();
  return dir;
}

TEST(MoeStateTest, TheFixtureOpens) {
  auto s = MoeState::Open(VersionFixturePath("0.19.5", kFixture));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->info().num_groups, 4);
  EXPECT_EQ((*s)->info().state_keys, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
}

// An exp_avg whose strides repeat elements (1280 elements over a storage of
// 640) would make every writer emit bytes the file does not have.
TEST(MoeStateTest, OverlappingStateViewIsRefused) {
  const std::string dir =
      DamagedCopy("moe_overlap", "overlap optimizer_state_dict.base_optimizer_state.state.1.exp_avg");
  auto s = MoeState::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_EQ(s.status().message(),
            absl::StrCat(JoinPath(dir, kOptim0),
                         ": state[1].exp_avg views 1280 elements of a storage of 640 (overlapping strides)"));
}

// Every group holds the states of group 0 (one optimizer): a group with
// other state names is refused rather than read under group 0's names.
TEST(MoeStateTest, GroupWithOtherStatesIsRefused) {
  const std::string dir = DamagedCopy(
      "moe_state_names", "rename-key optimizer_state_dict.base_optimizer_state.state.2 exp_avg_sq exp_avg_sq_x");
  auto s = MoeState::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_EQ(s.status().message(),
            absl::StrCat(JoinPath(dir, kOptim0),
                         ": group 2 has optimizer states [exp_avg, exp_avg_sq_x], group 0 has [exp_avg, exp_avg_sq]"));
}

// Real DeepSpeed 0.19.5 saves at tp 2 dp 2 (testdata/moe_tp): the one whose
// every tp rank has model states (ep 2) is read (its tensors against the saving
// job's dumps: //ops:moe_tp_test), the one DeepSpeed itself cannot load (ep 1:
// no mp_rank_01 model states) refused.
constexpr char kSupportedTail[] =
    "ucp reads native MoE checkpoints of ZeRO stage 1/2 (DeepSpeedZeroOptimizer) at any pp, and at tp > 1 when every "
    "tp rank has model states (ep >= tp)";

TEST(MoeStateTest, TensorParallelSaveOpensWithWholeExperts) {
  const std::string dir = ucp::testing::RunfilePath("testdata/moe_tp/ds0195_tp2_ep2_zero1_dp2/global_step3");
  auto s = MoeState::Open(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  const state::ModelInfo& info = (*s)->info();
  EXPECT_EQ(info.source_topology.tp, 2);
  EXPECT_EQ(info.source_topology.dp, 2);
  EXPECT_EQ(info.expert_parallel, 2);
  int experts = 0, dense = 0;
  for (const state::ParamState& p : info.params) {
    std::string prefix, suffix;
    int id = 0;
    if (SplitExpertName(p.name, &prefix, &id, &suffix)) {
      ++experts;
      EXPECT_TRUE(p.tp_whole) << p.name;
      EXPECT_EQ(p.tp_shapes.size(), 1u) << p.name;
    } else {
      ++dense;
      EXPECT_FALSE(p.tp_whole) << p.name;
      EXPECT_EQ(p.tp_shapes.size(), 2u) << p.name;
    }
  }
  EXPECT_EQ(experts, 8);
  EXPECT_EQ(dense, 10);
  EXPECT_EQ(info.Find("sequential.0.word_embeddings.weight")->tp_shapes,
            (std::vector<std::vector<int64_t>>{{8, 8}, {8, 8}}));
  EXPECT_EQ((*s)->ExpertPath(0, 1), JoinPath(dir, "layer_0_expert_1_mp_rank_01_model_states.pt"));
}

// An expert file under another mp rank than the one its ep rank writes from
// (ep rank 1 is global rank 1, tp rank 1): refused, not read as placed.
TEST(MoeStateTest, ExpertFileUnderTheWrongTpRankIsRefused) {
  const std::string src = ucp::testing::RunfilePath("testdata/moe_tp/ds0195_tp2_ep2_zero1_dp2/global_step3");
  const std::string dir = JoinPath(FreshTempDir("moe_tp_misplaced"), "global_step3");
  ASSERT_TRUE(CopyTree(src, dir).ok());
  ASSERT_EQ(std::rename(JoinPath(dir, "layer_0_expert_1_mp_rank_01_model_states.pt").c_str(),
                        JoinPath(dir, "layer_0_expert_1_mp_rank_00_model_states.pt").c_str()),
            0);
  auto s = MoeState::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_EQ(s.status().message(),
            absl::StrCat(JoinPath(dir, "layer_0_expert_1_mp_rank_00_model_states.pt"),
                         ": expert 1 of MoE layer 0 is ep rank 1's (ep 2), written under mp_rank_01 at tp 2, found "
                         "mp rank 0"));
}

// A tp rank's optimizer file missing (global rank 3: dp rank 1, tp rank 1):
// refused naming it.
TEST(MoeStateTest, MissingOptimizerFileOfATpRankIsRefused) {
  const std::string src = ucp::testing::RunfilePath("testdata/moe_tp/ds0195_tp2_ep2_zero1_dp2/global_step3");
  const std::string dir = JoinPath(FreshTempDir("moe_tp_missing_optim"), "global_step3");
  ASSERT_TRUE(CopyTree(src, dir).ok());
  ASSERT_EQ(std::remove(JoinPath(dir, "zero_pp_rank_1_mp_rank_01_optim_states.pt").c_str()), 0);
  auto s = MoeState::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_EQ(s.status().message(), absl::StrCat(JoinPath(dir, "zero_pp_rank_1_mp_rank_01_optim_states.pt"),
                                               ": missing (dp_world_size 2, tp 2)"));
}

TEST(MoeStateTest, TensorParallelSaveWithoutModelStatesOfATpRankIsRefused) {
  const std::string dir = ucp::testing::RunfilePath("testdata/moe_tp/ds0195_tp2_ep1_zero2_dp2/global_step3");
  auto s = MoeState::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_EQ(s.status().message(),
            absl::StrCat(dir, ": DeepSpeed 0.19.5 native mixture-of-experts checkpoint at tp 2 without "
                              "mp_rank_01_model_states.pt (DeepSpeed writes a tp rank's model states on expert data "
                              "parallel rank 0 only, so at ep < tp tp rank 1's dense slices are in no model-states "
                              "file; DeepSpeed's own load refuses this folder too): ",
                         kSupportedTail));
}

// The optimizer files' flat partitions are CRC-checked when read (not at
// open: a command checks only the records it uses): a byte flipped in rank
// 1's fp32 partition of group 0 opens, and is reported, naming the file, by
// the first read of it and by VerifyInput; the other records still read.
TEST(MoeStateTest, DamagedPartitionIsCaughtWhenRead) {
  const std::string src = ucp::testing::RunfilePath("testdata/moe_tp/ds0195_tp2_ep2_zero1_dp2/global_step3");
  const std::string dir = JoinPath(FreshTempDir("moe_damaged_partition"), "global_step3");
  ASSERT_TRUE(CopyTree(src, dir).ok());
  const std::string f = JoinPath(dir, "zero_pp_rank_0_mp_rank_01_optim_states.pt");  // global rank 1
  ASSERT_TRUE(ucp::testing::FlipByteInTensor(f, [](const pickle::Value& root) -> const pickle::Value* {
                const pickle::Value* fp32s =
                    root.DictGet("optimizer_state_dict")->DictGet("single_partition_of_fp32_groups");
                return fp32s == nullptr ? nullptr : fp32s->items()[0].get();
              }).ok());
  auto s = MoeState::Open(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  int damaged = 0;
  for (const auto& p : (*s)->info().params) {
    if (p.group != 0) continue;
    auto fp32 = (*s)->Slices(p, 0, "fp32");
    if (fp32.ok()) continue;
    ++damaged;
    EXPECT_EQ(fp32.status().code(), absl::StatusCode::kDataLoss) << fp32.status();
    EXPECT_NE(fp32.status().message().find(f), std::string::npos) << fp32.status();
  }
  EXPECT_GT(damaged, 0);
  auto exp_avg = (*s)->Slices((*s)->info().params[0], 0, "exp_avg");
  EXPECT_TRUE(exp_avg.ok()) << exp_avg.status();
  const absl::Status v = (*s)->VerifyInput(f);
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss) << v;
  EXPECT_TRUE((*s)->VerifyInput(JoinPath(dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt")).ok());
}

}  // namespace
}  // namespace ucp::deepspeed_moe
