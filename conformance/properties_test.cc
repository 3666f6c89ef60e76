// The conformance properties (properties.h), each on >= 200 generated cases
// (UCP_CONFORMANCE_CASES overrides the count; RC_PARAMS="seed=N" fixes the
// seed, which a failure prints together with the shrunk case).
#include "conformance/properties.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "rapidcheck.h"

namespace ucp::conformance {
namespace {

constexpr int kCiCases = 200;

int Cases() {
  int n = kCiCases;
  if (const char* s = std::getenv("UCP_CONFORMANCE_CASES")) (void)absl::SimpleAtoi(s, &n);
  return n;
}

void RunProperty(Property p, const CaseGenOptions& gen = {}) {
  FuzzOptions o;
  o.seed = rc::detail::configuration().testParams.seed;
  o.cases = Cases();
  o.properties = {p};
  o.gen = gen;
  const FuzzReport r = RunFuzz(o);
  std::cout << "property (" << PropertyLetter(p) << ") " << PropertyName(p) << ": seed " << o.seed << ", "
            << r.cases_passed << " cases passed\n"
            << r.distribution.ToString();
  EXPECT_TRUE(r.passed) << "property (" << PropertyLetter(p) << ") failed after " << r.cases_passed
                        << " cases; seed " << o.seed << "\n"
                        << r.failure << "\nshrunk case:\n"
                        << r.shrunk_case << "replay: " << r.replay;
  if (r.passed) EXPECT_EQ(r.cases_passed, o.cases);
}

TEST(ConformanceTest, ConvertIsTopologyFree) { RunProperty(Property::kConvertIsTopologyFree); }
TEST(ConformanceTest, ReshardMatchesSave) { RunProperty(Property::kReshardMatchesSave); }
TEST(ConformanceTest, DirectReshardMatchesTwoStep) { RunProperty(Property::kDirectReshardMatchesTwoStep); }
TEST(ConformanceTest, CorruptionsAreCaught) { RunProperty(Property::kCorruptionsAreCaught); }
TEST(ConformanceTest, SaveMatchesDeepSpeedLayout) { RunProperty(Property::kSaveMatchesDeepSpeedLayout); }

// The runner itself: a failure shrinks to a minimal model and reports the seed.
TEST(FuzzRunnerTest, ShrinksAFailureToAMinimalCaseAndReportsTheSeed) {
  FuzzOptions o;
  o.seed = 42;
  o.cases = 200;
  o.properties = {};
  o.gen.hf_one_in = 0;  // the shrinking of the non-Hugging Face generator
  // "Fails" for any model with a row-parallel param saved at tp >= 2.
  o.case_check = [](const GoldenCase& c) -> absl::Status {
    for (const ModelParam& p : c.model().param()) {
      if (p.rule().kind() == ROW && c.source().tp() >= 2) return absl::InternalError("row-parallel param at tp >= 2");
    }
    return absl::OkStatus();
  };
  const FuzzReport r = RunFuzz(o);
  ASSERT_FALSE(r.passed);
  EXPECT_EQ(r.failure, "row-parallel param at tp >= 2");
  GoldenCase shrunk;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(r.shrunk_case, &shrunk)) << r.shrunk_case;
  ASSERT_EQ(shrunk.model().param_size(), 1) << r.shrunk_case;
  EXPECT_EQ(shrunk.model().param(0).rule().kind(), ROW);
  EXPECT_EQ(shrunk.source().tp(), 2);
  EXPECT_EQ(shrunk.source().pp(), 1);
  EXPECT_EQ(shrunk.source().dp(), 1);
  EXPECT_EQ(shrunk.target().tp(), 1);
  EXPECT_FALSE(shrunk.model().pipeline());
  EXPECT_NE(r.replay.find("--seed=42"), std::string::npos) << r.replay;
  // The same seed replays the same run.
  const FuzzReport again = RunFuzz(o);
  EXPECT_EQ(again.cases_passed, r.cases_passed);
  EXPECT_EQ(again.shrunk_case, r.shrunk_case);
}

}  // namespace
}  // namespace ucp::conformance
