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
#ifndef UCP_WRITERS_UNIVERSAL_WRITER_H_
#define UCP_WRITERS_UNIVERSAL_WRITER_H_

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

namespace ucp::writers {

struct UniversalWriteOptions {
  int num_threads = 0;  // 0 = all cores
  bool overwrite = false;
  // The source checkpoint folder(s) the output must stay apart from, and
  // whether a latest file in the input's root may be repointed (RunOptions).
  std::vector<std::string> inputs;
  bool update_latest = false;
  bool keep_temp_folder = false;  // keep the staging folder on failure
  bool write_latest = true;       // <root>/latest_universal
  ProgressFn progress;  // may be empty
  // The digest of every file in the manifest (sha256 on request).
  DigestKind digest = DigestKind::kXxh3_128;
  // The DeepSpeed version that will load the output ("" = the source's
  // ds_version): a ZeRO-3 source is refused for versions whose stage-3
  // universal loader cannot read it (none before 0.15.0; one param group
  // before 0.18.0, whose loader also fills only the loading job's first
  // sub-group, which ucp cannot see from here).
  std::string target_ds_version;
  std::string source_folder;  // for the manifest
  MergeRules rules;           // for the manifest
  // A plain (non-pipeline) module saved at tp > 1: write one
  // mp_rank_00_model_states.pt (tp rank 0's, mp_world_size 1, no module
  // tensors) instead of copying every tp rank's (false: copies, as
  // ds_to_universal.py makes). DeepSpeed's checkpoint loader
  // (state_dict_factory.py, 0.12 to 0.19.5) merges several mp_rank files for
  // a job of smaller tp by Megatron's key names and asserts they exist, so
  // the copies load only at the source's tp or larger; the one file loads at
  // any tp. The other tp ranks' client state (rng states) is not kept.
  bool single_mp_rank_file = true;
};

// A plain (non-pipeline, ZeRO-1/2) module saved at tp > 1: the source whose
// universal folder UniversalWriteOptions::single_mp_rank_file concerns.
bool PlainModuleAtTpAboveOne(const state::ModelInfo& info);

// The DeepSpeed version that will load the universal folder:
// --target_ds_version, else the source's ds_version.
std::string UniversalLoaderVersion(const state::CheckpointState& state, const UniversalWriteOptions& options);

// The plan of the universal checkpoint of `state` (which must outlive it).
absl::StatusOr<std::unique_ptr<Plan>> PlanUniversal(const state::ModelState& state,
                                                    const UniversalWriteOptions& options);

// The RunOptions the write options imply.
RunOptions UniversalRunOptions(const UniversalWriteOptions& options);

// PlanUniversal, then RunPlan in this process.
absl::StatusOr<WriteStats> WriteUniversal(const state::ModelState& state, const std::string& output_folder,
                                          const UniversalWriteOptions& options);

}  // namespace ucp::writers

#endif  // UCP_WRITERS_UNIVERSAL_WRITER_H_
