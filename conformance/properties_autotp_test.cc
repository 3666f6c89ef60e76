// The conformance properties (properties.h) on AutoTP cases only
// (model_gen.h GenAutoTpCase): Hugging Face-named models trained with
// DeepSpeed's AutoTP, saved at tp 1-4 and resharded to tp 1-4, uneven widths
// (intermediate sizes and vocabularies tp does not divide), Phi-3's fused
// gate_up_proj with format 0.4's sub_param_shard_widths, DeepSpeed 0.18.9,
// 0.19.5 and master 0.19.6, converted with no flags. Properties (a)-(e) on
// UCP_CONFORMANCE_AUTOTP_CASES cases each (default 40), and (f)
// AutoTpMatchesMegatron on as many cases whose sizes both tps divide.
// RC_PARAMS="seed=N" fixes the seed, which a failure prints with the shrunk case.
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "conformance/model_gen.h"
#include "conformance/properties.h"
#include "gtest/gtest.h"
#include "rapidcheck.h"

namespace ucp::conformance {
namespace {

constexpr int kCiCases = 40;

int Cases() {
  int n = kCiCases;
  if (const char* s = std::getenv("UCP_CONFORMANCE_AUTOTP_CASES")) (void)absl::SimpleAtoi(s, &n);
  return n;
}

void Report(const std::string& what, const FuzzOptions& o, const FuzzReport& r) {
  std::cout << what << " on AutoTP cases: seed " << o.seed << ", " << r.cases_passed << " cases passed\n"
            << r.distribution.ToString();
  EXPECT_TRUE(r.passed) << what << " failed after " << r.cases_passed << " cases; seed " << o.seed << "\n"
                        << r.failure << "\nshrunk case:\n"
                        << r.shrunk_case << "replay: " << r.replay;
  if (r.passed) EXPECT_EQ(r.cases_passed, o.cases);
}

void RunProperty(Property p) {
  FuzzOptions o;
  o.seed = rc::detail::configuration().testParams.seed;
  o.cases = Cases();
  o.properties = {p};
  o.gen.autotp_only = true;
  Report(absl::StrCat("property (", PropertyLetter(p), ") ", PropertyName(p)), o, RunFuzz(o));
}

TEST(AutoTpConformanceTest, ConvertIsTopologyFree) { RunProperty(Property::kConvertIsTopologyFree); }
TEST(AutoTpConformanceTest, ReshardMatchesSave) { RunProperty(Property::kReshardMatchesSave); }
TEST(AutoTpConformanceTest, DirectReshardMatchesTwoStep) { RunProperty(Property::kDirectReshardMatchesTwoStep); }
TEST(AutoTpConformanceTest, CorruptionsAreCaught) { RunProperty(Property::kCorruptionsAreCaught); }
TEST(AutoTpConformanceTest, SaveMatchesDeepSpeedLayout) { RunProperty(Property::kSaveMatchesDeepSpeedLayout); }

// (f): the AutoTP save of a model and its Megatron-style twin reshard into
// each other bitwise (properties.h CheckAutoTpMatchesMegatron).
TEST(AutoTpConformanceTest, ReshardBetweenAutoTpAndMegatronIsBitwise) {
  FuzzOptions o;
  o.seed = rc::detail::configuration().testParams.seed;
  o.cases = Cases();
  o.properties = {};
  o.gen.autotp_only = true;
  o.gen.autotp_even = true;
  const std::string work = DefaultScratchDir("autotp_megatron");
  o.case_check = [&work](const GoldenCase& c) { return CheckAutoTpMatchesMegatron(c, work); };
  Report("property (f) AutoTpMatchesMegatron", o, RunFuzz(o));
}

// The generator draws what the header says: uneven widths, tp up to 4 at
// both ends, every version, version changes across 0.19.5 (the lm_head whole
// in 0.18.9, cut after), fused sub-params with their widths.
TEST(AutoTpGeneratorTest, DrawsUnevenWidthsFusedSubParamsAndEveryVersion) {
  FuzzOptions o;
  o.seed = 7;
  o.cases = 150;
  o.properties = {};
  o.gen.autotp_only = true;
  int uneven = 0, fused = 0, tp4 = 0, autotp = 0, across = 0;
  std::set<std::string> versions;
  o.case_check = [&](const GoldenCase& c) {
    autotp += c.model().autotp();
    versions.insert(c.ds_version());
    versions.insert(c.target_ds_version());
    // 0.18.9's whole lm_head read and written cut (0.19.5, master), or back.
    across += (c.ds_version() == "0.18.9") != (c.target_ds_version() == "0.18.9");
    tp4 += c.source().tp() == 4 || c.target().tp() == 4;
    bool u = false, f = false;
    for (const ModelParam& p : c.model().param()) {
      f |= p.rule().kind() == SUB_PARAMS;
      for (int tp : {c.source().tp(), c.target().tp()}) {
        const int dim = p.rule().kind() == ROW ? 1 : 0;
        u |= p.rule().kind() != REPLICATED && p.shape(dim) % tp != 0;
      }
    }
    uneven += u;
    fused += f;
    return absl::OkStatus();
  };
  const FuzzReport r = RunFuzz(o);
  ASSERT_TRUE(r.passed) << r.failure;
  EXPECT_EQ(autotp, 150);
  EXPECT_GT(uneven, 20);
  EXPECT_GT(fused, 10);
  EXPECT_GT(tp4, 10);
  EXPECT_GT(across, 10);
  EXPECT_EQ(versions, (std::set<std::string>{"0.18.9", "0.19.5", "0.19.6"}));
}

}  // namespace
}  // namespace ucp::conformance
