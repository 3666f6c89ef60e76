// Rules that test shapes, the savanna preset against savanna's own tensors,
// generalized patterns, and the suggestions' evidence logic.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "deepspeed/engine_defaults.h"
#include "format/pickle/value.h"
#include "rules/hf_names.h"
#include "rules/presets.h"
#include "rules/rules.h"
#include "rules/suggest.h"
#include "tp/merge.h"

namespace ucp::rules {
namespace {

using ::testing::HasSubstr;

MergeRules Parse(const std::string& text) {
  auto r = ParseRulesText(text, "test");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : MergeRules();
}

TEST(ShapeConditionsTest, RankAndDimSizeSelectTheRule) {
  auto set = RuleSet::Compile(Parse(R"pb(
    rule { pattern: ".*\\.filter\\.(p|R)$" ndim: 3 kind: ROW }
    rule { pattern: ".*\\.filter\\.(p|R)$" ndim: 2 dim_size { dim: 1 size: 4 } kind: COLUMN }
    rule { pattern: ".*\\.filter\\.(p|R)$" kind: REPLICATED }
  )pb"),
                             PRESET, "test");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->Match("2.mixer.mixer.filter.p", {4, 8, 2})->kind(), ROW);
  EXPECT_EQ(set->Match("2.mixer.mixer.filter.p", {8, 4})->kind(), COLUMN);
  EXPECT_EQ(set->Match("2.mixer.mixer.filter.R", {8, 6})->kind(), REPLICATED);  // dim 1 is not 4
  EXPECT_EQ(set->Match("2.mixer.mixer.filter.R", {8})->kind(), REPLICATED);
  EXPECT_EQ(set->Match("2.mixer.mixer.filter.h", {8, 4}), nullptr);
  EXPECT_EQ(set->MatchIndex("2.mixer.mixer.filter.p", {8, 4}), 1);
  // Names alone (preset detection) ignore the conditions.
  EXPECT_EQ(set->MatchNameIndex("2.mixer.mixer.filter.p"), 0);
  EXPECT_FALSE(ShapeConditionsHold(set->rules().rule(0), {8, 4}));
  EXPECT_TRUE(ShapeConditionsHold(set->rules().rule(0), {4, 8, 2}));
  EXPECT_EQ(DescribeShapeConditions(set->rules().rule(1)), "ndim 2, dim 1 = 4");
}

TEST(ShapeConditionsTest, ADimSizeOnTheSplitDimIsRefused) {
  // Column splits dim 0: a tp slice and the full tensor differ there.
  auto set = RuleSet::Compile(Parse(R"pb(rule { pattern: "x$" dim_size { dim: 0 size: 8 } kind: COLUMN })pb"),
                              RULE_FILE, "f.textproto");
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(set.status().message(), HasSubstr("tests the size of dim 0, the dim it splits"));
  // Row splits dim 1: dim 0 may be tested.
  EXPECT_TRUE(RuleSet::Compile(Parse(R"pb(rule { pattern: "x$" dim_size { dim: 0 size: 8 } kind: ROW })pb"),
                               RULE_FILE, "f")
                  .ok());
  // A dim past the rank it requires.
  EXPECT_FALSE(RuleSet::Compile(Parse(R"pb(rule { pattern: "x$" ndim: 2 dim_size { dim: 2 size: 8 } kind: ROW })pb"),
                                RULE_FILE, "f")
                   .ok());
  auto no_kind = RuleSet::Compile(Parse(R"pb(rule { pattern: "x$" kind: MERGE_KIND_UNSPECIFIED })pb"), RULE_FILE, "f");
  ASSERT_FALSE(no_kind.ok());
  EXPECT_THAT(no_kind.status().message(), HasSubstr("has no kind"));
}

TEST(ShapeConditionsTest, TheResolverDecidesByShapeAndSaysSo) {
  // A rules file is the first source: use one.
  const std::string path = ::testing::TempDir() + "/shape_rules.textproto";
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("rule { pattern: \".*p$\" ndim: 3 kind: ROW }\nrule { pattern: \".*p$\" kind: COLUMN }\n", f);
  fclose(f);
  RuleResolver::Options o;
  o.rules_file = path;
  o.preset = "none";
  auto r = RuleResolver::Make(o, *pickle::Value::MakeDict(), {"a.p"});
  ASSERT_TRUE(r.ok()) << r.status();
  RuleDecision d3 = r->Decide("a.p", {4, 2, 2});
  ASSERT_TRUE(d3.rule.has_value());
  EXPECT_EQ(d3.rule->kind(), ROW);
  EXPECT_THAT(d3.origin, HasSubstr("(ndim 3)"));
  RuleDecision d2 = r->Decide("a.p", {4, 2});
  ASSERT_TRUE(d2.rule.has_value());
  EXPECT_EQ(d2.rule->kind(), COLUMN);
}

TEST(RuleResolverTest, AutoTpUnsupportedPatternsAreRefusedNamingPatternAndReason) {
  // universal_checkpoint_info 0.4 (DeepSpeed master, layers.py
  // collect_autotp_universal_checkpoint_info): pattern -> reason.
  auto uc = pickle::Value::MakeDict();
  auto unsupported = pickle::Value::MakeDict();
  unsupported->DictSet(pickle::Value::Str("^model\\.layers\\.0\\.mlp\\.experts\\.w$"),
                       pickle::Value::Str("packed experts are not supported"));
  uc->DictSet(pickle::Value::Str("autotp_unsupported_parameter_patterns"), unsupported);
  RuleResolver::Options o;
  o.preset = "none";
  auto r = RuleResolver::Make(o, *uc, {"model.layers.0.mlp.experts.w", "model.norm.weight"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->CheckSupported("model.norm.weight").ok());
  EXPECT_TRUE(r->CheckSupported("model.layers.1.mlp.experts.w").ok());
  absl::Status s = r->CheckSupported("model.layers.0.mlp.experts.w");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.0.mlp.experts.w'"));
  EXPECT_THAT(s.message(), HasSubstr("packed experts are not supported"));
  EXPECT_THAT(s.message(), HasSubstr("autotp_unsupported_parameter_patterns '^model"));
  // An empty dict (what every 0.4 checkpoint here carries) refuses nothing.
  auto empty = pickle::Value::MakeDict();
  empty->DictSet(pickle::Value::Str("autotp_unsupported_parameter_patterns"), pickle::Value::MakeDict());
  auto r2 = RuleResolver::Make(o, *empty, {"model.norm.weight"});
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE(r2->CheckSupported("model.layers.0.mlp.experts.w").ok());
}

// DeepSpeed's MoE router is replicated whatever the model (no preset, no
// rules file); a rules file still says otherwise; a model with no router has
// the same effective rules as before.
TEST(RuleResolverTest, DeepSpeedsMoeRouterIsReplicatedWithoutRules) {
  RuleResolver::Options o;
  o.preset = "none";
  const std::string gate = "h.0.mlp.deepspeed_moe.gate.wg.weight";
  const std::string expert = "h.0.mlp.deepspeed_moe.experts.deepspeed_experts.0.w1.weight";
  auto r = RuleResolver::Make(o, *pickle::Value::MakeDict(), {gate, expert});
  ASSERT_TRUE(r.ok()) << r.status();
  RuleDecision d = r->Decide(gate, {4, 16});
  ASSERT_TRUE(d.rule.has_value());
  EXPECT_EQ(d.rule->kind(), REPLICATED);
  EXPECT_EQ(d.source, PRESET);
  EXPECT_THAT(d.origin, HasSubstr(kDeepSpeedModulesLabel));
  EXPECT_FALSE(r->Decide(expert, {8, 4}).rule.has_value());
  EXPECT_FALSE(r->Decide("h.0.mlp.deepspeed_moe.gate.wg.bias", {4}).rule.has_value());
  EXPECT_EQ(r->EffectiveRules().rule_size(), 1);

  auto plain = RuleResolver::Make(o, *pickle::Value::MakeDict(), {"h.0.mlp.dense_4h_to_h.weight"});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->EffectiveRules().rule_size(), 0);

  const std::string path = ::testing::TempDir() + "/gate_rules.textproto";
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("rule { pattern: \".*gate\\\\.wg\\\\.weight$\" kind: COLUMN }\n", f);
  fclose(f);
  o.rules_file = path;
  auto told = RuleResolver::Make(o, *pickle::Value::MakeDict(), {gate});
  ASSERT_TRUE(told.ok()) << told.status();
  RuleDecision t = told->Decide(gate, {4, 16});
  ASSERT_TRUE(t.rule.has_value());
  EXPECT_EQ(t.rule->kind(), COLUMN);
  EXPECT_EQ(t.source, RULE_FILE);
}

// deepspeed::DeclaredMergePatterns (what a ZeRO checkpoint written from a
// Hugging Face or DCP source declares): read back as the checkpoint's
// patterns, each param is decided to the rule it was written with, names
// with regex characters included; a param no DeepSpeed list can say declares
// nothing at all.
TEST(DeclaredMergePatternsTest, ReadBackEveryParamDecidesItsOwnRule) {
  state::ModelInfo info;
  auto add = [&](const std::string& name, MergeRule rule) {
    state::ParamState p;
    p.name = name;
    p.full_shape = {12, 8};
    p.rule = rule;
    info.params.push_back(p);
  };
  auto kind = [](MergeKind k) {
    MergeRule r;
    r.set_kind(k);
    return r;
  };
  MergeRule vocab = kind(VOCAB);
  vocab.set_original_vocab_size(11);
  MergeRule swiglu = kind(SUB_PARAMS);
  swiglu.set_num_sub_params(2);
  swiglu.set_cat_dim(0);
  add("0.word_embeddings.weight", vocab);
  add("2.input_layernorm.weight", kind(REPLICATED));
  add("2.self_attention.query_key_value.weight", kind(COLUMN));
  add("2.self_attention.dense.weight", kind(ROW));
  add("2.mlp.dense_h_to_4h.weight", swiglu);
  add("2.mlp.router.weight", kind(AVERAGE));
  add("tied_modules.embed[0].weight", kind(ROW));  // '[' and '.' are regex characters
  pickle::ValuePtr uc = deepspeed::DeclaredMergePatterns(info);
  ASSERT_NE(uc, nullptr);
  std::vector<std::string> names;
  for (const auto& p : info.params) names.push_back(p.name);
  RuleResolver::Options o;
  o.preset = "none";
  auto r = RuleResolver::Make(o, *uc, names);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& p : info.params) {
    SCOPED_TRACE(p.name);
    RuleDecision d = r->Decide(p.name, p.full_shape);
    if (!d.rule) d = r->DecideWithoutRules(p.name, std::nullopt);
    ASSERT_TRUE(d.rule.has_value());
    EXPECT_EQ(d.source, CHECKPOINT_INFO);
    EXPECT_EQ(d.rule->kind(), p.rule.kind());
    EXPECT_EQ(d.rule->num_sub_params(), p.rule.num_sub_params());
    if (p.rule.kind() == VOCAB) EXPECT_EQ(d.rule->original_vocab_size(), 11);
  }
  // The pattern of one name matches no other (re.match: a prefix would).
  EXPECT_FALSE(r->Decide("2.self_attention.dense.weight_extra", {8, 8}).rule.has_value());
  // Undecided, or uneven sub-params: nothing declared.
  add("3.mlp.w", MergeRule());
  EXPECT_EQ(deepspeed::DeclaredMergePatterns(info), nullptr);
  info.params.pop_back();
  MergeRule gqa = kind(SUB_PARAMS);
  gqa.mutable_sub_param_shape()->add_dim()->add_size(8);
  add("3.qkv", gqa);
  EXPECT_EQ(deepspeed::DeclaredMergePatterns(info), nullptr);
}

