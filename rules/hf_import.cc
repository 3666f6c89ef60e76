#include "rules/hf_import.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "rules/hf_names.h"
#include "rules/presets.h"
#include "state/model_state.h"

namespace ucp::rules {
namespace {

// An HF name template ("gpt_neox.layers.{layer}.{2}.{3}") as a regex over
// HF names, and the placeholder each of its groups captures.
constexpr char kTiedPrefix[] = "tied_modules.";

struct Inverse {
  std::regex re;
  std::vector<std::string> keys;
};

Inverse InverseOf(const std::string& tmpl) {
  Inverse out;
  std::string re;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    const size_t close = tmpl[i] == '{' ? tmpl.find('}', i) : std::string::npos;
    if (close != std::string::npos) {
      const std::string key = tmpl.substr(i + 1, close - i - 1);
      out.keys.push_back(key);
      re += key == "layer" ? "(\\d+)" : key == "0" ? "(.+)" : "([^.]+)";
      i = close;
      continue;
    }
    if (std::string(".^$|()[]{}*+?\\").find(tmpl[i]) != std::string::npos) re.push_back('\\');
    re.push_back(tmpl[i]);
  }
  out.re = std::regex(re, std::regex::ECMAScript);
  return out;
}

// `import_name` with its placeholders filled from what the HF name matched.
absl::StatusOr<std::string> Fill(const std::string& tmpl, const std::map<std::string, std::string>& matched,
                                 int num_layers, const std::string& preset) {
  std::string out;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    const size_t close = tmpl[i] == '{' ? tmpl.find('}', i) : std::string::npos;
    if (close == std::string::npos) {
      out.push_back(tmpl[i]);
      continue;
    }
    std::string key = tmpl.substr(i + 1, close - i - 1);
    i = close;
    int64_t base = -1, plus = 0;
    absl::string_view k = key;
    if (absl::ConsumePrefix(&k, "layers")) {
      base = num_layers;
    } else if (absl::ConsumePrefix(&k, "layer")) {
      auto it = matched.find("layer");
      if (it == matched.end() || !absl::SimpleAtoi(it->second, &base)) base = -2;
    }
    if (base != -1) {
      if (base < 0 || (!k.empty() && !(absl::ConsumePrefix(&k, "+") && absl::SimpleAtoi(k, &plus)))) {
        return absl::InternalError(absl::StrCat("preset '", preset, "': import_name '", tmpl, "': bad {", key, "}"));
      }
      out += absl::StrCat(base + plus);
      continue;
    }
    auto it = matched.find(key);
    if (it == matched.end()) {
      return absl::InternalError(absl::StrCat("preset '", preset, "': import_name '", tmpl, "': {", key,
                                              "} is not a placeholder of the entry's name"));
    }
    out += it->second;
  }
  return out;
}

// Whether entry `a` imports config architecture `arch`: it has import
// names, and `arch` is its architecture or one of its config_architectures.
bool Imports(const HfArchitecture& a, const std::string& arch) {
  bool any = false;
  for (const HfTensorMap& t : a.tensor()) any = any || !t.import_name().empty();
  if (!any) return false;
  if (a.architecture() == arch) return true;
  return std::find(a.config_architectures().begin(), a.config_architectures().end(), arch) !=
         a.config_architectures().end();
}

// Why a preset's trainer cannot hold `arch` (HfArchitecture.import_refused
// of any preset), or "".
std::string RefusedBecause(const std::string& arch) {
  for (const std::string& n : PresetNames()) {
    absl::StatusOr<const Preset*> p = FindPreset(n);
    if (!p.ok()) continue;
    for (const HfArchitecture& a : (*p)->hf()) {
      for (const HfRefusedArchitecture& r : a.import_refused()) {
        if (r.architecture() == arch) return absl::StrCat(" ", arch, " is not imported by preset '", n, "': ", r.reason());
      }
    }
  }
  return "";
}

