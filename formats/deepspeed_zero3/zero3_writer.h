// Writes a ModelState as a DeepSpeed ZeRO stage 3 checkpoint at a target dp,
// what DeepSpeed 0.12 to 0.19.5 save (stage3.py _rigid_state_dict, engine.py
// _save_zero_checkpoint / _save_checkpoint), so that a plain
// `load_checkpoint` of the target job loads it:
//
//   ROOT/TAG/zero_pp_rank_D_mp_rank_00_model_states.pt   per dp rank: `module` with every
//        param an empty tensor of the lp dtype (buffers whole), param_shapes per sub-group
//        at the target dp, frozen_param_shapes (module order) and frozen_param_fragments
//        (rank D's ceil(numel / dp) partition of each frozen param, zero padded, its lp
//        dtype), shared_params on rank 0 only ({} elsewhere), dp_world_size, the rest
//        carried over from the source
//   ROOT/TAG/[bf16_]zero_pp_rank_D_mp_rank_00_optim_states.pt   per dp rank:
//        {zero_stage: 3, loss_scaler, dynamic_loss_scale, overflow, partition_count: dp,
//         optimizer_state_dict: {state: {sub_group: {step, <states>}}, param_groups (params =
//         the group's sub-group ids)}, fp32_flat_groups (one per sub-group, with `ds_id`)}
//   ROOT/latest                                         TAG, written last
//
// Sub-groups are cut from each param group at the target dp by
// `sub_group_size` (deepspeed/layout_math.h, Zero3SubGroups); every
// sub-group's `step` is a tensor of its own (DeepSpeed 0.18-0.19.5's
// universal load shares one across sub-groups, and Adam then counts it once
// per sub-group), and every group keeps its own hyper-parameters.
//
// At tp > 1 (pp = 1) every tp rank T gets the same files named mp_rank_TT,
// each a ZeRO-3 checkpoint of its tp slices (cut as the ZeRO-1/2 writer cuts
// them: deepspeed_zero::PlanTarget / TargetSlice, Megatron's split or AutoTP's
// widths), its sub-groups cut over its slice sizes, mp_world_size and
// checkpoint_parallel_dimensions' tp_degree tp, rank T's model states of the
// source carried over.
#ifndef UCP_FORMATS_DEEPSPEED_ZERO3_ZERO3_WRITER_H_
#define UCP_FORMATS_DEEPSPEED_ZERO3_ZERO3_WRITER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "writers/plan.h"
#include "formats/deepspeed_zero/zero_writer.h"

namespace ucp::deepspeed_zero3 {

// The plan of the ZeRO-3 checkpoint of `state` at options.target (tp = pp = 1),
// with options.sub_group_size (0: the source's ds_config, else DeepSpeed's
// default 1e9). `state` must outlive it.
// `summary` (may be null) gets the target's topology, stage and notes.
absl::StatusOr<std::unique_ptr<writers::Plan>> PlanZero3(const state::ModelState& state, const writers::ZeroWriteOptions& options,
                                                        writers::TargetSummary* summary = nullptr);

}  // namespace ucp::deepspeed_zero3

#endif  // UCP_FORMATS_DEEPSPEED_ZERO3_ZERO3_WRITER_H_
