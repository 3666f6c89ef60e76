#include "rules/rules.h"

#include <fstream>
#include <algorithm>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/regex.h"
#include "base/status_macros.h"
#include "deepspeed/universal_metadata.h"
#include "format/pickle/accessors.h"
#include "rules/presets.h"
#include "tp/merge.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace ucp::rules {
namespace {

using pickle::Kind;
using pickle::Value;

// Collects parser errors with their line numbers.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    absl::StrAppend(&errors_, errors_.empty() ? "" : "; ", "line ", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

std::vector<std::string> StringsOf(const Value* v) {
  std::vector<std::string> out;
  if (v == nullptr || !(v->is(Kind::kList) || v->is(Kind::kTuple))) return out;
  for (const auto& item : v->items()) {
    if (item->is(Kind::kStr)) out.push_back(item->str());
  }
  return out;
}

// The Python `re` syntax DeepSpeed users write that ECMAScript lacks.
absl::Status CheckPortablePattern(const std::string& pattern) {
  if (absl::StrContains(pattern, "(?P") || absl::StrContains(pattern, "(?<") ||
      absl::StrContains(pattern, "\\A") || absl::StrContains(pattern, "\\Z")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pattern '", pattern, "' uses Python-only regex syntax ((?P<..>), (?<..), \\A, \\Z); rewrite it"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string RuleSourceName(RuleSource source) {
  switch (source) {
    case RULE_FILE: return "rules file";
    case CHECKPOINT_INFO: return "checkpoint patterns";
    case PRESET: return "preset";
    case EVIDENCE: return "evidence";
    case UNIVERSAL_METADATA: return "universal metadata";
    case UNDECIDED: return "undecided";
    default: return "none";
  }
}

absl::StatusOr<RuleSet> RuleSet::Compile(const MergeRules& rules, RuleSource source, std::string label) {
  RuleSet set;
  set.rules_ = rules;
  set.source_ = source;
  set.label_ = std::move(label);
  for (int i = 0; i < rules.rule_size(); ++i) {
    const MergeRule& r = rules.rule(i);
    UCP_RETURN_IF_ERROR(Annotate(CheckPortablePattern(r.pattern()), absl::StrCat(set.label_, ": rule ", i, ": ")));
    if (r.kind() == MERGE_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat(set.label_, ": rule ", i, " (pattern '", r.pattern(),
                       "') has no kind: give it one (REPLICATED, AVERAGE, COLUMN, ROW, VOCAB, SUB_PARAMS)"));
    }
    if (r.ndim() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(set.label_, ": rule ", i, " (pattern '", r.pattern(), "') has ndim ", r.ndim()));
    }
    for (const MergeRule::DimSize& d : r.dim_size()) {
      const int64_t split = tp::PartitionDim(r);
      if (d.dim() < 0 || (r.ndim() > 0 && d.dim() >= r.ndim()) || d.size() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(set.label_, ": rule ", i, " (pattern '", r.pattern(),
                                                       "') tests dim ", d.dim(), " size ", d.size(),
                                                       r.ndim() > 0 ? absl::StrCat(" of a ", r.ndim(), "-dim tensor") : ""));
      }
      if (d.dim() == split) {
        return absl::InvalidArgumentError(absl::StrCat(
            set.label_, ": rule ", i, " (pattern '", r.pattern(), "') tests the size of dim ", d.dim(),
            ", the dim it splits (", tp::DescribeRule(r),
            "): there a tp slice and the full tensor differ; test another dim, or ndim"));
      }
    }
    try {
      set.compiled_.push_back(std::make_shared<const std::regex>(r.pattern(), std::regex::ECMAScript));
      set.literals_.push_back(RequiredLiteral(r.pattern()));
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(set.label_, ": rule ", i, ": bad pattern '", r.pattern(), "': ", e.what()));
    }
  }
  return set;
}

namespace {

bool NameMatches(const std::regex& re, const std::string& literal, absl::string_view name) {
  if (!literal.empty() && !absl::StrContains(name, literal)) return false;
  std::match_results<absl::string_view::const_iterator> m;
  return std::regex_search(name.begin(), name.end(), m, re, std::regex_constants::match_continuous);
}

}  // namespace