absl::StatusOr<const HfArchitecture*> ArchitectureOf(const json::Value& config, const std::string& preset_name,
                                                     HfImportPlan* plan) {
  const json::Value* archs = config.Get("architectures");
  std::string arch;
  if (archs != nullptr && archs->type() == json::Value::Type::kArray && !archs->items().empty() &&
      archs->items()[0].type() == json::Value::Type::kString) {
    arch = archs->items()[0].string_value();
  }
  std::vector<std::string> importable, of_arch;
  for (const std::string& n : PresetNames()) {
    absl::StatusOr<const Preset*> p = FindPreset(n);
    if (!p.ok()) continue;
    for (const HfArchitecture& a : (*p)->hf()) {
      if (!Imports(a, a.architecture())) continue;
      std::vector<std::string> archs_of = {a.architecture()};
      for (const std::string& c : a.config_architectures()) {
        if (c != a.architecture()) archs_of.push_back(c);
      }
      importable.push_back(absl::StrCat(n, " (", absl::StrJoin(archs_of, ", "), ")"));
      if (Imports(a, arch)) of_arch.push_back(n);
    }
  }
  std::string name = preset_name;
  if (name.empty() || name == kNoPreset) {
    if (of_arch.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a Hugging Face folder is imported by a preset's names: pass --preset=NAME (presets that import: ",
          absl::StrJoin(importable, "; "), "; config.json's architecture: '", arch, "').", RefusedBecause(arch)));
    }
    name = of_arch[0];
    plan->notes.push_back(absl::StrCat("preset '", name, "': the one preset that imports ", arch,
                                       " (config.json); --preset names another"));
  }
  UCP_ASSIGN_OR_RETURN(const Preset* preset, FindPreset(name));
  for (const HfArchitecture& a : preset->hf()) {
    if (Imports(a, arch)) {
      plan->preset = name;
      plan->architecture = arch;
      return &a;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "config.json: architectures[0] is '", arch, "', which preset '", name,
      "' does not import (presets that import: ", absl::StrJoin(importable, "; "), ").", RefusedBecause(arch)));
}

// config.json's value at a dotted key ("rope_parameters.rope_type"), or null.
const json::Value* ConfigAt(const json::Value& config, const std::string& key) {
  const json::Value* v = &config;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(key, '.'))) {
    if (v->type() != json::Value::Type::kObject) return nullptr;
    v = v->Get(part);
    if (v == nullptr) return nullptr;
  }
  return v;
}

// A JSON literal in compact form ("" stays "").
std::string Compact(const std::string& literal) {
  if (literal.empty()) return "";
  absl::StatusOr<json::Value> parsed = json::Parse(literal);
  return parsed.ok() ? json::DumpCompact(*parsed) : literal;
}

// The value of `key` as compact JSON, `absent` when the key is not there
// ("" when neither).
std::string ConfigText(const json::Value& config, const std::string& key, const std::string& absent) {
  if (const json::Value* v = ConfigAt(config, key)) return json::DumpCompact(*v);
  return Compact(absent);
}

// The architecture's import_require: each config.json value the trainer
// cannot represent is refused, naming the key, its value and why.
absl::Status CheckImportConditions(const HfArchitecture& a, const json::Value& config, const std::string& arch) {
  for (const HfImportCondition& c : a.import_require()) {
    if (!c.architecture().empty() && c.architecture() != arch) continue;
    const std::string value = ConfigText(config, c.key(), c.absent());
    if (value.empty()) continue;
    bool ok = false;
    std::string other;
    for (const std::string& allowed : c.one_of()) ok = ok || value == Compact(allowed);
    if (!c.equals_key().empty()) {
      const std::string v = ConfigText(config, c.equals_key(), c.absent());
      ok = ok || v == value;
      other = absl::StrCat(", ", c.equals_key(), " = ", v);
    }
    if (!c.at_least_key().empty()) {
      const json::Value* v = ConfigAt(config, c.key());
      const json::Value* bound = ConfigAt(config, c.at_least_key());
      const bool ints = v != nullptr && bound != nullptr && v->type() == json::Value::Type::kInt &&
                        bound->type() == json::Value::Type::kInt;
      ok = ok || value == "null" || (ints && v->int_value() >= bound->int_value());
      other = absl::StrCat(", ", c.at_least_key(), " = ", ConfigText(config, c.at_least_key(), "null"));
    }
    if (ok) continue;
    return absl::UnimplementedError(absl::StrCat("config.json: ", c.key(), " = ", value,
                                                 ConfigAt(config, c.key()) == nullptr ? " (absent: the default)" : "",
                                                 other, ": ", c.reason(), "; not imported"));
  }
  return absl::OkStatus();
}

