// Zero3State: a DeepSpeed ZeRO stage 3 checkpoint folder as a SlicedState
// (deepspeed/model_state.h), as DeepSpeed 0.12 to 0.19.5 write it:
//
//   zero_pp_rank_D_mp_rank_00_model_states.pt          one per dp rank: `module` with every
//                                                      param an empty (0,) tensor (buffers whole),
//                                                      param_shapes: one OrderedDict per SUB-GROUP
//   [bf16_]zero_pp_rank_D_mp_rank_00_optim_states.pt   optimizer_state_dict = {zero_stage (3),
//        loss_scaler, dynamic_loss_scale, overflow, partition_count (int), optimizer_state_dict =
//        {state: {sub_group: {step, exp_avg, exp_avg_sq}}, param_groups: [{..., params: [sub_group
//        ids]}]}, fp32_flat_groups: [one flat fp32 tensor per sub-group]}
//
// Frozen params (requires_grad False: a LoRA run's base model, frozen
// embeddings) are in no optimizer file: every rank's model states list them
// in `frozen_param_shapes` (name -> full shape, module order) and hold its
// own partition of each in `frozen_param_fragments` (name -> the 1-D
// `ds_tensor` of ceil(numel / dp) elements, lp dtype, the last rank's
// padded); `module` has an empty tensor for them. A frozen param's lp
// weight is the ranks' fragments concatenated and cut to numel, as
// zero_to_fp32.py's _zero3_merge_frozen_params does. Tied params: rank 0's
// `shared_params` (alias -> owner; every other rank's is empty) names the
// module keys that are another name of a param (kTied, the owner's values).
//
// Each param is split over the dp ranks in partitions of ceil(numel / dp)
// elements (the last one padded); a rank's flat sub-group is its partitions
// of the sub-group's params, concatenated in param_shapes order
// (deepspeed/runtime/zero/partition_parameters.py, stage3.py
// _create_fp16_sub_groups and _rigid_state_dict; utils/zero_to_fp32.py
// reads it the same way). Sub-groups are cut from each param group by
// `sub_group_size` over the partition sizes, so they depend on dp.
//
// Topology: pp = 1; tp = the number of mp ranks (Megatron-style tensor
// parallelism under ZeRO-3: `zero_pp_rank_D_mp_rank_TT_*`, each mp rank's
// files a ZeRO-3 checkpoint of its tp slice of every param, read as one state
// per rank whose params are the tp slices of the union; mp_world_size must
// be their number); dp = dp_world_size = the number of files of each kind
// per mp rank = partition_count. Files are checked against each other
// and against param_shapes when opened (optimizer files on first use); every
// error names the file, the sub-group or param, expected vs found.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto z3, Zero3State::Open("/ckpt/global_step4"));
//   UCP_ASSIGN_OR_RETURN(auto slices, z3->Slices(z3->info().params[0], 0, "fp32"));  // one slice: full
#ifndef UCP_FORMATS_DEEPSPEED_ZERO3_ZERO3_STATE_H_
#define UCP_FORMATS_DEEPSPEED_ZERO3_ZERO3_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/layout_math.h"
#include "deepspeed/read_options.h"
#include "deepspeed/facet.h"
#include "deepspeed/flat_optim_file.h"
#include "state/model_state.h"
#include "format/torch/torch_file.h"

