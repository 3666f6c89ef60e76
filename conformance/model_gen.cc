#include "conformance/model_gen.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "conformance/spec_rules.h"
#include "conformance/synthetic_state.h"
#include "rules/presets.h"
#include "rules/rules.h"
#include "formats/deepspeed_zero/zero_writer.h"
#include "deepspeed/layout_math.h"
#include "google/protobuf/text_format.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

// Appends `params` to `spec` with their optimizer groups renumbered 0..n-1 in
// ascending order (a drawn group may end up empty), and sets num_groups (at
// least 1).
void AddParamsWithDenseGroups(std::vector<ModelParam>& params, ModelSpec& spec) {
  std::set<int> groups;
  for (const ModelParam& p : params) {
    if (p.group() >= 0) groups.insert(p.group());
  }
  std::map<int, int> renumber;
  for (int g : groups) renumber[g] = static_cast<int>(renumber.size());
  for (ModelParam& p : params) {
    if (p.group() >= 0) p.set_group(renumber[p.group()]);
    *spec.add_param() = p;
  }
  spec.set_num_groups(std::max<int>(1, static_cast<int>(groups.size())));
}

// Sizes of one model; every partitioned dim is a multiple of `unit`.
struct Dims {
  int64_t unit = 1;
  int64_t hidden = 4;
  int64_t attention = 1;  // A: qkv is [3A, H], attention.dense [H, A]
  int64_t q = 2, kv = 1;  // GQA rows of q and of each of k, v
  int64_t ffn = 1;        // F
  int64_t vocab = 8;
  int64_t positions = 4;
  int64_t rotary = 2;
};

// One tensor slot of a layer, before naming.
struct Slot {
  std::string local;
  std::vector<int64_t> shape;
  MergeRule rule;
  bool buffer = false;
};

MergeRule Rule(MergeKind kind) {
  MergeRule r;
  r.set_kind(kind);
  return r;
}

MergeRule TwoSubParams() {
  MergeRule r = Rule(SUB_PARAMS);
  r.set_num_sub_params(2);
  r.set_cat_dim(0);
  return r;
}

// Uneven q/k/v fused on dim 0 (Megatron-DeepSpeed's GQA query_key_value).
MergeRule Gqa(const Dims& d, bool with_hidden_dim) {
  MergeRule r = Rule(SUB_PARAMS);
  SubParamShape* s = r.mutable_sub_param_shape();
  auto* rows = s->add_dim();
  rows->add_size(d.q);
  rows->add_size(d.kv);
  rows->add_size(d.kv);
  if (with_hidden_dim) s->add_dim()->add_size(d.hidden);
  s->set_partition_dim(0);
  return r;
}

Slot S(std::string local, std::vector<int64_t> shape, MergeRule rule, bool buffer = false) {
  return Slot{std::move(local), std::move(shape), std::move(rule), buffer};
}

struct Variants {
  bool gqa = false;     // fused uneven q/k/v (else plain fused qkv or separate projections)
  bool swiglu = false;  // fused 2-chunk h_to_4h
  bool average_norm = false;
};

std::vector<Slot> TransformerSlots(const std::string& style, const Variants& v, const Dims& d) {
  const int64_t h = d.hidden;
  const MergeKind norm = v.average_norm ? AVERAGE : REPLICATED;
  const int64_t qkv_rows = v.gqa ? d.q + 2 * d.kv : 3 * d.attention;
  const int64_t attn_in = v.gqa ? d.q : d.attention;
  const MergeRule qkv_w = v.gqa ? Gqa(d, true) : Rule(COLUMN);
  const MergeRule qkv_b = v.gqa ? Gqa(d, false) : Rule(COLUMN);
  std::vector<Slot> s;
  if (style == "gpt-neox") {
    s.push_back(S("input_layernorm.scale", {h}, Rule(norm)));
    s.push_back(S("attention.query_key_value.weight", {qkv_rows, h}, qkv_w));
    s.push_back(S("attention.query_key_value.bias", {qkv_rows}, qkv_b));
    s.push_back(S("attention.rotary_emb.inv_freq", {d.rotary}, Rule(REPLICATED), /*buffer=*/true));
    s.push_back(S("attention.dense.weight", {h, attn_in}, Rule(ROW)));
    s.push_back(S("attention.dense.bias", {h}, Rule(REPLICATED)));
    s.push_back(S("post_attention_layernorm.scale", {h}, Rule(REPLICATED)));
    if (v.swiglu) {
      s.push_back(S("mlp.linear1.weight", {2 * d.ffn, h}, TwoSubParams()));
      s.push_back(S("mlp.linear1.bias", {2 * d.ffn}, TwoSubParams()));
      s.push_back(S("mlp.linear2.weight", {h, d.ffn}, Rule(ROW)));
      s.push_back(S("mlp.linear2.bias", {h}, Rule(REPLICATED)));
    } else {
      s.push_back(S("mlp.dense_h_to_4h.weight", {d.ffn, h}, Rule(COLUMN)));
      s.push_back(S("mlp.dense_h_to_4h.bias", {d.ffn}, Rule(COLUMN)));
      s.push_back(S("mlp.dense_4h_to_h.weight", {h, d.ffn}, Rule(ROW)));
      s.push_back(S("mlp.dense_4h_to_h.bias", {h}, Rule(REPLICATED)));
    }
  } else if (style == "megatron") {
    s.push_back(S("input_layernorm.weight", {h}, Rule(norm)));
    s.push_back(S("input_layernorm.bias", {h}, Rule(REPLICATED)));
    s.push_back(S("self_attention.query_key_value.weight", {qkv_rows, h}, qkv_w));
    s.push_back(S("self_attention.query_key_value.bias", {qkv_rows}, qkv_b));
    s.push_back(S("self_attention.rotary_emb.inv_freq", {d.rotary}, Rule(REPLICATED), /*buffer=*/true));
    s.push_back(S("self_attention.dense.weight", {h, attn_in}, Rule(ROW)));
    s.push_back(S("self_attention.dense.bias", {h}, Rule(REPLICATED)));
    s.push_back(S("post_attention_layernorm.weight", {h}, Rule(REPLICATED)));
    s.push_back(S("post_attention_layernorm.bias", {h}, Rule(REPLICATED)));
    const int64_t rows = v.swiglu ? 2 * d.ffn : d.ffn;
    const MergeRule h4 = v.swiglu ? TwoSubParams() : Rule(COLUMN);
    s.push_back(S("mlp.dense_h_to_4h.weight", {rows, h}, h4));
    s.push_back(S("mlp.dense_h_to_4h.bias", {rows}, h4));
    s.push_back(S("mlp.dense_4h_to_h.weight", {h, d.ffn}, Rule(ROW)));
    s.push_back(S("mlp.dense_4h_to_h.bias", {h}, Rule(REPLICATED)));
  } else {  // llama
    s.push_back(S("input_layernorm.weight", {h}, Rule(norm)));
    if (v.gqa) {
      s.push_back(S("self_attn.qkv_proj.weight", {qkv_rows, h}, qkv_w));
    } else {
      s.push_back(S("self_attn.q_proj.weight", {d.q, h}, Rule(COLUMN)));
      s.push_back(S("self_attn.k_proj.weight", {d.kv, h}, Rule(COLUMN)));
      s.push_back(S("self_attn.v_proj.weight", {d.kv, h}, Rule(COLUMN)));
    }
    s.push_back(S("self_attn.rotary_emb.inv_freq", {d.rotary}, Rule(REPLICATED), /*buffer=*/true));
    s.push_back(S("self_attn.o_proj.weight", {h, d.q}, Rule(ROW)));
    s.push_back(S("post_attention_layernorm.weight", {h}, Rule(REPLICATED)));
    if (v.swiglu) {
      s.push_back(S("mlp.gate_up_proj.weight", {2 * d.ffn, h}, TwoSubParams()));
    } else {
      s.push_back(S("mlp.gate_proj.weight", {d.ffn, h}, Rule(COLUMN)));
      s.push_back(S("mlp.up_proj.weight", {d.ffn, h}, Rule(COLUMN)));
    }
    s.push_back(S("mlp.down_proj.weight", {h, d.ffn}, Rule(ROW)));
  }
  return s;
}

