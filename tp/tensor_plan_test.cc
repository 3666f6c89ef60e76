#include "tp/tensor_plan.h"

#include <cstring>
#include <numeric>

#include "gtest/gtest.h"
#include "rapidcheck.h"
#include "rapidcheck/gtest.h"

namespace ucp::tp {
namespace {

using torch::DType;
using torch::Tensor;

// A reference dense tensor of int32 values with naive index math.
struct Dense {
  std::vector<int64_t> shape;
  std::vector<int32_t> data;
};

int64_t Numel(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<int64_t>());
}

Dense MakeDense(std::vector<int64_t> shape, int32_t base) {
  Dense d{shape, std::vector<int32_t>(Numel(shape))};
  std::iota(d.data.begin(), d.data.end(), base);
  return d;
}

Tensor ToTensor(const Dense& d) {
  std::string bytes(d.data.size() * 4, '\0');
  std::memcpy(bytes.data(), d.data.data(), bytes.size());
  return *Tensor::FromBytes(DType::kInt32, d.shape, bytes);
}

std::vector<int32_t> PlanValues(const TensorPlan& p) {
  std::vector<int32_t> out(p.numel());
  EXPECT_TRUE(p.CopyFlat(0, p.numel(), reinterpret_cast<uint8_t*>(out.data())).ok());
  return out;
}

Dense NarrowDense(const Dense& d, int dim, int64_t start, int64_t len) {
  Dense out;
  out.shape = d.shape;
  out.shape[dim] = len;
  const int64_t outer = Numel({d.shape.begin(), d.shape.begin() + dim});
  const int64_t block = Numel({d.shape.begin() + dim + 1, d.shape.end()});
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < len * block; ++i) {
      out.data.push_back(d.data[(o * d.shape[dim] + start) * block + i]);
    }
  }
  return out;
}

Dense CatDense(const std::vector<Dense>& ds, int dim) {
  Dense out;
  out.shape = ds[0].shape;
  out.shape[dim] = 0;
  for (const auto& d : ds) out.shape[dim] += d.shape[dim];
  const int64_t outer = Numel({out.shape.begin(), out.shape.begin() + dim});
  const int64_t block = Numel({out.shape.begin() + dim + 1, out.shape.end()});
  for (int64_t o = 0; o < outer; ++o) {
    for (const auto& d : ds) {
      const int64_t n = d.shape[dim] * block;
      for (int64_t i = 0; i < n; ++i) out.data.push_back(d.data[o * n + i]);
    }
  }
  return out;
}

