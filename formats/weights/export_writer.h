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
#ifndef UCP_FORMATS_WEIGHTS_EXPORT_WRITER_H_
#define UCP_FORMATS_WEIGHTS_EXPORT_WRITER_H_

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
#include "writers/target_options.h"

namespace ucp::weights {

// Which file format a weights target writes.
enum class ExportFormat { kSafetensors, kTorch };




// The shards of `tensors` (huggingface_hub's greedy split).
struct ShardSplit {
  std::vector<std::string> files;               // shard file names
  std::vector<std::vector<size_t>> tensors;     // per file: indices into the input, in order
  int64_t total_size = 0;                       // distinct storages' bytes
};
ShardSplit SplitIntoShards(const std::vector<writers::ExportTensor>& tensors, ExportFormat format, int64_t max_shard_size);

// The plan of an export (the tensors are moved in).
absl::StatusOr<std::unique_ptr<writers::Plan>> PlanExport(std::vector<writers::ExportTensor> tensors, ExportFormat format,
                                                         const writers::ExportWriteOptions& options);

// PlanExport, then RunPlan in this process.
absl::StatusOr<writers::WriteStats> WriteExport(std::vector<writers::ExportTensor> tensors, const std::string& output_folder,
                                                ExportFormat format,
                                       const writers::ExportWriteOptions& options);

}  // namespace ucp::weights

#endif  // UCP_FORMATS_WEIGHTS_EXPORT_WRITER_H_