// savanna (StripedHyena 2) blocks: each layer has an operator (hyena_se,
// hyena_mr, hyena, flash, as Evo 2 cycles them) and holds the slots of its
// operator. Slot indices are fixed across operators (the per-slot attributes
// are indexed by them), kSavannaSlots in all.
struct SavannaVariant {
  std::vector<std::string> ops;       // operator of each transformer layer
  bool complex_long = false;          // hyena: implicit_complex_modal (else implicit_modal)
  bool real_modal_medium = false;     // hyena_mr: implicit_real_modal (else explicit_single_decay)
  bool fast_conv = false;             // projection conv weight [3h, L] (causal_conv1d) instead of [3h, 1, L]
  std::string norm = "scale";         // RMSNorm ".scale" or LayerNorm ".weight"
};
struct SavannaDims {
  int64_t groups = 1;  // G, a multiple of the unit
  int64_t filter_len = 4, short_len = 3, order = 4, pole = 2, residue = 2;
};
constexpr int kSavannaSlots = 30;

std::vector<std::pair<int, Slot>> SavannaSlots(const std::string& op, const SavannaVariant& v, const Dims& d,
                                               const SavannaDims& sd) {
  const int64_t h = d.hidden, f = d.ffn, g = sd.groups, o2 = sd.order / 2;
  const bool hyena = op != "flash";
  std::vector<std::pair<int, Slot>> s;
  auto add = [&](int i, Slot slot) { s.emplace_back(i, std::move(slot)); };
  add(0, S("input_layernorm." + v.norm, {h}, Rule(REPLICATED)));
  add(1, S("post_attention_layernorm." + v.norm, {h}, Rule(REPLICATED)));
  add(2, S("pre_mlp_layernorm." + v.norm, {h}, Rule(REPLICATED)));
  add(3, S("outer_mlp_layernorm." + v.norm, {h}, Rule(REPLICATED)));
  add(4, S("mixer.dense_projection.weight", {3 * h, h}, Rule(COLUMN)));
  if (hyena) {
    add(10, S("mixer.hyena_proj_conv.short_conv_weight",
              v.fast_conv ? std::vector<int64_t>{3 * h, sd.short_len} : std::vector<int64_t>{3 * h, 1, sd.short_len},
              Rule(COLUMN)));
    add(11, S("mixer.mixer.conv_bias", {h}, Rule(COLUMN)));
  }
  if (op == "hyena_se") add(12, S("mixer.mixer.short_conv.short_conv_weight", {g, 1, sd.short_len}, Rule(COLUMN)));
  if (op == "hyena_mr" && !v.real_modal_medium) {
    add(13, S("mixer.mixer.filter.h", {g, sd.filter_len}, Rule(COLUMN)));
    add(14, S("mixer.mixer.filter.decay", {g, sd.filter_len}, Rule(COLUMN), /*buffer=*/true));
  }
  if (op == "hyena" && !v.complex_long) {
    add(15, S("mixer.mixer.filter.gamma", {g, sd.order}, Rule(COLUMN)));
    add(16, S("mixer.mixer.filter.R", {g, sd.order}, Rule(COLUMN)));
    add(17, S("mixer.mixer.filter.p", {g, sd.order}, Rule(COLUMN)));
    add(18, S("mixer.mixer.filter.t", {1, 1, sd.filter_len}, Rule(REPLICATED), /*buffer=*/true));
  }
  if (op == "hyena_mr" && v.real_modal_medium) {
    add(19, S("mixer.mixer.filter.dt", {sd.order, g}, Rule(ROW)));
    add(20, S("mixer.mixer.filter.p", {sd.order, g, sd.pole}, Rule(ROW)));
    add(21, S("mixer.mixer.filter.R", {sd.order, g, sd.residue}, Rule(ROW)));
    add(22, S("mixer.mixer.filter.residues_norm.weight", {g}, Rule(COLUMN)));
    add(23, S("mixer.mixer.filter.residues_norm.bias", {g}, Rule(COLUMN)));
  }
  if (op == "hyena" && v.complex_long) {
    add(24, S("mixer.mixer.filter.inner_cls.log_dt", {g}, Rule(COLUMN)));
    add(25, S("mixer.mixer.filter.inner_cls.inv_A_real", {g, o2}, Rule(COLUMN)));
    add(26, S("mixer.mixer.filter.inner_cls.A_imag", {g, o2}, Rule(COLUMN)));
    add(27, S("mixer.mixer.filter.inner_cls.B", {g, o2, 2}, Rule(COLUMN)));
    add(28, S("mixer.mixer.filter.inner_cls.C", {1, g, o2, 2}, Rule(ROW)));
  }
  if (!hyena) add(29, S("mixer.rotary_emb.inv_freq", {d.rotary}, Rule(REPLICATED), /*buffer=*/true));
  add(5, S("mixer.dense.weight", {h, h}, Rule(ROW)));
  add(6, S("mixer.dense.bias", {h}, Rule(REPLICATED)));
  add(7, S("mlp.w1.weight", {f, h}, Rule(COLUMN)));
  add(8, S("mlp.w2.weight", {f, h}, Rule(COLUMN)));
  add(9, S("mlp.w3.weight", {h, f}, Rule(ROW)));
  return s;
}

std::vector<Slot> EmbeddingSlots(const std::string& style, bool positions, const Dims& d) {
  std::vector<Slot> s;
  s.push_back(S(style == "llama" ? "embed_tokens.weight" : "word_embeddings.weight", {d.vocab, d.hidden}, Rule(VOCAB)));
  if (positions && style != "llama") {
    s.push_back(S("position_embeddings.weight", {d.positions, d.hidden}, Rule(REPLICATED)));
  }
  return s;
}

std::vector<Slot> FinalNormSlots(const std::string& style, bool pipeline, const Dims& d,
                                 const std::string& savanna_norm = "scale") {
  if (style == "gpt-neox") return {S("norm.scale", {d.hidden}, Rule(REPLICATED))};
  if (style == "savanna") return {S("norm." + savanna_norm, {d.hidden}, Rule(REPLICATED))};
  if (style == "llama") return {S("norm.weight", {d.hidden}, Rule(REPLICATED))};
  // GPTModelPipe's final LayerNorm is the layer itself: "<layer>.weight".
  const std::string prefix = pipeline ? "" : "final_layernorm.";
  return {S(prefix + "weight", {d.hidden}, Rule(REPLICATED)), S(prefix + "bias", {d.hidden}, Rule(REPLICATED))};
}

Slot HeadSlot(const std::string& style, const Dims& d) {
  return S(style == "gpt-neox" || style == "savanna" ? "final_linear.weight" : "lm_head.weight", {d.vocab, d.hidden},
           Rule(VOCAB));
}

// Where the layers of a plain nn.Module live in its names.
std::string PlainPrefix(const std::string& style, const std::string& part, int index, int transformer_index) {
  if (style == "gpt-neox" || style == "savanna") return absl::StrCat("sequential.", index, ".");
  if (part == "head") return "";
  if (style == "megatron") {
    if (part == "embed") return "language_model.embedding.";
    if (part == "norm") return "language_model.encoder.";
    return absl::StrCat("language_model.encoder.layers.", transformer_index, ".");
  }
  if (part == "embed" || part == "norm") return "model.";
  return absl::StrCat("model.layers.", transformer_index, ".");
}

