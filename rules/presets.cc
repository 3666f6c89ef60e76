#include "rules/presets.h"

#include <algorithm>
#include <map>
#include <memory>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "rules/rules.h"

namespace ucp::rules {
namespace {

using pickle::Kind;
using pickle::Value;

class ParseErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    absl::StrAppend(&errors_, errors_.empty() ? "" : "; ", "line ", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

struct Registry {
  std::map<std::string, Preset> presets;
  std::string error;  // a broken embedded file (a build defect)
};

const Registry& Presets() {
  static const Registry* registry = [] {
    auto* r = new Registry();
    for (const auto& e : internal::EmbeddedPresets()) {
      Preset p;
      google::protobuf::TextFormat::Parser parser;
      ParseErrors errors;
      parser.RecordErrorsTo(&errors);
      if (!parser.ParseFromString(e.text, &p)) {
        absl::StrAppend(&r->error, "rules/presets/", e.file, ": ", errors.errors(), "\n");
        continue;
      }
      const std::string stem(absl::StripSuffix(e.file, ".textproto"));
      if (p.name() != stem) {
        absl::StrAppend(&r->error, "rules/presets/", e.file, ": name '", p.name(), "' differs from the file name\n");
        continue;
      }
      r->presets.emplace(p.name(), std::move(p));
    }
    return r;
  }();
  return *registry;
}

// Python's str() of a scalar arg value; nullopt for other kinds.
std::optional<std::string> PyStr(const Value& v) {
  if (v.is(Kind::kBool)) return v.int_value() ? "True" : "False";
  if (v.is(Kind::kInt) && v.fits_int64()) return absl::StrCat(v.int_value());
  if (v.is(Kind::kStr)) return v.str();
  if (v.is_none()) return "None";
  return std::nullopt;
}

bool Truthy(const Value& v) {
  if (v.is(Kind::kBool) || v.is(Kind::kInt)) return v.int_value() != 0;
  if (v.is(Kind::kStr)) return !v.str().empty();
  return false;
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, p] : Presets().presets) names.push_back(name);
  return names;
}

absl::StatusOr<const Preset*> FindPreset(absl::string_view name) {
  const Registry& r = Presets();
  if (!r.error.empty()) return absl::InternalError(absl::StrCat("built-in presets: ", r.error));
  auto it = r.presets.find(std::string(name));
  if (it == r.presets.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown preset '", name, "' (", absl::StrJoin(PresetNames(), ", "), ")"));
  }
  return &it->second;
}

absl::StatusOr<MergeRules> PresetRules(absl::string_view name) {
  UCP_ASSIGN_OR_RETURN(const Preset* p, FindPreset(name));
  MergeRules rules;
  for (const MergeRule& r : p->rule()) {
    MergeRule* out = rules.add_rule();
    *out = r;
    if (p->tp_split_by_autotp()) out->set_autotp_widths(true);
  }
  return rules;
}

// A param of DeepSpeed's MoE layer (deepspeed.moe.layer.MoE: its router
// `deepspeed_moe.gate.wg` and the experts under `deepspeed_moe.experts`),
// which any model family can hold: its names speak neither for nor against a
// preset. A model whose every block is MoE, or with many experts, has more of
// them than of its own.
static bool IsDeepSpeedMoeName(const std::string& name) {
  return name.find(".deepspeed_moe.") != std::string::npos || name.rfind("deepspeed_moe.", 0) == 0;
}

std::optional<std::string> DetectPreset(const std::vector<std::string>& all_names, const std::string& hf_model_type) {
  std::vector<std::string> names;
  for (const std::string& n : all_names) {
    if (!IsDeepSpeedMoeName(n)) names.push_back(n);
  }
  if (names.empty()) return std::nullopt;
  std::map<std::string, size_t> score;
  std::map<std::string, bool> required_met;
  std::vector<std::string> lists_model_type;
  for (const auto& [name, preset] : Presets().presets) {
    if (!hf_model_type.empty() && preset.hf_model_type_size() > 0) {
      const auto& types = preset.hf_model_type();
      if (std::find(types.begin(), types.end(), hf_model_type) == types.end()) continue;
      lists_model_type.push_back(name);
    }
    MergeRules rules;
    for (const MergeRule& r : preset.rule()) *rules.add_rule() = r;
    auto set = RuleSet::Compile(rules, PRESET, name);
    if (!set.ok()) continue;
    if (preset.detect_requires_size() > 0) {
      MergeRules req;
      for (const std::string& pattern : preset.detect_requires()) {
        MergeRule* r = req.add_rule();
        r->set_pattern(pattern);
        r->set_kind(REPLICATED);
      }
      auto req_set = RuleSet::Compile(req, PRESET, name);
      bool met = false;
      for (const auto& n : names) met |= req_set.ok() && req_set->MatchName(n) != nullptr;
      if (!met) continue;
      required_met[name] = true;
    }
    size_t& s = score[name];
    for (const auto& n : names) {
      if (set->MatchName(n) != nullptr) ++s;
    }
  }
  // The checkpoint's config.json names the model type a preset lists.
  for (const std::string& preset : lists_model_type) {
    if (score[preset] > 0 && score[preset] * 2 >= names.size()) return preset;
  }
  std::string best;
  size_t best_score = 0;
  bool tie = false;
  for (const auto& [preset, s] : score) {
    if (s > best_score) {
      best = preset;
      best_score = s;
      tie = false;
    } else if (s == best_score && s > 0) {
      tie = true;
    }
  }
  // A preset whose detect_requires names are present wins a tie.
  for (const auto& [preset, met] : required_met) {
    if (met && score[preset] == best_score) {
      best = preset;
      tie = false;
    }
  }
  if (best.empty() || tie || best_score * 2 < names.size()) return std::nullopt;
  return best;
}

std::vector<ActiveOverride> ActiveOverrides(const Preset& preset, const pickle::Value* args) {
  std::vector<ActiveOverride> out;
  if (args == nullptr || !args->is(Kind::kDict)) return out;
  for (const Preset::ArgOverride& o : preset.arg_override()) {
    const Value* v = args->DictGet(o.arg());
    if (v == nullptr) continue;
    const bool met = o.equals().empty() ? Truthy(*v) : PyStr(*v) == o.equals();
    if (!met) continue;
    for (MergeRule r : o.rule()) {
      if (preset.tp_split_by_autotp()) r.set_autotp_widths(true);
      out.push_back({std::move(r), o.note()});
    }
  }
  return out;
}

LayerTypeNamer LayerTypeNamerFor(const std::string& preset) {
  const Preset* p = nullptr;
  if (auto found = FindPreset(preset.empty() ? "gpt-neox" : preset); found.ok()) p = *found;
  if (p == nullptr || p->layer_type_size() == 0) {
    if (auto neox = FindPreset("gpt-neox"); neox.ok()) p = *neox;
  }
  auto types = std::make_shared<std::vector<std::pair<std::regex, std::string>>>();
  if (p != nullptr) {
    for (const auto& t : p->layer_type()) {
      try {
        types->emplace_back(std::regex(t.pattern(), std::regex::ECMAScript), t.type_name());
      } catch (const std::regex_error&) {
        // A bad pattern in an embedded preset names nothing.
      }
    }
  }
  return [types](const std::vector<std::string>& local_names) -> std::string {
    if (local_names.empty()) return "function";
    for (const auto& [re, name] : *types) {
      for (const auto& n : local_names) {
        if (std::regex_search(n, re)) return name;
      }
    }
    return "Layer";
  };
}

}  // namespace ucp::rules
