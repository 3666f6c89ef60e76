// UniversalModelState: the ModelState of a universal checkpoint folder.
// Tensors are zero-copy views of the `zero/<param>/<state>.pt` files; rules come from the ucp manifest or the files' metadata
// (universal_checkpoint.h); the module layout (layer files, key order, tied
// layers) from the manifest, or, for a folder written by DeepSpeed, from the
// param names alone (then every layer index up to the last one gets a file).
//
// A folder written by DeepSpeed's ds_to_universal.py without patterns holds
// every param concatenated on dim 0 (the bug ucp exists for): this reader
// reports those params as COLUMN, as their metadata says;
// rules::ReinterpretDeepSpeedUniversal re-merges them when a rule source or
// the evidence knows better.
#ifndef UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_STATE_H_
#define UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_STATE_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "deepspeed/facet.h"
#include "state/model_state.h"
#include "formats/deepspeed_universal/universal_checkpoint.h"

namespace ucp::deepspeed_universal {

class UniversalModelState : public state::ModelState, public deepspeed::DeepSpeedFacet {
 public:
  static absl::StatusOr<std::unique_ptr<UniversalModelState>> Make(std::shared_ptr<const UniversalCheckpoint> ckpt);

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<tp::TensorPlan> Full(const state::ParamState& param, const std::string& state) const override;
  // A trainable param's optimizer state (float32, its full shape): the
  // state file and the param's step.pt are opened on the first read.
  std::optional<tp::TensorPlan> FullDeferred(const state::ParamState& param,
                                             const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  std::vector<state::InputRange> Inputs(const state::ParamState& param) const override;
  std::vector<state::InputRange> StateInputs(const state::ParamState& param,
                                                 const std::string& state) const override;
  // Every input Inputs() lists is a whole file (a param's state file, its
  // step.pt) that reading the param reads whole.
  std::optional<state::FileExtent> ExtentOf(const state::InputRange& range) const override {
    if (!range.tensor.empty()) return std::nullopt;
    return state::FileExtent{range.path, 0, -1};
  }
  void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const override {
    ckpt_->SetCheckedInputs(std::move(keys));
  }
  const state::Facet* GetFacet(state::FacetKey key) const override { return deepspeed::OfferFacet(this, key); }
  // DeepSpeedFacet.
  absl::StatusOr<state::FileValue> OptimizerCommon() const override;
  state::FileValue ModelStatesRoot(int pp, int tp) const override;
  std::string ModelStatesPath(int pp, int tp) const override;

  const UniversalCheckpoint& checkpoint() const { return *ckpt_; }
  // True when the layout came from a ucp manifest (else it was inferred).
  bool layout_recorded() const { return ckpt_->manifest().has_value(); }

 private:
  UniversalModelState() = default;
  absl::Status Build();

  // zero/<name>/<state>.pt in the folder.
  std::string StatePath(const std::string& name, const std::string& state) const;
  // `param`'s step.pt holds the step of its group's first param (checked
  // once per param, when one of its states is read: every rank checks the
  // params it reads, none opens every step.pt).
  absl::Status CheckStep(const state::ParamState& param) const;

  std::shared_ptr<const UniversalCheckpoint> ckpt_;
  state::ModelInfo info_;
  std::vector<std::string> first_param_of_group_;
  mutable std::mutex steps_mu_;
  mutable std::map<std::string, absl::Status> steps_checked_;  // by param name; guarded by steps_mu_
  mutable std::map<int, absl::StatusOr<std::string>> group_steps_;  // the first param's; guarded by steps_mu_
};

}  // namespace ucp::deepspeed_universal

#endif  // UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_STATE_H_
