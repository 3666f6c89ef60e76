#include "format/torch/tensor.h"

#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "format/torch/dtype.h"
#include "gtest/gtest.h"
#include "rapidcheck.h"
#include "rapidcheck/gtest.h"

namespace ucp::torch {
namespace {

// A float32 tensor 0, 1, 2, ... of `sizes`.
Tensor Iota(std::vector<int64_t> sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::string bytes(n * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(i);
    std::memcpy(&bytes[i * 4], &v, 4);
  }
  return *Tensor::FromBytes(DType::kFloat32, sizes, bytes);
}

std::vector<float> Values(const Tensor& t) {
  std::string b = t.ContiguousBytes();
  std::vector<float> v(b.size() / 4);
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(ItemSize(DType::kBFloat16), 2u);
  EXPECT_EQ(ItemSize(DType::kComplex128), 16u);
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(StorageClassName(DType::kBFloat16), "BFloat16Storage");
  EXPECT_EQ(StorageClassName(DType::kInt8), "CharStorage");
  EXPECT_EQ(*DTypeFromStorageClass("ByteStorage"), DType::kUInt8);
  EXPECT_EQ(*DTypeFromStorageClass("ComplexFloatStorage"), DType::kComplex64);
  EXPECT_EQ(DTypeFromStorageClass("EvilStorage").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseDType("torch.bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("fp16"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("half"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("fp32"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("long"), DType::kInt64);
  EXPECT_FALSE(ParseDType("float8").ok());
  EXPECT_TRUE(IsFloatingPoint(DType::kBFloat16));
  EXPECT_FALSE(IsFloatingPoint(DType::kInt32));
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kInt16,
                  DType::kInt32, DType::kInt64, DType::kUInt8, DType::kBool, DType::kComplex64, DType::kComplex128}) {
    EXPECT_EQ(*DTypeFromStorageClass(StorageClassName(d)), d);
    EXPECT_EQ(*ParseDType(DTypeName(d)), d);
  }
}

TEST(TensorTest, MakeValidatesBounds) {
  auto storage = Storage::Zeros(DType::kFloat32, 10);
  EXPECT_TRUE(Tensor::Make(storage, 0, {10}, {1}).ok());
  EXPECT_TRUE(Tensor::Make(storage, 4, {2, 3}, {3, 1}).ok());   // last element 4 + 3 + 2 = 9
  EXPECT_EQ(Tensor::Make(storage, 5, {2, 3}, {3, 1}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Tensor::Make(storage, 0, {11}, {1}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Tensor::Make(storage, 10, {1}, {1}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Tensor::Make(storage, -1, {1}, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::Make(storage, 0, {-1}, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::Make(storage, 0, {2}, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::Make(storage, 0, {2}, {1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::Make(nullptr, 0, {}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // Overflowing products and extents.
  const int64_t big = int64_t{1} << 62;
  EXPECT_EQ(Tensor::Make(storage, 0, {big, 4}, {1, 1}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Tensor::Make(storage, 0, {2}, {std::numeric_limits<int64_t>::max()}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Tensor::Make(storage, std::numeric_limits<int64_t>::max(), {2}, {1}).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Tensor::Make(storage, 0, {big / 2}, {1}).status().code(), absl::StatusCode::kOutOfRange);
  // Empty views are not bounds-checked (torch's set_ skips them too).
  EXPECT_TRUE(Tensor::Make(storage, 1000, {0, 5}, {5, 1}).ok());
  // 0-dim: one element at the offset.
  auto scalar = Tensor::Make(storage, 9, {}, {});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->numel(), 1);
  EXPECT_EQ(Tensor::Make(storage, 10, {}, {}).status().code(), absl::StatusCode::kOutOfRange);
  // A trailing partial element is not addressable (7-byte float storage).
  auto odd = Storage::Owned(DType::kFloat32, std::string(7, 'x'));
  EXPECT_EQ(odd->numel(), 1);
  EXPECT_TRUE(Tensor::Make(odd, 0, {1}, {1}).ok());
  EXPECT_EQ(Tensor::Make(odd, 1, {1}, {1}).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(TensorTest, FromBytesChecksSize) {
  EXPECT_TRUE(Tensor::FromBytes(DType::kInt16, {2, 3}, std::string(12, 'a')).ok());
  EXPECT_EQ(Tensor::FromBytes(DType::kInt16, {2, 3}, std::string(11, 'a')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Tensor::FromBytes(DType::kInt16, {-2}, "").ok());
}

TEST(TensorTest, ContiguityAndBytes) {
  Tensor t = Iota({3, 4});
  EXPECT_TRUE(t.is_contiguous());
  auto tt = Tensor::Make(t.storage(), 0, {4, 3}, {1, 4});  // transpose
  ASSERT_TRUE(tt.ok());
  EXPECT_FALSE(tt->is_contiguous());
  EXPECT_EQ(Values(*tt), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  // Size-1 dims do not affect contiguity (torch's rule).
  EXPECT_TRUE(Tensor::Make(t.storage(), 0, {1, 12}, {99, 1})->is_contiguous());
  Tensor c = tt->Contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_TRUE(c.BitwiseEqual(*tt));
  EXPECT_EQ(t.Contiguous().storage(), t.storage());  // no copy needed
  std::vector<uint8_t> out(3 * 4);
  ASSERT_TRUE(tt->CopyFlatRange(4, 3, out.data()).ok());
  float got[3];
  std::memcpy(got, out.data(), 12);
  EXPECT_EQ(got[0], 5);
  EXPECT_EQ(got[1], 9);
  EXPECT_EQ(got[2], 2);
  EXPECT_EQ(tt->CopyFlatRange(10, 3, out.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(tt->CopyFlatRange(-1, 1, out.data()).code(), absl::StatusCode::kOutOfRange);
}

TEST(TensorTest, NarrowLikeTorch) {
  Tensor t = Iota({4, 5});
  auto n = t.Narrow(1, 1, 3);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(n->storage_offset(), 1);
  EXPECT_EQ(Values(*n)[3], 6);
  EXPECT_EQ(t.Narrow(-1, -2, 2)->storage_offset(), 3);   // negative dim and start wrap
  EXPECT_EQ(t.Narrow(0, 4, 0)->numel(), 0);              // start == size with length 0
  EXPECT_EQ(t.Narrow(0, 3, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(t.Narrow(0, 5, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(t.Narrow(0, 0, -1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(t.Narrow(2, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, ViewLikeTorch) {
  Tensor t = Iota({4, 6});
  EXPECT_EQ(t.View({-1})->sizes(), (std::vector<int64_t>{24}));
  EXPECT_EQ(t.View({2, -1, 3})->sizes(), (std::vector<int64_t>{2, 4, 3}));
  EXPECT_EQ(t.View({5, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.View({-1, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.View({25}).status().code(), absl::StatusCode::kInvalidArgument);
  // A narrowed view can still be split along its contiguous rows...
  Tensor rows = *t.Narrow(0, 1, 2);
  auto v = rows.View({2, 2, 3});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->strides(), (std::vector<int64_t>{6, 3, 1}));
  EXPECT_EQ(v->storage_offset(), 6);
  // ...but a column slice cannot be flattened (torch raises too).
  Tensor cols = *t.Narrow(1, 0, 3);
  EXPECT_EQ(cols.View({-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cols.View({4, 3, 1}).ok());
  // Transposed views reshape when dims stay in their chunks.
  auto tt = Tensor::Make(t.storage(), 0, {6, 4}, {1, 6});
  EXPECT_TRUE(tt->View({6, 2, 2}).ok());
  EXPECT_FALSE(tt->View({24}).ok());
  // 0-dim and empty.
  Tensor scalar = *Tensor::Make(t.storage(), 3, {}, {});
  EXPECT_EQ(scalar.View({1, 1})->strides(), (std::vector<int64_t>{1, 1}));
  Tensor empty = Tensor::Zeros(DType::kFloat32, {0, 3});
  EXPECT_EQ(empty.View({3, 0})->strides(), (std::vector<int64_t>{1, 1}));
  EXPECT_FALSE(empty.View({-1, 0}).ok());
}

TEST(TensorTest, ChunkLikeTorch) {
  Tensor t = Iota({5, 2});
  auto sizes_of = [](const std::vector<Tensor>& v, int dim) {
    std::vector<int64_t> s;
    for (const Tensor& x : v) s.push_back(x.sizes()[dim]);
    return s;
  };
  EXPECT_EQ(sizes_of(*t.Chunk(2, 0), 0), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(sizes_of(*t.Chunk(4, 0), 0), (std::vector<int64_t>{2, 2, 1}));  // fewer chunks than asked
  EXPECT_EQ(sizes_of(*t.Chunk(5, 0), 0), (std::vector<int64_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(sizes_of(*t.Chunk(7, 0), 0), (std::vector<int64_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(sizes_of(*t.Chunk(2, -1), 1), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(sizes_of(*Tensor::Zeros(DType::kFloat32, {0}).Chunk(3, 0), 0), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(t.Chunk(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Chunk(2, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, CatLikeTorch) {
  Tensor a = Iota({2, 3});
  Tensor b = *Iota({2, 2}).View({2, 2});
  auto c = Cat({a, b}, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sizes(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(Values(*c), (std::vector<float>{0, 1, 2, 0, 1, 3, 4, 5, 2, 3}));
  auto r = Cat({a, a}, 0);
  EXPECT_EQ(r->sizes(), (std::vector<int64_t>{4, 3}));
  // Legacy empty [0] tensors are skipped.
  EXPECT_EQ(Cat({Tensor::Zeros(DType::kFloat32, {0}), a}, 0)->sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Cat({a, b}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Cat({a, Tensor::Zeros(DType::kInt32, {2, 3})}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Cat({}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Cat({a}, 2).status().code(), absl::StatusCode::kInvalidArgument);
  // Non-contiguous inputs.
  auto at = Tensor::Make(a.storage(), 0, {3, 2}, {1, 3});
  EXPECT_EQ(Values(*Cat({*at, *at}, 1)), (std::vector<float>{0, 3, 0, 3, 1, 4, 1, 4, 2, 5, 2, 5}));
}

TEST(TensorTest, AverageAndMaxAbsDiff) {
  Tensor a = Iota({4});
  Tensor b = *Tensor::FromBytes(DType::kFloat32, {4}, Iota({4}).ContiguousBytes());
  auto avg = Average({a, b, a});
  ASSERT_TRUE(avg.ok());
  EXPECT_TRUE(avg->BitwiseEqual(a));
  EXPECT_EQ(*MaxAbsDiff(a, b), 0.0);
  Tensor c = *Tensor::FromBytes(DType::kFloat32, {4}, std::string(16, '\0'));
  EXPECT_EQ(*MaxAbsDiff(a, c), 3.0);
  EXPECT_EQ(Average({a, Iota({5})}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Average({Tensor::Zeros(DType::kBFloat16, {2})}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MaxAbsDiff(a, Iota({5})).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, ShapeString) {
  EXPECT_EQ(ShapeString({}), "[]");
  EXPECT_EQ(ShapeString({64, 32}), "[64, 32]");
}

// ---- properties ----

struct RandomView {
  Tensor base;
  Tensor view;
};

// A random strided view (possibly transposed, narrowed, with size-1 and
// size-0 dims) over an iota storage.
rc::Gen<RandomView> GenView(int min_dim = 0) {
  return rc::gen::exec([min_dim] {
    const int ndim = *rc::gen::inRange(min_dim, 4);
    std::vector<int64_t> sizes;
    for (int i = 0; i < ndim; ++i) sizes.push_back(*rc::gen::inRange<int64_t>(0, 6));
    std::vector<int64_t> strides(ndim);
    int64_t extent = 1;
    std::vector<int> order(ndim);
    std::iota(order.begin(), order.end(), 0);
    order = *rc::gen::elementOf(std::vector<std::vector<int>>{order, std::vector<int>(order.rbegin(), order.rend())});
    for (int d : order) {
      strides[d] = extent * *rc::gen::inRange<int64_t>(1, 3);
      extent = strides[d] * std::max<int64_t>(sizes[d], 1);
    }
    const int64_t offset = *rc::gen::inRange<int64_t>(0, 4);
    Tensor base = Iota({extent + offset});
    Tensor view = *Tensor::Make(base.storage(), offset, sizes, strides);
    return RandomView{base, view};
  });
}

// Element i of the view computed from first principles.
float ElementAt(const Tensor& v, int64_t i) {
  int64_t pos = v.storage_offset();
  for (int64_t d = v.dim() - 1; d >= 0; --d) {
    pos += (i % v.sizes()[d]) * v.strides()[d];
    i /= v.sizes()[d];
  }
  float f;
  std::memcpy(&f, v.storage()->data() + pos * 4, 4);
  return f;
}

RC_GTEST_PROP(TensorProps, ContiguousBytesMatchesIndexing, ()) {
  RandomView rv = *GenView();
  std::vector<float> values = Values(rv.view);
  RC_ASSERT(static_cast<int64_t>(values.size()) == rv.view.numel());
  for (int64_t i = 0; i < rv.view.numel(); ++i) RC_ASSERT(values[i] == ElementAt(rv.view, i));
  // CopyFlatRange agrees with any sub-range.
  if (rv.view.numel() > 0) {
    int64_t start = *rc::gen::inRange<int64_t>(0, rv.view.numel());
    int64_t count = *rc::gen::inRange<int64_t>(0, rv.view.numel() - start + 1);
    std::vector<float> part(count);
    RC_ASSERT(rv.view.CopyFlatRange(start, count, reinterpret_cast<uint8_t*>(part.data())).ok());
    for (int64_t i = 0; i < count; ++i) RC_ASSERT(part[i] == values[start + i]);
  }
}

RC_GTEST_PROP(TensorProps, ChunkThenCatIsIdentity, ()) {
  RandomView rv = *GenView(1);
  int64_t dim = *rc::gen::inRange<int64_t>(0, rv.view.dim());
  int64_t chunks = *rc::gen::inRange<int64_t>(1, 7);
  auto parts = rv.view.Chunk(chunks, dim);
  RC_ASSERT(parts.ok());
  if (rv.view.sizes()[dim] == 0 && rv.view.dim() == 1) return;  // [0] pieces are skipped by cat
  auto joined = Cat(*parts, dim);
  RC_ASSERT(joined.ok());
  RC_ASSERT(joined->BitwiseEqual(rv.view));
}

RC_GTEST_PROP(TensorProps, NarrowMatchesIndexing, ()) {
  RandomView rv = *GenView(1);
  int64_t dim = *rc::gen::inRange<int64_t>(0, rv.view.dim());
  int64_t size = rv.view.sizes()[dim];
  int64_t start = *rc::gen::inRange<int64_t>(0, size + 1);
  int64_t length = *rc::gen::inRange<int64_t>(0, size - start + 1);
  auto n = rv.view.Narrow(dim, start, length);
  RC_ASSERT(n.ok());
  // Same as cat of the three pieces.
  auto before = rv.view.Narrow(dim, 0, start);
  auto after = rv.view.Narrow(dim, start + length, size - start - length);
  if (rv.view.dim() == 1) return;
  auto whole = Cat({*before, *n, *after}, dim);
  RC_ASSERT(whole.ok());
  RC_ASSERT(whole->BitwiseEqual(rv.view));
}

RC_GTEST_PROP(TensorProps, ViewOfContiguousRoundTrips, ()) {
  RandomView rv = *GenView();
  Tensor c = rv.view.Contiguous();
  auto flat = c.View({-1});
  if (c.numel() == 0) return;
  RC_ASSERT(flat.ok());
  auto back = flat->View(rv.view.sizes());
  RC_ASSERT(back.ok());
  RC_ASSERT(back->BitwiseEqual(rv.view));
}

}  // namespace
}  // namespace ucp::torch
