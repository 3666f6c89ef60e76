#include "base/fs.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
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

// --fsync=false reaches Commit: the flag survives the moves out of Create's
// StatusOr (the move constructor once dropped it, and every commit fsynced).
TEST(FsTest, StagingDirKeepsItsSyncFlagThroughMoves) {
  const std::string root = TempDir() + "/staging_sync";
  ASSERT_TRUE(MakeDirs(root).ok());
  for (bool sync : {false, true}) {
    auto created = StagingDir::Create(JoinPath(root, sync ? "synced" : "unsynced"), false, sync);
    ASSERT_TRUE(created.ok()) << created.status();
    StagingDir moved(std::move(*created));
    EXPECT_EQ(moved.syncs(), sync);
    auto other = StagingDir::Create(JoinPath(root, sync ? "other_synced" : "other_unsynced"), false, !sync);
    ASSERT_TRUE(other.ok()) << other.status();
    *other = std::move(moved);
    EXPECT_EQ(other->syncs(), sync);
    ASSERT_TRUE(other->Commit().ok());
  }
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

std::string Fresh(const std::string& name) {
  const std::string d = JoinPath(TempDir(), name);
  EXPECT_TRUE(RemoveTree(d).ok());
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

// d05: --overwrite replaces only what ucp wrote (it carries the marker).
TEST(FsTest, OverwriteReplacesOnlyUcpOutputs) {
  const std::string root = Fresh("overwrite_only_ucp");
  const std::string user = JoinPath(root, "user_data");
  ASSERT_TRUE(MakeDirs(user).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(user, "weights.pt"), "precious").ok());
  auto refused = StagingDir::Create(user, /*overwrite=*/true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("not a ucp output"), std::string::npos) << refused.status();
  EXPECT_EQ(*ReadFileToString(JoinPath(user, "weights.pt")), "precious");
  // A ucp output (written through a StagingDir) can be replaced.
  const std::string out = JoinPath(root, "out");
  {
    auto s = StagingDir::Create(out);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(s->Commit().ok());
  }
  EXPECT_TRUE(PathExists(JoinPath(out, kUcpOutputMarker)));
  EXPECT_TRUE(IsReplaceableOutput(out));
  auto again = StagingDir::Create(out, /*overwrite=*/true);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->Commit().ok());
}

// d05, d06: the output may not be the input, lie inside it or contain it,
// whatever path spells it (symlinks, trailing slashes, `..`).
TEST(FsTest, OutputMustStayApartFromInputs) {
  const std::string root = Fresh("apart_from_inputs");
  const std::string in = JoinPath(root, "ck/global_step4");
  ASSERT_TRUE(MakeDirs(in).ok());
  ASSERT_EQ(symlink(in.c_str(), JoinPath(root, "link").c_str()), 0);
  for (const std::string& bad : {in, in + "/", JoinPath(root, "ck"), root, JoinPath(in, "univ"),
                                 JoinPath(root, "link"), JoinPath(root, "link/sub/deeper"),
                                 JoinPath(root, "ck/global_step4/../global_step4")}) {
    absl::Status s = CheckOutputApartFromInputs(bad, {in});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message().rfind(bad, 0), 0u) << s;
  }
  for (const std::string& good : {JoinPath(root, "ck/global_step4_universal"), JoinPath(root, "other/x"),
                                  JoinPath(root, "ck/global_step4x")}) {
    EXPECT_TRUE(CheckOutputApartFromInputs(good, {in}).ok()) << good;
  }
}

