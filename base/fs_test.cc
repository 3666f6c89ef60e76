#include "base/fs.h"

#include <cstdlib>

#include "base/sha256.h"
#include "gtest/gtest.h"

namespace ucp {
namespace {

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

TEST(FsTest, PathPieces) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(Dirname("/x/y/z"), "/x/y");
  EXPECT_EQ(Dirname("/x/y/z/"), "/x/y");
  EXPECT_EQ(Basename("/x/y/z/"), "z");
  EXPECT_EQ(Dirname("z"), ".");
}

TEST(FsTest, StagingDirCommitsOrCleansUp) {
  const std::string target = JoinPath(TempDir(), "staging_out");
  ASSERT_TRUE(RemoveTree(target).ok());
  {
    auto staging = StagingDir::Create(target);
    ASSERT_TRUE(staging.ok()) << staging.status();
    ASSERT_TRUE(WriteFileAtomic(JoinPath(staging->path(), "f"), "x").ok());
    EXPECT_TRUE(PathExists(staging->path()));
    EXPECT_FALSE(PathExists(target));
    // Dropped without Commit: nothing left.
  }
  auto names = ListDirectory(TempDir());
  ASSERT_TRUE(names.ok());
  for (const auto& n : *names) EXPECT_EQ(n.find("staging_out"), std::string::npos) << n;

  auto staging = StagingDir::Create(target);
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(staging->path(), "f"), "hello").ok());
  ASSERT_TRUE(staging->Commit().ok());
  EXPECT_EQ(*ReadFileToString(JoinPath(target, "f")), "hello");
  // A second one refuses to replace it unless asked to.
  EXPECT_EQ(StagingDir::Create(target).status().code(), absl::StatusCode::kAlreadyExists);
  auto again = StagingDir::Create(target, /*overwrite=*/true);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(again->path(), "g"), "new").ok());
  ASSERT_TRUE(again->Commit().ok());
  EXPECT_FALSE(PathExists(JoinPath(target, "f")));
  EXPECT_EQ(*ReadFileToString(JoinPath(target, "g")), "new");
}

TEST(FsTest, CopyFileHashesWhatItCopies) {
  const std::string from = JoinPath(TempDir(), "copy_from");
  const std::string to = JoinPath(TempDir(), "copy_to");
  std::string data(5 << 20, 'a');
  data[12345] = 'b';
  ASSERT_TRUE(WriteFileAtomic(from, data).ok());
  std::string digest;
  ASSERT_TRUE(CopyFile(from, to, &digest).ok());
  EXPECT_EQ(*ReadFileToString(to), data);
  EXPECT_EQ(digest, Sha256Hex(data));
  EXPECT_EQ(CopyFile(JoinPath(TempDir(), "missing"), to).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ucp
