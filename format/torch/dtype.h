// Element types of torch storages and tensors, with their torch 1.13 names
// (`torch.float32`, storage class `FloatStorage`) and sizes.
#ifndef UCP_FORMAT_TORCH_DTYPE_H_
#define UCP_FORMAT_TORCH_DTYPE_H_

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"

namespace ucp::torch {

enum class DType : unsigned char {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kBool,
  kComplex64,
  kComplex128,
};

size_t ItemSize(DType dtype);
// "float32", "bfloat16", ... (torch's name without the "torch." prefix).
std::string_view DTypeName(DType dtype);
// "FloatStorage", "BFloat16Storage", ... as pickled by torch 1.13.
std::string_view StorageClassName(DType dtype);
absl::StatusOr<DType> DTypeFromStorageClass(std::string_view class_name);
// Accepts "float32", "torch.float32", "fp32", "bf16", "fp16", "half", ...
absl::StatusOr<DType> ParseDType(std::string_view name);
bool IsFloatingPoint(DType dtype);

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_DTYPE_H_
