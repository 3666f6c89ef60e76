#include "format/torch/tensor.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ucp::torch {
namespace {

// torch has no hard limit; 64 keeps index arrays on the stack and bounds
// hostile inputs.
constexpr size_t kMaxDims = 64;

// DTypeName as the string_view type Debian's Abseil takes in StrCat.
absl::string_view Name(DType dtype) {
  std::string_view n = DTypeName(dtype);
  return absl::string_view(n.data(), n.size());
}

bool MulOk(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool AddOk(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

// The product of `sizes`, or nullopt on overflow.
std::optional<int64_t> CheckedNumel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (!MulOk(n, s, &n)) return std::nullopt;
  }
  return n;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

// torch's maybe_wrap_dim.
absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t ndim, const char* op) {
  int64_t min = ndim == 0 ? -1 : -ndim, max = ndim == 0 ? 0 : ndim - 1;
  if (dim < min || dim > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dimension out of range (expected to be in range of [", min, ", ", max, "], but got ",
                     dim, ")"));
  }
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

// A view with size-1 dims dropped and mergeable neighbours merged, so that
// copies run over as few, as long, inner rows as possible.
struct Layout {
  size_t ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
};

Layout Coalesce(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  Layout l;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;
    if (l.ndim > 0 && l.strides[l.ndim - 1] == sizes[i] * strides[i]) {
      l.sizes[l.ndim - 1] *= sizes[i];
      l.strides[l.ndim - 1] = strides[i];
    } else {
      l.sizes[l.ndim] = sizes[i];
      l.strides[l.ndim] = strides[i];
      ++l.ndim;
    }
  }
  return l;
}

template <size_t N>
void GatherElements(const uint8_t* src, int64_t stride_bytes, int64_t count, uint8_t* dst) {
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(dst, src, N);
    src += stride_bytes;
    dst += N;
  }
}

void Gather(const uint8_t* src, int64_t stride_bytes, int64_t count, size_t item, uint8_t* dst) {
  switch (item) {
    case 1: return GatherElements<1>(src, stride_bytes, count, dst);
    case 2: return GatherElements<2>(src, stride_bytes, count, dst);
    case 4: return GatherElements<4>(src, stride_bytes, count, dst);
    case 8: return GatherElements<8>(src, stride_bytes, count, dst);
    default: return GatherElements<16>(src, stride_bytes, count, dst);
  }
}

