// ZeroSlicedState: a ZeRO checkpoint folder as a SlicedState
// (deepspeed/model_state.h): every tensor of the model with its shape on each
// tp rank, and its tp slices as TensorPlans over the optimizer files' flat
// partitions (fp32 masters and optimizer states) or the layer / module files
// (lp weights, frozen params, buffers). How the slices merge is the rules'
// business (rules/resolve.h); this reader knows only what the files say.
//
// Params are listed in the global flatten order of each optimizer group
// (groups in order, pipeline stages in order within a group), then frozen
// params and buffers in module order. A module tied across pipeline stages
// (`tied_modules.<key>.*`) is listed once with every layer that holds it; a
// tied head without a file of its own (a TiedLayerSpec with a forward_fn) is
// assumed to be the last layer spec unless ZeroReadOptions::tied_layers says
// otherwise, with a note.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto ckpt, ZeroCheckpoint::Open("/ckpt/global_step4"));
//   UCP_ASSIGN_OR_RETURN(auto sliced, ZeroSlicedState::Make(std::move(ckpt), {}));
//   UCP_ASSIGN_OR_RETURN(auto slices, sliced->Slices(sliced->info().params[0], 0, "fp32"));
#ifndef UCP_FORMATS_DEEPSPEED_ZERO_ZERO_STATE_H_
#define UCP_FORMATS_DEEPSPEED_ZERO_ZERO_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/facet.h"
#include "state/model_state.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"

namespace ucp::deepspeed_zero {

struct ZeroReadOptions {
  int64_t make_vocab_size_divisible_by = 0;  // 0 = from the checkpoint's args
  // Pipeline layers that use each tied module (--tied_layers=KEY:L1,L2;...).
  // Layers with files are known from the checkpoint; a TiedLayerSpec with a
  // forward_fn (Megatron-DeepSpeed's and GPT-NeoX's tied output head) leaves
  // no file, so without this ucp assumes it is the last layer spec.
  std::map<std::string, std::vector<int>> tied_layers;
};

class ZeroSlicedState : public state::SlicedState, public deepspeed::DeepSpeedFacet {
 public:
  static absl::StatusOr<std::unique_ptr<ZeroSlicedState>> Make(std::shared_ptr<const ZeroCheckpoint> ckpt,
                                                               const ZeroReadOptions& options);

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<std::vector<tp::TensorPlan>> Slices(const state::ParamState& param, int stage,
                                                     const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  std::vector<state::InputRange> Inputs(const state::ParamState& param) const override;
  // An optimizer param's fp32 or one optimizer state: the ranges of that
  // flat partition alone; anything else: Inputs(param).
  std::vector<state::InputRange> StateInputs(const state::ParamState& param, const std::string& state) const override;
  std::vector<std::string> InputFiles() const override;
  std::optional<state::FileExtent> ExtentOf(const state::InputRange& range) const override {
    return ckpt_->OpenedExtent(range);
  }
  absl::Status VerifyInput(const std::string& path) const override { return ckpt_->VerifyFile(path); }
  void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const override {
    ckpt_->SetCheckedInputs(std::move(keys));
  }
  const state::Facet* GetFacet(state::FacetKey key) const override { return deepspeed::OfferFacet(this, key); }
  // DeepSpeedFacet.
  absl::StatusOr<state::FileValue> OptimizerCommon() const override;
  state::FileValue ModelStatesRoot(int pp, int tp) const override;
  std::string ModelStatesPath(int pp, int tp) const override;
  const pickle::Value& checkpoint_info() const override { return ckpt_->universal_checkpoint_info(); }
  const pickle::Value* args() const override { return ckpt_->args(); }
  const std::string& dir() const override { return ckpt_->dir(); }

  const ZeroCheckpoint& checkpoint() const { return *ckpt_; }

 private:
  ZeroSlicedState() = default;
  absl::Status Build(const ZeroReadOptions& options);
  absl::Status PlaceTiedModules(const ZeroReadOptions& options, int max_layer);

  std::shared_ptr<const ZeroCheckpoint> ckpt_;
  state::ModelInfo info_;
  // Per param in info_.params: the ZeroParam (trainable) or module entry index.
  std::vector<const deepspeed::ZeroParam*> zero_params_;
  std::vector<int> module_entry_;
};

}  // namespace ucp::deepspeed_zero

#endif  // UCP_FORMATS_DEEPSPEED_ZERO_ZERO_STATE_H_
