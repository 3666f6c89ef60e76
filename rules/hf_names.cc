#include "rules/hf_names.h"

#include <map>
#include <optional>
#include <regex>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "rules/presets.h"

namespace ucp::rules {
namespace {

using pickle::Kind;
using pickle::Value;

std::optional<std::string> PyStr(const Value& v) {
  if (v.is(Kind::kBool)) return v.int_value() ? "True" : "False";
  if (v.is(Kind::kInt) && v.fits_int64()) return absl::StrCat(v.int_value());
  if (v.is(Kind::kStr)) return v.str();
  if (v.is(Kind::kFloat)) return json::PythonFloatRepr(v.float_value());
  if (v.is_none()) return "None";
  return std::nullopt;
}

bool Truthy(const Value& v) {
  if (v.is(Kind::kBool) || v.is(Kind::kInt)) return v.int_value() != 0;
  if (v.is(Kind::kStr)) return !v.str().empty();
  if (v.is(Kind::kFloat)) return v.float_value() != 0;
  return false;
}

const Value* Arg(const Value* args, const std::string& key) {
  if (args == nullptr || !args->is(Kind::kDict)) return nullptr;
  if (const Value* v = args->DictGet(key)) return v;
  // argparse stores "--foo-bar" as foo_bar; YAML-style dicts may keep '-'.
  std::string dashed = key;
  for (char& c : dashed) c = c == '_' ? '-' : c;
  return args->DictGet(dashed);
}

bool FullMatch(const std::regex& re, const std::string& s, std::smatch* m) { return std::regex_match(s, *m, re); }

absl::StatusOr<std::regex> Compile(const std::string& pattern, const std::string& where) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bad pattern '", pattern, "': ", e.what()));
  }
}

// The first failing condition's reason, or "" when all hold.
absl::StatusOr<std::string> FailedCondition(const HfArchitecture& arch, const state::ModelInfo& info,
                                            const Value* args) {
  for (const HfCondition& c : arch.require()) {
    const std::string reason = c.reason().empty() ? "a condition of the architecture fails" : c.reason();
    if (!c.no_param().empty() || !c.has_param().empty()) {
      const bool no = !c.no_param().empty();
      UCP_ASSIGN_OR_RETURN(std::regex re, Compile(no ? c.no_param() : c.has_param(), arch.architecture()));
      std::string hit;
      for (const auto& p : info.params) {
        std::smatch m;
        if (FullMatch(re, p.name, &m)) {
          hit = p.name;
          break;
        }
      }
      if (no && !hit.empty()) return absl::StrCat(reason, " (found '", hit, "')");
      if (!no && hit.empty()) return absl::StrCat(reason, " (no param matches '", c.has_param(), "')");
    }
    if (!c.arg().empty()) {
      const Value* v = Arg(args, c.arg());
      if (v == nullptr || v->is_none()) {
        if (!c.absent_ok()) return absl::StrCat(reason, " (the checkpoint's args have no '", c.arg(), "')");
        continue;
      }
      const bool met = c.equals().empty() ? Truthy(*v) : PyStr(*v) == c.equals();
      if (!met) {
        return absl::StrCat(reason, " (args.", c.arg(), " = ", PyStr(*v).value_or("?"), ", needs ",
                            c.equals().empty() ? "a true value" : c.equals(), ")");
      }
    }
  }
  return std::string();
}

std::string Substitute(const std::string& tmpl, const std::smatch& m, int layer) {
  std::string out;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] == '{') {
      const size_t close = tmpl.find('}', i);
      if (close != std::string::npos) {
        const std::string key = tmpl.substr(i + 1, close - i - 1);
        int g = 0;
        if (key == "layer") {
          out += absl::StrCat(layer);
          i = close;
          continue;
        }
        if (absl::SimpleAtoi(key, &g) && g >= 0 && static_cast<size_t>(g) < m.size()) {
          out += m[g].str();
          i = close;
          continue;
        }
      }
    }
    out.push_back(tmpl[i]);
  }
  return out;
}