TEST(GeneralizedPatternTest, LayerIndicesBecomeDigitRuns) {
  EXPECT_EQ(GeneralizedPattern("sequential.3.mlp.w1.weight"), "sequential\\.\\d+\\.mlp\\.w1\\.weight$");
  EXPECT_EQ(GeneralizedPattern("12.mixer.mixer.filter.p"), "\\d+\\.mixer\\.mixer\\.filter\\.p$");
  EXPECT_EQ(GeneralizedPattern("tied_modules.embed.word_embeddings.weight"),
            "tied_modules\\.embed\\.word_embeddings\\.weight$");
  EXPECT_EQ(GeneralizedPattern("blocks.w3x.b2"), "blocks\\.w3x\\.b2$");  // digits inside a component stay
  EXPECT_EQ(ExactPattern("a.b[0]"), "a\\.b\\[0\\]$");
}

// savanna's tensors as its code creates them (h = 64, G = 8 groups at tp=1),
// with the split dim each has there (-1: whole on every rank), for both of
// its naming schemes. Read off model/block.py, model/operators/hyena/*.py,
// mpu/layers.py and model/operators/local/base.py; see the preset's comments.
struct SavannaTensor {
  std::string local;
  std::vector<int64_t> shape;
  int split_dim;  // -1 whole
  MergeKind kind;
};
const std::vector<SavannaTensor>& SavannaTensors() {
  static const auto* t = new std::vector<SavannaTensor>{
      {"input_layernorm.scale", {64}, -1, REPLICATED},
      {"post_attention_layernorm.scale", {64}, -1, REPLICATED},
      {"pre_mlp_layernorm.weight", {64}, -1, REPLICATED},
      {"outer_mlp_layernorm.scale", {64}, -1, REPLICATED},
      {"mixer.dense_projection.weight", {192, 64}, 0, COLUMN},
      {"mixer.hyena_proj_conv.short_conv_weight", {192, 1, 3}, 0, COLUMN},
      {"mixer.hyena_proj_conv.short_conv_weight", {192, 3}, 0, COLUMN},
      {"mixer.mixer.conv_bias", {64}, 0, COLUMN},
      {"mixer.mixer.short_conv.short_conv_weight", {8, 1, 3}, 0, COLUMN},
      {"mixer.mixer.filter.h", {8, 16}, 0, COLUMN},
      {"mixer.mixer.filter.decay", {8, 16}, 0, COLUMN},
      {"mixer.mixer.filter.t", {1, 1, 16}, -1, REPLICATED},
      {"mixer.mixer.filter.gamma", {8, 4}, 0, COLUMN},
      {"mixer.mixer.filter.R", {8, 4}, 0, COLUMN},
      {"mixer.mixer.filter.p", {8, 4}, 0, COLUMN},
      {"mixer.mixer.filter.dt", {4, 8}, 1, ROW},
      {"mixer.mixer.filter.p", {4, 8, 2}, 1, ROW},
      {"mixer.mixer.filter.R", {4, 8, 2}, 1, ROW},
      {"mixer.mixer.filter.residues_norm.weight", {8}, 0, COLUMN},
      {"mixer.mixer.filter.residues_norm.bias", {8}, 0, COLUMN},
      {"mixer.mixer.filter.inner_cls.log_dt", {8}, 0, COLUMN},
      {"mixer.mixer.filter.inner_cls.inv_A_real", {8, 2}, 0, COLUMN},
      {"mixer.mixer.filter.inner_cls.A_imag", {8, 2}, 0, COLUMN},
      {"mixer.mixer.filter.inner_cls.B", {8, 2, 2}, 0, COLUMN},
      {"mixer.mixer.filter.inner_cls.C", {1, 8, 2, 2}, 1, ROW},
      {"mixer.rotary_emb.inv_freq", {8}, -1, REPLICATED},
      {"mixer.dense.weight", {64, 64}, 1, ROW},
      {"mixer.dense.bias", {64}, -1, REPLICATED},
      {"mlp.w1.weight", {96, 64}, 0, COLUMN},
      {"mlp.w2.weight", {96, 64}, 0, COLUMN},
      {"mlp.w3.weight", {64, 96}, 1, ROW},
      // mlp_type short_hyena: the MLP is a hyena_se sequence mixer.
      {"mlp.dense_projection.weight", {192, 64}, 0, COLUMN},
      {"mlp.hyena_proj_conv.short_conv_weight", {192, 1, 3}, 0, COLUMN},
      {"mlp.mixer.short_conv.short_conv_weight", {8, 1, 3}, 0, COLUMN},
      {"mlp.dense.weight", {64, 64}, 1, ROW},
      {"mlp.dense.bias", {64}, -1, REPLICATED},
  };
  return *t;
}

