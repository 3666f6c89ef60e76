// The golden case testdata/golden/neox_zero1_mp2_to_mp1: ucp's output still
// matches it file for file, it reproduces DeepSpeed's tp 2 -> 1 failure, and
// the golden check finds every param a pattern-less DeepSpeed merge gets wrong.
#include "conformance/golden.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "conformance/synthetic_state.h"
#include "ops/convert.h"
#include "ops/open.h"
#include "readers/zero_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

using ::testing::IsEmpty;
using ucp::testing::FreshTempDir;
using ucp::testing::RunfilePath;

const char kCase[] = "testdata/golden/neox_zero1_mp2_to_mp1";

const GoldenEntry* TensorOf(const Golden& g, const std::string& path) {
  for (const auto& f : g.file()) {
    if (f.path() == path && f.tensor_size() > 0) return &f.tensor(0);
  }
  return nullptr;
}

TEST(GoldenTest, CaseIsTheBugReportsSetting) {
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model().style(), "gpt-neox");
  EXPECT_EQ(c->model().hidden_size(), 768);
  EXPECT_EQ(c->zero_stage(), 1);
  EXPECT_EQ(c->source().tp(), 2);
  EXPECT_EQ(c->target().tp(), 1);
  EXPECT_NE(c->model().rules_source(), "checkpoint_info");  // GPT-NeoX stores no patterns
  bool found = false;
  for (const auto& p : c->model().param()) {
    if (p.name() == "9.input_layernorm.scale") {
      found = true;
      EXPECT_EQ(std::vector<int64_t>(p.shape().begin(), p.shape().end()), std::vector<int64_t>{768});
      EXPECT_EQ(p.rule().kind(), REPLICATED);
    }
  }
  EXPECT_TRUE(found);
}

TEST(GoldenTest, RegeneratesIdentically) {
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  auto want = ReadGolden(RunfilePath(kCase));
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = MakeGolden(*c, FreshTempDir("golden_regenerate"));
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<std::string> diffs = CompareGoldens(*want, *got);
  EXPECT_THAT(diffs, IsEmpty()) << diffs.size() << " differences (run `ucp golden update --golden=" << kCase
                                << "` only if the change is intended):\n"
                                << absl::StrJoin(diffs, "\n");
  // The golden describes both outputs, and ucp's universal param is the tp=1 shape.
  const GoldenEntry* scale = TensorOf(*want, "universal/zero/9.input_layernorm.scale/fp32.pt");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(std::vector<int64_t>(scale->shape().begin(), scale->shape().end()), std::vector<int64_t>{768});
  EXPECT_NE(TensorOf(*want, "target/layer_09-model_00-model_states.pt"), nullptr);
  EXPECT_EQ(TensorOf(*want, "target/layer_09-model_01-model_states.pt"), nullptr);  // tp=1
}

TEST(GoldenTest, CompareGoldensSeesAChange) {
  auto want = ReadGolden(RunfilePath(kCase));
  ASSERT_TRUE(want.ok()) << want.status();
  Golden changed = *want;
  changed.mutable_file(3)->mutable_tensor(0)->set_sha256("0000");
  changed.mutable_file(5)->add_key("extra");
  EXPECT_EQ(CompareGoldens(*want, changed).size(), 2u);
}

