// ZeroCheckpoint: a DeepSpeed ZeRO stage 1/2 (or BF16_Optimizer) checkpoint
// folder, opened and cross-checked, with lazy zero-copy access to every file.
//
// The folder is `<root>/<tag>/` (or `<root>` with a `latest` file naming the
// tag). Topology comes from the files and their contents, never from
// `layer_01*` files alone:
//   - pp * tp = the number of mp_rank files = their `mp_world_size`;
//   - tp = how many leading mp ranks share mp_rank_00's parameter names (all
//     tp ranks of a pipeline stage hold the same names), cross-checked with
//     layer file names when there are any;
//   - dp = `dp_world_size` = the optimizer files per mp rank = their
//     `partition_count`.
// Every optimizer file is checked against the partition math of
// layout_math.h: its `param_slice_mappings`, `group_paddings`, partition
// sizes. Errors name the file and what was expected versus found.
//
// Mirrors deepspeed/runtime/engine.py (_save_checkpoint), zero/stage_1_and_2.py
// and bf16_optimizer.py (state_dict), pipe/module.py (save_state_dict).
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto ckpt, ZeroCheckpoint::Open("/ckpt/global_step4"));
//   for (const ZeroParam& p : ckpt->params()) { ... }
//   UCP_ASSIGN_OR_RETURN(auto pieces, ckpt->SlicePieces(p, /*pp=*/0, /*tp=*/1, "exp_avg"));
#ifndef UCP_FORMATS_DEEPSPEED_ZERO_ZERO_CHECKPOINT_H_
#define UCP_FORMATS_DEEPSPEED_ZERO_ZERO_CHECKPOINT_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "base/once_slot.h"
#include "deepspeed/flat_optim_file.h"
#include "deepspeed/layout_math.h"
#include "deepspeed/read_options.h"
#include "state/model_state.h"
#include "deepspeed/model_states_files.h"
#include "state/topology.h"
#include "format/pickle/accessors.h"
#include "format/pickle/value.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"

namespace ucp::deepspeed_zero {

// ModuleEntry: one tensor of the module state (lp weights, frozen params,
// buffers): a key of a layer file, or of the mp_rank `module` dict.
struct ModuleEntry {
  std::string name;        // full module name ("2.attention.dense.weight")
  std::string local_name;  // key in its layer file (== name without pipeline)
  int layer = -1;          // layer file index, -1 without pipeline
  state::TensorRole role = state::TensorRole::kTrainable;
  std::string tied_key;
  std::string alias_of;    // kTied: the trainable param it is another name of
  torch::DType dtype = torch::DType::kFloat32;
  std::vector<std::vector<int64_t>> tp_shapes;  // per tp rank
};

// How units name a flat partition of an optimizer file (state::InputRange's
// tensor, CheckpointState::SetCheckedInputs's keys): state "fp32" is
// single_partition_of_fp32_groups[g], any other
// base_optimizer_state.state[g].<state>.
std::string FlatTensorName(int group, const std::string& state);

// OptimFile: one parsed `*_optim_states.pt`: per param group its flat dp
// partition (single_partition_of_fp32_groups[g]), per-element optimizer
// states and scalars in the shared FlatOptimFile (deepspeed/flat_optim_file.h,
// which the ZeRO-3 and MoE readers parse into too), `osd` the file's
// optimizer_state_dict; and what only ZeRO-1/2 records. The flat partitions
// are CRC-checked when first used, each once (VerifyPartition): a command
// reads only the bytes it needs and each of them once from disk (export
// reads no optimizer states); every other storage of the file is checked
// when it opens.
struct OptimFile : deepspeed::FlatOptimFile {
  std::vector<int64_t> paddings;  // per group: group_paddings[g] (its lean part is the partition minus it)
  // The padding convention its group_paddings follow, when they tell the two
  // apart (a group whose padding is not all in the last partition).
  deepspeed::PaddingConvention convention = deepspeed::PaddingConvention::kLastRank;
  bool convention_decided = false;
};
class ZeroCheckpoint {
 public:
  // `path`: a tag folder, or a root folder with a `latest` file.
  static absl::StatusOr<std::unique_ptr<ZeroCheckpoint>> Open(const std::string& path,
                                                              const deepspeed::ReadOptions& read = {});
  // The same, with the module tensors another process already read from the
  // layer or module files (an MPI job's rank 0): no layer file is opened
  // until a tensor of it is read.
  static absl::StatusOr<std::unique_ptr<ZeroCheckpoint>> Open(const std::string& path,
                                                              std::vector<ModuleEntry> module_entries,
                                                              const deepspeed::ReadOptions& read = {});

