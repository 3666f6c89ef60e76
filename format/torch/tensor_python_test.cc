// Cast and Average against torch 1.13 CPU (Debian's /usr/bin/python3),
// bitwise, on special values, every 16-bit pattern, random bit patterns and
// rounding ties, for the layouts that take torch's vectorized and scalar
// copy paths.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format/torch/tensor.h"
#include "format/torch/test_util.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using testing::ReadFileToString;
using testing::RunPython;
using testing::TempPath;

template <typename T>
std::string Raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<uint32_t> Float32Patterns() {
  std::vector<uint32_t> v = {
      0x00000000, 0x80000000, 0x7F800000, 0xFF800000,              // zeros, infinities
      0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA12345,  // NaNs: quiet, signalling, payloads
      0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF,
      0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,  // subnormal/normal limits
      0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000,  // around half's max 65504
      0x33000000, 0x33000001, 0x33800000, 0x33C00000, 0x38800000,  // half subnormal range
      0x387FE000, 0x387FF000, 0x387FFFFF, 0x3F808000, 0x3F818000,  // half normal limit, bf16 ties
      0x3F807FFF, 0x3F808001, 0x7F7F8000, 0x7F7F7FFF, 0xFF7F8000,  // bf16 rounding into inf
  };
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 200000; ++i) v.push_back(static_cast<uint32_t>(rng()));
  // Ties and near-ties for bfloat16 (low 16 bits) and float16 (low 13 bits).
  for (int i = 0; i < 30000; ++i) {
    uint32_t hi = static_cast<uint32_t>(rng()) & 0xFFFF0000u;
    for (uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u}) v.push_back(hi | lo);
    uint32_t sign = static_cast<uint32_t>(rng()) & 0x80000000u;
    uint32_t exp = 100 + static_cast<uint32_t>(rng() % 44);  // half subnormals to overflow
    uint32_t mant = static_cast<uint32_t>(rng()) & 0x7FE000u;
    for (uint32_t lo : {0xFFFu, 0x1000u, 0x1001u}) v.push_back(sign | (exp << 23) | mant | lo);
  }
  return v;
}

std::vector<uint64_t> Float64Patterns() {
  std::vector<uint64_t> v = {0, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
                             0x7FF0000000000001, 0xFFF8000000000001, 0x0000000000000001, 0x7FEFFFFFFFFFFFFF,
                             0x3FF0000010000000, 0x3FF0000010000001, 0x3FF0000030000000,  // float ties
                             0x3FF0100000000000, 0x3FF0100000000001, 0x3FF00FFFFFFFFFFF,  // bf16 ties via float
                             0x47EFFFFFE0000000, 0x47EFFFFFF0000000, 0x36A0000000000000};
  std::mt19937_64 rng(99);
  for (int i = 0; i < 100000; ++i) v.push_back(rng());
  for (int i = 0; i < 20000; ++i) {
    uint64_t sign = rng() & 0x8000000000000000ull;
    uint64_t exp = 1023 - 30 + rng() % 60;
    uint64_t mant = rng() & 0x000FFFFFF0000000ull;
    for (uint64_t lo : {0x0FFFFFFFull, 0x10000000ull, 0x10000001ull}) v.push_back(sign | (exp << 52) | mant | lo);
  }
  return v;
}

struct CastCase {
  std::string name;
  DType from;
  DType to;
  std::string input;  // raw storage bytes
  int64_t offset;
  std::vector<int64_t> sizes, strides;
};

std::string Json(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? ", " : "", v[i]);
  return s + "]";
}

std::string DescribeMismatch(const std::string& expected, const std::string& actual, size_t item,
                             bool any_nan = false, bool bf16 = false) {
  if (expected.size() != actual.size()) return absl::StrCat("size ", actual.size(), " != ", expected.size());
  for (size_t i = 0; i < expected.size(); i += item) {
    if (expected.compare(i, item, actual, i, item) != 0) {
      uint64_t e = 0, a = 0;
      std::memcpy(&e, expected.data() + i, item);
      std::memcpy(&a, actual.data() + i, item);
      if (any_nan) {
        auto nan = [&](uint64_t b) {
          if (item == 2 && bf16) return ((b >> 7) & 0xFF) == 0xFF && (b & 0x7F) != 0;
          if (item == 2) return ((b >> 10) & 0x1F) == 0x1F && (b & 0x3FF) != 0;
          if (item == 4) return ((b >> 23) & 0xFF) == 0xFF && (b & 0x7FFFFF) != 0;
          return ((b >> 52) & 0x7FF) == 0x7FF && (b & 0xFFFFFFFFFFFFFull) != 0;
        };
        if (nan(e) && nan(a)) continue;
      }
      return absl::StrFormat("element %d: torch %#x, ours %#x", i / item, e, a);
    }
  }
  return "";
}

