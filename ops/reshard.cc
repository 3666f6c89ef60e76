#include "ops/reshard.h"

#include "base/status_macros.h"
#include "rules/presets.h"

namespace ucp::ops {

absl::StatusOr<ReshardResult> Reshard(const ReshardOptions& options) {
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<deepspeed::ModelState> state,
                       OpenModelState(options.input_folder, options.zero_source, options.verify_checksums));
  ReshardResult result;
  result.source_kind = IsUniversalFolder(options.input_folder) ? "universal" : "zero";
  result.source = state->info().source_topology;
  result.notes = state->info().notes;
  writers::ZeroWriteOptions write = options.write;
  if (!write.layer_type_name) {
    // The class names the model's preset gives its pipeline layers.
    std::string preset = options.zero_source.rules.preset == "none" ? "" : options.zero_source.rules.preset;
    if (preset.empty()) {
      std::vector<std::string> names;
      for (const auto& p : state->info().params) names.push_back(p.name);
      preset = rules::DetectPreset(names).value_or("");
    }
    write.layer_type_name = rules::LayerTypeNamerFor(preset);
  }
  UCP_ASSIGN_OR_RETURN(result.write, writers::WriteZeroCheckpoint(*state, options.output_folder, write));
  return result;
}

}  // namespace ucp::ops
