// `ucp rules`: the presets (savanna's shape-conditioned rules included) and
// `--suggest`, on the real DeepSpeed NeoX fixture with presets disabled.
#include <string>
#include <vector>

#include "base/fs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rules/rules.h"
#include "testing/fixtures.h"
#include "tools/commands.h"

namespace ucp::tools {
namespace {

using ::testing::HasSubstr;

int RunUcpRules(std::vector<std::string> args) {
  args.insert(args.begin(), "rules");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return RunRules(static_cast<int>(argv.size()), argv.data());
}

TEST(CmdRulesTest, PrintsTheSavannaPresetWithItsRankConditions) {
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunUcpRules({"--preset=savanna"}), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_THAT(out, HasSubstr("# preset savanna"));
  EXPECT_THAT(out, HasSubstr("ndim: 3"));
  auto rules = rules::ParseRulesText(out, "stdout");
  ASSERT_TRUE(rules.ok()) << rules.status();
  EXPECT_GT(rules->rule_size(), 20);
}

TEST(CmdRulesTest, SuggestWritesAnEditableRulesFile) {
  const std::string out = JoinPath(ucp::testing::FreshTempDir("cmd_rules_suggest"), "suggested.textproto");
  ASSERT_EQ(RunUcpRules({"--suggest", "--input_folder=" + ucp::testing::FixturePath("neox-tp2-pp1-dp1/global_step4"),
                 "--preset=none", "--num_threads=1", "--output=" + out}),
            0);
  auto text = ReadFileToString(out);
  ASSERT_TRUE(text.ok()) << text.status();
  auto rules = rules::ParseRulesText(*text, out);
  ASSERT_TRUE(rules.ok()) << rules.status();
  EXPECT_EQ(rules->rule_size(), 13);
  EXPECT_THAT(*text, HasSubstr("rule { pattern: \"\\\\d+\\\\.attention\\\\.dense\\\\.weight$\" kind: ROW }"));
  EXPECT_THAT(*text, HasSubstr("dim 0 is hidden_size 64 and dim 1 (32) is not"));
  // Without a checkpoint there is nothing to suggest from.
  EXPECT_EQ(RunUcpRules({"--suggest"}), 1);
}

}  // namespace
}  // namespace ucp::tools