// DeepSpeed's ds_to_universal.py without patterns concatenates every param on
// dim 0; its tp=1 loader then asserts on the replicated layer norm.
TEST(GoldenTest, PatternlessMergeReproducesDeepSpeedsAssertion) {
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  auto source = WriteGoldenSource(*c, FreshTempDir("golden_assertion"));
  ASSERT_TRUE(source.ok()) << source.status();
  const std::string source_folder = *source;
  ops::SourceOptions options;
  options.rules.preset = "none";
  options.rules.default_kind = COLUMN;
  auto state = ops::OpenZeroState(source_folder, options);
  ASSERT_TRUE(state.ok()) << state.status();
  const std::string name = "9.input_layernorm.scale";
  const deepspeed::ParamState* p = (*state)->info().Find(name);
  ASSERT_NE(p, nullptr);
  auto slices = (*state)->source().Slices(*p, 0, "fp32");
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 2u);
  MergeRule cat0;
  cat0.set_kind(COLUMN);
  auto merged = tp::MergeSlices(cat0, *slices, 0, name);  // merge_tp_slices: torch.cat(slices, dim=0)
  ASSERT_TRUE(merged.ok()) << merged.status();
  // The tp=1 model's slice of the param: the whole [768] layer norm.
  auto m = SyntheticModelState::FromCase(*c);
  ASSERT_TRUE(m.ok());
  const int64_t slice_numel = (*m)->info().Find(name)->full_shape[0];
  const int tp_world_size = c->target().tp();
  ASSERT_NE(merged->numel(), slice_numel * tp_world_size);  // the assertion fires
  EXPECT_EQ(DeepSpeedSliceAssertion(merged->numel(), slice_numel, tp_world_size),
            "full param numel 1536 != tensor slice numel 768 * tp_world_size 1");
  // ucp's universal param fits: 768 == 768 * 1.
  auto golden = ReadGolden(RunfilePath(kCase));
  ASSERT_TRUE(golden.ok());
  const GoldenEntry* ours = TensorOf(*golden, "universal/zero/" + name + "/fp32.pt");
  ASSERT_NE(ours, nullptr);
  EXPECT_EQ(ours->shape(0), slice_numel * tp_world_size);
}

// A universal folder made the way DeepSpeed makes it without patterns (every
// param cat on dim 0, vocab padding kept): the check names exactly the
// replicated, row-parallel and vocabulary params, and nothing else.
TEST(GoldenTest, CheckUniversalReportsEveryParamDeepSpeedGetsWrong) {
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  auto golden = ReadGolden(RunfilePath(kCase));
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::string work = FreshTempDir("golden_check");
  auto source = WriteGoldenSource(*c, JoinPath(work, "source"));
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE(WriteFileAtomic(JoinPath(work, "cat0.textproto"), "rule { pattern: \".*\" kind: COLUMN }").ok());
  ops::ConvertOptions o;
  o.input_folder = *source;
  o.output_folder = JoinPath(work, "deepspeed_like");
  o.state.rules.rules_file = JoinPath(work, "cat0.textproto");
  ASSERT_TRUE(ops::Convert(o).ok());
  auto report = CheckUniversal(*golden, o.output_folder);
  ASSERT_TRUE(report.ok()) << report.status();
  std::set<std::string> wrong;
  for (const auto& [param, diffs] : *report) wrong.insert(param);
  std::set<std::string> expected = {"0.word_embeddings.weight", "12.final_linear.weight", "11.norm.scale"};
  for (int l = 2; l <= 9; ++l) {
    for (const char* local : {"input_layernorm.scale", "post_attention_layernorm.scale", "attention.dense.bias",
                              "mlp.dense_4h_to_h.bias", "attention.dense.weight", "mlp.dense_4h_to_h.weight"}) {
      expected.insert(absl::StrCat(l, ".", local));
    }
  }
  EXPECT_EQ(wrong, expected);
  ASSERT_TRUE(report->count("9.input_layernorm.scale"));
  EXPECT_THAT(absl::StrJoin(report->at("9.input_layernorm.scale"), "\n"),
              ::testing::HasSubstr("fp32.pt: param: float32[1536], golden float32[768]"));
  // ucp's own output passes.
  auto run = RunGoldenCase(*c, JoinPath(work, "ucp"));
  ASSERT_TRUE(run.ok()) << run.status();
  auto clean = CheckUniversal(*golden, run->universal);
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_TRUE(clean->empty()) << clean->begin()->first << ": " << absl::StrJoin(clean->begin()->second, "; ");
}

}  // namespace
}  // namespace ucp::conformance
