// Issue 10 (reliability): each defect found by trying ucp as a hostile user
// would (../shared/repro/reliability/dNN_*.sh) has a regression test here:
// ucp never destroys its input, never converts an inconsistent checkpoint
// silently, refuses bad flags early and says what went wrong.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/torch/torch_file.h"
#include "gtest/gtest.h"
#include "ops/convert.h"
#include "ops/export.h"
#include "ops/reshard.h"
#include "ops/inspect.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "testing/fixtures.h"

namespace ucp::ops {
namespace {

using ucp::testing::FixturePath;
using ucp::testing::FreshTempDir;

// A writable copy of a fixture root (with latest and global_step4).
std::string CopyFixture(const std::string& name, const std::string& fixture = "neox-tp2-pp1-dp2") {
  const std::string root = JoinPath(FreshTempDir(name), "ck");
  EXPECT_TRUE(CopyTree(FixturePath(fixture), root).ok());
  return root;
}

int CountOptimFiles(const std::string& dir) {
  auto names = ListDirectory(dir);
  int n = 0;
  if (names.ok()) {
    for (const auto& f : *names) n += f.find("optim_states") != std::string::npos;
  }
  return n;
}

absl::Status Python(const std::string& script, const std::string& args) {
  auto out = ucp::testing::RunCommand(absl::StrCat(ucp::testing::kPython, " ",
                                                   ucp::testing::RunfilePath("testdata/python/" + script), " ", args));
  return out.status();
}

absl::Status RunConvert(const std::string& in, const std::string& out, bool overwrite = false) {
  ConvertOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.overwrite = overwrite;
  o.write.num_threads = 2;
  return Convert(o).status();
}

ReshardOptions ReshardTo(const std::string& in, const std::string& out, int tp) {
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.target = {tp, 1, 1};
  o.write.num_threads = 2;
  return o;
}

// d05: --overwrite with output == input would delete the source.
TEST(ReliabilityTest, D05OutputEqualToInputIsRefusedEvenWithOverwrite) {
  const std::string root = CopyFixture("d05_same");
  const std::string tag = JoinPath(root, "global_step4");
  absl::Status s = RunConvert(tag, tag, /*overwrite=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("is the input"), std::string::npos) << s;
  EXPECT_EQ(CountOptimFiles(tag), 4);
}

// d05: output = the input's root (an ancestor of the tag folder).
TEST(ReliabilityTest, D05OutputContainingTheInputIsRefused) {
  const std::string root = CopyFixture("d05_root");
  ReshardOptions o = ReshardTo(root, root, 1);
  o.write.overwrite = true;
  absl::Status s = Reshard(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("contains the input"), std::string::npos) << s;
  EXPECT_EQ(CountOptimFiles(JoinPath(root, "global_step4")), 4);
  EXPECT_TRUE(PathExists(JoinPath(root, "run.json")));
  EXPECT_FALSE(PathExists(JoinPath(Dirname(root), "latest")));
}

// d05: --overwrite never replaces a folder ucp did not write.
TEST(ReliabilityTest, D05OverwriteOnlyReplacesUcpOutputs) {
  const std::string root = CopyFixture("d05_foreign");
  const std::string other = JoinPath(Dirname(root), "other/global_step4");
  ASSERT_TRUE(CopyTree(JoinPath(root, "global_step4"), other).ok());
  absl::Status s = RunConvert(JoinPath(root, "global_step4"), other, /*overwrite=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(CountOptimFiles(other), 4);
  // A previous ucp output is replaced.
  const std::string out = JoinPath(Dirname(root), "u/global_step4_universal");
  ASSERT_TRUE(RunConvert(JoinPath(root, "global_step4"), out).ok());
  EXPECT_TRUE(RunConvert(JoinPath(root, "global_step4"), out, /*overwrite=*/true).ok());
}

// d06: an output inside the input tag folder.
TEST(ReliabilityTest, D06OutputInsideInputIsRefused) {
  const std::string root = CopyFixture("d06");
  const std::string tag = JoinPath(root, "global_step4");
  absl::Status s = RunConvert(tag, JoinPath(tag, "univ"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("lies inside the input"), std::string::npos) << s;
  EXPECT_FALSE(PathExists(JoinPath(tag, "univ")));
  EXPECT_FALSE(PathExists(JoinPath(tag, "latest_universal")));
  // A ZeRO tag folder with a stray latest_universal is still read as ZeRO.
  ASSERT_TRUE(WriteFileAtomic(JoinPath(tag, "latest_universal"), "univ").ok());
  EXPECT_FALSE(IsUniversalFolder(tag));
}

// d07: writing beside the input leaves the input root's latest alone unless
// --update_latest.
TEST(ReliabilityTest, D07LatestOfTheInputRootIsLeftAlone) {
  const std::string root = CopyFixture("d07");
  auto r = Reshard(ReshardTo(root, JoinPath(root, "global_step4_tp1"), 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*ReadFileToString(JoinPath(root, "latest")), "global_step4");
  bool noted = false;
  for (const auto& n : r->notes) noted |= n.find("--update_latest") != std::string::npos;
  EXPECT_TRUE(noted);
  ReshardOptions o = ReshardTo(JoinPath(root, "global_step4"), JoinPath(root, "global_step4_tp1b"), 1);
  o.write.update_latest = true;
  ASSERT_TRUE(Reshard(o).ok());
  EXPECT_EQ(*ReadFileToString(JoinPath(root, "latest")), "global_step4_tp1b");
}

// d08: one dp shard saved at another step.
TEST(ReliabilityTest, D08ShardsOfDifferentStepsAreRefused) {
  const std::string root = CopyFixture("d08");
  const std::string tag = JoinPath(root, "global_step4");
  const std::string f = JoinPath(tag, "zero_pp_rank_1_mp_rank_00_optim_states.pt");
  ASSERT_TRUE(Python("mutate_checkpoint.py",
                     absl::StrCat(f, " add-to-element optimizer_state_dict.base_optimizer_state.state.0.step 0 1"))
                  .ok());
  absl::Status s = RunConvert(tag, JoinPath(root, "../u/x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message().rfind(f, 0), 0u) << s;
  EXPECT_NE(s.message().find("'step' of group 0 is tensor(5) but tensor(4)"), std::string::npos) << s;
  EXPECT_FALSE(PathExists(JoinPath(root, "../u/x")));
  auto report = ops::Inspect(tag);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->problem_size(), 0);
}

// d08: mp_rank files of different saves (global_steps).
TEST(ReliabilityTest, D08ModelStatesOfDifferentStepsAreRefused) {
  const std::string root = CopyFixture("d08_mp");
  const std::string f = JoinPath(root, "global_step4/mp_rank_01_model_states.pt");
  ASSERT_TRUE(Python("edit_checkpoint.py", absl::StrCat(f, " set global_steps 5")).ok());
  auto c = deepspeed_zero::ZeroCheckpoint::Open(JoinPath(root, "global_step4"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_EQ(c.status().message().rfind(f + ": global_steps is 5 but 4 in ", 0), 0u) << c.status();
}

// d08: a universal folder in which one param's step.pt says another step.
TEST(ReliabilityTest, D08UniversalStepsThatDisagreeAreRefused) {
  const std::string root = CopyFixture("d08_u");
  const std::string u = JoinPath(Dirname(root), "u/global_step4_universal");
  ASSERT_TRUE(RunConvert(JoinPath(root, "global_step4"), u).ok());
  const std::string q = JoinPath(u, "zero/2.attention.dense.weight/step.pt");
  ASSERT_TRUE(ucp::testing::RunCommand(absl::StrCat(ucp::testing::kPython,
                                                    " -c \"import torch; torch.save(torch.tensor(5.0), '", q, "')\""))
                  .ok());
  auto r = Reshard(ReshardTo(u, JoinPath(Dirname(root), "r/global_step4"), 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("step differs from that of"), std::string::npos) << r.status();
  auto v = ops::Verify(u);
  ASSERT_FALSE(v.problems.empty());
  bool named = false;
  for (const auto& p : v.problems) named |= p.find("step 5 in 2.attention.dense.weight/step.pt") != std::string::npos;
  EXPECT_TRUE(named) << v.problems[0];
}

// d09: optimizer files of tp ranks 0 and 1 swapped: the fp32 masters do not
// match the lp weights of the layer files of the rank their name says.
TEST(ReliabilityTest, D09SwappedTpShardsAreRefused) {
  const std::string root = CopyFixture("d09");
  const std::string tag = JoinPath(root, "global_step4");
  const std::string a = JoinPath(tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  const std::string b = JoinPath(tag, "zero_pp_rank_0_mp_rank_01_optim_states.pt");
  ASSERT_EQ(rename(a.c_str(), JoinPath(tag, "x").c_str()), 0);
  ASSERT_EQ(rename(b.c_str(), a.c_str()), 0);
  ASSERT_EQ(rename(JoinPath(tag, "x").c_str(), b.c_str()), 0);
  absl::Status s = RunConvert(tag, JoinPath(Dirname(root), "u/x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message().rfind(a, 0), 0u) << s;
  EXPECT_NE(s.message().find("do not match the lp weights of pipeline stage 0, tp rank 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("layer_0"), std::string::npos) << s;
}

// d09 on the bf16 fixture (lp weights are the masters rounded): the
// unswapped checkpoint passes.
TEST(ReliabilityTest, D09MastersMatchLpWeightsOnEveryFixture) {
  for (const std::string fx : {"neox-tp2-pp1-dp2", "neox-bf16-tp2-pp1-dp2", "neox-tp1-pp2-dp1",
                               "gpt-zero2-nopipe-tp2-dp2", "neox-tp2-pp1-dp1"}) {
    auto c = deepspeed_zero::ZeroCheckpoint::Open(FixturePath(fx + "/global_step4"));
    ASSERT_TRUE(c.ok()) << fx << ": " << c.status();
    const auto& t = (*c)->topology();
    for (int s = 0; s < t.pp; ++s) {
      for (int r = 0; r < t.tp; ++r) {
        for (int d = 0; d < t.dp; ++d) EXPECT_TRUE((*c)->Optim(s, r, d).ok()) << fx << " " << s << r << d;
      }
    }
  }
}

// d15: the layer files are gone.
TEST(ReliabilityTest, D15MissingLayerFilesAreAnError) {
  const std::string root = CopyFixture("d15");
  const std::string tag = JoinPath(root, "global_step4");
  auto names = ListDirectory(tag);
  ASSERT_TRUE(names.ok());
  for (const auto& n : *names) {
    if (n.rfind("layer_", 0) == 0) ASSERT_EQ(unlink(JoinPath(tag, n).c_str()), 0);
  }
  auto r = Reshard(ReshardTo(tag, JoinPath(Dirname(root), "r/global_step4"), 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_NE(r.status().message().find("missing layer files layer_00-model_00-model_states.pt"), std::string::npos)
      << r.status();
  EXPECT_FALSE(PathExists(JoinPath(Dirname(root), "r/global_step4")));
}

// d03, d13: flags checked before any work, and against the model.
TEST(ReliabilityTest, D13FlagsAreValidated) {
  const std::string root = CopyFixture("d13");
  const std::string tag = JoinPath(root, "global_step4");
  const std::string out = JoinPath(Dirname(root), "o/global_step4");
  auto code = [](const absl::StatusOr<ReshardResult>& r) { return r.status().code(); };
  ReshardOptions o = ReshardTo(tag, out, 1);
  o.write.zero_stage = -1;
  EXPECT_EQ(code(Reshard(o)), absl::StatusCode::kInvalidArgument);
  o = ReshardTo(tag, out, 1);
  o.write.num_threads = -3;
  EXPECT_EQ(code(Reshard(o)), absl::StatusCode::kInvalidArgument);
  o = ReshardTo(tag, out, 1);
  o.write.make_vocab_size_divisible_by = -1;
  EXPECT_EQ(code(Reshard(o)), absl::StatusCode::kInvalidArgument);
  o = ReshardTo(tag, out, 0);
  EXPECT_EQ(code(Reshard(o)), absl::StatusCode::kInvalidArgument);
  o = ReshardTo(tag, out, 8);  // 4 attention heads
  auto r = Reshard(o);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--tp=8 does not divide the model's num_attention_heads = 4"),
            std::string::npos)
      << r.status();
  o = ReshardTo(tag, out, 1);
  o.write.num_layers = 1000000000;
  r = Reshard(o);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--num_layers=1000000000"), std::string::npos) << r.status();
  EXPECT_EQ(RunConvert(tag, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PathExists(out));
}

// d16: writing `latest` fails after the commit: the message says the
// checkpoint itself is complete.
TEST(ReliabilityTest, D16LatestFailureSaysTheCheckpointIsComplete) {
  const std::string root = CopyFixture("d16");
  const std::string out_root = JoinPath(Dirname(root), "small");
  ASSERT_TRUE(MakeDirs(JoinPath(out_root, "latest/blocker")).ok());  // rename onto it fails
  auto r = Reshard(ReshardTo(JoinPath(root, "global_step4"), JoinPath(out_root, "r"), 1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the checkpoint itself is complete and committed at " +
                                      JoinPath(out_root, "r")),
            std::string::npos)
      << r.status();
  EXPECT_TRUE(PathExists(JoinPath(out_root, "r/mp_rank_00_model_states.pt")));
}

// d11: param_shapes whose product overflows int64.
TEST(ReliabilityTest, D11ShapeOverflowIsAnErrorNamingFileAndParam) {
  for (const std::string& dims : {"[2**63-1, 2**63-1, 48, 64]", "[2**32, 2**32]"}) {
    const std::string root = CopyFixture("d11");
    for (const char* f : {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"}) {
      ASSERT_TRUE(Python("edit_checkpoint.py", absl::StrCat(JoinPath(root, "global_step4/") + f,
                                                            " set param_shapes/0/0.word_embeddings.weight 'torch.Size(",
                                                            dims, ")'"))
                      .ok());
    }
    auto c = deepspeed_zero::ZeroCheckpoint::Open(JoinPath(root, "global_step4"));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_EQ(c.status().message().rfind(JoinPath(root, "global_step4/mp_rank_00_model_states.pt"), 0), 0u)
        << c.status();
    EXPECT_NE(c.status().message().find("param_shapes[0]['0.word_embeddings.weight']"), std::string::npos)
        << c.status();
  }
}

// Unsafe pickles: convert, reshard and export refuse them, naming the global
// and the file; inspect marks them; --allow_unsafe_pickle lets them through.
TEST(ReliabilityTest, UnsafePickleIsRefusedByWritersAndMarkedByInspect) {
  const std::string root = CopyFixture("unsafe");
  const std::string f = JoinPath(root, "global_step4/mp_rank_00_model_states.pt");
  ASSERT_TRUE(Python("edit_checkpoint.py", absl::StrCat(f, " set evil os.system")).ok());
  absl::Status s = RunConvert(JoinPath(root, "global_step4"), JoinPath(Dirname(root), "u/x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message().rfind(f + ": UNSAFE pickle: it names posix.system", 0), 0u) << s;
  EXPECT_EQ(Reshard(ReshardTo(JoinPath(root, "global_step4"), JoinPath(Dirname(root), "r/x"), 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExportOptions e;
  e.input_folder = JoinPath(root, "global_step4");
  e.output_folder = JoinPath(Dirname(root), "e");
  EXPECT_EQ(Export(e).status().code(), absl::StatusCode::kFailedPrecondition);
  auto report = ops::Inspect(JoinPath(root, "global_step4"));
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->unsafe_size(), 1);
  EXPECT_EQ(report->unsafe(0), f + ": posix.system");
  EXPECT_NE(formats::FormatReport(*report).find("UNSAFE " + f + ": posix.system"), std::string::npos);
  auto file_report = ops::Inspect(f);
  ASSERT_TRUE(file_report.ok()) << file_report.status();
  EXPECT_NE(formats::FormatReport(*file_report).find("evil: UNSAFE"), std::string::npos)
      << formats::FormatReport(*file_report);
  ConvertOptions allowed;
  allowed.input_folder = JoinPath(root, "global_step4");
  allowed.output_folder = JoinPath(Dirname(root), "u/x");
  allowed.state.allow_unsafe_pickles = true;
  s = Convert(allowed).status();
  EXPECT_TRUE(s.ok()) << s;
}

// d04: inspect of a file whose pickle shares sub-objects (a DAG of tuples,
// 2^60 nodes as a tree) prints each shared object once.
TEST(ReliabilityTest, D04InspectPrintsSharedObjectsOnce) {
  const std::string root = CopyFixture("d04");
  const std::string f = JoinPath(root, "global_step4/mp_rank_00_model_states.pt");
  ASSERT_TRUE(Python("edit_checkpoint.py",
                     absl::StrCat(f, " set bomb '__import__(\"functools\").reduce(lambda t, _: (t, t), range(60), ())'"))
                  .ok());
  auto report = ops::Inspect(f);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_LT(report->node_size(), 2000);
  EXPECT_LT(formats::FormatReport(*report).size(), size_t{1} << 20);
  EXPECT_NE(formats::FormatReport(*report).find("<the same tuple as bomb.0"), std::string::npos);
}

// d12: a huge or binary `latest` is refused without being read or echoed.
TEST(ReliabilityTest, D12LatestIsBounded) {
  const std::string root = CopyFixture("d12");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root, "latest"), std::string(1 << 20, 'a')).ok());
  auto c = deepspeed_zero::ZeroCheckpoint::Open(root);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << c.status();
  EXPECT_LT(c.status().message().size(), 300u);
  ASSERT_TRUE(WriteFileAtomic(JoinPath(root, "latest"), std::string("global_step4\0junk", 17)).ok());
  c = deepspeed_zero::ZeroCheckpoint::Open(root);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find("NUL"), std::string::npos) << c.status();
  ASSERT_EQ(unlink(JoinPath(root, "latest").c_str()), 0);
  ASSERT_EQ(mkfifo(JoinPath(root, "latest").c_str(), 0644), 0);
  c = deepspeed_zero::ZeroCheckpoint::Open(root);  // d01: does not block
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
}

// d01: a FIFO in place of an optimizer file.
TEST(ReliabilityTest, D01FifoCheckpointFileIsRefused) {
  const std::string root = CopyFixture("d01");
  const std::string f = JoinPath(root, "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  ASSERT_EQ(unlink(f.c_str()), 0);
  ASSERT_EQ(mkfifo(f.c_str(), 0644), 0);
  absl::Status s = RunConvert(JoinPath(root, "global_step4"), JoinPath(Dirname(root), "u/x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), f + ": a FIFO, expected a regular file");
}

// d14: fp32.pt of a universal checkpoint holding float16.
TEST(ReliabilityTest, D14WrongDtypeInUniversalFileNamesFileAndParam) {
  const std::string root = CopyFixture("d14");
  const std::string u = JoinPath(Dirname(root), "u/global_step4_universal");
  ASSERT_TRUE(RunConvert(JoinPath(root, "global_step4"), u).ok());
  const std::string q = JoinPath(u, "zero/2.attention.dense.weight/fp32.pt");
  ASSERT_TRUE(Python("edit_checkpoint.py", absl::StrCat(q, " set param 'torch.load(\"", q, "\")[\"param\"].half()'")).ok());
  auto r = Reshard(ReshardTo(u, JoinPath(Dirname(root), "r/global_step4"), 1));
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(q), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("2.attention.dense.weight"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("float16"), std::string::npos) << r.status();
}

// ucp verify: one line per problem, in ZeRO and universal folders.
TEST(ReliabilityTest, VerifyReportsEveryProblem) {
  const std::string root = CopyFixture("verify");
  const std::string tag = JoinPath(root, "global_step4");
  auto good = ops::Verify(tag);
  EXPECT_TRUE(good.problems.empty()) << good.problems[0];
  EXPECT_EQ(good.kind, "zero");
  EXPECT_EQ(good.files_checked, 2 + 4 + 24);
  const std::string u = JoinPath(Dirname(root), "u/global_step4_universal");
  ASSERT_TRUE(RunConvert(tag, u).ok());
  auto ugood = ops::Verify(u);
  EXPECT_TRUE(ugood.problems.empty()) << ugood.problems[0];
  EXPECT_EQ(ugood.kind, "universal");
  // Two damaged optimizer files: two lines.
  for (const char* f : {"zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_pp_rank_0_mp_rank_01_optim_states.pt"}) {
    ASSERT_TRUE(Python("mutate_checkpoint.py", absl::StrCat(JoinPath(tag, f),
                                                          " add-to-element optimizer_state_dict.base_optimizer_state."
                                                          "state.0.step 0 1"))
                    .ok());
  }
  auto bad = ops::Verify(tag);
  ASSERT_EQ(bad.problems.size(), 2u);
  EXPECT_NE(bad.problems[0].find("zero_pp_rank_1_mp_rank_00_optim_states.pt"), std::string::npos);
  EXPECT_NE(bad.problems[1].find("zero_pp_rank_0_mp_rank_01_optim_states.pt"), std::string::npos);
  // A universal file changed after the manifest: its digest.
  const std::string q = JoinPath(u, "zero/2.attention.dense.weight/exp_avg.pt");
  ASSERT_TRUE(Python("mutate_checkpoint.py", absl::StrCat(q, " add-to-element param 0 1")).ok());
  auto ubad = ops::Verify(u);
  ASSERT_FALSE(ubad.problems.empty());
  EXPECT_NE(ubad.problems[0].find("exp_avg.pt"), std::string::npos) << ubad.problems[0];
}

}  // namespace
}  // namespace ucp::ops
