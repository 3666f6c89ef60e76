// The `ucp inspect` report of a DeepSpeed source that exists at tp = pp = 1
// and reads as a SlicedState (ZeRO-3, native mixture of experts): topology,
// groups and every param with the ranges of the flat partitions
// (`fp32_flat_groups`, `single_partition_of_fp32_groups`) that hold its
// fp32 master, as the state's Inputs() name them.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(InspectReport r, SlicedReport(*z3, "zero3", z3->ds_version()));
#ifndef UCP_DEEPSPEED_SLICED_REPORT_H_
#define UCP_DEEPSPEED_SLICED_REPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/ucp.pb.h"
#include "state/model_state.h"

namespace ucp::deepspeed {

absl::StatusOr<InspectReport> SlicedReport(const state::SlicedState& st, const std::string& kind,
                                           const std::string& ds_version);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_SLICED_REPORT_H_
