#include "base/sha256.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <tuple>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace ucp {
namespace {

constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

inline uint32_t RotR(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

#if defined(__x86_64__)
bool DetectShaNi() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool sha = (b >> 29) & 1;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool sse41 = (c >> 19) & 1;
  const bool ssse3 = (c >> 9) & 1;
  return sha && sse41 && ssse3;
}

// Loads state words into the ABEF / CDGH lane layout of the SHA-NI rounds.
__attribute__((always_inline, target("sha,sse4.1,ssse3"))) inline void LoadShaNiState(const uint32_t state[8],
                                                                                      __m128i& abef, __m128i& cdgh) {
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));
  cdgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));
  tmp = _mm_shuffle_epi32(tmp, 0xB1);    // CDAB
  cdgh = _mm_shuffle_epi32(cdgh, 0x1B);  // EFGH
  abef = _mm_alignr_epi8(tmp, cdgh, 8);  // ABEF
  cdgh = _mm_blend_epi16(cdgh, tmp, 0xF0);  // CDGH
}

__attribute__((always_inline, target("sha,sse4.1,ssse3"))) inline void StoreShaNiState(uint32_t state[8], __m128i abef,
                                                                                       __m128i cdgh) {
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), _mm_blend_epi16(feba, dchg, 0xF0));  // DCBA
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), _mm_alignr_epi8(dchg, feba, 8));     // HGFE
}

// The SHA-NI message schedule and rounds (Intel SHA extensions): four rounds
// per 128-bit group of message words; W[16..63] derived with msg1/msg2.
__attribute__((target("sha,sse4.1,ssse3"))) void CompressShaNi(uint32_t state[8], const uint8_t* data,
                                                                size_t blocks) {
  const __m128i kByteSwap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i state0, state1;
  LoadShaNiState(state, state0, state1);
  for (size_t blk = 0; blk < blocks; ++blk, data += 64) {
    const __m128i abef = state0;
    const __m128i cdgh = state1;
    __m128i w[4];
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      if (g < 4) {
        w[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * g)), kByteSwap);
      }
      __m128i msg = _mm_add_epi32(w[g & 3], _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kRoundConstants[4 * g])));
      state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
      if (g >= 3 && g < 15) {
        const __m128i t = _mm_alignr_epi8(w[g & 3], w[(g + 3) & 3], 4);
        w[(g + 1) & 3] = _mm_sha256msg2_epu32(_mm_add_epi32(w[(g + 1) & 3], t), w[g & 3]);
      }
      msg = _mm_shuffle_epi32(msg, 0x0E);
      state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
      if (g >= 1 && g < 13) w[(g + 3) & 3] = _mm_sha256msg1_epu32(w[(g + 3) & 3], w[g & 3]);
    }
    state0 = _mm_add_epi32(state0, abef);
    state1 = _mm_add_epi32(state1, cdgh);
  }
  StoreShaNiState(state, state0, state1);
}

// CompressShaNi on two independent chains at once, round for round: `blocks`
// blocks of `da` into `sa` and of `db` into `sb`.
__attribute__((target("sha,sse4.1,ssse3"))) void CompressShaNiX2(uint32_t sa[8], const uint8_t* da, uint32_t sb[8],
                                                                  const uint8_t* db, size_t blocks) {
  const __m128i kByteSwap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i a0, a1, b0, b1;
  LoadShaNiState(sa, a0, a1);
  LoadShaNiState(sb, b0, b1);
  for (size_t blk = 0; blk < blocks; ++blk, da += 64, db += 64) {
    const __m128i a0_saved = a0, a1_saved = a1, b0_saved = b0, b1_saved = b1;
    __m128i wa[4], wb[4];
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      if (g < 4) {
        wa[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(da + 16 * g)), kByteSwap);
        wb[g] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(db + 16 * g)), kByteSwap);
      }
      const __m128i k = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kRoundConstants[4 * g]));
      __m128i ma = _mm_add_epi32(wa[g & 3], k);
      __m128i mb = _mm_add_epi32(wb[g & 3], k);
      a1 = _mm_sha256rnds2_epu32(a1, a0, ma);
      b1 = _mm_sha256rnds2_epu32(b1, b0, mb);
      if (g >= 3 && g < 15) {
        const __m128i ta = _mm_alignr_epi8(wa[g & 3], wa[(g + 3) & 3], 4);
        wa[(g + 1) & 3] = _mm_sha256msg2_epu32(_mm_add_epi32(wa[(g + 1) & 3], ta), wa[g & 3]);
        const __m128i tb = _mm_alignr_epi8(wb[g & 3], wb[(g + 3) & 3], 4);
        wb[(g + 1) & 3] = _mm_sha256msg2_epu32(_mm_add_epi32(wb[(g + 1) & 3], tb), wb[g & 3]);
      }
      ma = _mm_shuffle_epi32(ma, 0x0E);
      mb = _mm_shuffle_epi32(mb, 0x0E);
      a0 = _mm_sha256rnds2_epu32(a0, a1, ma);
      b0 = _mm_sha256rnds2_epu32(b0, b1, mb);
      if (g >= 1 && g < 13) {
        wa[(g + 3) & 3] = _mm_sha256msg1_epu32(wa[(g + 3) & 3], wa[g & 3]);
        wb[(g + 3) & 3] = _mm_sha256msg1_epu32(wb[(g + 3) & 3], wb[g & 3]);
      }
    }
    a0 = _mm_add_epi32(a0, a0_saved);
    a1 = _mm_add_epi32(a1, a1_saved);
    b0 = _mm_add_epi32(b0, b0_saved);
    b1 = _mm_add_epi32(b1, b1_saved);
  }
  StoreShaNiState(sa, a0, a1);
  StoreShaNiState(sb, b0, b1);
}
#endif

