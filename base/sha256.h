// SHA-256 (FIPS 180-4), for content fingerprints in dumps, manifests and tests.
//
// Not constant-time and not meant for secrets; the project has no OpenSSL.
//
// Example:
//   ucp::Sha256 h;
//   h.Update(header);
//   h.Update(payload);
//   std::string hex = h.HexDigest();          // 64 lowercase hex chars
//   std::string once = ucp::Sha256Hex("abc");  // "ba7816bf..."
#ifndef UCP_BASE_SHA256_H_
#define UCP_BASE_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ucp {

// Which compression a hasher runs: the CPU's SHA extensions when it has
// them (kAuto), or the portable code (kPortable; tests check both agree).
enum class Sha256Impl { kAuto, kPortable };

// Sha256: incremental hasher. Update() any number of times, then Digest() or
// HexDigest() once (the hasher is then spent; Reset() to reuse it).
class Sha256 {
 public:
  explicit Sha256(Sha256Impl impl = Sha256Impl::kAuto);
  void Reset();
  void Update(const void* data, size_t len);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  std::array<uint8_t, 32> Digest();
  std::string HexDigest();

  // a.Update(da, la) and b.Update(db, lb) (distinct hashers), computed
  // together: with SHA-NI the two message chains are interleaved, which keeps
  // the CPU's SHA unit busy where one chain waits on each round's latency
  // (about 1.8x the throughput of two Update() calls) when both hashers use
  // the extensions.
  static void UpdatePair(Sha256& a, const void* da, size_t la, Sha256& b, const void* db, size_t lb);

 private:
  // Appends to the partial block; returns how many leading bytes of `p` it
  // took (all of them, or enough to fill and compress the block).
  size_t FillBuffer(const uint8_t* p, size_t len);
  // Keeps a tail shorter than a block for later.
  void BufferTail(const uint8_t* p, size_t len);
  void Compress(const uint8_t* block);  // one 64-byte block
  // `n` consecutive 64-byte blocks, with the SHA-NI instructions when the CPU
  // has them (x86-64), else Compress() per block.
  void CompressBlocks(const uint8_t* blocks, size_t n);
  uint32_t state_[8];
  uint64_t total_len_ = 0;
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  bool hardware_;  // compress with the SHA extensions
};

// The hex digest of `data` in one call.
std::string Sha256Hex(std::string_view data, Sha256Impl impl = Sha256Impl::kAuto);

// Whether this CPU has the SHA extensions (Sha256Impl::kAuto uses them).
bool Sha256HardwareAvailable();

}  // namespace ucp

#endif  // UCP_BASE_SHA256_H_
