// Acceptance tests of `ucp convert` on the real DeepSpeed 0.14.4 fixtures.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "base/fs.h"
#include "ops/convert.h"
#include "ops/inspect.h"
#include "formats/inspect.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "testing/compare.h"
#include "formats/deepspeed_universal/universal_checkpoint.h"
#include "format/torch/torch_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"
#include "tp/merge.h"

namespace ucp::ops {
namespace {

using ::testing::IsEmpty;
using ucp::testing::FixturePath;
using ucp::testing::VersionFixturePath;
using ucp::testing::FreshTempDir;

ConvertOptions Options(const std::string& in, const std::string& out) {
  ConvertOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.num_threads = 2;
  return o;
}

// Converts a fixture with no extra flags and compares with an expected folder.
// `plain_module`: a non-pipeline module at tp=2, whose universal folder holds
// one mp_rank file instead of copies (checked against the source's rank 0).
void ConvertAndCompare(const std::string& fixture, const std::string& expected,
                       const std::vector<std::string>& extra_ignore = {}, bool plain_module = false) {
  const std::string root = FreshTempDir(absl::StrCat("convert_", absl::StrReplaceAll(fixture, {{"/", "_"}})));
  const std::string out = JoinPath(root, "global_step4_universal");
  auto result = Convert(Options(FixturePath(fixture + "/global_step4"), out));
  ASSERT_TRUE(result.ok()) << result.status();
  std::vector<std::string> ignore = {"ucp_manifest.textproto"};
  ignore.insert(ignore.end(), extra_ignore.begin(), extra_ignore.end());
  if (plain_module) ignore.insert(ignore.end(), {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"});
  auto diffs = testing::CompareFolders(out, FixturePath(fixture + "/" + expected), ignore);
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << absl::StrJoin(*diffs, "\n");
  if (plain_module) {
    EXPECT_FALSE(PathExists(JoinPath(out, "mp_rank_01_model_states.pt")));
    auto single = testing::CompareSingleMpRankFile(JoinPath(out, "mp_rank_00_model_states.pt"),
                                                   FixturePath(fixture + "/global_step4/mp_rank_00_model_states.pt"));
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_THAT(*single, IsEmpty()) << absl::StrJoin(*single, "\n");
  }
  // Otherwise the mp_rank files are byte-identical copies of the source's.
  for (const std::string mp : {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"}) {
    if (plain_module) break;
    auto a = ReadFileToString(JoinPath(out, mp));
    auto b = ReadFileToString(FixturePath(fixture + "/global_step4/" + mp));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << mp;
  }
  // latest_universal names the output folder.
  auto latest = ReadFileToString(JoinPath(root, "latest_universal"));
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, "global_step4_universal");
}

TEST(ConvertFixtureTest, NeoxTp2Dp1MatchesExpected) {
  ConvertAndCompare("neox-tp2-pp1-dp1", "global_step4_universal_expected");
}

TEST(ConvertFixtureTest, NeoxTp2Dp2MatchesExpected) {
  ConvertAndCompare("neox-tp2-pp1-dp2", "global_step4_universal_expected");
}

TEST(ConvertFixtureTest, Bf16Tp2Dp2MatchesExpected) {
  ConvertAndCompare("neox-bf16-tp2-pp1-dp2", "global_step4_universal_expected");
}

TEST(ConvertFixtureTest, Zero2NoPipelineMatchesExpected) {
  ConvertAndCompare("gpt-zero2-nopipe-tp2-dp2", "global_step4_universal_expected", {}, /*plain_module=*/true);
}

// A plain module at tp=2: by default one tp=1-style mp_rank file (what
// DeepSpeed's loader takes at any tp) beside the same zero/ folder, and
// resharding that back to tp=2 dp=2 gives DeepSpeed's own files but for tp
// rank 1's rng state, which it cannot keep; --single_mp_rank_file=false
// copies both files, as ds_to_universal.py does, and convert says DeepSpeed
// loads that only at tp >= 2.
TEST(ConvertFixtureTest, SingleMpRankFileForAPlainModule) {
  const std::string in = FixturePath("gpt-zero2-nopipe-tp2-dp2/global_step4");
  const std::string root = FreshTempDir("convert_single_mp_rank_file");
  ConvertOptions copies = Options(in, JoinPath(root, "copies/global_step4_universal"));
  copies.write.single_mp_rank_file = false;
  auto plain = Convert(copies);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(absl::StrJoin(plain->warnings, "\n"), ::testing::HasSubstr("--single_mp_rank_file"));
  for (const std::string mp : {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"}) {
    auto a = ReadFileToString(JoinPath(copies.output_folder, mp));
    auto b = ReadFileToString(JoinPath(in, mp));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << mp;
  }

  const std::string out = JoinPath(root, "single/global_step4_universal");
  auto single = Convert(Options(in, out));
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_THAT(absl::StrJoin(single->warnings, "\n"), ::testing::Not(::testing::HasSubstr("--single_mp_rank_file")));
  EXPECT_FALSE(PathExists(JoinPath(out, "mp_rank_01_model_states.pt")));
  auto diffs = testing::CompareFolders(out, FixturePath("gpt-zero2-nopipe-tp2-dp2/global_step4_universal_expected"),
                                       {"ucp_manifest.textproto", "mp_rank_00_model_states.pt",
                                        "mp_rank_01_model_states.pt"});
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << absl::StrJoin(*diffs, "\n");
  auto f = torch::TorchFile::Open(JoinPath(out, "mp_rank_00_model_states.pt"));
  ASSERT_TRUE(f.ok()) << f.status();
  const pickle::Value* root_value = (*f)->root().get();
  ASSERT_NE(root_value->DictGet("mp_world_size"), nullptr);
  EXPECT_EQ(root_value->DictGet("mp_world_size")->int_value(), 1);
  const pickle::Value* module = root_value->DictGet("module");
  ASSERT_NE(module, nullptr);
  EXPECT_EQ(module->dict_items().size(), 0u);
  ASSERT_NE(module->dict_state(), nullptr);  // the state dict's _metadata
  EXPECT_NE(module->dict_state()->DictGet("_metadata"), nullptr);

  ReshardOptions back;
  back.input_folder = out;
  back.output_folder = JoinPath(root, "back/global_step4");
  back.write.target = {2, 1, 2};
  back.write.num_threads = 2;
  auto r = Reshard(back);
  ASSERT_TRUE(r.ok()) << r.status();
  auto back_diffs = testing::CompareFolders(back.output_folder, in, {});
  ASSERT_TRUE(back_diffs.ok()) << back_diffs.status();
  ASSERT_FALSE(back_diffs->empty());  // rank 1's rng state is rank 0's now
  for (const std::string& d : *back_diffs) {
    EXPECT_TRUE(absl::StartsWith(d, "mp_rank_01_model_states.pt: random_rng_state")) << d;
  }
}

// With no preset, the suggested rules (`ucp rules --suggest`) settle every
// param of the real DeepSpeed NeoX checkpoint from its evidence alone, and
// convert it to exactly the expected universal checkpoint.
TEST(ConvertFixtureTest, SuggestedRulesConvertTheNeoxFixtureToTheExpectedOutput) {
  const std::string fixture = "neox-tp2-pp1-dp1";
  SourceOptions so;
  so.rules.preset = "none";
  so.num_threads = 2;
  auto report = SuggestRules(FixturePath(fixture + "/global_step4"), so);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->suggestions.size(), 13u);  // 8 partitioned families, 5 replicated by evidence
  for (const auto& s : report->suggestions) EXPECT_TRUE(s.decided()) << s.evidence;
  const std::string root = FreshTempDir("convert_suggested");
  const std::string rules_file = JoinPath(root, "rules.textproto");
  ASSERT_TRUE(WriteFileAtomic(rules_file, report->text).ok());
  ConvertOptions o = Options(FixturePath(fixture + "/global_step4"), JoinPath(root, "global_step4_universal"));
  o.state.rules.rules_file = rules_file;
  o.state.rules.preset = "none";
  auto result = Convert(o);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << report->text;
  auto diffs = testing::CompareFolders(o.output_folder, FixturePath(fixture + "/global_step4_universal_expected"),
                                       {"ucp_manifest.textproto"});
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << absl::StrJoin(*diffs, "\n") << "\n" << report->text;
}

// tp=1, pp=2: DeepSpeed's own output is right for the tensors (nothing to
// merge); its metadata says cat_dim 0 for everything. ucp writes the same
// tensors and files; the metadata differs exactly where DeepSpeed's would
// break a later load at tp > 1: replicated params carry no cat_dim, row-parallel
// weights cat_dim 1 (the same as the tp=2 expected output).
TEST(ConvertFixtureTest, NeoxTp1Pp2MatchesDeepSpeedUpToRowAndReplicatedMetadata) {
  const std::string fixture = "neox-tp1-pp2-dp1";
  const std::string root = FreshTempDir("convert_tp1_pp2");
  const std::string out = JoinPath(root, "global_step4_universal");
  auto result = Convert(Options(FixturePath(fixture + "/global_step4"), out));
  ASSERT_TRUE(result.ok()) << result.status();
  const std::string ds = FixturePath(fixture + "/global_step4_universal_deepspeed");
  auto ours = testing::ListFilesRecursive(out);
  auto theirs = testing::ListFilesRecursive(ds);
  ASSERT_TRUE(ours.ok() && theirs.ok());
  std::vector<std::string> ours_pt;
  for (const auto& f : *ours) {
    if (f != "ucp_manifest.textproto") ours_pt.push_back(f);
  }
  EXPECT_EQ(ours_pt, *theirs);
  int replicated = 0, row = 0, column = 0;
  for (const auto& f : *theirs) {
    if (!absl::StartsWith(f, "zero/") || f == "zero/optimizer_state.pt" || absl::EndsWith(f, "/step.pt")) {
      if (absl::EndsWith(f, ".pt")) {
        auto d = testing::CompareFiles(JoinPath(out, f), JoinPath(ds, f));
        ASSERT_TRUE(d.ok());
        EXPECT_THAT(*d, IsEmpty()) << f << "\n" << absl::StrJoin(*d, "\n");
      }
      continue;
    }
    auto a = torch::TorchFile::Open(JoinPath(out, f));
    auto b = torch::TorchFile::Open(JoinPath(ds, f));
    ASSERT_TRUE(a.ok() && b.ok()) << f;
    const pickle::Value& ra = *(*a)->root();
    const pickle::Value& rb = *(*b)->root();
    // DeepSpeed wrote {'cat_dim': 0, 'param'} everywhere.
    ASSERT_NE(rb.DictGet("cat_dim"), nullptr) << f;
    EXPECT_EQ(rb.DictGet("cat_dim")->int_value(), 0);
    auto ta = (*a)->GetTensor(*ra.DictGet("param"));
    auto tb = (*b)->GetTensor(*rb.DictGet("param"));
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_TRUE(ta->BitwiseEqual(*tb)) << f;
    const pickle::Value* cat = ra.DictGet("cat_dim");
    const bool is_row = absl::StrContains(f, "attention.dense.weight") || absl::StrContains(f, "dense_4h_to_h.weight");
    const bool is_replicated = absl::StrContains(f, "norm.scale") || absl::StrContains(f, "attention.dense.bias") ||
                               absl::StrContains(f, "dense_4h_to_h.bias");
    if (is_replicated) {
      EXPECT_EQ(cat, nullptr) << f;
      ++replicated;
    } else if (is_row) {
      ASSERT_NE(cat, nullptr) << f;
      EXPECT_EQ(cat->int_value(), 1) << f;
      ++row;
    } else {
      ASSERT_NE(cat, nullptr) << f;
      EXPECT_EQ(cat->int_value(), 0) << f;
      ++column;
    }
  }
  // 8 layers x (2 norms + 2 row biases) + final norm, x 3 states; 16 row weights x 3.
  EXPECT_EQ(replicated, 33 * 3);
  EXPECT_EQ(row, 16 * 3);
  EXPECT_EQ(column, (83 - 33 - 16) * 3);  // 83 params
}

// The bug: DeepSpeed's pattern-less merge concatenates the replicated
// layernorm scale of both tp ranks, 128 elements where a tp=1 model has 64.
TEST(ConvertFixtureTest, ReproducesTheBugAndFixesIt) {
  const std::string name = "2.input_layernorm.scale";
  // What DeepSpeed wrote.
  auto ds = torch::TorchFile::Open(
      FixturePath("neox-tp2-pp1-dp1/global_step4_universal_deepspeed/zero/" + name + "/fp32.pt"));
  ASSERT_TRUE(ds.ok());
  auto ds_param = (*ds)->GetTensor(*(*ds)->root()->DictGet("param"));
  ASSERT_TRUE(ds_param.ok());
  EXPECT_EQ(ds_param->numel(), 128);
  // DeepSpeed's merge, emulated: every param cat on dim 0.
  const std::string source_folder = FixturePath("neox-tp2-pp1-dp1/global_step4");
  SourceOptions options;
  options.rules.preset = "none";
  options.rules.default_kind = COLUMN;
  auto patternless = OpenResolvedState(source_folder, options);
  ASSERT_TRUE(patternless.ok()) << patternless.status();
  const state::ParamState* p = (*patternless)->info().Find(name);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->source, EVIDENCE);  // the data alone shows it is replicated...
  MergeRule cat0;
  cat0.set_kind(COLUMN);
  auto slices = (*patternless)->source().Slices(*p, 0, "fp32");
  ASSERT_TRUE(slices.ok());
  auto merged = tp::MergeSlices(cat0, *slices, 0, name);  // ...but DeepSpeed cats it anyway.
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->numel(), 128);
  EXPECT_TRUE(*tp::TensorPlan::BitwiseEqual(*merged, tp::TensorPlan::FromTensor(*ds_param)));
  // The tp=1 loader's check: full numel == slice numel (64, the tp=1 shape) * 1.
  const int64_t tp1_slice_numel = 64;
  EXPECT_NE(merged->numel(), tp1_slice_numel * 1)
      << "full param numel 128 != tensor slice numel 64 * tp_world_size 1";
  // ucp's output.
  const std::string out = JoinPath(FreshTempDir("convert_bug"), "global_step4_universal");
  auto result = Convert(Options(FixturePath("neox-tp2-pp1-dp1/global_step4"), out));
  ASSERT_TRUE(result.ok()) << result.status();
  auto ours = torch::TorchFile::Open(JoinPath(out, "zero/" + name + "/fp32.pt"));
  ASSERT_TRUE(ours.ok());
  auto t = (*ours)->GetTensor(*(*ours)->root()->DictGet("param"));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->numel(), tp1_slice_numel * 1);
  EXPECT_EQ((*ours)->root()->DictGet("cat_dim"), nullptr);
}

TEST(ConvertFixtureTest, ExplainAndSummaryNameSources) {
  const std::string out = JoinPath(FreshTempDir("convert_explain"), "u");
  auto result = Convert(Options(FixturePath("neox-tp2-pp1-dp1/global_step4"), out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->summary.find("preset: gpt-neox (detected from param names)"), std::string::npos)
      << result->summary;
  EXPECT_NE(result->summary.find("row"), std::string::npos);
  EXPECT_NE(result->explain.find("2.attention.dense.weight [64, 64] row (cat dim 1) [preset]"), std::string::npos)
      << result->explain;
  auto manifest = ReadFileToString(JoinPath(out, "ucp_manifest.textproto"));
  ASSERT_TRUE(manifest.ok());
  // XXH3-128 by default (sha256 on request: DigestsOnRequest).
  EXPECT_NE(manifest->find("xxh3_128"), std::string::npos);
  EXPECT_EQ(manifest->find("sha256"), std::string::npos);
  EXPECT_NE(manifest->find("source_topology"), std::string::npos);
  // The digest of every file, hashed while writing, matches the bytes on disk.
  deepspeed_universal::UniversalCheckpoint::Options verify;
  verify.verify_checksums = true;
  auto u = deepspeed_universal::UniversalCheckpoint::Open(out, verify);
  EXPECT_TRUE(u.ok()) << u.status();
  // ... and a changed byte is caught.
  const std::string victim = JoinPath(out, "zero/2.attention.dense.weight/exp_avg.pt");
  auto bytes = ReadFileToString(victim);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 2] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(victim, *bytes).ok());
  auto bad = deepspeed_universal::UniversalCheckpoint::Open(out, verify);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("differs from the manifest's"), std::string::npos) << bad.status();
}