int64_t Lcm(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

// Uniform in [lo, hi) whatever RapidCheck's size (inRange scales its range with
// the size, so early cases would never see tp = 8); shrinks towards lo.
template <typename T>
rc::Gen<T> Uniform(T lo, T hi) {
  return rc::gen::resize(rc::kNominalSize, rc::gen::inRange<T>(lo, hi));
}

// Indices into the per-slot attributes: transformer slots first.
constexpr int kEmbedAttr = kSavannaSlots, kNormAttr = kEmbedAttr + 2, kHeadAttr = kNormAttr + 2,
              kAttrSlots = kHeadAttr + 1;

// RapidCheck's gen::element and gen::weightedElement never shrink: these
// pick by an index that shrinks towards the first (simplest) choice.
template <typename T>
rc::Gen<T> Pick(std::vector<T> values) {
  const size_t n = values.size();
  return rc::gen::map(Uniform<size_t>(0, n), [values = std::move(values)](size_t i) { return values[i]; });
}

// true with odds weight_true : weight_false; shrinks towards false.
rc::Gen<bool> Maybe(int weight_true, int weight_false) {
  return rc::gen::map(Uniform(0, weight_true + weight_false), [weight_false](int x) { return x >= weight_false; });
}

Topology DrawTopology(const CaseGenOptions& o, int max_pp, bool tp_at_least_2) {
  Topology t;
  t.set_tp(*Uniform(tp_at_least_2 ? 2 : 1, o.max_tp + 1));
  t.set_pp(*Uniform(1, std::max(1, std::min(o.max_pp, max_pp)) + 1));
  t.set_dp(*Uniform(1, o.max_dp + 1));
  // Keep the file count bounded: shrink dp first, then pp.
  while (t.tp() * t.pp() * t.dp() > o.max_world && t.dp() > 1) t.set_dp(t.dp() / 2);
  while (t.tp() * t.pp() * t.dp() > o.max_world && t.pp() > 1) t.set_pp(t.pp() - 1);
  return t;
}

// Makes both topologies ones DeepSpeed can train the model at: every
// pipeline stage holds params of every optimizer group (DeepSpeed 0.14.4
// drops a group that is empty on a stage, which a checkpoint's single group
// list cannot express; the writer refuses such a target). Merges the groups
// into one first, then lowers pp.
void FitTopologies(GoldenCase& c) {
  ModelSpec& spec = *c.mutable_model();
  const state::OptimizerKind kind =
      c.optimizer_layout() == "bf16" ? state::OptimizerKind::kBf16 : state::OptimizerKind::kZero;
  for (Topology* t : {c.mutable_source(), c.mutable_target(), c.mutable_source()}) {
    for (;;) {
      auto info = ModelInfoFromSpec(spec, c.zero_stage(), kind);
      if (!info.ok()) return;  // the properties report it
      writers::ZeroWriteOptions o;
      o.target = state::Topology::FromProto(*t);
      o.layer_type_name = ModelLayerTypeNamer(*info);
      const absl::Status s = deepspeed_zero::PlanTarget(*info, o).status();
      if (s.ok() || s.code() != absl::StatusCode::kFailedPrecondition ||
          !absl::StrContains(s.message(), "holds no params of optimizer group")) {
        break;
      }
      if (spec.num_groups() > 1) {
        for (ModelParam& p : *spec.mutable_param()) {
          if (p.group() > 0) p.set_group(0);
        }
        spec.set_num_groups(1);
      } else if (t->pp() > 1) {
        t->set_pp(t->pp() - 1);
      } else {
        break;
      }
    }
  }
}

bool DsVersionLess(const std::string& a, const std::string& b) {
  auto va = deepspeed::ParseDsVersion(a), vb = deepspeed::ParseDsVersion(b);
  return va.ok() && vb.ok() && *va < *vb;
}

}  // namespace

const std::vector<std::string>& DsVersionsDrawn() {
  // The last release of each minor line, and both sides of each layout change
  // (per-rank group_paddings from 0.16.4, checkpoint_parallel_dimensions in 0.19.5).
  static const std::vector<std::string> kVersions = {"0.14.4", "0.12.6", "0.13.5", "0.15.4", "0.16.3",
                                                     "0.16.4", "0.17.6", "0.18.9", "0.19.4", "0.19.5"};
  return kVersions;
}

