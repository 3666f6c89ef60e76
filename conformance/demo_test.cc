// `ucp demo` end to end: it writes the three checkpoints and verifies every
// tensor of the tp=1 result.
#include "conformance/demo.h"

#include "base/fs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"

namespace ucp::conformance {
namespace {

using ::testing::HasSubstr;

TEST(DemoTest, ConvertsReshardsAndVerifiesBitwise) {
  DemoOptions o;
  o.workdir = ucp::testing::FreshTempDir("demo");
  o.num_threads = 2;
  auto r = RunDemo(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->mismatches.empty());
  // 83 params: weights, fp32 masters, exp_avg, exp_avg_sq.
  EXPECT_EQ(r->verified_tensors, 83 * 4);
  EXPECT_THAT(r->summary, HasSubstr("83 weights, 83 fp32 masters, 83 exp_avg, 83 exp_avg_sq: all bitwise equal"));
  EXPECT_THAT(r->summary, HasSubstr("preset: gpt-neox (detected from param names)"));
  EXPECT_TRUE(PathExists(JoinPath(r->source, "layer_12-model_01-model_states.pt")));
  EXPECT_TRUE(PathExists(JoinPath(r->universal, "zero/2.attention.dense.weight/fp32.pt")));
  EXPECT_TRUE(PathExists(JoinPath(r->target, "zero_pp_rank_0_mp_rank_00_optim_states.pt")));
  EXPECT_FALSE(PathExists(JoinPath(r->target, "mp_rank_01_model_states.pt")));
}

}  // namespace
}  // namespace ucp::conformance