// One HF tensor's checkpoint name, from the first entry with an import_name
// whose names include it; *part is the index of that name in a fused entry
// (q, k, v or gate, up), -1 for a rename. Returns "" (and sets *fused) for a
// tensor only a fused entry without an import_name names.
absl::StatusOr<std::string> ImportName(const HfArchitecture& arch, const std::vector<std::vector<Inverse>>& inverses,
                                       const std::string& hf, int num_layers, const std::string& preset, bool tied,
                                       int* entry, int* part, bool* fused,
                                       std::map<std::string, std::string>* placeholders) {
  for (int e = 0; e < arch.tensor_size(); ++e) {
    const HfTensorMap& t = arch.tensor(e);
    const bool is_fused = t.split() == HF_SPLIT_QKV || t.split() == HF_SPLIT_GATE_UP;
    for (int n = 0; n < t.name_size(); ++n) {
      const Inverse& inv = inverses[static_cast<size_t>(e)][static_cast<size_t>(n)];
      std::smatch m;
      if (!std::regex_match(hf, m, inv.re)) continue;
      if (t.import_name().empty()) {
        // Entries without an import name only say what the name is.
        *fused = *fused || t.split() != HF_SPLIT_NONE;
        continue;
      }
      if (n > 0 && !is_fused) continue;
      // A tied module's name is taken only when the embeddings are tied (the
      // preset lists it before the untied name of the same tensor).
      if (absl::StartsWith(t.import_name(), kTiedPrefix) && !tied) continue;
      std::map<std::string, std::string> matched;
      for (size_t g = 0; g < inv.keys.size(); ++g) matched[inv.keys[g]] = m[g + 1].str();
      const std::string tmpl = t.import_name().substr(0, t.import_name().find(" @"));
      UCP_ASSIGN_OR_RETURN(std::string name, Fill(tmpl, matched, num_layers, preset));
      // The entry's own pattern decides: a name it does not match is not its.
      std::smatch pm;
      if (!std::regex_match(name, pm, std::regex(t.pattern(), std::regex::ECMAScript))) continue;
      *entry = e;
      *part = is_fused ? n : -1;
      *placeholders = std::move(matched);
      return name;
    }
  }
  return std::string();
}

// The number of transformer layers: one more than the largest {layer} any
// entry's name matches.
int CountLayers(const std::vector<std::vector<Inverse>>& inverses, const std::vector<HfImportInput>& tensors) {
  int n = 0;
  for (const HfImportInput& in : tensors) {
    for (const std::vector<Inverse>& names : inverses) {
      for (const Inverse& inv : names) {
        std::smatch m;
        if (!std::regex_match(in.name, m, inv.re)) continue;
        for (size_t g = 0; g < inv.keys.size(); ++g) {
          int v = 0;
          if (inv.keys[g] == "layer" && absl::SimpleAtoi(m[g + 1].str(), &v)) n = std::max(n, v + 1);
        }
      }
    }
  }
  return n;
}

