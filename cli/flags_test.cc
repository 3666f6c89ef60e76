#include "cli/flags.h"

#include "gtest/gtest.h"

namespace ucp::cli {
namespace {

std::vector<char*> Argv(std::vector<std::string>& args) {
  std::vector<char*> out;
  for (auto& a : args) out.push_back(a.data());
  return out;
}

TEST(FlagSetTest, ParsesEveryForm) {
  FlagSet f("convert", "test");
  std::string in, out;
  int64_t n = 0;
  int m = 0;
  bool b = false, strict = true, nb = true;
  f.String("input_folder", &in, "in", true);
  f.String("output_folder", &out, "out");
  f.Int("n", &n, "n");
  f.Int32("m", &m, "m");
  f.Bool("explain", &b, "b");
  f.Bool("verbose", &nb, "v");
  f.NegatedBool("no_strict", &strict, "s");
  f.Ignored("num_merge_workers", true, "ignored");
  std::vector<std::string> args = {"convert", "--input_folder=a", "--output_folder", "b", "--n=5", "-m", "7",
                                   "--explain", "--no_strict", "--noverbose", "--num_merge_workers", "3", "pos"};
  auto argv = Argv(args);
  auto pos = f.Parse(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(pos.ok()) << pos.status();
  EXPECT_EQ(in, "a");
  EXPECT_EQ(out, "b");
  EXPECT_EQ(n, 5);
  EXPECT_EQ(m, 7);
  EXPECT_TRUE(b);
  EXPECT_FALSE(strict);
  EXPECT_FALSE(nb);
  EXPECT_EQ(*pos, std::vector<std::string>{"pos"});
  EXPECT_EQ(f.Names(), (std::vector<std::string>{"input_folder", "output_folder", "n", "m", "explain", "verbose",
                                                  "no_strict", "num_merge_workers"}));
}

TEST(FlagSetTest, NegatedBoolTakesAnExplicitValue) {
  for (const auto& [arg, expected] : std::vector<std::pair<std::string, bool>>{
           {"--no_strict", false}, {"--no_strict=true", false}, {"--no_strict=false", true}, {"--no_strict=0", true}}) {
    FlagSet f("convert", "test");
    bool strict = true;
    f.NegatedBool("no_strict", &strict, "s");
    std::vector<std::string> args = {"convert", arg};
    auto argv = Argv(args);
    ASSERT_TRUE(f.Parse(static_cast<int>(argv.size()), argv.data()).ok()) << arg;
    EXPECT_EQ(strict, expected) << arg;
  }
  FlagSet f("convert", "test");
  bool strict = true;
  f.NegatedBool("no_strict", &strict, "s");
  std::vector<std::string> args = {"convert", "--no_strict=maybe"};
  auto argv = Argv(args);
  EXPECT_EQ(f.Parse(static_cast<int>(argv.size()), argv.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FlagSetTest, RejectsUnknownMissingAndBadValues) {
  {
    FlagSet f("x", "t");
    std::string in;
    f.String("input_folder", &in, "in", true);
    std::vector<std::string> args = {"x", "--input_folderr=a"};
    auto argv = Argv(args);
    auto s = f.Parse(static_cast<int>(argv.size()), argv.data());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("unknown flag --input_folderr"), std::string::npos);
  }
  {
    FlagSet f("x", "t");
    std::string in;
    f.String("input_folder", &in, "in", true);
    std::vector<std::string> args = {"x"};
    auto argv = Argv(args);
    auto s = f.Parse(static_cast<int>(argv.size()), argv.data());
    EXPECT_NE(s.status().message().find("--input_folder is required"), std::string::npos);
  }
  {
    FlagSet f("x", "t");
    int64_t n = 0;
    f.Int("n", &n, "n");
    std::vector<std::string> args = {"x", "--n=abc"};
    auto argv = Argv(args);
    EXPECT_FALSE(f.Parse(static_cast<int>(argv.size()), argv.data()).ok());
  }
}

TEST(FlagSetTest, HelpListsEveryFlag) {
  FlagSet f("reshard", "summary");
  std::string a;
  int b = 2;
  f.String("input_folder", &a, "where to read", true);
  f.Int32("tp", &b, "tensor parallel");
  std::vector<std::string> args = {"reshard", "--help"};
  auto argv = Argv(args);
  ASSERT_TRUE(f.Parse(static_cast<int>(argv.size()), argv.data()).ok());
  EXPECT_TRUE(f.help_requested());
  const std::string usage = f.Usage();
  EXPECT_NE(usage.find("--input_folder=VALUE"), std::string::npos);
  EXPECT_NE(usage.find("(required)"), std::string::npos);
  EXPECT_NE(usage.find("--tp=N"), std::string::npos);
  EXPECT_NE(usage.find("[default 2]"), std::string::npos);
}

}  // namespace
}  // namespace ucp::cli

namespace ucp::cli {
namespace {

// Fuzz failures print 64-bit seeds; `ucp_conformance fuzz --seed=` must take them back.
TEST(FlagSetTest, Uint64TakesTheFullRange) {
  FlagSet f("fuzz", "");
  uint64_t seed = 1;
  f.Uint64("seed", &seed, "");
  std::vector<std::string> args = {"fuzz", "--seed=14309164124395595551"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_TRUE(f.Parse(static_cast<int>(argv.size()), argv.data()).ok());
  EXPECT_EQ(seed, 14309164124395595551ull);
  args[1] = "--seed=-1";
  argv.clear();
  for (auto& a : args) argv.push_back(a.data());
  EXPECT_FALSE(f.Parse(static_cast<int>(argv.size()), argv.data()).ok());
}

}  // namespace
}  // namespace ucp::cli
