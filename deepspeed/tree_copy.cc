#include "deepspeed/tree_copy.h"

#include "format/torch/tree_copy.h"

namespace ucp::deepspeed {

absl::StatusOr<pickle::ValuePtr> CopyTreeForWrite(const state::FileValue& source, torch::TorchWriter& writer) {
  return torch::CopyTreeForWrite(source.file.get(), source.value, writer);
}

}  // namespace ucp::deepspeed