// --digest=sha256 records SHA-256 digests, checked the same way; both kinds of
// digest of a file agree with independent tools' (sha256sum, xxh128sum) in
// base:digest_test.
TEST(ConvertFixtureTest, DigestsOnRequest) {
  const std::string out = JoinPath(FreshTempDir("convert_sha256"), "u");
  ConvertOptions o = Options(FixturePath("neox-tp2-pp1-dp1/global_step4"), out);
  o.write.digest = DigestKind::kSha256;
  ASSERT_TRUE(Convert(o).ok());
  auto manifest = ReadFileToString(JoinPath(out, "ucp_manifest.textproto"));
  ASSERT_TRUE(manifest.ok());
  EXPECT_NE(manifest->find("sha256: "), std::string::npos);
  EXPECT_EQ(manifest->find("xxh3_128"), std::string::npos);
  deepspeed_universal::UniversalCheckpoint::Options verify;
  verify.verify_checksums = true;
  EXPECT_TRUE(deepspeed_universal::UniversalCheckpoint::Open(out, verify).ok());
  const std::string victim = JoinPath(out, "mp_rank_00_model_states.pt");
  auto bytes = ReadFileToString(victim);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[10] ^= 0x40;
  ASSERT_TRUE(WriteFileAtomic(victim, *bytes).ok());
  auto bad = deepspeed_universal::UniversalCheckpoint::Open(out, verify);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("sha256"), std::string::npos) << bad.status();
}