TEST(SavannaPresetTest, EveryTensorIsSplitAsSavannaSplitsIt) {
  auto rules = PresetRules("savanna");
  ASSERT_TRUE(rules.ok()) << rules.status();
  auto set = RuleSet::Compile(*rules, PRESET, "savanna");
  ASSERT_TRUE(set.ok()) << set.status();
  for (const std::string prefix : {"5.", "sequential.5."}) {
    for (const SavannaTensor& t : SavannaTensors()) {
      const std::string name = prefix + t.local;
      SCOPED_TRACE(name + " " + std::to_string(t.shape.size()) + "-D");
      const MergeRule* r = set->Match(name, t.shape);
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(r->kind(), t.kind);
      EXPECT_EQ(tp::PartitionDim(*r), t.split_dim);
      // A tp=2 slice's shape selects the same rule.
      std::vector<int64_t> slice = t.shape;
      if (t.split_dim >= 0) slice[t.split_dim] /= 2;
      EXPECT_EQ(set->Match(name, slice), r);
    }
  }
  // Outside the blocks: embeddings (tied or not), the final norm, the output layer.
  EXPECT_EQ(set->Match("tied_modules.embed.word_embeddings.weight", {50, 64})->kind(), VOCAB);
  EXPECT_EQ(set->Match("0.word_embeddings.weight", {50, 64})->kind(), VOCAB);
  EXPECT_EQ(set->Match("sequential.0.word_embeddings.weight", {50, 64})->kind(), VOCAB);
  EXPECT_EQ(set->Match("12.final_linear.weight", {50, 64})->kind(), VOCAB);
  EXPECT_EQ(set->Match("sequential.12.final_linear.weight", {50, 64})->kind(), VOCAB);
  for (const char* n : {"11.norm.scale", "11.norm.weight", "sequential.11.norm.scale", "sequential.11.norm.weight"}) {
    EXPECT_EQ(set->Match(n, {64})->kind(), REPLICATED) << n;
  }
}

