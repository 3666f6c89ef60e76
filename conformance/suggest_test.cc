// Suggested rules (rules/suggest.h, `ucp rules --suggest`) on a model no
// preset knows, saved at tp=2: one generalized rule per family, kinds only
// where the evidence decides them and then the true ones, the rest left to
// fill in; filled in with the true kinds, the file converts the checkpoint to
// the model's own tensors.
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "conformance/synthetic_state.h"
#include "format/torch/torch_file.h"
#include "google/protobuf/text_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/convert.h"
#include "ops/open.h"
#include "rules/presets.h"
#include "rules/rules.h"
#include "testing/fixtures.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

using ::testing::HasSubstr;
using ucp::testing::FreshTempDir;

constexpr int64_t kHidden = 32;

void Add(ModelSpec& spec, const std::string& name, std::vector<int64_t> shape, MergeKind kind, int group,
         bool equal_slices = false) {
  ModelParam* p = spec.add_param();
  p->set_name(name);
  p->set_local_name(name);
  p->set_layer(-1);
  for (int64_t d : shape) p->add_shape(d);
  p->mutable_rule()->set_kind(kind);
  p->set_group(group);
  p->set_role("trainable");
  p->set_equal_slices(equal_slices);
}

// A made-up model (names no preset knows), plain nn.Module, 3 blocks.
GoldenCase UnknownModel() {
  GoldenCase c;
  ModelSpec& s = *c.mutable_model();
  s.set_style("custom");
  s.set_pipeline(false);
  s.set_lp_dtype("fp32");
  s.set_num_groups(2);
  s.set_original_vocab_size(40);
  s.set_make_vocab_size_divisible_by(1);
  s.set_hidden_size(kHidden);
  s.set_rules_source("rules_file");  // unused: the test passes its own options
  Add(s, "table.weight", {40, kHidden}, COLUMN, 0);
  for (int l = 0; l < 3; ++l) {
    const std::string b = absl::StrCat("trunk.", l, ".");
    Add(s, b + "gain", {kHidden}, REPLICATED, 1);
    Add(s, b + "mix.in_proj", {96, kHidden}, COLUMN, 0);
    Add(s, b + "mix.out_proj", {kHidden, 48}, ROW, 0);
    // Block 0's gate bias is partitioned but its tp slices are equal (e.g.
    // zero-initialized): only its siblings tell that it is not replicated.
    Add(s, b + "mix.gate_bias", {48}, COLUMN, 1, /*equal_slices=*/l == 0);
    Add(s, b + "mix.kernel", {16, 1, 5}, COLUMN, 0);
    Add(s, b + "mix.poles", {4, 16, 3}, ROW, 0);
    // Same name, two ranks (as savanna's implicit_modal vs implicit_real_modal filter.p).
    if (l == 1) {
      Add(s, b + "mix.coef", {4, 16, 2}, ROW, 0);
    } else {
      Add(s, b + "mix.coef", {16, 4}, COLUMN, 0);
    }
    Add(s, b + "out_bias", {kHidden}, REPLICATED, 1);
  }
  c.mutable_source()->set_tp(2);
  c.mutable_source()->set_pp(1);
  c.mutable_source()->set_dp(1);
  *c.mutable_target() = c.source();
  c.set_seed(21);
  c.set_zero_stage(1);
  c.set_optimizer_layout("zero");
  return c;
}

std::vector<int64_t> ShapeOf(const ModelParam& p) { return std::vector<int64_t>(p.shape().begin(), p.shape().end()); }

struct Fixture {
  GoldenCase c;
  std::unique_ptr<SyntheticModelState> m;
  std::string work, src;
};

Fixture Save(const std::string& name) {
  Fixture f;
  f.c = UnknownModel();
  EXPECT_TRUE(ValidateModelSpec(f.c.model()).ok()) << ValidateModelSpec(f.c.model());
  auto m = SyntheticModelState::FromCase(f.c);
  EXPECT_TRUE(m.ok()) << m.status();
  f.m = std::move(*m);
  f.work = FreshTempDir(name);
  f.src = JoinPath(f.work, "src/global_step1");
  EXPECT_TRUE(SaveZero(*f.m, f.src, state::Topology::FromProto(f.c.source())).ok());
  return f;
}

