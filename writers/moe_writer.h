// Writes a native mixture-of-experts ModelState (readers/moe_state.h) as the
// DeepSpeed ZeRO 1/2 checkpoint of a job at another dp and expert parallel
// degree (tp = pp = 1), what that job saves (engine.py _save_moe_checkpoint,
// stage_1_and_2.py state_dict), so that its plain load_checkpoint loads it:
//
//   mp_rank_00_model_states.pt            module without the experts, dp rank 0's
//                                         param_shapes (expert groups under local ids)
//   layer_L_expert_E_mp_rank_00_model_states.pt   each expert's weights, global names
//   zero_pp_rank_D_mp_rank_00_optim_states.pt     non-expert groups partitioned over dp,
//        expert groups over dp / ep, each rank's local experts (global id
//        (D % ep) * n_local + local) under local ids; expert param groups named
//        'ep_size_<ep>'; group_paddings in the target version's convention
//   latest
#ifndef UCP_WRITERS_MOE_WRITER_H_
#define UCP_WRITERS_MOE_WRITER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "deepspeed/model_state.h"
#include "writers/plan.h"
#include "writers/zero_writer.h"

namespace ucp::writers {

// The expert parallel degree the target gets (ZeroWriteOptions::expert_parallel).
absl::StatusOr<int> TargetExpertParallel(const deepspeed::ModelInfo& info, const ZeroWriteOptions& options);

absl::StatusOr<std::unique_ptr<Plan>> PlanMoe(const deepspeed::ModelState& state, const ZeroWriteOptions& options);

}  // namespace ucp::writers

#endif  // UCP_WRITERS_MOE_WRITER_H_