// The export's mapping run over the checkpoint names found: each must give
// back its HF tensor(s) under the same names and shapes: a rename whole, a
// fused tensor's parts as rows of equal groups that tile every group exactly
// once (which is where each part's rows in the fused tensor come from).
absl::Status CheckForwards(HfImportPlan* plan, const std::vector<HfImportInput>& tensors, const HfArchitecture& arch,
                           const json::Value& config) {
  state::ModelInfo info;
  std::vector<int> order;
  for (const HfImportTensor& t : plan->tensors) {
    state::ParamState p;
    p.name = t.name;
    p.full_shape = t.shape;
    p.rule.set_kind(REPLICATED);
    order.push_back(static_cast<int>(info.params.size()));
    info.params.push_back(std::move(p));
  }
  info.source_topology = state::Topology{1, 1, 1};
  info.Reindex();
  HfOptions o;
  o.preset = plan->preset;
  for (const HfConfigField& f : arch.config()) {
    if (const json::Value* v = config.Get(f.key())) o.config.emplace_back(f.key(), json::DumpCompact(*v));
  }
  UCP_ASSIGN_OR_RETURN(HfNamePlan forward, PlanHfNames(info, order, plan->args.get(), o),
                       _.Prepend(absl::StrCat("preset '", plan->preset, "' run forwards over the imported names: ")));
  std::vector<size_t> seen(plan->tensors.size(), 0);
  for (const HfTensor& t : forward.tensors) {
    HfImportTensor& it = plan->tensors[static_cast<size_t>(t.param)];
    HfImportPart* part = nullptr;
    for (HfImportPart& p : it.parts) {
      if (tensors[static_cast<size_t>(p.input)].name == t.name) part = &p;
    }
    const HfImportInput& in = tensors[static_cast<size_t>(part != nullptr ? part->input : it.input)];
    const bool whole = t.groups == 1 && t.start == 0 && (in.shape.empty() || t.length == in.shape[0]);
    const bool rows = part != nullptr && !t.shape.empty() && t.groups >= 1 && t.groups * t.length == t.shape[0];
    if (t.name != in.name || t.shape != in.shape || t.scale != 1 || !(it.parts.empty() ? whole : rows)) {
      return absl::InternalError(absl::StrCat("preset '", plan->preset, "': '", in.name, "' imported as '", it.name,
                                              "', which the export names '", t.name, "' (rows ", t.start, "+",
                                              t.length, " of ", t.groups, " groups, x", t.scale, ")"));
    }
    if (part != nullptr) *part = HfImportPart{part->input, t.groups, t.start, t.length};
    ++seen[static_cast<size_t>(t.param)];
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    HfImportTensor& it = plan->tensors[i];
    const std::string from = tensors[static_cast<size_t>(it.input)].name;
    if (seen[i] != std::max<size_t>(1, it.parts.size())) {
      return absl::InternalError(absl::StrCat("preset '", plan->preset, "': '", it.name, "' (from '", from,
                                              "') is exported as ", seen[i], " tensors, imported from ",
                                              std::max<size_t>(1, it.parts.size())));
    }
    if (it.parts.empty()) continue;
    std::sort(it.parts.begin(), it.parts.end(),
              [](const HfImportPart& a, const HfImportPart& b) { return a.start < b.start; });
    int64_t next = 0;
    for (const HfImportPart& p : it.parts) {
      if (p.groups != it.parts[0].groups || p.start != next) {
        return absl::InternalError(absl::StrCat("preset '", plan->preset, "': the parts of '", it.name,
                                                "' do not tile its rows (", tensors[static_cast<size_t>(p.input)].name,
                                                ": rows ", p.start, "+", p.length, " of ", p.groups, " groups)"));
      }
      next += p.length;
    }
    if (next * it.parts[0].groups != it.shape[0]) {
      return absl::InternalError(absl::StrCat("preset '", plan->preset, "': the parts of '", it.name, "' give ",
                                              next * it.parts[0].groups, " rows of ", it.shape[0]));
    }
  }
  return absl::OkStatus();
}

// The args the export requires of the architecture's checkpoints (its
// conditions on args that may not be absent): true, or the value it equals.
pickle::ValuePtr RequiredArgs(const HfArchitecture& arch) {
  pickle::ValuePtr args = pickle::Value::MakeDict();
  for (const HfCondition& c : arch.require()) {
    if (c.arg().empty() || c.absent_ok()) continue;
    args->DictSet(pickle::Value::Str(c.arg()),
                  c.equals().empty() || c.equals() == "True" ? pickle::Value::Bool(true)
                  : c.equals() == "False"                    ? pickle::Value::Bool(false)
                                                             : pickle::Value::Str(c.equals()));
  }
  return args;
}

// A tied module's key, local name and layers, from an import_name
// "tied_modules.<key>.<local> @L1,L2" (each L a layer template).
absl::Status TiedLayers(const std::string& import_name, const std::map<std::string, std::string>& placeholders,
                        int num_layers, const std::string& preset, HfImportTensor* t) {
  const size_t at = import_name.find(" @");
  const std::string rest = t->name.substr(std::string(kTiedPrefix).size());
  const size_t dot = rest.find('.');
  if (at == std::string::npos || dot == std::string::npos) {
    return absl::InternalError(absl::StrCat("preset '", preset, "': tied import_name '", import_name,
                                            "' needs tied_modules.<key>.<name> @<layers>"));
  }
  t->tied_key = rest.substr(0, dot);
  t->local_name = rest.substr(dot + 1);
  for (absl::string_view l : absl::StrSplit(import_name.substr(at + 2), ',')) {
    UCP_ASSIGN_OR_RETURN(std::string v, Fill(std::string(l), placeholders, num_layers, preset));
    int layer = 0;
    if (!absl::SimpleAtoi(v, &layer)) {
      return absl::InternalError(absl::StrCat("preset '", preset, "': tied layer '", l, "' of '", import_name, "'"));
    }
    t->tied_layers.push_back(layer);
  }
  std::sort(t->tied_layers.begin(), t->tied_layers.end());
  t->layer = t->tied_layers.front();
  return absl::OkStatus();
}

