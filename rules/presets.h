// The built-in model presets: rules/presets/*.textproto (`Preset` messages of
// proto/ucp.proto), embedded into the binary. A preset is data: merge rules,
// rules that the checkpoint's args switch on, and the class names of the
// model's pipeline layers. Adding a model family is adding a file.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(const Preset* p, FindPreset("gpt-neox"));
//   std::optional<std::string> detected = DetectPreset(param_names);
#ifndef UCP_RULES_PRESETS_H_
#define UCP_RULES_PRESETS_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "state/model_state.h"
#include "format/pickle/value.h"
#include "proto/ucp.pb.h"

namespace ucp::rules {

// `--preset=none`: use no preset and detect none.
inline constexpr char kNoPreset[] = "none";

// Every built-in preset, by name.
std::vector<std::string> PresetNames();
absl::StatusOr<const Preset*> FindPreset(absl::string_view name);
// A preset's merge rules (what `ucp rules --preset=NAME` prints).
absl::StatusOr<MergeRules> PresetRules(absl::string_view name);

// The preset whose rules match the most of `names` (at least half of them
// and more than any other; Preset.detect_requires narrows the candidates),
// or nullopt. Names only: rules' shape conditions are not tested. Names of
// DeepSpeed's MoE layer (`.deepspeed_moe.`: router and experts) are not counted.
// `hf_model_type`: the `model_type` of the checkpoint's config.json ("" =
// none): presets that list model types (Preset.hf_model_type) but not this
// one are no candidates, and one that lists it wins if its rules match at
// least half of the names.
std::optional<std::string> DetectPreset(const std::vector<std::string>& names,
                                        const std::string& hf_model_type = "");

// The ArgOverride rules of `preset` whose condition the checkpoint's `args`
// (a dict, or null) meets, in file order, each with its note.
struct ActiveOverride {
  MergeRule rule;
  std::string note;
};
std::vector<ActiveOverride> ActiveOverrides(const Preset& preset, const pickle::Value* args);

// Names pipeline layers for PipelineModule's type:REGEX partitioning: from
// the param names of a layer (without the layer prefix), the class name the
// preset gives it ("function" for a layer without params). `preset` may be
// empty: GPT-NeoX's class names then.
using LayerTypeNamer = std::function<std::string(const std::vector<std::string>& local_names)>;
LayerTypeNamer LayerTypeNamerFor(const std::string& preset);

namespace internal {
struct EmbeddedPreset {
  const char* file;
  const char* text;
};
const std::vector<EmbeddedPreset>& EmbeddedPresets();  // presets_data.cc (generated)
}  // namespace internal

}  // namespace ucp::rules

#endif  // UCP_RULES_PRESETS_H_
