// `ucp export` on the real DeepSpeed fixtures (0.14.4, 0.16.4, 0.19.5 ZeRO
// folders ucp reads, and universal folders): every exported fp32 tensor
// bitwise equal to the merged fp32 masters, read back by Python readers
// independent of ucp (testdata/python/check_export.py: json + numpy for
// safetensors, torch.load(weights_only=True) for the torch format), against
//   - DeepSpeed's expected universal checkpoint (global_step4_universal_expected;
//     for neox-tp1-pp2-dp1 DeepSpeed's own, correct at tp=1), and
//   - a merge of the optimizer files written in Python (zero_to_fp32.py's
//     walk of param_shapes, tp slices merged by the GPT-NeoX layer kinds).
#include <string>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "gtest/gtest.h"
#include "ops/export.h"
#include "testing/fixtures.h"

namespace ucp {
namespace {

using testing::FixturePath;
using testing::FreshTempDir;
using testing::kPython;
using testing::RunCommand;
using testing::RunfilePath;

struct FixtureCase {
  std::string name;      // test name
  std::string fixture;   // under fixtures/deepspeed-0.14.4/ (or ../deepspeed-X/)
  std::string universal; // expected universal folder, "" if none
};

void PrintTo(const FixtureCase& c, std::ostream* os) { *os << c.name; }

class ExportFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

absl::Status Check(const std::string& out, const std::string& format, const std::string& expected) {
  return RunCommand(absl::StrCat(kPython, " ", RunfilePath("testdata/python/check_export.py"), " ", out, " ", format,
                                 " ", expected))
      .status();
}

TEST_P(ExportFixtureTest, Fp32MastersBitwiseInBothFormats) {
  const FixtureCase& c = GetParam();
  const std::string in = FixturePath(c.fixture + "/global_step4");
  const std::string dir = FreshTempDir("export_" + c.name);
  for (const auto& [format, fmt] : {std::pair{writers::ExportFormat::kSafetensors, std::string("safetensors")},
                                    std::pair{writers::ExportFormat::kTorch, std::string("torch")}}) {
    ops::ExportOptions o;
    o.input_folder = in;
    o.output_folder = JoinPath(dir, fmt);
    o.write.format = format;
    // Safetensors in one file; torch in 300 KB shards (index + several files).
    o.write.max_shard_size = format == writers::ExportFormat::kTorch ? 300'000 : 5'000'000'000;
    auto r = ops::Export(o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(PathExists(JoinPath(o.output_folder, "pytorch_model.bin.index.json")),
              format == writers::ExportFormat::kTorch);
    absl::Status s = Check(o.output_folder, fmt, "zero:" + in);
    EXPECT_TRUE(s.ok()) << s;
    if (!c.universal.empty()) {
      s = Check(o.output_folder, fmt, "universal:" + FixturePath(c.fixture + "/" + c.universal));
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ExportFixtureTest,
    ::testing::Values(
        FixtureCase{"v0144_neox_tp2_pp1_dp1", "neox-tp2-pp1-dp1", "global_step4_universal_expected"},
        FixtureCase{"v0144_neox_tp2_pp1_dp2", "neox-tp2-pp1-dp2", "global_step4_universal_expected"},
        FixtureCase{"v0144_neox_tp1_pp2_dp1", "neox-tp1-pp2-dp1", "global_step4_universal_deepspeed"},
        FixtureCase{"v0144_neox_bf16_tp2_pp1_dp2", "neox-bf16-tp2-pp1-dp2", "global_step4_universal_expected"},
        FixtureCase{"v0144_gpt_zero2_nopipe_tp2_dp2", "gpt-zero2-nopipe-tp2-dp2", "global_step4_universal_expected"},
        FixtureCase{"v0164_neox_tp2_pp1_dp1", "../deepspeed-0.16.4/neox-tp2-pp1-dp1", ""},
        FixtureCase{"v0164_neox_bf16_tp2_pp1_dp2", "../deepspeed-0.16.4/neox-bf16-tp2-pp1-dp2", ""},
        FixtureCase{"v0195_neox_tp2_pp1_dp1", "../deepspeed-0.19.5/neox-tp2-pp1-dp1", ""},
        FixtureCase{"v0195_neox_bf16_tp2_pp1_dp2", "../deepspeed-0.19.5/neox-bf16-tp2-pp1-dp2", ""},
        // Per-rank group_paddings, rank 1 saving a 0-element partition.
        FixtureCase{"v0195_gpt_zero1_padding_dp2", "../deepspeed-0.19.5/gpt-zero1-padding-dp2", ""}),
    [](const ::testing::TestParamInfo<FixtureCase>& i) { return i.param.name; });

// A universal folder as input: the same tensors as from the ZeRO folder.
TEST(ExportUniversalTest, UniversalInputEqualsZeroInput) {
  const std::string dir = FreshTempDir("export_universal");
  for (const std::string& fixture : {std::string("neox-tp2-pp1-dp1"), std::string("gpt-zero2-nopipe-tp2-dp2")}) {
    ops::ExportOptions o;
    o.input_folder = FixturePath(fixture + "/global_step4_universal_expected");
    o.output_folder = JoinPath(dir, fixture);
    auto r = ops::Export(o);
    ASSERT_TRUE(r.ok()) << r.status();
    absl::Status s = Check(o.output_folder, "safetensors", "zero:" + FixturePath(fixture + "/global_step4"));
    EXPECT_TRUE(s.ok()) << s;
  }
}

// --weights=lp: the bf16 module weights of the ZeRO folder, and from its
// universal checkpoint (which has none) the fp32 masters rounded to bf16:
// the same file, byte for byte (DeepSpeed's lp weights are the masters rounded).
TEST(ExportLpTest, UniversalLpIsTheMastersRoundedLikeTheModuleWeights) {
  const std::string dir = FreshTempDir("export_lp");
  std::string files[2];
  int k = 0;
  for (const std::string& in : {std::string("global_step4"), std::string("global_step4_universal_expected")}) {
    ops::ExportOptions o;
    o.input_folder = FixturePath("neox-bf16-tp2-pp1-dp2/" + in);
    o.output_folder = JoinPath(dir, in);
    o.weights = "lp";
    auto r = ops::Export(o);
    ASSERT_TRUE(r.ok()) << r.status();
    auto bytes = ReadFileToString(JoinPath(o.output_folder, "model.safetensors"));
    ASSERT_TRUE(bytes.ok());
    files[k++] = *bytes;
  }
  EXPECT_TRUE(files[0] == files[1]);
  EXPECT_NE(files[0].find("\"dtype\":\"BF16\""), std::string::npos);
}

TEST(ExportRefusalTest, RmsNormNeoXHasNoGptNeoXEquivalentAndNothingIsLeft) {
  ops::ExportOptions o;
  o.input_folder = FixturePath("neox-tp2-pp1-dp1/global_step4");
  o.output_folder = JoinPath(FreshTempDir("export_refuse"), "hf");
  o.names = "hf";
  o.state.rules.preset = "gpt-neox";
  auto r = ops::Export(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("RMSNorm"), std::string::npos) << r.status();
  EXPECT_FALSE(PathExists(o.output_folder));
}

TEST(ExportRefusalTest, NativeMoeIsRefusedAndNothingIsLeft) {
  ops::ExportOptions o;
  o.input_folder = FixturePath("../deepspeed-0.19.5/gpt-moe-ep2-zero2-dp2/global_step4");
  o.output_folder = JoinPath(FreshTempDir("export_moe"), "out");
  auto r = ops::Export(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("native mixture-of-experts"), std::string::npos) << r.status();
  EXPECT_FALSE(PathExists(o.output_folder));
}

TEST(ExportRefusalTest, ExistingOutputIsKeptWithoutOverwrite) {
  const std::string out = JoinPath(FreshTempDir("export_exists"), "out");
  ASSERT_TRUE(MakeDirs(out).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(out, "keep"), "x").ok());
  ops::ExportOptions o;
  o.input_folder = FixturePath("neox-tp2-pp1-dp1/global_step4");
  o.output_folder = out;
  EXPECT_FALSE(ops::Export(o).ok());
  EXPECT_TRUE(PathExists(JoinPath(out, "keep")));
  EXPECT_FALSE(PathExists(JoinPath(out, "model.safetensors")));
}

}  // namespace
}  // namespace ucp
