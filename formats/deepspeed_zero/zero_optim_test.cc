// The ZeRO-1/2 reader's optimizer files, parsed by the shared flat-group
// parser (deepspeed/flat_optim_file.h) on the real DeepSpeed 0.19.5 ZeRO-1
// fixture (3 param groups, the last of one element in partitions of 2) and on
// damaged copies of it,
// which the reader must refuse naming the file, the group and the state.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"

namespace ucp::deepspeed_zero {
namespace {

using ucp::testing::FreshTempDir;
using ucp::testing::VersionFixturePath;

constexpr char kFixture[] = "gpt-zero1-padding-dp2/global_step4";
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

TEST(ZeroOptimFileTest, EveryGroupsPartitionStatesAndScalars) {
  auto c = ZeroCheckpoint::Open(VersionFixturePath("0.19.5", kFixture));
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> states = {"exp_avg", "exp_avg_sq"};
  for (int dp = 0; dp < 2; ++dp) {
    auto f = (*c)->Optim(0, 0, dp);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ((*f)->fp32.size(), 3u);
    EXPECT_EQ((*f)->path, JoinPath((*c)->dir(), absl::StrCat("zero_pp_rank_", dp, "_mp_rank_00_optim_states.pt")));
    for (int g = 0; g < 3; ++g) {
      EXPECT_EQ((*f)->StateNames(g), states) << "dp " << dp << " group " << g;
      EXPECT_EQ((*f)->ScalarNames(g), std::vector<std::string>{"step"}) << "dp " << dp << " group " << g;
      // Each per-element state holds the dp partition or its lean part (the
      // fp32 partition's elements).
      const int64_t p = (*c)->Layout(0, 0, g).partition_numel();
      for (const std::string& s : states) {
        ASSERT_NE((*f)->Flat(g, s), nullptr);
        const int64_t n = (*f)->Flat(g, s)->numel();
        EXPECT_TRUE(n == p || n == (*f)->fp32[g].numel()) << "dp " << dp << " group " << g << " " << s << ": " << n;
      }
      EXPECT_EQ((*f)->Flat(g, "fp32"), &(*f)->fp32[g]);
      EXPECT_EQ((*f)->Flat(g, "momentum"), nullptr);
    }
    EXPECT_NE((*f)->Scalar(2, "step").value, nullptr);
  }
  // The one-element group, in partitions of 2 (padding [1, 2], DeepSpeed >=
  // 0.16.4's per-rank padding): its fp32 partitions are the lean parts (1
  // element on rank 0, none on rank 1), its states the whole partitions.
  auto f0 = (*c)->Optim(0, 0, 0);
  auto f1 = (*c)->Optim(0, 0, 1);
  ASSERT_TRUE(f0.ok() && f1.ok());
  EXPECT_EQ((*c)->Layout(0, 0, 2).partition_numel(), 2);
  EXPECT_EQ((*f0)->fp32[2].numel(), 1);
  EXPECT_EQ((*f1)->fp32[2].numel(), 0);
  EXPECT_EQ((*f1)->Flat(2, "exp_avg")->numel(), 2);
}

// An exp_avg whose strides repeat elements would make every writer emit
// bytes the file does not have.
TEST(ZeroOptimFileTest, OverlappingStateViewIsRefused) {
  const std::string dir =
      DamagedCopy("zero_overlap", "overlap optimizer_state_dict.base_optimizer_state.state.1.exp_avg");
  auto c = ZeroCheckpoint::Open(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_THAT(std::string(c.status().message()),
              ::testing::MatchesRegex(absl::StrCat(JoinPath(dir, kOptim0),
                                                   ": optimizer state 'exp_avg' of group 1 views [0-9]+ elements of a ",
                                                   "storage of [0-9]+ \\(overlapping strides\\)")));
}

// Every group holds the states of group 0 (one optimizer): a group with
// other state names is refused rather than read under group 0's names.
TEST(ZeroOptimFileTest, GroupWithOtherStatesIsRefused) {
  const std::string dir = DamagedCopy(
      "zero_state_names", "rename-key optimizer_state_dict.base_optimizer_state.state.1 exp_avg_sq exp_avg_sq_x");
  auto c = ZeroCheckpoint::Open(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_EQ(c.status().message(),
            absl::StrCat(JoinPath(dir, kOptim0),
                         ": group 1 has optimizer states [exp_avg, exp_avg_sq_x], group 0 has [exp_avg, exp_avg_sq]"));
}

// A group whose state dict was emptied has none of group 0's states.
TEST(ZeroOptimFileTest, GroupWithoutStatesIsRefused) {
  const std::string dir = DamagedCopy("zero_no_state", "clear optimizer_state_dict.base_optimizer_state.state.2");
  auto c = ZeroCheckpoint::Open(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), absl::StrCat(JoinPath(dir, kOptim0),
                                               ": group 2 has optimizer states [], group 0 has [exp_avg, exp_avg_sq]"));
}

}  // namespace
}  // namespace ucp::deepspeed_zero