rc::Gen<GoldenCase> GenCase(const CaseGenOptions& options) {
  return rc::gen::exec([options]() {
    if (options.autotp_only) return *GenAutoTpCase(options);
    if (options.hf_only || (options.hf_one_in > 0 && *Maybe(1, options.hf_one_in - 1))) {
      return *GenHfCase(options);
    }
    GoldenCase c;
    ModelSpec& spec = *c.mutable_model();
    const bool pipeline = *Maybe(3, 1);
    const std::string style = *Pick<std::string>({"gpt-neox", "megatron", "llama", "savanna"});
    const bool savanna = style == "savanna";
    // savanna models are also converted with no rule flags: the preset is
    // detected from the names.
    const std::string source =
        savanna ? *Pick<std::string>({kRulesFileSource, kCheckpointInfoSource, kPresetSource, kDetectSource})
                : *Pick<std::string>({kRulesFileSource, kCheckpointInfoSource, kPresetSource});
    const std::string lp = *Pick<std::string>({"fp32", "fp16", "bf16"});
    spec.set_style(style);
    spec.set_pipeline(pipeline);
    spec.set_rules_source(source);
    spec.set_preset(style == "gpt-neox" ? "gpt-neox" : savanna ? "savanna" : "megatron-deepspeed");
    // With DeepSpeed's patterns in the checkpoint, also without any preset
    // (names no preset knows): the patterns and DeepSpeed's default decide.
    if (source == kCheckpointInfoSource && *Maybe(1, 1)) spec.set_preset("none");
    spec.set_lp_dtype(lp);
    c.set_optimizer_layout(lp == "bf16" ? "bf16" : "zero");
    const bool preset = source == kPresetSource || source == kDetectSource;

    // Structure.
    const int layers = *Uniform(1, 4);
    const bool embedding = *Maybe(3, 1);
    const bool positions = *Maybe(1, 2);
    const bool paramless = pipeline && *Maybe(1, 2);
    const bool function = pipeline && *Maybe(1, 2);
    const bool final_norm = *Maybe(3, 1);
    // 0: none, 1: its own output layer, 2: the embedding tied to the last stage.
    int head = *Pick<int>({0, 1, 2});
    if (head == 2 && (!pipeline || !embedding)) head = 1;
    Variants v;
    v.gqa = !preset && *Maybe(1, 2);
    v.swiglu = !(preset && style == "llama") && *Maybe(1, 2);
    v.average_norm = !preset && *Maybe(1, 3);
    spec.set_swiglu(v.swiglu && style == "megatron");
    SavannaVariant sv;
    if (savanna) {
      static const std::vector<std::string> kOps = {"hyena_se", "hyena_mr", "hyena", "flash"};
      // Starting at hyena_mr half the time: hyena_mr and hyena side by side.
      const int offset = *Maybe(1, 1) ? 1 : *Uniform(0, 4);
      for (int i = 0; i < layers; ++i) sv.ops.push_back(kOps[(offset + i) % kOps.size()]);
      // Leaning to implicit_modal hyena beside implicit_real_modal hyena_mr:
      // their filter.p / filter.R names clash but for the rank.
      sv.complex_long = *Maybe(1, 2);
      sv.real_modal_medium = *Maybe(2, 1);
      sv.fast_conv = *Maybe(1, 2);
      sv.norm = *Pick<std::string>({"scale", "weight"});
    }
    Dims probe;  // slot names only
    const size_t num_slots = savanna ? kSavannaSlots : TransformerSlots(style, v, probe).size();
    std::vector<bool> use_slot;
    for (size_t i = 0; i < num_slots; ++i) use_slot.push_back(*Maybe(3, 1));
    // The projection every savanna block has (what names it as savanna).
    if (savanna) use_slot[4] = true;
    // Per slot (the same in every layer, so that dropping a layer or a slot
    // while shrinking leaves the others as they were): frozen, equal tp
    // slices, and the param group under the random group scheme.
    // One group; weights / norms+biases; random of 3; one small 1-D param in a
    // group of its own (whose alignment padding covers whole dp partitions,
    // where DeepSpeed's two group_paddings conventions differ).
    const int group_scheme = *Pick<int>({0, 1, 2, 3});
    struct SlotAttrs {
      bool frozen = false;
      bool equal = false;
      int group = 0;
    };
    std::vector<SlotAttrs> attrs(kAttrSlots);
    for (SlotAttrs& a : attrs) {
      a.frozen = *Maybe(1, 9);
      a.equal = *Maybe(1, 4);
      if (group_scheme == 2) a.group = *Uniform(0, 3);
    }

    // Pipeline layer count, then topologies.
    int num_layers = 0;
    if (pipeline) {
      num_layers = (embedding ? 1 : 0) + (paramless ? 1 : 0) + layers + (final_norm ? 1 : 0) + (head != 0 ? 1 : 0);
      if (function && (final_norm || head != 0)) ++num_layers;
    }
    const int max_pp = pipeline ? num_layers : 1;
    *c.mutable_source() = DrawTopology(options, max_pp, options.source_tp_at_least_2);
    *c.mutable_target() = DrawTopology(options, max_pp, false);

    // Sizes.
    Dims d;
    d.unit = Lcm(c.source().tp(), c.target().tp());
    d.hidden = 4 * *rc::gen::inRange(1, 4);
    d.attention = d.unit * *rc::gen::inRange(1, 3);
    d.kv = d.unit;
    d.q = d.unit * *rc::gen::inRange(1, 4);
    d.ffn = d.unit * *rc::gen::inRange(1, 3);
    d.vocab = *Uniform<int64_t>(3, 41);
    d.positions = *rc::gen::inRange(2, 9);
    d.rotary = 2 * *rc::gen::inRange(1, 3);
    SavannaDims sd;
    if (savanna) {
      // savanna splits the block width (= hidden) and the filter groups over tp.
      d.hidden = d.unit * *rc::gen::inRange(1, 3);
      sd.groups = d.unit * *rc::gen::inRange(1, 3);
      sd.filter_len = *rc::gen::inRange(2, 7);
      sd.short_len = *rc::gen::inRange(2, 5);
      sd.order = 2 * *rc::gen::inRange(1, 3);
      sd.pole = *rc::gen::inRange(1, 3);
      sd.residue = *rc::gen::inRange(1, 3);
    }
    spec.set_hidden_size(d.hidden);
    // A head count every tp of the case divides (ucp refuses a tp that does not).
    spec.set_num_attention_heads(d.unit * *Pick<int64_t>({1, 2, 4}));
    spec.set_original_vocab_size(d.vocab);
    spec.set_make_vocab_size_divisible_by(*Pick<int64_t>({1, 2, 4, 8, 16, 128}));

    // The tensors, in module order (tied params first, as PipelineModule
    // registers tied_modules before the layers).
    std::vector<ModelParam> params;
    std::set<int> module_layers;
    std::vector<int> attr_of;  // per param: its slot's index in `attrs`
    auto add = [&](const Slot& slot, const std::string& prefix, int layer, const std::string& tied, int attr) {
      attr_of.push_back(attr);
      ModelParam p;
      p.set_name(prefix + slot.local);
      p.set_local_name(pipeline ? slot.local : p.name());
      p.set_layer(pipeline ? layer : -1);
      for (int64_t x : slot.shape) p.add_shape(x);
      *p.mutable_rule() = slot.rule;
      p.set_role(slot.buffer ? "buffer" : "trainable");
      p.set_tied_key(tied);
      params.push_back(std::move(p));
    };
    int index = 0;
    int embed_layer = -1;
    if (embedding) {
      embed_layer = index++;
      module_layers.insert(embed_layer);
      if (head != 2) {
        const std::vector<Slot> slots = EmbeddingSlots(style, positions, d);
        for (size_t k = 0; k < slots.size(); ++k) {
          add(slots[k], pipeline ? absl::StrCat(embed_layer, ".") : PlainPrefix(style, "embed", embed_layer, 0),
              embed_layer, "", kEmbedAttr + static_cast<int>(k));
        }
      }
    }
    if (paramless) module_layers.insert(index++);
    for (int i = 0; i < layers; ++i) {
      const int l = index++;
      module_layers.insert(l);
      std::vector<std::pair<int, Slot>> slots;
      if (savanna) {
        slots = SavannaSlots(sv.ops[i], sv, d, sd);
      } else {
        std::vector<Slot> plain = TransformerSlots(style, v, d);
        for (size_t k = 0; k < plain.size(); ++k) slots.emplace_back(static_cast<int>(k), std::move(plain[k]));
      }
      const std::string prefix = pipeline ? absl::StrCat(l, ".") : PlainPrefix(style, "layer", l, i);
      bool any = false;
      for (const auto& [k, slot] : slots) {
        if (!use_slot[k]) continue;
        add(slot, prefix, l, "", k);
        any = true;
      }
      if (!any) add(slots[0].second, prefix, l, "", slots[0].first);
    }
    if (function && (final_norm || head != 0)) ++index;
    if (final_norm) {
      const int l = index++;
      module_layers.insert(l);
      const std::vector<Slot> slots = FinalNormSlots(style, pipeline, d, sv.norm);
      for (size_t k = 0; k < slots.size(); ++k) {
        add(slots[k], pipeline ? absl::StrCat(l, ".") : PlainPrefix(style, "norm", l, 0), l, "",
            kNormAttr + static_cast<int>(k));
      }
    }
    if (head == 1) {
      const int l = index++;
      module_layers.insert(l);
      add(HeadSlot(style, d), pipeline ? absl::StrCat(l, ".") : PlainPrefix(style, "head", l, 0), l, "", kHeadAttr);
    } else if (head == 2) {
      const int l = index++;
      module_layers.insert(l);
      std::vector<ModelParam> tied;
      for (const Slot& s : EmbeddingSlots(style, positions, d)) {
        ModelParam p;
        p.set_name("tied_modules.embed." + s.local);
        p.set_local_name(s.local);
        p.set_layer(embed_layer);
        p.add_tied_layer(embed_layer);
        p.add_tied_layer(l);
        for (int64_t x : s.shape) p.add_shape(x);
        *p.mutable_rule() = s.rule;
        p.set_role("trainable");
        p.set_tied_key("embed");
        tied.push_back(std::move(p));
      }
      params.insert(params.begin(), tied.begin(), tied.end());
      for (size_t k = 0; k < tied.size(); ++k) attr_of.insert(attr_of.begin() + k, kEmbedAttr + static_cast<int>(k));
    }
    if (pipeline) {
      spec.set_num_layers(index);
      for (int l : module_layers) spec.add_module_layers(l);
    }

    // Frozen params, equal slices, param groups.
    bool any_trainable = false;
    for (size_t i = 0; i < params.size(); ++i) {
      ModelParam& p = params[i];
      const SlotAttrs& a = attrs[attr_of[i]];
      const bool partitioned = tp::PartitionDim(p.rule()) >= 0;
      if (partitioned && a.equal) p.set_equal_slices(true);
      if (p.role() == "trainable" && p.tied_key().empty() && a.frozen) p.set_role("frozen");
      if (p.role() == "trainable") {
        any_trainable = true;
        int g = 0;
        if (group_scheme == 1) g = p.shape_size() >= 2 ? 0 : 1;
        if (group_scheme == 2) g = a.group;
        p.set_group(g);
      } else {
        p.set_group(-1);
      }
    }
    if (!any_trainable) {
      for (ModelParam& p : params) {
        if (p.role() == "frozen") {
          p.set_role("trainable");
          p.set_group(0);
          break;
        }
      }
    }
    if (group_scheme == 3) {
      for (auto it = params.rbegin(); it != params.rend(); ++it) {
        if (it->role() == "trainable" && it->tied_key().empty() && it->shape_size() == 1) {
          it->set_group(1);
          break;
        }
      }
    }
    AddParamsWithDenseGroups(params, spec);

    // Optimizer, values, job.
    c.set_zero_stage(!pipeline && lp != "bf16" ? *Pick<int>({1, 2}) : 1);
    if (pipeline) {
      spec.set_partition_method(*Pick<std::string>(
          {"", "parameters", "uniform", savanna ? "type:ParallelBlockPipe" : "type:transformer"}));
    }
    FitTopologies(c);
    // The DeepSpeed release the source was saved with, and the one the
    // target is written for (the same half of the time).
    const std::vector<std::string>& versions = DsVersionsDrawn();
    c.set_ds_version(*Pick<std::string>(versions));
    c.set_target_ds_version(*Maybe(1, 1) ? *Pick<std::string>(versions) : c.ds_version());
    c.set_numpy2(!(DsVersionLess(c.ds_version(), "0.14.4")) && *Maybe(1, 1));
    spec.set_train_batch_size(*Maybe(1, 3) ? 5040 : 0);
    c.set_seed(*Uniform<uint64_t>(0, uint64_t{1} << 40));
    c.set_name("fuzz");
    return c;
  });
}

