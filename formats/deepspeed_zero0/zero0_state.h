// Zero0State: a DeepSpeed checkpoint saved without ZeRO
// (`zero_optimization.stage: 0`) as a SlicedState (tp = pp = 1 below; tp and
// pipelines further down):
//
//   mp_rank_00_model_states.pt   `module` (the full lp weights, buffers, both names
//                                of a tied weight), `optimizer` = the optimizer's own
//                                state_dict, param_shapes None; no *_optim_states.pt
//
// `optimizer` is one of (DeepSpeed 0.12 to 0.19.5 and master, engine.py
// _save_checkpoint / _get_optimizer_ckpt_state):
//   fp32        the torch optimizer's state_dict: {state: {i: {step, exp_avg,
//               exp_avg_sq}}, param_groups: [{..., params: [i, ...]}]}; the fp32
//               master is the module weight itself;
//   bf16/fp16   FP16_UnfusedOptimizer.state_dict (runtime/fp16/unfused_optimizer.py):
//               {dynamic_loss_scale, cur_scale, cur_iter, [last_overflow_iter,
//               scale_factor, scale_window,] optimizer_state_dict: <as fp32>,
//               fp32_groups: [[fp32 master per param of the group]]}.
// FP16_Optimizer's fused layout (fp32_groups_flat, GPU FusedAdam only) is
// refused (kUnimplemented).
//
// Tensor parallelism (a plain module given an mpu: mp_rank_00 .. mp_rank_<tp-1>,
// each holding its tp rank's module slices and the optimizer state over them):
// each file is read and its order reconstructed on its own (a rank of its
// own, `tp_ranks_`), and the ranks must agree on every name, role and group;
// the state is then their tp slices side by side.
//
// A PipelineModule (layer_LL-model_TT-model_states.pt beside mp_rank_00 ..
// mp_rank_<pp*tp-1>, whose `module` is None): every (stage, tp rank) file
// holds the optimizer over its stage's params. Which layers a stage holds is
// not saved: stage s takes the fewest layers after stage s-1's for which its
// optimizer's order reconstruction succeeds (the last stage the rest); its
// params are named `<layer>.<key>` as PipelineModule names them. Tied modules
// (TiedLayerSpec: `tied_modules.<key>.*`, in the optimizer of every stage
// using them) cannot be told from the files and are refused.
//
// The state is keyed by the optimizer's param index; which module param each
// index is, is reconstructed (param_order.h) from shapes, then for bf16/fp16
// from the masters cast to the lp dtype, then, when the option names it, by
// the Hugging Face Trainer's decay / no-decay rule; an assignment that is
// still ambiguous is refused with the params in question. The evidence that
// decided is in `evidence()` and in the notes commands print.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto z0, Zero0State::Open("/ckpt/global_step3", {}));
//   UCP_ASSIGN_OR_RETURN(auto slices, z0->Slices(z0->info().params[0], 0, "exp_avg"));  // one slice: full
#ifndef UCP_FORMATS_DEEPSPEED_ZERO0_ZERO0_STATE_H_
#define UCP_FORMATS_DEEPSPEED_ZERO0_ZERO0_STATE_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/facet.h"
#include "deepspeed/read_options.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"
#include "state/model_state.h"