std::vector<std::string> SavannaNames(const std::string& prefix, bool tied) {
  std::vector<std::string> names = {tied ? "tied_modules.embed.word_embeddings.weight"
                                         : prefix + "0.word_embeddings.weight"};
  for (int l = 2; l < 6; ++l) {
    for (const SavannaTensor& t : SavannaTensors()) names.push_back(prefix + std::to_string(l) + "." + t.local);
  }
  names.push_back(prefix + "7.norm.scale");
  if (!tied) names.push_back(prefix + "8.final_linear.weight");
  return names;
}

TEST(SavannaPresetTest, DetectedFromEitherNaming) {
  EXPECT_EQ(DetectPreset(SavannaNames("", /*tied=*/true)), "savanna");
  EXPECT_EQ(DetectPreset(SavannaNames("sequential.", /*tied=*/false)), "savanna");
  // A GPT-NeoX model stays GPT-NeoX.
  std::vector<std::string> neox = {"0.word_embeddings.weight"};
  for (int l = 2; l < 4; ++l) {
    for (const char* s : {"input_layernorm.scale", "attention.query_key_value.weight", "attention.dense.weight",
                          "attention.dense.bias", "post_attention_layernorm.scale", "mlp.dense_h_to_4h.weight",
                          "mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.bias"}) {
      neox.push_back(std::to_string(l) + "." + s);
    }
  }
  neox.push_back("5.norm.scale");
  EXPECT_EQ(DetectPreset(neox), "gpt-neox");
  // Every block's MLP a DeepSpeed MoE layer (router and 8 experts): those names,
  // more than the model's own, are not counted.
  std::vector<std::string> moe;
  for (const std::string& n : neox) {
    if (n.find(".mlp.") == std::string::npos) moe.push_back("sequential." + n);
  }
  for (int l = 2; l < 4; ++l) {
    const std::string block = "sequential." + std::to_string(l) + ".mlp.deepspeed_moe.";
    moe.push_back(block + "gate.wg.weight");
    for (int e = 0; e < 8; ++e) {
      for (const char* s : {"0.weight", "0.bias", "2.weight", "2.bias"}) {
        moe.push_back(block + "experts.deepspeed_experts." + std::to_string(e) + "." + s);
      }
    }
  }
  EXPECT_EQ(DetectPreset(moe), "gpt-neox");
  EXPECT_EQ(DetectPreset({"sequential.2.mlp.deepspeed_moe.gate.wg.weight"}), std::nullopt);
  // The pipeline layer classes savanna's backbone.py builds.
  LayerTypeNamer namer = LayerTypeNamerFor("savanna");
  EXPECT_EQ(namer({"input_layernorm.scale", "mixer.dense_projection.weight", "mlp.w1.weight"}), "ParallelBlockPipe");
  EXPECT_EQ(namer({"word_embeddings.weight"}), "EmbeddingPipe");
  EXPECT_EQ(namer({"norm.scale"}), "NormPipe");
  EXPECT_EQ(namer({"final_linear.weight"}), "ParallelLinearPipe");
}

// --- Hugging Face names (rules/presets/hf-*.textproto) ---

struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  MergeKind kind;
  int split_dim;  // -1: whole
};

