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
#include "ops/inspect.h"
#include "ops/reshard.h"
#include "state/topology.h"
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
  // `ucp inspect` of the folder: every param with its merged shape (as in
  // DeepSpeed's folder; the source's report gives tp rank 0's slices).
  auto theirs_report = Inspect(ds);
  auto report = Inspect(out);
  ASSERT_TRUE(theirs_report.ok() && report.ok()) << theirs_report.status() << report.status();
  EXPECT_THAT(report->kind_detail(), HasSubstr("saved at tp > 1"));
  ASSERT_EQ(report->param_size(), theirs_report->param_size());
  for (int i = 0; i < report->param_size(); ++i) {
    EXPECT_EQ(report->param(i).name(), theirs_report->param(i).name());
    EXPECT_THAT(report->param(i).shape(), ::testing::ElementsAreArray(theirs_report->param(i).shape()))
        << report->param(i).name();
    if (report->param(i).name() == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_THAT(report->param(i).shape(), ElementsAre(16, 16));  // hidden 16; tp 2 slices of 8 rows
    }
  }
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

// Such a folder (ucp's, and DeepSpeed's with every mp rank's model states) as
// a source: read at tp 1, it reshards to the same files as the ZeRO-3
// checkpoint it was converted from (ZeRO-3 at tp 1 and, in AutoTP's widths, 2;
// ZeRO-1 at tp 1).
TEST_P(ConvertZero3Tp, UniversalFolderReshardsAsItsSource) {
  const std::string root = FreshTempDir(absl::StrCat("convert_z3_tp_reread_", GetParam()));
  const std::string out = JoinPath(root, "global_step3_universal");
  ASSERT_TRUE(Convert(Options(Fixture(GetParam(), "source"), out)).ok());
  struct Target {
    std::string name;
    int tp, zero_stage;
    std::string ds_version;  // ucp writes master's ZeRO-3 layout, not yet its ZeRO-1/2 one
  };
  for (const Target& t :
       {Target{"z3tp1", 1, 3, "0.19.6"}, Target{"z3tp2", 2, 3, "0.19.6"}, Target{"z1tp1", 1, 1, "0.19.5"}}) {
    auto reshard = [&](const std::string& in, const std::string& name) {
      ReshardOptions r;
      r.input_folder = in;
      r.output_folder = JoinPath(root, absl::StrCat(name, "_", t.name, "/global_step3"));
      r.write.target = state::Topology{t.tp, 1, 1};
      r.write.zero_stage = t.zero_stage;
      r.write.target_ds_version = t.ds_version;
      auto result = Reshard(r);
      EXPECT_TRUE(result.ok()) << name << " " << t.name << ": " << result.status();
      return r.output_folder;
    };
    const std::string want = reshard(Fixture(GetParam(), "source"), "direct");
    for (const auto& [name, folder] : std::vector<std::pair<std::string, std::string>>{
             {"ucp", out}, {"deepspeed", Fixture(GetParam(), "ds_universal")}}) {
      const std::string got = reshard(folder, name);
      auto diffs = testing::CompareFolders(got, want, {"ucp_manifest.textproto"});
      ASSERT_TRUE(diffs.ok()) << diffs.status();
      EXPECT_THAT(*diffs, IsEmpty()) << name << " " << t.name << ":\n" << absl::StrJoin(*diffs, "\n");
    }
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
