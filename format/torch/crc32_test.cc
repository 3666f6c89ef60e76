#include "format/torch/crc32.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using internal_crc32::Crc32Bytewise;
using internal_crc32::Crc32Pclmul;
using internal_crc32::Crc32Slicing16;

TEST(Crc32Test, KnownValues) {
  EXPECT_EQ(Crc32(0, "", 0), 0u);
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(0, "3\n", 2), 0x55679ed1u);  // a torch `version` record
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32(0, zeros.data(), zeros.size()), 0x190A55ADu);
}

TEST(Crc32Test, ImplementationsAgreeOnAllLengthsAndAlignments) {
  std::mt19937 rng(42);
  std::vector<uint8_t> data(4096 + 64);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t offset : {0, 1, 3, 8, 15}) {
    for (size_t len = 0; len <= 4096; ++len) {
      const uint8_t* p = data.data() + offset;
      uint32_t expected = Crc32Bytewise(0, p, len);
      ASSERT_EQ(Crc32Slicing16(0, p, len), expected) << len;
      if (internal_crc32::HasPclmul()) {
        ASSERT_EQ(Crc32Pclmul(0, p, len), expected) << len;
      }
      if (internal_crc32::HasVpclmul256()) {
        ASSERT_EQ(internal_crc32::Crc32Vpclmul(0, p, len), expected) << len;
      }
      ASSERT_EQ(Crc32(0, p, len), expected) << len;
    }
  }
}

TEST(Crc32Test, ChainingEqualsOneShot) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(100000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  uint32_t whole = Crc32Bytewise(0, data.data(), data.size());
  for (size_t split : {0, 1, 63, 64, 65, 4097, 99999, 100000}) {
    uint32_t c = Crc32(0, data.data(), split);
    c = Crc32(c, data.data() + split, data.size() - split);
    EXPECT_EQ(c, whole) << split;
  }
}

TEST(Crc32Test, CombineEqualsOneShot) {
  std::mt19937 rng(11);
  std::vector<uint8_t> data(300000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32Bytewise(0, data.data(), data.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{123457}, size_t{299999}, size_t{300000}}) {
    const uint32_t a = Crc32(0, data.data(), split);
    const uint32_t b = Crc32(0, data.data() + split, data.size() - split);
    EXPECT_EQ(Crc32Combine(a, b, data.size() - split), whole) << split;
  }
  // Many pieces of random lengths, combined left to right.
  uint32_t combined = 0;
  size_t at = 0;
  while (at < data.size()) {
    const size_t len = std::min<size_t>(data.size() - at, rng() % 40000);
    combined = Crc32Combine(combined, Crc32(0, data.data() + at, len), len);
    at += len;
  }
  EXPECT_EQ(combined, whole);
  // "123456789" = 0xCBF43926, as "1234" + "56789".
  EXPECT_EQ(Crc32Combine(Crc32(0, "1234", 4), Crc32(0, "56789", 5), 5), 0xCBF43926u);
}

TEST(Crc32Test, CombineLongZeroRuns) {
  // Lengths beyond 4 GiB (a record of a multi-terabyte file): zeros extend a
  // CRC like a shift, and the combine must agree with chaining zero blocks.
  std::vector<uint8_t> zeros(size_t{1} << 20, 0);
  const uint32_t head = Crc32(0, "head", 4);
  uint32_t chained = head;
  uint32_t zero_crc = 0;
  const int blocks = 5 * 1024 + 3;  // 5 GiB + 3 MiB
  for (int i = 0; i < blocks; ++i) chained = Crc32(chained, zeros.data(), zeros.size());
  for (int i = 0; i < blocks; ++i) zero_crc = Crc32(zero_crc, zeros.data(), zeros.size());
  EXPECT_EQ(Crc32Combine(head, zero_crc, uint64_t{blocks} << 20), chained);
}

// Prints throughput (not a pass/fail criterion; see the report).
TEST(Crc32Test, Throughput) {
  std::vector<uint8_t> data(size_t{256} << 20, 0x5A);
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<uint8_t>(i >> 12);
  auto time = [&](const char* name, uint32_t (*fn)(uint32_t, const void*, size_t)) {
    auto start = std::chrono::steady_clock::now();
    uint32_t c = fn(0, data.data(), data.size());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%-10s %8.2f GB/s (crc %08x)\n", name, data.size() / s / 1e9, c);
    return c;
  };
  uint32_t a = time("slicing16", &Crc32Slicing16);
  if (internal_crc32::HasPclmul()) {
    EXPECT_EQ(time("pclmul", &Crc32Pclmul), a);
  }
  if (internal_crc32::HasVpclmul256()) {
    EXPECT_EQ(time("vpclmul256", &internal_crc32::Crc32Vpclmul), a);
  }
  if (!internal_crc32::HasVpclmul256()) std::printf("note: no VPCLMULQDQ on this CPU; that path did not run\n");
}

}  // namespace
}  // namespace ucp::torch