// ZeRO-3 (DeepSpeed 0.19.5): ds_to_universal.py's output is right (raw flat
// tensors per param, rank 0's optimizer state with param_groups, the
// zero_pp_rank_* model states copied); ucp writes the same, file for file.
void ConvertZero3AndCompare(const std::string& version, const std::string& fixture) {
  const std::string root = FreshTempDir(absl::StrCat("convert_", version, "_", fixture));
  const std::string out = JoinPath(root, "global_step4_universal");
  auto result = Convert(Options(VersionFixturePath(version, fixture + "/global_step4"), out));
  ASSERT_TRUE(result.ok()) << result.status();
  auto diffs = testing::CompareFolders(
      out, VersionFixturePath(version, fixture + "/global_step4_universal_deepspeed"), {"ucp_manifest.textproto"});
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << absl::StrJoin(*diffs, "\n");
  for (const std::string mp : {"zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"}) {
    auto a = ReadFileToString(JoinPath(out, mp));
    auto b = ReadFileToString(VersionFixturePath(version, fixture + "/global_step4/" + mp));
    ASSERT_TRUE(a.ok() && b.ok()) << mp;
    EXPECT_TRUE(*a == *b) << mp;
  }
}

TEST(ConvertFixtureTest, Zero3MatchesDeepSpeed0195) { ConvertZero3AndCompare("0.19.5", "gpt-zero3-dp2"); }

