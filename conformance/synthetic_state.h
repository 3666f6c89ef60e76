// SyntheticModelState: a made-up model's full training state, built from a
// ModelSpec (proto/ucp.proto) and a seed, that the ZeRO writer
// (formats/deepspeed_zero/zero_writer.h) saves at any topology exactly as DeepSpeed 0.14.4
// would have: save(M, T) = deepspeed_zero::WriteZeroCheckpoint(SyntheticModelState(M), T).
// The conformance properties compare everything ucp reads back with it.
//
// What it holds, all in memory:
//   - per trainable param: fp32 master, exp_avg, exp_avg_sq (full tensors,
//     distinct and deterministic from the seed; exp_avg_sq >= 0). No lp
//     weight: the writer casts the fp32 master, as DeepSpeed's optimizers
//     keep the module weights.
//   - per frozen param and buffer: its lp tensor in the spec's lp dtype.
//   - per tied alias of a plain module (role "tied", tied_key = the owner's
//     name, as Hugging Face's tie_word_embeddings makes lm_head.weight):
//     nothing of its own; its lp weight is the owner's, and the model
//     states' shared_params map it to the owner.
//   - per optimizer group: `step`, a 0-dim float32 tensor (as torch AdamW).
//   - OptimizerCommon(): what DeepSpeed 0.14.4's optimizer state_dict holds
//     besides the partitions (stage_1_and_2.py / bf16_optimizer.py state_dict:
//     loss_scaler (LossScaler, or DynamicLossScaler for fp16),
//     dynamic_loss_scale, overflow, clip_grad, zero_stage (ZeroStageEnum),
//     group_paddings, partition_count, ds_version; bf16: clip_grad,
//     group_paddings, partition_count, ds_version), plus torch AdamW's
//     param_groups.
//   - ModelStatesRoot(): an mp_rank_*_model_states.pt dict with
//     engine.py:_save_checkpoint's keys in its order, then the client state of
//     a Megatron/NeoX job (iteration, args, rng states,
//     universal_checkpoint_info).
// Value trees are written and read back through the torch file writer/reader
// once ("baked"), so they are exactly what a reader of a saved file sees.
// Vocabulary params are held at their unpadded size; the spec records the
// original vocab size and make_vocab_size_divisible_by.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto m, SyntheticModelState::Make(spec, /*seed=*/7, /*zero_stage=*/1,
//                                                          state::OptimizerKind::kZero));
//   UCP_RETURN_IF_ERROR(SaveZero(*m, "/tmp/ckpt/global_step7", {2, 1, 4}).status());
#ifndef UCP_CONFORMANCE_SYNTHETIC_STATE_H_
#define UCP_CONFORMANCE_SYNTHETIC_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/facet.h"
#include "state/model_state.h"
#include "state/topology.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"
#include "format/pickle/value.h"
#include "rules/presets.h"
#include "ops/training_state.h"
#include "writers/target_options.h"
#include "proto/ucp.pb.h"