std::string RequiredLiteral(absl::string_view pattern) {
  std::string best, run;
  auto end_run = [&] {
    if (run.size() > best.size()) best = run;
    run.clear();
  };
  int depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    // The literal character this atom stands for, or none (kNone).
    constexpr int kNone = -1;
    int literal = kNone;
    size_t next = i + 1;
    if (c == '\\') {
      if (i + 1 >= pattern.size()) return "";
      const unsigned char e = static_cast<unsigned char>(pattern[i + 1]);
      next = i + 2;
      // An escaped punctuation character is itself; an escaped letter or
      // digit is a class, an assertion, a code or a back reference.
      if (!absl::ascii_isalnum(e) && e != '_') literal = e;
      if (absl::ascii_isalnum(e)) {
        // \x41, \u0041, \cA: skip their digits so they are not read as literals.
        while (next < pattern.size() && absl::ascii_isalnum(static_cast<unsigned char>(pattern[next])) &&
               (e == 'x' || e == 'u' || e == 'c' || absl::ascii_isdigit(e))) {
          ++next;
        }
      }
    } else if (c == '[') {
      // A class: up to its closing ']' (a ']' first, or escaped, is a member).
      size_t j = i + 1;
      if (j < pattern.size() && pattern[j] == '^') ++j;
      if (j < pattern.size() && pattern[j] == ']') ++j;
      for (; j < pattern.size() && pattern[j] != ']'; ++j) {
        if (pattern[j] == '\\') ++j;
      }
      if (j >= pattern.size()) return "";
      next = j + 1;
    } else if (c == '{') {
      // A quantifier's bounds ({3}, {1,4}): none of its digits is in a match.
      const size_t close = pattern.find('}', i);
      if (close == absl::string_view::npos) return "";
      next = close + 1;
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      if (depth == 0) return "";
      --depth;
    } else if (c == '|') {
      if (depth == 0) return "";  // either side may match
    } else if (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == ':' ||
               c == '/' || c == '=' || c == ',' || c == ' ' || c == '<' || c == '>' || c == '@' || c == '#') {
      literal = c;
    }
    // A quantifier after an atom makes it optional or repeated: it is no
    // part of a required run (nor is the run broken by what follows).
    const bool quantified = next < pattern.size() &&
                            (pattern[next] == '*' || pattern[next] == '+' || pattern[next] == '?' || pattern[next] == '{');
    if (depth == 0 && literal != kNone && !quantified && c != ')') {
      run.push_back(static_cast<char>(literal));
    } else {
      end_run();
    }
    i = next - 1;
  }
  if (depth != 0) return "";
  end_run();
  return best;
}

bool ShapeConditionsHold(const MergeRule& rule, const std::vector<int64_t>& shape) {
  if (rule.ndim() > 0 && static_cast<int64_t>(shape.size()) != rule.ndim()) return false;
  for (const MergeRule::DimSize& d : rule.dim_size()) {
    if (d.dim() < 0 || d.dim() >= static_cast<int64_t>(shape.size()) || shape[d.dim()] != d.size()) return false;
  }
  return true;
}

std::string DescribeShapeConditions(const MergeRule& rule) {
  std::vector<std::string> parts;
  if (rule.ndim() > 0) parts.push_back(absl::StrCat("ndim ", rule.ndim()));
  for (const MergeRule::DimSize& d : rule.dim_size()) parts.push_back(absl::StrCat("dim ", d.dim(), " = ", d.size()));
  return absl::StrJoin(parts, ", ");
}

std::string ExactPattern(const std::string& name) { return EscapeRegex(name) + "$"; }

std::string GeneralizedPattern(const std::string& name) {
  std::string out;
  size_t i = 0;
  while (i <= name.size()) {
    size_t j = name.find('.', i);
    if (j == std::string::npos) j = name.size();
    const std::string part = name.substr(i, j - i);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    out += digits ? "\\d+" : EscapeRegex(part);
    if (j < name.size()) out += "\\.";
    i = j + 1;
  }
  return out + "$";
}

int RuleSet::MatchIndex(absl::string_view name, const std::vector<int64_t>& shape) const {
  for (size_t i = 0; i < compiled_.size(); ++i) {
    if (ShapeConditionsHold(rules_.rule(static_cast<int>(i)), shape) && NameMatches(*compiled_[i], literals_[i], name)) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

const MergeRule* RuleSet::Match(absl::string_view name, const std::vector<int64_t>& shape) const {
  const int i = MatchIndex(name, shape);
  return i < 0 ? nullptr : &rules_.rule(i);
}

int RuleSet::MatchNameIndex(absl::string_view name) const {
  for (size_t i = 0; i < compiled_.size(); ++i) {
    if (NameMatches(*compiled_[i], literals_[i], name)) return static_cast<int>(i);
  }
  return -1;
}

const MergeRule* RuleSet::MatchName(absl::string_view name) const {
  const int i = MatchNameIndex(name);
  return i < 0 ? nullptr : &rules_.rule(i);
}

absl::StatusOr<MergeRules> ParseRulesText(const std::string& text, const std::string& name) {
  MergeRules rules;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &rules)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a MergeRules textproto: ", errors.errors()));
  }
  return rules;
}