// An arg value written as config `type`.
std::optional<json::Value> ArgAsJson(const Value& v, const std::string& type, bool negate) {
  if (v.is_none()) return std::nullopt;
  if (type == "bool") {
    if (!(v.is(Kind::kBool) || v.is(Kind::kInt))) return std::nullopt;
    return json::Value::Bool((v.int_value() != 0) != negate);
  }
  if (type == "int") {
    if (v.is(Kind::kInt) && v.fits_int64()) return json::Value::Int(v.int_value());
    if (v.is(Kind::kFloat) && v.float_value() == static_cast<double>(static_cast<int64_t>(v.float_value()))) {
      return json::Value::Int(static_cast<int64_t>(v.float_value()));
    }
    return std::nullopt;
  }
  if (type == "float") {
    if (v.is(Kind::kFloat)) return json::Value::Double(v.float_value());
    if (v.is(Kind::kInt) && v.fits_int64()) return json::Value::Double(static_cast<double>(v.int_value()));
    return std::nullopt;
  }
  if (v.is(Kind::kStr)) return json::Value::String(v.str());
  if (v.is(Kind::kBool)) return json::Value::Bool(v.int_value() != 0);
  if (v.is(Kind::kInt) && v.fits_int64()) return json::Value::Int(v.int_value());
  if (v.is(Kind::kFloat)) return json::Value::Double(v.float_value());
  return std::nullopt;
}

int64_t ConfigInt(const json::Value& config, const std::string& key, bool* ok) {
  const json::Value* v = config.Get(key);
  if (v == nullptr || v->type() != json::Value::Type::kInt) {
    *ok = false;
    return 0;
  }
  return v->int_value();
}

// Phase 1: the preset (the one asked for, or the one the param names
// suggest; sets plan->preset) and its first Hugging Face architecture whose
// conditions the checkpoint meets; a refusal lists every architecture's
// failed condition.
absl::StatusOr<const HfArchitecture*> ChooseArchitecture(const state::ModelInfo& info, const Value* args,
                                                         const HfOptions& options, HfNamePlan* plan) {
  plan->preset = options.preset;
  if (plan->preset.empty() || plan->preset == kNoPreset) {
    std::vector<std::string> names;
    for (const auto& p : info.params) names.push_back(p.name);
    std::optional<std::string> detected = DetectPreset(names, options.checkpoint_model_type);
    if (!detected) {
      std::vector<std::string> with_hf;
      for (const std::string& n : PresetNames()) {
        if (auto p = FindPreset(n); p.ok() && (*p)->hf_size() > 0) with_hf.push_back(n);
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "--names=hf: no preset recognizes this checkpoint's param names; pass --preset=NAME (presets with Hugging "
          "Face names: ", absl::StrJoin(with_hf, ", "), ") or export with --names=checkpoint"));
    }
    plan->preset = *detected;
    plan->notes.push_back(absl::StrCat("Hugging Face names from preset '", plan->preset, "' (detected from the names)"));
  }
  UCP_ASSIGN_OR_RETURN(const Preset* preset, FindPreset(plan->preset));
  if (preset->hf_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("--names=hf: preset '", plan->preset,
                                                      "' has no Hugging Face architecture; export with --names=checkpoint"));
  }
  // The checkpoint's own config.json names its architecture (a Trainer's
  // checkpoint-N, or the Hugging Face folder `ucp reshard` imported, whose
  // config.json the import keeps beside the tags): the entry that lists it
  // maps the names and writes that config as is; its conditions on the
  // names still hold, and those on args hold for the args the checkpoint
  // has.
  if (!options.checkpoint_architecture.empty()) {
    std::vector<std::string> known;
    for (const HfArchitecture& a : preset->hf()) {
      for (const std::string& c : a.config_architectures()) {
        known.push_back(c);
        if (c != options.checkpoint_architecture) continue;
        // The names must fit the entry (no_param), and args the checkpoint
        // has must agree (a Megatron-DeepSpeed training's swiglu); args it
        // does not have (an import records none) pass.
        HfArchitecture only_names;
        for (const HfCondition& cond : a.require()) {
          if (!cond.no_param().empty()) *only_names.add_require() = cond;
          if (!cond.arg().empty()) {
            HfCondition* kept = only_names.add_require();
            *kept = cond;
            kept->set_absent_ok(true);
          }
        }
        only_names.set_architecture(c);
        UCP_ASSIGN_OR_RETURN(std::string failed, FailedCondition(only_names, info, args));
        if (!failed.empty()) {
          return absl::FailedPreconditionError(absl::StrCat("--names=hf: ", c, " (the checkpoint's config.json, preset '",
                                                            plan->preset, "'): ", failed));
        }
        plan->config_verbatim = true;
        plan->notes.push_back(absl::StrCat("config.json: the checkpoint's own (", c, "), names kept"));
        return &a;
      }
    }
    if (!known.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--names=hf: the checkpoint's config.json names ", options.checkpoint_architecture, ", which preset '",
          plan->preset, "' does not know (", absl::StrJoin(known, ", "),
          "): export with --names=checkpoint"));
    }
  }
  std::vector<std::string> refusals;
  for (const HfArchitecture& a : preset->hf()) {
    UCP_ASSIGN_OR_RETURN(std::string failed, FailedCondition(a, info, args));
    if (failed.empty()) return &a;
    refusals.push_back(absl::StrCat(a.architecture(), ": ", failed));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--names=hf: this checkpoint has no faithful Hugging Face equivalent in preset '", plan->preset, "': ",
      absl::StrJoin(refusals, "; "), ". Export with --names=checkpoint instead"));
}