namespace ucp::conformance {

// The num_attention_heads a spec's args record: spec.num_attention_heads(),
// else the gcd of the sizes of its tp-partitioned dims (each sub-param's for
// fused ones; vocab rows are padded, so not counted), else 64.
int64_t SpecAttentionHeads(const ModelSpec& spec);

// The pieces a synthetic state is made of, for the other generators
// (moe_gen.h): the same values, scalars and DeepSpeed objects.
namespace synthetic {
// The full tensor of state "fp32", "exp_avg", "exp_avg_sq" or "lp" (float32)
// of `p`: deterministic from the seed and the name, exact in every float type.
absl::StatusOr<torch::Tensor> Values(const ModelParam& p, uint64_t seed, const std::string& state);
// A 0-dim float32 tensor (torch AdamW's step).
torch::Tensor Scalar(float v);
// Writes a value tree (its tensors added to `w`) and reads it back.
absl::StatusOr<state::FileValue> BakeTree(torch::TorchWriter& w, const pickle::Value& root,
                                              const std::string& stem);
// DeepSpeed 0.14.4+'s LossScaler(1.0), or for fp16 the DynamicLossScaler of
// its fp16 config (initial_scale_power 16, hysteresis 2).
pickle::ValuePtr LossScaler(bool fp16, int64_t iterations);
pickle::ValuePtr AdamBetas();  // [0.9, 0.95]
}  // namespace synthetic

// Checks that a spec describes a model the writer can save at tp=1: shapes
// agree with rules, groups are dense, layers and tied params are consistent.
absl::Status ValidateModelSpec(const ModelSpec& spec);

// "zero" / "bf16" (GoldenCase.optimizer_layout).
absl::StatusOr<state::OptimizerKind> ParseOptimizerLayout(const std::string& name);

// The ModelInfo a SyntheticModelState of `spec` has (no tensors made), e.g.
// to plan where its params go at a topology (deepspeed_zero::PlanTarget).
absl::StatusOr<state::ModelInfo> ModelInfoFromSpec(const ModelSpec& spec, int zero_stage,
                                                       state::OptimizerKind kind);

// The ZeRO stage (0-3) save(M, T1) is written at (GoldenCase
// source_zero_stage, else zero_stage), the one save(M, T2) and the reshards
// to T2 are written at (target_zero_stage, else the source's), and the stage
// of the synthetic model's own ModelInfo (1 or 2, what ModelInfoFromSpec
// accepts: the source's when it is 1 or 2, else 1 for the bf16 optimizer and
// 2 otherwise).
int SourceZeroStage(const GoldenCase& c);
int TargetZeroStage(const GoldenCase& c);
int ModelZeroStage(const GoldenCase& c);

// The DeepSpeed release (and the job's environment) a synthetic source is
// saved as. What differs between 0.12 and 0.19.5 in a ZeRO 1/2 checkpoint
// (DeepSpeed's source at each tag):
//   - ds_version in every file;
//   - group_paddings: the last rank's only up to 0.16.3, every rank its own
//     from 0.16.4 (BF16_Optimizer: the last rank's in every version). The
//     synthetic source is dp=1, where both agree; the writer applies the
//     convention at the target dp;
//   - checkpoint_parallel_dimensions {'pp_degree', 'tp_degree'} after
//     mp_world_size (engine.py:_checkpoint_parallel_metadata, 0.19.5 only);
//   - torch 2's optimizer param_groups keys (differentiable, fused), as the
//     torch 2.x that 0.15 and later run with adds them.
// And of the environment, any version: numpy 2 pickles the RNG state's
// ndarray from numpy._core (`numpy2`); the zero_stage enum is pickled as
// ZeroStageEnum(n) or getattr(ZeroStageEnum, name) by the Python version (by
// the seed's parity, as before).
struct SyntheticVersion {
  std::string ds_version = "0.14.4";
  bool numpy2 = false;
  // The zero_stage enum pickled as ZeroStageEnum(n) whatever the seed: for
  // a source that records no ZeroStageEnum (ZeRO-0: the torch optimizer's
  // own state), from which ucp cannot tell the Python and writes that form.
  bool zero_stage_call = false;
};

class SyntheticModelState : public state::ModelState, public deepspeed::DeepSpeedFacet {
 public:
  static absl::StatusOr<std::unique_ptr<SyntheticModelState>> Make(const ModelSpec& spec, uint64_t seed,
                                                                   int zero_stage, state::OptimizerKind kind,
                                                                   const SyntheticVersion& version = {});
  // The same from a case (its model, seed, zero stage and optimizer layout).
  static absl::StatusOr<std::unique_ptr<SyntheticModelState>> FromCase(const GoldenCase& c);

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<tp::TensorPlan> Full(const state::ParamState& param, const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  const state::Facet* GetFacet(state::FacetKey key) const override { return deepspeed::OfferFacet(this, key); }
  // DeepSpeedFacet: DeepSpeed's defaults for the model
  // (deepspeed/engine_defaults.h) with a GPT-NeoX job's client state.
  absl::StatusOr<state::FileValue> OptimizerCommon() const override;
  state::FileValue ModelStatesRoot(int pp, int tp) const override;
  // "": there is no file; writers serialize ModelStatesRoot().
  std::string ModelStatesPath(int pp, int tp) const override { return ""; }

  const ModelSpec& spec() const { return spec_; }
  uint64_t seed() const { return seed_; }
  // The full tensor of a param for "fp32", "exp_avg", "exp_avg_sq" (trainable)
  // or "lp" (frozen params and buffers); kNotFound otherwise.
  absl::StatusOr<torch::Tensor> Tensor(const std::string& name, const std::string& state) const;
  // The step of a group (also what GroupScalar returns), as a float.
  double Step(int group) const { return steps_[group]; }

 private:
  SyntheticModelState() = default;
  absl::Status Build();
  absl::Status AddClientState(torch::TorchWriter& w, pickle::Value& root) const;

  ModelSpec spec_;
  uint64_t seed_ = 0;
  SyntheticVersion version_;
  state::ModelInfo info_;
  // name -> state -> tensor
  std::map<std::string, std::map<std::string, torch::Tensor>> tensors_;
  std::vector<double> steps_;
  state::FileValue steps_value_;  // a list, one 0-dim tensor per group
  state::FileValue common_;
  state::FileValue root_;
};

// The class names of a model's pipeline layers: those of the preset its
// names follow (rules::DetectPreset; GPT-NeoX's when none), as ucp reshard
// names them.
rules::LayerTypeNamer ModelLayerTypeNamer(const state::ModelInfo& info);

// save(M, T): the writer the resharder uses, into `folder` (ROOT/TAG; ROOT/latest
// is written too).
absl::StatusOr<ops::WrittenCheckpoint> SaveZero(const state::ModelState& state, const std::string& folder,
                                                 const state::Topology& topology, int num_threads = 1);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_SYNTHETIC_STATE_H_