const bool kHardware =
#if defined(__x86_64__)
    DetectShaNi();
#else
    false;
#endif

}  // namespace

bool Sha256HardwareAvailable() { return kHardware; }

Sha256::Sha256(Sha256Impl impl) : hardware_(kHardware && impl == Sha256Impl::kAuto) { Reset(); }

void Sha256::CompressBlocks(const uint8_t* blocks, size_t n) {
#if defined(__x86_64__)
  if (hardware_) {
    CompressShaNi(state_, blocks, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) Compress(blocks + 64 * i);
}

void Sha256::Reset() {
  static constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(state_, kInit, sizeof(state_));
  total_len_ = 0;
  buffered_ = 0;
}

void Sha256::Compress(const uint8_t* block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t{block[4 * i]} << 24) | (uint32_t{block[4 * i + 1]} << 16) |
           (uint32_t{block[4 * i + 2]} << 8) | uint32_t{block[4 * i + 3]};
  }
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = RotR(w[i - 15], 7) ^ RotR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = RotR(w[i - 2], 17) ^ RotR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t s1 = RotR(e, 6) ^ RotR(e, 11) ^ RotR(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = h + s1 + ch + kRoundConstants[i] + w[i];
    uint32_t s0 = RotR(a, 2) ^ RotR(a, 13) ^ RotR(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

size_t Sha256::FillBuffer(const uint8_t* p, size_t len) {
  if (buffered_ == 0) return 0;
  const size_t take = std::min(len, sizeof(buffer_) - buffered_);
  std::memcpy(buffer_ + buffered_, p, take);
  buffered_ += take;
  if (buffered_ == sizeof(buffer_)) {
    CompressBlocks(buffer_, 1);
    buffered_ = 0;
  }
  return take;
}

void Sha256::BufferTail(const uint8_t* p, size_t len) {
  if (len > 0) {
    std::memcpy(buffer_, p, len);
    buffered_ = len;
  }
}

void Sha256::Update(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_len_ += len;
  const size_t took = FillBuffer(p, len);
  p += took;
  len -= took;
  if (buffered_ > 0) return;  // all of it went into the partial block
  if (len >= 64) {
    const size_t n = len / 64;
    CompressBlocks(p, n);
    p += 64 * n;
    len -= 64 * n;
  }
  BufferTail(p, len);
}

void Sha256::UpdatePair(Sha256& a, const void* da, size_t la, Sha256& b, const void* db, size_t lb) {
#if defined(__x86_64__)
  if (&a != &b && a.hardware_ && b.hardware_) {
    const uint8_t* pa = static_cast<const uint8_t*>(da);
    const uint8_t* pb = static_cast<const uint8_t*>(db);
    a.total_len_ += la;
    b.total_len_ += lb;
    size_t took = a.FillBuffer(pa, la);
    pa += took;
    la -= took;
    took = b.FillBuffer(pb, lb);
    pb += took;
    lb -= took;
    // Both partial blocks are now empty unless their input ran out.
    if (a.buffered_ == 0 && b.buffered_ == 0) {
      const size_t n = std::min(la, lb) / 64;
      CompressShaNiX2(a.state_, pa, b.state_, pb, n);
      pa += 64 * n;
      la -= 64 * n;
      pb += 64 * n;
      lb -= 64 * n;
    }
    for (auto [h, p, len] : {std::tuple<Sha256*, const uint8_t*, size_t>{&a, pa, la}, {&b, pb, lb}}) {
      if (h->buffered_ > 0) continue;  // the input ran out filling the partial block
      const size_t n = len / 64;
      if (n > 0) h->CompressBlocks(p, n);
      h->BufferTail(p + 64 * n, len - 64 * n);
    }
    return;
  }
#endif
  a.Update(da, la);
  b.Update(db, lb);
}

std::array<uint8_t, 32> Sha256::Digest() {
  const uint64_t bit_len = total_len_ * 8;
  uint8_t pad[72] = {0x80};
  size_t pad_len = (buffered_ < 56) ? (56 - buffered_) : (120 - buffered_);
  for (int i = 0; i < 8; ++i) pad[pad_len + i] = static_cast<uint8_t>(bit_len >> (56 - 8 * i));
  Update(pad, pad_len + 8);
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = static_cast<uint8_t>(state_[i] >> 24);
    out[4 * i + 1] = static_cast<uint8_t>(state_[i] >> 16);
    out[4 * i + 2] = static_cast<uint8_t>(state_[i] >> 8);
    out[4 * i + 3] = static_cast<uint8_t>(state_[i]);
  }
  return out;
}

std::string Sha256::HexDigest() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::array<uint8_t, 32> d = Digest();
  std::string out(64, '0');
  for (int i = 0; i < 32; ++i) {
    out[2 * i] = kHex[d[i] >> 4];
    out[2 * i + 1] = kHex[d[i] & 15];
  }
  return out;
}

std::string Sha256Hex(std::string_view data, Sha256Impl impl) {
  Sha256 h(impl);
  h.Update(data);
  return h.HexDigest();
}

}  // namespace ucp
