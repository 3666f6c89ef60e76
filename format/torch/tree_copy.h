// Carrying a pickle value tree from a file being read into a file being
// written: every tensor (a `_rebuild_tensor_v2` viewing a storage of the
// source archive) becomes a tensor of the TorchWriter, everything else
// (parameters wrapping those tensors included) is rebuilt as the same data,
// and shared references stay shared.
//
// Example:
//   TorchWriter w;
//   UCP_ASSIGN_OR_RETURN(pickle::ValuePtr copy, CopyTreeForWrite(file.get(), file->root(), w));
//   UCP_RETURN_IF_ERROR(w.WriteFile(path, *copy));
#ifndef UCP_FORMAT_TORCH_TREE_COPY_H_
#define UCP_FORMAT_TORCH_TREE_COPY_H_

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"

namespace ucp::torch {

// kInvalidArgument when the tree holds a tensor but `file` is null, a bare
// storage (a persistent id outside a tensor), or nests deeper than 1000.
absl::StatusOr<pickle::ValuePtr> CopyTreeForWrite(const TorchFile* file, const pickle::ValuePtr& root,
                                                  TorchWriter& writer);

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_TREE_COPY_H_
