// The ZeRO stage 0 target: what DeepSpeed without ZeRO loads, from any model
// state: one mp_rank_XX_model_states.pt per tp rank (plain modules: pp = 1;
// tp slices as the ZeRO writer cuts them) holding the module's lp
// weights and the optimizer's own state_dict in the layout the target job's
// precision makes DeepSpeed use (zero0_state.h):
//   fp32 model    the torch optimizer's state_dict: state {i: {step,
//                 exp_avg, ...}} with one step tensor per param, param_groups
//                 with the source's hyper-parameters and `params` = indices;
//   bf16 / fp16   FP16_UnfusedOptimizer's: dynamic_loss_scale, cur_scale,
//                 cur_iter (= global_steps) [, last_overflow_iter,
//                 scale_factor, scale_window], optimizer_state_dict (as
//                 above), fp32_groups (the masters per group).
// The optimizer indices number the trainable params group by group in the
// state's order (ModelInfo::params), which is the module order of each group
// for every source ucp reads: a client that builds its groups from the
// module's params in module order (DeepSpeed's default, the Hugging Face
// Trainer) loads them as saved. `dp_world_size` is the target dp (a stage 0
// checkpoint loads at any dp); ds_config's zero_optimization.stage is 0.
#ifndef UCP_FORMATS_DEEPSPEED_ZERO0_ZERO0_WRITER_H_
#define UCP_FORMATS_DEEPSPEED_ZERO0_ZERO0_WRITER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "writers/plan.h"
#include "writers/target_options.h"

namespace ucp::deepspeed_zero0 {

// `summary` (may be null) gets the target's topology, stage and notes.
absl::StatusOr<std::unique_ptr<writers::Plan>> PlanZero0(const state::ModelState& state,
                                                         const writers::ZeroWriteOptions& options,
                                                         writers::TargetSummary* summary = nullptr);

}  // namespace ucp::deepspeed_zero0

#endif  // UCP_FORMATS_DEEPSPEED_ZERO0_ZERO0_WRITER_H_
