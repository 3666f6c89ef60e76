#include "ops/reshard.h"

#include "base/status_macros.h"
#include "rules/presets.h"

namespace ucp::ops {

absl::StatusOr<ReshardResult> Reshard(const ReshardOptions& options) {
  // A reshard to tp=1 splits nothing: a tp=1 source needs no merge rules.
  SourceOptions source = options.zero_source;
  if (options.write.target.tp == 1) source.tp1_whole_tensors = true;
  UCP_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(options.input_folder, source, options.verify_checksums,
                                                    /*zero_only=*/false, options.cluster));
  const deepspeed::ModelState* state = src.state.get();
  ReshardResult result;
  result.source_kind = src.kind;
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
  absl::StatusOr<std::unique_ptr<writers::Plan>> plan = writers::PlanZero(*state, write, &result.write.layout);
  if (options.cluster != nullptr) UCP_RETURN_IF_ERROR(AgreeOnStatus(*options.cluster, plan.status()));
  UCP_RETURN_IF_ERROR(plan.status());
  if (options.dry_run_ranks > 0) {
    result.plan = writers::DescribePlan(**plan, options.cluster ? options.cluster->size() : options.dry_run_ranks,
                                        options.dry_run_units);
    return result;
  }
  const writers::RunOptions run = writers::ZeroRunOptions(write);
  UCP_ASSIGN_OR_RETURN(writers::WriteStats stats,
                       options.cluster != nullptr
                           ? writers::RunPlanOnCluster(**plan, options.output_folder, run, *options.cluster)
                           : writers::RunPlan(**plan, options.output_folder, run));
  result.write.files = stats.files;
  result.write.bytes = stats.bytes;
  return result;
}

}  // namespace ucp::ops