// Every param of tiny transformers 5.12 instances (names and shapes as
// `model.state_dict()` gives them) and how AutoTP splits it from the
// family's tp plan (FINDINGS 4.2: colwise -> dim 0, rowwise -> dim 1, no
// plan entry -> whole).
std::vector<HfTensor> LlamaLikeTensors(const std::string& prefix) {
  const std::string l = prefix + "model.layers.1.";
  return {
      {prefix + "model.embed_tokens.weight", {128, 64}, REPLICATED, -1},
      {l + "self_attn.q_proj.weight", {64, 64}, COLUMN, 0},
      {l + "self_attn.q_proj.bias", {64}, COLUMN, 0},  // Qwen2
      {l + "self_attn.k_proj.weight", {32, 64}, COLUMN, 0},
      {l + "self_attn.v_proj.weight", {32, 64}, COLUMN, 0},
      {l + "self_attn.o_proj.weight", {64, 64}, ROW, 1},
      {l + "self_attn.q_norm.weight", {16}, REPLICATED, -1},  // Qwen3
      {l + "self_attn.k_norm.weight", {16}, REPLICATED, -1},
      {l + "mlp.gate_proj.weight", {128, 64}, COLUMN, 0},
      {l + "mlp.up_proj.weight", {128, 64}, COLUMN, 0},
      {l + "mlp.down_proj.weight", {64, 128}, ROW, 1},
      {l + "input_layernorm.weight", {64}, REPLICATED, -1},
      {l + "post_attention_layernorm.weight", {64}, REPLICATED, -1},
      {l + "pre_feedforward_layernorm.weight", {64}, REPLICATED, -1},  // Gemma2/3
      {l + "post_feedforward_layernorm.weight", {64}, REPLICATED, -1},
      {l + "self_attn.dense.weight", {64, 64}, ROW, 1},  // Phi
      {l + "self_attn.dense.bias", {64}, REPLICATED, -1},
      {l + "mlp.fc1.weight", {128, 64}, COLUMN, 0},
      {l + "mlp.fc1.bias", {128}, COLUMN, 0},
      {l + "mlp.fc2.weight", {64, 128}, ROW, 1},
      {l + "mlp.fc2.bias", {64}, REPLICATED, -1},
      {l + "mlp.c_fc.weight", {128, 64}, COLUMN, 0},  // Starcoder2
      {l + "mlp.c_proj.weight", {64, 128}, ROW, 1},
      {l + "mlp.c_proj.bias", {64}, REPLICATED, -1},
      {l + "mlp.gate.weight", {2, 64}, REPLICATED, -1},  // Mixtral / Qwen2-MoE routers and experts
      {l + "mlp.experts.gate_up_proj", {2, 256, 64}, REPLICATED, -1},
      {l + "mlp.shared_expert.gate_proj.weight", {32, 64}, REPLICATED, -1},
      {l + "mlp.gate_up_proj.weight", {256, 64}, SUB_PARAMS, 0},  // Phi-3
      {prefix + "model.final_layernorm.weight", {64}, REPLICATED, -1},
      {prefix + "model.norm.weight", {64}, REPLICATED, -1},
      {prefix + "lm_head.weight", {128, 64}, COLUMN, 0},
  };
}

void ExpectSplits(const std::string& preset, const std::vector<HfTensor>& tensors) {
  auto rules = PresetRules(preset);
  ASSERT_TRUE(rules.ok()) << rules.status();
  auto set = RuleSet::Compile(*rules, PRESET, preset);
  ASSERT_TRUE(set.ok()) << set.status();
  for (const HfTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    const MergeRule* r = set->Match(t.name, t.shape);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->kind(), t.kind);
    if (t.split_dim >= 0) {
      EXPECT_EQ(tp::PartitionDim(*r), t.split_dim);
    }
  }
}

TEST(HfPresetTest, LlamaStyleFamiliesSplitAsAutoTpSplitsThem) {
  ExpectSplits("hf-llama", LlamaLikeTensors(""));
  // Phi-3's fused [gate; up] is two sub-params; its qkv_proj is left to a rule.
  auto set = RuleSet::Compile(*PresetRules("hf-llama"), PRESET, "hf-llama");
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->Match("model.layers.0.mlp.gate_up_proj.weight", {256, 64})->num_sub_params(), 2);
  EXPECT_EQ(set->Match("model.layers.0.self_attn.qkv_proj.weight", {128, 64}), nullptr);
}

TEST(HfPresetTest, PeftLoraNamesSplitAsTheirBaseLayer) {
  const std::string p = "base_model.model.model.layers.0.";
  ExpectSplits("hf-llama", {
                               {p + "self_attn.q_proj.base_layer.weight", {64, 64}, COLUMN, 0},
                               {p + "self_attn.q_proj.lora_A.default.weight", {4, 64}, REPLICATED, -1},
                               {p + "self_attn.q_proj.lora_B.default.weight", {64, 4}, COLUMN, 0},
                               {p + "self_attn.o_proj.base_layer.weight", {64, 64}, ROW, 1},
                               {p + "self_attn.o_proj.lora_A.default.weight", {4, 64}, ROW, 1},
                               {p + "self_attn.o_proj.lora_B.default.weight", {64, 4}, REPLICATED, -1},
                               {p + "mlp.down_proj.lora_A.default.weight", {4, 128}, ROW, 1},
                               {"base_model.model.model.embed_tokens.weight", {128, 64}, REPLICATED, -1},
                               {"base_model.model.lm_head.weight", {128, 64}, COLUMN, 0},
                           });
  ExpectSplits("hf-llama", LlamaLikeTensors("base_model.model."));
}

