// ModelStatesFiles: the `mp_rank_XX_model_states.pt` files of a checkpoint
// folder (a ZeRO folder, or a universal folder that copied them), opened and
// cross-checked, with what they say about the model:
//   - topology: pp * tp = the number of files = their `mp_world_size`; tp =
//     how many leading mp ranks share mp_rank_00's param names (all tp ranks
//     of a pipeline stage hold the same names), or the layer files' tp when
//     the caller saw any; dp = `dp_world_size`;
//   - the optimizer param groups of every (stage, tp rank) from
//     `param_shapes`, and the params with the stages holding them (tied
//     params sit in several);
//   - buffer names, `args`, `universal_checkpoint_info`, `ds_config`.
// Mirrors deepspeed/runtime/engine.py:_save_checkpoint.
#ifndef UCP_DEEPSPEED_MODEL_STATES_FILES_H_
#define UCP_DEEPSPEED_MODEL_STATES_FILES_H_

#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "deepspeed/read_options.h"
#include "state/topology.h"
#include "format/pickle/value.h"
#include "format/torch/dtype.h"
#include "format/torch/torch_file.h"

namespace ucp::deepspeed {

// ZeroParam: one optimizer parameter, as the pipeline stages that hold it see it.
struct ZeroParam {
  std::string name;
  int group = 0;
  // Pipeline stages holding the param (several for tied params), ascending.
  std::vector<int> stages;
  // Index in its group's flatten order, per stage in `stages`.
  std::vector<int> index_in_group;
  // The tp slice shape on each tp rank (from param_shapes).
  std::vector<std::vector<int64_t>> tp_shapes;
  int layer = -1;        // pipeline layer index from the name, -1 if none
  std::string tied_key;  // "embed" for "tied_modules.embed.word_embeddings.weight"
};

class ModelStatesFiles {
 public:
  using GroupShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

  // `layer_files_tp`: the tp degree the folder's layer files show, 0 if none.
  static absl::StatusOr<std::unique_ptr<ModelStatesFiles>> Open(const std::string& dir, int layer_files_tp,
                                                                const ReadOptions& read = {});

  const std::string& dir() const { return dir_; }
  // tp and pp; dp is the files' dp_world_size.
  const state::Topology& topology() const { return topo_; }
  // checkpoint_parallel_dimensions.tp_degree (DeepSpeed >= 0.19.5), 0 when absent.
  int recorded_tp() const { return recorded_tp_; }
  bool pipeline() const { return pipeline_; }
  int num_groups() const { return num_groups_; }
  const torch::TorchFile& file(int pp, int tp) const { return *files_[pp * topo_.tp + tp]; }
  std::string path(int pp, int tp) const;
  const std::vector<std::string>& StageGroup(int pp, int group) const { return stage_groups_[pp][group]; }
  const GroupShapes& Shapes(int pp, int tp, int group) const { return shapes_[pp * topo_.tp + tp][group]; }
  const std::vector<ZeroParam>& params() const { return params_; }
  const ZeroParam* FindParam(const std::string& name) const;
  const std::set<std::string>& buffer_names() const { return buffer_names_; }
  // mp_rank_00's `universal_checkpoint_info` (an empty dict when absent).
  const pickle::Value& universal_checkpoint_info() const { return *uc_info_; }
  // mp_rank_00's `args` (a dict or an argparse.Namespace's attributes), or null.
  const pickle::Value* args() const { return args_; }
  // A field of `args` (the first of `keys` present), else 0 / "" / false.
  int64_t ArgInt(std::initializer_list<const char*> keys) const;
  std::string ArgString(std::initializer_list<const char*> keys) const;
  bool ArgBool(const char* key) const;
  // The pipeline partition method the training recorded in its args, or "".
  std::string RecordedPartitionMethod() const {
    return ArgString({"pipe_partition_method", "partition_method", "partition-method"});
  }
  // The lp dtype the ds_config implies (bf16.enabled, fp16.enabled, else fp32).
  torch::DType config_lp_dtype() const { return config_lp_dtype_; }
  // ds_config.tensor_parallel.autotp_size (DeepSpeed's AutoTP training), 0 when absent.
  int64_t autotp_size() const { return autotp_size_; }
  std::vector<std::string> file_names() const;

 private:
  ModelStatesFiles() = default;
  int64_t autotp_size_ = 0;
  absl::Status Load(int layer_files_tp);

  std::string dir_;
  ReadOptions read_;
  state::Topology topo_;
  bool pipeline_ = true;
  int num_groups_ = 0;
  int recorded_tp_ = 0;  // checkpoint_parallel_dimensions.tp_degree, 0 when not recorded
  std::vector<std::unique_ptr<torch::TorchFile>> files_;  // by mp rank
  std::vector<std::vector<GroupShapes>> shapes_;          // [mp][group]
  std::vector<std::vector<std::vector<std::string>>> stage_groups_;
  std::vector<ZeroParam> params_;
  absl::flat_hash_map<std::string, size_t> param_index_;
  std::set<std::string> buffer_names_;
  pickle::ValuePtr empty_dict_;
  const pickle::Value* uc_info_ = nullptr;
  const pickle::Value* args_ = nullptr;
  torch::DType config_lp_dtype_ = torch::DType::kFloat32;
};

// "2.attention.dense.weight" -> 2; "tied_modules.embed.x" -> tied key "embed".
// -1 / "" when the name has neither form.
int LayerOfName(const std::string& name);
std::string TiedKeyOfName(const std::string& name);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_MODEL_STATES_FILES_H_
