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

struct Pending {
  int param;
  const HfTensorMap* entry;
  std::vector<std::string> names;  // substituted
};

int64_t ConfigInt(const json::Value& config, const std::string& key, bool* ok) {
  const json::Value* v = config.Get(key);
  if (v == nullptr || v->type() != json::Value::Type::kInt) {
    *ok = false;
    return 0;
  }
  return v->int_value();
}

}  // namespace

absl::StatusOr<HfNamePlan> PlanHfNames(const state::ModelInfo& info, const std::vector<int>& order,
                                       const pickle::Value* args, const HfOptions& options) {
  HfNamePlan plan;
  plan.preset = options.preset;
  if (plan.preset.empty() || plan.preset == "none") {
    std::vector<std::string> names;
    for (const auto& p : info.params) names.push_back(p.name);
    std::optional<std::string> detected = DetectPreset(names);
    if (!detected) {
      return absl::FailedPreconditionError(
          "--names=hf: no preset recognizes this checkpoint's param names; pass --preset=NAME (presets with Hugging "
          "Face names: gpt-neox, megatron-deepspeed) or export with --names=checkpoint");
    }
    plan.preset = *detected;
    plan.notes.push_back(absl::StrCat("Hugging Face names from preset '", plan.preset, "' (detected from the names)"));
  }
  UCP_ASSIGN_OR_RETURN(const Preset* preset, FindPreset(plan.preset));
  if (preset->hf_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("--names=hf: preset '", plan.preset,
                                                      "' has no Hugging Face architecture; export with --names=checkpoint"));
  }
  const HfArchitecture* arch = nullptr;
  std::vector<std::string> refusals;
  for (const HfArchitecture& a : preset->hf()) {
    UCP_ASSIGN_OR_RETURN(std::string failed, FailedCondition(a, info, args));
    if (failed.empty()) {
      arch = &a;
      break;
    }
    refusals.push_back(absl::StrCat(a.architecture(), ": ", failed));
  }
  if (arch == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--names=hf: this checkpoint has no faithful Hugging Face equivalent in preset '", plan.preset, "': ",
        absl::StrJoin(refusals, "; "), ". Export with --names=checkpoint instead"));
  }
  plan.architecture = arch->architecture();

  // Names.
  std::vector<std::regex> res;
  for (const HfTensorMap& t : arch->tensor()) {
    UCP_ASSIGN_OR_RETURN(std::regex re, Compile(t.pattern(), plan.architecture));
    res.push_back(std::move(re));
  }
  std::vector<std::string> unmatched;
  std::set<int64_t> layer_indices;
  struct Matched {
    int param;
    int entry;
    std::smatch m;
    std::string name;
  };
  std::vector<Matched> matched;
  for (int i : order) {
    const state::ParamState& p = info.params[static_cast<size_t>(i)];
    bool found = false;
    for (size_t e = 0; e < res.size(); ++e) {
      Matched mt{i, static_cast<int>(e), {}, p.name};
      if (!std::regex_match(mt.name, mt.m, res[e])) continue;
      found = true;
      const HfTensorMap& entry = arch->tensor(static_cast<int>(e));
      if (entry.split() == HF_SPLIT_DROP) {
        plan.dropped.push_back(p.name);
        break;
      }
      if (entry.layer_group() > 0) {
        int64_t idx = 0;
        if (static_cast<size_t>(entry.layer_group()) >= mt.m.size() ||
            !absl::SimpleAtoi(mt.m[entry.layer_group()].str(), &idx)) {
          return absl::InternalError(absl::StrCat("preset '", plan.preset, "': pattern '", entry.pattern(),
                                                  "' group ", entry.layer_group(), " is not a layer index in '",
                                                  p.name, "'"));
        }
        layer_indices.insert(idx);
      }
      matched.push_back(std::move(mt));
      break;
    }
    if (!found) unmatched.push_back(p.name);
  }
  if (!unmatched.empty()) {
    if (unmatched.size() > 12) unmatched.resize(12), unmatched.push_back("...");
    return absl::FailedPreconditionError(absl::StrCat(
        "--names=hf: ", plan.architecture, " (preset '", plan.preset, "') has no name for: ",
        absl::StrJoin(unmatched, ", "), ". Export with --names=checkpoint instead"));
  }
  std::map<int64_t, int> ordinal;
  for (int64_t idx : layer_indices) ordinal.emplace(idx, static_cast<int>(ordinal.size()));

  // HF names and shapes; QKV shapes wait for the config (head counts).
  struct Out {
    HfTensor t;
    const HfTensorMap* entry = nullptr;
    int part = 0;
  };
  std::vector<Out> outs;
  std::set<std::string> hf_names;
  const int64_t source_tp = std::max(1, info.source_topology.tp);
  for (const Matched& mt : matched) {
    const HfTensorMap& entry = arch->tensor(mt.entry);
    const state::ParamState& p = info.params[static_cast<size_t>(mt.param)];
    int layer = -1;
    if (entry.layer_group() > 0) layer = ordinal.at(std::stoll(mt.m[entry.layer_group()].str()));
    const int want = entry.split() == HF_SPLIT_QKV ? 3 : entry.split() == HF_SPLIT_GATE_UP ? 2 : 1;
    if (entry.name_size() != want) {
      return absl::InternalError(absl::StrCat("preset '", plan.preset, "': pattern '", entry.pattern(), "' needs ",
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
      if (!hf_names.insert(o.t.name).second) {
        return absl::FailedPreconditionError(absl::StrCat("--names=hf: two checkpoint tensors map to '", o.t.name,
                                                          "' (the second is '", p.name, "')"));
      }
      if (entry.split() == HF_SPLIT_GATE_UP) {
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
        o.t.groups = groups;
        o.t.length = rows / (2 * groups);
        o.t.start = k * o.t.length;
        o.t.shape[0] = rows / 2;
      }
      outs.push_back(std::move(o));
    }
  }

  // Config.
  json::Value config = json::Value::Object();
  config.Set("architectures", json::Value::Array({json::Value::String(arch->architecture())}));
  config.Set("model_type", json::Value::String(arch->model_type()));
  std::map<std::string, std::string> overrides(options.config.begin(), options.config.end());
  std::set<std::string> used_overrides;
  auto find_out = [&](const std::string& name) -> const Out* {
    for (const Out& o : outs) {
      if (o.t.name == name) return &o;
    }
    return nullptr;
  };
  for (const HfConfigField& f : arch->config()) {
    std::optional<json::Value> v;
    std::string from;
    if (auto it = overrides.find(f.key()); it != overrides.end()) {
      UCP_ASSIGN_OR_RETURN(json::Value parsed, json::Parse(it->second),
                           _.Prepend(absl::StrCat("--hf_config ", f.key(), ": ")));
      v = std::move(parsed);
      used_overrides.insert(f.key());
      from = "--hf_config";
    }
    if (!v && !f.tensor_dim().empty()) {
      std::vector<std::string> parts = absl::StrSplit(f.tensor_dim(), ':');
      int dim = 0;
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &dim)) {
        return absl::InternalError(absl::StrCat("preset '", plan.preset, "': bad tensor_dim '", f.tensor_dim(), "'"));
      }
      if (const Out* o = find_out(parts[0]); o && o->entry->split() != HF_SPLIT_QKV && dim >= 0 &&
                                             static_cast<size_t>(dim) < o->t.shape.size()) {
        v = json::Value::Int(o->t.shape[static_cast<size_t>(dim)]);
      }
    }
    if (!v && !f.tensor_present().empty()) v = json::Value::Bool(hf_names.count(f.tensor_present()) > 0);
    if (!v && !f.tensor_absent().empty()) v = json::Value::Bool(hf_names.count(f.tensor_absent()) == 0);
    if (!v && f.count_layers()) v = json::Value::Int(static_cast<int64_t>(ordinal.size()));
    if (!v) {
      for (const std::string& a : f.arg()) {
        const Value* av = Arg(args, a);
        if (av == nullptr) continue;
        v = ArgAsJson(*av, f.type(), f.negate());
        if (v) {
          from = absl::StrCat("args.", a);
          break;
        }
      }
    }
    if (!v && !f.fallback_key().empty()) {
      if (const json::Value* fb = config.Get(f.fallback_key())) v = *fb;
    }
    if (!v && !f.divide().empty()) {
      std::vector<std::string> ab = absl::StrSplit(f.divide(), '/');
      bool ok = ab.size() == 2;
      const int64_t a = ok ? ConfigInt(config, ab[0], &ok) : 0;
      const int64_t b = ok ? ConfigInt(config, ab[1], &ok) : 0;
      if (ok && b != 0 && a % b == 0) v = json::Value::Int(a / b);
    }
    if (!v && !f.value().empty()) {
      UCP_ASSIGN_OR_RETURN(json::Value parsed, json::Parse(f.value()),
                           _.Prepend(absl::StrCat("preset '", plan.preset, "' config ", f.key(), ": ")));
      v = std::move(parsed);
      if (f.note_default() && f.arg_size() > 0) {
        plan.notes.push_back(absl::StrCat("config.json ", f.key(), " = ", f.value(), ": the default, since the checkpoint's args have no ",
                                          absl::StrJoin(f.arg(), " or "), "; pass --hf_config=", f.key(),
                                          "=VALUE if the training used another"));
      }
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
  if (!arch->transformers_version().empty()) {
    config.Set("transformers_version", json::Value::String(arch->transformers_version()));
  }

  // QKV splits and tp sums, now that the config is known.
  std::string layout = options.qkv_layout;
  if (layout != "auto" && layout != "grouped" && layout != "block") {
    return absl::InvalidArgumentError(absl::StrCat("--qkv_layout must be auto, grouped or block, not '", layout, "'"));
  }
  bool any_qkv = false;
  for (const Out& o : outs) any_qkv |= o.entry->split() == HF_SPLIT_QKV;
  if (any_qkv && layout == "auto") {
    const bool marker = !arch->qkv_block_marker_arg().empty() && Arg(args, arch->qkv_block_marker_arg()) != nullptr;
    layout = marker ? "block" : "grouped";
    plan.notes.push_back(
        marker ? absl::StrCat("fused query_key_value read as [Q_r; K_r; V_r] blocks per tp rank: the args have ",
                              arch->qkv_block_marker_arg(),
                              " (Megatron-DeepSpeed 676a482c or later); --qkv_layout=grouped says otherwise")
               : absl::StrCat("fused query_key_value read as grouped per kv head [nkv, q heads + 2, d] "
                              "(Megatron-DeepSpeed before 676a482c: the args have no ",
                              arch->qkv_block_marker_arg(), "); --qkv_layout=block says otherwise"));
  }
  for (Out& o : outs) {
    const state::ParamState& p = info.params[static_cast<size_t>(o.t.param)];
    if (!o.entry->sum_tp_if().empty()) {
      const json::Value* flag = config.Get(o.entry->sum_tp_if());
      if (flag != nullptr && flag->type() == json::Value::Type::kBool && flag->bool_value() && source_tp > 1) {
        if (p.rule.kind() != REPLICATED) {
          return absl::FailedPreconditionError(absl::StrCat("--names=hf: '", p.name, "' is merged as ",
                                                            MergeKind_Name(p.rule.kind()), ", expected REPLICATED"));
        }
        o.t.scale = source_tp;
        plan.notes.push_back(absl::StrCat(o.t.name, " = ", source_tp, " x '", p.name, "' (", o.entry->sum_tp_if(),
                                          ": every tp rank adds its copy before the all-reduce)"));
      }
    }
    if (o.entry->split() != HF_SPLIT_QKV) continue;
    bool ok = true;
    const int64_t nq = ConfigInt(config, arch->heads_key(), &ok);
    int64_t nkv = nq;
    if (!arch->kv_heads_key().empty() && config.Get(arch->kv_heads_key()) != nullptr) {
      nkv = ConfigInt(config, arch->kv_heads_key(), &ok);
    }
    if (!ok || nq <= 0 || nkv <= 0 || nq % nkv != 0) {
      return absl::FailedPreconditionError(absl::StrCat("--names=hf: cannot split '", p.name, "': need ",
                                                        arch->heads_key(), " and ", arch->kv_heads_key(),
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
    const int part = o.part;
    if (qkv_sub) {
      // Merged as three sub-params: [Q; K; V] whole.
      o.t.groups = 1;
      o.t.start = part == 0 ? 0 : part == 1 ? nq * d : (nq + nkv) * d;
      o.t.length = (part == 0 ? nq : nkv) * d;
    } else if (layout == "grouped") {
      o.t.groups = nkv;
      o.t.start = part == 0 ? 0 : part == 1 ? g * d : (g + 1) * d;
      o.t.length = part == 0 ? g * d : d;
    } else {
      const int64_t t = r.kind() == COLUMN ? source_tp : 1;
      if (nq % t != 0 || nkv % t != 0) {
        return absl::FailedPreconditionError(absl::StrCat("--names=hf: '", p.name, "': ", nq, " query and ", nkv,
                                                          " kv heads do not split over tp ", t));
      }
      o.t.groups = t;
      o.t.start = part == 0 ? 0 : part == 1 ? nq / t * d : (nq + nkv) / t * d;
      o.t.length = (part == 0 ? nq : nkv) / t * d;
    }
    o.t.shape[0] = o.t.groups * o.t.length;
  }
  for (Out& o : outs) plan.tensors.push_back(std::move(o.t));
  plan.config = std::move(config);
  return plan;
}

}  // namespace ucp::rules