// A fused tensor's shape: its parts' rows stacked (every other dim equal).
absl::Status FusedShape(const std::vector<HfImportInput>& tensors, HfImportTensor* t) {
  t->shape = tensors[static_cast<size_t>(t->parts[0].input)].shape;
  if (t->shape.empty()) return absl::InvalidArgumentError(absl::StrCat("'", tensors[static_cast<size_t>(t->parts[0].input)].name, "' is a scalar"));
  for (size_t k = 1; k < t->parts.size(); ++k) {
    const HfImportInput& in = tensors[static_cast<size_t>(t->parts[k].input)];
    if (in.shape.size() != t->shape.size() ||
        !std::equal(in.shape.begin() + 1, in.shape.end(), t->shape.begin() + 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", in.name, "' [", absl::StrJoin(in.shape, ", "), "] and '",
          tensors[static_cast<size_t>(t->parts[0].input)].name, "' [", absl::StrJoin(t->shape, ", "),
          "] are fused into '", t->name, "': expected the same size in every dim but the first"));
    }
    t->shape[0] += in.shape[0];
  }
  return absl::OkStatus();
}

// Each fused tensor's parts are all there (the HF names its entry needs),
// and its shape is theirs stacked.
absl::Status CompleteFused(const std::map<size_t, std::vector<std::string>>& fused_names,
                           const std::vector<HfImportInput>& tensors, HfImportPlan* plan) {
  for (const auto& [index, want] : fused_names) {
    HfImportTensor& t = plan->tensors[index];
    std::vector<std::string> missing;
    for (const std::string& n : want) {
      bool found = false;
      for (const HfImportPart& p : t.parts) found = found || tensors[static_cast<size_t>(p.input)].name == n;
      if (!found) missing.push_back(n);
    }
    if (!missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("'", t.name, "' is fused from ", absl::StrJoin(want, ", "),
                                                     ": the folder has no ", absl::StrJoin(missing, ", ")));
    }
    UCP_RETURN_IF_ERROR(FusedShape(tensors, &t));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfImportPlan> PlanHfImport(const std::vector<HfImportInput>& tensors, const json::Value& config,
                                          const std::string& preset) {
  HfImportPlan plan;
  UCP_ASSIGN_OR_RETURN(const HfArchitecture* arch, ArchitectureOf(config, preset, &plan));
  UCP_RETURN_IF_ERROR(CheckImportConditions(*arch, config, plan.architecture));
  const json::Value* tie = config.Get("tie_word_embeddings");
  const bool tied = tie != nullptr && tie->type() == json::Value::Type::kBool && tie->bool_value();
  std::vector<std::vector<Inverse>> inverses;
  for (const HfTensorMap& t : arch->tensor()) {
    inverses.emplace_back();
    for (const std::string& n : t.name()) inverses.back().push_back(InverseOf(n));
  }
  const int num_hf_layers = CountLayers(inverses, tensors);
  plan.args = RequiredArgs(*arch);
  std::vector<std::string> unmatched, fused;
  std::vector<std::tuple<int, int, int>> keys;  // layer, entry, plan index
  std::map<std::string, size_t> by_name;        // checkpoint name -> plan index
  std::map<size_t, std::vector<std::string>> fused_names;  // plan index -> the HF names a fused tensor needs
  for (size_t i = 0; i < tensors.size(); ++i) {
    int entry = -1, part = -1;
    bool is_fused = false;
    std::map<std::string, std::string> placeholders;
    UCP_ASSIGN_OR_RETURN(std::string name, ImportName(*arch, inverses, tensors[i].name, num_hf_layers, plan.preset,
                                                      tied, &entry, &part, &is_fused, &placeholders));
    if (name.empty()) {
      (is_fused ? fused : unmatched).push_back(tensors[i].name);
      continue;
    }
    auto [it, added] = by_name.emplace(name, plan.tensors.size());
    if (!added) {
      HfImportTensor& t = plan.tensors[it->second];
      if (part < 0 || t.parts.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("two Hugging Face tensors import as '", name,
                                                       "' (the second is '", tensors[i].name, "')"));
      }
      t.parts.push_back(HfImportPart{static_cast<int>(i)});
      continue;
    }
    HfImportTensor t;
    t.input = static_cast<int>(i);
    t.name = name;
    t.shape = tensors[i].shape;
    if (part >= 0) {
      t.parts.push_back(HfImportPart{static_cast<int>(i)});
      for (const std::string& tmpl : arch->tensor(entry).name()) {
        UCP_ASSIGN_OR_RETURN(std::string n, Fill(tmpl, placeholders, num_hf_layers, plan.preset));
        fused_names[plan.tensors.size()].push_back(n);
      }
    }
    if (absl::StartsWith(name, kTiedPrefix)) {
      UCP_RETURN_IF_ERROR(TiedLayers(arch->tensor(entry).import_name(), placeholders, num_hf_layers, plan.preset, &t));
      keys.emplace_back(t.layer, entry, static_cast<int>(plan.tensors.size()));
      plan.tensors.push_back(std::move(t));
      continue;
    }
    const size_t dot = name.find('.');
    if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(0, dot), &t.layer)) {
      return absl::InternalError(absl::StrCat("preset '", plan.preset, "': import name '", name, "' of '",
                                              tensors[i].name, "' does not start with a pipeline layer index"));
    }
    t.local_name = name.substr(dot + 1);
    keys.emplace_back(t.layer, entry, static_cast<int>(plan.tensors.size()));
    plan.tensors.push_back(std::move(t));
  }
  UCP_RETURN_IF_ERROR(CompleteFused(fused_names, tensors, &plan));
  if (!fused.empty() || !unmatched.empty()) {
    auto list = [](std::vector<std::string> v) {
      if (v.size() > 12) v.resize(12), v.push_back("...");
      return absl::StrJoin(v, ", ");
    };
    return absl::UnimplementedError(absl::StrCat(
        "preset '", preset, "' (", plan.architecture, ") imports no checkpoint name for: ",
        fused.empty() ? "" : absl::StrCat(list(fused), " (parts of a fused checkpoint tensor: not imported yet)"),
        !fused.empty() && !unmatched.empty() ? "; " : "", unmatched.empty() ? "" : list(unmatched)));
  }
  std::sort(keys.begin(), keys.end());
  std::vector<HfImportTensor> sorted;
  std::set<int> layers;
  for (const auto& [layer, entry, i] : keys) {
    sorted.push_back(plan.tensors[static_cast<size_t>(i)]);
    layers.insert(layer);
  }
  plan.tensors = std::move(sorted);
  plan.module_layers.assign(layers.begin(), layers.end());
  plan.num_layers = plan.module_layers.empty() ? 0 : plan.module_layers.back() + 1;
  bool any_tied = false;
  for (const HfImportTensor& t : plan.tensors) {
    for (int l : t.tied_layers) plan.num_layers = std::max(plan.num_layers, l + 1);
    any_tied = any_tied || !t.tied_key.empty();
  }
  if (tied && !any_tied) {
    return absl::UnimplementedError(absl::StrCat(
        "config.json: tie_word_embeddings is true (the output layer is the input embedding), but preset '",
        plan.preset, "' names no tied module for ", plan.architecture,
        ": its trainer's output layer would be a separate weight; not imported"));
  }
  plan.partition_method = arch->import_partition_method();
  UCP_RETURN_IF_ERROR(CheckForwards(&plan, tensors, *arch, config));
  // The export's sum_tp_if: a model that adds each tp rank's copy before the
  // all-reduce (GPT-NeoX's gpt_j_residual) holds 1/tp of the HF value per
  // rank; the import writes the HF value on every rank.
  std::map<std::string, std::string> summed;  // pattern -> config key
  for (const HfTensorMap& t : arch->tensor()) {
    const json::Value* flag = t.sum_tp_if().empty() ? nullptr : config.Get(t.sum_tp_if());
    if (flag != nullptr && flag->type() == json::Value::Type::kBool && flag->bool_value()) summed[t.pattern()] = t.sum_tp_if();
  }
  for (const auto& [pattern, key] : summed) {
    plan.notes.push_back(absl::StrCat(
        "params matching '", pattern, "' are written whole on every tp rank, for a model that adds them once after "
        "the all-reduce (Megatron's RowParallelLinear); with config.json's ", key, " true the preset's own trainer adds "
        "each rank's copy before it, which needs them divided by tp: not done"));
  }
  plan.notes.push_back(absl::StrCat("Hugging Face ", plan.architecture, " imported by preset '", plan.preset, "': ",
                                    plan.tensors.size(), " tensors, ", num_hf_layers, " layers as pipeline layers ",
                                    plan.num_layers, " specs (checked by running the export's names forwards)"));
  return plan;
}

}  // namespace ucp::rules
