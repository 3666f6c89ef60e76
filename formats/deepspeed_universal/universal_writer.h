// Writes a ModelState as DeepSpeed's universal checkpoint, exactly the layout
// deepspeed/checkpoint/ds_to_universal.py writes and
// universal_checkpoint.py:load_hp_checkpoint_state reads:
//
//   <output>/mp_rank_XX_model_states.pt      byte-identical copies of the source's
//   <output>/zero/optimizer_state.pt         optimizer state minus the sharded parts, + param_groups
//   <output>/zero/<param>/fp32.pt            {['cat_dim'], ['vocab_tensor'], ['param_n_sub_params'],
//   <output>/zero/<param>/exp_avg.pt          ['sub_param_shape'], 'param': full tensor}
//   <output>/zero/<param>/exp_avg_sq.pt       (keys in DeepSpeed's order, per merge kind)
//   <output>/zero/<param>/step.pt            the group's step (a 0-dim tensor or a number)
//   <root>/latest_universal                  the output folder's name, written last
// and for a ZeRO-3 source, as ds_to_universal.py writes it for stage 3:
//   <output>/zero_pp_rank_D_mp_rank_00_model_states.pt   byte-identical copies
//   <output>/zero/optimizer_state.pt         rank 0's optimizer_state_dict + param_groups
//   <output>/zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt   raw flat tensors (no step.pt)
// and for a ZeRO-3 source saved at tp > 1 (AutoTP, Megatron-style modules), as
// ds_to_universal.py 0.19.5 and later write it (stage-3 loaders of 0.19.5 on):
//   <output>/zero_pp_rank_D_mp_rank_00_model_states.pt   mp rank 0's, mp_world_size 1, tp_degree 1
//                                            (single_mp_rank_file; else every mp rank's copied)
//   <output>/zero/optimizer_state.pt         mp rank 0's, as above
//   <output>/zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt   the stage 1/2 dict: the state merged
//                                            over tp, its merge keys (no step.pt)
// plus ucp's own additions, which stock DeepSpeed ignores:
//   <output>/ucp_module/<name>.pt            frozen params and buffers (full lp tensors)
//   <output>/ucp_manifest.textproto          source topology, each param's rule and its
//                                            source, sha256 of every file
//
// A plan (plan.h) whose units are: one per param (its state files, or its
// ucp_module file), one for zero/optimizer_state.pt, one per mp_rank file.
// Finish writes the manifest from every unit's file digests. The output is
// written into a staging folder beside the target and renamed into place
// when complete; `latest_universal` follows.
#ifndef UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_WRITER_H_
#define UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/digest.h"
#include "state/model_state.h"
#include "format/pickle/value.h"
#include "proto/ucp.pb.h"
#include "tp/tensor_plan.h"
#include "writers/plan.h"
#include "writers/target_options.h"

namespace ucp::deepspeed_universal {


// A plain (non-pipeline, ZeRO-1/2) module saved at tp > 1: the source whose
// universal folder UniversalWriteOptions::single_mp_rank_file concerns.
bool PlainModuleAtTpAboveOne(const state::ModelInfo& info);

// The DeepSpeed version that will load the universal folder:
// --target_ds_version, else the source's ds_version.
std::string UniversalLoaderVersion(const state::CheckpointState& state, const writers::UniversalWriteOptions& options);

// The plan of the universal checkpoint of `state` (which must outlive it).
absl::StatusOr<std::unique_ptr<writers::Plan>> PlanUniversal(const state::ModelState& state,
                                                    const writers::UniversalWriteOptions& options);

// The RunOptions the write options imply.

// PlanUniversal, then RunPlan in this process.
absl::StatusOr<writers::WriteStats> WriteUniversal(const state::ModelState& state, const std::string& output_folder,
                                          const writers::UniversalWriteOptions& options);

}  // namespace ucp::deepspeed_universal

#endif  // UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_WRITER_H_
