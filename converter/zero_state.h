// ZeroModelState: the full model state of a ZeRO checkpoint folder, with each
// param's tp slices merged by its rule (rules.h), lazily.
//
// Making one resolves every param's rule and checks, before anything is
// written, what the rules assume of the data:
//   - a REPLICATED param's tp copies are bitwise equal in fp32 and every
//     optimizer state (else an error naming the param and the largest
//     difference, unless ReplicatedMismatch says otherwise);
//   - a param tied across pipeline stages is bitwise equal in every stage;
//   - params no source decides are settled by evidence or listed, all at
//     once, in one error.
// Then `Full(param, state)` is a TensorPlan over the optimizer files' bytes
// (merge_tp_slices of ds_to_universal.py, without temp files).
#ifndef UCP_CONVERTER_ZERO_STATE_H_
#define UCP_CONVERTER_ZERO_STATE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "converter/rules.h"
#include "deepspeed/model_state.h"
#include "deepspeed/zero_checkpoint.h"

namespace ucp::converter {

enum class ReplicatedMismatch { kError, kAverage, kFirst };

struct ZeroStateOptions {
  RuleResolver::Options rules;
  ReplicatedMismatch replicated_mismatch = ReplicatedMismatch::kError;
  int num_threads = 0;  // 0 = all cores
  int64_t make_vocab_size_divisible_by = 0;  // 0 = from the checkpoint's args
  // Pipeline layers that use each tied module (--tied_layers=KEY:L1,L2;...).
  // Layers with files are known from the checkpoint; a TiedLayerSpec with a
  // forward_fn (Megatron-DeepSpeed's and GPT-NeoX's tied output head) leaves
  // no file, so without this ucp assumes it is the last layer spec.
  std::map<std::string, std::vector<int>> tied_layers;
};

class ZeroModelState : public deepspeed::ModelState {
 public:
  static absl::StatusOr<std::unique_ptr<ZeroModelState>> Make(std::shared_ptr<const deepspeed::ZeroCheckpoint> ckpt,
                                                              const ZeroStateOptions& options);

  const deepspeed::ModelInfo& info() const override { return info_; }
  absl::StatusOr<tp::TensorPlan> Full(const deepspeed::ParamState& param, const std::string& state) const override;
  absl::StatusOr<deepspeed::FileValue> GroupScalar(int group, const std::string& key) const override;
  absl::StatusOr<deepspeed::FileValue> OptimizerCommon() const override;
  deepspeed::FileValue ModelStatesRoot(int pp, int tp) const override;
  std::string ModelStatesPath(int pp, int tp) const override;

  const deepspeed::ZeroCheckpoint& checkpoint() const { return *ckpt_; }
  const RuleResolver& resolver() const { return resolver_; }
  // The tp slices of `param` for `state` in source stage `stage`, before merging.
  absl::StatusOr<std::vector<tp::TensorPlan>> Slices(const deepspeed::ParamState& param, int stage,
                                                     const std::string& state) const;

 private:
  ZeroModelState() = default;
  absl::Status Resolve(const ZeroStateOptions& options);
  absl::Status PlaceTiedModules(const ZeroStateOptions& options, int max_layer);

  std::shared_ptr<const deepspeed::ZeroCheckpoint> ckpt_;
  RuleResolver resolver_;
  deepspeed::ModelInfo info_;
  // Per param in info_.params: the ZeroParam (trainable) or module entry index.
  std::vector<const deepspeed::ZeroParam*> zero_params_;
  std::vector<int> module_entry_;
};

}  // namespace ucp::converter

#endif  // UCP_CONVERTER_ZERO_STATE_H_