// torch's computeStride (aten/src/ATen/TensorUtils.cpp): the strides of a
// view of `new_sizes` over (old_sizes, old_strides), if one exists.
std::optional<std::vector<int64_t>> ComputeViewStrides(const std::vector<int64_t>& old_sizes,
                                                       const std::vector<int64_t>& old_strides,
                                                       const std::vector<int64_t>& new_sizes) {
  if (old_sizes.empty()) return std::vector<int64_t>(new_sizes.size(), 1);
  int64_t numel = 1;
  for (int64_t s : old_sizes) numel *= s;
  if (numel == 0 && old_sizes == new_sizes) return old_strides;
  std::vector<int64_t> new_strides(new_sizes.size());
  if (numel == 0) {
    for (int64_t d = static_cast<int64_t>(new_sizes.size()) - 1; d >= 0; --d) {
      new_strides[d] = d == static_cast<int64_t>(new_sizes.size()) - 1
                           ? 1
                           : std::max<int64_t>(new_sizes[d + 1], 1) * new_strides[d + 1];
    }
    return new_strides;
  }
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_sizes.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_sizes[tensor_d];
    if (tensor_d == 0 ||
        (old_sizes[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

// ---- float conversions, bitwise as torch 1.13 CPU ----

uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// c10::BFloat16 round_to_nearest_even, except for NaN, which torch's AVX
// conversion (taken for contiguous rows) writes as 0xFFFF and its scalar
// path as 0x7FC0.
uint16_t F32ToBF16(float f, uint16_t nan_bits) {
  if (std::isnan(f)) return nan_bits;
  uint32_t u = F32Bits(f);
  uint32_t bias = ((u >> 16) & 1) + 0x7FFF;
  return static_cast<uint16_t>((u + bias) >> 16);
}

float BF16ToF32(uint16_t h) { return F32FromBits(uint32_t{h} << 16); }

// c10::Half(float): IEEE round to nearest even; NaN -> sign | 0x7E00.
uint16_t F32ToF16(float f) {
  const uint32_t w = F32Bits(f);
  const uint16_t sign = static_cast<uint16_t>((w >> 16) & 0x8000);
  const uint32_t abs = w & 0x7FFFFFFF;
  if (abs > 0x7F800000) return sign | 0x7E00;          // NaN
  if (abs >= 0x477FF000) return sign | 0x7C00;         // >= 65520 rounds to inf
  if (abs < 0x38800000) {                              // below 2^-14: subnormal half
    const uint32_t e = abs >> 23;
    if (e < 102) return sign;                          // below 2^-25
    const uint32_t m = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;                    // 14..24
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t h = (abs - 0x38000000) >> 13;               // rebias 127 -> 15
  const uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

// c10 half -> float: exact; NaN payloads are kept and quieted.
float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  if (exp == 0x1F) return F32FromBits(sign | 0x7F800000 | (mant ? 0x400000 | (mant << 13) : 0));
  if (exp != 0) return F32FromBits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return F32FromBits(sign);
  // Subnormal: mant * 2^-24, exact in float.
  float v = static_cast<float>(mant) * F32FromBits(0x33800000);  // 2^-24
  return sign ? -v : v;
}

// Reads element i of a float-typed contiguous buffer as float (the
// intermediate torch uses between 16-bit types) or double.
float LoadAsFloat(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return F16ToF32(h);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return BF16ToF32(h);
    }
    default: {
      double d;
      std::memcpy(&d, p, 8);
      return static_cast<float>(d);
    }
  }
}

double LoadAsDouble(DType dtype, const uint8_t* p) {
  if (dtype == DType::kFloat64) {
    double d;
    std::memcpy(&d, p, 8);
    return d;
  }
  return static_cast<double>(LoadAsFloat(dtype, p));
}

// c10's is_non_overlapping_and_dense.
bool IsNonOverlappingAndDense(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  const size_t ndim = sizes.size();
  if (ndim == 1) return sizes[0] < 2 || strides[0] == 1;
  std::vector<size_t> perm(ndim);
  std::iota(perm.begin(), perm.end(), 0);
  std::sort(perm.begin(), perm.end(), [&](size_t a, size_t b) {
    if (sizes[a] < 2) return false;
    if (sizes[b] < 2) return true;
    return strides[a] < strides[b];
  });
  int64_t require = 1;
  for (size_t i : perm) {
    if (sizes[i] < 2) return true;
    if (strides[i] != require) return false;
    require *= sizes[i];
  }
  return true;
}

// ATen's infer_dense_strides: dense strides ordered like the input's.
std::vector<int64_t> InferDenseStrides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  const size_t ndim = sizes.size();
  if (ndim == 0) return {};
  if (ndim == 1) return {1};
  std::vector<size_t> perm(ndim);
  for (size_t i = 0; i < ndim; ++i) perm[i] = ndim - 1 - i;
  auto should_swap = [&](size_t d0, size_t d1) {
    int64_t s0 = strides[d0], s1 = strides[d1];
    if (s0 == 0 || s1 == 0) return 0;
    if (s0 < s1) return -1;
    if (s0 > s1) return 1;
    return sizes[d0] > sizes[d1] ? 1 : 0;
  };
  for (size_t i = 1; i < ndim; ++i) {
    size_t dim1 = i;
    for (size_t j = 1; j <= i; ++j) {
      size_t dim0 = i - j;
      int c = should_swap(perm[dim0], perm[dim1]);
      if (c > 0) {
        std::swap(perm[dim0], perm[dim1]);
        dim1 = dim0;
      } else if (c < 0) {
        break;
      }
    }
  }
  std::vector<int64_t> out(ndim);
  int64_t cur = 1;
  for (size_t i = 0; i < ndim; ++i) {
    out[perm[i]] = cur;
    if (sizes[perm[i]] > 1) cur *= sizes[perm[i]];
  }
  return out;
}

// Whether torch 1.13's CPU copy kernel runs its vectorized loop for
// `t.to(dtype)`, i.e. TensorIterator::has_contiguous_first_dim() after
// `_to_copy` allocated the output: a dense input gets an output with the
// same strides and the 1-d fast setup (vectorized); otherwise the output has
// InferDenseStrides and the iterator reorders dims by the output's then the
// input's strides, coalesces, and checks that dim 0 is unit-stride in both.
// Observed: a 0-dim tensor takes the scalar path.
bool TorchCopyIsVectorized(const Tensor& t) {
  const std::vector<int64_t>& sizes = t.sizes();
  const size_t ndim = sizes.size();
  if (ndim == 0) return false;
  if (IsNonOverlappingAndDense(sizes, t.strides())) return true;
  // Operand 0: output, operand 1: input; strides in elements (both sides
  // compare against their own element size, so units cancel).
  std::vector<std::vector<int64_t>> ops = {InferDenseStrides(sizes, t.strides()), t.strides()};
  std::vector<int64_t> shape = sizes;
  std::vector<size_t> perm(ndim);
  for (size_t i = 0; i < ndim; ++i) perm[i] = ndim - 1 - i;
  if (ndim == 1) perm[0] = 0;
  auto should_swap = [&](size_t d0, size_t d1) {
    for (const auto& st : ops) {
      int64_t s0 = st[d0], s1 = st[d1];
      if (s0 == 0 || s1 == 0) continue;
      if (s0 < s1) return -1;
      if (s0 > s1) return 1;
      if (shape[d0] > shape[d1]) return 1;
    }
    return 0;
  };
  for (size_t i = 1; i < ndim; ++i) {
    size_t dim1 = i;
    for (size_t dim0 = i; dim0-- > 0;) {
      int c = should_swap(perm[dim0], perm[dim1]);
      if (c > 0) {
        std::swap(perm[dim0], perm[dim1]);
        dim1 = dim0;
      } else if (c < 0) {
        break;
      }
    }
  }
  std::vector<int64_t> p_shape(ndim);
  std::vector<std::vector<int64_t>> p_ops(2, std::vector<int64_t>(ndim));
  for (size_t i = 0; i < ndim; ++i) {
    p_shape[i] = shape[perm[i]];
    for (size_t k = 0; k < 2; ++k) p_ops[k][i] = ops[k][perm[i]];
  }
  // coalesce_dimensions
  size_t prev = 0;
  for (size_t dim = 1; dim < ndim; ++dim) {
    bool can = p_shape[prev] == 1 || p_shape[dim] == 1;
    if (!can) {
      can = true;
      for (const auto& st : p_ops) can = can && p_shape[prev] * st[prev] == st[dim];
    }
    if (can) {
      if (p_shape[prev] == 1) {
        for (auto& st : p_ops) st[prev] = st[dim];
      }
      p_shape[prev] *= p_shape[dim];
    } else {
      ++prev;
      if (prev != dim) {
        for (auto& st : p_ops) st[prev] = st[dim];
        p_shape[prev] = p_shape[dim];
      }
    }
  }
  return p_ops[0][0] == 1 && p_ops[1][0] == 1;
}

}  // namespace

// ---------------------------------------------------------------------------
// Storage

std::shared_ptr<const Storage> Storage::Owned(DType dtype, std::string bytes) {
  auto holder = std::make_shared<std::string>(std::move(bytes));
  const uint8_t* data = reinterpret_cast<const uint8_t*>(holder->data());
  size_t n = holder->size();
  return std::shared_ptr<const Storage>(new Storage(dtype, data, n, std::move(holder)));
}

std::shared_ptr<const Storage> Storage::Zeros(DType dtype, int64_t numel) {
  return Owned(dtype, std::string(static_cast<size_t>(std::max<int64_t>(numel, 0)) * ItemSize(dtype), '\0'));
}

std::shared_ptr<const Storage> Storage::Borrowed(DType dtype, const uint8_t* data, size_t nbytes,
                                                 std::shared_ptr<const void> keep_alive) {
  return std::shared_ptr<const Storage>(new Storage(dtype, data, nbytes, std::move(keep_alive)));
}

// ---------------------------------------------------------------------------
// Tensor

absl::StatusOr<Tensor> Tensor::Make(std::shared_ptr<const Storage> storage, int64_t offset,
                                    std::vector<int64_t> sizes, std::vector<int64_t> strides,
                                    bool requires_grad) {
  if (storage == nullptr) return absl::InvalidArgumentError("tensor without a storage");
  if (sizes.size() != strides.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor has ", sizes.size(), " sizes but ", strides.size(),
                                                   " strides"));
  }
  if (sizes.size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat("tensor has ", sizes.size(), " dimensions (most: ", kMaxDims, ")"));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0 || strides[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor size ", ShapeString(sizes), " / stride ",
                                                     ShapeString(strides), " has a negative entry"));
    }
  }
  if (offset < 0) return absl::InvalidArgumentError(absl::StrCat("negative storage offset ", offset));
  const int64_t item = static_cast<int64_t>(ItemSize(storage->dtype()));
  std::optional<int64_t> numel = CheckedNumel(sizes);
  int64_t numel_bytes;
  if (!numel || !MulOk(*numel, item, &numel_bytes)) {
    return absl::OutOfRangeError(absl::StrCat("tensor of size ", ShapeString(sizes), " has too many elements"));
  }
  if (*numel > 0) {
    // Last addressed element: offset + sum((size - 1) * stride), checked.
    int64_t last = offset;
    for (size_t i = 0; i < sizes.size(); ++i) {
      int64_t step;
      if (!MulOk(sizes[i] - 1, strides[i], &step) || !AddOk(last, step, &last)) {
        return absl::OutOfRangeError(absl::StrCat("tensor view offset ", offset, " size ", ShapeString(sizes),
                                                  " stride ", ShapeString(strides), " overflows"));
      }
    }
    int64_t end_bytes;
    if (!AddOk(last, 1, &end_bytes) || !MulOk(end_bytes, item, &end_bytes) ||
        static_cast<uint64_t>(end_bytes) > storage->nbytes()) {
      return absl::OutOfRangeError(absl::StrCat(
          "tensor view offset ", offset, " size ", ShapeString(sizes), " stride ", ShapeString(strides),
          " reaches element ", last, " of a ", Name(storage->dtype()), " storage of ", storage->numel(),
          " elements"));
    }
  }
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.sizes_ = std::move(sizes);
  t.strides_ = std::move(strides);
  t.requires_grad_ = requires_grad;
  return t;
}

