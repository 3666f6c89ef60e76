#include "base/digest.h"

#include <xxhash.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "base/phases.h"

namespace ucp {

struct StreamDigest::Xxh3 {
  XXH3_state_t* state = XXH3_createState();
  ~Xxh3() { XXH3_freeState(state); }
};

const char* DigestKindName(DigestKind kind) {
  switch (kind) {
    case DigestKind::kNone: return "none";
    case DigestKind::kSha256: return "sha256";
    case DigestKind::kXxh3_128: return "xxh3";
  }
  return "?";
}

absl::StatusOr<DigestKind> ParseDigestKind(std::string_view name) {
  if (name == "none") return DigestKind::kNone;
  if (name == "sha256") return DigestKind::kSha256;
  if (name == "xxh3" || name == "xxh3_128") return DigestKind::kXxh3_128;
  return absl::InvalidArgumentError(absl::StrCat("unknown digest '", std::string(name), "' (expected xxh3, sha256 or none)"));
}

StreamDigest::StreamDigest(DigestKind kind) : kind_(kind) {
  if (kind_ == DigestKind::kXxh3_128) {
    xxh_ = std::make_unique<Xxh3>();
    XXH3_128bits_reset(xxh_->state);
  }
}

StreamDigest::~StreamDigest() = default;

void StreamDigest::Update(const void* data, size_t len) {
  if (kind_ == DigestKind::kNone) return;
  PhaseTimer timer(Phase::kDigest, static_cast<int64_t>(len));
  switch (kind_) {
    case DigestKind::kNone:
      break;
    case DigestKind::kSha256:
      sha_.Update(data, len);
      break;
    case DigestKind::kXxh3_128:
      XXH3_128bits_update(xxh_->state, data, len);
      break;
  }
}

std::string StreamDigest::HexDigest() {
  switch (kind_) {
    case DigestKind::kNone:
      return "";
    case DigestKind::kSha256:
      return sha_.HexDigest();
    case DigestKind::kXxh3_128: {
      // The canonical (big-endian) form, as `xxh128sum` prints it.
      XXH128_canonical_t c;
      XXH128_canonicalFromHash(&c, XXH3_128bits_digest(xxh_->state));
      std::string hex;
      for (unsigned char b : c.digest) {
        char buf[3];
        std::snprintf(buf, sizeof(buf), "%02x", b);
        hex += buf;
      }
      return hex;
    }
  }
  return "";
}

void StreamDigest::UpdatePair(StreamDigest& a, const void* da, size_t la, StreamDigest& b, const void* db, size_t lb) {
  if (a.kind_ == DigestKind::kSha256 && b.kind_ == DigestKind::kSha256) {
    Sha256::UpdatePair(a.sha_, da, la, b.sha_, db, lb);
    return;
  }
  a.Update(da, la);
  b.Update(db, lb);
}

std::string HexDigestOf(DigestKind kind, std::string_view data) {
  StreamDigest d(kind);
  d.Update(data.data(), data.size());
  return d.HexDigest();
}

}  // namespace ucp
