// The generator makes what the properties assume: valid specs the writer can
// save at both topologies, rules that say what the model is (for each of the
// three ways the converter learns them), and every kind, style and degree.
#include "conformance/model_gen.h"

#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "conformance/spec_rules.h"
#include "conformance/synthetic_state.h"
#include "rules/presets.h"
#include "rules/rules.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

// The non-Hugging Face cases (GenHfCase has tests of its own below).
CaseGenOptions NonHf() {
  CaseGenOptions o;
  o.hf_one_in = 0;
  return o;
}

bool SameKindAndShape(const MergeRule& a, const MergeRule& b) {
  if (a.kind() != b.kind()) return false;
  if (a.kind() != SUB_PARAMS) return true;
  if (a.sub_param_shape().dim_size() != b.sub_param_shape().dim_size()) return false;
  if (a.sub_param_shape().dim_size() > 0) return a.sub_param_shape().SerializeAsString() == b.sub_param_shape().SerializeAsString();
  return a.num_sub_params() == b.num_sub_params() && a.cat_dim() == b.cat_dim();
}

RC_GTEST_PROP(ModelGenTest, CasesAreValidAndFitBothTopologies, ()) {
  const GoldenCase c = *GenCase(NonHf());
  const ModelSpec& spec = c.model();
  RC_ASSERT(ValidateModelSpec(spec).ok());
  auto m = SyntheticModelState::FromCase(c);
  RC_ASSERT(m.ok());
  for (const Topology& t : {c.source(), c.target()}) {
    RC_ASSERT(t.tp() >= 1 && t.tp() <= 8 && t.dp() >= 1 && t.dp() <= 8 && t.pp() >= 1 && t.pp() <= 4);
    RC_ASSERT(t.tp() * t.pp() * t.dp() <= 64);
    if (spec.pipeline()) {
      RC_ASSERT(t.pp() <= spec.num_layers());
    } else {
      RC_ASSERT(t.pp() == 1);
    }
    for (const ModelParam& p : spec.param()) {
      const std::vector<int64_t> shape(p.shape().begin(), p.shape().end());
      const int64_t padded = p.rule().kind() == VOCAB ? tp::PaddedVocabSize(spec.original_vocab_size(),
                                                                           spec.make_vocab_size_divisible_by(), t.tp())
                                                      : 0;
      const auto s = tp::SliceShapeFromFull(p.rule(), shape, t.tp(), padded, p.name());
      RC_ASSERT(s.ok());
    }
  }
  if (!spec.pipeline()) RC_ASSERT(c.zero_stage() == 1 || c.zero_stage() == 2);
  if (spec.pipeline()) RC_ASSERT(c.zero_stage() == 1);
}

// Whatever source the converter is told the rules by, it is told the truth.
RC_GTEST_PROP(ModelGenTest, RulesSourcesSayWhatTheModelIs, ()) {
  const GoldenCase c = *GenCase(NonHf());
  const ModelSpec& spec = c.model();
  std::vector<std::string> names;
  for (const ModelParam& p : spec.param()) names.push_back(p.name());
  // The rules file.
  auto file_rules = rules::RuleSet::Compile(SpecMergeRules(spec), RULE_FILE, "rules");
  RC_ASSERT(file_rules.ok());
  auto shape_of = [](const ModelParam& p) { return std::vector<int64_t>(p.shape().begin(), p.shape().end()); };
  for (const ModelParam& p : spec.param()) {
    const MergeRule* r = file_rules->Match(p.name(), shape_of(p));
    RC_ASSERT(r != nullptr);
    RC_ASSERT(SameKindAndShape(*r, p.rule()));
  }
  if (spec.rules_source() == kCheckpointInfoSource) {
    auto info = SpecCheckpointInfo(spec);
    RC_ASSERT(info.ok());
    auto rules = rules::RulesFromCheckpointInfo(**info);
    RC_ASSERT(rules.ok());
    RC_ASSERT(rules->rules.original_vocab_size() == spec.original_vocab_size());
    auto set = rules::RuleSet::Compile(rules->rules, CHECKPOINT_INFO, "info");
    RC_ASSERT(set.ok());
    for (const ModelParam& p : spec.param()) {
      const MergeRule* r = set->Match(p.name(), shape_of(p));
      if (r == nullptr) {
        RC_ASSERT(p.rule().kind() == COLUMN);  // DeepSpeed's default
      } else {
        RC_ASSERT(SameKindAndShape(*r, p.rule()));
      }
    }
  }
  if (spec.rules_source() == kDetectSource) RC_ASSERT(rules::DetectPreset(names) == spec.preset());
  if (spec.rules_source() == kPresetSource || spec.rules_source() == kDetectSource) {
    auto preset = rules::PresetRules(spec.preset());
    RC_ASSERT(preset.ok());
    auto set = rules::RuleSet::Compile(*preset, PRESET, spec.preset());
    RC_ASSERT(set.ok());
    for (const ModelParam& p : spec.param()) {
      // The tp=1 shape, and a tp slice's: shape conditions hold for both.
      const MergeRule* r = set->Match(p.name(), shape_of(p));
      RC_ASSERT(r != nullptr);
      auto slice = tp::SliceShapeFromFull(p.rule(), shape_of(p), c.source().tp(),
                                          p.rule().kind() == VOCAB ? tp::PaddedVocabSize(spec.original_vocab_size(),
                                                                                         spec.make_vocab_size_divisible_by(),
                                                                                         c.source().tp())
                                                                   : 0,
                                          p.name());
      RC_ASSERT(slice.ok());
      RC_ASSERT(set->Match(p.name(), *slice) == r);
      MergeRule want = p.rule();
      if (spec.swiglu() && want.kind() == SUB_PARAMS && r->kind() == COLUMN) continue;  // args.swiglu upgrades it
      RC_ASSERT(SameKindAndShape(*r, want));
    }
  }
}