const MergeRules& DeepSpeedModuleRules() {
  static const MergeRules* const rules = [] {
    auto* r = new MergeRules();
    MergeRule* gate = r->add_rule();
    // deepspeed/moe/sharded_moe.py TopKGate: self.wg = torch.nn.Linear(model_dim, num_experts,
    // bias=False); no DeepSpeed version splits it over tp.
    gate->set_pattern(".*\\.deepspeed_moe\\.gate\\.wg\\.weight$");
    gate->set_kind(REPLICATED);
    gate->set_comment("DeepSpeed's MoE router (TopKGate.wg): every tp rank holds it whole");
    return r;
  }();
  return *rules;
}

absl::StatusOr<MergeRules> ReadRulesFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read rules file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseRulesText(ss.str(), path);
}

// universal_checkpoint_info['sub_param_shard_widths'][pattern] (format 0.4,
// AutoTP of DeepSpeed 0.19.6): one list of per-rank widths per sub-param.
static absl::Status AddShardWidths(const Value& uc, const std::string& pattern, SubParamShape* shape) {
  const Value* all = uc.DictGet("sub_param_shard_widths");
  if (all == nullptr || !all->is(Kind::kDict)) return absl::OkStatus();
  const Value* widths = all->DictGet(pattern);
  if (widths == nullptr) return absl::OkStatus();
  const std::string what = absl::StrCat("universal_checkpoint_info.sub_param_shard_widths['", pattern, "']");
  UCP_ASSIGN_OR_RETURN(auto* subs, pickle::AsSequence(*widths, what));
  for (const auto& sub : *subs) {
    UCP_ASSIGN_OR_RETURN(auto* per_rank, pickle::AsSequence(*sub, what));
    SubParamShape::ShardWidths* w = shape->add_shard_widths();
    for (const auto& x : *per_rank) {
      UCP_ASSIGN_OR_RETURN(int64_t width, pickle::AsInt(*x, what));
      w->add_width(width);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointInfoRules> RulesFromCheckpointInfo(const Value& uc) {
  CheckpointInfoRules out;
  if (!uc.is(Kind::kDict)) return out;
  // The pattern lists are a declaration even when empty (Megatron-DeepSpeed
  // stores every list; an empty one says no param is of that kind). GPT-NeoX
  // stores {}: no declaration at all.
  for (const char* key : {"tp_replicated_parameter_patterns", "parameter_to_average_patterns",
                          "parameter_with_2_sub_params_cat_dim_0", "parameter_with_sub_params",
                          "vocabulary_parameter_patterns", "parameter_with_row_parallelism_patterns"}) {
    const Value* v = uc.DictGet(key);
    if (v != nullptr && (v->is(Kind::kList) || v->is(Kind::kTuple))) out.has_patterns = true;
  }
  auto add = [&](const char* key, MergeKind kind, int n_sub = 0) {
    for (const auto& p : StringsOf(uc.DictGet(key))) {
      MergeRule* r = out.rules.add_rule();
      r->set_pattern(p);
      r->set_kind(kind);
      if (n_sub > 0) {
        r->set_num_sub_params(n_sub);
        r->set_cat_dim(0);
      }
      r->set_comment(key);
      out.has_patterns = true;
    }
  };
  // merge_tp_slices's precedence: replicated, average, 2 sub-params,
  // sub-param shapes, then cat (vocab strip applies to cat on dim 0, row
  // parallel cats on dim 1).
  add("tp_replicated_parameter_patterns", REPLICATED);
  add("parameter_to_average_patterns", AVERAGE);
  add("parameter_with_2_sub_params_cat_dim_0", SUB_PARAMS, 2);
  if (const Value* subs = uc.DictGet("parameter_with_sub_params");
      subs != nullptr && (subs->is(Kind::kList) || subs->is(Kind::kTuple))) {
    for (const auto& s : subs->items()) {
      UCP_ASSIGN_OR_RETURN(
          SubParamShape shape,
          deepspeed::ParseSubparamShape(*s, "universal_checkpoint_info.parameter_with_sub_params", /*default=*/0));
      const Value* d = deepspeed::SubparamShapeFields(*s);
      for (const auto& p : StringsOf(d->DictGet("patterns"))) {
        MergeRule* r = out.rules.add_rule();
        r->set_pattern(p);
        r->set_kind(SUB_PARAMS);
        *r->mutable_sub_param_shape() = shape;
        // Format 0.4: each sub-param's width on each tp rank, by pattern.
        UCP_RETURN_IF_ERROR(AddShardWidths(uc, p, r->mutable_sub_param_shape()));
        r->set_comment("parameter_with_sub_params");
        out.has_patterns = true;
      }
    }
  }
  add("vocabulary_parameter_patterns", VOCAB);
  add("parameter_with_row_parallelism_patterns", ROW);
  out.pipeline_replicated = StringsOf(uc.DictGet("pipeline_replicated_parameter_patterns"));
  if (const Value* v = uc.DictGet("original_vocab_size"); v != nullptr && v->is(Kind::kInt)) {
    out.rules.set_original_vocab_size(v->int_value());
  }
  return out;
}

absl::StatusOr<RuleResolver> RuleResolver::Make(const Options& options, const Value& uc_info,
                                                const std::vector<std::string>& names, const Value* args) {
  RuleResolver r;
  r.default_kind_ = options.default_kind;
  if (!options.rules_file.empty()) {
    UCP_ASSIGN_OR_RETURN(MergeRules rules, ReadRulesFile(options.rules_file));
    UCP_ASSIGN_OR_RETURN(RuleSet set, RuleSet::Compile(rules, RULE_FILE, options.rules_file));
    if (rules.original_vocab_size() > 0) r.original_vocab_size_ = rules.original_vocab_size();
    r.sets_.push_back(std::move(set));
  }
  UCP_ASSIGN_OR_RETURN(CheckpointInfoRules info, RulesFromCheckpointInfo(uc_info));
  r.checkpoint_has_patterns_ = info.has_patterns;
  r.pipeline_replicated_ = info.pipeline_replicated;
  if (r.original_vocab_size_ == 0 && info.rules.original_vocab_size() > 0) {
    r.original_vocab_size_ = info.rules.original_vocab_size();
  }
  if (info.has_patterns) {
    UCP_ASSIGN_OR_RETURN(RuleSet set,
                         RuleSet::Compile(info.rules, CHECKPOINT_INFO, "universal_checkpoint_info"));
    r.sets_.push_back(std::move(set));
  }
  if (options.preset != kNoPreset) {
    std::string preset = options.preset;
    if (preset.empty()) {
      if (auto detected = DetectPreset(names, options.hf_model_type)) {
        preset = *detected;
        r.preset_detected_ = true;
      }
    }
    if (!preset.empty()) {
      UCP_ASSIGN_OR_RETURN(const Preset* p, FindPreset(preset));
      UCP_ASSIGN_OR_RETURN(MergeRules rules, PresetRules(preset));
      UCP_ASSIGN_OR_RETURN(RuleSet set, RuleSet::Compile(rules, PRESET, absl::StrCat("preset ", preset)));
      r.preset_set_ = static_cast<int>(r.sets_.size());
      r.sets_.push_back(std::move(set));
      r.preset_ = preset;
      MergeRules override_rules;
      for (const ActiveOverride& o : ActiveOverrides(*p, args)) {
        *override_rules.add_rule() = o.rule;
        r.override_notes_.push_back(o.note);
      }
      UCP_ASSIGN_OR_RETURN(r.overrides_, RuleSet::Compile(override_rules, PRESET,
                                                          absl::StrCat("preset ", preset, " (args)")));
    }
  }
  // After the preset (a rules file, the checkpoint's patterns or a preset
  // may still say otherwise), and only when the model has such a module:
  // other checkpoints' effective rules are unchanged.
  UCP_ASSIGN_OR_RETURN(RuleSet builtin, RuleSet::Compile(DeepSpeedModuleRules(), PRESET, kDeepSpeedModulesLabel));
  if (std::any_of(names.begin(), names.end(), [&](const std::string& n) { return builtin.MatchNameIndex(n) >= 0; })) {
    r.sets_.push_back(std::move(builtin));
  }
  if (options.original_vocab_size > 0) r.original_vocab_size_ = options.original_vocab_size;
  MergeRules unsupported;
  if (const Value* u = uc_info.is(Kind::kDict) ? uc_info.DictGet("autotp_unsupported_parameter_patterns") : nullptr;
      u != nullptr && u->is(Kind::kDict)) {
    for (const auto& [k, v] : u->dict_items()) {
      if (!k->is(Kind::kStr)) continue;
      MergeRule* rule = unsupported.add_rule();
      rule->set_pattern(k->str());
      rule->set_kind(REPLICATED);  // unused: the pattern is what matters
      r.unsupported_reasons_.push_back(v->is(Kind::kStr) ? v->str() : "no reason given");
    }
  }
  UCP_ASSIGN_OR_RETURN(r.unsupported_, RuleSet::Compile(unsupported, CHECKPOINT_INFO,
                                                        "autotp_unsupported_parameter_patterns"));
  return r;
}

absl::Status RuleResolver::CheckSupported(absl::string_view name) const {
  const int i = unsupported_.MatchNameIndex(name);
  if (i < 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "param '", name, "' matches AutoTP's autotp_unsupported_parameter_patterns '",
      unsupported_.rules().rule(i).pattern(),
      "': ", unsupported_reasons_[static_cast<size_t>(i)],
      " (DeepSpeed's converter refuses it too; ucp does not guess how its tp slices merge)"));
}

RuleDecision RuleResolver::Decide(absl::string_view name, const std::vector<int64_t>& shape) const {
  RuleDecision d;
  for (const RuleSet& set : sets_) {
    const int i = set.MatchIndex(name, shape);
    if (i < 0) continue;
    MergeRule rule = set.rules().rule(i);
    d.source = set.source();
    const std::string conditions = DescribeShapeConditions(rule);
    d.origin = absl::StrCat(set.label(), ": '", rule.pattern(), "'", conditions.empty() ? "" : " (", conditions,
                            conditions.empty() ? "" : ")");
    // The preset's rules that the checkpoint's args replace.
    if (&set - sets_.data() == preset_set_) {
      if (const int k = overrides_.MatchIndex(name, shape); k >= 0) {
        rule = overrides_.rules().rule(k);
        absl::StrAppend(&d.origin, " (", override_notes_[k], ")");
      }
    }
    // A vocab param whose original size is unknown keeps its padding: it is
    // then an ordinary column-parallel concatenation, as DeepSpeed writes it.
    if (rule.kind() == VOCAB && rule.original_vocab_size() == 0 && original_vocab_size_ == 0) {
      rule.set_kind(COLUMN);
      absl::StrAppend(&d.origin, " (vocab size unknown: cat on dim 0, padding kept)");
    } else if (rule.kind() == VOCAB && rule.original_vocab_size() == 0) {
      rule.set_original_vocab_size(original_vocab_size_);
    }
    d.rule = std::move(rule);
    return d;
  }
  return d;
}

RuleDecision RuleResolver::DecideWithoutRules(absl::string_view name, std::optional<bool> copies_equal) const {
  RuleDecision d;
  // A checkpoint that declares DeepSpeed's patterns says how every name they
  // do not match merges: cat on dim 0. Evidence must not overrule that: a
  // column-parallel param whose tp slices happen to be equal (zero-initialized
  // biases, frozen params) would otherwise be merged as replicated, and the
  // universal checkpoint would depend on the source's tp.
  if (checkpoint_has_patterns_) {
    MergeRule rule;
    rule.set_pattern(std::string(name));
    rule.set_kind(COLUMN);
    d.rule = rule;
    d.source = CHECKPOINT_INFO;
    d.origin = "no checkpoint pattern matches: DeepSpeed's default, cat on dim 0";
    return d;
  }
  if (copies_equal.has_value() && *copies_equal) {
    MergeRule rule;
    rule.set_pattern(std::string(name));
    rule.set_kind(REPLICATED);
    d.rule = rule;
    d.source = EVIDENCE;
    d.origin = "tp copies are bitwise equal in every optimizer state";
    return d;
  }
  if (default_kind_ != MERGE_KIND_UNSPECIFIED) {
    MergeRule rule;
    rule.set_pattern(std::string(name));
    rule.set_kind(default_kind_);
    d.rule = rule;
    d.source = RULE_FILE;
    d.origin = "--default_kind";
    return d;
  }
  return d;
}

MergeRules RuleResolver::EffectiveRules() const {
  MergeRules out;
  for (const RuleSet& set : sets_) {
    for (const auto& r : set.rules().rule()) *out.add_rule() = r;
  }
  out.set_original_vocab_size(original_vocab_size_);
  return out;
}

}  // namespace ucp::rules
