// A source that is not DeepSpeed's (no deepspeed::DeepSpeedFacet: a model
// held in memory here, as a Hugging Face or DCP reader would produce it) is
// written by DeepSpeed's writers with DeepSpeed's defaults for its engine
// state (deepspeed/engine_defaults.h): a ZeRO checkpoint at tp=1 dp=2 and a
// universal checkpoint, both read back bitwise with the version recorded.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/fs.h"
#include "deepspeed/facet.h"
#include "gtest/gtest.h"
#include "formats/deepspeed_universal/universal_checkpoint.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "state/model_state.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"
#include "formats/deepspeed_universal/universal_writer.h"
#include "formats/deepspeed_zero/zero_writer.h"

namespace ucp {
namespace {

using state::ParamState;

torch::Tensor Floats(const std::vector<int64_t>& shape, float base) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::string bytes(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = base + static_cast<float>(i) / 64.0f;
    std::memcpy(&bytes[static_cast<size_t>(i) * 4], &v, 4);
  }
  return *torch::Tensor::FromBytes(torch::DType::kFloat32, shape, std::move(bytes));
}

// Two trainable params in one group, fp32, a step per group; no facet.
class ForeignState : public state::ModelState {
 public:
  ForeignState() {
    info_.num_groups = 1;
    info_.state_keys = {"exp_avg", "exp_avg_sq"};
    info_.scalar_keys = {"step"};
    info_.pipeline = false;
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"embed.weight", {6, 4}}, {"norm.weight", {5}}}) {
      ParamState p;
      p.name = name;
      p.full_shape = shape;
      p.rule.set_kind(REPLICATED);
      p.group = 0;
      info_.params.push_back(p);
      float base = 1.0f;
      for (const char* s : {"fp32", "exp_avg", "exp_avg_sq"}) tensors_[name][s] = Floats(shape, base++);
    }
    info_.Reindex();
    std::string step(4, '\0');
    const float seven = 7.0f;
    std::memcpy(step.data(), &seven, 4);
    step_ = *torch::Tensor::FromBytes(torch::DType::kFloat32, {}, std::move(step));
  }
  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<tp::TensorPlan> Full(const ParamState& p, const std::string& s) const override {
    if (s == state::kLpState) return tp::TensorPlan::FromTensor(tensors_.at(p.name).at("fp32"));
    return tp::TensorPlan::FromTensor(tensors_.at(p.name).at(s));
  }
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override {
    torch::TorchWriter w;
    pickle::ValuePtr v = w.AddTensor(step_);
    auto bytes = w.WriteToString("step", *v);
    if (!bytes.ok()) return bytes.status();
    auto f = torch::TorchFile::FromBytes(*std::move(bytes), "step");
    if (!f.ok()) return f.status();
    std::shared_ptr<const torch::TorchFile> shared(*std::move(f));
    return state::FileValue{shared->root(), shared};
  }
  const torch::Tensor& tensor(const std::string& name, const std::string& s) const { return tensors_.at(name).at(s); }

 private:
  state::ModelInfo info_;
  std::map<std::string, std::map<std::string, torch::Tensor>> tensors_;
  torch::Tensor step_;
};

TEST(ForeignSourceTest, ZeroWriterUsesDeepSpeedDefaults) {
  ForeignState src;
  ASSERT_EQ(deepspeed::FacetOf(src), nullptr);
  const std::string out = JoinPath(ucp::testing::FreshTempDir("foreign_zero"), "global_step7");
  writers::ZeroWriteOptions o;
  o.target = state::Topology{1, 1, 2};
  o.target_ds_version = "0.16.4";
  auto written = deepspeed_zero::WriteZeroCheckpoint(src, out, o);
  ASSERT_TRUE(written.ok()) << written.status();
  auto ckpt = deepspeed_zero::ZeroCheckpoint::Open(out);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->ds_version(), "0.16.4");
  EXPECT_EQ((*ckpt)->topology(), (state::Topology{1, 1, 2}));
  for (const char* name : {"embed.weight", "norm.weight"}) {
    const deepspeed::ZeroParam* p = (*ckpt)->FindParam(name);
    ASSERT_NE(p, nullptr) << name;
    for (const char* s : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto pieces = (*ckpt)->SlicePieces(*p, 0, 0, s);
      ASSERT_TRUE(pieces.ok()) << pieces.status();
      auto got = tp::TensorPlan::FromPieces(torch::DType::kFloat32, p->tp_shapes[0], *pieces);
      ASSERT_TRUE(got.ok()) << got.status();
      auto eq = tp::TensorPlan::BitwiseEqual(*got, tp::TensorPlan::FromTensor(src.tensor(name, s)));
      ASSERT_TRUE(eq.ok()) << eq.status();
      EXPECT_TRUE(*eq) << name << " " << s;
    }
  }
}

TEST(ForeignSourceTest, UniversalWriterUsesDeepSpeedDefaults) {
  ForeignState src;
  const std::string out = JoinPath(ucp::testing::FreshTempDir("foreign_universal"), "global_step7_universal");
  writers::UniversalWriteOptions o;
  auto written = deepspeed_universal::WriteUniversal(src, out, o);
  ASSERT_TRUE(written.ok()) << written.status();
  auto u = deepspeed_universal::UniversalCheckpoint::Open(out);
  ASSERT_TRUE(u.ok()) << u.status();
  const pickle::Value* version = u->get()->optimizer_state().root()->DictGet("ds_version");
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version->str(), "0.19.5");  // deepspeed::kNewestDsVersion
  auto fp32 = u->get()->ReadState("embed.weight", "fp32");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  auto eq = tp::TensorPlan::BitwiseEqual(tp::TensorPlan::FromTensor(fp32->param),
                                         tp::TensorPlan::FromTensor(src.tensor("embed.weight", "fp32")));
  ASSERT_TRUE(eq.ok()) << eq.status();
  EXPECT_TRUE(*eq);
}

}  // namespace
}  // namespace ucp
