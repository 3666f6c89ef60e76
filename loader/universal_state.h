// UniversalModelState: the ModelState of a universal checkpoint folder, for
// the loader. Tensors are zero-copy views of the `zero/<param>/<state>.pt`
// files; rules come from the ucp manifest or the files' metadata
// (universal_checkpoint.h); the module layout (layer files, key order, tied
// layers) from the manifest, or, for a folder written by DeepSpeed, from the
// param names alone (then every layer index up to the last one gets a file).
//
// A folder written by DeepSpeed's ds_to_universal.py without patterns holds
// every param concatenated on dim 0 (the bug ucp exists for). When a rule
// source (--rules, the checkpoint's patterns, a preset) knows better, or the
// tp copies inside such a tensor are bitwise equal (a replicated param stored
// tp times), the stored tensor is read back as DeepSpeed's concatenation of
// the source's tp slices and re-merged by the right rule: DeepSpeed's broken
// output reshards correctly, bitwise.
#ifndef UCP_LOADER_UNIVERSAL_STATE_H_
#define UCP_LOADER_UNIVERSAL_STATE_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "converter/rules.h"
#include "deepspeed/model_state.h"
#include "deepspeed/universal_checkpoint.h"

namespace ucp::loader {

class UniversalModelState : public deepspeed::ModelState {
 public:
  struct Options {
    // Rule sources for folders written by DeepSpeed (ignored when a ucp
    // manifest records the rules).
    converter::RuleResolver::Options rules;
  };
  static absl::StatusOr<std::unique_ptr<UniversalModelState>> Make(
      std::shared_ptr<const deepspeed::UniversalCheckpoint> ckpt, const Options& options);

  const deepspeed::ModelInfo& info() const override { return info_; }
  absl::StatusOr<tp::TensorPlan> Full(const deepspeed::ParamState& param, const std::string& state) const override;
  absl::StatusOr<deepspeed::FileValue> GroupScalar(int group, const std::string& key) const override;
  absl::StatusOr<deepspeed::FileValue> OptimizerCommon() const override;
  deepspeed::FileValue ModelStatesRoot(int pp, int tp) const override;
  std::string ModelStatesPath(int pp, int tp) const override;

  const deepspeed::UniversalCheckpoint& checkpoint() const { return *ckpt_; }
  // True when the layout came from a ucp manifest (else it was inferred).
  bool layout_recorded() const { return ckpt_->manifest().has_value(); }

 private:
  UniversalModelState() = default;
  absl::Status Build(const Options& options);
  absl::Status Reinterpret(const Options& options);

  std::shared_ptr<const deepspeed::UniversalCheckpoint> ckpt_;
  deepspeed::ModelInfo info_;
  std::vector<std::string> first_param_of_group_;
  // Per param: the rule its stored tensor was merged with, when it differs
  // from the rule it is re-merged by (DeepSpeed's pattern-less cat on dim 0).
  std::vector<std::optional<MergeRule>> stored_rule_;
};

}  // namespace ucp::loader

#endif  // UCP_LOADER_UNIVERSAL_STATE_H_
