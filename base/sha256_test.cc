#include "base/sha256.h"

#include <iostream>
#include <vector>
#include <string>

#include "gtest/gtest.h"

namespace ucp {
namespace {

// FIPS 180-4 / NIST CAVS example vectors.
TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Every split of the input into two Update() calls gives the same digest,
// covering the 55/56/63/64-byte padding boundaries.
TEST(Sha256Test, IncrementalMatchesOneShot) {
  std::string data;
  for (int i = 0; i < 200; ++i) data.push_back(static_cast<char>(i * 7 + 3));
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 200}) {
    std::string part = data.substr(0, len);
    std::string expected = Sha256Hex(part);
    for (size_t split = 0; split <= len; ++split) {
      Sha256 h;
      h.Update(part.substr(0, split));
      h.Update(part.substr(split));
      ASSERT_EQ(h.HexDigest(), expected) << "len " << len << " split " << split;
    }
  }
}

// The SHA-NI path (when this CPU has it) and the portable one agree on
// inputs of every length around block boundaries and on large ones.
TEST(Sha256Test, HardwareMatchesPortable) {
  std::string data;
  for (int i = 0; i < (1 << 20) + 77; ++i) data.push_back(static_cast<char>((i * 131 + (i >> 9)) & 0xff));
  for (size_t len : std::vector<size_t>{0, 1, 63, 64, 65, 127, 128, 129, 1000, 4096 + 13, size_t{1} << 20, data.size()}) {
    const std::string part = data.substr(0, len);
    const std::string portable = Sha256Hex(part, Sha256Impl::kPortable);
    EXPECT_EQ(Sha256Hex(part), portable) << "len " << len;
  }
  EXPECT_EQ(Sha256Hex("abc", Sha256Impl::kPortable), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  if (!Sha256HardwareAvailable()) std::cerr << "note: this CPU has no SHA extensions; only the portable path ran\n";
}

// UpdatePair gives each hasher exactly what its own Update() would, whatever
// the two inputs' lengths and whatever each hasher already buffered (the
// interleaved SHA-NI chains, the single-chain tails and the partial blocks).
TEST(Sha256Test, UpdatePairMatchesUpdate) {
  std::string data;
  for (int i = 0; i < 300000; ++i) data.push_back(static_cast<char>((i * 151 + (i >> 7)) & 0xff));
  const std::vector<size_t> prefixes = {0, 1, 13, 63, 64, 65, 100};
  const std::vector<size_t> lengths = {0, 1, 50, 63, 64, 65, 127, 128, 1000, 4096 + 7, 100000};
  for (bool hardware : {true, false}) {
    const Sha256Impl impl = hardware ? Sha256Impl::kAuto : Sha256Impl::kPortable;
    for (size_t pa : prefixes) {
      for (size_t pb : prefixes) {
        for (size_t la : lengths) {
          for (size_t lb : lengths) {
            const char* a_data = data.data() + 1000;
            const char* b_data = data.data() + 150000 + pb;
            Sha256 a(impl), b(impl), a_ref(Sha256Impl::kPortable), b_ref(Sha256Impl::kPortable);
            a.Update(data.data(), pa);
            a_ref.Update(data.data(), pa);
            b.Update(data.data() + 77, pb);
            b_ref.Update(data.data() + 77, pb);
            Sha256::UpdatePair(a, a_data, la, b, b_data, lb);
            a_ref.Update(a_data, la);
            b_ref.Update(b_data, lb);
            // And once more, so a second pair starts from the tails the first left.
            Sha256::UpdatePair(a, a_data + la, lb, b, b_data + lb, la);
            a_ref.Update(a_data + la, lb);
            b_ref.Update(b_data + lb, la);
            ASSERT_EQ(a.HexDigest(), a_ref.HexDigest()) << hardware << " " << pa << " " << pb << " " << la << " " << lb;
            ASSERT_EQ(b.HexDigest(), b_ref.HexDigest()) << hardware << " " << pa << " " << pb << " " << la << " " << lb;
          }
        }
      }
    }
  }
  // Large equal inputs, against a known digest.
  Sha256 x, y;
  const std::string million(1000000, 'a');
  Sha256::UpdatePair(x, million.data(), million.size(), y, "abc", 3);
  EXPECT_EQ(x.HexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(y.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 p, q;
  Sha256::UpdatePair(p, million.data(), million.size(), q, million.data(), million.size());
  EXPECT_EQ(p.HexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(q.HexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, ResetReuses) {
  Sha256 h;
  h.Update("garbage");
  h.Reset();
  h.Update("abc");
  EXPECT_EQ(h.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace ucp
