// A DCP folder real torch 2.14 saved (testdata/dcp/mlp_w3: FSDP2 at world
// 3) through the registry: detected as "dcp", converted to DeepSpeed's
// universal checkpoint, which holds the saving job's fp32 masters, exp_avg
// and exp_avg_sq (`mlp_w3.ref.pt`, torch's full state) bitwise; a weights-only
// one (weights_bf16_w3) with a fresh optimizer state. And real
// DeepSpeed 0.19.5 checkpoints (ZeRO-3 dp 2, NeoX tp 2) through
// `convert --to=dcp` and back: the DCP folder exports the same bytes as the
// checkpoint itself; a native MoE one (ep 2, ZeRO-2) keeps every expert's
// fp32 master, exp_avg and exp_avg_sq under its global name.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/torch/torch_file.h"
#include "formats/builtin/builtin.h"
#include "formats/format.h"
#include "ops/convert.h"
#include "ops/export.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"
#include "writers/plan.h"

namespace ucp {
namespace {

std::string Case(const std::string& name) { return testing::RunfilePath(absl::StrCat("testdata/dcp/", name)); }

bool Equal(const tp::TensorPlan& a, const torch::Tensor& b) {
  absl::StatusOr<bool> same = tp::TensorPlan::BitwiseEqual(a, tp::TensorPlan::FromTensor(b));
  return same.ok() && *same;
}

TEST(DcpConvertTest, ConvertsToUniversalHoldingTheReference) {
  const formats::Registry& r = formats::builtin::Formats();
  auto d = formats::DetectFolder(r, Case("mlp_w3"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->format->name(), "dcp");
  auto src = d->format->Open(d->folder, formats::SourceOptions(), nullptr);
  ASSERT_TRUE(src.ok()) << src.status();
  writers::UniversalWriteOptions w;
  w.write_latest = false;
  w.fsync = false;
  w.inputs = {d->folder.dir};
  auto plan = r.FindTarget("deepspeed_universal")->PlanUniversal(*src->state, w);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string out = JoinPath(testing::FreshTempDir("dcp_universal"), "u");
  auto stats = writers::RunPlan(**plan, out, writers::UniversalRunOptions(w));
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto u = formats::DetectFolder(r, out);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->format->kind(), "universal");
  auto back = u->format->Open(u->folder, formats::SourceOptions(), nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  auto ref = torch::TorchFile::Open(Case("mlp_w3.ref.pt"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  int compared = 0;
  for (const state::ParamState& p : back->state->info().params) {
    for (const auto& [st, key] : std::vector<std::pair<std::string, std::string>>{
             {"fp32", "model." + p.name}, {"exp_avg", "optim.state." + p.name + ".exp_avg"},
             {"exp_avg_sq", "optim.state." + p.name + ".exp_avg_sq"}}) {
      SCOPED_TRACE(key);
      auto full = back->state->Full(p, st);
      ASSERT_TRUE(full.ok()) << full.status();
      auto t = (*ref)->GetTensor(*(*ref)->root()->DictGet(key));
      ASSERT_TRUE(t.ok());
      EXPECT_TRUE(Equal(*full, *t));
      ++compared;
    }
  }
  EXPECT_EQ(compared, 21);
}

// A weights-only DCP (bf16, FSDP2 at world 3): the universal checkpoint holds
// the weights as fp32 masters (cast), exp_avg and exp_avg_sq zero, step 0.
TEST(DcpConvertTest, WeightsOnlyConvertsWithAFreshOptimizerState) {
  ops::ConvertOptions c;
  c.input_folder = Case("weights_bf16_w3");
  c.output_folder = JoinPath(testing::FreshTempDir("dcp_weights"), "u");
  c.write.fsync = false;
  auto converted = ops::Convert(c);
  ASSERT_TRUE(converted.ok()) << converted.status();
  const formats::Registry& r = formats::builtin::Formats();
  auto u = formats::DetectFolder(r, c.output_folder);
  ASSERT_TRUE(u.ok()) << u.status();
  auto back = u->format->Open(u->folder, formats::SourceOptions(), nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  auto ref = torch::TorchFile::Open(Case("weights_bf16_w3.ref.pt"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  int compared = 0;
  for (const state::ParamState& p : back->state->info().params) {
    SCOPED_TRACE(p.name);
    auto t = (*ref)->GetTensor(*(*ref)->root()->DictGet("model." + p.name));
    ASSERT_TRUE(t.ok());
    auto t32 = torch::Cast(*t, torch::DType::kFloat32);
    ASSERT_TRUE(t32.ok());
    auto fp32 = back->state->Full(p, "fp32");
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    EXPECT_TRUE(Equal(*fp32, *t32));
    for (const char* st : {"exp_avg", "exp_avg_sq"}) {
      auto z = back->state->Full(p, st);
      ASSERT_TRUE(z.ok()) << z.status();
      EXPECT_TRUE(Equal(*z, torch::Tensor::Zeros(torch::DType::kFloat32, t->sizes()))) << st;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 7);
}

TEST(DcpConvertTest, DeepSpeedThroughDcpExportsTheSameBytes) {
  for (const std::string fx : {"gpt-zero3-dp2", "neox-tp2-pp1-dp1"}) {
    SCOPED_TRACE(fx);
    const std::string src = testing::VersionFixturePath("0.19.5", fx);
    const std::string tmp = testing::FreshTempDir(absl::StrCat("dcp_roundtrip_", fx));
    ops::ConvertOptions c;
    c.input_folder = src;
    c.output_folder = JoinPath(tmp, "dcp");
    c.to = "dcp";
    c.write.fsync = false;
    auto converted = ops::Convert(c);
    ASSERT_TRUE(converted.ok()) << converted.status();
    std::vector<std::string> outputs;
    for (const std::string& in : {src, c.output_folder}) {
      ops::ExportOptions e;
      e.input_folder = in;
      e.output_folder = JoinPath(tmp, absl::StrCat("export", outputs.size()));
      e.write.fsync = false;
      auto exported = ops::Export(e);
      ASSERT_TRUE(exported.ok()) << exported.status();
      auto bytes = ReadFileToString(JoinPath(e.output_folder, "model.safetensors"));
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      outputs.push_back(*bytes);
    }
    EXPECT_GT(outputs[0].size(), 1000u);
    EXPECT_TRUE(outputs[0] == outputs[1]);
  }
}

// A native MoE checkpoint (no universal target takes it): every param, the
// experts under their global names, holds in the DCP folder, read back by
// ucp's DCP reader, the states the MoE reader gives it, bitwise.
TEST(DcpConvertTest, MoeThroughDcpKeepsEveryState) {
  const std::string src = testing::VersionFixturePath("0.19.5", "gpt-moe-ep2-zero2-dp2");
  ops::ConvertOptions c;
  c.input_folder = src;
  c.output_folder = JoinPath(testing::FreshTempDir("dcp_moe"), "dcp");
  c.to = "dcp";
  c.write.fsync = false;
  auto converted = ops::Convert(c);
  ASSERT_TRUE(converted.ok()) << converted.status();
  const formats::Registry& r = formats::builtin::Formats();
  auto opened = [&](const std::string& dir) {
    auto d = formats::DetectFolder(r, dir);
    EXPECT_TRUE(d.ok()) << d.status();
    return d->format->Open(d->folder, formats::SourceOptions(), nullptr);
  };
  auto moe = opened(src);
  ASSERT_TRUE(moe.ok()) << moe.status();
  ASSERT_GT(moe->state->info().expert_parallel, 1);
  auto dcp = opened(c.output_folder);
  ASSERT_TRUE(dcp.ok()) << dcp.status();
  int compared = 0, experts = 0;
  for (const state::ParamState& p : moe->state->info().params) {
    SCOPED_TRACE(p.name);
    const state::ParamState* q = dcp->state->info().Find(p.name);
    ASSERT_NE(q, nullptr);
    for (const char* st : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto a = moe->state->Full(p, st);
      ASSERT_TRUE(a.ok()) << a.status();
      auto b = dcp->state->Full(*q, st);
      ASSERT_TRUE(b.ok()) << b.status();
      auto same = tp::TensorPlan::BitwiseEqual(*a, *b);
      ASSERT_TRUE(same.ok()) << same.status();
      EXPECT_TRUE(*same) << st;
    }
    ++compared;
    experts += p.name.find(".deepspeed_experts.") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(compared, static_cast<int>(dcp->state->info().params.size()));
  EXPECT_GT(experts, 0);
}

}  // namespace
}  // namespace ucp
