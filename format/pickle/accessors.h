// Typed views of the values DeepSpeed checkpoints hold, over the generic
// pickle value model, and builders that encode them as DeepSpeed 0.14.4 /
// torch 1.13 do (see ../shared/docs/FORMAT.md, "How objects are encoded").
//
// Every accessor returns kInvalidArgument naming what was expected and what
// was found when the value has another shape.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(std::vector<int64_t> shape, AsTorchSize(*v));
//   UCP_ASSIGN_OR_RETURN(FragmentAddress a, AsFragmentAddress(*frag));
#ifndef UCP_FORMAT_PICKLE_ACCESSORS_H_
#define UCP_FORMAT_PICKLE_ACCESSORS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"

namespace ucp::pickle {

// ---- generic ----
// `what` names the value in error messages, e.g. "optimizer_state_dict.zero_stage".
absl::StatusOr<int64_t> AsInt(const Value& v, std::string_view what);
absl::StatusOr<double> AsFloat(const Value& v, std::string_view what);  // int or float
absl::StatusOr<bool> AsBool(const Value& v, std::string_view what);
absl::StatusOr<std::string> AsStr(const Value& v, std::string_view what);
// A dict (plain or OrderedDict) field by string key; kNotFound when absent.
absl::StatusOr<const Value*> GetField(const Value& dict, std::string_view key, std::string_view what);
// A tuple or list.
absl::StatusOr<const std::vector<ValuePtr>*> AsSequence(const Value& v, std::string_view what);
bool IsOrderedDict(const Value& v);

// ---- torch.Size ----
// Accepts torch.Size((d0, d1, ...)) and a plain tuple/list of ints.
absl::StatusOr<std::vector<int64_t>> AsTorchSize(const Value& v, std::string_view what = "torch.Size");
ValuePtr MakeTorchSize(const std::vector<int64_t>& dims);

// ---- deepspeed.utils.tensor_fragment.fragment_address ----
struct FragmentAddress {
  int64_t numel = 0;
  int64_t start = 0;
};
absl::StatusOr<FragmentAddress> AsFragmentAddress(const Value& v, std::string_view what = "fragment_address");
// EMPTY_TUPLE NEWOBJ + BUILD {numel, start}, as DeepSpeed writes it.
ValuePtr MakeFragmentAddress(int64_t numel, int64_t start);

// ---- deepspeed.runtime.fp16.loss_scaler.LossScaler / DynamicLossScaler ----
struct LossScalerInfo {
  std::string class_name;  // LossScaler or DynamicLossScaler
  double cur_scale = 1.0;
  bool dynamic = false;
  const Value* state = nullptr;  // the whole attribute dict
};
absl::StatusOr<LossScalerInfo> AsLossScaler(const Value& v, std::string_view what = "loss_scaler");
// A static LossScaler (EMPTY_TUPLE NEWOBJ + BUILD {cur_scale, dynamic: False}),
// as DeepSpeed's fp32/bf16 ZeRO optimizers save it.
ValuePtr MakeLossScaler(double cur_scale = 1.0);

// ---- deepspeed.runtime.zero.config.ZeroStageEnum ----
// Both encodings: ZeroStageEnum(1) and getattr(ZeroStageEnum, 'optimizer_states');
// a plain int is accepted too. Stages outside 0-3 are kInvalidArgument.
absl::StatusOr<int> AsZeroStage(const Value& v, std::string_view what = "zero_stage");
enum class EnumEncoding { kCall, kGetattr };
// The getattr encoding needs a stage name: for a stage outside 0-3 it falls
// back to kCall. (`getattr` is spelled `builtins`, the writer writes `__builtin__`.)
ValuePtr MakeZeroStage(int stage, EnumEncoding encoding = EnumEncoding::kCall);
// The encoding of a ZeroStageEnum value (kGetattr for getattr(...), else
// kCall): a writer changing the stage keeps the source's (its Python's).
EnumEncoding ZeroStageEncoding(const Value& v);
// disabled, optimizer_states, gradients, weights
absl::StatusOr<std::string> ZeroStageName(int stage);

// ---- argparse.Namespace ----
// The attribute dict of an argparse.Namespace object (its BUILD state; an
// empty dict when it has none). Accepts NEWOBJ (protocol 2+) and
// copyreg._reconstructor (protocol 0/1) encodings.
absl::StatusOr<const Value*> AsNamespace(const Value& v, std::string_view what = "args");

// ---- numpy arrays (numpy.core.multiarray._reconstruct + BUILD) ----
struct NumpyArray {
  std::string dtype;  // numpy dtype str with byte order, e.g. "<u4", "|u1", "<f8"
  std::vector<int64_t> shape;
  bool fortran_order = false;
  std::string data;  // raw bytes
};
// Accepts `numpy.core.multiarray._reconstruct` + BUILD (protocols 0-4; also
// `numpy._core` as numpy 2 spells it) and `numpy.core.numeric._frombuffer`
// (protocol 5). Only plain dtypes (no fields, no objects); the data size must
// equal numel * itemsize.
absl::StatusOr<NumpyArray> AsNumpyArray(const Value& v, std::string_view what = "ndarray");
// The protocol 2 encoding numpy 1.x writes (as in torch checkpoints' RNG
// states). kInvalidArgument for a dtype other than [<>|=][biufcSV]N or a
// data size that does not match the shape. `numpy2`: the module numpy 2
// pickles it from (numpy._core.multiarray); the bytes are otherwise the same.
absl::StatusOr<ValuePtr> MakeNumpyArray(const NumpyArray& array, bool numpy2 = false);

// ---- set / frozenset ----
absl::StatusOr<const std::vector<ValuePtr>*> AsSet(const Value& v, std::string_view what = "set");

}  // namespace ucp::pickle

#endif  // UCP_FORMAT_PICKLE_ACCESSORS_H_