// DeepSpeed's own stage-3 universal loader (0.18+) shares one step tensor and
// copies group 0's hyper-parameters: convert says so and points to reshard;
// for a 0.15-0.17 loader (one sub-group, one group) it does not apply.
TEST(ConvertFixtureTest, Zero3ConvertWarnsAboutTheLoadersStepAndGroups) {
  const std::string root = FreshTempDir("convert_zero3_warning");
  auto two = Convert(Options(VersionFixturePath("0.19.5", "gpt-zero3-dp2/global_step4"), JoinPath(root, "a")));
  ASSERT_TRUE(two.ok()) << two.status();
  const std::string w = absl::StrJoin(two->warnings, "\n");
  EXPECT_THAT(w, ::testing::HasSubstr("DeepSpeed 0.19.5's stage-3 universal loader"));
  EXPECT_THAT(w, ::testing::HasSubstr("one shared `step` tensor and all 2 param groups group 0's hyper-parameters"));
  EXPECT_THAT(w, ::testing::HasSubstr("`ucp reshard --dp=N --sub_group_size=S`"));
  auto one = Convert(Options(VersionFixturePath("0.16.4", "gpt-zero3-onegroup-dp2/global_step4"), JoinPath(root, "b")));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(absl::StrJoin(one->warnings, "\n"), ::testing::Not(::testing::HasSubstr("stage-3 universal loader")));
  ConvertOptions o = Options(VersionFixturePath("0.16.4", "gpt-zero3-onegroup-dp2/global_step4"), JoinPath(root, "c"));
  o.write.target_ds_version = "0.18.9";
  auto later = Convert(o);
  ASSERT_TRUE(later.ok()) << later.status();
  const std::string lw = absl::StrJoin(later->warnings, "\n");
  EXPECT_THAT(lw, ::testing::HasSubstr("DeepSpeed 0.18.9's stage-3 universal loader"));
  EXPECT_THAT(lw, ::testing::Not(::testing::HasSubstr("param groups group 0's")));
}