const ModelParam* Param(const GoldenCase& c, const std::string& name) {
  for (const auto& p : c.model().param()) {
    if (p.name() == name) return &p;
  }
  return nullptr;
}

TEST(SuggestTest, NoPresetKnowsTheModel) {
  const GoldenCase c = UnknownModel();
  std::vector<std::string> names;
  for (const auto& p : c.model().param()) names.push_back(p.name());
  EXPECT_FALSE(rules::DetectPreset(names).has_value());
}

TEST(SuggestTest, SuggestionsAreGeneralizedAndNeverContradictTheEvidence) {
  Fixture f = Save("suggest_families");
  ops::SourceOptions o;
  o.num_threads = 1;
  auto report = ops::SuggestRules(f.src, o);
  ASSERT_TRUE(report.ok()) << report.status();
  // Families: table, in_proj, out_proj, gate_bias, kernel, poles, coef (2-D),
  // coef (3-D); gain and out_bias are replicated by evidence (listed too).
  std::map<std::string, const rules::FamilySuggestion*> by_member;
  std::set<std::string> covered;
  for (const auto& s : report->suggestions) {
    for (const auto& n : s.members) {
      EXPECT_TRUE(covered.insert(n).second) << n << " is in two suggestions";
      by_member[n] = &s;
    }
    // One generalized pattern per family: every member matches it (with its
    // shape), nothing else does.
    MergeRules one;
    *one.add_rule() = s.rule;
    one.mutable_rule(0)->set_kind(REPLICATED);
    auto set = rules::RuleSet::Compile(one, RULE_FILE, "suggestion");
    ASSERT_TRUE(set.ok()) << set.status();
    for (const auto& p : f.c.model().param()) {
      const bool member = std::find(s.members.begin(), s.members.end(), p.name()) != s.members.end();
      EXPECT_EQ(set->Match(p.name(), ShapeOf(p)) != nullptr, member) << s.rule.pattern() << " vs " << p.name();
    }
  }
  EXPECT_EQ(covered.size(), static_cast<size_t>(f.c.model().param_size()));
  EXPECT_EQ(report->suggestions.size(), 10u);
  EXPECT_EQ(by_member.at("trunk.0.mix.in_proj")->rule.pattern(), "trunk\\.\\d+\\.mix\\.in_proj$");
  EXPECT_EQ(by_member.at("trunk.0.mix.in_proj")->members.size(), 3u);
  EXPECT_EQ(by_member.at("trunk.0.mix.coef")->rule.ndim(), 2);
  EXPECT_EQ(by_member.at("trunk.1.mix.coef")->rule.ndim(), 3);
  for (const auto& p : f.c.model().param()) {
    const rules::FamilySuggestion& s = *by_member.at(p.name());
    SCOPED_TRACE(absl::StrCat(p.name(), ": ", s.evidence));
    if (s.decided()) {
      // Right: the model's own kind.
      EXPECT_EQ(s.rule.kind(), p.rule().kind());
    } else {
      // Absent, and what remains possible includes the truth.
      EXPECT_NE(std::find(s.candidates.begin(), s.candidates.end(), p.rule().kind()), s.candidates.end());
      EXPECT_THAT(s.evidence, HasSubstr("cannot decide"));
    }
    // Partitioned params never come out replicated, even block 0's gate bias
    // whose slices are equal.
    if (p.rule().kind() != REPLICATED) EXPECT_NE(s.rule.kind(), REPLICATED);
  }
  // Decided where the data says so, with the evidence named.
  EXPECT_EQ(by_member.at("trunk.0.mix.out_proj")->rule.kind(), ROW);
  EXPECT_THAT(by_member.at("trunk.0.mix.out_proj")->evidence, HasSubstr("dim 0 is hidden_size 32"));
  EXPECT_EQ(by_member.at("trunk.0.mix.in_proj")->rule.kind(), COLUMN);
  EXPECT_EQ(by_member.at("trunk.0.mix.gate_bias")->rule.kind(), COLUMN);
  EXPECT_THAT(by_member.at("trunk.0.mix.gate_bias")->evidence, HasSubstr("tp copies differ (2 of 3"));
  EXPECT_EQ(by_member.at("table.weight")->rule.kind(), COLUMN);
  EXPECT_FALSE(by_member.at("trunk.0.mix.kernel")->decided());
  EXPECT_FALSE(by_member.at("trunk.0.mix.poles")->decided());
  EXPECT_EQ(by_member.at("trunk.0.gain")->rule.kind(), REPLICATED);
  // The file parses as a MergeRules textproto, and refuses to be used as is.
  auto parsed = rules::ParseRulesText(report->text, "suggested");
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << report->text;
  EXPECT_EQ(parsed->rule_size(), 10);
  auto compiled = rules::RuleSet::Compile(*parsed, RULE_FILE, "suggested");
  EXPECT_FALSE(compiled.ok());
  EXPECT_THAT(compiled.status().message(), HasSubstr("has no kind"));
}

