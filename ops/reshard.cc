#include "ops/reshard.h"

#include "base/status_macros.h"

namespace ucp::ops {

absl::StatusOr<ReshardResult> Reshard(const ReshardOptions& options) {
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<deepspeed::ModelState> state,
                       OpenModelState(options.input_folder, options.zero_source, options.verify_checksums));
  ReshardResult result;
  result.source_kind = IsUniversalFolder(options.input_folder) ? "universal" : "zero";
  result.source = state->info().source_topology;
  result.notes = state->info().notes;
  UCP_ASSIGN_OR_RETURN(result.write, writers::WriteZeroCheckpoint(*state, options.output_folder, options.write));
  return result;
}

}  // namespace ucp::ops
