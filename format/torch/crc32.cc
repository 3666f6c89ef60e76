#include "format/torch/crc32.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace ucp::torch {
namespace internal_crc32 {
namespace {

constexpr uint32_t kPolynomial = 0xEDB88320u;

struct Tables {
  uint32_t t[16][256];
};

constexpr Tables MakeTables() {
  Tables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    tables.t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 16; ++s) {
      uint32_t prev = tables.t[s - 1][i];
      tables.t[s][i] = (prev >> 8) ^ tables.t[0][prev & 0xFF];
    }
  }
  return tables;
}

constexpr Tables kTables = MakeTables();

inline uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // little-endian hosts only (x86-64, aarch64)
}

}  // namespace

uint32_t Crc32Bytewise(uint32_t crc, const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  while (len--) crc = (crc >> 8) ^ kTables.t[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

uint32_t Crc32Slicing16(uint32_t crc, const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const auto& t = kTables.t;
  crc = ~crc;
  while (len >= 16) {
    uint32_t a = Load32(p) ^ crc;
    uint32_t b = Load32(p + 4);
    uint32_t c = Load32(p + 8);
    uint32_t d = Load32(p + 12);
    crc = t[15][a & 0xFF] ^ t[14][(a >> 8) & 0xFF] ^ t[13][(a >> 16) & 0xFF] ^ t[12][a >> 24] ^
          t[11][b & 0xFF] ^ t[10][(b >> 8) & 0xFF] ^ t[9][(b >> 16) & 0xFF] ^ t[8][b >> 24] ^
          t[7][c & 0xFF] ^ t[6][(c >> 8) & 0xFF] ^ t[5][(c >> 16) & 0xFF] ^ t[4][c >> 24] ^
          t[3][d & 0xFF] ^ t[2][(d >> 8) & 0xFF] ^ t[1][(d >> 16) & 0xFF] ^ t[0][d >> 24];
    p += 16;
    len -= 16;
  }
  while (len--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

#if defined(__x86_64__)

bool HasPclmul() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_PCLMUL) && (ecx & bit_SSE4_1);
}

// Folds 64 bytes at a time with carry-less multiplication, then reduces with
// Barrett. Constants are x^k mod P(x) in the bit-reflected domain for the
// zip polynomial, from the Intel paper (as used by zlib/Chromium).
// `crc` is the raw (pre-inverted) register; `len` >= 64 and a multiple of 16.
// A fold constant is x^n mod P(x), bit-reflected over 33 bits: the
// multiplier that moves 64 bits of the running remainder n - 32 (low half) or
// n + 32 (high half) bits further along the message.
alignas(16) const uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};  // n = 512 + 32, 512 - 32
alignas(16) const uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};  // n = 128 + 32, 128 - 32
alignas(16) const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};  // n = 64
alignas(16) const uint64_t poly[] = {0x01db710641, 0x01f7011641};  // P(x)' and its Barrett quotient
const uint64_t k1024[] = {0x01e88ef372, 0x014a7fe880};             // n = 1024 + 32, 1024 - 32

// Continues a fold whose four 128-bit lanes x1..x4 hold the first 64 bytes
// (crc applied): folds the rest of `buf` (`len` a multiple of 16) into them
// and reduces to the raw CRC register.
__attribute__((target("pclmul,sse4.1"))) static uint32_t FoldLanes(__m128i x1, __m128i x2, __m128i x3, __m128i x4,
                                                                  const uint8_t* buf, size_t len) {
  __m128i x0, x5, x6, x7, x8, y5, y6, y7, y8;
  x0 = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  while (len >= 64) {
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
    x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
    x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
    x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
    y5 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x00));
    y6 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x10));
    y7 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x20));
    y8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x30));
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
    x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
    x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
    x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
    buf += 64;
    len -= 64;
  }

  // Fold the four lanes into one.
  x0 = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);

  while (len >= 16) {
    x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf));
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    buf += 16;
    len -= 16;
  }

  // 128 -> 64 bits.
  x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
  x3 = _mm_setr_epi32(~0, 0, ~0, 0);
  x1 = _mm_srli_si128(x1, 8);
  x1 = _mm_xor_si128(x1, x2);
  x0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_and_si128(x1, x3);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_xor_si128(x1, x2);

  // Barrett reduction to 32 bits.
  x0 = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  x2 = _mm_and_si128(x1, x3);
  x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
  x2 = _mm_and_si128(x2, x3);
  x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

// `crc` is the raw (pre-inverted) register; `len` >= 64 and a multiple of 16.
__attribute__((target("pclmul,sse4.1"))) static uint32_t FoldPclmul(const uint8_t* buf, size_t len, uint32_t crc) {
  __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x00));
  const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x10));
  const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x20));
  const __m128i x4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + 0x30));
  x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128(static_cast<int>(crc)));
  return FoldLanes(x1, x2, x3, x4, buf + 64, len - 64);
}

bool HasVpclmul256() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool avx2 = (ebx >> 5) & 1;
  const bool vpclmul = (ecx >> 10) & 1;
  if (!avx2 || !vpclmul || !HasPclmul()) return false;
  // The OS must save the ymm state (XCR0: SSE and AVX).
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !((ecx >> 27) & 1)) return false;
  uint32_t xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 0x6) == 0x6;
}