namespace {

// The true tp split of a Hugging Face name: the first rule of the preset's
// own rules (rules/presets/<preset>.textproto) whose pattern matches it
// (Python re.match: anchored at the start), replicated when none does.
MergeRule PresetRuleOf(const MergeRules& preset, const std::string& name) {
  for (const MergeRule& r : preset.rule()) {
    std::smatch m;
    if (std::regex_search(name, m, std::regex(r.pattern(), std::regex::ECMAScript),
                          std::regex_constants::match_continuous)) {
      MergeRule out;
      out.set_kind(r.kind());
      if (r.kind() == SUB_PARAMS) {
        out.set_num_sub_params(r.num_sub_params());
        out.set_cat_dim(r.cat_dim());
        if (r.has_sub_param_shape()) *out.mutable_sub_param_shape() = r.sub_param_shape();
      }
      return out;
    }
  }
  return Rule(REPLICATED);
}

struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool buffer = false;
  bool adapter = false;    // a peft LoRA adapter
  bool embedding = false;  // input embeddings (word / position)
  bool norm = false;       // a norm module's param (the Trainer's no-decay group)
};

// A learned per-channel scale of a block's output (DINOv2's / CaiT's
// LayerScale, layer_scale*.lambda1): a 1-D param the Hugging Face Trainer
// decays (its name has no bias / norm part) beside 1-D norms it does not. In
// a ZeRO stage 0 checkpoint, where no name map is saved, shapes then cannot
// tell which of the [h] params is in the decay group: only the Trainer's rule
// (--source_option=zero0_order=hf_trainer) settles the order. No Hugging
// Face architecture of the presets has it (export --names=hf refuses it).
constexpr char kLayerScale[] = "layer_scale.lambda1";

// The names and shapes of one transformers model (tp = 1), in module order.
// `lora`: peft LoRA on the attention projections (and, for Llama, on the
// MLP's down_proj): <proj>.base_layer.<weight|bias>, lora_A / lora_B.
std::vector<HfTensor> HfTensors(const std::string& style, int layers, int64_t h, int64_t f, int64_t vocab,
                                int64_t positions, int64_t q, int64_t kv, int64_t rank, bool lora, bool qkv_bias,
                                bool buffers, bool head, bool layer_scale) {
  std::vector<HfTensor> t;
  const std::string root = lora ? "base_model.model." : "";
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { t.push_back({root + name, std::move(shape)}); };
  // A linear module (nn.Linear [out, in]; GPT-2's Conv1D [in, out]) with LoRA or not.
  auto linear = [&](const std::string& m, int64_t out, int64_t in, bool bias, bool adapted, bool conv1d) {
    const std::string base = adapted ? m + ".base_layer" : m;
    add(base + ".weight", conv1d ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in});
    if (bias) add(base + ".bias", {out});
    if (adapted) {
      add(m + ".lora_A.default.weight", {rank, in});
      t.back().adapter = true;
      add(m + ".lora_B.default.weight", {out, rank});
      t.back().adapter = true;
    }
  };
  auto scale = [&](const std::string& l) {
    if (layer_scale) add(l + kLayerScale, {h});
  };
  auto norm = [&](const std::string& m, bool bias) {
    add(m + ".weight", {h});
    t.back().norm = true;
    if (bias) {
      add(m + ".bias", {h});
      t.back().norm = true;
    }
  };
  if (style == "hf-llama") {
    add("model.embed_tokens.weight", {vocab, h});
    t.back().embedding = true;
    for (int i = 0; i < layers; ++i) {
      const std::string l = absl::StrCat("model.layers.", i, ".");
      norm(l + "input_layernorm", false);
      linear(l + "self_attn.q_proj", q, h, qkv_bias, lora, false);
      linear(l + "self_attn.k_proj", kv, h, qkv_bias, false, false);
      linear(l + "self_attn.v_proj", kv, h, qkv_bias, lora, false);
      linear(l + "self_attn.o_proj", h, q, false, false, false);
      scale(l);
      if (buffers) {
        add(l + "self_attn.rotary_emb.inv_freq", {2});
        t.back().buffer = true;
      }
      norm(l + "post_attention_layernorm", false);
      linear(l + "mlp.gate_proj", f, h, false, false, false);
      linear(l + "mlp.up_proj", f, h, false, false, false);
      linear(l + "mlp.down_proj", h, f, false, lora, false);
    }
    norm("model.norm", false);
    if (head) add("lm_head.weight", {vocab, h});
  } else if (style == "hf-gpt-neox") {
    add("gpt_neox.embed_in.weight", {vocab, h});
    t.back().embedding = true;
    for (int i = 0; i < layers; ++i) {
      const std::string l = absl::StrCat("gpt_neox.layers.", i, ".");
      norm(l + "input_layernorm", true);
      norm(l + "post_attention_layernorm", true);
      scale(l);
      linear(l + "attention.query_key_value", 3 * h, h, true, lora, false);
      if (buffers) {
        add(l + "attention.rotary_emb.inv_freq", {2});
        t.back().buffer = true;
      }
      linear(l + "attention.dense", h, h, true, lora, false);
      linear(l + "mlp.dense_h_to_4h", f, h, true, false, false);
      linear(l + "mlp.dense_4h_to_h", h, f, true, false, false);
    }
    norm("gpt_neox.final_layer_norm", true);
    if (head) add("embed_out.weight", {vocab, h});
  } else {  // hf-gpt2
    add("transformer.wte.weight", {vocab, h});
    t.back().embedding = true;
    add("transformer.wpe.weight", {positions, h});
    t.back().embedding = true;
    for (int i = 0; i < layers; ++i) {
      const std::string l = absl::StrCat("transformer.h.", i, ".");
      norm(l + "ln_1", true);
      if (buffers) {
        add(l + "attn.bias", {1, 1, positions, positions});
        t.back().buffer = true;
      }
      linear(l + "attn.c_attn", 3 * h, h, true, lora, true);
      linear(l + "attn.c_proj", h, h, true, lora, true);
      scale(l);
      norm(l + "ln_2", true);
      linear(l + "mlp.c_fc", f, h, true, false, true);
      linear(l + "mlp.c_proj", h, f, true, false, true);
    }
    norm("transformer.ln_f", true);
    if (head) add("lm_head.weight", {vocab, h});
  }
  return t;
}

}  // namespace