// A checkpoint param and the first tensor pattern of the architecture that
// matches its name.
struct Matched {
  int param;
  int entry;
  std::smatch m;  // over info.params[param].name, which outlives it
};

// What phase 2 finds: the matched params in output order, and the HF layer
// number of each layer index their names hold (the indices in order: a
// pipeline's layer 2 can be HF layer 0).
struct NameMatches {
  std::vector<Matched> matched;
  std::map<int64_t, int> ordinal;
};

// Phase 2: each exported param's pattern. Params the architecture drops by
// design go to plan->dropped; a param no pattern matches is a refusal (the
// first 12 named).
absl::StatusOr<NameMatches> MatchNames(const HfArchitecture& arch, const state::ModelInfo& info,
                                       const std::vector<int>& order, HfNamePlan* plan) {
  std::vector<std::regex> res;
  for (const HfTensorMap& t : arch.tensor()) {
    UCP_ASSIGN_OR_RETURN(std::regex re, Compile(t.pattern(), plan->architecture));
    res.push_back(std::move(re));
  }
  NameMatches out;
  std::vector<std::string> unmatched;
  std::set<int64_t> layer_indices;
  for (int i : order) {
    const state::ParamState& p = info.params[static_cast<size_t>(i)];
    bool found = false;
    for (size_t e = 0; e < res.size(); ++e) {
      Matched mt{i, static_cast<int>(e), {}};
      if (!std::regex_match(p.name, mt.m, res[e])) continue;
      found = true;
      const HfTensorMap& entry = arch.tensor(static_cast<int>(e));
      if (entry.split() == HF_SPLIT_DROP) {
        plan->dropped.push_back(p.name);
        break;
      }
      if (entry.layer_group() > 0) {
        int64_t idx = 0;
        if (static_cast<size_t>(entry.layer_group()) >= mt.m.size() ||
            !absl::SimpleAtoi(mt.m[entry.layer_group()].str(), &idx)) {
          return absl::InternalError(absl::StrCat("preset '", plan->preset, "': pattern '", entry.pattern(),
                                                  "' group ", entry.layer_group(), " is not a layer index in '",
                                                  p.name, "'"));
        }
        layer_indices.insert(idx);
      }
      out.matched.push_back(std::move(mt));
      break;
    }
    if (!found) unmatched.push_back(p.name);
  }
  if (!unmatched.empty()) {
    if (unmatched.size() > 12) unmatched.resize(12), unmatched.push_back("...");
    return absl::FailedPreconditionError(absl::StrCat(
        "--names=hf: ", plan->architecture, " (preset '", plan->preset, "') has no name for: ",
        absl::StrJoin(unmatched, ", "), ". Export with --names=checkpoint instead"));
  }
  for (int64_t idx : layer_indices) out.ordinal.emplace(idx, static_cast<int>(out.ordinal.size()));
  return out;
}

