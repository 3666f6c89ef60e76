// Writing a training state at a topology with the target format the
// registry picks (formats/format.h, Registry::PickTrainingStateTarget): a
// ZeRO stage 1/2, ZeRO-3 or native mixture-of-experts checkpoint, or the
// target named. What `ucp reshard` writes with, and the conformance suite's
// save(M, T).
//
// Example:
//   writers::ZeroWriteOptions o;
//   o.target = state::Topology{1, 1, 4};
//   UCP_ASSIGN_OR_RETURN(WrittenCheckpoint w, WriteTrainingState(state, "/out/global_step4", o));
#ifndef UCP_OPS_TRAINING_STATE_H_
#define UCP_OPS_TRAINING_STATE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "state/model_state.h"
#include "writers/plan.h"
#include "writers/target_options.h"

namespace ucp::ops {

struct WrittenCheckpoint {
  writers::TargetSummary layout;  // what the target chose
  int64_t files = 0;
  int64_t bytes = 0;
};

// The plan of `state` at options.target (`state` must outlive it), with the
// target named by `target` (a registry name, "" = the registry's pick), and
// the RunOptions it is run with.
struct TrainingStatePlan {
  std::unique_ptr<writers::Plan> plan;
  writers::RunOptions run;
  writers::TargetSummary layout;
};
absl::StatusOr<TrainingStatePlan> PlanTrainingState(const state::ModelState& state,
                                                    const writers::ZeroWriteOptions& options,
                                                    absl::string_view target = "");

// PlanTrainingState, then RunPlan in this process. `output_folder` is ROOT/TAG.
absl::StatusOr<WrittenCheckpoint> WriteTrainingState(const state::ModelState& state, const std::string& output_folder,
                                                     const writers::ZeroWriteOptions& options,
                                                     absl::string_view target = "");

}  // namespace ucp::ops

#endif  // UCP_OPS_TRAINING_STATE_H_
