#include "conformance/spec_rules.h"

#include <map>
#include <regex>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/universal_metadata.h"
#include "rules/rules.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"

namespace ucp::conformance {
namespace {

using pickle::Value;
using pickle::ValuePtr;

bool SameRule(const MergeRule& a, const MergeRule& b) {
  MergeRule x = a, y = b;
  x.clear_pattern();
  y.clear_pattern();
  x.clear_comment();
  y.clear_comment();
  x.clear_ndim();
  y.clear_ndim();
  x.clear_dim_size();
  y.clear_dim_size();
  return google::protobuf::util::MessageDifferencer::Equals(x, y);
}

// DeepSpeed's pattern list for a kind of rule.
enum class PatternList { kReplicated, kAverage, kTwoSubParams, kSubParamShape, kVocab, kRow, kNone };

absl::StatusOr<PatternList> ListOf(const MergeRule& r, const std::string& name) {
  switch (r.kind()) {
    case REPLICATED: return PatternList::kReplicated;
    case AVERAGE: return PatternList::kAverage;
    case VOCAB: return PatternList::kVocab;
    case ROW: return PatternList::kRow;
    case COLUMN: return PatternList::kNone;
    case SUB_PARAMS:
      if (r.sub_param_shape().dim_size() > 0) return PatternList::kSubParamShape;
      if (r.num_sub_params() == 2 && r.cat_dim() == 0) return PatternList::kTwoSubParams;
      return absl::InvalidArgumentError(absl::StrCat("param '", name, "': ", r.num_sub_params(),
                                                     " sub-params on dim ", r.cat_dim(),
                                                     " have no universal_checkpoint_info pattern list"));
    default:
      return absl::InvalidArgumentError(absl::StrCat("param '", name, "' has no merge kind"));
  }
}

}  // namespace

std::string ExactPattern(const std::string& name) { return rules::ExactPattern(name); }

MergeRules SpecMergeRules(const ModelSpec& spec) {
  MergeRules rules;
  for (const ModelParam& p : spec.param()) {
    MergeRule* r = rules.add_rule();
    *r = p.rule();
    r->set_pattern(ExactPattern(p.name()));
    if (r->kind() == VOCAB) r->set_original_vocab_size(spec.original_vocab_size());
  }
  rules.set_original_vocab_size(spec.original_vocab_size());
  return rules;
}

absl::StatusOr<ValuePtr> SpecCheckpointInfo(const ModelSpec& spec) {
  ValuePtr info = Value::MakeDict();
  if (spec.rules_source() != kCheckpointInfoSource) return info;
  // Patterns generalized over layer numbers, when such a pattern matches only
  // params of one rule; else the exact names.
  std::map<std::string, std::vector<int>> by_template;
  std::vector<std::string> templates;  // first-seen order
  for (int i = 0; i < spec.param_size(); ++i) {
    const std::string t = rules::GeneralizedPattern(spec.param(i).name());
    if (!by_template.count(t)) templates.push_back(t);
    by_template[t].push_back(i);
  }
  std::vector<std::pair<std::string, int>> patterns;  // pattern, a param it stands for
  for (const std::string& t : templates) {
    const std::vector<int>& members = by_template[t];
    bool exact = true;
    try {
      const std::regex re(t, std::regex::ECMAScript);
      exact = false;
      for (int i = 0; i < spec.param_size() && !exact; ++i) {
        const bool matches = std::regex_search(spec.param(i).name(), re, std::regex_constants::match_continuous);
        const bool member = std::find(members.begin(), members.end(), i) != members.end();
        if (matches != member || (member && !SameRule(spec.param(i).rule(), spec.param(members[0]).rule()))) {
          exact = true;
        }
      }
    } catch (const std::regex_error&) {
      exact = true;
    }
    if (exact) {
      for (int i : members) patterns.emplace_back(ExactPattern(spec.param(i).name()), i);
    } else {
      patterns.emplace_back(t, members[0]);
    }
  }
  std::vector<ValuePtr> replicated, average, two_sub, sub_shapes, vocab, row;
  std::vector<ValuePtr> pipeline_replicated;
  for (const auto& [pattern, i] : patterns) {
    const ModelParam& p = spec.param(i);
    UCP_ASSIGN_OR_RETURN(PatternList list, ListOf(p.rule(), p.name()));
    switch (list) {
      case PatternList::kReplicated: replicated.push_back(Value::Str(pattern)); break;
      case PatternList::kAverage: average.push_back(Value::Str(pattern)); break;
      case PatternList::kTwoSubParams: two_sub.push_back(Value::Str(pattern)); break;
      case PatternList::kVocab: vocab.push_back(Value::Str(pattern)); break;
      case PatternList::kRow: row.push_back(Value::Str(pattern)); break;
      case PatternList::kSubParamShape: {
        MergeRule r = p.rule();
        r.set_pattern(pattern);
        sub_shapes.push_back(deepspeed::SubparamShapeValue(r));
        break;
      }
      case PatternList::kNone: break;
    }
    if (!p.tied_key().empty()) pipeline_replicated.push_back(Value::Str(pattern));
  }
  // The keys Megatron-DeepSpeed's GPTModel._universal_checkpoint_info stores.
  info->DictSet(Value::Str("universal_checkpoint_version"), Value::Float(0.2));
  info->DictSet(Value::Str("tp_replicated_parameter_patterns"), Value::List(replicated));
  info->DictSet(Value::Str("pipeline_replicated_parameter_patterns"), Value::List(pipeline_replicated));
  info->DictSet(Value::Str("parameter_to_average_patterns"), Value::List(average));
  info->DictSet(Value::Str("parameter_with_row_parallelism_patterns"), Value::List(row));
  info->DictSet(Value::Str("vocabulary_parameter_patterns"), Value::List(vocab));
  info->DictSet(Value::Str("parameter_with_2_sub_params_cat_dim_0"), Value::List(two_sub));
  info->DictSet(Value::Str("parameter_with_sub_params"), Value::List(sub_shapes));
  info->DictSet(Value::Str("original_vocab_size"), Value::Int(spec.original_vocab_size()));
  return info;
}

absl::StatusOr<ops::SourceOptions> ZeroSourceOptionsFor(const ModelSpec& spec, const std::string& dir) {
  ops::SourceOptions o;
  o.num_threads = 1;
  if (spec.rules_source() == kRulesFileSource) {
    std::string text;
    google::protobuf::TextFormat::PrintToString(SpecMergeRules(spec), &text);
    const std::string path = JoinPath(dir, "rules.textproto");
    UCP_RETURN_IF_ERROR(MakeDirs(dir));
    UCP_RETURN_IF_ERROR(WriteFileAtomic(path, text));
    o.rules.rules_file = path;
  } else if (spec.rules_source() == kPresetSource) {
    o.rules.preset = spec.preset();
    o.rules.original_vocab_size = spec.original_vocab_size();
  } else if (spec.rules_source() == kDetectSource) {
    o.rules.original_vocab_size = spec.original_vocab_size();
  } else if (spec.rules_source() == kNoFlagsSource) {
    // No rule flag of any kind.
  } else if (spec.rules_source() == kCheckpointInfoSource) {
    if (spec.preset() == "none") o.rules.preset = "none";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown rules_source '", spec.rules_source(),
                                                   "' (rules_file, checkpoint_info, preset, detect, no_flags)"));
  }
  for (const auto& [k, v] : spec.source_options()) o.format_options[k] = v;
  return o;
}

}  // namespace ucp::conformance