rc::Gen<GoldenCase> GenHfCase(const CaseGenOptions& options) {
  return rc::gen::exec([options]() {
    if (options.autotp_only || (options.autotp_one_in > 0 && *Maybe(1, options.autotp_one_in - 1))) {
      return *GenAutoTpCase(options);
    }
    GoldenCase c;
    ModelSpec& spec = *c.mutable_model();
    const std::string style = *Pick<std::string>({"hf-llama", "hf-gpt-neox", "hf-gpt2"});
    spec.set_style(style);
    spec.set_pipeline(false);
    spec.set_preset(style);
    spec.set_rules_source(kNoFlagsSource);
    // lp dtype and the stages the formats write it at: fp32 / fp16 with
    // DeepSpeed's ZeRO optimizers at any stage; bf16 as BF16_Optimizer
    // (stage 1 in the synthetic model) and the stage 0 and 3 writers.
    const std::string lp = *Pick<std::string>({"fp32", "fp16", "bf16"});
    spec.set_lp_dtype(lp);
    // bf16 either as BF16_Optimizer (stage 1, and stage 0's
    // FP16_UnfusedOptimizer) or as DeepSpeed's ZeRO optimizers at stage 2
    // and 3 (bf16_ file names, fp32 partitions).
    const bool bf16_optimizer = lp == "bf16" && *Maybe(1, 1);
    c.set_optimizer_layout(bf16_optimizer ? "bf16" : "zero");
    // (A bf16 stage 0 source is read as bf16 weights with fp32 masters,
    // which DeepSpeed would run at stage 1 with BF16_Optimizer: ucp writes
    // those files only from a BF16_Optimizer checkpoint, and tells the user
    // to pick stage 2, which the synthetic BF16_Optimizer model cannot be
    // saved at; so BF16_Optimizer goes 1 -> 1, 1 -> 0, 0 -> 0, and bf16
    // under the ZeRO optimizers between 2 and 3.)
    const std::vector<int> stages = bf16_optimizer  ? std::vector<int>{1, 0}
                                    : lp == "bf16" ? std::vector<int>{2, 3}
                                                   : std::vector<int>{1, 2, 3, 0};
    c.set_source_zero_stage(*Pick<int>(stages));
    c.set_target_zero_stage(*Maybe(1, 3) ? c.source_zero_stage() : *Pick<int>(stages));
    if (bf16_optimizer && c.source_zero_stage() == 0) c.set_target_zero_stage(0);

    // Structure and sizes.
    const int layers = *Uniform(1, 3);
    const int64_t h = 2 * *Uniform<int64_t>(1, 5);
    const int64_t f = *Uniform<int64_t>(1, 9);
    const int64_t vocab = *Uniform<int64_t>(3, 41);
    const int64_t positions = *Uniform<int64_t>(2, 9);
    const int64_t kv = *Uniform<int64_t>(1, 5);
    const int64_t q = kv * *Uniform<int64_t>(1, 3);
    const bool lora = *Maybe(1, 1);
    const int64_t rank = *Uniform<int64_t>(1, 3);
    const bool qkv_bias = style == "hf-llama" && *Maybe(1, 2);
    const bool buffers = *Maybe(1, 2);
    // 0: an lm_head of its own; 1: lm_head tied to the embedding (a tied
    // alias in the module state, the optimizer holds the embedding once).
    const bool tied = *Maybe(1, 1);
    // none, LoRA's (base frozen: with peft names), frozen embeddings, random.
    const int freeze = lora ? 1 : *Pick<int>({0, 2, 3});
    const bool trainer_groups = *Maybe(1, 1);
    const bool layer_scale = *Maybe(1, 2);
    std::vector<HfTensor> tensors = HfTensors(style, layers, h, f, vocab, positions, q, kv, rank, lora, qkv_bias,
                                              buffers, /*head=*/true, layer_scale);
    auto preset = rules::PresetRules(style);
    RC_ASSERT(preset.ok());
    spec.set_hidden_size(h);
    spec.set_num_attention_heads(1);
    spec.set_original_vocab_size(vocab);
    spec.set_make_vocab_size_divisible_by(1);

    std::vector<ModelParam> params;
    std::vector<int> group_if_trained;  // per param: the group it joins when trained
    std::string embedding_name;
    for (const HfTensor& t : tensors) {
      ModelParam p;
      p.set_name(t.name);
      p.set_local_name(t.name);
      p.set_layer(-1);
      for (int64_t x : t.shape) p.add_shape(x);
      *p.mutable_rule() = PresetRuleOf(*preset, t.name);
      bool frozen = false;
      if (freeze == 1) frozen = !t.adapter;
      if (freeze == 2) frozen = t.embedding;
      if (freeze == 3) frozen = *Maybe(1, 4);
      const bool head = absl::EndsWith(t.name, "lm_head.weight") || absl::EndsWith(t.name, "embed_out.weight");
      if (t.embedding && embedding_name.empty()) embedding_name = t.name;
      if (head && tied) {
        // Another name of the embedding: its split is the embedding's.
        p.set_role("tied");
        p.set_tied_key(embedding_name);
        p.set_group(-1);
        *p.mutable_rule() = PresetRuleOf(*preset, embedding_name);
      } else if (t.buffer) {
        p.set_role("buffer");
        p.set_group(-1);
      } else {
        p.set_role(frozen ? "frozen" : "trainable");
        p.set_group(-1);
      }
      const bool no_decay = t.norm || absl::EndsWith(t.name, ".bias");
      group_if_trained.push_back(trainer_groups && no_decay ? 1 : 0);
      if (p.role() == "trainable") p.set_group(group_if_trained.back());
      params.push_back(std::move(p));
    }
    // A ZeRO-0 checkpoint names no param of its optimizer state: ucp finds
    // the order from the shapes (and, for bf16 / fp16, the masters), which
    // cannot tell an fp32 frozen param from a trainable one of its shape
    // (README, "The param order": refused as ambiguous). Such a model is
    // drawn with that frozen param trained.
    if (lp == "fp32" && (c.source_zero_stage() == 0 || c.target_zero_stage() == 0)) {
      std::set<std::vector<int64_t>> trained;
      for (const ModelParam& p : params) {
        if (p.role() == "trainable") trained.insert({p.shape().begin(), p.shape().end()});
      }
      for (size_t i = 0; i < params.size(); ++i) {
        ModelParam& p = params[i];
        if (p.role() == "frozen" && trained.count({p.shape().begin(), p.shape().end()})) {
          p.set_role("trainable");
          p.set_group(group_if_trained[i]);
        }
      }
    }
    bool any_trainable = false;
    for (const ModelParam& p : params) any_trainable |= p.role() == "trainable";
    if (!any_trainable) {
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i].role() == "frozen") {
          params[i].set_role("trainable");
          params[i].set_group(group_if_trained[i]);
          break;
        }
      }
    }
    AddParamsWithDenseGroups(params, spec);
    // The Trainer's order rule, as its user would pass it: needed for a
    // stage 0 fp32 model whose decay and no-decay groups share a shape
    // (LayerScale beside the norms), and harmless elsewhere (it narrows only
    // what shapes and masters leave open). Only with both of the Trainer's
    // groups (group 0 decays: engine_defaults' AdamParamGroups).
    if (trainer_groups && spec.num_groups() == 2 && (layer_scale || *Maybe(1, 2))) {
      (*spec.mutable_source_options())["zero0_order"] = "hf_trainer";
    }
    c.set_zero_stage(c.source_zero_stage() == 1 || c.source_zero_stage() == 2 ? c.source_zero_stage() : 0);

    // tp = pp = 1; dp at each end.
    c.mutable_source()->set_tp(1);
    c.mutable_source()->set_pp(1);
    c.mutable_source()->set_dp(*Uniform(1, options.max_dp + 1));
    c.mutable_target()->set_tp(1);
    c.mutable_target()->set_pp(1);
    c.mutable_target()->set_dp(*Uniform(1, options.max_dp + 1));
    static const std::vector<std::string> kVersions = {"0.19.5", "0.18.9", "0.19.4"};
    c.set_ds_version(*Pick<std::string>(kVersions));
    c.set_target_ds_version(*Maybe(1, 1) ? *Pick<std::string>(kVersions) : c.ds_version());
    c.set_numpy2(*Maybe(1, 1));
    spec.set_train_batch_size(0);
    c.set_seed(*Uniform<uint64_t>(0, uint64_t{1} << 40));
    c.set_name("fuzz_hf");
    return c;
  });
}

