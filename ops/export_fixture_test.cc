// `ucp export` on the real DeepSpeed fixtures (0.14.4, 0.16.4, 0.19.5 ZeRO
// folders ucp reads, and universal folders): every exported fp32 tensor
// bitwise equal to the merged fp32 masters, read back by Python readers
// independent of ucp (testdata/python/check_export.py: json + numpy for
// safetensors, torch.load(weights_only=True) for the torch format), against
//   - DeepSpeed's expected universal checkpoint (global_step4_universal_expected;
//     for neox-tp1-pp2-dp1 DeepSpeed's own, correct at tp=1), and
//   - a merge of the optimizer files written in Python (zero_to_fp32.py's
//     walk of param_shapes, tp slices merged by the GPT-NeoX layer kinds).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "gtest/gtest.h"
#include "format/safetensors/safetensors.h"
#include "format/torch/torch_file.h"
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
  for (const std::string fmt : {"safetensors", "torch"}) {
    const bool torch_format = fmt == "torch";
    ops::ExportOptions o;
    o.input_folder = in;
    o.output_folder = JoinPath(dir, fmt);
    o.format = fmt;
    // Safetensors in one file; torch in 300 KB shards (index + several files).
    o.write.max_shard_size = torch_format ? 300'000 : 5'000'000'000;
    auto r = ops::Export(o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(PathExists(JoinPath(o.output_folder, "pytorch_model.bin.index.json")), torch_format);
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

// A native MoE checkpoint exports as one state dict with every expert under
// its global id. The fixture trained in fp32, so every exported (fp32 master)
// tensor must equal, bitwise, the weight the files hold for it: the module of
// mp_rank_00 for non-expert params, layer_L_expert_E for experts (read here
// straight from those files, not through ucp's MoE reader).
TEST(ExportMoeTest, EveryExpertUnderItsGlobalIdAsTheFilesHoldIt) {
  const std::string dir = FixturePath("../deepspeed-0.19.5/gpt-moe-ep2-zero2-dp2/global_step4");
  ops::ExportOptions o;
  o.input_folder = dir;
  o.output_folder = JoinPath(FreshTempDir("export_moe"), "out");
  auto r = ops::Export(o);
  ASSERT_TRUE(r.ok()) << r.status();
  auto st = safetensors::SafetensorsFile::Open(JoinPath(o.output_folder, "model.safetensors"));
  ASSERT_TRUE(st.ok()) << st.status();
  std::map<std::string, torch::Tensor> want;
  std::vector<std::unique_ptr<torch::TorchFile>> files;  // the tensors' storage
  auto add = [&](const std::string& path, bool module) {
    auto f = torch::TorchFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    const pickle::Value& d = module ? *(*f)->root()->DictGet("module") : *(*f)->root();
    for (const auto& [k, v] : d.dict_items()) {
      auto t = (*f)->GetTensor(*v);
      ASSERT_TRUE(t.ok()) << k->str();
      want[k->str()] = *t;
    }
    files.push_back(*std::move(f));
  };
  add(JoinPath(dir, "mp_rank_00_model_states.pt"), true);
  int experts = 0;
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      const std::string path = JoinPath(dir, absl::StrCat("layer_", l, "_expert_", e, "_mp_rank_00_model_states.pt"));
      add(path, false);
      ++experts;
    }
  }
  ASSERT_EQ(experts, 8);
  EXPECT_EQ((*st)->tensors().size(), want.size());
  int equal = 0;
  for (const auto& [name, t] : want) {
    auto got = (*st)->GetTensor(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_TRUE(got->BitwiseEqual(t)) << name;
    equal += got->BitwiseEqual(t) ? 1 : 0;
  }
  EXPECT_GT(equal, 40);
  EXPECT_TRUE((*st)->GetTensor("h.1.moe.deepspeed_moe.experts.deepspeed_experts.3.fc.weight").ok());
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