// An HF tensor being planned: the pattern entry that named it, and which
// part of a fused tensor it is (0, 1, 2: query, key, value; 0, 1: gate, up).
struct Out {
  HfTensor t;
  const HfTensorMap* entry = nullptr;
  int part = 0;
};

// What phase 3 names: the HF tensors in output order, and their names.
struct NamedTensors {
  std::vector<Out> outs;
  std::set<std::string> hf_names;
};

// Part `part` (0 gate, 1 up) of a fused gate/up param `p`: which of its
// rows, given how its tp slices were merged.
absl::Status SplitGateUp(const state::ParamState& p, int64_t source_tp, int part, HfTensor* t) {
  if (p.full_shape.empty()) return absl::InvalidArgumentError(absl::StrCat("'", p.name, "' is a scalar"));
  const MergeRule& r = p.rule;
  int64_t groups = 1;
  if (r.kind() == SUB_PARAMS && r.num_sub_params() == 2 && r.cat_dim() == 0) {
    groups = 1;  // merged as [gate; up]
  } else if (r.kind() == COLUMN || source_tp == 1) {
    groups = r.kind() == COLUMN ? source_tp : 1;  // [gate_r; up_r] per source tp rank
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "--names=hf: '", p.name, "' is a fused gate/up tensor but merged as ", MergeKind_Name(r.kind()),
        "; it must be 2 sub-params on dim 0 (Megatron's args.swiglu) or concatenated on dim 0"));
  }
  const int64_t rows = p.full_shape[0];
  if (rows % (2 * groups) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", p.name, "': ", rows, " rows do not split into gate/up over ",
                                                   groups, " tp ranks"));
  }
  t->groups = groups;
  t->length = rows / (2 * groups);
  t->start = part * t->length;
  t->shape[0] = rows / 2;
  return absl::OkStatus();
}

// Phase 3: the HF tensors each matched param becomes (one, or the parts of
// a fused one) with their names and shapes; fused QKV shapes wait for the
// config (head counts). Two tensors with one HF name are a refusal.
absl::StatusOr<NamedTensors> NameTensors(const HfArchitecture& arch, const state::ModelInfo& info,
                                         const NameMatches& names, int64_t source_tp, const std::string& preset) {
  NamedTensors out;
  for (const Matched& mt : names.matched) {
    const HfTensorMap& entry = arch.tensor(mt.entry);
    const state::ParamState& p = info.params[static_cast<size_t>(mt.param)];
    int layer = -1;
    if (entry.layer_group() > 0) layer = names.ordinal.at(std::stoll(mt.m[entry.layer_group()].str()));
    const int want = entry.split() == HF_SPLIT_QKV ? 3 : entry.split() == HF_SPLIT_GATE_UP ? 2 : 1;
    if (entry.name_size() != want) {
      return absl::InternalError(absl::StrCat("preset '", preset, "': pattern '", entry.pattern(), "' needs ",
                                              want, " names, has ", entry.name_size()));
    }
    for (int k = 0; k < want; ++k) {
      Out o;
      o.entry = &entry;
      o.part = k;
      o.t.name = Substitute(entry.name(k), mt.m, layer);
      o.t.param = mt.param;
      o.t.shape = p.full_shape;
      o.t.length = p.full_shape.empty() ? 1 : p.full_shape[0];
      if (!out.hf_names.insert(o.t.name).second) {
        return absl::FailedPreconditionError(absl::StrCat("--names=hf: two checkpoint tensors map to '", o.t.name,
                                                          "' (the second is '", p.name, "')"));
      }
      if (entry.split() == HF_SPLIT_GATE_UP) UCP_RETURN_IF_ERROR(SplitGateUp(p, source_tp, k, &o.t));
      out.outs.push_back(std::move(o));
    }
  }
  return out;
}