// The fold 128 bytes at a time in four 256-bit registers (8 lanes), then
// down to the four 128-bit lanes FoldLanes continues with. 256-bit rather
// than 512-bit registers: after zmm16-31 are used, the legacy-SSE SHA-NI
// rounds that hash the same bytes run at half speed (measured on Zen 4).
//
// a * k (both 64-bit halves of each 128-bit lane) xor b: the fold of lanes
// `a` onto the data `b` they reach.
__attribute__((always_inline, target("avx2,vpclmulqdq"))) inline __m256i Fold256(__m256i a, __m256i k, __m256i b) {
  return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(a, k, 0x00), _mm256_clmulepi64_epi128(a, k, 0x11)),
                          b);
}

__attribute__((always_inline, target("avx2"))) inline __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// `len` >= 128 and a multiple of 16.
__attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1"))) static uint32_t FoldVpclmul(const uint8_t* buf, size_t len,
                                                                                     uint32_t crc) {
  const __m256i k1024x2 = _mm256_set_epi64x(k1024[1], k1024[0], k1024[1], k1024[0]);
  const __m256i k512x2 = _mm256_set_epi64x(k1k2[1], k1k2[0], k1k2[1], k1k2[0]);
  __m256i y0 = Load256(buf + 0x00);
  __m256i y1 = Load256(buf + 0x20);
  __m256i y2 = Load256(buf + 0x40);
  __m256i y3 = Load256(buf + 0x60);
  y0 = _mm256_xor_si256(y0, _mm256_set_epi64x(0, 0, 0, crc));
  buf += 128;
  len -= 128;
  while (len >= 128) {
    y0 = Fold256(y0, k1024x2, Load256(buf + 0x00));
    y1 = Fold256(y1, k1024x2, Load256(buf + 0x20));
    y2 = Fold256(y2, k1024x2, Load256(buf + 0x40));
    y3 = Fold256(y3, k1024x2, Load256(buf + 0x60));
    buf += 128;
    len -= 128;
  }
  // y0 and y1 onto y2 and y3, 512 bits on: the last 64 bytes' four lanes.
  y2 = Fold256(y0, k512x2, y2);
  y3 = Fold256(y1, k512x2, y3);
  const __m128i x1 = _mm256_castsi256_si128(y2), x2 = _mm256_extracti128_si256(y2, 1);
  const __m128i x3 = _mm256_castsi256_si128(y3), x4 = _mm256_extracti128_si256(y3, 1);
  _mm256_zeroupper();  // before legacy-SSE code (FoldLanes, the caller's SHA-NI)
  return FoldLanes(x1, x2, x3, x4, buf, len);
}

// `fold` over the whole 16-byte blocks of `data`, slicing for the tail.
uint32_t FoldThenSlice(uint32_t crc, const void* data, size_t len, uint32_t (*fold)(const uint8_t*, size_t, uint32_t)) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const size_t bulk = len & ~size_t{15};
  return Crc32Slicing16(~fold(p, bulk, ~crc), p + bulk, len - bulk);
}

uint32_t Crc32Pclmul(uint32_t crc, const void* data, size_t len) {
  if (len < 64) return Crc32Slicing16(crc, data, len);
  return FoldThenSlice(crc, data, len, &FoldPclmul);
}

uint32_t Crc32Vpclmul(uint32_t crc, const void* data, size_t len) {
  if (len < 256) return Crc32Pclmul(crc, data, len);
  return FoldThenSlice(crc, data, len, &FoldVpclmul);
}

#else  // !__x86_64__

bool HasPclmul() { return false; }
bool HasVpclmul256() { return false; }
uint32_t Crc32Pclmul(uint32_t crc, const void* data, size_t len) { return Crc32Slicing16(crc, data, len); }
uint32_t Crc32Vpclmul(uint32_t crc, const void* data, size_t len) { return Crc32Slicing16(crc, data, len); }

#endif

}  // namespace internal_crc32

uint32_t Crc32(uint32_t crc, const void* data, size_t len) {
  using Impl = uint32_t (*)(uint32_t, const void*, size_t);
  static const Impl impl = internal_crc32::HasVpclmul256() ? &internal_crc32::Crc32Vpclmul
                                  : internal_crc32::HasPclmul()   ? &internal_crc32::Crc32Pclmul
                                                                  : &internal_crc32::Crc32Slicing16;
  return impl(crc, data, len);
}

namespace {

constexpr uint32_t kPoly = 0xEDB88320u;  // reflected; bit 31 is x^0

// a * b modulo the CRC polynomial, both polynomials in the reflected
// representation (bit 31 = x^0, bit 0 = x^31).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;  // b *= x
  }
  return product;
}

// x^(2^k) modulo the polynomial for k = 0..63.
struct PowersOfX {
  uint32_t p[64];
  PowersOfX() {
    p[0] = 1u << 30;  // x^1
    for (int k = 1; k < 64; ++k) p[k] = MultModP(p[k - 1], p[k - 1]);
  }
};

}  // namespace

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // CRC(A || B) = CRC(A) * x^(8 len_b) + CRC(B) (mod P): the pre- and
  // post-conditioning (~) of the two CRCs cancel out for this form.
  static const PowersOfX powers;
  uint32_t shift = 1u << 31;  // x^0
  uint64_t bits = len_b;      // x^(8 len_b) = (x^8)^len_b: x^(2^(k+3)) per set bit k
  for (int k = 3; bits != 0 && k < 64; ++k, bits >>= 1) {
    if (bits & 1) shift = MultModP(powers.p[k], shift);
  }
  return MultModP(shift, crc_a) ^ crc_b;
}

}  // namespace ucp::torch
