#include "formats/weights/export_writer.h"

#include <string>
#include <vector>

#include "base/fs.h"
#include "format/safetensors/safetensors.h"
#include "format/torch/torch_file.h"
#include "gtest/gtest.h"

namespace ucp::weights {

using writers::ExportTensor;
using writers::ExportWriteOptions;
using writers::ParseShardSize;

namespace {

using torch::DType;

ExportTensor Fixed(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::kFloat32,
                   DType source_dtype = DType::kFloat32) {
  ExportTensor t;
  t.name = name;
  t.shape = shape;
  t.dtype = dtype;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::string bytes(static_cast<size_t>(n) * torch::ItemSize(source_dtype), '\0');
  for (int64_t i = 0; i < n; ++i) {
    if (source_dtype == DType::kFloat32) {
      const float f = static_cast<float>(i) + 0.5f + static_cast<float>(name.size());
      std::memcpy(&bytes[static_cast<size_t>(i) * 4], &f, 4);
    }
  }
  auto tensor = torch::Tensor::FromBytes(source_dtype, shape, bytes);
  t.source = [tensor]() -> absl::StatusOr<tp::TensorPlan> { return tp::TensorPlan::FromTensor(*tensor); };
  return t;
}

TEST(ParseShardSizeTest, HubSemantics) {
  EXPECT_EQ(*ParseShardSize("5GB"), 5000000000);
  EXPECT_EQ(*ParseShardSize(" 10mb "), 10000000);
  EXPECT_EQ(*ParseShardSize("1.5KB"), 1500);
  EXPECT_EQ(*ParseShardSize("1234"), 1234);
  EXPECT_FALSE(ParseShardSize("5GiB").ok());
  EXPECT_FALSE(ParseShardSize("5G").ok());
  EXPECT_FALSE(ParseShardSize("GB").ok());
  EXPECT_FALSE(ParseShardSize("-1").ok());
}

// Worked by hand from huggingface_hub's algorithm with max 100 bytes:
// a=40 b=40 c=40 -> [a b] [c]; d=200 (oversized) gets its own shard before
// the open one; e=0, f=0: f follows e; g aliases nothing.
TEST(SplitIntoShardsTest, GreedyOversizedFirstAndFollowers) {
  std::vector<ExportTensor> t = {Fixed("a", {10}), Fixed("b", {10}), Fixed("c", {10}), Fixed("d", {50}),
                                 Fixed("e", {0}),  Fixed("f", {0}),  Fixed("g", {5})};
  t[0].aliases = {"a_alias"};
  ShardSplit s = SplitIntoShards(t, ExportFormat::kSafetensors, 100);
  ASSERT_EQ(s.files.size(), 3u);
  EXPECT_EQ(s.files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(s.files[2], "model-00003-of-00003.safetensors");
  EXPECT_EQ(s.tensors[0], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(s.tensors[1], (std::vector<size_t>{3}));
  EXPECT_EQ(s.tensors[2], (std::vector<size_t>{2, 4, 6, 5}));
  EXPECT_EQ(s.total_size, 40 * 3 + 200 + 20);
  ShardSplit one = SplitIntoShards(t, ExportFormat::kTorch, 0);
  ASSERT_EQ(one.files.size(), 1u);
  EXPECT_EQ(one.files[0], "pytorch_model.bin");
}

TEST(WriteExportTest, SafetensorsShardsIndexAndAliasMetadata) {
  const std::string out = JoinPath(::testing::TempDir(), "st_export");
  std::vector<ExportTensor> t = {Fixed("w", {4, 3}), Fixed("b", {3}), Fixed("h", {5}, DType::kBFloat16)};
  t[0].aliases = {"tied.w"};
  ExportWriteOptions o;
  o.max_shard_size = 48;  // w alone; then b (12) + h (10)
  o.extra_files = {{"config.json", "{}\n"}};
  auto stats = WriteExport(t, out, ExportFormat::kSafetensors, o);
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto index = ReadFileToString(JoinPath(out, "model.safetensors.index.json"));
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(*index,
            "{\n  \"metadata\": {\n    \"total_size\": 70\n  },\n  \"weight_map\": {\n"
            "    \"b\": \"model-00002-of-00002.safetensors\",\n"
            "    \"h\": \"model-00002-of-00002.safetensors\",\n"
            "    \"w\": \"model-00001-of-00002.safetensors\"\n  }\n}\n");
  auto f1 = safetensors::SafetensorsFile::Open(JoinPath(out, "model-00001-of-00002.safetensors"));
  ASSERT_TRUE(f1.ok()) << f1.status();
  ASSERT_EQ((*f1)->metadata().size(), 2u);
  EXPECT_EQ((*f1)->metadata()[1], (std::pair<std::string, std::string>{"tied.w", "w"}));
  auto w = (*f1)->GetTensor("w");
  ASSERT_TRUE(w.ok());
  float v;
  std::memcpy(&v, w->data() + 4 * 7, 4);
  EXPECT_EQ(v, 7.5f + 1);
  auto f2 = safetensors::SafetensorsFile::Open(JoinPath(out, "model-00002-of-00002.safetensors"));
  ASSERT_TRUE(f2.ok()) << f2.status();
  auto h = (*f2)->GetTensor("h");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->dtype(), DType::kBFloat16);
  // 2.5f = 0x40200000 -> bf16 0x4020 (exact).
  EXPECT_EQ(h->data()[2], 0x20);
  EXPECT_EQ(h->data()[3], 0x40);
  EXPECT_TRUE(PathExists(JoinPath(out, "config.json")));
}

TEST(WriteExportTest, TorchAliasSharesTheStorage) {
  const std::string out = JoinPath(::testing::TempDir(), "pt_export");
  std::vector<ExportTensor> t = {Fixed("w", {2, 3}), Fixed("b", {3})};
  t[0].aliases = {"tied.w"};
  ExportWriteOptions o;
  ASSERT_TRUE(WriteExport(t, out, ExportFormat::kTorch, o).ok());
  EXPECT_FALSE(PathExists(JoinPath(out, "pytorch_model.bin.index.json")));
  auto f = torch::TorchFile::Open(JoinPath(out, "pytorch_model.bin"));
  ASSERT_TRUE(f.ok()) << f.status();
  const auto& root = *(*f)->root();
  ASSERT_EQ(root.dict_items().size(), 3u);
  EXPECT_EQ(root.dict_items()[2].first->str(), "tied.w");
  auto a = (*f)->GetTensor(*root.DictGet("w"));
  auto b = (*f)->GetTensor(*root.DictGet("tied.w"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->storage().get(), b->storage().get());
  EXPECT_EQ((*f)->Storages().size(), 2u);
}

TEST(WriteExportTest, RefusesRepeatedNamesAndLeavesNothing) {
  const std::string out = JoinPath(::testing::TempDir(), "bad_export");
  std::vector<ExportTensor> t = {Fixed("w", {2}), Fixed("w", {2})};
  EXPECT_FALSE(WriteExport(t, out, ExportFormat::kSafetensors, ExportWriteOptions()).ok());
  EXPECT_FALSE(PathExists(out));
}

}  // namespace
}  // namespace ucp::weights
