#include "format/safetensors/safetensors.h"

#include <cstring>
#include <string>

#include "base/fs.h"
#include "gtest/gtest.h"

namespace ucp::safetensors {
namespace {

using torch::DType;

std::string U64(uint64_t n) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[k] = static_cast<char>((n >> (8 * k)) & 0xFF);
  return s;
}

// The header save_file writes for {"b": f32[2], "a": bf16[3], "c": i64[],
// "a2": f32[0]} with metadata {"format": "pt"}, worked out by hand from the
// format's rules: data order dtype descending (I64 > F32 > BF16), then name.
TEST(LayoutTest, OrderOffsetsAndPaddingAsSaveFile) {
  auto l = Layout({{"b", DType::kFloat32, {2}},
                   {"a", DType::kBFloat16, {3}},
                   {"c", DType::kInt64, {}},
                   {"a2", DType::kFloat32, {0}}},
                  {{"format", "pt"}});
  ASSERT_TRUE(l.ok()) << l.status();
  const std::string json =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"a2\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  EXPECT_EQ(l->header, U64(padded.size()) + padded);
  EXPECT_EQ(l->header.size() % 8, 0u);
  EXPECT_EQ(l->file_size, l->header.size() + 22);
  ASSERT_EQ(l->tensors.size(), 4u);
  EXPECT_EQ(l->tensors[0].spec.name, "c");
  EXPECT_EQ(l->tensors[3].spec.name, "a");
}

TEST(LayoutTest, Rejects) {
  EXPECT_FALSE(Layout({{"x", DType::kFloat32, {1}}, {"x", DType::kFloat32, {1}}}, {}).ok());
  EXPECT_FALSE(Layout({{"__metadata__", DType::kFloat32, {1}}}, {}).ok());
  EXPECT_FALSE(Layout({{"x", DType::kFloat32, {-1}}}, {}).ok());
  EXPECT_FALSE(Layout({{"x", DType::kFloat32, {int64_t{1} << 40, int64_t{1} << 40}}}, {}).ok());
  EXPECT_FALSE(Layout({{"x", DType::kComplex128, {1}}}, {}).ok());
}

TEST(WriteReadTest, RoundTripThroughAFile) {
  auto l = Layout({{"w", DType::kFloat32, {2, 3}}, {"h", DType::kFloat16, {5}}, {"e", DType::kFloat32, {0, 4}}},
                  {{"format", "pt"}});
  ASSERT_TRUE(l.ok());
  const std::string path = JoinPath(::testing::TempDir(), "rt.safetensors");
  ASSERT_TRUE(CreateFile(path, *l).ok());
  for (size_t i = 0; i < l->tensors.size(); ++i) {
    const auto status = WriteTensor(
        path, *l, i,
        [&](uint64_t off, size_t len, uint8_t* scratch) -> absl::StatusOr<absl::Span<const uint8_t>> {
          for (size_t k = 0; k < len; ++k) scratch[k] = static_cast<uint8_t>(i * 100 + off + k);
          return absl::MakeConstSpan(scratch, len);
        },
        /*chunk_bytes=*/4);
    ASSERT_TRUE(status.ok()) << status;
  }
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->has_metadata());
  ASSERT_EQ((*f)->metadata().size(), 1u);
  EXPECT_EQ((*f)->metadata()[0].second, "pt");
  auto w = (*f)->GetTensor("w");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->sizes(), (std::vector<int64_t>{2, 3}));
  const int wi = l->Find("w");
  for (int k = 0; k < 24; ++k) EXPECT_EQ(w->data()[k], static_cast<uint8_t>(wi * 100 + k));
  auto h = (*f)->GetTensor("h");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->dtype(), DType::kFloat16);
  EXPECT_EQ((*f)->GetTensor("nope").status().code(), absl::StatusCode::kNotFound);
}

std::string File(const std::string& json, const std::string& data) { return U64(json.size()) + json + data; }

TEST(ReadTest, RejectsHostileFiles) {
  const std::string ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  EXPECT_TRUE(SafetensorsFile::FromBytes(File(ok, "abcd"), "ok").ok());
  // trailing byte, missing byte
  EXPECT_FALSE(SafetensorsFile::FromBytes(File(ok, "abcde"), "t").ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(File(ok, "abc"), "t").ok());
  // header length past the end / over the cap
  EXPECT_FALSE(SafetensorsFile::FromBytes(U64(1000) + "{}", "t").ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(U64(kMaxHeaderBytes + 1) + "{}", "t").ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes("1234", "t").ok());
  // gap, overlap, extent not matching the shape, bad dtype, duplicate key
  EXPECT_FALSE(SafetensorsFile::FromBytes(
                   File("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", "abcdefgh"), "t")
                   .ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(
                   File("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                        "abcd"),
                   "t")
                   .ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(
                   File("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", "abcd"), "t")
                   .ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(
                   File("{\"x\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "a"), "t")
                   .ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(File(ok.substr(0, ok.size() - 1) + ",\"x\":1}", "abcd"), "t").ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(
                   File("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "abcd"), "t")
                   .ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(
                   File("{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", "abcd"),
                   "t")
                   .ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(File("{\"__metadata__\":{\"a\":1}}", ""), "t").ok());
  EXPECT_FALSE(SafetensorsFile::FromBytes(File("[]", ""), "t").ok());
}

}  // namespace
}  // namespace ucp::safetensors