TEST(TensorPythonTest, CastAndAverageMatchTorchBitwise) {
  std::vector<CastCase> cases;
  const std::string f32 = Raw(Float32Patterns());
  const int64_t n32 = static_cast<int64_t>(f32.size() / 4);
  const int64_t rows = n32 / 8;
  // Layouts: contiguous, strided (scalar path), transposed (dense,
  // vectorized), column slices of width 3 (vectorized) and 1 (scalar), a
  // broadcast, a 0-dim and a [1, 1].
  struct Layout {
    std::string name;
    int64_t offset;
    std::vector<int64_t> sizes, strides;
  };
  const std::vector<Layout> layouts = {
      {"contiguous", 0, {n32}, {1}},
      {"step2", 1, {n32 / 2 - 1}, {2}},
      {"transposed", 0, {8, rows}, {1, 8}},
      {"cols3", 2, {rows - 1, 3}, {8, 1}},
      {"col1", 5, {rows - 1, 1}, {8, 1}},
      {"broadcast", 4, {3, 5}, {0, 0}},
      {"scalar", 4, {}, {}},
      {"one", 4, {1, 1}, {1, 1}},
      {"one-strided", 4, {1}, {5}},
      {"transposed-narrowed", 1, {7, rows - 1}, {1, 8}},
      {"transposed-narrowed-rows", 8, {8, rows / 2 - 1}, {1, 16}},
      {"3d-mixed", 3, {4, 5, 6}, {2, 48, 8}},
      {"3d-size1", 0, {rows / 4, 1, 3}, {8, 1000, 2}},
      {"size1-weird", 2, {3, 1}, {1, 7}},
  };
  for (const Layout& l : layouts) {
    for (DType to : {DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
      cases.push_back({absl::StrCat("f32->", DTypeName(to).data(), "/", l.name), DType::kFloat32, to, f32, l.offset,
                       l.sizes, l.strides});
    }
  }
  std::vector<uint16_t> all16(65536);
  for (int i = 0; i < 65536; ++i) all16[i] = static_cast<uint16_t>(i);
  for (DType from : {DType::kFloat16, DType::kBFloat16}) {
    for (DType to : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      if (to == from) continue;
      cases.push_back({"16bit-all", from, to, Raw(all16), 0, {65536}, {1}});
      cases.push_back({"16bit-all-step3", from, to, Raw(all16), 1, {21845}, {3}});
    }
  }
  const std::string f64 = Raw(Float64Patterns());
  for (DType to : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    cases.push_back({"f64", DType::kFloat64, to, f64, 0, {static_cast<int64_t>(f64.size() / 8)}, {1}});
  }

  std::string json = "[";
  for (size_t i = 0; i < cases.size(); ++i) {
    const CastCase& c = cases[i];
    std::string in = TempPath(absl::StrCat("ops/cast", i, ".in"));
    ASSERT_TRUE(WriteFileAtomic(in, c.input).ok());
    absl::StrAppend(&json, i ? ",\n" : "", "{\"op\": \"cast\", \"in\": \"", in, "\", \"dtype\": \"",
                    DTypeName(c.from).data(), "\", \"offset\": ", c.offset, ", \"sizes\": ", Json(c.sizes),
                    ", \"strides\": ", Json(c.strides), ", \"to\": \"", DTypeName(c.to).data(), "\", \"out\": \"",
                    in, ".out\"}");
  }

  // Average: float32 values of mixed magnitude plus specials, k slices.
  std::mt19937_64 rng(5);
  auto random_f32 = [&](int n) {
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) {
      uint32_t sign = rng() & 1 ? 0x80000000u : 0;
      uint32_t exp = 127 - 40 + static_cast<uint32_t>(rng() % 80);
      uint32_t bits = sign | (exp << 23) | (static_cast<uint32_t>(rng()) & 0x7FFFFF);
      std::memcpy(&v[i], &bits, 4);
    }
    const uint32_t specials[] = {0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                 0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x00400000, 0x7F800001};
    for (int i = 0; i < 10; ++i) std::memcpy(&v[i * 97], &specials[i], 4);
    return v;
  };
  auto random_f64 = [&](int n) {
    std::vector<double> v(n);
    for (int i = 0; i < n; ++i) {
      uint64_t sign = rng() & 1 ? 0x8000000000000000ull : 0;
      uint64_t exp = 1023 - 60 + rng() % 120;
      uint64_t bits = sign | (exp << 52) | (rng() & 0xFFFFFFFFFFFFFull);
      std::memcpy(&v[i], &bits, 8);
    }
    return v;
  };
  struct AvgCase {
    DType dtype;
    std::vector<std::string> slices;
  };
  std::vector<AvgCase> avg_cases;
  for (int k : {1, 2, 3, 4, 5, 8}) {
    AvgCase c{DType::kFloat32, {}};
    for (int j = 0; j < k; ++j) c.slices.push_back(Raw(random_f32(5000)));
    avg_cases.push_back(c);
  }
  for (int k : {1, 3, 7}) {
    AvgCase c{DType::kFloat64, {}};
    for (int j = 0; j < k; ++j) c.slices.push_back(Raw(random_f64(3000)));
    avg_cases.push_back(c);
  }
  for (size_t i = 0; i < avg_cases.size(); ++i) {
    std::string ins;
    for (size_t j = 0; j < avg_cases[i].slices.size(); ++j) {
      std::string p = TempPath(absl::StrCat("ops/avg", i, "_", j, ".in"));
      ASSERT_TRUE(WriteFileAtomic(p, avg_cases[i].slices[j]).ok());
      absl::StrAppend(&ins, j ? ", " : "", "\"", p, "\"");
    }
    absl::StrAppend(&json, ",\n{\"op\": \"average\", \"dtype\": \"", DTypeName(avg_cases[i].dtype).data(),
                    "\", \"ins\": [", ins, "], \"out\": \"", TempPath(absl::StrCat("ops/avg", i, ".out")), "\"}");
  }
  json += "]";
  const std::string spec = TempPath("ops/cases.json");
  ASSERT_TRUE(WriteFileAtomic(spec, json).ok());
  auto ran = RunPython(testing::PackageDataPath("testdata/torch_ops.py"), {spec});
  ASSERT_TRUE(ran.ok()) << ran.status();

  for (size_t i = 0; i < cases.size(); ++i) {
    const CastCase& c = cases[i];
    auto expected = ReadFileToString(TempPath(absl::StrCat("ops/cast", i, ".in.out")));
    ASSERT_TRUE(expected.ok());
    auto storage = Storage::Owned(c.from, c.input);
    auto view = Tensor::Make(storage, c.offset, c.sizes, c.strides);
    ASSERT_TRUE(view.ok()) << view.status();
    auto cast = Cast(*view, c.to);
    ASSERT_TRUE(cast.ok()) << cast.status();
    EXPECT_EQ(cast->sizes(), c.sizes);
    // NaN encodings from float64 sources vary in torch with the vector
    // width and thread split (vector body 0xFFFF, scalar tail 0x7FC0), so
    // only NaN-ness is compared there; see Cast in tensor.h.
    EXPECT_EQ(DescribeMismatch(*expected, cast->ContiguousBytes(), ItemSize(c.to), c.from == DType::kFloat64,
                               c.to == DType::kBFloat16),
              "")
        << c.name << " " << DTypeName(c.from) << " -> " << DTypeName(c.to);
  }
  for (size_t i = 0; i < avg_cases.size(); ++i) {
    const AvgCase& c = avg_cases[i];
    auto expected = ReadFileToString(TempPath(absl::StrCat("ops/avg", i, ".out")));
    ASSERT_TRUE(expected.ok());
    std::vector<Tensor> slices;
    const int64_t n = static_cast<int64_t>(c.slices[0].size() / ItemSize(c.dtype));
    for (const std::string& s : c.slices) slices.push_back(*Tensor::FromBytes(c.dtype, {n}, s));
    auto avg = Average(slices);
    ASSERT_TRUE(avg.ok()) << avg.status();
    EXPECT_EQ(DescribeMismatch(*expected, avg->ContiguousBytes(), ItemSize(c.dtype)), "")
        << "average of " << c.slices.size() << " " << DTypeName(c.dtype);
  }
}

}  // namespace
}  // namespace ucp::torch