TEST(SuggestTest, ConvertStopsWithOneSuggestionPerFamily) {
  Fixture f = Save("suggest_convert_stops");
  ops::ConvertOptions o;
  o.input_folder = f.src;
  o.output_folder = JoinPath(f.work, "out/universal");
  absl::Status s = ops::Convert(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // Every partitioned param (6 per block, and the table), block 0's equal gate bias included.
  EXPECT_THAT(s.message(), HasSubstr("cannot tell how to merge the tp slices of 19 param(s) in 8 families"));
  EXPECT_THAT(s.message(), HasSubstr("rule { pattern: \"trunk\\\\.\\\\d+\\\\.mix\\\\.out_proj$\" kind: ROW }"));
  EXPECT_THAT(s.message(), HasSubstr("ucp rules --suggest --input_folder="));
  EXPECT_FALSE(PathExists(o.output_folder));
}

TEST(SuggestTest, FilledInSuggestionsConvertToTheModel) {
  Fixture f = Save("suggest_filled");
  ops::SourceOptions so;
  so.num_threads = 1;
  auto report = ops::SuggestRules(f.src, so);
  ASSERT_TRUE(report.ok()) << report.status();
  auto parsed = rules::ParseRulesText(report->text, "suggested");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // Fill in the kinds left open, as the user would: the model's truth.
  int filled = 0;
  for (int i = 0; i < parsed->rule_size(); ++i) {
    MergeRule* r = parsed->mutable_rule(i);
    const rules::FamilySuggestion& s = report->suggestions[i];
    ASSERT_EQ(r->pattern(), s.rule.pattern());
    const ModelParam* p = Param(f.c, s.members[0]);
    ASSERT_NE(p, nullptr);
    if (r->kind() == MERGE_KIND_UNSPECIFIED) {
      r->set_kind(p->rule().kind());
      ++filled;
    }
  }
  EXPECT_EQ(filled, 4);  // kernel, poles, coef 2-D, coef 3-D
  std::string text;
  ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(*parsed, &text));
  const std::string rules_file = JoinPath(f.work, "rules.textproto");
  ASSERT_TRUE(WriteFileAtomic(rules_file, text).ok());
  ops::ConvertOptions o;
  o.input_folder = f.src;
  o.output_folder = JoinPath(f.work, "out/universal");
  o.state.rules.rules_file = rules_file;
  auto r = ops::Convert(o);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& p : f.c.model().param()) {
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      const std::string path = JoinPath(o.output_folder, absl::StrCat("zero/", p.name(), "/", state, ".pt"));
      auto file = torch::TorchFile::Open(path);
      ASSERT_TRUE(file.ok()) << file.status();
      auto got = (*file)->GetTensor(*(*file)->root()->DictGet("param"));
      ASSERT_TRUE(got.ok()) << got.status();
      auto want = f.m->Tensor(p.name(), state);
      ASSERT_TRUE(want.ok());
      EXPECT_TRUE(got->BitwiseEqual(*want)) << path;
    }
  }
}

}  // namespace
}  // namespace ucp::conformance