namespace {

// The tensors of one AutoTP-trained transformers model and the split AutoTP
// gives each (module_inject: LinearLayer column-parallel q/k/v/gate/up by
// rows, LinearAllreduce o/down by columns, the lm_head by vocabulary rows,
// embeddings and norms whole; with a partition_config, Phi-3's fused
// gate_up_proj per sub-param and everything but the MLP whole).
struct AutoTpTensor {
  std::string name;
  std::vector<int64_t> shape;
  MergeRule rule;
};

MergeRule AutoTpRule(MergeKind kind) {
  MergeRule r = Rule(kind);
  r.set_autotp_widths(true);
  return r;
}

// arch "llama": LlamaForCausalLM under AutoTP's tp plan (0.18.9 to master);
// "phi3": Phi3ForCausalLM with a partition_config cutting only the MLP
// (gate_up_proj as 2 sub-params of a -1 dim, down_proj by columns: realds
// family autotp --arch phi3). The Llama's lm_head is cut by vocabulary rows
// and declared a vocabulary param (0.19.5 and later; 0.18.9 leaves it whole:
// a save's layout, the writer's).
std::vector<AutoTpTensor> AutoTpTensors(const std::string& arch, int layers, int64_t h, int64_t q, int64_t kv,
                                        int64_t f, int64_t vocab, bool qkv_bias) {
  std::vector<AutoTpTensor> t;
  const bool phi3 = arch == "phi3";
  auto add = [&](std::string name, std::vector<int64_t> shape, MergeKind kind) {
    t.push_back({std::move(name), std::move(shape), AutoTpRule(kind)});
  };
  const MergeKind column = phi3 ? REPLICATED : COLUMN;  // the attention, whole under Phi-3's partition_config
  // Module order as transformers registers it (the decoder layer's
  // self_attn and mlp before its norms; Phi3Attention's o_proj before
  // qkv_proj), as the real checkpoints list them.
  add("model.embed_tokens.weight", {vocab, h}, REPLICATED);
  for (int i = 0; i < layers; ++i) {
    const std::string l = absl::StrCat("model.layers.", i, ".");
    if (phi3) {
      add(l + "self_attn.o_proj.weight", {h, q}, REPLICATED);
      add(l + "self_attn.qkv_proj.weight", {q + 2 * kv, h}, REPLICATED);
    } else {
      for (const auto& [proj, rows] : {std::make_pair("q_proj", q), std::make_pair("k_proj", kv),
                                       std::make_pair("v_proj", kv)}) {
        add(l + "self_attn." + proj + ".weight", {rows, h}, column);
        if (qkv_bias) add(l + "self_attn." + proj + ".bias", {rows}, column);
      }
      add(l + "self_attn.o_proj.weight", {h, q}, ROW);
    }
    if (phi3) {
      AutoTpTensor gate_up{l + "mlp.gate_up_proj.weight", {2 * f, h}, AutoTpRule(SUB_PARAMS)};
      SubParamShape* s = gate_up.rule.mutable_sub_param_shape();
      s->set_partition_dim(0);
      s->add_dim()->add_size(f);
      s->mutable_dim(0)->add_size(f);
      s->add_dim()->add_size(-1);  // as AutoTP publishes it: (2, -1) with the sizes
      t.push_back(std::move(gate_up));
    } else {
      add(l + "mlp.gate_proj.weight", {f, h}, COLUMN);
      add(l + "mlp.up_proj.weight", {f, h}, COLUMN);
    }
    add(l + "mlp.down_proj.weight", {h, f}, ROW);
    add(l + "input_layernorm.weight", {h}, REPLICATED);
    add(l + "post_attention_layernorm.weight", {h}, REPLICATED);
  }
  add("model.norm.weight", {h}, REPLICATED);
  // 0.18.9 leaves the lm_head whole (replace_module.py set_lm_head returns in
  // AutoTP training; a real 0.18.9 tp 2 save holds [vocab, hidden] on each
  // rank): its saves hold this rule's tensor whole (properties.cc RuleSavedBy).
  add("lm_head.weight", {vocab, h}, phi3 ? REPLICATED : VOCAB);
  return t;
}

}  // namespace

rc::Gen<GoldenCase> GenAutoTpCase(const CaseGenOptions& options) {
  return rc::gen::exec([options]() {
    GoldenCase c;
    ModelSpec& spec = *c.mutable_model();
    spec.set_style("hf-llama");
    spec.set_pipeline(false);
    spec.set_preset("hf-llama");
    spec.set_rules_source(kNoFlagsSource);
    spec.set_autotp(true);
    // Topologies: tp 1-4 at both ends (AutoTP is a plain module: pp 1).
    for (Topology* t : {c.mutable_source(), c.mutable_target()}) {
      t->set_tp(*Uniform(1, std::min(options.max_tp, 4) + 1));
      t->set_pp(1);
      t->set_dp(*Uniform(1, std::min(options.max_dp, 4) + 1));
    }
    const int s_tp = c.source().tp(), t_tp = c.target().tp();
    const int64_t unit = Lcm(s_tp, t_tp);
    const int max_tp = std::max(s_tp, t_tp);
    // The fused gate_up_proj (format 0.4's sub_param_shard_widths) is
    // written by master only.
    const std::string arch = *Maybe(1, 3) ? "phi3" : "llama";
    // Sizes: AutoTP cuts the attention in whole key-value heads (ucp refuses
    // a tp the heads do not divide), so head counts are multiples of every tp
    // of the case; the intermediate size and the vocabulary are any size
    // every rank holds a row of (a rank of zero rows does not train:
    // README), uneven where tp does not divide them. `even`: every dim a
    // multiple of both tps (the AutoTP / Megatron-style comparison).
    const int64_t head_dim = *Uniform<int64_t>(1, 3);
    const int64_t kv = unit * *Uniform<int64_t>(1, 3) * head_dim;
    const int64_t q = kv * *Uniform<int64_t>(1, 3);
    const int64_t h = 2 * *Uniform<int64_t>(1, 5);
    int64_t f = *Uniform<int64_t>(max_tp, max_tp + 9);
    int64_t vocab = *Uniform<int64_t>(std::max<int64_t>(3, max_tp), 41);
    // Half the vocabularies even (0.18.9 and 0.19.5 write only those).
    if (options.autotp_even || *Maybe(1, 1)) vocab = unit * *Uniform<int64_t>(1, 9);
    if (options.autotp_even) f = unit * *Uniform<int64_t>(1, 4);
    const int layers = *Uniform(1, 3);
    const bool qkv_bias = arch == "llama" && *Maybe(1, 2);
    // Versions: 0.18.9 (no AutoTP metadata), 0.19.5 (format 0.3), master
    // 0.19.6 (0.4), at each end. A vocabulary tp does not divide is cut by
    // rows on master only (0.19.5 cuts such an lm_head by columns and trains
    // it wrong; ucp refuses to write that): such a case has no 0.19.5. The
    // lm_head's rule is AutoTP's cut of the vocabulary rows in every version:
    // 0.18.9 keeps it whole on every tp rank (the synthetic save, ucp's
    // writer, does so for a 0.16.4 - 0.18.9 target), so a version change
    // across 0.19.5 reads it whole and writes it cut, or the reverse.
    c.set_ds_version(*Pick<std::string>({"0.19.6", "0.19.5", "0.18.9"}));
    c.set_target_ds_version(*Maybe(1, 1) ? *Pick<std::string>({"0.19.6", "0.19.5", "0.18.9"}) : c.ds_version());
    // (f)'s Megatron-style twin holds one lm_head layout at both ends.
    if (options.autotp_even && (c.ds_version() == "0.18.9") != (c.target_ds_version() == "0.18.9")) {
      c.set_target_ds_version(c.ds_version());
    }
    const bool uneven_vocab = arch == "llama" && (vocab % s_tp != 0 || vocab % t_tp != 0);
    if (arch == "phi3") {
      c.set_ds_version("0.19.6");
      c.set_target_ds_version("0.19.6");
    }
    if (uneven_vocab && c.ds_version() == "0.19.5") c.set_ds_version("0.19.6");
    if (uneven_vocab && c.target_ds_version() == "0.19.5") c.set_target_ds_version("0.19.6");
    // Before 0.19.6 AutoTP cuts by torch.chunk (pieces of ceil(f / tp)), which
    // leaves the last rank nothing for some sizes (5 over 4: 2, 2, 1): master there.
    auto chunk_fits = [f](int tp) { return (tp - 1) * ((f + tp - 1) / tp) < f; };
    if (!chunk_fits(s_tp)) c.set_ds_version("0.19.6");
    if (!chunk_fits(t_tp)) c.set_target_ds_version("0.19.6");
    // lp dtype, optimizer and ZeRO stage (1 or 2, as the formats write them).
    const std::string lp = *Pick<std::string>({"fp32", "bf16", "fp16"});
    spec.set_lp_dtype(lp);
    const bool bf16_optimizer = lp == "bf16" && *Maybe(1, 1);
    c.set_optimizer_layout(bf16_optimizer ? "bf16" : "zero");
    c.set_zero_stage(bf16_optimizer ? 1 : lp == "bf16" ? 2 : *Pick<int>({1, 2}));
    const bool trainer_groups = *Maybe(1, 1);
    const bool freeze = *Maybe(1, 2);
    std::vector<ModelParam> params;
    for (const AutoTpTensor& t : AutoTpTensors(arch, layers, h, q, kv, f, vocab, qkv_bias)) {
      ModelParam p;
      p.set_name(t.name);
      p.set_local_name(t.name);
      p.set_layer(-1);
      for (int64_t x : t.shape) p.add_shape(x);
      *p.mutable_rule() = t.rule;
      p.set_role(freeze && *Maybe(1, 4) ? "frozen" : "trainable");
      const bool no_decay = t.shape.size() == 1;
      p.set_group(p.role() == "trainable" ? (trainer_groups && no_decay ? 1 : 0) : -1);
      params.push_back(std::move(p));
    }
    bool any_trainable = false;
    for (const ModelParam& p : params) any_trainable |= p.role() == "trainable";
    if (!any_trainable) {
      params.back().set_role("trainable");
      params.back().set_group(0);
    }
    AddParamsWithDenseGroups(params, spec);
    spec.set_hidden_size(h);
    spec.set_num_attention_heads(kv);
    spec.set_original_vocab_size(vocab);
    spec.set_make_vocab_size_divisible_by(0);  // AutoTP pads no vocabulary
    spec.set_autotp_size(s_tp);
    spec.set_train_batch_size(0);
    c.set_numpy2(*Maybe(1, 1));
    c.set_seed(*Uniform<uint64_t>(0, uint64_t{1} << 40));
    c.set_name("fuzz_autotp");
    return c;
  });
}

