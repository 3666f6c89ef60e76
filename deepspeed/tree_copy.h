// Carrying pickle value trees from a file being read into a file being
// written: tensors (views into the source archive) become tensors of the
// TorchWriter, everything else is copied as data, shared references stay
// shared. Used for client state, optimizer state and rng states that ucp
// passes through unchanged.
#ifndef UCP_DEEPSPEED_TREE_COPY_H_
#define UCP_DEEPSPEED_TREE_COPY_H_

#include "absl/status/statusor.h"
#include "deepspeed/model_state.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"

namespace ucp::deepspeed {

// kInvalidArgument when the tree holds a tensor but `source.file` is null, or
// a bare storage (a persistent id outside a tensor).
absl::StatusOr<pickle::ValuePtr> CopyTreeForWrite(const FileValue& source, torch::TorchWriter& writer);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_TREE_COPY_H_
