// Checkpoints of DeepSpeed's Ulysses sequence parallelism (testdata/ulysses: real
// DeepSpeed master edaa72212 and 0.19.5, realds/ulysses_job.py at sp 2, ZeRO-1):
// both record checkpoint_parallel_dimensions.tp_degree = 2 (the sp degree) beside
// mp_world_size 1; master names every file mp_rank_00, 0.19.5 rank d's optimizer
// file mp_rank_{d % sp}. ucp reads both as tp 1, dp 2 (the sp ranks are ZeRO's dp
// ranks), and refuses the same files once ds_config no longer says sp.
#include <filesystem>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"

namespace ucp::deepspeed_zero {
namespace {

using ::testing::HasSubstr;
using ucp::testing::FreshTempDir;
using ucp::testing::RunfilePath;

std::string Tag(const std::string& name) { return RunfilePath(absl::StrCat("testdata/ulysses/", name, "/t")); }

void ExpectTp1Dp2(const std::string& name, const std::string& rank1_file) {
  auto c = ZeroCheckpoint::Open(Tag(name));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->topology().tp, 1);
  EXPECT_EQ((*c)->topology().pp, 1);
  EXPECT_EQ((*c)->topology().dp, 2);
  for (int dp = 0; dp < 2; ++dp) {
    auto f = (*c)->Optim(0, 0, dp);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->path, JoinPath((*c)->dir(), dp == 0 ? "zero_pp_rank_0_mp_rank_00_optim_states.pt" : rank1_file));
    // Its name leads back to its slot (verify, read-ahead).
    EXPECT_EQ((*c)->OptimKeyOf((*f)->path), std::make_tuple(0, 0, dp)) << (*f)->path;
  }
  for (const std::string& f : {std::string("mp_rank_00_model_states.pt"),
                               std::string("zero_pp_rank_0_mp_rank_00_optim_states.pt"), rank1_file}) {
    EXPECT_TRUE((*c)->VerifyFile(JoinPath((*c)->dir(), f)).ok()) << f;
  }
}

TEST(UlyssesTest, MasterNamesEveryFileMpRank00) {
  ExpectTp1Dp2("master_zero1_sp2", "zero_pp_rank_1_mp_rank_00_optim_states.pt");
}

TEST(UlyssesTest, Version0195NamesOptimizerFilesBySpRank) {
  ExpectTp1Dp2("ds0195_zero1_sp2", "zero_pp_rank_1_mp_rank_01_optim_states.pt");
}

TEST(UlyssesTest, WithoutSequenceParallelSizeTheRecordedTpIsRefused) {
  const std::string dir = JoinPath(FreshTempDir("ulysses_no_sp"), "t");
  ASSERT_TRUE(CopyTree(Tag("master_zero1_sp2"), dir).ok());
  auto out = ucp::testing::RunCommand(absl::StrCat(
      ucp::testing::kPython, " ", RunfilePath("testdata/python/mutate_checkpoint.py"), " ",
      JoinPath(dir, "mp_rank_00_model_states.pt"), " rename-key ds_config sequence_parallel_size not_sp x"));
  ASSERT_TRUE(out.ok()) << out.status();
  auto c = ZeroCheckpoint::Open(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("checkpoint_parallel_dimensions is"));
  EXPECT_THAT(c.status().message(), HasSubstr("mp_rank_00_model_states.pt"));
}

TEST(UlyssesTest, OptimizerFilesNamedByNeitherConventionAreRefused) {
  const std::string dir = JoinPath(FreshTempDir("ulysses_bad_name"), "t");
  ASSERT_TRUE(CopyTree(Tag("ds0195_zero1_sp2"), dir).ok());
  std::filesystem::rename(JoinPath(dir, "zero_pp_rank_1_mp_rank_01_optim_states.pt"),
                          JoinPath(dir, "zero_pp_rank_1_mp_rank_02_optim_states.pt"));
  auto c = ZeroCheckpoint::Open(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("zero_pp_rank_1_mp_rank_00_optim_states.pt"));
}

}  // namespace
}  // namespace ucp::deepspeed_zero