absl::StatusOr<Tensor> Tensor::FromBytes(DType dtype, std::vector<int64_t> sizes, std::string bytes) {
  std::optional<int64_t> numel = CheckedNumel(sizes);
  int64_t nbytes;
  if (!numel || *numel < 0 || !MulOk(*numel, static_cast<int64_t>(ItemSize(dtype)), &nbytes)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid tensor size ", ShapeString(sizes)));
  }
  if (static_cast<uint64_t>(nbytes) != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a ", Name(dtype), " tensor of size ", ShapeString(sizes),
                                                   " needs ", nbytes, " bytes, got ", bytes.size()));
  }
  std::vector<int64_t> strides = ContiguousStrides(sizes);
  return Make(Storage::Owned(dtype, std::move(bytes)), 0, std::move(sizes), std::move(strides));
}

Tensor Tensor::Zeros(DType dtype, std::vector<int64_t> sizes) {
  int64_t numel = CheckedNumel(sizes).value_or(0);
  Tensor t;
  t.storage_ = Storage::Zeros(dtype, numel);
  t.strides_ = ContiguousStrides(sizes);
  t.sizes_ = std::move(sizes);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes_) n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= sizes_[i];
  }
  return true;
}

const uint8_t* Tensor::data() const {
  if (numel() == 0) return storage_->data();
  return storage_->data() + static_cast<size_t>(offset_) * ItemSize(dtype());
}

