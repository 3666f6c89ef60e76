// Writes a native mixture-of-experts ModelState (formats/deepspeed_moe/moe_state.h) as the
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
//   expp_rank_E_mp_rank_00_optim_states.pt        {'optimizer': None} per ep rank,
//        for targets up to 0.19.4
//   latest
//
// The model states are the target version's (--target_ds_version, default
// the source's): from 0.19.3 the common checkpoint state (param_shapes,
// buffer_names, ..., ds_config, ds_version) + num_experts, ds_autoep_layers;
// before, module, lr_scheduler, data_sampler, random_ltd,
// sparse_tensor_module_names, skipped/global steps, global_samples, dp/mp
// world sizes, num_experts (+ ds_autoep_layers in 0.19.2); the source's
// client state after them. Targets before 0.14.5 get the expert groups'
// param_slice_mappings of the window that version's stage_1_and_2.py links
// (deepspeed::ExpertMappingWindow). A source without buffer_names (before
// 0.19.3) with module tensors outside the optimizer is refused for 0.19.3+
// targets: its files do not say which are buffers and which frozen params.
#ifndef UCP_FORMATS_DEEPSPEED_MOE_MOE_WRITER_H_
#define UCP_FORMATS_DEEPSPEED_MOE_MOE_WRITER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "writers/plan.h"
#include "formats/deepspeed_zero/zero_writer.h"

namespace ucp::deepspeed_moe {

// The expert parallel degree the target gets (ZeroWriteOptions::expert_parallel).
absl::StatusOr<int> TargetExpertParallel(const state::ModelInfo& info, const writers::ZeroWriteOptions& options);

absl::StatusOr<std::unique_ptr<writers::Plan>> PlanMoe(const state::ModelState& state, const writers::ZeroWriteOptions& options);

}  // namespace ucp::deepspeed_moe

#endif  // UCP_FORMATS_DEEPSPEED_MOE_MOE_WRITER_H_