TEST(HfPresetTest, GptNeoxAndGpt2) {
  ExpectSplits("hf-gpt-neox", {
                                  {"gpt_neox.embed_in.weight", {128, 64}, REPLICATED, -1},
                                  {"gpt_neox.layers.0.input_layernorm.bias", {64}, REPLICATED, -1},
                                  {"gpt_neox.layers.0.attention.query_key_value.weight", {192, 64}, COLUMN, 0},
                                  {"gpt_neox.layers.0.attention.query_key_value.bias", {192}, COLUMN, 0},
                                  {"gpt_neox.layers.0.attention.dense.weight", {64, 64}, ROW, 1},
                                  {"gpt_neox.layers.0.attention.dense.bias", {64}, REPLICATED, -1},
                                  {"gpt_neox.layers.0.mlp.dense_h_to_4h.weight", {128, 64}, COLUMN, 0},
                                  {"gpt_neox.layers.0.mlp.dense_4h_to_h.weight", {64, 128}, ROW, 1},
                                  {"gpt_neox.layers.0.mlp.dense_4h_to_h.bias", {64}, REPLICATED, -1},
                                  {"gpt_neox.final_layer_norm.weight", {64}, REPLICATED, -1},
                                  {"embed_out.weight", {128, 64}, COLUMN, 0},
                              });
  // Conv1D weights are [in, out]: column-parallel ones split dim 1, row-parallel ones dim 0.
  ExpectSplits("hf-gpt2", {
                              {"transformer.wte.weight", {128, 64}, REPLICATED, -1},
                              {"transformer.wpe.weight", {64, 64}, REPLICATED, -1},
                              {"transformer.h.0.ln_1.weight", {64}, REPLICATED, -1},
                              {"transformer.h.0.attn.c_attn.weight", {64, 192}, SUB_PARAMS, 1},
                              {"transformer.h.0.attn.c_attn.bias", {192}, SUB_PARAMS, 0},
                              {"transformer.h.0.attn.c_proj.weight", {64, 64}, COLUMN, 0},
                              {"transformer.h.0.attn.c_proj.bias", {64}, REPLICATED, -1},
                              {"transformer.h.0.mlp.c_fc.weight", {64, 256}, ROW, 1},
                              {"transformer.h.0.mlp.c_fc.bias", {256}, COLUMN, 0},
                              {"transformer.h.0.mlp.c_proj.weight", {256, 64}, COLUMN, 0},
                              {"transformer.h.0.mlp.c_proj.bias", {64}, REPLICATED, -1},
                              {"transformer.ln_f.bias", {64}, REPLICATED, -1},
                          });
}

std::vector<std::string> Names(const std::vector<HfTensor>& tensors) {
  std::vector<std::string> out;
  for (const HfTensor& t : tensors) out.push_back(t.name);
  return out;
}

TEST(HfPresetTest, DetectedFromTheNamesAndTheConfigModelType) {
  // A Trainer's Llama (FINDINGS 1: the tiny LlamaForCausalLM's 21 params).
  std::vector<std::string> llama = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  for (int l = 0; l < 2; ++l) {
    for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"}) {
      llama.push_back("model.layers." + std::to_string(l) + "." + s);
    }
  }
  EXPECT_EQ(DetectPreset(llama), "hf-llama");
  EXPECT_EQ(DetectPreset(llama, "llama"), "hf-llama");
  EXPECT_EQ(DetectPreset(llama, "mistral"), "hf-llama");
  EXPECT_EQ(DetectPreset(Names(LlamaLikeTensors("base_model.model."))), "hf-llama");
  // Megatron-DeepSpeed's Llama-style pipeline names stay megatron-deepspeed.
  std::vector<std::string> pipe = {"tied_modules.embed.word_embeddings.weight", "4.weight"};
  for (const char* s : {"self_attn.q_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight",
                        "input_layernorm.weight", "post_attention_layernorm.weight"}) {
    pipe.push_back(std::string("2.") + s);
  }
  EXPECT_EQ(DetectPreset(pipe), "megatron-deepspeed");
  std::vector<std::string> gpt2 = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                                   "transformer.ln_f.bias"};
  for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                        "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
    gpt2.push_back(std::string("transformer.h.0.") + s);
  }
  EXPECT_EQ(DetectPreset(gpt2), "hf-gpt2");
  EXPECT_EQ(DetectPreset(gpt2, "gpt2"), "hf-gpt2");
  // GPTBigCode has GPT-2's names with nn.Linear weights: its config.json says so.
  EXPECT_NE(DetectPreset(gpt2, "gpt_bigcode"), "hf-gpt2");
  std::vector<std::string> neox = {"gpt_neox.embed_in.weight", "gpt_neox.final_layer_norm.weight",
                                   "gpt_neox.final_layer_norm.bias", "embed_out.weight"};
  for (const char* s : {"input_layernorm.weight", "attention.query_key_value.weight", "attention.dense.weight",
                        "attention.dense.bias", "mlp.dense_h_to_4h.weight", "mlp.dense_4h_to_h.weight"}) {
    neox.push_back(std::string("gpt_neox.layers.0.") + s);
  }
  EXPECT_EQ(DetectPreset(neox), "hf-gpt-neox");
}

// --- the suggestions' evidence ---

ParamFacts Facts(const std::string& name, std::vector<int64_t> slice, std::optional<bool> equal) {
  ParamFacts f;
  f.name = name;
  f.slice_shape = std::move(slice);
  f.tp_equal = equal;
  f.diff_state = "fp32";
  f.max_diff = 0.5;
  return f;
}