absl::StatusOr<Tensor> Tensor::Narrow(int64_t dim, int64_t start, int64_t length) const {
  if (sizes_.empty()) {
    return absl::InvalidArgumentError("narrow() cannot be applied to a 0-dim tensor");
  }
  absl::StatusOr<int64_t> d = WrapDim(dim, this->dim(), "narrow");
  if (!d.ok()) return d.status();
  const int64_t size = sizes_[*d];
  if (start != size) {
    if (start < -size || start >= size) {
      return absl::OutOfRangeError(absl::StrCat("narrow: start ", start, " out of range for dimension ", *d,
                                                " of size ", size));
    }
    if (start < 0) start += size;
  }
  if (length < 0 || start > size - length) {
    return absl::OutOfRangeError(absl::StrCat("narrow: start (", start, ") + length (", length,
                                              ") exceeds dimension size (", size, ")"));
  }
  int64_t step, offset;
  if (!MulOk(start, strides_[*d], &step) || !AddOk(offset_, step, &offset)) {
    return absl::OutOfRangeError("narrow: offset overflows");
  }
  std::vector<int64_t> sizes = sizes_;
  sizes[*d] = length;
  return Make(storage_, offset, std::move(sizes), strides_, requires_grad_);
}

absl::StatusOr<Tensor> Tensor::View(std::vector<int64_t> sizes) const {
  int64_t infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      if (infer >= 0) return absl::InvalidArgumentError("view: only one dimension can be inferred");
      infer = static_cast<int64_t>(i);
    } else if (sizes[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("view: invalid shape dimension ", sizes[i]));
    } else if (!MulOk(known, sizes[i], &known)) {
      return absl::InvalidArgumentError(absl::StrCat("view: shape ", ShapeString(sizes), " is too large"));
    }
  }
  const int64_t n = numel();
  if (infer >= 0) {
    if (known == 0 || n % known != 0) {
      return absl::InvalidArgumentError(absl::StrCat("view: shape ", ShapeString(sizes),
                                                     " is invalid for input of size ", n));
    }
    sizes[infer] = n / known;
  } else if (known != n) {
    return absl::InvalidArgumentError(absl::StrCat("view: shape ", ShapeString(sizes),
                                                   " is invalid for input of size ", n));
  }
  if (sizes.size() > kMaxDims) return absl::InvalidArgumentError("view: too many dimensions");
  std::optional<std::vector<int64_t>> strides = ComputeViewStrides(sizes_, strides_, sizes);
  if (!strides) {
    return absl::InvalidArgumentError(absl::StrCat(
        "view size ", ShapeString(sizes), " is not compatible with input tensor's size ", ShapeString(sizes_),
        " and stride ", ShapeString(strides_), " (at least one dimension spans across two contiguous subspaces)"));
  }
  return Make(storage_, offset_, std::move(sizes), std::move(*strides), requires_grad_);
}

