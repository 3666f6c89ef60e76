// `ucp convert` of ZeRO-3 checkpoints saved at tp 2 by DeepSpeed AutoTP (real
// DeepSpeed master, testdata/autotp_z3), against DeepSpeed master's own
// ds_to_universal.py output of the same checkpoints.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "formats/builtin/builtin.h"
#include "formats/verify.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/convert.h"
#include "ops/reshard.h"
#include "testing/compare.h"
#include "testing/fixtures.h"

namespace ucp::ops {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ucp::testing::FreshTempDir;
using ucp::testing::RunfilePath;

const char kModel0[] = "zero_pp_rank_0_mp_rank_00_model_states.pt";
const char kModel1[] = "zero_pp_rank_0_mp_rank_01_model_states.pt";

std::string Fixture(const std::string& name, const std::string& part) {
  return RunfilePath(absl::StrCat("testdata/autotp_z3/", name, "/", part));
}

ConvertOptions Options(const std::string& in, const std::string& out) {
  ConvertOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.num_threads = 2;
  return o;
}

class ConvertZero3Tp : public ::testing::TestWithParam<std::string> {};

// The zero/ files (each param merged over tp in the stage 1/2 dict, no
// step.pt; optimizer_state.pt) equal DeepSpeed's, field by field; the model
// states are mp rank 0's with mp_world_size 1 and tp_degree 1, nothing else
// changed; no mp rank 1 file.
TEST_P(ConvertZero3Tp, EqualsDeepSpeedsConverter) {
  const std::string root = FreshTempDir(absl::StrCat("convert_z3_tp_", GetParam()));
  const std::string out = JoinPath(root, "global_step3_universal");
  auto result = Convert(Options(Fixture(GetParam(), "source"), out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(absl::StrJoin(result->warnings, "\n"), HasSubstr("ZeRO stage 3 at tp=2: every param merged over tp"));
  const std::string ds = Fixture(GetParam(), "ds_universal");
  auto diffs = testing::CompareFolders(out, ds, {"ucp_manifest.textproto", kModel0, kModel1});
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << absl::StrJoin(*diffs, "\n");
  EXPECT_TRUE(PathExists(JoinPath(out, "zero/model.norm.weight/fp32.pt")));
  EXPECT_FALSE(PathExists(JoinPath(out, "zero/model.norm.weight/step.pt")));
  EXPECT_FALSE(PathExists(JoinPath(out, kModel1)));
  auto model = testing::CompareFiles(JoinPath(out, kModel0), JoinPath(ds, kModel0));
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->size(), 2u) << absl::StrJoin(*model, "\n");
  EXPECT_THAT((*model)[0], HasSubstr("mp_world_size"));
  EXPECT_THAT((*model)[1], HasSubstr("tp_degree"));
  formats::VerifyResult mine = formats::VerifyFolder(formats::builtin::Formats(), out);
  EXPECT_THAT(mine.problems, IsEmpty()) << absl::StrJoin(mine.problems, "\n");
  // DeepSpeed's own folder verifies too.
  formats::VerifyResult theirs = formats::VerifyFolder(formats::builtin::Formats(), ds);
  EXPECT_THAT(theirs.problems, IsEmpty()) << absl::StrJoin(theirs.problems, "\n");
}

// --single_mp_rank_file=false: every file as DeepSpeed's converter writes it,
// the model states byte-identical copies of every mp rank's.
TEST_P(ConvertZero3Tp, CopiesEqualDeepSpeedsFolder) {
  const std::string root = FreshTempDir(absl::StrCat("convert_z3_tp_copies_", GetParam()));
  const std::string out = JoinPath(root, "global_step3_universal");
  ConvertOptions o = Options(Fixture(GetParam(), "source"), out);
  o.write.single_mp_rank_file = false;
  auto result = Convert(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(absl::StrJoin(result->warnings, "\n"), HasSubstr("reads it with ZeRO-3 at tp=2 only"));
  auto diffs = testing::CompareFolders(out, Fixture(GetParam(), "ds_universal"), {"ucp_manifest.textproto"});
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << absl::StrJoin(*diffs, "\n");
  for (const std::string f : {kModel0, kModel1}) {
    auto a = ReadFileToString(JoinPath(out, f));
    auto b = ReadFileToString(JoinPath(Fixture(GetParam(), "source"), f));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << f;
  }
}

// Such a folder (DeepSpeed's or ucp's) as a source: not read yet, said so.
TEST_P(ConvertZero3Tp, UniversalFolderAsSourceRefused) {
  const std::string root = FreshTempDir(absl::StrCat("convert_z3_tp_reread_", GetParam()));
  const std::string out = JoinPath(root, "global_step3_universal");
  ASSERT_TRUE(Convert(Options(Fixture(GetParam(), "source"), out)).ok());
  for (const std::string& folder : {out, Fixture(GetParam(), "ds_universal")}) {
    ReshardOptions r;
    r.input_folder = folder;
    r.output_folder = JoinPath(root, "again/global_step3");
    auto again = Reshard(r);
    ASSERT_FALSE(again.ok()) << folder;
    EXPECT_EQ(again.status().code(), absl::StatusCode::kUnimplemented) << again.status();
    EXPECT_THAT(again.status().message(), HasSubstr("ZeRO-3 checkpoint saved at tp > 1"));
    EXPECT_THAT(again.status().message(), HasSubstr("reshard the ZeRO-3 checkpoint it was converted from"));
  }
}

INSTANTIATE_TEST_SUITE_P(Master, ConvertZero3Tp, ::testing::Values("master_z3_tp2_even", "master_z3_tp2_uneven"));

// DeepSpeed before 0.19.5 has no stage-3 loader of params merged over tp:
// refused, naming why and what to do, and nothing written.
TEST(ConvertZero3TpRefused, LoaderBefore0195) {
  const std::string root = FreshTempDir("convert_z3_tp_old_loader");
  const std::string out = JoinPath(root, "global_step3_universal");
  ConvertOptions o = Options(Fixture("master_z3_tp2_even", "source"), out);
  o.write.target_ds_version = "0.18.9";
  auto result = Convert(o);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("a ZeRO stage 3 checkpoint at tp=2 for DeepSpeed 0.18.9"));
  EXPECT_THAT(result.status().message(), HasSubstr("from DeepSpeed 0.19.5 on"));
  EXPECT_THAT(result.status().message(), HasSubstr("ucp reshard"));
  EXPECT_FALSE(PathExists(out));
}

}  // namespace
}  // namespace ucp::ops
