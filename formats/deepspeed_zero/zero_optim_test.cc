// The ZeRO-1/2 reader's optimizer files, parsed by the shared flat-group
// parser (deepspeed/flat_optim_file.h) on the real DeepSpeed 0.19.5 ZeRO-1
// fixture (3 param groups, the last of one element in partitions of 2) and on
// damaged copies of it,
// which the reader must refuse naming the file, the group and the state.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "formats/deepspeed_zero/zero_state.h"
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

// Read-ahead (writers/read_ahead.h) asks the state where each unit's input
// bytes lie: for a flat partition of an optimizer file already open, the
// file's own bytes at that extent are the range's bytes; for a file not
// opened yet, nothing (asking must not open one).
TEST(ZeroOptimFileTest, ExtentsOfOpenedOptimizerFilesHoldTheRangesBytes) {
  auto c = ZeroCheckpoint::Open(VersionFixturePath("0.19.5", kFixture));
  ASSERT_TRUE(c.ok()) << c.status();
  const ZeroCheckpoint& ckpt = **c;
  const std::string rank1 = ckpt.OptimPath(0, 0, 1);
  const state::InputRange exp_avg{rank1, "base_optimizer_state.state[1].exp_avg", 8, 16};
  EXPECT_EQ(ckpt.OpenedExtent(exp_avg), std::nullopt) << "rank 1's file is not open yet";
  auto f1 = ckpt.Optim(0, 0, 1);
  ASSERT_TRUE(f1.ok()) << f1.status();
  const int fd = ::open(rank1.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  struct Case {
    state::InputRange range;
    const torch::Tensor* flat;
  };
  const std::vector<Case> cases = {
      {exp_avg, (*f1)->Flat(1, "exp_avg")},
      {{rank1, "single_partition_of_fp32_groups[0]", 0, 64}, (*f1)->Flat(0, "fp32")},
      {{rank1, "base_optimizer_state.state[0].exp_avg_sq", 4, 12}, (*f1)->Flat(0, "exp_avg_sq")},
  };
  for (const Case& k : cases) {
    ASSERT_NE(k.flat, nullptr) << k.range.tensor;
    ASSERT_GE(k.flat->nbytes(), static_cast<size_t>(k.range.offset + k.range.length)) << k.range.tensor;
    const std::optional<state::FileExtent> e = ckpt.OpenedExtent(k.range);
    ASSERT_TRUE(e.has_value()) << k.range.tensor;
    EXPECT_EQ(e->path, rank1);
    ASSERT_EQ(e->length, k.range.length) << k.range.tensor;
    std::string in_file(static_cast<size_t>(e->length), '\0');
    ASSERT_EQ(::pread(fd, in_file.data(), in_file.size(), e->offset), static_cast<ssize_t>(in_file.size()));
    const std::string parsed(reinterpret_cast<const char*>(k.flat->data()) + k.range.offset,
                             static_cast<size_t>(k.range.length));
    EXPECT_EQ(in_file, parsed) << k.range.tensor << " at file offset " << e->offset;
  }
  ::close(fd);
  // Not a flat partition of an optimizer file: nothing to say.
  EXPECT_EQ(ckpt.OpenedExtent({rank1, "base_optimizer_state.state[7].exp_avg", 0, 4}), std::nullopt);
  EXPECT_EQ(ckpt.OpenedExtent({rank1, "", 0, -1}), std::nullopt);
  EXPECT_EQ(ckpt.OpenedExtent({JoinPath(ckpt.dir(), "mp_rank_00_model_states.pt"), "module.x", 0, -1}), std::nullopt);
  EXPECT_EQ(ckpt.OpenedExtent({"/elsewhere/zero_pp_rank_1_mp_rank_00_optim_states.pt", exp_avg.tensor, 8, 16}),
            std::nullopt)
      << "a file of the same name in another folder";
  EXPECT_EQ(ckpt.OptimKeyOf(rank1), std::make_tuple(0, 0, 1));
  EXPECT_EQ(ckpt.OptimKeyOf(JoinPath(ckpt.dir(), "mp_rank_00_model_states.pt")), std::nullopt);
}

// Every range the state lists for the optimizer's params resolves, once
// the files are open: the names Inputs writes are the ones OpenedExtent reads.
TEST(ZeroOptimFileTest, EveryOptimizerInputOfTheStateHasAnExtent) {
  auto c = ZeroCheckpoint::Open(VersionFixturePath("0.19.5", kFixture));
  ASSERT_TRUE(c.ok()) << c.status();
  std::shared_ptr<const ZeroCheckpoint> ckpt = std::move(*c);
  for (int dp = 0; dp < 2; ++dp) ASSERT_TRUE(ckpt->Optim(0, 0, dp).ok());
  auto st = ZeroSlicedState::Make(ckpt, ZeroReadOptions());
  ASSERT_TRUE(st.ok()) << st.status();
  int resolved = 0;
  for (const state::ParamState& p : (*st)->info().params) {
    for (const state::InputRange& r : (*st)->Inputs(p)) {
      if (r.path.find("optim_states") == std::string::npos) continue;
      const std::optional<state::FileExtent> e = (*st)->ExtentOf(r);
      ASSERT_TRUE(e.has_value()) << p.name << ": " << r.path << " " << r.tensor;
      EXPECT_EQ(e->length, r.length) << p.name << " " << r.tensor;
      ++resolved;
    }
  }
  EXPECT_GT(resolved, 0);
  // An export reads the fp32 masters only: StateInputs lists those ranges alone.
  for (const state::ParamState& p : (*st)->info().params) {
    if (!p.trainable()) continue;
    const std::vector<state::InputRange> fp32 = (*st)->StateInputs(p, state::kFp32State);
    ASSERT_FALSE(fp32.empty()) << p.name;
    for (const state::InputRange& r : fp32) {
      EXPECT_EQ(r.tensor.rfind("single_partition_of_fp32_groups[", 0), 0u) << p.name << ": " << r.tensor;
    }
    EXPECT_EQ(fp32.size() * 3, (*st)->Inputs(p).size()) << p.name << ": fp32, exp_avg and exp_avg_sq";
  }
}

}  // namespace
}  // namespace ucp::deepspeed_zero