// An operand of HfConfigField.divide: "HF_NAME:DIM" (a dim of an exported
// tensor that is not a fused QKV part) or a config key holding an int.
int64_t Operand(const json::Value& config, const NamedTensors& tensors, const std::string& operand, bool* ok) {
  std::vector<std::string> parts = absl::StrSplit(operand, ':');
  if (parts.size() != 2) return ConfigInt(config, operand, ok);
  int dim = 0;
  if (absl::SimpleAtoi(parts[1], &dim)) {
    for (const Out& o : tensors.outs) {
      if (o.t.name != parts[0] || o.entry->split() == HF_SPLIT_QKV) continue;
      if (dim >= 0 && static_cast<size_t>(dim) < o.t.shape.size()) return o.t.shape[static_cast<size_t>(dim)];
    }
  }
  *ok = false;
  return 0;
}

// A config.json field's value from what the checkpoint says, trying its
// sources in the preset's order: a tensor's dim, whether a tensor is there,
// the layer count, the args, another key's value, a quotient of two keys,
// and last the preset's default (with a note when args could have said
// otherwise). nullopt when none has it.
absl::StatusOr<std::optional<json::Value>> ConfigFieldFromCheckpoint(const HfConfigField& f,
                                                                     const json::Value& config,
                                                                     const NamedTensors& tensors, int num_layers,
                                                                     const Value* args, HfNamePlan* plan) {
  std::optional<json::Value> v;
  if (!f.tensor_dim().empty()) {
    std::vector<std::string> parts = absl::StrSplit(f.tensor_dim(), ':');
    int dim = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &dim)) {
      return absl::InternalError(absl::StrCat("preset '", plan->preset, "': bad tensor_dim '", f.tensor_dim(), "'"));
    }
    const Out* o = nullptr;
    for (const Out& candidate : tensors.outs) {
      if (candidate.t.name == parts[0]) {
        o = &candidate;
        break;
      }
    }
    if (o && o->entry->split() != HF_SPLIT_QKV && dim >= 0 && static_cast<size_t>(dim) < o->t.shape.size()) {
      v = json::Value::Int(o->t.shape[static_cast<size_t>(dim)]);
    }
  }
  if (!v && !f.tensor_present().empty()) v = json::Value::Bool(tensors.hf_names.count(f.tensor_present()) > 0);
  if (!v && !f.tensor_absent().empty()) v = json::Value::Bool(tensors.hf_names.count(f.tensor_absent()) == 0);
  if (!v && f.count_layers()) v = json::Value::Int(static_cast<int64_t>(num_layers));
  if (!v) {
    for (const std::string& a : f.arg()) {
      const Value* av = Arg(args, a);
      if (av == nullptr) continue;
      v = ArgAsJson(*av, f.type(), f.negate());
      if (v) break;
    }
  }
  if (!v && !f.fallback_key().empty()) {
    if (const json::Value* fb = config.Get(f.fallback_key())) v = *fb;
  }
  if (!v && !f.divide().empty()) {
    std::vector<std::string> ab = absl::StrSplit(f.divide(), '/');
    bool ok = ab.size() == 2;
    const int64_t a = ok ? Operand(config, tensors, ab[0], &ok) : 0;
    const int64_t b = ok ? Operand(config, tensors, ab[1], &ok) : 0;
    if (ok && b != 0 && a % b == 0) v = json::Value::Int(a / b);
  }
  if (!v && !f.value().empty()) {
    UCP_ASSIGN_OR_RETURN(json::Value parsed, json::Parse(f.value()),
                         _.Prepend(absl::StrCat("preset '", plan->preset, "' config ", f.key(), ": ")));
    v = std::move(parsed);
    if (f.note_default() && f.arg_size() > 0) {
      plan->notes.push_back(absl::StrCat("config.json ", f.key(), " = ", f.value(), ": the default, since the checkpoint's args have no ",
                                         absl::StrJoin(f.arg(), " or "), "; pass --hf_config=", f.key(),
                                         "=VALUE if the training used another"));
    } else if (f.note_default()) {
      plan->notes.push_back(absl::StrCat("config.json ", f.key(), " = ", f.value(),
                                         ": the default, which the checkpoint does not record; pass --hf_config=",
                                         f.key(), "=VALUE if the model has another"));
    }
  }
  return v;
}