TEST(ConvertFixtureTest, Zero3OneGroupMatchesDeepSpeed0164) {
  ConvertZero3AndCompare("0.16.4", "gpt-zero3-onegroup-dp2");
}

// 0.16.4 and 0.19.5 ZeRO-1 tp2: DeepSpeed's universal output is right for
// column-parallel params, step.pt and optimizer_state.pt, and wrong for
// replicated params (the tp copies stacked: the numel assertion at tp=1).
void ConvertNeoxAndCompare(const std::string& version) {
  const std::string fixture = "neox-tp2-pp1-dp1";
  const std::string root = FreshTempDir(absl::StrCat("convert_neox_", version));
  const std::string out = JoinPath(root, "global_step4_universal");
  auto result = Convert(Options(VersionFixturePath(version, fixture + "/global_step4"), out));
  ASSERT_TRUE(result.ok()) << result.status();
  const std::string ds = VersionFixturePath(version, fixture + "/global_step4_universal_deepspeed");
  auto theirs = testing::ListFilesRecursive(ds);
  ASSERT_TRUE(theirs.ok());
  int same = 0, replicated = 0;
  for (const auto& f : *theirs) {
    if (!absl::EndsWith(f, ".pt")) continue;
    const bool state_file = absl::StartsWith(f, "zero/") && f != "zero/optimizer_state.pt" && !absl::EndsWith(f, "/step.pt");
    if (!state_file) {
      auto d = testing::CompareFiles(JoinPath(out, f), JoinPath(ds, f));
      ASSERT_TRUE(d.ok()) << f << ": " << d.status();
      EXPECT_THAT(*d, IsEmpty()) << f << "\n" << absl::StrJoin(*d, "\n");
      ++same;
      continue;
    }
    auto a = torch::TorchFile::Open(JoinPath(out, f));
    auto b = torch::TorchFile::Open(JoinPath(ds, f));
    ASSERT_TRUE(a.ok() && b.ok()) << f;
    auto ta = (*a)->GetTensor(*(*a)->root()->DictGet("param"));
    auto tb = (*b)->GetTensor(*(*b)->root()->DictGet("param"));
    ASSERT_TRUE(ta.ok() && tb.ok()) << f;
    const bool is_replicated = absl::StrContains(f, "norm.scale") || absl::StrContains(f, "attention.dense.bias") ||
                               absl::StrContains(f, "dense_4h_to_h.bias");
    const bool is_row = absl::StrContains(f, "attention.dense.weight") || absl::StrContains(f, "dense_4h_to_h.weight");
    if (is_replicated) {
      // DeepSpeed's: both tp copies one after the other; ucp's: one copy.
      ASSERT_EQ(tb->numel(), 2 * ta->numel()) << f;
      auto first = tb->Narrow(0, 0, ta->numel());
      ASSERT_TRUE(first.ok());
      EXPECT_TRUE(first->BitwiseEqual(*ta)) << f;
      ++replicated;
    } else if (!is_row) {
      EXPECT_TRUE(ta->BitwiseEqual(*tb)) << f;
      ++same;
    }
  }
  EXPECT_GT(same, 0);
  EXPECT_GT(replicated, 0);
}

