#include "format/torch/dtype.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ucp::torch {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t item_size;
  const char* name;
  const char* storage_class;
  bool floating;
};

constexpr DTypeInfo kInfos[] = {
    {DType::kFloat32, 4, "float32", "FloatStorage", true},
    {DType::kFloat64, 8, "float64", "DoubleStorage", true},
    {DType::kFloat16, 2, "float16", "HalfStorage", true},
    {DType::kBFloat16, 2, "bfloat16", "BFloat16Storage", true},
    {DType::kInt8, 1, "int8", "CharStorage", false},
    {DType::kInt16, 2, "int16", "ShortStorage", false},
    {DType::kInt32, 4, "int32", "IntStorage", false},
    {DType::kInt64, 8, "int64", "LongStorage", false},
    {DType::kUInt8, 1, "uint8", "ByteStorage", false},
    {DType::kBool, 1, "bool", "BoolStorage", false},
    {DType::kComplex64, 8, "complex64", "ComplexFloatStorage", false},
    {DType::kComplex128, 16, "complex128", "ComplexDoubleStorage", false},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kInfos) {
    if (info.dtype == dtype) return info;
  }
  return kInfos[0];  // unreachable for valid enumerators
}

}  // namespace

size_t ItemSize(DType dtype) { return Info(dtype).item_size; }
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }
std::string_view StorageClassName(DType dtype) { return Info(dtype).storage_class; }
bool IsFloatingPoint(DType dtype) { return Info(dtype).floating; }

absl::StatusOr<DType> DTypeFromStorageClass(std::string_view class_name) {
  for (const DTypeInfo& info : kInfos) {
    if (class_name == info.storage_class) return info.dtype;
  }
  // torch >= 2 pickles untyped storages as UntypedStorage (bytes).
  if (class_name == "UntypedStorage") return DType::kUInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown torch storage class '", absl::string_view(class_name.data(), class_name.size()), "'"));
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  std::string n = absl::AsciiStrToLower(absl::string_view(name.data(), name.size()));
  if (n.rfind("torch.", 0) == 0) n = n.substr(6);
  for (const DTypeInfo& info : kInfos) {
    if (n == info.name) return info.dtype;
  }
  struct Alias {
    const char* alias;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"fp32", DType::kFloat32},   {"float", DType::kFloat32},      {"f32", DType::kFloat32},
      {"fp64", DType::kFloat64},   {"double", DType::kFloat64},     {"f64", DType::kFloat64},
      {"fp16", DType::kFloat16},   {"half", DType::kFloat16},       {"f16", DType::kFloat16},
      {"bf16", DType::kBFloat16},  {"short", DType::kInt16},        {"int", DType::kInt32},
      {"long", DType::kInt64},     {"byte", DType::kUInt8},         {"char", DType::kInt8},
      {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128},
  };
  for (const Alias& a : kAliases) {
    if (n == a.alias) return a.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", absl::string_view(name.data(), name.size()), "'"));
}

}  // namespace ucp::torch
