// torch::CopyTreeForWrite for a FileValue: carries client state, optimizer
// state and rng states that ucp passes through unchanged into a file being
// written.
#ifndef UCP_DEEPSPEED_TREE_COPY_H_
#define UCP_DEEPSPEED_TREE_COPY_H_

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"

namespace ucp::deepspeed {

// See torch::CopyTreeForWrite (format/torch/tree_copy.h).
absl::StatusOr<pickle::ValuePtr> CopyTreeForWrite(const state::FileValue& source, torch::TorchWriter& writer);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_TREE_COPY_H_
