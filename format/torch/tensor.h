// Storages and strided tensor views over them, without libtorch.
//
// A `Storage` is the immutable bytes of one torch storage: either a range of
// a memory-mapped checkpoint file (zero-copy; the mapping stays alive while
// any storage or tensor refers to it) or bytes the process owns. A `Tensor` is
// a view: (storage, offset, sizes, strides) in elements, exactly torch's
// `_rebuild_tensor_v2` arguments, validated on construction so that every
// element it addresses lies inside the storage (checked arithmetic).
//
// The operations are the ones the converter and loader need (narrow, view,
// chunk, cat, flatten to bytes, bitwise compare). They copy bytes only; the
// one arithmetic operation, `Average`, is IEEE float32/float64 exactly as
// Python's `sum(slices) / len(slices)` computes it in torch.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(Tensor w, file->GetTensor(*value));
//   UCP_ASSIGN_OR_RETURN(std::vector<Tensor> parts, w.Chunk(2, /*dim=*/1));
//   std::string bytes = parts[0].ContiguousBytes();
#ifndef UCP_FORMAT_TORCH_TENSOR_H_
#define UCP_FORMAT_TORCH_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "format/torch/dtype.h"

namespace ucp::torch {

// Storage: bytes of `numel` elements of `dtype`.
class Storage {
 public:
  // Bytes the storage owns.
  static std::shared_ptr<const Storage> Owned(DType dtype, std::string bytes);
  // Zero-filled owned storage of `numel` elements.
  static std::shared_ptr<const Storage> Zeros(DType dtype, int64_t numel);
  // A view of `nbytes` at `data`, kept valid by `keep_alive` (e.g. a mapping).
  static std::shared_ptr<const Storage> Borrowed(DType dtype, const uint8_t* data, size_t nbytes,
                                                 std::shared_ptr<const void> keep_alive);

  DType dtype() const { return dtype_; }
  int64_t numel() const { return static_cast<int64_t>(nbytes_ / ItemSize(dtype_)); }
  size_t nbytes() const { return nbytes_; }
  const uint8_t* data() const { return data_; }

 private:
  Storage(DType dtype, const uint8_t* data, size_t nbytes, std::shared_ptr<const void> keep_alive)
      : dtype_(dtype), data_(data), nbytes_(nbytes), keep_alive_(std::move(keep_alive)) {}
  DType dtype_;
  const uint8_t* data_;
  size_t nbytes_;
  std::shared_ptr<const void> keep_alive_;
};

class Tensor {
 public:
  Tensor() = default;
  // Validates that every addressed element lies in the storage (kOutOfRange
  // otherwise) and that sizes/strides are non-negative (kInvalidArgument).
  static absl::StatusOr<Tensor> Make(std::shared_ptr<const Storage> storage, int64_t offset,
                                     std::vector<int64_t> sizes, std::vector<int64_t> strides,
                                     bool requires_grad = false);
  // A contiguous tensor over a fresh owned storage holding `bytes`
  // (bytes.size() must be numel(sizes) * ItemSize(dtype)).
  static absl::StatusOr<Tensor> FromBytes(DType dtype, std::vector<int64_t> sizes, std::string bytes);
  static Tensor Zeros(DType dtype, std::vector<int64_t> sizes);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return storage_->dtype(); }
  const std::shared_ptr<const Storage>& storage() const { return storage_; }
  int64_t storage_offset() const { return offset_; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * ItemSize(dtype()); }
  bool requires_grad() const { return requires_grad_; }
  bool is_contiguous() const;
  // Pointer to element 0 (the storage offset applied).
  const uint8_t* data() const;

  // ---- views (no copy) ----
  absl::StatusOr<Tensor> Narrow(int64_t dim, int64_t start, int64_t length) const;
  // Reshape of a contiguous tensor; one size may be -1.
  absl::StatusOr<Tensor> View(std::vector<int64_t> sizes) const;
  // torch.chunk: ceil(size/n) per chunk, the last one possibly smaller.
  absl::StatusOr<std::vector<Tensor>> Chunk(int64_t chunks, int64_t dim) const;

  // ---- copies ----
  // Row-major bytes of the view.
  std::string ContiguousBytes() const;
  // Elements [start, start + count) of the row-major flattening, into `out`
  // (count * ItemSize bytes). Used to cut ZeRO fragments out of a view.
  absl::Status CopyFlatRange(int64_t start, int64_t count, uint8_t* out) const;
  // This view as a contiguous tensor on an owned storage (no copy when it
  // already is contiguous and covers its whole storage).
  Tensor Contiguous() const;

  bool BitwiseEqual(const Tensor& other) const;  // same dtype, sizes, bytes

 private:
  std::shared_ptr<const Storage> storage_;
  int64_t offset_ = 0;
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;
  bool requires_grad_ = false;
};

// torch.cat: all tensors same dtype and same sizes except on `dim`.
absl::StatusOr<Tensor> Cat(const std::vector<Tensor>& tensors, int64_t dim);
// sum(tensors) / len(tensors), element-wise, left to right, starting from 0
// as Python's sum() does; float32/float64 only (kInvalidArgument otherwise).
absl::StatusOr<Tensor> Average(const std::vector<Tensor>& tensors);
// Largest |a - b| over elements (as double); for messages about mismatches.
absl::StatusOr<double> MaxAbsDiff(const Tensor& a, const Tensor& b);
// Round-to-nearest-even cast between float types (float32 <-> bfloat16,
// float16, float64), bitwise as torch's `Tensor.to(dtype)` on CPU.
// The result is contiguous; a cast to the same dtype returns `t` itself.
// NaN encodings follow torch 1.13 too: float32 -> bfloat16 writes 0xFFFF
// when torch's vectorized copy loop runs (any non-overlapping dense view,
// and most others; modelled on TensorIterator) and 0x7FC0 on its scalar
// path (0-dim, strided rows); -> float16 writes sign|0x7E00; 16-bit -> 32
// keeps payloads (quieted). From float64 torch's NaN encoding depends on
// vector width and thread split; here it is that of float32 scalars.
absl::StatusOr<Tensor> Cast(const Tensor& t, DType dtype);

std::string ShapeString(const std::vector<int64_t>& sizes);  // "[64, 32]"

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_TENSOR_H_
