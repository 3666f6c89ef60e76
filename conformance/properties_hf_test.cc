// The conformance properties (properties.h) on Hugging Face cases only
// (model_gen.h, GenHfCase): tp = 1 models with transformers / peft names,
// frozen params (LoRA, frozen embeddings), tied embeddings, saved at ZeRO
// stage 0-3 and resharded to stage 0-3 at another dp, converted with no
// flags, exported (--names=checkpoint and --names=hf). Each property on
// UCP_CONFORMANCE_HF_CASES cases (default 60; RC_PARAMS="seed=N" fixes the
// seed, which a failure prints with the shrunk case).
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "conformance/properties.h"
#include "gtest/gtest.h"
#include "rapidcheck.h"

namespace ucp::conformance {
namespace {

constexpr int kCiCases = 60;

int Cases() {
  int n = kCiCases;
  if (const char* s = std::getenv("UCP_CONFORMANCE_HF_CASES")) (void)absl::SimpleAtoi(s, &n);
  return n;
}

void RunProperty(Property p) {
  FuzzOptions o;
  o.seed = rc::detail::configuration().testParams.seed;
  o.cases = Cases();
  o.properties = {p};
  o.gen.hf_only = true;
  const FuzzReport r = RunFuzz(o);
  std::cout << "property (" << PropertyLetter(p) << ") " << PropertyName(p) << " on Hugging Face cases: seed " << o.seed
            << ", " << r.cases_passed << " cases passed\n"
            << r.distribution.ToString();
  EXPECT_TRUE(r.passed) << "property (" << PropertyLetter(p) << ") failed after " << r.cases_passed << " cases; seed "
                        << o.seed << "\n"
                        << r.failure << "\nshrunk case:\n"
                        << r.shrunk_case << "replay: " << r.replay;
  if (r.passed) EXPECT_EQ(r.cases_passed, o.cases);
}

TEST(HfConformanceTest, ConvertIsTopologyFreeAndExportIsTheModel) { RunProperty(Property::kConvertIsTopologyFree); }
TEST(HfConformanceTest, ReshardMatchesSave) { RunProperty(Property::kReshardMatchesSave); }
TEST(HfConformanceTest, DirectReshardMatchesTwoStep) { RunProperty(Property::kDirectReshardMatchesTwoStep); }
TEST(HfConformanceTest, CorruptionsAreCaught) { RunProperty(Property::kCorruptionsAreCaught); }
TEST(HfConformanceTest, SaveMatchesDeepSpeedLayout) { RunProperty(Property::kSaveMatchesDeepSpeedLayout); }

}  // namespace
}  // namespace ucp::conformance