absl::StatusOr<std::vector<Tensor>> Tensor::Chunk(int64_t chunks, int64_t dim) const {
  if (chunks <= 0) return absl::InvalidArgumentError(absl::StrCat("chunk expects `chunks` > 0, got ", chunks));
  if (sizes_.empty()) return absl::InvalidArgumentError("chunk expects at least a 1-dimensional tensor");
  absl::StatusOr<int64_t> d = WrapDim(dim, this->dim(), "chunk");
  if (!d.ok()) return d.status();
  const int64_t size = sizes_[*d];
  const int64_t split = size / chunks + (size % chunks != 0 ? 1 : 0);
  std::vector<Tensor> out;
  if (split == 0 && size == 0) {
    for (int64_t i = 0; i < chunks; ++i) {
      absl::StatusOr<Tensor> t = Narrow(*d, 0, 0);
      if (!t.ok()) return t.status();
      out.push_back(*std::move(t));
    }
    return out;
  }
  const int64_t pieces = std::max<int64_t>(size / split + (size % split != 0 ? 1 : 0), 1);
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t start = i * split;
    absl::StatusOr<Tensor> t = Narrow(*d, start, std::min(split, size - start));
    if (!t.ok()) return t.status();
    out.push_back(*std::move(t));
  }
  return out;
}

