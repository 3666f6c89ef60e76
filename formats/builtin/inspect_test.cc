#include "formats/inspect.h"

#include "formats/builtin/builtin.h"

#include "gtest/gtest.h"
#include "testing/fixtures.h"

namespace ucp::formats {
namespace {

using ucp::testing::FixturePath;

TEST(InspectTest, ZeroFolders) {
  struct Case {
    std::string fixture;
    int tp, pp, dp, stage;
    std::string layout;
    bool pipeline;
    std::string lp;
  };
  for (const Case& c : std::vector<Case>{{"neox-tp2-pp1-dp2", 2, 1, 2, 1, "zero", true, "float32"},
                                         {"neox-tp1-pp2-dp1", 1, 2, 1, 1, "zero", true, "float32"},
                                         {"neox-bf16-tp2-pp1-dp2", 2, 1, 2, 1, "bf16", true, "bfloat16"},
                                         {"gpt-zero2-nopipe-tp2-dp2", 2, 1, 2, 2, "zero", false, "float32"}}) {
    // The root (with `latest`) and the tag folder both open.
    for (const std::string& path : {FixturePath(c.fixture), FixturePath(c.fixture + "/global_step4")}) {
      auto r = Inspect(builtin::Formats(), path);
      ASSERT_TRUE(r.ok()) << path << ": " << r.status();
      EXPECT_EQ(r->kind(), "zero");
      EXPECT_EQ(r->tag(), "global_step4");
      EXPECT_EQ(r->topology().tp(), c.tp) << c.fixture;
      EXPECT_EQ(r->topology().pp(), c.pp) << c.fixture;
      EXPECT_EQ(r->topology().dp(), c.dp) << c.fixture;
      EXPECT_EQ(r->zero_stage(), c.stage) << c.fixture;
      EXPECT_EQ(r->optimizer_layout(), c.layout) << c.fixture;
      EXPECT_EQ(r->pipeline(), c.pipeline) << c.fixture;
      EXPECT_EQ(r->lp_dtype(), c.lp) << c.fixture;
      EXPECT_EQ(r->param_size(), 83) << c.fixture;
      ASSERT_EQ(r->group_size(), 2);
    }
  }
}

TEST(InspectTest, FragmentsOfAParamStraddlingDpRanks) {
  auto r = Inspect(builtin::Formats(), FixturePath("neox-tp2-pp1-dp2/global_step4"));
  ASSERT_TRUE(r.ok());
  for (const auto& p : r->param()) {
    if (p.name() != "6.input_layernorm.scale") continue;
    // 32 elements at the end of dp rank 0's partition, 32 at the start of rank 1's, per tp rank.
    ASSERT_EQ(p.fragment_size(), 4);
    EXPECT_EQ(p.fragment(0).file(), "zero_pp_rank_0_mp_rank_00_optim_states.pt");
    EXPECT_EQ(p.fragment(0).offset(), 1920);
    EXPECT_EQ(p.fragment(0).numel(), 32);
    EXPECT_EQ(p.fragment(1).file(), "zero_pp_rank_1_mp_rank_00_optim_states.pt");
    EXPECT_EQ(p.fragment(1).offset(), 0);
    EXPECT_EQ(p.fragment(1).numel(), 32);
    return;
  }
  FAIL() << "6.input_layernorm.scale not reported";
}

TEST(InspectTest, UniversalFolderAndSingleFile) {
  auto u = Inspect(builtin::Formats(), FixturePath("neox-tp2-pp1-dp1/global_step4_universal_expected"));
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->kind(), "universal");
  EXPECT_EQ(u->param_size(), 83);
  auto f = Inspect(builtin::Formats(), FixturePath("neox-tp2-pp1-dp1/global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind(), "file");
  const std::string text = FormatReport(*f);
  EXPECT_NE(text.find("      exp_avg: tensor float32[202752]"), std::string::npos) << text;
  EXPECT_NE(text.find("      0.word_embeddings.weight: deepspeed.utils.tensor_fragment.fragment_address()"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("zero_stage: builtins.getattr(deepspeed.runtime.zero.config.ZeroStageEnum, 'optimizer_states')"), std::string::npos) << text;
  EXPECT_EQ(Inspect(builtin::Formats(), "/nonexistent").status().code(), absl::StatusCode::kNotFound);
}

// ZeRO-3 and native MoE folders of DeepSpeed 0.19.5.
TEST(InspectTest, Zero3AndMoeFolders) {
  auto z3 = Inspect(builtin::Formats(), ucp::testing::VersionFixturePath("0.19.5", "gpt-zero3-subgroups-dp2"));
  ASSERT_TRUE(z3.ok()) << z3.status();
  EXPECT_EQ(z3->kind(), "zero3");
  EXPECT_EQ(z3->tag(), "global_step4");
  EXPECT_EQ(z3->zero_stage(), 3);
  EXPECT_EQ(z3->topology().dp(), 2);
  EXPECT_EQ(z3->ds_version(), "0.19.5");
  EXPECT_EQ(z3->param_size(), 53);
  ASSERT_EQ(z3->group_size(), 2);
  EXPECT_EQ(z3->group(0).num_params() + z3->group(1).num_params(), 53);
  // wte.weight (96 x 64): 3072 elements on each dp rank, sub-group 0.
  ASSERT_EQ(z3->param(0).name(), "wte.weight");
  ASSERT_EQ(z3->param(0).fragment_size(), 2);
  EXPECT_EQ(z3->param(0).fragment(1).file(), "zero_pp_rank_1_mp_rank_00_optim_states.pt");
  EXPECT_EQ(z3->param(0).fragment(1).numel(), 3072);
  EXPECT_NE(FormatReport(*z3).find("ZeRO stage 3"), std::string::npos);
  auto moe = Inspect(builtin::Formats(), ucp::testing::VersionFixturePath("0.19.5", "gpt-moe-ep2-zero2-dp2/global_step4"));
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->kind(), "moe");
  EXPECT_EQ(moe->zero_stage(), 2);
  ASSERT_EQ(moe->group_size(), 4);
  EXPECT_EQ(moe->group(2).num_params(), 16);  // 2 layers x 4 experts x (fc, proj) weights
  int experts = 0;
  for (const auto& p : moe->param()) experts += p.name().find(".deepspeed_experts.3.") != std::string::npos;
  EXPECT_EQ(experts, 8);  // global expert 3, held by ep rank 1 as its local expert 1
}

}  // namespace
}  // namespace ucp::formats