// d10: a staging folder of a process that died (kill -9) is removed by the
// next run; one of a live process, or of another host, is not.
TEST(FsTest, StaleStagingOfDeadProcessesIsRemoved) {
  const std::string root = Fresh("stale_staging");
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  char host[256] = {0};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string dead = JoinPath(root, absl::StrCat(".u.ucp-tmp-", host, "-", child));
  const std::string live = JoinPath(root, absl::StrCat(".v.ucp-tmp-", host, "-", getppid()));
  const std::string elsewhere = JoinPath(root, absl::StrCat(".w.ucp-tmp-otherhost-", child));
  for (const auto& d : {dead, live, elsewhere}) {
    ASSERT_TRUE(MakeDirs(JoinPath(d, "zero")).ok());
    ASSERT_TRUE(WriteFileAtomic(JoinPath(d, "zero/f"), "partial").ok());
  }
  auto s = StagingDir::Create(JoinPath(root, "u"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(PathExists(dead));
  EXPECT_TRUE(PathExists(live));
  EXPECT_TRUE(PathExists(elsewhere));
  ASSERT_EQ(s->notes().size(), 1u);
  EXPECT_NE(s->notes()[0].find(dead), std::string::npos) << s->notes()[0];
}

// d10: SIGINT, SIGTERM and SIGHUP remove the staging folder, and the process
// still ends by that signal.
TEST(FsTest, SignalsRemoveTheStagingFolder) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    const std::string root = Fresh(absl::StrCat("signal_staging_", sig));
    const std::string ready = JoinPath(root, "ready");
    const pid_t child = fork();
    if (child == 0) {
      signal(sig, SIG_DFL);
      InstallStagingCleanupOnSignals();
      auto s = StagingDir::Create(JoinPath(root, "out"));
      if (!s.ok()) _exit(3);
      if (!WriteFileAtomic(JoinPath(s->path(), "big.pt"), std::string(1 << 20, 'x')).ok()) _exit(4);
      if (!WriteFileAtomic(ready, s->path()).ok()) _exit(5);
      while (true) pause();
    }
    ASSERT_GT(child, 0);
    for (int i = 0; i < 500 && !PathExists(ready); ++i) usleep(10000);
    ASSERT_TRUE(PathExists(ready));
    const std::string staging = *ReadFileToString(ready);
    EXPECT_TRUE(PathExists(staging));
    ASSERT_EQ(kill(child, sig), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    EXPECT_FALSE(PathExists(staging)) << staging;
    EXPECT_FALSE(PathExists(JoinPath(root, "out")));
  }
}

// d01, d12: a FIFO is refused without blocking; a file larger than expected
// is refused before it is read.
TEST(FsTest, ReadFileToStringRefusesFifosAndHugeFiles) {
  const std::string root = Fresh("read_fifo");
  const std::string fifo = JoinPath(root, "latest");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  auto r = ReadFileToString(fifo);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("a FIFO"), std::string::npos) << r.status();
  std::string digest;
  EXPECT_FALSE(FileDigestOf(fifo, DigestKind::kSha256, &digest).ok());
  const std::string big = JoinPath(root, "big");
  ASSERT_TRUE(WriteFileAtomic(big, std::string(10000, 'a')).ok());
  auto b = ReadFileToString(big, 4096);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_LT(b.status().message().size(), 300u);
  EXPECT_TRUE(ReadFileToString(big, 10000).ok());
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

TEST(FsTest, CopyFileReportsEveryWrittenRangeInSteps) {
  const std::string from = JoinPath(TempDir(), "copy_steps_from");
  const std::string to = JoinPath(TempDir(), "copy_steps_to");
  // Two whole steps and a part of a third.
  const size_t size = 2 * kCopyStepBytes + 3 * 1000 * 1000 + 7;
  std::string data(size, 'x');
  for (size_t i = 0; i < size; i += 4093) data[i] = static_cast<char>('a' + i % 26);
  ASSERT_TRUE(WriteFileAtomic(from, data).ok());
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::string digest;
  ASSERT_TRUE(CopyFile(from, to, &digest, DigestKind::kSha256, [&](int fd, uint64_t offset, uint64_t len) {
                EXPECT_GE(fd, 0);
                // Reported once written: the file holds them already.
                struct stat st;
                ASSERT_EQ(fstat(fd, &st), 0);
                EXPECT_GE(static_cast<uint64_t>(st.st_size), offset + len);
                ranges.push_back({offset, len});
              }).ok());
  EXPECT_EQ(*ReadFileToString(to, size), data);
  EXPECT_EQ(digest, Sha256Hex(data));
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0], std::make_pair(uint64_t{0}, kCopyStepBytes));
  EXPECT_EQ(ranges[1], std::make_pair(kCopyStepBytes, kCopyStepBytes));
  EXPECT_EQ(ranges[2], std::make_pair(2 * kCopyStepBytes, uint64_t{size} - 2 * kCopyStepBytes));
}

}  // namespace
}  // namespace ucp