namespace ucp::deepspeed_zero0 {

// The source option key (formats::SourceOptions::format_options) and its values.
inline constexpr char kOrderOption[] = "zero0_order";
inline constexpr char kOrderHfTrainer[] = "hf_trainer";

struct Zero0Options {
  deepspeed::ReadOptions read;
  // "" (evidence in the files only) or kOrderHfTrainer.
  std::string order;
  // --make_vocab_size_divisible_by of the command (0: the checkpoint's args'),
  // recorded in ModelInfo as the ZeRO-1/2 reader records it.
  int64_t make_vocab_size_divisible_by = 0;
};

// Whether the parsed model-states root is a stage-0 checkpoint's: param_shapes
// None and an optimizer state (or none at all) in the file.
bool IsZero0Root(const pickle::Value& root);

class Zero0State : public state::SlicedState, public deepspeed::DeepSpeedFacet {
 public:
  static absl::StatusOr<std::unique_ptr<Zero0State>> Open(const std::string& dir, const Zero0Options& options);

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<std::vector<tp::TensorPlan>> Slices(const state::ParamState& param, int stage,
                                                     const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  std::vector<state::InputRange> Inputs(const state::ParamState& param) const override;
  std::vector<std::string> InputFiles() const override;
  absl::Status VerifyInput(const std::string& path) const override;
  const state::Facet* GetFacet(state::FacetKey key) const override { return deepspeed::OfferFacet(this, key); }
  const std::string& dir() const override { return dir_; }
  // DeepSpeedFacet: the model states without `optimizer`, and an optimizer
  // state in the shape of a ZeRO optimizer's (loss scaler, clip_grad from the
  // ds_config's gradient_clipping, param_groups as the source saved them).
  absl::StatusOr<state::FileValue> OptimizerCommon() const override {
    return tp_ranks_.empty() ? common_ : tp_ranks_[0]->common_;
  }
  state::FileValue ModelStatesRoot(int pp, int tp) const override;
  std::string ModelStatesPath(int pp, int tp) const override { return ""; }

  const std::string& ds_version() const { return ds_version_; }
  // "fp32 (torch optimizer state_dict)" or "bf16 (FP16_UnfusedOptimizer)".
  const std::string& layout() const { return layout_; }
  const std::string& evidence() const { return evidence_; }

 private:
  struct Slot {              // one optimizer param
    int index = -1;          // the optimizer's state key
    std::vector<int64_t> shape;
    const pickle::Value* state = nullptr;  // its state dict
    const pickle::Value* master = nullptr; // fp32_groups[g][j] (bf16/fp16), else null
  };
  struct Entry {             // one module tensor
    std::string name;
    int layer = -1;          // pipelines: the layer file's index
    std::string local_name;  // pipelines: the key in the layer file
    torch::Tensor tensor;
    state::TensorRole role = state::TensorRole::kFrozen;
    std::string alias_of;
  };

  Zero0State() = default;
  // One model-states file (`file` in dir_): what Load does for tp = 1.
  static absl::StatusOr<std::unique_ptr<Zero0State>> OpenFile(const std::string& dir, const std::string& file,
                                                               const Zero0Options& options);
  absl::Status Load(const Zero0Options& options);
  absl::Status LoadFile(const std::string& file, const Zero0Options& options);
  // tp > 1: the ranks' infos agree; info_ is rank 0's with every rank's shapes.
  absl::Status CombineTpRanks();
  // Pipelines: the mp_rank files (sorted) and the layer files by (layer, tp rank).
  absl::Status LoadPipeline(const std::vector<std::string>& mp_files,
                            const std::map<std::pair<int, int>, std::string>& layer_files, const Zero0Options& options);
  // Pipelines: opens a stage's mp_rank file and reads its optimizer (no module).
  static absl::StatusOr<std::unique_ptr<Zero0State>> OpenStageFile(const std::string& dir, const std::string& file,
                                                                    const Zero0Options& options);
  // Pipelines: gives the rank the tensors of layers [begin, end) of tp rank
  // `t` and reconstructs its order.
  absl::Status SolveStage(const Zero0State& parent, int t, size_t begin, size_t end, const Zero0Options& options);
  absl::Status CombinePipeline();
  const Zero0State& Rank(int stage, int tp_rank) const { return *tp_ranks_[stage * tp_ + tp_rank]; }
  absl::Status ReadModule();
  absl::Status ReadOptimizer();
  absl::Status SolveOrder(const Zero0Options& options);
  absl::Status BuildInfo();
  absl::Status BuildCommon();
  // What the training's args say that the ZeRO-1/2 reader records too: the
  // vocabulary padding (make_vocab_size_divisible_by, or the option's) and
  // the pipeline partition method.
  void RecordArgs(const Zero0Options& options);
  absl::StatusOr<torch::Tensor> Tensor(const pickle::Value& v, const std::string& what) const;
  absl::Status Error(const std::string& what) const;

  std::string dir_, path_, ds_version_, layout_, evidence_;
  std::unique_ptr<torch::TorchFile> file_;
  const pickle::Value* optimizer_ = nullptr;  // the torch optimizer's state_dict
  const pickle::Value* wrapper_ = nullptr;    // FP16_UnfusedOptimizer's, or null
  std::vector<Entry> entries_;                // module order
  std::vector<std::vector<Slot>> groups_;
  std::vector<std::vector<int>> assigned_;    // per group, per slot: entries_ index
  std::vector<std::string> state_keys_, scalar_keys_;
  std::vector<int> info_entry_;               // info_.params index -> entries_ index
  std::vector<const Slot*> info_slot_;        // info_.params index -> slot or null
  state::ModelInfo info_;
  state::FileValue common_;
  pickle::ValuePtr root_copy_;
  // tp > 1 or pp > 1: one per mp_rank file, in mp rank order (stage * tp + tp rank).
  std::vector<std::unique_ptr<Zero0State>> tp_ranks_;
  int tp_ = 1, pp_ = 1;
  // Pipelines (the parent only): layer indices with files, their files per
  // tp rank, and the entries each layer file holds per tp rank.
  std::vector<int> layers_;
  std::vector<std::unique_ptr<torch::TorchFile>> layer_files_;
  std::vector<std::vector<std::vector<Entry>>> layer_entries_;  // [tp][layer index in layers_]
  std::vector<std::pair<size_t, size_t>> stage_layers_;         // per stage: [begin, end) in layers_
};

}  // namespace ucp::deepspeed_zero0

#endif  // UCP_FORMATS_DEEPSPEED_ZERO0_ZERO0_STATE_H_
