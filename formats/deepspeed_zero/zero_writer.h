// Writes a ModelState as a regular DeepSpeed 0.14.4 ZeRO checkpoint for a
// target topology: what DeepSpeed itself saves at that tp/pp/dp, so that any
// DeepSpeed version loads it with a plain `load_checkpoint`.
//
//   ROOT/TAG/layer_LL-model_TT-model_states.pt    PipelineModule layers (lp weights,
//                                                 frozen params, buffers)
//   ROOT/TAG/mp_rank_XX_model_states.pt           param_shapes, world sizes, ds_config
//                                                 updated; client state carried over
//   ROOT/TAG/[bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt
//                                                 flat fp32 partitions and optimizer
//                                                 states per param group
//   ROOT/latest                                   TAG, written last
//
// Mirrors deepspeed/runtime/zero/stage_1_and_2.py and bf16_optimizer.py
// (state_dict; partitions as layout_math.h computes them; a ZeRO optimizer
// saves its fp32 partition without the padding, as a view of the padded
// storage, and its Adam states with it), deepspeed/runtime/pipe/module.py
// (save_state_dict; stages from partition_uniform / partition_balanced),
// deepspeed/runtime/engine.py (_save_checkpoint). Module weights of trainable
// params are the fp32 masters cast to the lp dtype, as DeepSpeed's optimizers
// keep them.
//
// Every output file is an independent unit of work (plan.h), except that a
// large optimizer file is cut into pieces, each a unit (piece_bytes below,
// plan.h WriteUnitPiece); files are written into a staging folder renamed
// into place when complete, then `latest`.
#ifndef UCP_FORMATS_DEEPSPEED_ZERO_ZERO_WRITER_H_
#define UCP_FORMATS_DEEPSPEED_ZERO_ZERO_WRITER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/client_args.h"
#include "deepspeed/layout_math.h"
#include "state/model_state.h"
#include "state/topology.h"
#include "tp/merge.h"
#include "tp/tensor_plan.h"
#include "writers/plan.h"
#include "writers/target_options.h"