namespace ucp::deepspeed_zero3 {

// True when `path` (a tag folder, or a root whose `latest` names one) holds
// ZeRO-3 model-state files (zero_pp_rank_D_mp_rank_XX_model_states.pt).
bool IsZero3Folder(const std::string& path);

// The sub-group and partition math (deepspeed/layout_math.h).
using deepspeed::Zero3PartitionNumel;
using deepspeed::Zero3SubGroups;

class Zero3State : public state::SlicedState, public deepspeed::DeepSpeedFacet {
 public:
  static absl::StatusOr<std::unique_ptr<Zero3State>> Open(const std::string& path,
                                                          const deepspeed::ReadOptions& read = {});
  // DeepSpeed's stage-3 universal layout (ds_to_universal.py 0.15 to 0.19.5
  // of a ZeRO-3 checkpoint at tp 1, and `ucp convert` of one): the model
  // states copied from the ZeRO-3 checkpoint (everything but the trainable
  // params read as above), zero/optimizer_state.pt (rank 0's
  // optimizer_state_dict with param_groups: the groups, sub-groups and
  // scalars) and each trainable param's states as zero/<name>/<state>.pt, a
  // raw 1-D float32 tensor of its numel. A ZeRO-3 checkpoint saved at tp > 1
  // (ds_to_universal.py 0.19.5 on, `ucp convert`): the model states of mp
  // rank 0 (its tp slices in param_shapes; every mp rank's copied, or mp rank
  // 0's alone) and each param's states merged over tp in the stage 1/2 dict
  // ('param' of the full shape), read at tp 1.
  static absl::StatusOr<std::unique_ptr<Zero3State>> OpenUniversal(const std::string& dir,
                                                                   const deepspeed::ReadOptions& read = {});

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<std::vector<tp::TensorPlan>> Slices(const state::ParamState& param, int stage,
                                                     const std::string& state) const override;
  // Of a stage-3 universal folder: each param's state file (a float32
  // tensor of the param's numel, or of its full shape when saved at tp > 1).
  std::optional<WholeFile> WholeStateFile(const state::ParamState& param, const std::string& state) const override;
  // The scalar (step) of the group's first sub-group: every sub-group of a
  // group holds the same one (checked at Open).
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  std::vector<state::InputRange> Inputs(const state::ParamState& param) const override;
  std::vector<std::string> InputFiles() const override;
  absl::Status VerifyInput(const std::string& path) const override;
  void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const override;
  const state::Facet* GetFacet(state::FacetKey key) const override { return deepspeed::OfferFacet(this, key); }
  // DeepSpeedFacet. What DeepSpeed's ds_to_universal.py writes as zero/optimizer_state.pt for
  // ZeRO-3: rank 0's optimizer_state_dict with `param_groups` added (the
  // stage-3 universal loader reads state[0]['step'] and param_groups[0]).
  absl::StatusOr<state::FileValue> OptimizerCommon() const override;
  state::FileValue ModelStatesRoot(int pp, int tp) const override;
  std::string ModelStatesPath(int pp, int tp) const override;
  std::string DpModelStatesPath(int dp, int tp) const override;
  const pickle::Value& checkpoint_info() const override;
  const pickle::Value* args() const override;
  const std::string& dir() const override { return dir_; }

  // (At tp > 1: mp rank 0's.)
  int num_sub_groups() const {
    return tp_ranks_.empty() ? static_cast<int>(sub_groups_.size()) : tp_ranks_[0]->num_sub_groups();
  }
  // `sub_group_size` of the saving job's ds_config (DeepSpeed's default 1e9
  // when it records none).
  int64_t sub_group_size() const { return tp_ranks_.empty() ? sub_group_size_ : tp_ranks_[0]->sub_group_size(); }
  const std::string& ds_version() const { return tp_ranks_.empty() ? ds_version_ : tp_ranks_[0]->ds_version(); }

 private:
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int64_t partition = 0;  // ceil(numel / dp)
    int sub_group = 0;
    int64_t offset = 0;     // in the sub-group's flat partition of every rank
  };
  // A frozen param: frozen_param_shapes entry, its partition per rank.
  struct FrozenParam {
    std::string name;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int64_t partition = 0;  // ceil(numel / dp)
    torch::DType dtype = torch::DType::kFloat32;
  };
  struct SubGroup {
    int group = 0;
    int64_t flat_numel = 0;  // per rank
  };
  using OptimFile = deepspeed::FlatOptimFile;  // flat groups: the sub-groups
  // The checkpoint's files by kind and dp rank (ListFiles).
  struct FolderFiles {
    std::set<int> model_dp, optim_dp;
  };

