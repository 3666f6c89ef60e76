// Every .pt file of the DeepSpeed 0.14.4 fixtures (../shared/fixtures):
//  (a) the C++ reader's canonical dump equals Python's (torch.load via
//      testdata/canonical_dump.py), line for line;
//  (b) read -> TorchWriter -> torch.load gives the same dump (tensors
//      bitwise equal: the dump holds their sha256), the C++ reader reads its
//      own output back identically, and the written file is byte-identical
//      to the one DeepSpeed/torch wrote.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/torch/dump.h"
#include "format/torch/test_util.h"
#include "format/torch/torch_file.h"
#include "format/torch/torch_test_util.h"
#include "format/torch/tree_copy.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using testing::DiffExcerpt;

constexpr int kMaxReported = 10;

std::vector<std::string> Fixtures() {
  std::vector<std::string> files = testing::FindTorchFiles(testing::FixturesRoot());
  EXPECT_GT(files.size(), 2000u) << "fixtures missing under " << testing::FixturesRoot();
  return files;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

TEST(FixturesInteropTest, CppDumpEqualsPythonDump) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> files = Fixtures();
  auto python = testing::PythonDumps(files);
  ASSERT_TRUE(python.ok()) << python.status();
  const double python_seconds = Seconds(start);
  int mismatches = 0, lines = 0;
  for (const std::string& path : files) {
    auto file = TorchFile::Open(path);
    std::string cpp;
    if (!file.ok()) {
      cpp = absl::StrCat("!C++ error ", file.status().ToString(), "\n");
    } else {
      auto dump = CanonicalDump(**file);
      cpp = dump.ok() ? *dump : absl::StrCat("!C++ dump error ", dump.status().ToString(), "\n");
    }
    const std::string& expected = (*python)[path];
    lines += static_cast<int>(std::count(cpp.begin(), cpp.end(), '\n'));
    if (expected != cpp && ++mismatches <= kMaxReported) {
      ADD_FAILURE() << path << ":\n" << DiffExcerpt(expected, cpp);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << files.size() << " files";
  std::printf("%zu files, %d dump lines, python %.1f s, total %.1f s\n", files.size(), lines, python_seconds,
              Seconds(start));
}

TEST(FixturesInteropTest, RoundTripThroughTorchWriter) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> files = Fixtures();
  const std::string root = testing::FixturesRoot();
  const std::string out_root = testing::TempPath("roundtrip");
  std::vector<std::string> outputs;
  std::map<std::string, std::string> cpp_dumps;
  int byte_identical = 0, reread_mismatches = 0;
  for (const std::string& path : files) {
    auto file = TorchFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    TorchWriter writer;
    auto copy = CopyTreeForWrite(file->get(), (*file)->root(), writer);
    ASSERT_TRUE(copy.ok()) << path << ": " << copy.status();
    // Same file name (hence the same record stem) in a mirror tree. The
    // relative path is taken lexically: std::filesystem::relative resolves
    // the runfiles symlinks and would point back at the fixture itself.
    ASSERT_EQ(path.compare(0, root.size() + 1, root + "/"), 0) << path;
    const std::string relative = path.substr(root.size() + 1);
    ASSERT_EQ(relative.find(".."), std::string::npos) << path;
    const std::string out = out_root + "/" + relative;
    std::filesystem::create_directories(std::filesystem::path(out).parent_path());
    absl::Status written = writer.WriteFile(out, **copy);
    ASSERT_TRUE(written.ok()) << written;
    outputs.push_back(out);

    auto original_bytes = testing::ReadFileToString(path);
    auto written_bytes = testing::ReadFileToString(out);
    if (*original_bytes == *written_bytes) {
      ++byte_identical;
    } else {
      ADD_FAILURE() << path << ": rewritten file differs in bytes (" << original_bytes->size() << " vs "
                    << written_bytes->size() << ")";
    }
    auto reread = TorchFile::Open(out);
    ASSERT_TRUE(reread.ok()) << reread.status();
    const std::string before = *CanonicalDump(**file), after = *CanonicalDump(**reread);
    if (before != after && ++reread_mismatches <= kMaxReported) {
      ADD_FAILURE() << out << " (C++ re-read):\n" << DiffExcerpt(before, after);
    }
  }
  const double cpp_seconds = Seconds(start);
  std::vector<std::string> all = files;
  all.insert(all.end(), outputs.begin(), outputs.end());
  auto python = testing::PythonDumps(all);
  ASSERT_TRUE(python.ok()) << python.status();
  int mismatches = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& expected = (*python)[files[i]];
    const std::string& actual = (*python)[outputs[i]];
    if (expected != actual && ++mismatches <= kMaxReported) {
      ADD_FAILURE() << outputs[i] << " (torch.load of the rewritten file):\n" << DiffExcerpt(expected, actual);
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(reread_mismatches, 0);
  std::printf("%zu files rewritten, %d byte-identical; C++ %.1f s, total %.1f s\n", files.size(), byte_identical,
              cpp_seconds, Seconds(start));
}

}  // namespace
}  // namespace ucp::torch
