// The conformance properties (properties.h), each on >= 200 generated cases
// (UCP_CONFORMANCE_CASES overrides the count; RC_PARAMS="seed=N" fixes the
// seed, which a failure prints together with the shrunk case).
#include "conformance/properties.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace ucp::conformance