  // A param of one mp rank's state (null when it has none).
  struct TpRank {
    const Zero3State* state;
    const state::ParamState* param;
  };

  Zero3State() = default;
  absl::Status BuildTpInfo();
  TpRank RankParam(int r, const state::ParamState& param) const;
  // Open's phases, in order; each checks what it reads and names the file.
  absl::Status Load();
  absl::StatusOr<FolderFiles> ListFiles();
  absl::Status OpenModelFiles(const FolderFiles& files);
  absl::Status ReadZeroConfig();
  absl::StatusOr<const std::vector<pickle::ValuePtr>*> ParseParamShapes();
  absl::Status CheckParamShapesAgree(const std::vector<pickle::ValuePtr>& shape_list) const;
  absl::Status ParseFrozenParams();
  absl::Status CheckFrozenFragments(int dp);
  void ParseSharedParams();
  absl::Status ParseParamGroups(const OptimFile& first);
  absl::Status CheckScalarsAgree(const OptimFile& first) const;
  absl::Status BuildInfo(const OptimFile& first);
  absl::Status AddModuleTensors(const pickle::Value& module, const std::map<std::string, int>& trainable);

  absl::StatusOr<std::unique_ptr<OptimFile>> ParseOptim(int dp) const;
  absl::StatusOr<const OptimFile*> Optim(int dp) const;
  std::string OptimPath(int dp) const;
  // The stage-3 universal layout: a param's state file and its tensor.
  std::string ParamStatePath(const Param& p, const std::string& state) const;
  absl::StatusOr<tp::TensorPlan> UniversalParamState(const Param& p, const std::string& state) const;
  std::string ModelPath(int dp) const;
  // The stage-3 universal folder of a checkpoint saved at tp > 1: its
  // params' shapes from their merged fp32.pt (sets merged_).
  absl::Status ReadMergedShapes();
  // The frozen param's lp weight: every rank's fragment, cut to numel.
  absl::StatusOr<tp::TensorPlan> FrozenFull(const FrozenParam& f) const;
  // A tied alias's lp weight: its owner's (a trainable owner's fp32 master
  // in the lp dtype).
  absl::StatusOr<tp::TensorPlan> TiedFull(const state::ParamState& alias) const;
  std::vector<state::InputRange> FrozenInputs(const FrozenParam& f) const;

  std::string dir_;
  deepspeed::ReadOptions read_;
  bool universal_ = false;  // the stage-3 universal layout (OpenUniversal)
  bool merged_ = false;     // ... of a checkpoint saved at tp > 1 (ReadMergedShapes)
  int mp_rank_ = 0;   // whose files this state reads (ModelPath, OptimPath)
  int mp_world_ = 1;  // the folder's mp ranks (ListFiles)
  // tp > 1: one state per mp rank (this one holds no files of its own).
  std::vector<std::unique_ptr<Zero3State>> tp_ranks_;
  int dp_ = 1;
  bool bf16_prefix_ = false;
  int64_t sub_group_size_ = 1000000000;
  std::string ds_version_;
  std::vector<std::unique_ptr<torch::TorchFile>> model_files_;  // per dp rank
  std::vector<Param> params_;                                   // trainable, in param_shapes order
  std::vector<SubGroup> sub_groups_;
  std::vector<std::vector<int>> group_sub_groups_;  // param group -> its sub-groups
  std::vector<int> info_param_;                     // info_.params index -> params_ index or -1
  std::vector<FrozenParam> frozen_;                 // frozen_param_shapes order
  std::map<std::string, int> frozen_index_;         // name -> frozen_ index
  std::map<std::string, std::string> aliases_;      // rank 0's shared_params: alias -> owner
  deepspeed::LazyOptimFiles optim_files_;           // per dp rank
  mutable deepspeed::CheckedInputs checked_inputs_;  // SetCheckedInputs
  state::ModelInfo info_;
  pickle::ValuePtr empty_dict_;
};

}  // namespace ucp::deepspeed_zero3

#endif  // UCP_FORMATS_DEEPSPEED_ZERO3_ZERO3_STATE_H_
