// `ucp verify` through the registry on the formats that had no verifier of
// their own before formats/ (ZeRO-3, native MoE, DeepSpeed's stage-3
// universal layout): a good folder verifies, and a copy with one damaged
// byte in a tensor record, or a file missing, is reported with the file's
// name. (tools:verify_fixtures_test runs every fixture folder.)
#include "formats/verify.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "formats/builtin/builtin.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"

namespace ucp::formats {
namespace {

using ucp::testing::FreshTempDir;
using ucp::testing::RunCommand;
using ucp::testing::VersionFixturePath;

std::string CopyOf(const std::string& version, const std::string& fixture, const std::string& name) {
  const std::string dst = JoinPath(FreshTempDir(name), "ckpt");
  auto copied = RunCommand("cp -rL '" + VersionFixturePath(version, fixture) + "' '" + dst + "'");
  EXPECT_TRUE(copied.ok()) << copied.status();
  return dst;
}

// Flips one byte in the middle of the largest stored record of a .pt file.
void Flip(const std::string& path) {
  const std::string script =
      "import sys, zipfile\n"
      "p = sys.argv[1]\n"
      "z = zipfile.ZipFile(p)\n"
      "i = max((i for i in z.infolist() if '/data/' in i.filename), key=lambda i: i.file_size)\n"
      "f = open(p, 'r+b'); f.seek(i.header_offset + 26)\n"
      "n, m = int.from_bytes(f.read(2), 'little'), int.from_bytes(f.read(2), 'little')\n"
      "at = i.header_offset + 30 + n + m + i.file_size // 2\n"
      "f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x40]))\n";
  const std::string py = JoinPath(FreshTempDir("flip"), "flip.py");
  std::ofstream(py) << script;
  auto ran = RunCommand(std::string(ucp::testing::kPython) + " '" + py + "' '" + path + "'");
  ASSERT_TRUE(ran.ok()) << ran.status();
}

std::string Problems(const VerifyResult& r) { return absl::StrJoin(r.problems, "\n"); }

TEST(VerifyTest, Zero3FolderGoodAndDamaged) {
  const std::string dir = JoinPath(CopyOf("0.19.5", "gpt-zero3-dp2", "z3"), "global_step4");
  VerifyResult good = VerifyFolder(builtin::Formats(), dir);
  EXPECT_TRUE(good.problems.empty()) << Problems(good);
  EXPECT_EQ(good.kind, "zero3");
  EXPECT_EQ(good.files_checked, 4);
  const std::string optim = JoinPath(dir, "zero_pp_rank_1_mp_rank_00_optim_states.pt");
  Flip(optim);
  VerifyResult bad = VerifyFolder(builtin::Formats(), dir);
  ASSERT_EQ(bad.problems.size(), 1u) << Problems(bad);
  EXPECT_TRUE(absl::StrContains(bad.problems[0], optim)) << bad.problems[0];
}

TEST(VerifyTest, MoeFolderGoodAndDamaged) {
  const std::string dir = JoinPath(CopyOf("0.19.5", "gpt-moe-ep2-zero2-dp2", "moe"), "global_step4");
  VerifyResult good = VerifyFolder(builtin::Formats(), dir);
  EXPECT_TRUE(good.problems.empty()) << Problems(good);
  EXPECT_EQ(good.kind, "moe");
  const std::string expert = JoinPath(dir, "layer_1_expert_3_mp_rank_00_model_states.pt");
  Flip(expert);
  VerifyResult bad = VerifyFolder(builtin::Formats(), dir);
  ASSERT_FALSE(bad.problems.empty());
  EXPECT_TRUE(absl::StrContains(Problems(bad), "layer_1_expert_3_mp_rank_00_model_states.pt")) << Problems(bad);
}

TEST(VerifyTest, Zero3UniversalLayoutGoodDamagedAndIncomplete) {
  const std::string dir =
      JoinPath(CopyOf("0.19.5", "gpt-zero3-dp2", "z3u"), "global_step4_universal_deepspeed");
  VerifyResult good = VerifyFolder(builtin::Formats(), dir);
  EXPECT_TRUE(good.problems.empty()) << Problems(good);
  EXPECT_EQ(good.kind, "universal (ZeRO-3)");
  EXPECT_GT(good.files_checked, 100);
  const std::string state = JoinPath(dir, "zero/h.0.attn_qkv.weight/exp_avg.pt");
  Flip(state);
  VerifyResult bad = VerifyFolder(builtin::Formats(), dir);
  ASSERT_EQ(bad.problems.size(), 1u) << Problems(bad);
  EXPECT_TRUE(absl::StrContains(bad.problems[0], "h.0.attn_qkv.weight/exp_avg.pt")) << bad.problems[0];
  ASSERT_EQ(std::remove(JoinPath(dir, "zero/h.0.attn_proj.bias/fp32.pt").c_str()), 0);
  VerifyResult missing = VerifyFolder(builtin::Formats(), dir);
  EXPECT_TRUE(absl::StrContains(Problems(missing), "h.0.attn_proj.bias: holds [exp_avg, exp_avg_sq], expected "
                                                   "[exp_avg, exp_avg_sq, fp32] with fp32"))
      << Problems(missing);
}

TEST(VerifyTest, UnrecognizedFolderIsAProblemNamingIt) {
  const std::string dir = FreshTempDir("empty_ckpt");
  VerifyResult r = VerifyFolder(builtin::Formats(), dir);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_TRUE(absl::StrContains(r.problems[0], dir + ": unrecognized checkpoint layout")) << r.problems[0];
}

}  // namespace
}  // namespace ucp::formats