GoldenCase MegatronTwin(const GoldenCase& c) {
  GoldenCase m = c;
  ModelSpec& spec = *m.mutable_model();
  spec.set_autotp(false);
  spec.set_autotp_size(0);
  spec.set_rules_source(kRulesFileSource);
  spec.set_preset("none");
  spec.set_make_vocab_size_divisible_by(1);
  for (ModelParam& p : *spec.mutable_param()) {
    MergeRule& r = *p.mutable_rule();
    r.clear_autotp_widths();
    // Megatron's fused [gate; up] (swiglu's 2 chunks on dim 0).
    if (r.kind() == SUB_PARAMS) r = TwoSubParams();
    // A vocabulary Megatron would pad: kept unpadded as a column split (the
    // twin's sizes are multiples of both tps).
    if (r.kind() == VOCAB) r = Rule(COLUMN);
    // 0.18.9's AutoTP saves hold the lm_head whole (no version change across
    // 0.19.5 here: GenAutoTpCase with autotp_even): so does the twin.
    if (p.name() == "lm_head.weight" && c.ds_version() == "0.18.9") r = Rule(REPLICATED);
  }
  m.set_name(c.name() + "_megatron");
  return m;
}

std::vector<std::string> CaseFeatures(const GoldenCase& c) {
  std::set<std::string> f;
  const ModelSpec& spec = c.model();
  for (const ModelParam& p : spec.param()) {
    const MergeRule& r = p.rule();
    switch (r.kind()) {
      case SUB_PARAMS: f.insert(r.sub_param_shape().dim_size() > 0 ? "sub_params_gqa" : "sub_params_2"); break;
      case VOCAB: {
        f.insert("vocab");
        if (spec.autotp()) break;  // not padded
        for (const Topology& t : {c.source(), c.target()}) {
          if (tp::PaddedVocabSize(spec.original_vocab_size(), spec.make_vocab_size_divisible_by(), t.tp()) !=
              spec.original_vocab_size()) {
            f.insert("vocab_padded");
          }
        }
        break;
      }
      default: f.insert(tp::MergeKindName(r.kind()));
    }
    // AutoTP's uneven widths: a split dim (or a fused sub-param) tp does not divide.
    if (spec.autotp() && r.kind() != REPLICATED) {
      std::vector<int64_t> sizes = {p.shape(r.kind() == ROW ? 1 : 0)};
      if (r.kind() == SUB_PARAMS && r.sub_param_shape().dim_size() > 0) {
        sizes.assign(r.sub_param_shape().dim(0).size().begin(), r.sub_param_shape().dim(0).size().end());
        f.insert("sub_param_shard_widths");
      }
      for (int64_t n : sizes) {
        for (const Topology& t : {c.source(), c.target()}) {
          if (n % t.tp() != 0) f.insert(absl::StrCat("autotp_uneven_", tp::MergeKindName(r.kind())));
        }
      }
    }
    if (p.role() == "frozen") f.insert("frozen");
    if (p.role() == "tied") f.insert("tied_alias");
    if (absl::StartsWith(p.name(), "base_model.model.")) f.insert("peft");
    if (p.role() == "buffer") f.insert("buffer");
    if (!p.tied_key().empty()) f.insert("tied");
    if (p.equal_slices()) f.insert("equal_slices");
    if (p.shape_size() >= 3) f.insert(absl::StrCat("rank", p.shape_size()));
    if (p.shape_size() >= 3 && tp::PartitionDim(r) == 1) f.insert("split_dim1_rank3+");
    if (absl::EndsWith(p.name(), kLayerScale)) f.insert("layer_scale");
  }
  if (spec.source_options().count("zero0_order")) {
    const bool stage0 = (c.has_source_zero_stage() && c.source_zero_stage() == 0) ||
                        (c.has_target_zero_stage() && c.target_zero_stage() == 0);
    f.insert(stage0 ? "zero0_order_hf_trainer_stage0" : "zero0_order_hf_trainer");
  }
  // Names that clash but for their rank (savanna's filter.p / filter.R of
  // the implicit_modal and implicit_real_modal filters): rules must test ranks.
  std::map<std::string, std::set<int>> ranks;
  for (const ModelParam& p : spec.param()) ranks[rules::GeneralizedPattern(p.name())].insert(p.shape_size());
  for (const auto& [pattern, r] : ranks) {
    if (r.size() > 1) f.insert("rank_conditioned");
  }
  // DeepSpeed versions: a change of version on the way, each layout change.
  const std::string v1 = c.ds_version().empty() ? "0.14.4" : c.ds_version();
  const std::string v2 = c.target_ds_version().empty() ? v1 : c.target_ds_version();
  if (v1 != v2) f.insert("ds_version_change");
  for (const std::string& v : {v1, v2}) {
    if (!DsVersionLess(v, "0.16.4") && c.optimizer_layout() != "bf16") f.insert("per_rank_paddings");
    if (!DsVersionLess(v, "0.16.4") && c.optimizer_layout() == "bf16") f.insert("bf16_last_rank_paddings");
    if (!DsVersionLess(v, "0.19.5")) f.insert("checkpoint_parallel_dimensions");
  }
  if (DsVersionLess(v1, "0.16.4") != DsVersionLess(v2, "0.16.4") && c.optimizer_layout() != "bf16") {
    f.insert("padding_convention_change");
  }
  if (c.numpy2()) f.insert("numpy2");
  if (absl::StartsWith(spec.style(), "hf-")) f.insert("hf_names");
  if (spec.autotp()) f.insert("autotp");
  if (SourceZeroStage(c) != TargetZeroStage(c)) f.insert("zero_stage_change");
  // A group whose padding spans more than one dp partition: there the two
  // conventions write different group_paddings (and fp32 partition sizes).
  {
    const state::OptimizerKind kind =
        c.optimizer_layout() == "bf16" ? state::OptimizerKind::kBf16 : state::OptimizerKind::kZero;
    auto info = ModelInfoFromSpec(spec, c.zero_stage() > 0 ? c.zero_stage() : 1, kind);
    for (const auto& [t, v] : {std::make_pair(c.source(), v1), std::make_pair(c.target(), v2)}) {
      if (!info.ok()) break;
      writers::ZeroWriteOptions o;
      o.target = state::Topology::FromProto(t);
      o.layer_type_name = ModelLayerTypeNamer(*info);
      auto layout = deepspeed_zero::PlanTarget(*info, o);
      if (!layout.ok()) continue;
      for (const auto& stage : layout->layouts) {
        for (const auto& g : stage) {
          if (g.padded_numel() - g.numel() <= g.partition_numel()) continue;
          f.insert("padding_spans_ranks");
          if (!DsVersionLess(v, "0.16.4") && kind != state::OptimizerKind::kBf16) f.insert("per_rank_paddings_span_ranks");
        }
      }
    }
  }
  return std::vector<std::string>(f.begin(), f.end());
}

}  // namespace ucp::conformance

namespace ucp {

void showValue(const GoldenCase& c, std::ostream& os) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(c, &text);
  os << "\n" << text;
}

}  // namespace ucp