absl::Status Tensor::CopyFlatRange(int64_t start, int64_t count, uint8_t* out) const {
  const int64_t n = numel();
  if (start < 0 || count < 0 || start > n || count > n - start) {
    return absl::OutOfRangeError(absl::StrCat("elements [", start, ", ", start, " + ", count,
                                              ") are outside a tensor of ", n, " elements"));
  }
  if (count == 0) return absl::OkStatus();
  const size_t item = ItemSize(dtype());
  const uint8_t* base = storage_->data() + static_cast<size_t>(offset_) * item;
  const Layout l = Coalesce(sizes_, strides_);
  if (l.ndim == 0) {
    std::memcpy(out, base, item);
    return absl::OkStatus();
  }
  int64_t idx[kMaxDims];
  int64_t rem = start;
  for (size_t d = l.ndim; d-- > 0;) {
    idx[d] = rem % l.sizes[d];
    rem /= l.sizes[d];
  }
  const size_t inner = l.ndim - 1;
  const int64_t inner_size = l.sizes[inner], inner_stride = l.strides[inner];
  int64_t left = count;
  while (left > 0) {
    int64_t pos = 0;
    for (size_t d = 0; d < l.ndim; ++d) pos += idx[d] * l.strides[d];
    const int64_t run = std::min(inner_size - idx[inner], left);
    const uint8_t* src = base + static_cast<size_t>(pos) * item;
    if (inner_stride == 1) {
      std::memcpy(out, src, static_cast<size_t>(run) * item);
    } else {
      Gather(src, inner_stride * static_cast<int64_t>(item), run, item, out);
    }
    out += static_cast<size_t>(run) * item;
    left -= run;
    idx[inner] += run;
    for (size_t d = inner; d > 0 && idx[d] == l.sizes[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
  return absl::OkStatus();
}

std::string Tensor::ContiguousBytes() const {
  std::string out(nbytes(), '\0');
  (void)CopyFlatRange(0, numel(), reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

Tensor Tensor::Contiguous() const {
  if (is_contiguous() && offset_ == 0 && nbytes() == storage_->nbytes()) return *this;
  Tensor t;
  t.storage_ = Storage::Owned(dtype(), ContiguousBytes());
  t.sizes_ = sizes_;
  t.strides_ = ContiguousStrides(sizes_);
  t.requires_grad_ = requires_grad_;
  return t;
}

bool Tensor::BitwiseEqual(const Tensor& other) const {
  if (!defined() || !other.defined()) return defined() == other.defined();
  if (dtype() != other.dtype() || sizes_ != other.sizes_) return false;
  if (is_contiguous() && other.is_contiguous()) return std::memcmp(data(), other.data(), nbytes()) == 0;
  const int64_t n = numel(), chunk = std::max<int64_t>(1, (int64_t{1} << 20) / static_cast<int64_t>(ItemSize(dtype())));
  std::string a, b;
  for (int64_t pos = 0; pos < n; pos += chunk) {
    const int64_t c = std::min(chunk, n - pos);
    a.resize(static_cast<size_t>(c) * ItemSize(dtype()));
    b.resize(a.size());
    (void)CopyFlatRange(pos, c, reinterpret_cast<uint8_t*>(a.data()));
    (void)other.CopyFlatRange(pos, c, reinterpret_cast<uint8_t*>(b.data()));
    if (a != b) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Free functions

absl::StatusOr<Tensor> Cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (tensors.empty()) return absl::InvalidArgumentError("cat: expected a non-empty list of tensors");
  for (const Tensor& t : tensors) {
    if (!t.defined()) return absl::InvalidArgumentError("cat: undefined tensor");
  }
  // torch skips legacy empty tensors of shape [0].
  auto skip = [](const Tensor& t) { return t.dim() == 1 && t.sizes()[0] == 0; };
  size_t valid = tensors.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!skip(tensors[i])) {
      valid = i;
      break;
    }
  }
  const DType dtype = tensors[valid == tensors.size() ? 0 : valid].dtype();
  if (valid == tensors.size()) return Tensor::Zeros(dtype, {0});
  const Tensor& ref = tensors[valid];
  if (ref.dim() == 0) return absl::InvalidArgumentError("cat: zero-dimensional tensor cannot be concatenated");
  absl::StatusOr<int64_t> d = WrapDim(dim, ref.dim(), "cat");
  if (!d.ok()) return d.status();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (skip(t)) continue;
    if (t.dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat("cat: tensor ", i, " is ", Name(t.dtype()),
                                                     ", expected ", Name(dtype)));
    }
    if (t.dim() != ref.dim()) {
      return absl::InvalidArgumentError(absl::StrCat("cat: tensors must have the same number of dimensions: got ",
                                                     ref.dim(), " and ", t.dim(), " (tensor ", i, ")"));
    }
    for (int64_t k = 0; k < ref.dim(); ++k) {
      if (k != *d && t.sizes()[k] != ref.sizes()[k]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cat: sizes of tensors must match except in dimension ", *d, ". Expected size ", ref.sizes()[k],
            " but got size ", t.sizes()[k], " for tensor number ", i, " in the list"));
      }
    }
    if (!AddOk(total, t.sizes()[*d], &total)) return absl::OutOfRangeError("cat: result too large");
  }
  std::vector<int64_t> sizes = ref.sizes();
  sizes[*d] = total;
  std::optional<int64_t> numel = CheckedNumel(sizes);
  int64_t nbytes;
  if (!numel || !MulOk(*numel, static_cast<int64_t>(ItemSize(dtype)), &nbytes)) {
    return absl::OutOfRangeError(absl::StrCat("cat: result of size ", ShapeString(sizes), " is too large"));
  }
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < *d; ++k) outer *= sizes[k];
  for (int64_t k = *d + 1; k < static_cast<int64_t>(sizes.size()); ++k) inner *= sizes[k];
  std::string bytes(static_cast<size_t>(nbytes), '\0');
  uint8_t* out = reinterpret_cast<uint8_t*>(bytes.data());
  const size_t item = ItemSize(dtype);
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor& t : tensors) {
      if (skip(t)) continue;
      const int64_t block = t.sizes()[*d] * inner;
      absl::Status s = t.CopyFlatRange(o * block, block, out);
      if (!s.ok()) return s;
      out += static_cast<size_t>(block) * item;
    }
  }
  return Tensor::FromBytes(dtype, std::move(sizes), std::move(bytes));
}

