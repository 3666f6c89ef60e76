#include "ops/training_state.h"

#include "base/status_macros.h"
#include "formats/builtin/builtin.h"
#include "formats/format.h"

namespace ucp::ops {

absl::StatusOr<TrainingStatePlan> PlanTrainingState(const state::ModelState& state,
                                                    const writers::ZeroWriteOptions& options,
                                                    absl::string_view target) {
  const formats::Registry& registry = formats::builtin::Formats();
  UCP_ASSIGN_OR_RETURN(const formats::TargetFormat* format,
                       registry.PickTrainingStateTarget(state.info(), options, target));
  TrainingStatePlan out;
  out.layout.topo = options.target;
  out.layout.zero_stage = options.zero_stage > 0 ? options.zero_stage : state.info().zero_stage;
  UCP_ASSIGN_OR_RETURN(out.plan, format->PlanTrainingState(state, options, &out.layout));
  out.run = format->TrainingStateRunOptions(options);
  return out;
}

absl::StatusOr<WrittenCheckpoint> WriteTrainingState(const state::ModelState& state, const std::string& output_folder,
                                                     const writers::ZeroWriteOptions& options,
                                                     absl::string_view target) {
  UCP_ASSIGN_OR_RETURN(TrainingStatePlan planned, PlanTrainingState(state, options, target));
  UCP_ASSIGN_OR_RETURN(writers::WriteStats stats, writers::RunPlan(*planned.plan, output_folder, planned.run));
  WrittenCheckpoint out;
  out.layout = planned.layout;
  out.files = stats.files;
  out.bytes = stats.bytes;
  return out;
}

}  // namespace ucp::ops