TEST(SuggestFamiliesTest, EvidenceDecidesOrSaysItCannot) {
  const SuggestContext ctx{2, 64};
  std::vector<ParamFacts> facts = {
      Facts("b.0.row", {64, 32}, false),       Facts("b.1.row", {64, 32}, false),
      Facts("b.0.col", {48, 64}, false),       Facts("b.0.square", {64, 64}, false),
      Facts("b.0.conv", {96, 1, 3}, false),    Facts("b.0.bias", {24}, false),
      Facts("b.0.hbias", {64}, false),         Facts("b.0.scalar", {}, false),
      Facts("b.0.norm_w", {64}, true),         Facts("b.1.norm_w", {64}, true),
  };
  facts.push_back(Facts("c.decided", {64, 32}, std::nullopt));
  facts.back().decided = true;
  std::vector<FamilySuggestion> s = SuggestFamilies(facts, ctx);
  ASSERT_EQ(s.size(), 7u);  // the equal norm_w family is left to evidence
  EXPECT_EQ(s[0].rule.pattern(), "b\\.\\d+\\.row$");
  EXPECT_EQ(s[0].members, (std::vector<std::string>{"b.0.row", "b.1.row"}));
  EXPECT_EQ(s[0].rule.kind(), ROW);
  EXPECT_THAT(s[0].evidence, HasSubstr("not REPLICATED"));
  EXPECT_EQ(s[1].rule.kind(), COLUMN);
  EXPECT_FALSE(s[2].decided());  // [64, 64]: both dims are hidden_size
  EXPECT_THAT(s[2].evidence, HasSubstr("both hidden_size 64"));
  EXPECT_FALSE(s[3].decided());  // neither dim is hidden_size
  EXPECT_EQ(s[3].candidates, (std::vector<MergeKind>{COLUMN, ROW}));
  EXPECT_EQ(s[4].rule.kind(), COLUMN);  // 1-D, not hidden-sized
  EXPECT_FALSE(s[5].decided());  // a [hidden] vector whose copies differ: split or drifted
  EXPECT_EQ(s[5].candidates, (std::vector<MergeKind>{AVERAGE, COLUMN}));
  EXPECT_FALSE(s[6].decided());  // 0-dim
  // With include_equal the equal family comes as REPLICATED.
  std::vector<FamilySuggestion> all = SuggestFamilies(facts, ctx, /*include_equal=*/true);
  ASSERT_EQ(all.size(), 8u);
  EXPECT_EQ(all[7].rule.kind(), REPLICATED);
  // Unknown hidden size: the split dim cannot be told.
  std::vector<FamilySuggestion> blind = SuggestFamilies({Facts("x.0.w", {64, 32}, false)}, {2, 0});
  ASSERT_EQ(blind.size(), 1u);
  EXPECT_FALSE(blind[0].decided());
  EXPECT_THAT(blind[0].evidence, HasSubstr("hidden_size unknown"));
  // tp = 1: no copies to compare.
  std::vector<FamilySuggestion> single = SuggestFamilies({Facts("x.0.w", {64, 32}, std::nullopt)}, {1, 64});
  ASSERT_EQ(single.size(), 1u);
  EXPECT_FALSE(single[0].decided());
  EXPECT_THAT(single[0].evidence, HasSubstr("tp=1"));
}

TEST(SuggestFamiliesTest, ASiblingThatDiffersOutweighsEqualCopies) {
  // Block 0's slices happen to be equal; block 1's differ: both are split.
  std::vector<ParamFacts> facts = {Facts("b.0.bias", {24}, true), Facts("b.1.bias", {24}, false)};
  EXPECT_EQ(FamilyCopiesEqual(facts), (std::vector<bool>{false, false}));
  std::vector<FamilySuggestion> s = SuggestFamilies(facts, {2, 64});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rule.kind(), COLUMN);
  EXPECT_EQ(s[0].members.size(), 2u);
  EXPECT_THAT(s[0].evidence, HasSubstr("tp copies differ (1 of 2"));
  // All equal: evidence may settle them.
  EXPECT_EQ(FamilyCopiesEqual({Facts("b.0.g", {64}, true), Facts("b.1.g", {64}, true)}),
            (std::vector<bool>{true, true}));
}

TEST(SuggestFamiliesTest, RanksSplitAFamilyAndDecidedNamesAreNotCaught) {
  std::vector<ParamFacts> facts = {Facts("f.0.p", {4, 64}, false), Facts("f.1.p", {2, 64, 8}, false),
                                   Facts("g.0.w", {48, 64}, false), Facts("g.1.w", {48, 64}, std::nullopt)};
  facts[3].decided = true;  // a rule names g.1.w only
  std::vector<FamilySuggestion> s = SuggestFamilies(facts, {2, 64});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].rule.ndim(), 2);
  EXPECT_EQ(s[1].rule.ndim(), 3);
  EXPECT_EQ(s[2].rule.pattern(), "g\\.0\\.w$");  // the generalized one would catch g.1.w
  const std::string text = SuggestionText(s[1]);
  EXPECT_THAT(text, HasSubstr("rule { pattern: \"f\\\\.\\\\d+\\\\.p$\" ndim: 3 kind: COLUMN }"));
}

// A Megatron-DeepSpeed Llama checkpoint with a config.json beside its tags
// (a Hugging Face import keeps its own there; it records no args): the
// megatron-deepspeed entry that lists the config's architecture maps the
// names, the config is written as is, and the architecture is the config's.
// Args the checkpoint has must still agree (swiglu false is refused).
TEST(HfNamesTest, TheCheckpointsOwnConfigNamesAMegatronDeepSpeedLlama) {
  state::ModelInfo info;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, MergeKind kind, int sub = 0) {
    state::ParamState p;
    p.name = name;
    p.full_shape = std::move(shape);
    p.rule.set_kind(kind);
    if (sub > 0) {
      p.rule.set_num_sub_params(sub);
      p.rule.set_cat_dim(0);
    }
    info.params.push_back(std::move(p));
  };
  add("0.word_embeddings.weight", {12, 8}, VOCAB);
  add("2.input_layernorm.weight", {8}, REPLICATED);
  add("2.self_attention.query_key_value.weight", {16, 8}, COLUMN);
  add("2.self_attention.dense.weight", {8, 8}, ROW);
  add("2.post_attention_layernorm.weight", {8}, REPLICATED);
  add("2.mlp.dense_h_to_4h.weight", {12, 8}, SUB_PARAMS, 2);
  add("2.mlp.dense_4h_to_h.weight", {8, 6}, ROW);
  add("4.weight", {8}, REPLICATED);
  add("5.lm_head.weight", {12, 8}, VOCAB);
  info.source_topology = state::Topology{2, 1, 1};
  info.Reindex();
  std::vector<int> order;
  for (size_t i = 0; i < info.params.size(); ++i) order.push_back(static_cast<int>(i));
  for (const std::string arch : {"LlamaForCausalLM", "MistralForCausalLM"}) {
    SCOPED_TRACE(arch);
    HfOptions o;
    o.preset = "megatron-deepspeed";
    o.checkpoint_config_json = "{\"architectures\": [\"" + arch +
                               "\"], \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"hidden_size\": 8}";
    o.checkpoint_architecture = arch;
    absl::StatusOr<HfNamePlan> plan = PlanHfNames(info, order, nullptr, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->config_verbatim);
    EXPECT_EQ(plan->architecture, arch);
    ASSERT_EQ(plan->tensors.size(), 12u);  // q, k, v and gate, up split
    EXPECT_EQ(plan->tensors[2].name, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(plan->tensors[2].groups, 2);  // grouped per kv head
    EXPECT_EQ(plan->tensors[2].length, 4);
    pickle::ValuePtr args = pickle::Value::MakeDict();
    args->DictSet(pickle::Value::Str("swiglu"), pickle::Value::Bool(false));
    absl::StatusOr<HfNamePlan> refused = PlanHfNames(info, order, args.get(), o);
    ASSERT_FALSE(refused.ok());
    EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("args.swiglu = False"));
    args->DictSet(pickle::Value::Str("swiglu"), pickle::Value::Bool(true));
    EXPECT_TRUE(PlanHfNames(info, order, args.get(), o).ok());
  }
}


