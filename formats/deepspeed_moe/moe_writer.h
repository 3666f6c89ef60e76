// Writes a native mixture-of-experts ModelState (formats/deepspeed_moe/moe_state.h) as the
// DeepSpeed ZeRO 1/2 checkpoint of a job at another tp, pp, dp and expert
// parallel degree, what that job saves (engine.py
// _save_moe_checkpoint, stage_1_and_2.py state_dict), so that its plain
// load_checkpoint loads it. At tp = 1:
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
// At tp > 1 (ep >= tp: the placement DeepSpeed 0.14.4 to 0.19.5 write,
// realds/README.md "Native MoE at tp > 1", in the target version's files:
// before 0.14.5 the expert groups' mappings of a window, before 0.19.3 no
// param_shapes, before 0.19.5 expp_rank_E_mp_rank_{E % tp} placeholders and
// no checkpoint_parallel_dimensions), global rank r = dp rank x tp + tp
// rank is ep rank r % ep and expert data parallel rank r / ep:
//   mp_rank_TT_model_states.pt     per tp rank T (written by global rank T):
//        its tp slices of the non-expert tensors, cut by their rules as the
//        ZeRO writer cuts them; param_shapes with those slice shapes (0.19.3+);
//        mp_world_size tp, checkpoint_parallel_dimensions tp_degree tp (0.19.5+)
//   layer_L_expert_E_mp_rank_TT    expert E whole, under the mp_rank of its
//        ep rank e (written by global rank e): TT = e % tp
//   zero_pp_rank_D_mp_rank_TT      global rank D x tp + T: the non-expert
//        groups' partition D of tp rank T's slices over dp (partition_count
//        dp), the expert groups' partition r / ep of ep rank r % ep's experts
//        over the ep-strided expert data parallel group (partition_count tp x dp / ep)
//
// At pp > 1 (a PipelineModule's checkpoint: every name '<layer>.<name>'),
// the layers are cut into stages as PipelineModule._partition_layers cuts
// them (--partition_method, else "parameters": a layer weighs the trainable
// numel one rank builds, its tp slices and num_experts / ep local experts),
// and each stage is written as the pp 1 save above of its own layers over
// its own tp x dp ranks, under mp rank stage x tp + tp rank (the pipeline
// grid's model parallel rank; realds/README.md "Native MoE at pp > 1"):
// the stage's module, param_shapes and num_experts, mp_world_size pp x tp,
// checkpoint_parallel_dimensions {pp, tp}; its expert files numbered from
// layer 0 (layer_L_expert_E_mp_rank_{stage x tp + e % tp}); its optimizer
// files zero_pp_rank_D_mp_rank_{stage x tp + T} with the stage's groups;
// the module's _metadata the stage's layers'. A stage without a MoE layer
// (DeepSpeed hangs) or without params of some group is refused.
//
// ep < tp (tp ranks >= ep would have no model states; DeepSpeed cannot load
// such a save) and pp > 1 for a module that is not a PipelineModule are
// refused.
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

// The expert parallel degree the target gets: ZeroWriteOptions::expert_parallel
// (refused unless it divides tp x dp and every layer's expert count, and is
// >= tp), else the source's if it fits, else the largest that fits below it,
// else (tp > 1) the smallest that fits from tp up.
absl::StatusOr<int> TargetExpertParallel(const state::ModelInfo& info, const writers::ZeroWriteOptions& options);

// `summary` (may be null) gets the target's topology, ZeRO stage and, at
// pp > 1, its partition method and stage boundaries.
absl::StatusOr<std::unique_ptr<writers::Plan>> PlanMoe(const state::ModelState& state,
                                                       const writers::ZeroWriteOptions& options,
                                                       writers::TargetSummary* summary = nullptr);

}  // namespace ucp::deepspeed_moe

#endif  // UCP_FORMATS_DEEPSPEED_MOE_MOE_WRITER_H_
