// DcpState: a PyTorch Distributed Checkpoint folder (torch.distributed.checkpoint
// FileSystemWriter: `.metadata` + `__R_n.distcp`; FSDP2, torchtitan, ucp's
// own `convert --to=dcp`) holding a model and its torch Adam(W) optimizer
// state, as a SlicedState at tp = pp = 1: every tensor whole, assembled from
// the chunks its saving ranks held (any dims, uneven, empty ones), nothing
// read until a writer copies the bytes.
//
// Which keys are what is read from the keys themselves, as torch names them
// (get_model_state_dict / get_optimizer_state_dict, flattened by dcp.save):
//   <M><fqn>                           the module's tensor (M: "model." when saved as
//                                      {"model": ..., "optim": ...}; "" for torchtitan)
//   <P>state.<fqn>.<name>              the optimizer's state of a param: per-element
//                                      (exp_avg, exp_avg_sq) or 0-d (step)
//   <P>param_groups.<g>.<hp>, .params  the groups (nested, torch's default), or
//   <P>param_groups.<fqn>.<hp>         one copy per param (flatten_optimizer_state_dict,
//                                      torchtitan): params with equal values form a group
// P is the prefix of the `param_groups` entries ("optim.", "optimizer."); M
// the prefix that makes every state's fqn a model key. The fp32 master of a
// trainable param is its model tensor (torch's optimizers step the fp32 param
// itself); model tensors no group lists are frozen params, or tied names of a
// trainable one when their values are the same (bitwise). The other entries
// (lr_scheduler, dataloader, train_state, ...) are not read.
//
// A weights-only DCP (no '<P>param_groups' entry: dcp.save(model.state_dict())
// as torchtitan's weights-only export writes it, at the top or under
// "model."): every tensor entry is a trainable param of one group (M =
// "model." when every entry is under it, else ""), its fp32 master the weight
// (cast to float32 when the weights are bf16/fp16), the optimizer state fresh
// as a Hugging Face source's: exp_avg and exp_avg_sq 0, step 0 (a 0-d float32
// tensor), DeepSpeed's default param group. DeepSpeed loads it with
// load_module_only=True. Tied names stay two params (equal values cannot
// tell a tie from two equal tensors: LayerNorm weights of ones).
//
// Refused, each with the keys in question: trainable params that are not
// float32 (weights of several dtypes or not floating point in a weights-only
// DCP), params of one group whose scalar states (step) differ, a param in a
// group with no state, states of an fqn that is no model key, per-element
// states of another size than the param.
//
// It offers the DeepSpeed facet a DeepSpeed target needs: DeepSpeed's engine
// defaults for the model (deepspeed/engine_defaults.h) with the source's
// param groups (every hyper-parameter torch saved), global_steps = step and
// clip_grad = DcpReadOptions::clip_grad.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto s, DcpState::Open("/ckpt/step-100", {}));
//   UCP_ASSIGN_OR_RETURN(auto slices, s->Slices(s->info().params[0], 0, "exp_avg"));  // one: the whole tensor
#ifndef UCP_FORMATS_DCP_DCP_STATE_H_
#define UCP_FORMATS_DCP_DCP_STATE_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/facet.h"
#include "format/torch/mapped_file.h"
#include "format/torch/torch_file.h"
#include "formats/dcp/dcp_metadata.h"
#include "state/model_state.h"
#include "tp/tensor_plan.h"

namespace ucp::dcp {

struct DcpReadOptions {
  // Read items whose pickles name code-execution globals (never executed).
  bool allow_unsafe_pickles = false;
  // The gradient clipping DeepSpeed's optimizer state records (clip_grad,
  // which a ZeRO optimizer restores on load over its config's
  // gradient_clipping). DCP does not record one: clipping is the training
  // loop's, not the optimizer's; 0 = none (--source_option=dcp_clip_grad=X).
  double clip_grad = 0.0;
};
// The source option (formats::SourceOptions::format_options) that sets it.
inline constexpr char kClipGradOption[] = "dcp_clip_grad";

class DcpState : public state::SlicedState, public deepspeed::DeepSpeedFacet {
 public:
  static absl::StatusOr<std::unique_ptr<DcpState>> Open(const std::string& dir, const DcpReadOptions& options);

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<std::vector<tp::TensorPlan>> Slices(const state::ParamState& param, int stage,
                                                     const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  std::vector<state::InputRange> Inputs(const state::ParamState& param) const override;
  std::vector<state::InputRange> StateInputs(const state::ParamState& param, const std::string& state) const override;
  std::vector<std::string> InputFiles() const override;
  absl::Status VerifyInput(const std::string& path) const override;
  const state::Facet* GetFacet(state::FacetKey key) const override { return deepspeed::OfferFacet(this, key); }
  const std::string& dir() const override { return dir_; }
  // DeepSpeedFacet.
  absl::StatusOr<state::FileValue> OptimizerCommon() const override { return common_; }
  state::FileValue ModelStatesRoot(int pp, int tp) const override { return root_; }
  std::string ModelStatesPath(int pp, int tp) const override { return ""; }

  const DcpMetadata& metadata() const { return metadata_; }
  // How the keys were read, for inspect: "model 'model.', optimizer 'optim.'
  // (param groups nested)".
  const std::string& layout() const { return layout_; }

  // The tensor of one entry, assembled from its chunks.
  absl::StatusOr<tp::TensorPlan> Assemble(const DcpEntry& entry) const;
  // The Python object of a bytes entry.
  absl::StatusOr<state::FileValue> BytesValue(const DcpEntry& entry) const;

 private:
  struct Param {
    std::string model_key;
    std::map<std::string, std::string> states;  // state name -> entry key
  };
  DcpState() = default;
  absl::Status Load();
  absl::Status FindPrefixes(std::vector<std::string>* fqns);
  absl::Status FindWeights(std::vector<std::string>* fqns);
  absl::Status ReadGroups(const std::vector<std::string>& fqns);
  absl::Status BuildInfo(const std::vector<std::string>& fqns);
  absl::StatusOr<torch::DType> WeightsDtype(const std::vector<std::string>& fqns);
  absl::Status CheckScalars();
  bool HasState(const state::ParamState& p, const std::string& state) const;
  // A weights-only source's fresh per-element state (exp_avg, exp_avg_sq):
  // zeros, read from no file.
  bool FreshState(const std::string& state) const;
  absl::Status BuildFacet();
  absl::StatusOr<std::shared_ptr<const torch::TorchFile>> OpenItem(const DcpStorage& storage,
                                                                 const std::string& key) const;
  absl::StatusOr<std::shared_ptr<const torch::MappedFile>> File(const std::string& file) const;
  const DcpEntry& EntryOf(const state::ParamState& param, const std::string& state) const;

  std::string dir_, layout_, model_prefix_, optim_prefix_;
  DcpReadOptions options_;
  DcpMetadata metadata_;
  std::map<std::string, Param> params_;                 // by fqn
  std::vector<std::vector<std::string>> groups_;        // fqns per group
  std::vector<pickle::ValuePtr> hyper_;                 // per group: {hp: value}
  std::vector<std::string> state_keys_, scalar_keys_;
  std::optional<int64_t> group0_step_;  // CheckScalars: group 0's step, when a number
  bool weights_only_ = false;           // no optimizer state: FindWeights
  state::FileValue fresh_step_;         // weights only: step 0, a 0-d float32 tensor
  state::ModelInfo info_;
  state::FileValue common_, root_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const torch::MappedFile>> files_;
};

}  // namespace ucp::dcp

#endif  // UCP_FORMATS_DCP_DCP_STATE_H_
