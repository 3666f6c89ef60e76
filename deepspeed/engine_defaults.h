// DeepSpeed's engine state for a model that has none: the DeepSpeedFacet
// (deepspeed/facet.h) of a source that is not DeepSpeed's (a Hugging Face
// or PyTorch DCP folder, a model built in memory), so that DeepSpeed's
// writers can pass it through as they pass a DeepSpeed source's.
//
// What it holds is what a DeepSpeed job of that version saves for the model
// at tp = pp = dp = 1 when nothing else is known (engine.py
// _save_checkpoint, stage_1_and_2.py / bf16_optimizer.py state_dict, torch
// AdamW's param_groups):
//   - OptimizerCommon(): loss_scaler (LossScaler(1.0); fp16: the
//     DynamicLossScaler of DeepSpeed's fp16 defaults), dynamic_loss_scale,
//     overflow, clip_grad, zero_stage (ZeroStageEnum), group_paddings,
//     partition_count, ds_version, then param_groups; BF16_Optimizer:
//     clip_grad, group_paddings, partition_count, ds_version, param_groups;
//   - ModelStatesRoot(): engine.py's keys in its order (module None,
//     buffer_names, optimizer None, param_shapes, frozen_param_shapes,
//     shared_params, frozen_param_fragments, lr_scheduler, data_sampler,
//     random_ltd, sparse_tensor_module_names, skipped_steps, global_steps,
//     global_samples, dp/mp_world_size, checkpoint_parallel_dimensions from
//     0.19.5, ds_config, ds_version), then the client state the caller adds.
// The trees are written and read back once ("baked"), so they are exactly
// what a reader of such a file sees.
//
// Example:
//   std::unique_ptr<DeepSpeedFacet> owned;
//   UCP_ASSIGN_OR_RETURN(const DeepSpeedFacet* ds, FacetOrDefaults(state, "", &owned));
//   state::FileValue root = ds->ModelStatesRoot(0, 0);
#ifndef UCP_DEEPSPEED_ENGINE_DEFAULTS_H_
#define UCP_DEEPSPEED_ENGINE_DEFAULTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "deepspeed/facet.h"
#include "format/pickle/accessors.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"
#include "state/model_state.h"

namespace ucp::deepspeed {

// The newest DeepSpeed release whose layout ucp writes.
inline constexpr char kNewestDsVersion[] = "0.19.5";

struct EngineDefaults {
  std::string ds_version = kNewestDsVersion;  // written in the files
  int64_t global_steps = 0;                   // global_steps (and a fp16 loss scaler's cur_iter)
  int64_t micro_batch = 1;                    // train_micro_batch_size_per_gpu; global_samples = steps * it
  int64_t train_batch_size = 0;               // 0: not in the ds_config
  // How ZeroStageEnum is pickled: ZeroStageEnum(n) (Python >= 3.11.7) or
  // getattr(ZeroStageEnum, name) (3.11.2).
  pickle::EnumEncoding zero_stage_encoding = pickle::EnumEncoding::kCall;
  // Client state after the engine's keys (iteration, args, rng states, ...):
  // adds to `root`, tensors through `writer`. Null: none.
  std::function<absl::Status(torch::TorchWriter& writer, pickle::Value& root)> client_state;
  // Client state `universal_checkpoint_info`: DeclaredMergePatterns(info).
  bool declare_merge_patterns = false;
};

// How each param of `info` merges over tp (its resolved rule), declared as
// Megatron-DeepSpeed declares its own in `universal_checkpoint_info`:
// DeepSpeed's pattern lists, one exact pattern per param whose merge is not
// DeepSpeed's default (cat on dim 0), and `original_vocab_size`. A checkpoint
// written from a source without DeepSpeed's engine state (a Hugging Face
// folder, a DCP checkpoint) then says how it was split, so that ucp and
// DeepSpeed's ds_to_universal merge it back without a preset's guess about
// args it does not record (swiglu's fused gate/up). Null when some param's
// merge has no such pattern (undecided, uneven sub-params, AutoTP widths,
// shape conditions): then nothing is declared, as before.
pickle::ValuePtr DeclaredMergePatterns(const state::ModelInfo& info);

// torch AdamW's param_groups as DeepSpeed's ZeRO optimizers hold them (one
// flat param per group; group 0 weight_decay 0.01, the others 0.0; torch 2's
// `differentiable` and `fused` with `torch2`).
pickle::ValuePtr AdamParamGroups(int num_groups, bool torch2);
pickle::ValuePtr AdamBetas();  // [0.9, 0.95]
// LossScaler(1.0), or for fp16 the DynamicLossScaler of DeepSpeed's fp16
// defaults (initial_scale_power 16, hysteresis 2) after `iterations` steps.
pickle::ValuePtr DefaultLossScaler(bool fp16, int64_t iterations);
// Writes a value tree (its tensors added to `writer`) and reads it back.
absl::StatusOr<state::FileValue> BakeTree(torch::TorchWriter& writer, const pickle::Value& root,
                                          const std::string& stem);

// torch Adam's step before its first step (a 0-d float32 tensor 0), baked:
// the step of a fresh optimizer state (Hugging Face and weights-only DCP
// sources).
absl::StatusOr<state::FileValue> FreshAdamStep();

absl::StatusOr<state::FileValue> DefaultOptimizerCommon(const state::ModelInfo& info, const EngineDefaults& d);
absl::StatusOr<state::FileValue> DefaultModelStatesRoot(const state::ModelInfo& info, const EngineDefaults& d);

// A facet of the two trees above (no files: ModelStatesPath is "").
absl::StatusOr<std::unique_ptr<DeepSpeedFacet>> MakeDefaultFacet(const state::ModelInfo& info,
                                                                 const EngineDefaults& d);

// The facet of `state`, or when it has none one of DeepSpeed's defaults for
// its model (written as `ds_version`, "" = kNewestDsVersion), owned by
// `*owned`, which must outlive its use.
absl::StatusOr<const DeepSpeedFacet*> FacetOrDefaults(const state::CheckpointState& state,
                                                      const std::string& ds_version,
                                                      std::unique_ptr<DeepSpeedFacet>* owned);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_ENGINE_DEFAULTS_H_