TEST(TensorPlanTest, RowCatInterleavesRows) {
  Dense a = MakeDense({2, 2}, 0);   // [[0,1],[2,3]]
  Dense b = MakeDense({2, 2}, 10);  // [[10,11],[12,13]]
  auto cat = TensorPlan::Cat({TensorPlan::FromTensor(ToTensor(a)), TensorPlan::FromTensor(ToTensor(b))}, 1);
  ASSERT_TRUE(cat.ok());
  EXPECT_EQ(cat->shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(PlanValues(*cat), (std::vector<int32_t>{0, 1, 10, 11, 2, 3, 12, 13}));
  // Narrowing back gives the second slice as one run per row.
  auto back = cat->Narrow(1, 2, 2);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(PlanValues(*back), b.data);
}

TEST(TensorPlanTest, PiecesFormOneFlatTensor) {
  Dense a = MakeDense({3}, 0);
  Dense b = MakeDense({2, 1}, 3);
  Dense c = MakeDense({1}, 5);
  auto p = TensorPlan::FromPieces(DType::kInt32, {2, 3}, {ToTensor(a), ToTensor(b), ToTensor(c)});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(PlanValues(*p), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  // Adjacent runs of different sources stay separate, runs of one source merge.
  EXPECT_EQ(p->num_runs(), 3u);
  EXPECT_FALSE(TensorPlan::FromPieces(DType::kInt32, {2, 2}, {ToTensor(a)}).ok());
  EXPECT_FALSE(TensorPlan::FromPieces(DType::kFloat32, {3}, {ToTensor(a)}).ok());
}

TEST(TensorPlanTest, ViewFlatAvoidsCopiesInsideOneRun) {
  Tensor a = ToTensor(MakeDense({4}, 0));
  Tensor b = ToTensor(MakeDense({4}, 100));
  auto p = TensorPlan::FromPieces(DType::kInt32, {8}, {a, b});
  ASSERT_TRUE(p.ok());
  std::vector<uint8_t> scratch(8 * 4);
  // Inside the second piece: a view of its own memory.
  auto inside = p->ViewFlat(5, 2, scratch.data());
  ASSERT_TRUE(inside.ok());
  EXPECT_EQ(inside->data(), b.data() + 4);
  EXPECT_EQ(inside->size(), 8u);
  // Across both pieces: copied into the scratch buffer.
  auto across = p->ViewFlat(2, 4, scratch.data());
  ASSERT_TRUE(across.ok());
  EXPECT_EQ(across->data(), scratch.data());
  std::vector<int32_t> got(4);
  std::memcpy(got.data(), across->data(), 16);
  EXPECT_EQ(got, (std::vector<int32_t>{2, 3, 100, 101}));
}

TEST(TensorPlanTest, PadDim0AddsZeroRows) {
  Dense a = MakeDense({2, 2}, 1);
  auto p = TensorPlan::FromTensor(ToTensor(a)).PadDim0(3);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(PlanValues(*p), (std::vector<int32_t>{1, 2, 3, 4, 0, 0}));
  EXPECT_FALSE(TensorPlan::FromTensor(ToTensor(a)).PadDim0(1).ok());
}

TEST(TensorPlanTest, ErrorsNameTheShapes) {
  Dense a = MakeDense({2, 3}, 0);
  TensorPlan p = TensorPlan::FromTensor(ToTensor(a));
  EXPECT_EQ(p.Narrow(1, 2, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(p.Narrow(2, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = TensorPlan::Cat({p, TensorPlan::FromTensor(ToTensor(MakeDense({3, 3}, 0)))}, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("[3, 3]"), std::string::npos) << bad.status();
  EXPECT_FALSE(p.Reshape({4, 2}).ok());
  EXPECT_TRUE(p.Reshape({3, -1}).ok());
}

TEST(TensorPlanTest, WholeContiguousSourceIsRecognized) {
  Tensor t = ToTensor(MakeDense({4, 4}, 0));
  TensorPlan p = TensorPlan::FromTensor(t);
  EXPECT_TRUE(p.IsWholeContiguousSource());
  EXPECT_FALSE(p.Narrow(0, 0, 2)->IsWholeContiguousSource());
  auto parts = p.Chunk(2, 1);
  ASSERT_TRUE(parts.ok());
  auto whole = TensorPlan::Cat(*parts, 1);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(whole->IsWholeContiguousSource());  // runs re-merge into the source
}

// Random compositions of narrow and cat agree with the naive reference.
// A deferred source stands for `d` and counts how often it is opened.
TensorPlan CountingDeferred(const Dense& d, std::shared_ptr<int> opens, std::string file) {
  TensorPlan::DeferredSource s;
  s.dtype = DType::kInt32;
  s.shape = d.shape;
  s.label = file;
  s.files = {file};
  s.open = [d, opens]() -> absl::StatusOr<TensorPlan> {
    ++*opens;
    return TensorPlan::FromTensor(ToTensor(d));
  };
  return TensorPlan::Deferred(std::move(s));
}

TEST(TensorPlanTest, DeferredSourcesOpenOnFirstReadOnly) {
  const Dense a = MakeDense({4, 3}, 0), b = MakeDense({2, 3}, 100);
  auto opens_a = std::make_shared<int>(0), opens_b = std::make_shared<int>(0);
  TensorPlan pa = CountingDeferred(a, opens_a, "a.pt"), pb = CountingDeferred(b, opens_b, "b.pt");
  // Cat, narrow, reshape and flat ranges: planning opens nothing.
  auto cat = TensorPlan::Cat({pa, pb, TensorPlan::FromTensor(ToTensor(MakeDense({1, 3}, 200)))}, 0);
  ASSERT_TRUE(cat.ok());
  auto flat = cat->Reshape({21});
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(*opens_a + *opens_b, 0);
  EXPECT_FALSE(pa.IsWholeContiguousSource());
  EXPECT_EQ(pa.source_tensor(), nullptr);
  // Which sources a range reads, without opening them.
  std::vector<TensorPlan::DeferredUse> uses = flat->DeferredIn(10, 6);  // a[10..12), b[0..4)
  ASSERT_EQ(uses.size(), 2u);
  EXPECT_EQ(uses[0].source->files, std::vector<std::string>{"a.pt"});
  EXPECT_EQ(uses[0].offset, 10);
  EXPECT_EQ(uses[0].count, 2);
  EXPECT_EQ(uses[1].source->files, std::vector<std::string>{"b.pt"});
  EXPECT_EQ(uses[1].offset, 0);
  EXPECT_EQ(uses[1].count, 4);
  EXPECT_TRUE(flat->DeferredIn(18, 3).empty());  // the eager tensor only
  EXPECT_EQ(flat->DeferredIn(15, 100).size(), 1u);  // clamped to the plan
  EXPECT_EQ(*opens_a + *opens_b, 0);
  // Reading b only opens b, once, however often it is read.
  std::vector<int32_t> out(3);
  ASSERT_TRUE(flat->CopyFlat(14, 3, reinterpret_cast<uint8_t*>(out.data())).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{102, 103, 104}));
  EXPECT_EQ(*opens_a, 0);
  EXPECT_EQ(*opens_b, 1);
  std::vector<int32_t> want = a.data;
  want.insert(want.end(), b.data.begin(), b.data.end());
  for (int i = 200; i < 203; ++i) want.push_back(i);
  EXPECT_EQ(PlanValues(*flat), want);
  EXPECT_EQ(*opens_a, 1);
  EXPECT_EQ(*opens_b, 1);
  // A view inside one deferred run comes from the opened plan.
  std::vector<uint8_t> scratch(8);
  auto view = flat->ViewFlat(1, 2, scratch.data());
  ASSERT_TRUE(view.ok());
  int32_t got[2];
  std::memcpy(got, view->data(), 8);
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[1], 2);
}

TEST(TensorPlanTest, DeferredSourceErrorsNameTheSource) {
  TensorPlan::DeferredSource s;
  s.dtype = DType::kInt32;
  s.shape = {2, 3};
  s.label = "zero/w/exp_avg.pt";
  s.open = [] { return absl::StatusOr<TensorPlan>(TensorPlan::FromTensor(ToTensor(MakeDense({3, 2}, 0)))); };
  TensorPlan wrong_shape = TensorPlan::Deferred(s);
  std::vector<int32_t> out(6);
  absl::Status st = wrong_shape.CopyFlat(0, 6, reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("zero/w/exp_avg.pt: opened as int32 [3, 2], planned as int32 [2, 3]"), std::string::npos)
      << st;
  s.open = [] { return absl::StatusOr<TensorPlan>(absl::DataLossError("zero/w/exp_avg.pt: truncated")); };
  TensorPlan failing = TensorPlan::Deferred(s);
  // The error, every time it is read.
  for (int i = 0; i < 2; ++i) {
    st = failing.CopyFlat(0, 6, reinterpret_cast<uint8_t*>(out.data()));
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  }
  std::vector<uint8_t> scratch(24);
  EXPECT_EQ(failing.ViewFlat(0, 2, scratch.data()).status().code(), absl::StatusCode::kDataLoss);
}

RC_GTEST_PROP(TensorPlanProperty, NarrowCatMatchReference, ()) {
  const int ndim = *rc::gen::inRange(1, 4);
  std::vector<int64_t> shape;
  for (int i = 0; i < ndim; ++i) shape.push_back(*rc::gen::inRange<int64_t>(1, 6));
  const int parts = *rc::gen::inRange(1, 4);
  const int cat_dim = *rc::gen::inRange(0, ndim);
  std::vector<Dense> dense;
  std::vector<TensorPlan> plans;
  for (int i = 0; i < parts; ++i) {
    std::vector<int64_t> s = shape;
    s[cat_dim] = *rc::gen::inRange<int64_t>(1, 5);
    dense.push_back(MakeDense(s, 1000 * i));
    // Half the parts come as two flat pieces, as ZeRO fragments do.
    Tensor t = ToTensor(dense.back());
    if (t.numel() > 1 && *rc::gen::arbitrary<bool>()) {
      auto flat = *t.View({t.numel()});
      const int64_t cut = *rc::gen::inRange<int64_t>(1, t.numel());
      plans.push_back(*TensorPlan::FromPieces(DType::kInt32, s, {*flat.Narrow(0, 0, cut),
                                                                 *flat.Narrow(0, cut, t.numel() - cut)}));
    } else {
      plans.push_back(TensorPlan::FromTensor(t));
    }
  }
  Dense ref = CatDense(dense, cat_dim);
  auto plan = TensorPlan::Cat(plans, cat_dim);
  RC_ASSERT(plan.ok());
  RC_ASSERT(plan->shape() == ref.shape);
  RC_ASSERT(PlanValues(*plan) == ref.data);
  const int nd = *rc::gen::inRange(0, ndim);
  const int64_t start = *rc::gen::inRange<int64_t>(0, ref.shape[nd]);
  const int64_t len = *rc::gen::inRange<int64_t>(0, ref.shape[nd] - start + 1);
  Dense ref_n = NarrowDense(ref, nd, start, len);
  auto n = plan->Narrow(nd, start, len);
  RC_ASSERT(n.ok());
  RC_ASSERT(PlanValues(*n) == ref_n.data);
  // Any flat sub-range copies the same elements.
  if (n->numel() > 0) {
    const int64_t fs = *rc::gen::inRange<int64_t>(0, n->numel());
    const int64_t fc = *rc::gen::inRange<int64_t>(0, n->numel() - fs + 1);
    std::vector<int32_t> sub(fc);
    RC_ASSERT(n->CopyFlat(fs, fc, reinterpret_cast<uint8_t*>(sub.data())).ok());
    RC_ASSERT(std::equal(sub.begin(), sub.end(), ref_n.data.begin() + fs));
  }
}

}  // namespace
}  // namespace ucp::tp