TEST(ModelGenTest, CoversEveryKindStyleAndDegree) {
  std::map<std::string, std::set<std::string>> seen;
  for (int i = 0; i < 600; ++i) {
    const GoldenCase c = GenCase(NonHf())(rc::Random(static_cast<uint64_t>(i) * 7919 + 1), 50).value();
    for (const Topology& t : {c.source(), c.target()}) {
      seen["tp"].insert(absl::StrCat(t.tp()));
      seen["pp"].insert(absl::StrCat(t.pp()));
      seen["dp"].insert(absl::StrCat(t.dp()));
    }
    seen["style"].insert(c.model().style());
    seen["source"].insert(c.model().rules_source());
    seen["lp"].insert(c.model().lp_dtype());
    seen["stage"].insert(absl::StrCat(c.zero_stage(), c.model().pipeline() ? "pipe" : "plain"));
    for (const auto& f : CaseFeatures(c)) seen["features"].insert(f);
    seen["ds_version"].insert(c.ds_version());
    seen["target_ds_version"].insert(c.target_ds_version());
    // Every tp of the case divides the recorded head count.
    EXPECT_GT(c.model().num_attention_heads(), 0);
    for (const Topology& t : {c.source(), c.target()}) EXPECT_EQ(c.model().num_attention_heads() % t.tp(), 0);
  }
  const std::set<std::string> versions(DsVersionsDrawn().begin(), DsVersionsDrawn().end());
  EXPECT_EQ(seen["ds_version"], versions);
  EXPECT_EQ(seen["target_ds_version"], versions);
  EXPECT_EQ(seen["tp"].size(), 8u);
  EXPECT_EQ(seen["pp"].size(), 4u);
  EXPECT_EQ(seen["dp"].size(), 8u);
  EXPECT_EQ(seen["style"].size(), 4u);
  EXPECT_EQ(seen["source"].size(), 4u);
  EXPECT_EQ(seen["lp"].size(), 3u);
  EXPECT_EQ(seen["stage"], (std::set<std::string>{"1pipe", "1plain", "2plain"}));
  EXPECT_EQ(seen["features"],
            (std::set<std::string>{"average", "bf16_last_rank_paddings", "buffer", "checkpoint_parallel_dimensions",
                                   "column", "ds_version_change", "equal_slices", "frozen", "numpy2",
                                   "padding_convention_change", "padding_spans_ranks", "per_rank_paddings",
                                   "per_rank_paddings_span_ranks", "rank3", "rank4", "rank_conditioned", "replicated",
                                   "row", "split_dim1_rank3+", "sub_params_2", "sub_params_gqa", "tied", "vocab",
                                   "vocab_padded"}))
      << absl::StrJoin(seen["features"], ", ");
}

// Hugging Face cases: tp = pp = 1, a plain module, valid for the synthetic
// model, every name one the preset of its style detects, no rule flags.
RC_GTEST_PROP(ModelGenTest, HfCasesAreTp1PlainModelsOfTheirPreset, ()) {
  CaseGenOptions o;
  o.hf_only = true;
  o.autotp_one_in = 0;  // AutoTP cases: below
  const GoldenCase c = *GenCase(o);
  const ModelSpec& spec = c.model();
  RC_ASSERT(ValidateModelSpec(spec).ok());
  RC_ASSERT(SyntheticModelState::FromCase(c).ok());
  RC_ASSERT(!spec.pipeline());
  for (const Topology& t : {c.source(), c.target()}) {
    RC_ASSERT(t.tp() == 1 && t.pp() == 1 && t.dp() >= 1 && t.dp() <= 8);
  }
  RC_ASSERT(c.has_source_zero_stage() && c.has_target_zero_stage());
  RC_ASSERT(c.source_zero_stage() >= 0 && c.source_zero_stage() <= 3);
  RC_ASSERT(c.target_zero_stage() >= 0 && c.target_zero_stage() <= 3);
  RC_ASSERT(spec.rules_source() == std::string(kNoFlagsSource));
  std::vector<std::string> names;
  for (const ModelParam& p : spec.param()) names.push_back(p.name());
  RC_ASSERT(rules::DetectPreset(names) == std::optional<std::string>(spec.style()));
}

