#include "format/torch/crc32.h"

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
