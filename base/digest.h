// File digests for manifests: SHA-256 (cryptographic, ~3 GB/s per core with
// SHA-NI when two files are hashed together) or XXH3-128 (non-cryptographic,
// tens of GB/s: it detects corruption and truncation as well, not tampering),
// computed incrementally while a file is written.
//
// Example:
//   StreamDigest d(DigestKind::kXxh3_128);
//   d.Update(bytes.data(), bytes.size());
//   std::string hex = d.HexDigest();  // 32 lowercase hex chars
#ifndef UCP_BASE_DIGEST_H_
#define UCP_BASE_DIGEST_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/sha256.h"

namespace ucp {

enum class DigestKind { kNone, kSha256, kXxh3_128 };

// "none", "sha256", "xxh3".
const char* DigestKindName(DigestKind kind);
absl::StatusOr<DigestKind> ParseDigestKind(std::string_view name);

class StreamDigest {
 public:
  explicit StreamDigest(DigestKind kind);
  ~StreamDigest();
  StreamDigest(const StreamDigest&) = delete;
  StreamDigest& operator=(const StreamDigest&) = delete;

  DigestKind kind() const { return kind_; }
  void Update(const void* data, size_t len);
  // Lowercase hex ("" for kNone); the digest is then spent.
  std::string HexDigest();
  // a.Update(da, la) and b.Update(db, lb), two SHA-256 chains interleaved
  // when both are SHA-256 (Sha256::UpdatePair), else one after the other.
  static void UpdatePair(StreamDigest& a, const void* da, size_t la, StreamDigest& b, const void* db, size_t lb);

 private:
  DigestKind kind_;
  Sha256 sha_;
  struct Xxh3;
  std::unique_ptr<Xxh3> xxh_;
};

// The hex digest of `data` in one call.
std::string HexDigestOf(DigestKind kind, std::string_view data);

}  // namespace ucp

#endif  // UCP_BASE_DIGEST_H_