namespace ucp::deepspeed_zero {



// Where everything goes at the target topology.
struct TargetLayout {
  state::Topology topo;
  int zero_stage = 1;
  std::string ds_version;  // written in the files; "" = copied from the source
  // The version whose layout is written (the target's, else the source's,
  // else 0.14.4): decides checkpoint_parallel_dimensions (0.19.5 and later).
  deepspeed::DsVersion version{0, 14, 4};
  deepspeed::PaddingConvention padding_convention = deepspeed::PaddingConvention::kLastRank;
  std::string partition_method;
  std::vector<int> parts;  // pp + 1 layer boundaries (pipeline only)
  // [stage][group] -> indices into ModelInfo::params, in flatten order.
  std::vector<std::vector<std::vector<int>>> stage_groups;
  // [stage][group] -> partition layout (the same on every tp rank).
  std::vector<std::vector<deepspeed::ZeroGroupLayout>> layouts;
  // Per param: its tp slice shape and, for vocab params, the padded rows.
  std::vector<std::vector<int64_t>> slice_shapes;
  std::vector<int64_t> padded_rows;
  // Per param: written whole on every tp rank although its rule splits it
  // (AutoTP training before 0.19.5 leaves the lm_head whole: replace_module.py
  // set_lm_head returns in training mode, and such a job saves no
  // universal_checkpoint_info). Empty when none is.
  std::vector<char> whole;
  bool Whole(int param) const { return !whole.empty() && whole[param] != 0; }
  // Per param: the rule written when it is not the param's own (an AutoTP
  // lm_head the source held whole, ParamState::autotp_cut, cut again at a
  // target tp > 1; whole again for a target before 0.19.5). Empty when none
  // is; kind unspecified: the param's own.
  std::vector<MergeRule> rules;
  // How the target version's AutoTP cuts a dim tp does not divide (master by
  // get_shard_size, earlier versions by torch.chunk: tp::AutoTpCut).
  tp::AutoTpCut autotp_cut = tp::AutoTpCut::kNearEven;
  // The client state 'args' keys that record the source's topology, with the
  // target's values (deepspeed/client_args.h).
  std::vector<deepspeed::ArgsChange> args_changes;
  const MergeRule& RuleOf(int param, const MergeRule& own) const {
    return rules.empty() || rules[param].kind() == MERGE_KIND_UNSPECIFIED ? own : rules[param];
  }
  // AutoTP's uneven widths (tp::AutoTpWidth: the first size % tp ranks hold
  // one more row or column): per tp rank, each param's slice shape and the
  // stage groups' layouts. Empty when every tp rank has the shapes and
  // layouts above; read them through SliceShape and Layout.
  std::vector<std::vector<std::vector<int64_t>>> rank_slice_shapes;                  // [tp][param]
  std::vector<std::vector<std::vector<deepspeed::ZeroGroupLayout>>> rank_layouts;  // [tp][stage][group]
  const std::vector<int64_t>& SliceShape(int param, int tp_rank) const {
    return rank_slice_shapes.empty() ? slice_shapes[param] : rank_slice_shapes[tp_rank][param];
  }
  const deepspeed::ZeroGroupLayout& Layout(int stage, int group, int tp_rank) const {
    return rank_layouts.empty() ? layouts[stage][group] : rank_layouts[tp_rank][stage][group];
  }
  // Per stage: params outside the optimizer (frozen, buffers) it holds.
  std::vector<std::vector<int>> stage_module_params;
  // Layer files: (layer, ordered param indices).
  std::vector<std::pair<int, std::vector<int>>> layer_files;
};

// `source_ds_version`: the source's ds_version ("" if unknown), for the
// target's conventions when options.target_ds_version is empty.
absl::StatusOr<TargetLayout> PlanTarget(const state::ModelInfo& info, const writers::ZeroWriteOptions& options,
                                        const std::string& source_ds_version = "");

// The tp slice `rank` of a param's state at the target, as a plan. With
// `deferred`, over the state's FullDeferred when it has one (nothing is
// opened until the bytes are read).
absl::StatusOr<tp::TensorPlan> TargetSlice(const state::ModelState& state, const TargetLayout& layout,
                                           int param_index, const std::string& state_name, int rank,
                                           bool deferred = false);

// Which inputs each of `pieces` pieces of the file `name` (tree `root`, made
// in `w`) reads (writers::WriteUnitPiece), from the plans of its storages
// (`records`: TorchWriter storage number -> deferred plan, as the writer
// made them), without writing or reading anything: per piece, each input
// file whole (tensor ""), with the bytes it reads of it as the length.
// Storages not in `records` (copied from the source's common state) are
// left out: every piece opens those.
absl::StatusOr<std::vector<std::vector<writers::InputRange>>> PieceInputsOf(
    torch::TorchWriter& w, const std::string& name, const pickle::Value& root, int pieces,
    const std::vector<std::pair<size_t, tp::TensorPlan>>& records);

// Whether `state` defers (state::ModelState::FullDeferred) the fp32 master
// and every optimizer state of each of `params` (indices into its params):
// only then can PieceInputsOf lay a file of theirs out without opening (and
// CRC-checking, outside any unit) its inputs while planning.
bool AllStatesDeferred(const state::ModelState& state, const std::vector<int>& params);

struct ZeroWriteResult {
  TargetLayout layout;
  int64_t files = 0;
  int64_t bytes = 0;
};

// The plan of the ZeRO checkpoint of `state` at options.target (`state`
// must outlive it); its TargetLayout goes to `layout` when not null. One unit
// per output file, or per piece of a large optimizer file.
absl::StatusOr<std::unique_ptr<writers::Plan>> PlanZero(const state::ModelState& state, const writers::ZeroWriteOptions& options,
                                               TargetLayout* layout = nullptr);


// PlanZero, then RunPlan in this process. `output_folder` is ROOT/TAG.
absl::StatusOr<ZeroWriteResult> WriteZeroCheckpoint(const state::ModelState& state,
                                                    const std::string& output_folder,
                                                    const writers::ZeroWriteOptions& options);

}  // namespace ucp::deepspeed_zero

#endif  // UCP_FORMATS_DEEPSPEED_ZERO_ZERO_WRITER_H_
