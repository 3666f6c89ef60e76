// A DCP folder real torch 2.14 saved (testdata/dcp/mlp_w3: FSDP2 at world
// 3) through the registry: detected as "dcp", converted to DeepSpeed's
// universal checkpoint, which holds the saving job's fp32 masters, exp_avg
// and exp_avg_sq (`mlp_w3.ref.pt`, torch's full state) bitwise.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/torch/torch_file.h"
#include "formats/builtin/builtin.h"
#include "formats/format.h"
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

}  // namespace
}  // namespace ucp