TEST(RequiredLiteralTest, TheLongestLiteralRunOutsideGroupsClassesAndQuantifiers) {
  EXPECT_EQ(RequiredLiteral(".*\\.input_layernorm\\.(weight|bias)$"), ".input_layernorm.");
  EXPECT_EQ(RequiredLiteral("(.*\\.)?norm\\.(weight|bias|scale)$"), "norm.");
  EXPECT_EQ(RequiredLiteral("\\d+\\.(weight|bias)$"), ".");
  EXPECT_EQ(RequiredLiteral("ab*cd"), "cd");        // b may be absent: "a" and "cd" are runs
  EXPECT_EQ(RequiredLiteral("xyz?w"), "xy");         // z is optional
  EXPECT_EQ(RequiredLiteral("a{3}b"), "b");          // neither 'a' (quantified) nor the '3'
  EXPECT_EQ(RequiredLiteral("x[abc.]yz"), "yz");     // a class is no literal
  EXPECT_EQ(RequiredLiteral("(?=abc)def"), "def");   // group contents are not collected
  EXPECT_EQ(RequiredLiteral("\\x41\\.b"), ".b");     // \x41's digits are not literals
  EXPECT_EQ(RequiredLiteral("a\\db"), "a");          // \d is a class
  EXPECT_EQ(RequiredLiteral("layers|blocks"), "");   // either side may match
  EXPECT_EQ(RequiredLiteral(".*"), "");
}

// Every built-in preset's rules pick the same rule for every name with the
// literal prefilter as std::regex alone: names of each model family, and
// each with one character dropped (names that almost match).
TEST(RequiredLiteralTest, PresetMatchesAreThoseOfTheRegexAlone) {
  std::vector<std::string> names = {
      "0.word_embeddings.weight", "2.input_layernorm.weight", "2.attention.query_key_value.weight",
      "2.attention.query_key_value.bias", "2.attention.dense.weight", "2.attention.dense.bias",
      "2.post_attention_layernorm.bias", "2.mlp.dense_h_to_4h.weight", "2.mlp.dense_4h_to_h.bias",
      "15.norm.weight", "16.final_linear.weight", "sequential.5.mixer.dense.weight", "5.filter.h",
      "model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.o_proj.weight",
      "model.layers.3.mlp.gate_proj.weight", "model.layers.3.mlp.down_proj.weight", "model.norm.weight",
      "lm_head.weight", "transformer.h.1.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.bias", "transformer.wte.weight",
      "transformer.ln_f.bias", "h.2.self_attention.query_key_value.weight", "word_embeddings_layernorm.weight",
      "gpt_neox.layers.0.attention.dense.weight", "embed_out.weight", "language_model.encoder.layers.0.mlp.dense_4h_to_h.weight",
      "tied_modules.embed.word_embeddings.weight", "3.mlp.deepspeed_moe.experts.deepspeed_experts.0.dense_h_to_4h.weight"};
  const size_t base = names.size();
  for (size_t n = 0; n < base; ++n) {
    for (size_t i = 0; i < names[n].size(); ++i) names.push_back(names[n].substr(0, i) + names[n].substr(i + 1));
  }
  int compared = 0, matched = 0;
  for (const std::string& preset : PresetNames()) {
    auto rules = PresetRules(preset);
    ASSERT_TRUE(rules.ok()) << rules.status();
    auto set = RuleSet::Compile(*rules, PRESET, preset);
    ASSERT_TRUE(set.ok()) << set.status();
    std::vector<std::regex> plain;
    for (const MergeRule& r : rules->rule()) plain.emplace_back(r.pattern(), std::regex::ECMAScript);
    for (const std::string& name : names) {
      int want = -1;
      for (size_t i = 0; i < plain.size() && want < 0; ++i) {
        std::smatch m;
        if (std::regex_search(name, m, plain[i], std::regex_constants::match_continuous)) want = static_cast<int>(i);
      }
      EXPECT_EQ(set->MatchNameIndex(name), want) << preset << ": " << name;
      ++compared;
      matched += want >= 0;
    }
  }
  EXPECT_GT(compared, 5000);
  EXPECT_GT(matched, 500);  // the names do match: the test compares matches, not only misses
}

}  // namespace
}  // namespace ucp::rules