// The element-wise mean of `inputs` (contiguous, `n` elements of T each)
// into `out`, as torch computes sum(tensors) / len(tensors): Python's sum()
// starts from the int 0, torch adds each tensor in turn, rounding every step
// in the tensor's dtype, then divides by len().
template <typename T>
void MeanInto(const std::vector<Tensor>& inputs, int64_t n, char* out_bytes) {
  T* out = reinterpret_cast<T*>(out_bytes);
  std::fill(out, out + n, T{0});
  for (const Tensor& t : inputs) {
    const uint8_t* in = t.data();
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, in + i * sizeof(T), sizeof(T));
      out[i] = out[i] + v;
    }
  }
  const T divisor = static_cast<T>(inputs.size());
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] / divisor;
}

absl::StatusOr<Tensor> Average(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return absl::InvalidArgumentError("average of no tensors");
  const Tensor& ref = tensors[0];
  if (!ref.defined()) return absl::InvalidArgumentError("average: undefined tensor");
  const DType dtype = ref.dtype();
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    return absl::InvalidArgumentError(absl::StrCat("average supports float32 and float64, got ", Name(dtype)));
  }
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined() || t.dtype() != dtype || t.sizes() != ref.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat("average: tensor ", i, " (",
                                                     t.defined() ? Name(t.dtype()) : absl::string_view("undefined"), " ",
                                                     ShapeString(t.defined() ? t.sizes() : std::vector<int64_t>{}),
                                                     ") differs from tensor 0 (", Name(dtype), " ",
                                                     ShapeString(ref.sizes()), ")"));
    }
    inputs.push_back(t.is_contiguous() ? t : t.Contiguous());
  }
  const int64_t n = ref.numel();
  std::string bytes(ref.nbytes(), '\0');
  if (dtype == DType::kFloat32) {
    MeanInto<float>(inputs, n, bytes.data());
  } else {
    MeanInto<double>(inputs, n, bytes.data());
  }
  return Tensor::FromBytes(dtype, ref.sizes(), std::move(bytes));
}