  const std::string& dir() const { return dir_; }     // the tag folder
  const std::string& tag() const { return tag_; }
  const std::string& root() const { return root_; }   // its parent
  const state::Topology& topology() const { return topo_; }
  int zero_stage() const { return zero_stage_; }
  state::OptimizerKind optimizer_kind() const { return kind_; }
  bool bf16_file_prefix() const { return bf16_prefix_; }
  bool pipeline() const { return pipeline_; }
  int num_groups() const { return num_groups_; }
  torch::DType lp_dtype() const { return lp_dtype_; }
  // The `ds_version` the files record ("" when none does), and the padding
  // convention of group_paddings: what zero_pp_rank_0's paddings show when
  // they tell, else what that version writes.
  const std::string& ds_version() const { return ds_version_; }
  deepspeed::PaddingConvention padding_convention() const { return convention_; }

  // Trainable params, in the order: stage 0's groups in flatten order, then
  // the params first seen in stage 1, ...
  const std::vector<deepspeed::ZeroParam>& params() const { return ms_->params(); }
  const deepspeed::ZeroParam* FindParam(const std::string& name) const { return ms_->FindParam(name); }
  // Names of group `group` of pipeline stage `pp`, in flatten order.
  const std::vector<std::string>& StageGroup(int pp, int group) const { return ms_->StageGroup(pp, group); }
  const deepspeed::ModelStatesFiles& model_states() const { return *ms_; }
  // The partition layout of (pp stage, tp rank, group).
  const deepspeed::ZeroGroupLayout& Layout(int pp, int tp, int group) const;
  // Per-element optimizer state keys besides "fp32" (exp_avg, exp_avg_sq, ...),
  // as found in the files, in file order.
  const std::vector<std::string>& state_keys() const { return state_keys_; }

  // Module tensors (layer files or mp_rank `module`) in file order; layer
  // files ascending by layer index.
  const std::vector<ModuleEntry>& module_entries() const { return module_entries_; }
  // Layer indices that have files (pipeline only), ascending.
  const std::vector<int>& layer_files() const { return layer_files_; }

  std::string MpRankPath(int pp, int tp) const;
  std::string OptimPath(int pp, int tp, int dp) const;
  std::string LayerPath(int layer, int tp) const;
  // The mp_rank file of (pp, tp) (opened at Open).
  const torch::TorchFile& MpRankFile(int pp, int tp) const { return ms_->file(pp, tp); }
  // Optimizer / layer files, opened on first use and cached (thread-safe).
  // An optimizer file is checked against the partition math and against
  // zero_pp_rank_0_mp_rank_00 when it opens; its error is kept and returned
  // to every later call.
  // A layer file's records are not CRC-checked when it opens: read its
  // tensors through ModuleTensor, which checks each one it returns.
  absl::StatusOr<const OptimFile*> Optim(int pp, int tp, int dp) const;
  absl::StatusOr<const torch::TorchFile*> LayerFile(int layer, int tp) const;
  // The flat partitions this process CRC-checks when it reads them
  // (state::CheckpointState::SetCheckedInputs); null: all.
  void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const {
    checked_inputs_.Set(std::move(keys));
  }
  // Checks one file of the checkpoint (a path under dir()) as reading it
  // would: an optimizer file is opened (Optim); layer and mp_rank files were
  // checked at Open (a layer file's storages when a tensor is read).
  absl::Status VerifyFile(const std::string& path) const;
  // Where the bytes of `range` (a range of a flat partition of an optimizer
  // file, as ZeroSlicedState::Inputs lists it) lie in that file, when the
  // file is open already (never opens one, never waits for one being
  // opened); nullopt otherwise (state::CheckpointState::ExtentOf).
  std::optional<state::FileExtent> OpenedExtent(const state::InputRange& range) const;
  // The (pp, tp, dp) of the optimizer file `path` of this checkpoint's
  // folder (its Optim slot), from its name; nullopt for any other file.
  std::optional<std::tuple<int, int, int>> OptimKeyOf(const std::string& path) const;

