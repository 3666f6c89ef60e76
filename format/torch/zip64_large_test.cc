// A real zip64 torch file (> 4 GiB: a record larger than 0xFFFFFFFF bytes,
// records and the central directory past 4 GiB), written by TorchWriter and
// read by torch.load and by TorchFile. Manual: it writes ~4.3 GB to
// $TEST_TMPDIR and takes tens of seconds.
//   bazel test //format/torch:zip64_large_test --test_output=all
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "format/torch/test_util.h"
#include "format/torch/torch_file.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using pickle::Value;

TEST(Zip64LargeTest, TorchLoadsAFileBeyondFourGiB) {
  const int64_t big = (int64_t{1} << 32) + 4096 + 3;  // bytes of a uint8 storage
  TorchWriter w;
  auto root = Value::MakeDict();
  root->DictSet(Value::Str("big"), w.AddStreamedTensor(DType::kUInt8, {big}, big, 0,
                                                       [](uint64_t offset, absl::Span<uint8_t> dst) {
                                                         for (size_t i = 0; i < dst.size(); ++i) {
                                                           dst[i] = static_cast<uint8_t>((offset + i) % 251);
                                                         }
                                                         return absl::OkStatus();
                                                       }));
  std::string small_bytes(12, '\0');
  for (int i = 0; i < 12; ++i) small_bytes[i] = static_cast<char>(i + 1);
  root->DictSet(Value::Str("small"), w.AddTensor(*Tensor::FromBytes(DType::kUInt8, {3, 4}, small_bytes)));
  const std::string path = testing::TempPath("zip64_large/large.pt");
  ASSERT_TRUE(w.WriteFile(path, *root).ok());
  EXPECT_GT(std::filesystem::file_size(path), uint64_t{1} << 32);

  auto file = TorchFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  Tensor b = *(*file)->GetTensor(*(*file)->root()->DictGet("big"));
  EXPECT_EQ(b.numel(), big);
  EXPECT_EQ(b.data()[big - 1], static_cast<uint8_t>((big - 1) % 251));
  Tensor s = *(*file)->GetTensor(*(*file)->root()->DictGet("small"));
  EXPECT_EQ(s.ContiguousBytes(), small_bytes);

  auto out = testing::RunPython(
      "-c", {"import sys, torch, zipfile\n"
             "z = zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None\n"
             "print([(i.filename, i.file_size, i.header_offset > 2**32) for i in z.infolist()])\n"
             "d = torch.load(sys.argv[1])\n"
             "b = d['big']\n"
             "print(b.shape[0], int(b[0]), int(b[-1]), int(b[2**32 + 17]), d['small'].tolist())\n",
             path});
  ASSERT_TRUE(out.ok()) << out.status();
  std::printf("%s", out->c_str());
  EXPECT_NE(out->find("4294971395 0 " + std::to_string((big - 1) % 251) + " " +
                      std::to_string(((int64_t{1} << 32) + 17) % 251) +
                      " [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]"),
            std::string::npos);

  // torch.save of the same tensors writes the same bytes (zip64 extras,
  // padding, 64-bit descriptors, zip64 end records included).
  const std::string reference = testing::TempPath("zip64_large/torch/large.pt");
  auto saved = testing::RunPython(
      "-c", {"import sys, numpy as np, torch\n"
             "big = 2**32 + 4096 + 3\n"
             "a = np.empty(big, dtype=np.uint8)\n"
             "for off in range(0, big, 1 << 26):\n"
             "    n = min(1 << 26, big - off)\n"
             "    a[off:off + n] = (np.arange(off, off + n, dtype=np.int64) % 251).astype(np.uint8)\n"
             "torch.save({'big': torch.from_numpy(a), 'small': torch.arange(1, 13, dtype=torch.uint8).reshape(3, 4)},"
             " sys.argv[1])\n",
             reference});
  ASSERT_TRUE(saved.ok()) << saved.status();
  FILE* x = std::fopen(path.c_str(), "rb");
  FILE* y = std::fopen(reference.c_str(), "rb");
  ASSERT_TRUE(x != nullptr && y != nullptr);
  std::string bx(1 << 24, '\0'), by(1 << 24, '\0');
  uint64_t offset = 0;
  bool same = true;
  while (same) {
    size_t nx = std::fread(bx.data(), 1, bx.size(), x), ny = std::fread(by.data(), 1, by.size(), y);
    if (nx != ny || std::memcmp(bx.data(), by.data(), nx) != 0) {
      same = false;
      for (size_t i = 0; i < std::min(nx, ny); ++i) {
        if (bx[i] != by[i]) {
          ADD_FAILURE() << "first difference at byte " << offset + i;
          break;
        }
      }
      if (nx != ny) ADD_FAILURE() << "lengths differ near " << offset;
    }
    if (nx == 0) break;
    offset += nx;
  }
  std::fclose(x);
  std::fclose(y);
  EXPECT_TRUE(same) << "ours and torch.save's files differ";
  std::filesystem::remove(path);
  std::filesystem::remove(reference);
}

}  // namespace
}  // namespace ucp::torch