absl::StatusOr<double> MaxAbsDiff(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return absl::InvalidArgumentError("MaxAbsDiff: undefined tensor");
  if (a.sizes() != b.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat("MaxAbsDiff: sizes ", ShapeString(a.sizes()), " and ",
                                                   ShapeString(b.sizes()), " differ"));
  }
  auto load = [](const Tensor& t, const uint8_t* p) -> std::complex<double> {
    switch (t.dtype()) {
      case DType::kFloat32:
      case DType::kFloat16:
      case DType::kBFloat16:
      case DType::kFloat64: return LoadAsDouble(t.dtype(), p);
      case DType::kInt8: return static_cast<double>(*reinterpret_cast<const int8_t*>(p));
      case DType::kUInt8:
      case DType::kBool: return static_cast<double>(*p);
      case DType::kInt16: { int16_t v; std::memcpy(&v, p, 2); return static_cast<double>(v); }
      case DType::kInt32: { int32_t v; std::memcpy(&v, p, 4); return static_cast<double>(v); }
      case DType::kInt64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
      case DType::kComplex64: { float v[2]; std::memcpy(v, p, 8); return {v[0], v[1]}; }
      case DType::kComplex128: { double v[2]; std::memcpy(v, p, 16); return {v[0], v[1]}; }
    }
    return 0.0;
  };
  const Tensor ca = a.Contiguous(), cb = b.Contiguous();
  const size_t ia = ItemSize(a.dtype()), ib = ItemSize(b.dtype());
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    std::complex<double> x = load(a, ca.data() + i * ia), y = load(b, cb.data() + i * ib);
    const bool nx = std::isnan(x.real()) || std::isnan(x.imag()), ny = std::isnan(y.real()) || std::isnan(y.imag());
    if (nx || ny) {
      if (nx != ny) return std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (x == y) continue;  // also equal infinities
    worst = std::max(worst, std::abs(x - y));
  }
  return worst;
}

absl::StatusOr<Tensor> Cast(const Tensor& t, DType dtype) {
  if (!t.defined()) return absl::InvalidArgumentError("Cast: undefined tensor");
  auto is_float = [](DType d) {
    return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 || d == DType::kBFloat16;
  };
  if (!is_float(t.dtype()) || !is_float(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("Cast supports float32/float64/float16/bfloat16, got ",
                                                   Name(t.dtype()), " -> ", Name(dtype)));
  }
  if (t.dtype() == dtype) return t;  // torch's .to() returns self
  const DType from = t.dtype();
  const Tensor src = t.Contiguous();
  const int64_t n = t.numel();
  const size_t in_item = ItemSize(from), out_item = ItemSize(dtype);
  std::string bytes(static_cast<size_t>(n) * out_item, '\0');
  uint8_t* out = reinterpret_cast<uint8_t*>(bytes.data());
  const uint8_t* in = src.data();
  // Only float32 -> bfloat16 is vectorized in torch 1.13 with a NaN encoding
  // of its own; every other pair goes through float (or double) scalars.
  const uint16_t bf16_nan = (from == DType::kFloat32 && TorchCopyIsVectorized(t)) ? 0xFFFF : 0x7FC0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = in + i * in_item;
    uint8_t* q = out + i * out_item;
    switch (dtype) {
      case DType::kFloat64: {
        double d = LoadAsDouble(from, p);
        std::memcpy(q, &d, 8);
        break;
      }
      case DType::kFloat32: {
        float f = LoadAsFloat(from, p);
        std::memcpy(q, &f, 4);
        break;
      }
      case DType::kFloat16: {
        uint16_t h = F32ToF16(LoadAsFloat(from, p));
        std::memcpy(q, &h, 2);
        break;
      }
      default: {
        uint16_t h = F32ToBF16(LoadAsFloat(from, p), bf16_nan);
        std::memcpy(q, &h, 2);
        break;
      }
    }
  }
  absl::StatusOr<Tensor> result = Tensor::FromBytes(dtype, t.sizes(), std::move(bytes));
  if (!result.ok()) return result.status();
  return Tensor::Make(result->storage(), 0, result->sizes(), result->strides(), t.requires_grad());
}

std::string ShapeString(const std::vector<int64_t>& sizes) { return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]"); }

}  // namespace ucp::torch