// Phase 4: config.json: the architecture, each field of the preset (a
// --hf_config value first, else from the checkpoint; a required field
// nothing gives is a refusal), the --hf_config keys the preset does not
// list, and the transformers version.
absl::StatusOr<json::Value> BuildConfig(const HfArchitecture& arch, const NamedTensors& tensors, int num_layers,
                                        const Value* args, const HfOptions& options, HfNamePlan* plan) {
  json::Value config = json::Value::Object();
  config.Set("architectures", json::Value::Array({json::Value::String(arch.architecture())}));
  config.Set("model_type", json::Value::String(arch.model_type()));
  std::map<std::string, std::string> overrides(options.config.begin(), options.config.end());
  std::set<std::string> used_overrides;
  for (const HfConfigField& f : arch.config()) {
    std::optional<json::Value> v;
    if (auto it = overrides.find(f.key()); it != overrides.end()) {
      UCP_ASSIGN_OR_RETURN(json::Value parsed, json::Parse(it->second),
                           _.Prepend(absl::StrCat("--hf_config ", f.key(), ": ")));
      v = std::move(parsed);
      used_overrides.insert(f.key());
    } else {
      UCP_ASSIGN_OR_RETURN(v, ConfigFieldFromCheckpoint(f, config, tensors, num_layers, args, plan));
    }
    if (!v) {
      if (f.required()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--names=hf: config.json needs ", f.key(), ", which the checkpoint does not record",
            f.arg_size() > 0 ? absl::StrCat(" (no args.", absl::StrJoin(f.arg(), " / args."), ")") : "",
            "; pass --hf_config=", f.key(), "=VALUE"));
      }
      continue;
    }
    config.Set(f.key(), std::move(*v));
  }
  for (const auto& [k, val] : overrides) {
    if (used_overrides.count(k)) continue;
    UCP_ASSIGN_OR_RETURN(json::Value parsed, json::Parse(val), _.Prepend(absl::StrCat("--hf_config ", k, ": ")));
    config.Set(k, std::move(parsed));
  }
  if (!arch.transformers_version().empty()) {
    config.Set("transformers_version", json::Value::String(arch.transformers_version()));
  }
  return config;
}

// Phase 5: how fused query_key_value rows are laid out: --qkv_layout, or
// for auto (when there is a fused QKV) the args' marker of
// Megatron-DeepSpeed 676a482c, with a note saying which was read.
absl::StatusOr<std::string> ChooseQkvLayout(const HfArchitecture& arch, const std::vector<Out>& outs,
                                            const Value* args, const HfOptions& options, HfNamePlan* plan) {
  std::string layout = options.qkv_layout;
  if (layout != "auto" && layout != "grouped" && layout != "block") {
    return absl::InvalidArgumentError(absl::StrCat("--qkv_layout must be auto, grouped or block, not '", layout, "'"));
  }
  bool any_qkv = false;
  for (const Out& o : outs) any_qkv |= o.entry->split() == HF_SPLIT_QKV;
  if (any_qkv && layout == "auto") {
    const bool marker = !arch.qkv_block_marker_arg().empty() && Arg(args, arch.qkv_block_marker_arg()) != nullptr;
    layout = marker ? "block" : "grouped";
    plan->notes.push_back(
        marker ? absl::StrCat("fused query_key_value read as [Q_r; K_r; V_r] blocks per tp rank: the args have ",
                              arch.qkv_block_marker_arg(),
                              " (Megatron-DeepSpeed 676a482c or later); --qkv_layout=grouped says otherwise")
               : absl::StrCat("fused query_key_value read as grouped per kv head [nkv, q heads + 2, d] "
                              "(Megatron-DeepSpeed before 676a482c: the args have no ",
                              arch.qkv_block_marker_arg(), "); --qkv_layout=block says otherwise"));
  }
  return layout;
}

