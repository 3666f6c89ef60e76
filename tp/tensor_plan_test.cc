#include "tp/tensor_plan.h"

#include <cstring>
#include <numeric>

#include "base/fs.h"
#include "format/torch/crc32.h"
#include "format/torch/mapped_file.h"
#include "format/torch/read_coverage.h"
#include "format/torch/test_util.h"
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

// A file of int32 values base, base + 1, ... mapped, as checkpoint readers map
// their inputs, and the same values in memory.
struct MappedInts {
  std::shared_ptr<const torch::MappedFile> file;
  std::vector<int32_t> values;
};

MappedInts MapInts(const std::string& name, int64_t n, int32_t base) {
  MappedInts m;
  m.values.resize(static_cast<size_t>(n));
  std::iota(m.values.begin(), m.values.end(), base);
  const std::string path = torch::testing::TempPath(name);
  std::string bytes(m.values.size() * 4, '\0');
  std::memcpy(bytes.data(), m.values.data(), bytes.size());
  EXPECT_TRUE(WriteFileAtomic(path, bytes).ok()) << path;
  m.file = *torch::MappedFile::Open(path);
  return m;
}

// Elements [offset, offset + numel(shape)) of the mapping as a tensor.
Tensor MappedTensor(const MappedInts& m, int64_t offset, std::vector<int64_t> shape) {
  auto storage = torch::Storage::Borrowed(DType::kInt32, m.file->data(), m.file->size(), m.file);
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  return *Tensor::Make(storage, offset, shape, strides);
}

// The same elements, copied into memory.
Tensor MemoryTensor(const MappedInts& m, int64_t offset, std::vector<int64_t> shape) {
  std::string bytes(static_cast<size_t>(Numel(shape)) * 4, '\0');
  std::memcpy(bytes.data(), m.values.data() + offset, bytes.size());
  return *Tensor::FromBytes(DType::kInt32, shape, bytes);
}

// Windows of CopyFlat read large dense spans of a mapped source into a buffer
// (staged) and copy from there; a deferred source read inside a window stages
// its own spans in a buffer of its own. Cat along dim 1: each 1 MiB window
// holds 4 output rows of 256 KiB, alternating 128 KiB of `a` (its rows, one
// staged span of 512 KiB) and 128 KiB of the deferred `b`, whose plan is
// itself two mapped halves of 64 KiB per row (staged at the next depth).
TEST(TensorPlanTest, StagedWindowsCopyTheSourceBytes) {
  const int64_t rows = 40;
  const MappedInts m = MapInts("staged.bin", rows * 32768 * 2, 7);
  auto build = [&](bool mapped) {
    auto t = [&](int64_t offset, std::vector<int64_t> shape) {
      return mapped ? MappedTensor(m, offset, shape) : MemoryTensor(m, offset, shape);
    };
    TensorPlan a = TensorPlan::FromTensor(t(0, {rows, 32768}));
    TensorPlan b1 = TensorPlan::FromTensor(t(rows * 32768, {rows, 16384}));
    TensorPlan b2 = TensorPlan::FromTensor(t(rows * 32768 + rows * 16384, {rows, 16384}));
    TensorPlan::DeferredSource d;
    d.dtype = DType::kInt32;
    d.shape = {rows, 32768};
    d.label = "b.pt";
    d.open = [b1, b2]() { return TensorPlan::Cat({b1, b2}, 1); };
    return *TensorPlan::Cat({a, TensorPlan::Deferred(std::move(d))}, 1);
  };
  const TensorPlan mapped = build(true), memory = build(false);
  ASSERT_EQ(mapped.numel(), rows * 65536);
  const std::vector<int32_t> want = PlanValues(memory);
  EXPECT_EQ(PlanValues(mapped), want);
  // Ranges that start and end inside runs and windows.
  for (int64_t start : {int64_t{0}, int64_t{1}, int64_t{16383}, int64_t{300001}}) {
    for (int64_t count : {int64_t{1}, int64_t{16385}, int64_t{262144}, int64_t{700000}}) {
      std::vector<int32_t> got(static_cast<size_t>(count));
      ASSERT_TRUE(mapped.CopyFlat(start, count, reinterpret_cast<uint8_t*>(got.data())).ok());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + start)) << start << " +" << count;
    }
  }
  // Sparse spans (a narrow column of every row: 4 KiB read of each 128 KiB)
  // are not staged; the bytes are the same.
  auto narrow = mapped.Narrow(1, 1000, 1024);
  ASSERT_TRUE(narrow.ok());
  auto narrow_memory = memory.Narrow(1, 1000, 1024);
  EXPECT_EQ(PlanValues(*narrow), PlanValues(*narrow_memory));
}

// ReadFlat reads bytes of a mapped file into the scratch buffer; ViewFlat
// views them in the mapping. Both view memory that is not mapped.
TEST(TensorPlanTest, ReadFlatReadsMappedBytesIntoScratch) {
  const MappedInts m = MapInts("readflat.bin", 100000, 3);
  const TensorPlan mapped = TensorPlan::FromTensor(MappedTensor(m, 10, {50000}));
  const Tensor in_memory = MemoryTensor(m, 10, {50000});
  const TensorPlan memory = TensorPlan::FromTensor(in_memory);
  std::vector<uint8_t> scratch(4 * 30000);
  auto read = mapped.ReadFlat(5, 30000, scratch.data());
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->data(), scratch.data());
  EXPECT_EQ(std::memcmp(read->data(), m.values.data() + 15, 4 * 30000), 0);
  auto view = mapped.ViewFlat(5, 30000, scratch.data());
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->data(), m.file->data() + 4 * 15);
  auto memory_read = memory.ReadFlat(5, 30000, scratch.data());
  ASSERT_TRUE(memory_read.ok());
  EXPECT_EQ(memory_read->data(), in_memory.data() + 4 * 5);
}

// The input check (ReadCoverage) gets the CRC-32 of every byte a staged or
// directly read window copied: a record read whole needs no gap read, and
// its CRC is the file's.
TEST(TensorPlanTest, StagedCopiesReportTheirCrcs) {
  const int64_t rows = 262185;  // 3 MiB per tensor: several windows
  const MappedInts m = MapInts("coverage.bin", 2 * rows * 3, 11);
  const Tensor a = MappedTensor(m, 0, {rows, 3}), b = MappedTensor(m, rows * 3, {rows, 3});
  const absl::Span<const uint8_t> record(m.file->data(), static_cast<size_t>(2 * rows * 3) * 4);
  for (int dim : {0, 1}) {
    auto plan = TensorPlan::Cat({TensorPlan::FromTensor(a), TensorPlan::FromTensor(b)}, dim);
    ASSERT_TRUE(plan.ok());
    torch::ReadCoverage coverage;
    uint32_t seen = 0;
    coverage.Track(
        record, [](absl::Span<const uint8_t> bytes, uint64_t) { return torch::Crc32(0, bytes.data(), bytes.size()); },
        [&seen](uint32_t crc) {
          seen = crc;
          return absl::OkStatus();
        });
    std::vector<uint8_t> out(plan->nbytes());
    {
      torch::ReadCoverage::Scope scope(&coverage);
      ASSERT_TRUE(plan->CopyFlat(0, plan->numel(), out.data()).ok());
    }
    ASSERT_TRUE(coverage.CheckAll(1).ok());
    EXPECT_EQ(coverage.gap_bytes(), 0u) << "dim " << dim;
    EXPECT_EQ(coverage.covered_bytes(), record.size()) << "dim " << dim;
    EXPECT_EQ(seen, torch::Crc32(0, record.data(), record.size())) << "dim " << dim;
  }
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