TEST(ConvertFixtureTest, Neox0195MatchesDeepSpeedWhereItIsRight) { ConvertNeoxAndCompare("0.19.5"); }
TEST(ConvertFixtureTest, Neox0164MatchesDeepSpeedWhereItIsRight) { ConvertNeoxAndCompare("0.16.4"); }

// Per-rank group_paddings (0.19.5): the dp2 checkpoint and DeepSpeed's dp1
// resave of it convert to the same per-param universal files (tp=1: every
// param cat on dim 0, --default_kind).
TEST(ConvertFixtureTest, PerRankPaddingConvertsLikeItsDp1Resave) {
  const std::string root = FreshTempDir("convert_padding_0195");
  std::string outs[2];
  int k = 0;
  for (const std::string in : {"global_step4", "resaved-dp1/global_step4"}) {
    ConvertOptions o = Options(VersionFixturePath("0.19.5", "gpt-zero1-padding-dp2/" + in), JoinPath(root, absl::StrCat("u", k)));
    o.state.rules.default_kind = COLUMN;
    auto r = Convert(o);
    ASSERT_TRUE(r.ok()) << in << ": " << r.status();
    outs[k++] = o.output_folder;
  }
  auto files = testing::ListFilesRecursive(outs[0]);
  ASSERT_TRUE(files.ok());
  int compared = 0;
  for (const auto& f : *files) {
    if (!absl::StartsWith(f, "zero/") || f == "zero/optimizer_state.pt") continue;
    auto d = testing::CompareFiles(JoinPath(outs[0], f), JoinPath(outs[1], f));
    ASSERT_TRUE(d.ok()) << f << ": " << d.status();
    EXPECT_THAT(*d, IsEmpty()) << f << "\n" << absl::StrJoin(*d, "\n");
    ++compared;
  }
  EXPECT_EQ(compared, 54 * 4);  // 54 params x (fp32, exp_avg, exp_avg_sq, step)
}