// Phase 6a: a tensor that every tp rank holds a copy of and adds up before
// the all-reduce (the config flag the entry's sum_tp_if names is true) is
// exported as source_tp times the param.
absl::Status SumTpCopies(const state::ParamState& p, const json::Value& config, int64_t source_tp, Out* o,
                         HfNamePlan* plan) {
  if (o->entry->sum_tp_if().empty()) return absl::OkStatus();
  const json::Value* flag = config.Get(o->entry->sum_tp_if());
  if (flag != nullptr && flag->type() == json::Value::Type::kBool && flag->bool_value() && source_tp > 1) {
    if (p.rule.kind() != REPLICATED) {
      return absl::FailedPreconditionError(absl::StrCat("--names=hf: '", p.name, "' is merged as ",
                                                        MergeKind_Name(p.rule.kind()), ", expected REPLICATED"));
    }
    o->t.scale = source_tp;
    plan->notes.push_back(absl::StrCat(o->t.name, " = ", source_tp, " x '", p.name, "' (", o->entry->sum_tp_if(),
                                       ": every tp rank adds its copy before the all-reduce)"));
  }
  return absl::OkStatus();
}

// Phase 6b: the rows of a fused QKV param that its part (query, key or
// value) takes, from the config's head counts and the layout: whole
// [Q; K; V] when merged as three sub-params, else grouped per kv head or
// [Q_r; K_r; V_r] blocks per source tp rank.
absl::Status SplitQkv(const HfArchitecture& arch, const json::Value& config, const state::ParamState& p,
                      const std::string& layout, int64_t source_tp, Out* o) {
  bool ok = true;
  const int64_t nq = ConfigInt(config, arch.heads_key(), &ok);
  int64_t nkv = nq;
  if (!arch.kv_heads_key().empty() && config.Get(arch.kv_heads_key()) != nullptr) {
    nkv = ConfigInt(config, arch.kv_heads_key(), &ok);
  }
  if (!ok || nq <= 0 || nkv <= 0 || nq % nkv != 0) {
    return absl::FailedPreconditionError(absl::StrCat("--names=hf: cannot split '", p.name, "': need ",
                                                      arch.heads_key(), " and ", arch.kv_heads_key(),
                                                      " (query heads a multiple of kv heads) in the config"));
  }
  if (p.full_shape.empty()) return absl::InvalidArgumentError(absl::StrCat("'", p.name, "' is a scalar"));
  const int64_t rows = p.full_shape[0];
  if (rows % (nq + 2 * nkv) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("--names=hf: '", p.name, "' has ", rows,
                                                      " rows, not a multiple of query + 2 x kv heads = ",
                                                      nq + 2 * nkv));
  }
  const int64_t d = rows / (nq + 2 * nkv);
  const int64_t g = nq / nkv;
  const MergeRule& r = p.rule;
  const bool qkv_sub = r.kind() == SUB_PARAMS && r.has_sub_param_shape();
  if (!qkv_sub && r.kind() != COLUMN && source_tp > 1) {
    return absl::FailedPreconditionError(absl::StrCat("--names=hf: '", p.name, "' is merged as ",
                                                      MergeKind_Name(r.kind()), "; a fused QKV must be column-parallel"));
  }
  const int part = o->part;
  HfTensor& t = o->t;
  if (qkv_sub) {
    // Merged as three sub-params: [Q; K; V] whole.
    t.groups = 1;
    t.start = part == 0 ? 0 : part == 1 ? nq * d : (nq + nkv) * d;
    t.length = (part == 0 ? nq : nkv) * d;
  } else if (layout == "grouped") {
    t.groups = nkv;
    t.start = part == 0 ? 0 : part == 1 ? g * d : (g + 1) * d;
    t.length = part == 0 ? g * d : d;
  } else {
    const int64_t tp = r.kind() == COLUMN ? source_tp : 1;
    if (nq % tp != 0 || nkv % tp != 0) {
      return absl::FailedPreconditionError(absl::StrCat("--names=hf: '", p.name, "': ", nq, " query and ", nkv,
                                                        " kv heads do not split over tp ", tp));
    }
    t.groups = tp;
    t.start = part == 0 ? 0 : part == 1 ? nq / tp * d : (nq + nkv) / tp * d;
    t.length = (part == 0 ? nq : nkv) / tp * d;
  }
  t.shape[0] = t.groups * t.length;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfNamePlan> PlanHfNames(const state::ModelInfo& info, const std::vector<int>& order,
                                       const pickle::Value* args, const HfOptions& options) {
  HfNamePlan plan;
  UCP_ASSIGN_OR_RETURN(const HfArchitecture* arch, ChooseArchitecture(info, args, options, &plan));
  // The checkpoint's own config.json names the model (MistralForCausalLM
  // under the Llama entry's names).
  plan.architecture = plan.config_verbatim ? options.checkpoint_architecture : arch->architecture();
  UCP_ASSIGN_OR_RETURN(NameMatches names, MatchNames(*arch, info, order, &plan));
  const int64_t source_tp = std::max(1, info.source_topology.tp);
  UCP_ASSIGN_OR_RETURN(NamedTensors tensors, NameTensors(*arch, info, names, source_tp, plan.preset));
  json::Value config;
  if (plan.config_verbatim) {
    UCP_ASSIGN_OR_RETURN(config, json::Parse(options.checkpoint_config_json),
                         _.Prepend("the checkpoint's config.json: "));
    if (!options.config.empty()) {
      return absl::InvalidArgumentError(
          "--hf_config: the checkpoint's own config.json is written as is; edit it instead of overriding its keys");
    }
  } else {
    UCP_ASSIGN_OR_RETURN(config, BuildConfig(*arch, tensors, static_cast<int>(names.ordinal.size()), args, options,
                                             &plan));
  }
  // Tp sums and QKV splits, now that the config is known.
  UCP_ASSIGN_OR_RETURN(std::string layout, ChooseQkvLayout(*arch, tensors.outs, args, options, &plan));
  for (Out& o : tensors.outs) {
    const state::ParamState& p = info.params[static_cast<size_t>(o.t.param)];
    UCP_RETURN_IF_ERROR(SumTpCopies(p, config, source_tp, &o, &plan));
    if (o.entry->split() == HF_SPLIT_QKV) UCP_RETURN_IF_ERROR(SplitQkv(*arch, config, p, layout, source_tp, &o));
  }
  for (Out& o : tensors.outs) plan.tensors.push_back(std::move(o.t));
  plan.config = std::move(config);
  return plan;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TpSummedParams(const state::ModelInfo& info,
                                                                                const Value* args,
                                                                                const std::string& preset) {
  std::vector<std::pair<std::string, std::string>> out;
  if (preset.empty()) return out;
  UCP_ASSIGN_OR_RETURN(const Preset* found, FindPreset(preset));
  std::set<std::string> seen;
  for (const HfArchitecture& a : found->hf()) {
    for (const HfTensorMap& t : a.tensor()) {
      if (t.sum_tp_if().empty()) continue;
      // The flag: from the checkpoint's args, else the field's default.
      std::optional<json::Value> flag;
      std::string from;
      for (const HfConfigField& f : a.config()) {
        if (f.key() != t.sum_tp_if()) continue;
        for (const std::string& arg : f.arg()) {
          const Value* av = Arg(args, arg);
          if (av == nullptr) continue;
          flag = ArgAsJson(*av, "bool", f.negate());
          if (flag) {
            from = absl::StrCat("the arg ", arg, " (Hugging Face's ", t.sum_tp_if(), ")");
            break;
          }
        }
        if (!flag && !f.value().empty()) {
          absl::StatusOr<json::Value> v = json::Parse(f.value());
          if (v.ok()) flag = *v;
          from = absl::StrCat(t.sum_tp_if(), " by default");
        }
        break;
      }
      if (!flag || flag->type() != json::Value::Type::kBool || !flag->bool_value()) continue;
      UCP_ASSIGN_OR_RETURN(std::regex re, Compile(t.pattern(), a.architecture()));
      for (const state::ParamState& p : info.params) {
        if (std::regex_match(p.name, re) && seen.insert(p.name).second) out.emplace_back(p.name, from);
      }
    }
  }
  return out;
}

}  // namespace ucp::rules