  // The flat pieces (in dp order) whose concatenation is the tp slice of
  // `param` in stage `pp`, tp rank `tp`, for `state` ("fp32" or a state key).
  absl::StatusOr<std::vector<torch::Tensor>> SlicePieces(const deepspeed::ZeroParam& param, int pp, int tp,
                                                         const std::string& state) const;
  // A scalar state (e.g. "step") of `group` in (pp, tp, dp); null if absent.
  absl::StatusOr<pickle::ValuePtr> GroupScalar(int pp, int tp, int dp, int group, const std::string& key) const;
  // The lp tensor of a module entry on tp rank `tp` (from its layer file,
  // CRC-checked, or from the mp_rank `module` of stage 0).
  absl::StatusOr<torch::Tensor> ModuleTensor(const ModuleEntry& entry, int tp) const;

  // mp_rank_00's `universal_checkpoint_info` (an empty dict when absent).
  const pickle::Value& universal_checkpoint_info() const { return ms_->universal_checkpoint_info(); }
  // mp_rank_00's `args` (dict or argparse.Namespace attributes), null if none.
  const pickle::Value* args() const { return ms_->args(); }
  // Every file of the folder that belongs to the checkpoint.
  const std::vector<std::string>& files() const { return files_; }

 private:
  ZeroCheckpoint() = default;
  static absl::StatusOr<std::unique_ptr<ZeroCheckpoint>> OpenImpl(const std::string& path,
                                                                  std::vector<ModuleEntry>* module_entries,
                                                                  const deepspeed::ReadOptions& read);
  absl::Status Load(const std::vector<ModuleEntry>* module_entries);
  absl::Status LoadModuleLayout();
  absl::Status SetModuleLayout(std::vector<ModuleEntry> entries);
  absl::StatusOr<std::unique_ptr<OptimFile>> ParseOptim(int pp, int tp, int dp) const;

  std::string dir_, tag_, root_;
  deepspeed::ReadOptions read_;
  state::Topology topo_;
  int zero_stage_ = 1;
  state::OptimizerKind kind_ = state::OptimizerKind::kZero;
  bool bf16_prefix_ = false;
  // > 1: DeepSpeed 0.19.5's Ulysses naming, rank d's optimizer file is mp_rank_{d % sp}.
  int ulysses_sp_ = 1;
  bool pipeline_ = true;
  int num_groups_ = 0;
  std::string ds_version_;
  deepspeed::PaddingConvention convention_ = deepspeed::PaddingConvention::kLastRank;
  torch::DType lp_dtype_ = torch::DType::kFloat32;
  std::vector<std::string> files_;
  std::unique_ptr<deepspeed::ModelStatesFiles> ms_;
  // [pp][tp][group] -> layout
  std::vector<std::vector<std::vector<deepspeed::ZeroGroupLayout>>> layouts_;
  std::vector<std::string> state_keys_;
  std::vector<ModuleEntry> module_entries_;
  std::vector<int> layer_files_;  // the layers with files (pipeline), set at Load
  std::map<std::pair<int, int>, std::string> layer_paths_;  // (layer, tp) -> path

  absl::Status CheckLikeFirst(const OptimFile& file) const;
  absl::Status CheckMastersMatchLp(const OptimFile& file, int pp, int tp, int dp) const;
  absl::Status CheckLayerFilesPresent() const;
  absl::StatusOr<torch::Tensor> ModuleTensorUnchecked(const ModuleEntry& entry, int tp) const;
  std::map<std::string, size_t> lp_entry_;  // trainable param -> first entry in module_entries_
  // One per optimizer file, created at Load; the file is parsed (and its
  // CRCs verified) by the first Optim() call that needs it.
  std::map<std::tuple<int, int, int>, std::unique_ptr<OnceSlot<OptimFile>>> optim_slots_;
  mutable deepspeed::CheckedInputs checked_inputs_;
  // One per layer file (layer_paths_), created at Load; the file is parsed
  // by the first LayerFile() call that needs it, so that threads parse
  // different files at once (LoadModuleLayout parses them all in parallel).
  std::map<std::pair<int, int>, std::unique_ptr<OnceSlot<torch::TorchFile>>> layer_slots_;
  // Parses every layer file on all cores at once (LoadModuleLayout reads
  // them all: a pipeline checkpoint holds one per layer and tp rank, 136
  // small files for 64 layers at tp 2); a file's error stays in its slot,
  // for LayerFile to report in layer order.
  void ParseLayerFiles() const;
};

}  // namespace ucp::deepspeed_zero

#endif  // UCP_FORMATS_DEEPSPEED_ZERO_ZERO_CHECKPOINT_H_
