// HfState: a Hugging Face model folder (transformers' save_pretrained:
// config.json + model.safetensors, or model-0000x-of-0000y.safetensors
// shards indexed by model.safetensors.index.json) as a SlicedState at
// tp = pp = dp = 1 under a preset's checkpoint names, for `ucp reshard` into
// a DeepSpeed checkpoint at any tp/pp/dp (issue 26 part 3).
//
// The names: the preset's Hugging Face names run backwards
// (rules/hf_import.h; e.g. gpt-neox: gpt_neox.layers.3.attention.dense.weight
// -> 5.attention.dense.weight, pipeline layer 5), each checked by running the
// export's mapping forwards. The tp split is then the preset's rules', the pp
// split the writers' (the preset's import_partition_method).
// Fused params (megatron-deepspeed: q/k/v -> query_key_value grouped per kv
// head, gate/up -> dense_h_to_4h [gate; up]) are assembled lazily from their
// HF parts, group by group of rows (rules::HfImportPart); the import's args
// (import_args: swiglu) make the preset split dense_h_to_4h as 2 sub-params.
// Tied embeddings become the preset's tied module (tied_key, tied_layers).
//
// The optimizer state is fresh: every tensor is a trainable param of one
// group, its fp32 master the weight (cast to float32 when the folder holds
// bf16/fp16), exp_avg and exp_avg_sq zero, step 0 (a 0-d float32 tensor, as
// torch's Adam keeps it); DeepSpeed's defaults for the rest of the engine
// state (no facet: deepspeed::FacetOrDefaults). DeepSpeed is to load it with
// load_module_only=True (README, "A Hugging Face folder into DeepSpeed"):
// the job's own optimizer and hyper-parameters then start from the weights.
// (A plain load would map the fresh flat partitions by position, and their
// order, ucp's, need not be the model's parameters() order: measured wrong.)
//
// Refused, each naming the file and tensor: a config.json that is not a JSON
// object, no safetensors, an index whose weight_map names a file outside the
// folder or missing, a tensor the index and its file disagree on (listed in
// one and not the other, or in two files), a tensor that is not floating
// point, tensors of several dtypes, names the preset does not import, a fused
// param with a part missing or of another width, tied embeddings a preset has
// no tied module for.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto s, HfState::Open("/models/tiny-neox", {"gpt-neox"}));
//   s->info().params[0].name;  // "0.word_embeddings.weight"
#ifndef UCP_FORMATS_HF_HF_STATE_H_
#define UCP_FORMATS_HF_HF_STATE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/json/json.h"
#include "format/safetensors/safetensors.h"
#include "state/model_state.h"
#include "tp/tensor_plan.h"

namespace ucp::hf {

inline constexpr char kConfigFile[] = "config.json";
inline constexpr char kSingleFile[] = "model.safetensors";
inline constexpr char kIndexFile[] = "model.safetensors.index.json";

struct HfReadOptions {
  std::string preset;  // --preset: whose Hugging Face names to run backwards
};

class HfState : public state::SlicedState {
 public:
  static absl::StatusOr<std::unique_ptr<HfState>> Open(const std::string& dir, const HfReadOptions& options);

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<std::vector<tp::TensorPlan>> Slices(const state::ParamState& param, int stage,
                                                     const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  std::vector<std::string> InputFiles() const override;
  absl::Status VerifyInput(const std::string& path) const override;
  const std::string& dir() const override { return dir_; }

  const std::string& architecture() const { return architecture_; }
  const std::string& preset() const { return preset_; }
  // The args the imported checkpoint has (rules::HfImportPlan::args): for
  // the preset's argument-conditional rules (ResolveOptions::args).
  const pickle::Value* import_args() const { return args_.get(); }
  // The safetensors files read, in the folder's order.
  std::vector<std::string> Files() const;

 private:
  struct Part {
    std::string hf_name;
    const safetensors::SafetensorsFile* file = nullptr;
    int64_t groups = 1, start = 0, length = 0;  // rules::HfImportPart
  };
  // A checkpoint param: one HF tensor (a rename), or the parts of a fused
  // one, by start.
  struct Entry {
    std::vector<Part> parts;
    bool fused = false;
  };
  absl::StatusOr<torch::Tensor> Read(const Part& part, bool fp32) const;
  HfState() = default;
  absl::Status OpenFiles();
  absl::Status BuildInfo(const std::string& preset);

  std::string dir_, architecture_, preset_;
  json::Value config_;
  std::vector<std::unique_ptr<safetensors::SafetensorsFile>> files_;
  std::vector<std::pair<std::string, const safetensors::SafetensorsFile*>> tensors_;  // HF name, file; folder order
  std::map<std::string, Entry> entries_;  // by checkpoint name
  state::ModelInfo info_;
  state::FileValue step_;
  pickle::ValuePtr args_;
};

}  // namespace ucp::hf

#endif  // UCP_FORMATS_HF_HF_STATE_H_
