// Writes plain weights (no optimizer state) the way Hugging Face and
// DeepSpeed's zero_to_fp32.py lay them out, as a plan (plan.h):
//
//   safetensors  model.safetensors, or model-00001-of-0000N.safetensors ...
//                + model.safetensors.index.json
//   torch        pytorch_model.bin, or pytorch_model-00001-of-0000N.bin ...
//                + pytorch_model.bin.index.json
//   plus any extra files (config.json), written at commit.
//
// Shards follow huggingface_hub's split_torch_state_dict_into_shards
// (serialization/_base.py), which zero_to_fp32.py (>= 0.15.3) and
// transformers' save_pretrained use: one greedy pass in tensor order, a
// tensor larger than the limit gets a shard of its own numbered before the
// open one, tied aliases (same storage) follow their owner's shard and add
// no size, sizes decimal ("5GB" = 5e9 bytes), names `-%05d-of-%05d`, an
// index only when there are several shards, written as
// json.dumps({"metadata": {"total_size": N}, "weight_map": {...}},
// indent=2, sort_keys=True) + "\n".
//
// Safetensors files are laid out before any data exists
// (format/safetensors), created at full size in Prepare, and filled by one
// unit per tensor (or run of small tensors) with pwrite, so one file is
// written by all threads. A tied alias is not written twice (safetensors
// refuses two names on one byte range): the file's __metadata__ records
// alias -> owner, as safetensors' save_model does. Torch files are one unit
// per shard (TorchWriter, storages filled by several threads); an alias is
// the owner's tensor under a second key (one storage, as torch.save keeps
// tied weights), readable with torch.load(weights_only=True).
#ifndef UCP_WRITERS_EXPORT_WRITER_H_
#define UCP_WRITERS_EXPORT_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "format/torch/dtype.h"
#include "tp/tensor_plan.h"
#include "writers/plan.h"

namespace ucp::writers {

// One tensor of an export.
struct ExportTensor {
  std::string name;
  torch::DType dtype = torch::DType::kFloat32;  // as written
  std::vector<int64_t> shape;
  // Its value, of `shape`: exactly `dtype`, or any real dtype when `dtype` is
  // floating (converted while streaming: floats round to nearest even,
  // integers and bools as torch's .float()). Called when the unit writing the
  // tensor runs.
  std::function<absl::StatusOr<tp::TensorPlan>()> source;
  // Tied names of the same tensor, written after every other tensor of the
  // owner's shard.
  std::vector<std::string> aliases;
  std::vector<state::InputRange> inputs;  // what `source` reads

  int64_t nbytes() const;
};

enum class ExportFormat { kSafetensors, kTorch };

struct ExportWriteOptions {
  ExportFormat format = ExportFormat::kSafetensors;
  // Bytes per shard (huggingface_hub semantics); 0 = everything in one file.
  int64_t max_shard_size = 5'000'000'000;
  // Files written beside the weights at commit (name, contents), e.g. config.json.
  std::vector<std::pair<std::string, std::string>> extra_files;
  int num_threads = 0;  // 0 = all cores
  bool overwrite = false;
  // The source checkpoint folder(s) the output must stay apart from, and
  // whether a latest file in the input's root may be repointed (RunOptions).
  std::vector<std::string> inputs;
  bool update_latest = false;
  bool keep_temp_folder = false;
  ProgressFn progress;
};

// "5GB" -> 5000000000 as huggingface_hub's parse_size_to_int reads it: an
// integer is bytes; else a number followed by KB, MB, GB or TB (decimal,
// case-insensitive), the product truncated to an integer.
absl::StatusOr<int64_t> ParseShardSize(const std::string& text);

// The shards of `tensors` (huggingface_hub's greedy split).
struct ShardSplit {
  std::vector<std::string> files;               // shard file names
  std::vector<std::vector<size_t>> tensors;     // per file: indices into the input, in order
  int64_t total_size = 0;                       // distinct storages' bytes
};
ShardSplit SplitIntoShards(const std::vector<ExportTensor>& tensors, ExportFormat format, int64_t max_shard_size);

// The plan of an export (the tensors are moved in).
absl::StatusOr<std::unique_ptr<Plan>> PlanExport(std::vector<ExportTensor> tensors, const ExportWriteOptions& options);

// PlanExport, then RunPlan in this process.
absl::StatusOr<WriteStats> WriteExport(std::vector<ExportTensor> tensors, const std::string& output_folder,
                                       const ExportWriteOptions& options);

}  // namespace ucp::writers

#endif  // UCP_WRITERS_EXPORT_WRITER_H_
