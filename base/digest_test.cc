#include "base/digest.h"

#include <string>

#include "gtest/gtest.h"

namespace ucp {
namespace {

// Expected values from `xxh128sum` and `sha256sum` (Debian's xxhash and
// coreutils), not from this code.
TEST(DigestTest, KnownValues) {
  EXPECT_EQ(HexDigestOf(DigestKind::kXxh3_128, "abc"), "06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(HexDigestOf(DigestKind::kXxh3_128, ""), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(HexDigestOf(DigestKind::kXxh3_128, std::string(1000, 'a')), "b01da365eddaa29cb3e7af627147db7c");
  EXPECT_EQ(HexDigestOf(DigestKind::kSha256, "abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexDigestOf(DigestKind::kNone, "abc"), "");
}

TEST(DigestTest, PiecesEqualWhole) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  for (DigestKind kind : {DigestKind::kSha256, DigestKind::kXxh3_128}) {
    StreamDigest d(kind);
    for (size_t at = 0; at < data.size(); at += 777) d.Update(data.data() + at, std::min<size_t>(777, data.size() - at));
    EXPECT_EQ(d.HexDigest(), HexDigestOf(kind, data)) << DigestKindName(kind);
  }
}

TEST(DigestTest, PairEqualsTwoUpdates) {
  const std::string x(5000, 'x'), y(3000, 'y');
  for (DigestKind ka : {DigestKind::kSha256, DigestKind::kXxh3_128}) {
    for (DigestKind kb : {DigestKind::kSha256, DigestKind::kXxh3_128}) {
      StreamDigest a(ka), b(kb);
      StreamDigest::UpdatePair(a, x.data(), x.size(), b, y.data(), y.size());
      EXPECT_EQ(a.HexDigest(), HexDigestOf(ka, x));
      EXPECT_EQ(b.HexDigest(), HexDigestOf(kb, y));
    }
  }
}

TEST(DigestTest, ParsesNames) {
  EXPECT_EQ(*ParseDigestKind("xxh3"), DigestKind::kXxh3_128);
  EXPECT_EQ(*ParseDigestKind("sha256"), DigestKind::kSha256);
  EXPECT_EQ(*ParseDigestKind("none"), DigestKind::kNone);
  EXPECT_FALSE(ParseDigestKind("md5").ok());
}

}  // namespace
}  // namespace ucp
