#include "conformance/spec_rules.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <regex>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

namespace {

// Python's rf"^{re.escape(name)}$" for a param name (letters, digits, '_', '.').
std::string EscapedExact(const std::string& name) {
  std::string out = "^";
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') out += '\\';
    out += c;
  }
  return out + "$";
}

// AutoTP's split of n over tp (tp_shard.py get_shard_size, grain 1).
int64_t Width(int64_t n, int tp, int r) { return n / tp + (r < n % tp ? 1 : 0); }

ValuePtr SortedList(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  std::vector<ValuePtr> items;
  for (const std::string& s : v) items.push_back(Value::Str(s));
  return Value::List(std::move(items));
}

}  // namespace

absl::StatusOr<ValuePtr> AutoTpCheckpointInfo(const ModelSpec& spec, const std::string& version, int tp) {
  int major = 0, minor = 0, patch = 0;
  if (sscanf(version.c_str(), "%d.%d.%d", &major, &minor, &patch) != 3) {
    return absl::InvalidArgumentError(absl::StrCat("AutoTP metadata: version '", version, "'"));
  }
  const auto v = std::make_tuple(major, minor, patch);
  if (v < std::make_tuple(0, 19, 5)) return ValuePtr();
  const bool master = v >= std::make_tuple(0, 19, 6);
  std::vector<std::string> row, replicated, vocabulary;
  std::vector<ValuePtr> sub_params;
  ValuePtr widths = Value::MakeDict();
  int64_t original_vocab = 0;
  for (const ModelParam& p : spec.param()) {
    if (p.role() == "buffer" || p.role() == "tied") continue;  // not named_parameters / an alias
    const std::string pattern = EscapedExact(p.name());
    const MergeRule& r = p.rule();
    switch (r.kind()) {
      case REPLICATED: replicated.push_back(pattern); break;
      case ROW: row.push_back(pattern); break;
      case VOCAB:
        vocabulary.push_back(pattern);
        if (original_vocab == 0) original_vocab = p.shape(0);
        break;
      case COLUMN: break;  // DeepSpeed's default: cat on dim 0
      case SUB_PARAMS: {
        if (!master || r.sub_param_shape().dim_size() == 0) {
          return absl::InvalidArgumentError(absl::StrCat("AutoTP metadata: '", p.name(), "' fused sub-params need ",
                                                         "master (0.19.6) and a sub_param_shape"));
        }
        const SubParamShape& s = r.sub_param_shape();
        std::vector<ValuePtr> shape, sizes, per_sub;
        for (int d = 0; d < s.dim_size(); ++d) {
          if (d != s.partition_dim()) {
            shape.push_back(Value::Int(-1));
            continue;
          }
          for (int64_t n : s.dim(d).size()) {
            sizes.push_back(Value::Int(n));
            std::vector<ValuePtr> w;
            for (int k = 0; k < tp; ++k) w.push_back(Value::Int(Width(n, tp, k)));
            per_sub.push_back(Value::List(std::move(w)));
          }
          shape.push_back(Value::Tuple(sizes));
        }
        ValuePtr entry = Value::MakeDict();
        entry->DictSet(Value::Str("patterns"), Value::List({Value::Str(pattern)}));
        entry->DictSet(Value::Str("shape"), Value::List(std::move(shape)));
        entry->DictSet(Value::Str("partition_dim"), Value::Int(s.partition_dim()));
        sub_params.push_back(entry);
        widths->DictSet(Value::Str(pattern), Value::List(std::move(per_sub)));
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat("AutoTP metadata: '", p.name(), "' has a split AutoTP has not"));
    }
  }
  ValuePtr uc = Value::MakeDict();
  uc->DictSet(Value::Str("universal_checkpoint_version"), Value::Float(master ? 0.4 : 0.3));
  uc->DictSet(Value::Str("parameter_with_row_parallelism_patterns"), SortedList(row));
  uc->DictSet(Value::Str("tp_replicated_parameter_patterns"), SortedList(replicated));
  uc->DictSet(Value::Str("vocabulary_parameter_patterns"), SortedList(vocabulary));
  uc->DictSet(Value::Str("parameter_with_sub_params"), Value::List(std::move(sub_params)));
  if (master) {
    uc->DictSet(Value::Str("autotp_unsupported_parameter_patterns"), Value::MakeDict());
    if (!widths->dict_items().empty()) uc->DictSet(Value::Str("sub_param_shard_widths"), widths);
  }
  if (original_vocab > 0) uc->DictSet(Value::Str("original_vocab_size"), Value::Int(original_vocab));
  return uc;
}

std::string PyRepr(const Value& v) {
  using pickle::Kind;
  auto join = [](const Value& seq) {
    std::vector<std::string> parts;
    for (const auto& item : seq.items()) parts.push_back(PyRepr(*item));
    return absl::StrJoin(parts, ", ");
  };
  switch (v.kind()) {
    case Kind::kNone: return "None";
    case Kind::kBool: return v.bool_value() ? "True" : "False";
    case Kind::kInt: return absl::StrCat(v.int_value());
    case Kind::kFloat: {
      std::string s = absl::StrCat(v.float_value());
      if (s.find_first_of(".eni") == std::string::npos) s += ".0";
      return s;
    }
    case Kind::kStr: {
      std::string out = "'";
      for (char c : v.str()) {
        if (c == '\\' || c == '\'') out += '\\';
        out += c;
      }
      return out + "'";
    }
    case Kind::kList: return absl::StrCat("[", join(v), "]");
    case Kind::kTuple: return absl::StrCat("(", join(v), v.items().size() == 1 ? ",)" : ")");
    case Kind::kDict: {
      std::vector<std::string> parts;
      for (const auto& [k, x] : v.dict_items()) parts.push_back(absl::StrCat(PyRepr(*k), ": ", PyRepr(*x)));
      return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
    }
    default: return absl::StrCat("<", v.DebugString(60), ">");
  }
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
