// Writing TensorPlans into torch.save files: the plan's bytes are streamed
// into the archive record chunk by chunk (TorchWriter::AddStreamedTensor),
// so no output tensor is ever held whole in memory.
#ifndef UCP_TP_PLAN_IO_H_
#define UCP_TP_PLAN_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"
#include "tp/tensor_plan.h"

namespace ucp::tp {

// The tensor value of `plan` in `writer` (a contiguous tensor of the plan's
// shape over a storage of exactly its elements). With `cast_to` set, the
// elements are converted (round to nearest even) while streaming.
pickle::ValuePtr AddPlan(torch::TorchWriter& writer, const TensorPlan& plan);
absl::StatusOr<pickle::ValuePtr> AddPlanAs(torch::TorchWriter& writer, const TensorPlan& plan, torch::DType cast_to);

// A tensor of the first `view_numel` elements of a storage that holds the
// whole plan (1-D), as DeepSpeed saves `flat[:n]` views of a padded
// partition: the file keeps the padding, the tensor does not show it.
absl::StatusOr<pickle::ValuePtr> AddPlanView(torch::TorchWriter& writer, const TensorPlan& plan, int64_t view_numel,
                                             bool requires_grad);
// Marks a `_rebuild_tensor_v2` value as requires_grad (DeepSpeed's fp32
// master partitions are saved with requires_grad=True).
absl::Status SetRequiresGrad(pickle::Value& tensor_value, bool requires_grad);

struct WrittenFile {
  int64_t size = 0;
  std::string digest;  // hex; empty unless the writer was made with a TorchWriteOptions::digest
};
// Writes the archive and reports its size and digest, both measured while
// writing (the file is never read back).
absl::StatusOr<WrittenFile> WriteTorchFile(torch::TorchWriter& writer, const std::string& path,
                                           const pickle::Value& root);

}  // namespace ucp::tp

#endif  // UCP_TP_PLAN_IO_H_