// AutoTP cases (GenAutoTpCase): valid models of the hf-llama preset at tp
// 1-4 whose attention every tp of the case divides, uneven only where AutoTP
// cuts unevenly, each version's constraints kept.
RC_GTEST_PROP(ModelGenTest, AutoTpCasesAreHfModelsSplitAsAutoTpSplitsThem, ()) {
  CaseGenOptions o;
  o.autotp_only = true;
  const GoldenCase c = *GenCase(o);
  const ModelSpec& spec = c.model();
  RC_ASSERT(spec.autotp());
  RC_ASSERT(ValidateModelSpec(spec).ok());
  RC_ASSERT(SyntheticModelState::FromCase(c).ok());
  RC_ASSERT(!spec.pipeline() && spec.make_vocab_size_divisible_by() == 0);
  RC_ASSERT(spec.autotp_size() == c.source().tp());
  for (const Topology& t : {c.source(), c.target()}) {
    RC_ASSERT(t.tp() >= 1 && t.tp() <= 4 && t.pp() == 1 && t.dp() >= 1 && t.dp() <= 4);
  }
  RC_ASSERT(c.zero_stage() == 1 || c.zero_stage() == 2);
  std::vector<std::string> names;
  bool fused = false, uneven_vocab = false;
  for (const ModelParam& p : spec.param()) {
    names.push_back(p.name());
    RC_ASSERT(p.rule().autotp_widths());
    fused |= p.rule().kind() == SUB_PARAMS;
    for (int tp : {c.source().tp(), c.target().tp()}) {
      // AutoTP cuts attention projections in whole heads: even.
      if (absl::StrContains(p.name(), "self_attn") && p.rule().kind() != REPLICATED) {
        RC_ASSERT(p.shape(p.rule().kind() == ROW ? 1 : 0) % tp == 0);
      }
      // Every rank holds a row of every split dim.
      if (p.rule().kind() != REPLICATED) RC_ASSERT(p.shape(p.rule().kind() == ROW ? 1 : 0) >= tp);
      uneven_vocab |= p.rule().kind() == VOCAB && p.shape(0) % tp != 0;
    }
    // The Llama's lm_head is AutoTP's vocabulary cut in every version (0.18.9's
    // saves hold it whole: the writer's layout of that version).
    if (p.name() == "lm_head.weight" && !fused) RC_ASSERT(p.rule().kind() == VOCAB);
  }
  if (fused) RC_ASSERT(c.ds_version() == "0.19.6" && c.target_ds_version() == "0.19.6");
  // 0.19.5 cuts an uneven vocabulary by columns: not written.
  if (uneven_vocab) RC_ASSERT(c.ds_version() != "0.19.5" && c.target_ds_version() != "0.19.5");
  RC_ASSERT(rules::DetectPreset(names) == std::optional<std::string>("hf-llama"));
  // The Megatron-style twin is the same model without the AutoTP metadata.
  const GoldenCase twin = MegatronTwin(c);
  RC_ASSERT(!twin.model().autotp() && twin.model().param_size() == spec.param_size());
  RC_ASSERT(ValidateModelSpec(twin.model()).ok());
}

TEST(ModelGenTest, HfCasesCoverStagesStylesAndFreezing) {
  std::map<std::string, std::set<std::string>> seen;
  CaseGenOptions o;
  o.hf_only = true;
  for (int i = 0; i < 400; ++i) {
    const GoldenCase c = GenCase(o)(rc::Random(static_cast<uint64_t>(i) * 7919 + 3), 50).value();
    seen["style"].insert(c.model().style());
    seen["stages"].insert(absl::StrCat(c.source_zero_stage(), "->", c.target_zero_stage()));
    seen["lp"].insert(c.model().lp_dtype());
    seen["dp"].insert(absl::StrCat(c.source().dp()));
    for (const auto& f : CaseFeatures(c)) seen["features"].insert(f);
    bool frozen_embedding = false;
    for (const ModelParam& p : c.model().param()) {
      frozen_embedding |= p.role() == "frozen" && (absl::StrContains(p.name(), "embed") || absl::StrContains(p.name(), "wte"));
    }
    if (frozen_embedding) seen["features"].insert("frozen_embedding");
  }
  EXPECT_EQ(seen["style"], (std::set<std::string>{"hf-gpt-neox", "hf-gpt2", "hf-llama"}));
  // Every stage to every stage (bf16: 0, 1, 3).
  EXPECT_EQ(seen["stages"].size(), 16u) << absl::StrJoin(seen["stages"], " ");
  EXPECT_EQ(seen["lp"].size(), 3u);
  EXPECT_EQ(seen["dp"].size(), 8u);
  for (const std::string f : {"frozen", "frozen_embedding", "peft", "tied_alias", "buffer", "hf_names",
                              "zero_stage_change", "ds_version_change", "numpy2"}) {
    EXPECT_TRUE(seen["features"].count(f)) << f << " not drawn: " << absl::StrJoin(seen["features"], ", ");
  }
}

}  // namespace
}  // namespace ucp::conformance
