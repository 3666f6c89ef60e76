// The `ucp_conformance fuzz` / `golden` and `ucp demo` commands: flags, output, exit codes.
#include "conformance/commands.h"
#include "conformance/demo_command.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "conformance/golden.h"
#include "ops/convert.h"
#include "google/protobuf/text_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"

namespace ucp::conformance {
namespace {

using ::testing::HasSubstr;
using ucp::testing::FreshTempDir;
using ucp::testing::RunfilePath;

const char kCase[] = "testdata/golden/neox_zero1_mp2_to_mp1";

// Runs a command with argv = {args...}; returns (exit code, stdout).
std::pair<int, std::string> RunCommand(int (*command)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  const int code = command(static_cast<int>(argv.size()), argv.data());
  return {code, ::testing::internal::GetCapturedStdout()};
}

TEST(CommandsTest, FuzzRunsAndPrintsTheDistribution) {
  const std::string work = FreshTempDir("fuzz_cmd");
  auto [code, out] = RunCommand(&RunFuzzCommand, {"fuzz", "--seed=7", "--cases=3", "--workdir=" + work});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("ucp_conformance fuzz: seed 7, 3 cases"));
  EXPECT_THAT(out, HasSubstr("param kinds (params)"));
  EXPECT_THAT(out, HasSubstr("style"));
  EXPECT_THAT(out, HasSubstr("passed: 3 cases"));
}

TEST(CommandsTest, FuzzReplaysOneCase) {
  const std::string work = FreshTempDir("fuzz_replay");
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok());
  // A small model: the golden case's, without its transformer layers but one.
  GoldenCase small = *c;
  small.mutable_model()->clear_param();
  for (const auto& p : c->model().param()) {
    if (p.layer() == 0 || p.layer() == 2 || p.layer() >= 11) *small.mutable_model()->add_param() = p;
  }
  std::string text;
  google::protobuf::TextFormat::PrintToString(small, &text);
  ASSERT_TRUE(WriteFileAtomic(JoinPath(work, "case.textproto"), text).ok());
  auto [code, out] = RunCommand(&RunFuzzCommand, {"fuzz", "--case=" + JoinPath(work, "case.textproto"), "--properties=bc",
                                           "--workdir=" + JoinPath(work, "scratch")});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("(b) reshard(convert(save(M, T1)), T2) == save(M, T2): ok"));
  EXPECT_THAT(out, HasSubstr("(c) ZeRO -> ZeRO reshard == the two-step path: ok"));
}

TEST(CommandsTest, FuzzRejectsBadFlags) {
  EXPECT_EQ(RunCommand(&RunFuzzCommand, {"fuzz", "--properties=x"}).first, 1);
  EXPECT_EQ(RunCommand(&RunFuzzCommand, {"fuzz", "--cases=0"}).first, 1);
  EXPECT_EQ(RunCommand(&RunFuzzCommand, {"fuzz", "--nope"}).first, 1);
}

TEST(CommandsTest, GoldenCheckPassesUcpAndNamesWhatDeepSpeedGetsWrong) {
  const std::string work = FreshTempDir("golden_cmd");
  const std::string golden = RunfilePath(kCase);
  auto [code, out] = RunCommand(&RunGoldenCommand, {"golden", "source", "--golden=" + golden, "--output=" + JoinPath(work, "src")});
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("--preset=gpt-neox --original_vocab_size=50"));
  auto c = ReadGoldenCase(golden);
  ASSERT_TRUE(c.ok());
  auto run = RunGoldenCase(*c, JoinPath(work, "ucp"));
  ASSERT_TRUE(run.ok()) << run.status();
  std::tie(code, out) = RunCommand(&RunGoldenCommand, {"golden", "check", "--golden=" + golden, "--universal=" + run->universal});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("matches the golden neox_zero1_mp2_to_mp1"));
  // Everything on dim 0, as DeepSpeed without patterns.
  ASSERT_TRUE(WriteFileAtomic(JoinPath(work, "cat0.textproto"), "rule { pattern: \".*\" kind: COLUMN }").ok());
  ops::ConvertOptions o;
  o.input_folder = JoinPath(work, "src");  // the root: its `latest` names the tag
  o.output_folder = JoinPath(work, "deepspeed_like/global_step5_universal");
  o.state.rules.rules_file = JoinPath(work, "cat0.textproto");
  ASSERT_TRUE(ops::Convert(o).ok());
  std::tie(code, out) =
      RunCommand(&RunGoldenCommand, {"golden", "check", "--golden=" + golden, "--universal=" + JoinPath(work, "deepspeed_like")});
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("param 9.input_layernorm.scale:"));
  EXPECT_THAT(out, HasSubstr("param 2.attention.dense.weight:"));
  EXPECT_THAT(out, HasSubstr("51 param(s) differ from the golden neox_zero1_mp2_to_mp1"));
}

TEST(CommandsTest, GoldenRejectsBadUsage) {
  EXPECT_EQ(RunCommand(&RunGoldenCommand, {"golden"}).first, 1);
  EXPECT_EQ(RunCommand(&RunGoldenCommand, {"golden", "frobnicate", "--golden=x"}).first, 1);
  EXPECT_EQ(RunCommand(&RunGoldenCommand, {"golden", "check", "--golden=" + RunfilePath(kCase)}).first, 1);  // no --universal
}

TEST(CommandsTest, DemoPrintsItsSummary) {
  auto [code, out] = RunCommand(&RunDemoCommand, {"demo", "--workdir=" + FreshTempDir("demo_cmd")});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("all bitwise equal"));
}

}  // namespace
}  // namespace ucp::conformance