// The --dry_run plan counts the records each rank CRC-checks, the
// model-states files' included: their records are checked beside the units
// (torch::OwedCrcChecks) by rank 0, not by the rank whose units read them.
TEST(ConvertFixtureTest, DryRunCountsTheModelStatesRecords) {
  const std::string src = FixturePath("gpt-zero2-nopipe-tp2-dp2/global_step4");
  size_t records = 0;
  for (const std::string name : {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"}) {
    auto f = torch::TorchFile::Open(JoinPath(src, name));
    ASSERT_TRUE(f.ok()) << f.status();
    records += (*f)->RecordNames().size();
  }
  ASSERT_GT(records, 2u);
  ConvertOptions o = Options(src, JoinPath(FreshTempDir("convert_dry_run_records"), "u"));
  o.dry_run_ranks = 2;
  auto r = Convert(o);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<std::string> lines = absl::StrSplit(r->plan, '\n');
  ASSERT_GE(lines.size(), 3u) << r->plan;
  EXPECT_TRUE(absl::StartsWith(lines[1], "rank 0: ")) << r->plan;
  EXPECT_TRUE(absl::EndsWith(lines[1], absl::StrCat(" input records + the ", records,
                                                    " records of 2 model-states files beside the units")))
      << r->plan;
  EXPECT_TRUE(absl::StartsWith(lines[2], "rank 1: ")) << r->plan;
  EXPECT_TRUE(absl::EndsWith(lines[2], " input records")) << r->plan;
  EXPECT_FALSE(PathExists(o.output_folder));
}

// A tp=1 source converts with no flags (issue 24): the params nothing decides
// are kept whole and recorded as undecided; their universal files are those
// of a replicated param (the whole tensor, no cat_dim). A reshard to tp > 1,
// from the ZeRO folder or from the universal one, asks for their kind with
// one rule per family, and with the same rules both give the same bytes.
TEST(ConvertFixtureTest, Tp1SourceConvertsWithNoFlags) {
  const std::string root = FreshTempDir("convert_tp1_noflags");
  const std::string src = VersionFixturePath("0.19.5", "gpt-zero1-padding-dp2/global_step4");
  const std::string undecided = JoinPath(root, "u/global_step4_universal");
  auto r = Convert(Options(src, undecided));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->summary, ::testing::HasSubstr("whole        undecided            54"));
  EXPECT_THAT(r->explain, ::testing::HasSubstr("wte.weight [96, 64] kept whole, tp split unknown [undecided]"));
  ASSERT_FALSE(r->warnings.empty());
  EXPECT_THAT(r->warnings[0], ::testing::HasSubstr("54 param(s) of this tp=1 checkpoint"));
  auto manifest = ReadFileToString(JoinPath(undecided, "ucp_manifest.textproto"));
  ASSERT_TRUE(manifest.ok());
  int n = 0;
  for (size_t at = manifest->find("source: UNDECIDED"); at != std::string::npos;
       at = manifest->find("source: UNDECIDED", at + 1)) {
    ++n;
  }
  EXPECT_EQ(n, 54);
  auto inspected = Inspect(undecided);
  ASSERT_TRUE(inspected.ok()) << inspected.status();
  EXPECT_THAT(formats::FormatReport(*inspected),
              ::testing::HasSubstr("wte.weight float32[96, 64] group 0 (tp split undecided: saved at tp=1, no rule)"));

  ConvertOptions o = Options(src, JoinPath(root, "r/global_step4_universal"));
  o.state.rules.default_kind = REPLICATED;
  auto replicated = Convert(o);
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  auto files = testing::ListFilesRecursive(undecided);
  ASSERT_TRUE(files.ok());
  int compared = 0;
  for (const auto& f : *files) {
    if (!absl::StartsWith(f, "zero/")) continue;
    auto a = ReadFileToString(JoinPath(undecided, f));
    auto b = ReadFileToString(JoinPath(o.output_folder, f));
    ASSERT_TRUE(a.ok() && b.ok()) << f;
    EXPECT_TRUE(*a == *b) << f;
    ++compared;
  }
  EXPECT_EQ(compared, 54 * 4 + 1);  // 54 params x (fp32, exp_avg, exp_avg_sq, step) + optimizer_state.pt

  // tp=2 needs the kinds: refused from either folder, each family listed.
  for (const std::string in : {src, undecided}) {
    ReshardOptions ro;
    ro.input_folder = in;
    ro.output_folder = JoinPath(root, "refused/global_step4");
    ro.write.target.tp = 2;
    auto refused = Reshard(ro);
    ASSERT_FALSE(refused.ok()) << in;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("54 param(s) in 18 families"));
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("have no known tp split"));
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("rule { pattern: \"h\\\\.\\\\d+\\\\.attn_proj\\\\.weight$\" kind: MERGE_KIND_UNSPECIFIED }"));
    EXPECT_FALSE(PathExists(ro.output_folder));
  }
  const std::string rules_file = JoinPath(root, "rules.textproto");
  ASSERT_TRUE(WriteFileAtomic(rules_file, R"(
rule { pattern: "h\\.\\d+\\.attn_qkv\\.(weight|bias)$" kind: COLUMN }
rule { pattern: "h\\.\\d+\\.mlp_fc\\.(weight|bias)$" kind: COLUMN }
rule { pattern: "h\\.\\d+\\.(attn_proj|mlp_proj)\\.weight$" kind: ROW }
rule { pattern: "lm_head\\.weight$" kind: COLUMN }
rule { pattern: ".*" kind: REPLICATED }
)").ok());
  std::string outs[2];
  int k = 0;
  for (const std::string in : {src, undecided}) {
    ReshardOptions ro;
    ro.input_folder = in;
    ro.output_folder = JoinPath(root, absl::StrCat("tp2_", k, "/global_step4"));
    ro.write.target.tp = 2;
    ro.zero_source.rules.rules_file = rules_file;
    auto done = Reshard(ro);
    ASSERT_TRUE(done.ok()) << in << ": " << done.status();
    outs[k++] = ro.output_folder;
  }
  auto diffs = testing::CompareFolders(outs[0], outs[1], {});
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << absl::StrJoin(*diffs, "\n");
}

}  // namespace
}  // namespace ucp::ops
