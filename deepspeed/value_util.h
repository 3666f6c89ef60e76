// Small helpers for reading DeepSpeed's pickled dicts, shared by the
// checkpoint readers of this package.
#ifndef UCP_DEEPSPEED_VALUE_UTIL_H_
#define UCP_DEEPSPEED_VALUE_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/pickle/value.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"

namespace ucp::deepspeed::internal {

// A status whose message starts with the file's path.
inline absl::Status FileError(const std::string& path, absl::StatusCode code, absl::string_view what) {
  return absl::Status(code, absl::StrCat(path, ": ", what));
}

inline int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

inline std::string ShapeStr(const std::vector<int64_t>& s) { return torch::ShapeString(s); }

// The most elements a shape read from a file may have (2^50: far beyond any
// model, far below int64 overflow in the partition math that adds them up).
inline constexpr int64_t kMaxShapeNumel = int64_t{1} << 50;

// A shape read from a file: non-negative dims whose product (computed with
// overflow checks) is at most kMaxShapeNumel. Returns the product.
inline absl::StatusOr<int64_t> CheckedShapeNumel(const std::vector<int64_t>& s, const std::string& path,
                                                 absl::string_view what) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " has a negative dimension: ", ShapeStr(s)));
    }
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxShapeNumel) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " = ", ShapeStr(s),
                                                     " has more than 2^50 elements (the product of its "
                                                     "dimensions overflows): a damaged or hostile shape"));
    }
  }
  return n;
}

// The strings of a list value (e.g. buffer_names); empty when None.
inline std::vector<std::string> StringList(const pickle::Value* v) {
  std::vector<std::string> out;
  if (v == nullptr || !(v->is(pickle::Kind::kList) || v->is(pickle::Kind::kTuple))) return out;
  for (const auto& item : v->items()) {
    if (item->is(pickle::Kind::kStr)) out.push_back(item->str());
  }
  return out;
}

// v[k0][k1]... through nested dicts; null when a level is missing.
inline const pickle::Value* DictPath(const pickle::Value* v, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (v == nullptr || !v->is(pickle::Kind::kDict)) return nullptr;
    v = v->DictGet(k);
  }
  return v;
}

// Python truthiness of a bool or int; false for anything else or null.
inline bool Truthy(const pickle::Value* v) {
  if (v == nullptr) return false;
  if (v->is(pickle::Kind::kBool) || v->is(pickle::Kind::kInt)) return v->int_value() != 0;
  return false;
}

// Checkpoint tensors are dense: a view addressing more elements than its
// storage holds (stride 0 repeats) would make a writer produce far more bytes
// than the file has, so such views are refused.
inline absl::Status CheckDense(const torch::Tensor& t, const std::string& path, absl::string_view what) {
  if (t.numel() > t.storage()->numel()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " views ", t.numel(), " elements of a storage of ",
                                                   t.storage()->numel(), " (overlapping strides)"));
  }
  return absl::OkStatus();
}

// One group's optimizer state dict ({"exp_avg": tensor, "step": ...}) split
// the way every ZeRO layout stores it: per-element tensors (in file order)
// and scalars (`step`, as a 0-dim tensor or a number; whatever is not a
// tensor). Keys that are not strings are skipped. `classify(key, t)` decides
// each tensor, with the layout's own checks: true for a per-element state,
// false for a scalar, or an error.
struct GroupStates {
  std::vector<std::pair<std::string, torch::Tensor>> per_element;
  std::vector<std::pair<std::string, pickle::ValuePtr>> scalars;
};
inline absl::StatusOr<GroupStates> SplitGroupStates(
    const torch::TorchFile& file, const pickle::Value& states,
    const std::function<absl::StatusOr<bool>(const std::string& key, const torch::Tensor& t)>& classify) {
  GroupStates out;
  for (const auto& [k, v] : states.dict_items()) {
    if (!k->is(pickle::Kind::kStr)) continue;
    if (!torch::TorchFile::IsTensor(*v)) {
      out.scalars.emplace_back(k->str(), v);
      continue;
    }
    absl::StatusOr<torch::Tensor> t = file.GetTensor(*v);
    if (!t.ok()) return t.status();
    absl::StatusOr<bool> per_element = classify(k->str(), *t);
    if (!per_element.ok()) return per_element.status();
    if (*per_element) {
      out.per_element.emplace_back(k->str(), *std::move(t));
    } else {
      out.scalars.emplace_back(k->str(), v);
    }
  }
  return out;
}

// Whether two lists of optimizer state names (exp_avg, exp_avg_sq, ...) name
// the same states. The order is not compared: DeepSpeed's own saves after a
// universal load list each rank's states in the order that rank loaded them
// (0.14.4's resaved folders: [exp_avg_sq, exp_avg] on one rank, [exp_avg,
// exp_avg_sq] on another), and every reader looks states up by name.
inline bool SameStateNames(std::vector<std::string> a, std::vector<std::string> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

// Visits the entries of param_slice_mappings[g] (a dict of param name ->
// fragment address, as DeepSpeed's ZeRO-1/2 optimizer saves it) in order;
// an error naming the file when the entry is not a dict or a key not a string.
inline absl::Status ForEachSliceMapping(const std::string& path, const pickle::Value& mapping, size_t g,
                                        const std::function<absl::Status(const std::string& name,
                                                                         const pickle::Value& address)>& visit) {
  if (!mapping.is(pickle::Kind::kDict)) {
    return FileError(path, absl::StatusCode::kInvalidArgument, absl::StrCat("param_slice_mappings[", g, "] is not a dict"));
  }
  for (const auto& [k, v] : mapping.dict_items()) {
    if (!k->is(pickle::Kind::kStr)) {
      return FileError(path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("param_slice_mappings[", g, "] has a non-string key"));
    }
    absl::Status s = visit(k->str(), *v);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The sequence_parallel_size of a model states file's ds_config (DeepSpeed's
// Ulysses); 1 when it records none (or one below 2).
inline int SequenceParallelSize(const pickle::Value& root) {
  const pickle::Value* config = DictPath(&root, {"ds_config"});
  const pickle::Value* sp = config != nullptr && config->is(pickle::Kind::kDict) ? config->DictGet("sequence_parallel_size") : nullptr;
  return sp != nullptr && sp->is(pickle::Kind::kInt) && sp->int_value() > 1 ? static_cast<int>(sp->int_value()) : 1;
}

}  // namespace ucp::deepspeed::internal

#endif  // UCP_DEEPSPEED_VALUE_UTIL_H_
