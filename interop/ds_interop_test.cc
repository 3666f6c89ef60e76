// ucp against checkpoints written at test time by an independent writer of
// DeepSpeed 0.14.4's formats: testdata/python/make_ds_checkpoint.py, derived
// from DeepSpeed's source and run with /usr/bin/python3 + python3-torch. It
// covers what the real fixtures (all fp32) do not: ZeRO-2, fp16 and bf16 lp
// weights, BF16_Optimizer files, non-zero group padding, params straddling dp
// ranks, frozen params, buffers, tied embeddings across pipeline stages.
//
// For each case of the matrix the writer produces the checkpoint and, from its
// own model (not by reading the files back), expected.pt (the full fp32,
// exp_avg, exp_avg_sq, step of every param, its merge kind and the dict keys
// ds_to_universal writes for it), expected_optimizer_state.pt, the spec's
// rules as a MergeRules textproto, and the InspectReport ucp should print.
// The tests then check, per case:
//   - Convert: every universal zero/<param>/*.pt bitwise against expected.pt,
//     read by ucp's reader and, independently, by torch (check_checkpoint.py);
//   - Reshard: the source to another topology equals what the writer writes at
//     that topology, and back to the source topology equals the original; the
//     source's universal checkpoint resharded to the other topology too;
//   - Inspect: the report equals the writer's.
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "ops/convert.h"
#include "testing/compare.h"
#include "ops/inspect.h"
#include "state/topology.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "ops/reshard.h"
#include "proto/ucp.pb.h"
#include "testing/fixtures.h"

namespace ucp {
namespace {

using ::testing::IsEmpty;
using state::Topology;
using pickle::Kind;
using pickle::Value;
using testing::FreshTempDir;
using testing::kPython;
using testing::RunCommand;
using testing::RunfilePath;

// One checkpoint layout of the matrix.
struct InteropCase {
  std::string name;
  std::string spec;              // file under interop/testdata/
  std::vector<std::string> set;  // make_ds_checkpoint.py --set overrides (KEY=JSON)
  Topology source;
  Topology other;                // the topology of the reshard round trip
  bool rules_file = true;        // false: rules come from universal_checkpoint_info
  // What inspect must say (also in the writer's expected report).
  int zero_stage = 1;
  std::string optimizer_layout;  // "zero" or "bf16"
  std::string lp_dtype;
  // With rules_file false and no patterns: no rule flags at all (the preset
  // is detected from the names), only the unpadded vocab size when > 0.
  int64_t original_vocab_size = 0;
};

void PrintTo(const InteropCase& c, std::ostream* os) { *os << c.name; }

std::string PythonScript(const std::string& name) { return RunfilePath("testdata/python/" + name); }

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

// Runs the writer for `c` at topology `t` into `root` (tag global_stepN).
absl::Status Generate(const InteropCase& c, const Topology& t, const std::string& root) {
  std::string cmd = absl::StrCat(kPython, " ", PythonScript("make_ds_checkpoint.py"), " ",
                                 RunfilePath("interop/testdata/" + c.spec), " ", root, " --tp ", t.tp, " --pp ",
                                 t.pp, " --dp ", t.dp);
  for (const std::string& s : c.set) absl::StrAppend(&cmd, " --set ", ShellQuote(s));
  auto out = RunCommand(cmd);
  if (!out.ok()) return out.status();
  return absl::OkStatus();
}

// The source checkpoint of a case, generated once per test binary run.
absl::StatusOr<std::string> SourceRoot(const InteropCase& c) {
  static auto* cache = new std::map<std::string, absl::StatusOr<std::string>>();
  auto it = cache->find(c.name);
  if (it != cache->end()) return it->second;
  const std::string root = JoinPath(FreshTempDir(absl::StrCat("src_", c.name)), "ckpt");
  absl::Status s = Generate(c, c.source, root);
  absl::StatusOr<std::string> result = s.ok() ? absl::StatusOr<std::string>(root) : s;
  cache->emplace(c.name, result);
  return result;
}

absl::StatusOr<std::string> TagFolder(const std::string& root) {
  auto tag = ReadFileToString(JoinPath(root, "latest"));
  if (!tag.ok()) return tag.status();
  return JoinPath(root, *tag);
}

ops::SourceOptions StateOptions(const InteropCase& c, const std::string& root) {
  ops::SourceOptions o;
  if (c.rules_file) o.rules.rules_file = JoinPath(root, "rules.textproto");
  if (c.original_vocab_size > 0) o.rules.original_vocab_size = c.original_vocab_size;
  o.num_threads = 2;
  return o;
}

// The keys of a dict value, in order.
std::vector<std::string> Keys(const Value& d) {
  std::vector<std::string> out;
  for (const auto& [k, v] : d.dict_items()) out.push_back(k->is(Kind::kStr) ? k->str() : k->DebugString(40));
  return out;
}

// The strings of a list value.
std::vector<std::string> StringList(const Value* v) {
  std::vector<std::string> out;
  if (v == nullptr) return out;
  for (const auto& item : v->items()) out.push_back(item->str());
  return out;
}

// The python oracle: prints "ok" or one line per problem. `args` may hold
// several checks separated by "---" (one process, torch imported once).
void ExpectPythonCheck(const std::vector<std::string>& args) {
  std::string cmd = absl::StrCat(kPython, " ", PythonScript("check_checkpoint.py"));
  for (const auto& a : args) absl::StrAppend(&cmd, " ", ShellQuote(a));
  auto out = RunCommand(cmd);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(absl::EndsWith(*out, "ok\n")) << *out;
}

class DsInteropTest : public ::testing::TestWithParam<InteropCase> {};

// ---------------------------------------------------------------------------
// Convert: the universal checkpoint against the writer's expectations.

// Checks one zero/<name>/<state>.pt against expected[name].
void ExpectUniversalState(const std::string& out, const std::string& name, const std::string& state,
                          const torch::TorchFile& expected_file, const Value& e) {
  const std::string path = JoinPath(out, absl::StrCat("zero/", name, "/", state, ".pt"));
  auto f = torch::TorchFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const Value& d = *(*f)->root();
  ASSERT_TRUE(d.is(Kind::kDict)) << path;
  EXPECT_EQ(Keys(d), StringList(e.DictGet("keys"))) << path << " (" << e.DictGet("kind")->str() << ")";
  for (const char* key : {"cat_dim", "param_n_sub_params"}) {
    if (const Value* want = e.DictGet(key)) {
      const Value* have = d.DictGet(key);
      ASSERT_NE(have, nullptr) << path << " has no " << key;
      EXPECT_EQ(have->int_value(), want->int_value()) << path << " " << key;
    }
  }
  if (e.DictGet("kind")->str() == "vocab") {
    const Value* v = d.DictGet("vocab_tensor");
    ASSERT_NE(v, nullptr) << path;
    EXPECT_TRUE(v->is(Kind::kBool) && v->bool_value()) << path;
  }
  const Value* param = d.DictGet("param");
  ASSERT_NE(param, nullptr) << path;
  auto have = (*f)->GetTensor(*param);
  auto want = expected_file.GetTensor(*e.DictGet(state));
  ASSERT_TRUE(have.ok() && want.ok()) << path;
  EXPECT_TRUE(have->BitwiseEqual(*want)) << path << ": " << torch::ShapeString(have->sizes()) << " vs expected "
                                         << torch::ShapeString(want->sizes());
  EXPECT_EQ(have->requires_grad(), want->requires_grad()) << path << " requires_grad";
}

TEST_P(DsInteropTest, ConvertGivesTheExpectedUniversalCheckpoint) {
  const InteropCase& c = GetParam();
  auto root = SourceRoot(c);
  ASSERT_TRUE(root.ok()) << root.status();
  auto tag_dir = TagFolder(*root);
  ASSERT_TRUE(tag_dir.ok()) << tag_dir.status();
  const std::string out_root = FreshTempDir(absl::StrCat("convert_", c.name));
  const std::string out = JoinPath(out_root, "universal");
  ops::ConvertOptions o;
  o.input_folder = *tag_dir;
  o.output_folder = out;
  o.state = StateOptions(c, *root);
  o.write.num_threads = 2;
  auto result = ops::Convert(o);
  ASSERT_TRUE(result.ok()) << result.status();

  auto expected = torch::TorchFile::Open(JoinPath(*root, "expected.pt"));
  ASSERT_TRUE(expected.ok()) << expected.status();
  std::vector<std::string> trainable;
  int frozen_or_buffers = 0;
  for (const auto& [k, e] : (*expected)->root()->dict_items()) {
    const std::string& name = k->str();
    const std::string role = e->DictGet("role")->str();
    if (role != "trainable") {
      // Outside the optimizer: DeepSpeed's universal format has no place for
      // them; ucp keeps their merged lp tensor in ucp_module/.
      ++frozen_or_buffers;
      EXPECT_FALSE(PathExists(JoinPath(out, "zero/" + name))) << name << " is " << role;
      auto f = torch::TorchFile::Open(JoinPath(out, "ucp_module/" + name + ".pt"));
      ASSERT_TRUE(f.ok()) << f.status();
      auto have = (*f)->GetTensor(*(*f)->root()->DictGet("param"));
      auto want = (*expected)->GetTensor(*e->DictGet("lp"));
      ASSERT_TRUE(have.ok() && want.ok()) << name;
      EXPECT_TRUE(have->BitwiseEqual(*want)) << name;
      continue;
    }
    trainable.push_back(name);
    for (const char* state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      ExpectUniversalState(out, name, state, **expected, *e);
    }
    auto step = torch::TorchFile::Open(JoinPath(out, "zero/" + name + "/step.pt"));
    ASSERT_TRUE(step.ok()) << step.status();
    auto have = (*step)->GetTensor(*(*step)->root());
    auto want = (*expected)->GetTensor(*e->DictGet("step"));
    ASSERT_TRUE(have.ok() && want.ok()) << name;
    EXPECT_TRUE(have->BitwiseEqual(*want)) << name << "/step.pt";
  }
  EXPECT_GT(trainable.size(), 5u);  // the smallest model of the matrix has 6
  // zero/ holds exactly the trainable params and optimizer_state.pt.
  auto entries = ListDirectory(JoinPath(out, "zero"));
  ASSERT_TRUE(entries.ok());
  std::vector<std::string> dirs;
  for (const auto& n : *entries) {
    if (n != "optimizer_state.pt") dirs.push_back(n);
  }
  std::sort(trainable.begin(), trainable.end());
  EXPECT_EQ(dirs, trainable);
  auto diffs = testing::CompareFiles(JoinPath(out, "zero/optimizer_state.pt"),
                                       JoinPath(*root, "expected_optimizer_state.pt"));
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << absl::StrJoin(*diffs, "\n");
  // mp_rank files are byte-identical copies (a plain module at tp > 1: one,
  // tp rank 0's for any tp); latest_universal names the folder.
  const bool plain = !PathExists(JoinPath(*tag_dir, "layer_00-model_00-model_states.pt")) &&
                     !PathExists(JoinPath(*tag_dir, "layer_01-model_00-model_states.pt"));
  if (plain && c.source.tp > 1) {
    for (int r = 1; r < c.source.tp; ++r) {
      EXPECT_FALSE(PathExists(JoinPath(out, absl::StrCat("mp_rank_0", r, "_model_states.pt"))));
    }
    auto single = testing::CompareSingleMpRankFile(JoinPath(out, "mp_rank_00_model_states.pt"),
                                                   JoinPath(*tag_dir, "mp_rank_00_model_states.pt"));
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_THAT(*single, IsEmpty()) << absl::StrJoin(*single, "\n");
  }
  for (int r = 0; r < c.source.tp * c.source.pp && !(plain && c.source.tp > 1); ++r) {
    const std::string mp = absl::StrCat("mp_rank_", r < 10 ? "0" : "", r, "_model_states.pt");
    auto a = ReadFileToString(JoinPath(out, mp));
    auto b = ReadFileToString(JoinPath(*tag_dir, mp));
    ASSERT_TRUE(a.ok() && b.ok()) << mp;
    EXPECT_TRUE(*a == *b) << mp;
  }
  auto latest = ReadFileToString(JoinPath(out_root, "latest_universal"));
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, "universal");
  // The same, read by torch itself.
  ExpectPythonCheck({"universal", *root, out});
}

// ---------------------------------------------------------------------------
// Reshard: to another topology and back.

// ucp's output folder against the writer's: ucp's comparison (tensors by
// dtype, shape, bytes and requires_grad) now, torch's (check_checkpoint.py)
// added to `python_checks` for one run at the end.
void ExpectSameCheckpoint(const std::string& ours, const std::string& writers,
                          std::vector<std::string>& python_checks) {
  testing::CompareOptions o;
  o.compare_requires_grad = true;
  auto diffs = testing::CompareFolders(ours, writers, {}, o);
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_THAT(*diffs, IsEmpty()) << ours << " vs " << writers << ":\n" << absl::StrJoin(*diffs, "\n");
  if (!python_checks.empty()) python_checks.push_back("---");
  for (const std::string& a : {std::string("same"), ours, writers}) python_checks.push_back(a);
}

TEST_P(DsInteropTest, ReshardToAnotherTopologyAndBack) {
  const InteropCase& c = GetParam();
  auto root = SourceRoot(c);
  ASSERT_TRUE(root.ok()) << root.status();
  auto tag_dir = TagFolder(*root);
  ASSERT_TRUE(tag_dir.ok());
  const std::string tag = Basename(*tag_dir);
  const std::string work = FreshTempDir(absl::StrCat("reshard_", c.name));
  // What DeepSpeed would have saved at the other topology: the same model,
  // written by the writer there.
  const std::string other_root = JoinPath(work, "writer_other");
  absl::Status generated = Generate(c, c.other, other_root);
  ASSERT_TRUE(generated.ok()) << generated;

  ops::ReshardOptions there;
  there.input_folder = *tag_dir;
  there.output_folder = JoinPath(work, "there/" + tag);
  there.write.target = c.other;
  there.write.num_threads = 2;
  there.zero_source = StateOptions(c, *root);
  std::vector<std::string> python_checks;
  auto r1 = ops::Reshard(there);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->source, c.source);
  ExpectSameCheckpoint(there.output_folder, JoinPath(other_root, tag), python_checks);

  ops::ReshardOptions back = there;
  back.input_folder = there.output_folder;
  back.output_folder = JoinPath(work, "back/" + tag);
  back.write.target = c.source;
  auto r2 = ops::Reshard(back);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->source, c.other);
  ExpectSameCheckpoint(back.output_folder, *tag_dir, python_checks);
  auto latest = ReadFileToString(JoinPath(work, "back/latest"));
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, tag);

  // The same target from ucp's universal checkpoint of the source.
  ops::ConvertOptions convert;
  convert.input_folder = *tag_dir;
  convert.output_folder = JoinPath(work, "universal/" + tag + "_universal");
  convert.state = StateOptions(c, *root);
  convert.write.num_threads = 2;
  auto converted = ops::Convert(convert);
  ASSERT_TRUE(converted.ok()) << converted.status();
  ops::ReshardOptions from_universal = there;
  from_universal.input_folder = convert.output_folder;
  from_universal.output_folder = JoinPath(work, "from_universal/" + tag);
  auto r3 = ops::Reshard(from_universal);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(r3->source_kind, "universal");
  ExpectSameCheckpoint(from_universal.output_folder, JoinPath(other_root, tag), python_checks);
  ExpectPythonCheck(python_checks);
}

// ---------------------------------------------------------------------------
// Inspect: topology, ZeRO stage, optimizer layout, groups, fragments.

TEST_P(DsInteropTest, InspectReportsWhatTheWriterWrote) {
  const InteropCase& c = GetParam();
  auto root = SourceRoot(c);
  ASSERT_TRUE(root.ok()) << root.status();
  auto tag_dir = TagFolder(*root);
  ASSERT_TRUE(tag_dir.ok());
  auto report = ops::Inspect(*root);  // a root with `latest`
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->kind(), "zero");
  EXPECT_EQ(Topology::FromProto(report->topology()), c.source);
  EXPECT_EQ(report->zero_stage(), c.zero_stage);
  EXPECT_EQ(report->optimizer_layout(), c.optimizer_layout);
  EXPECT_EQ(report->lp_dtype(), c.lp_dtype);
  // The matrix is meant to cover alignment padding and, with dp > 1, params
  // straddling two dp ranks: make sure the specs still produce them.
  int padded_groups = 0;
  for (const auto& g : report->group()) {
    for (int64_t p : g.padding()) padded_groups += p > 0 ? 1 : 0;
  }
  EXPECT_GT(padded_groups, 0) << "no param group of stage 0 needs padding";
  int straddling = 0;
  for (const auto& p : report->param()) {
    std::map<std::pair<int, int>, int> ranks;  // (pp, tp) -> dp ranks holding a fragment
    for (const auto& f : p.fragment()) ++ranks[{f.pp_rank(), f.tp_rank()}];
    for (const auto& [where, n] : ranks) straddling += n > 1 ? 1 : 0;
  }
  if (c.source.dp > 1) EXPECT_GT(straddling, 0) << "no param straddles dp ranks";
  // Everything else the writer knows, field for field.
  auto text = ReadFileToString(JoinPath(*root, "expected_inspect.textproto"));
  ASSERT_TRUE(text.ok());
  InspectReport want;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(*text, &want));
  InspectReport have = *report;
  have.clear_path();
  have.clear_file();
  have.clear_node();
  google::protobuf::util::MessageDifferencer diff;
  std::string report_text;
  diff.ReportDifferencesToString(&report_text);
  EXPECT_TRUE(diff.Compare(have, want)) << report_text;
}

std::vector<InteropCase> Matrix() {
  const std::string no_file_tie = "layers.6.forward_fn=false";
  return {
      // ZeRO-1, fp32, PipelineModule; Megatron's tied output layer (a
      // TiedLayerSpec with forward_fn, so no file), pp stays 1.
      {"zero1_fp32_pipe_tp2_dp2", "gpt_pipe.json", {}, {2, 1, 2}, {1, 1, 3}, true, 1, "zero", "float32"},
      // ZeRO-1, fp16 lp weights (DynamicLossScaler), the tied embedding in the
      // first and the last stage.
      {"zero1_fp16_pipe_tp2_pp2_dp1_tied",
       "gpt_pipe.json",
       {"lp_dtype=\"fp16\"", no_file_tie},
       {2, 2, 1},
       {1, 1, 2},
       true,
       1,
       "zero",
       "float16"},
      // ZeRO-2, fp32, plain nn.Module: views into the flat buffers, frozen
      // params with frozen_param_shapes/fragments, buffers; padding on both
      // groups at dp=3, params straddling dp ranks.
      {"zero2_fp32_plain_tp2_dp3", "gpt_plain.json", {}, {2, 1, 3}, {1, 1, 2}, true, 2, "zero", "float32"},
      // BF16_Optimizer (7-key state dict, whole fp32 partitions, bf16 layer
      // files), padding at dp=2, to pp=2 and back.
      {"bf16_optimizer_pipe_tp2_dp2",
       "gpt_pipe.json",
       {"optimizer=\"bf16\"", "lp_dtype=\"bf16\"", no_file_tie},
       {2, 1, 2},
       {1, 2, 3},
       true,
       1,
       "bf16",
       "bfloat16"},
      // ZeRO-2 with fp16 lp weights, tp raised from 1 to 2.
      {"zero2_fp16_plain_tp1_dp2", "gpt_plain.json", {"lp_dtype=\"fp16\""}, {1, 1, 2}, {2, 1, 3}, true, 2, "zero",
       "float16"},
      // ZeRO-2 with bf16 lp weights: DeepSpeedZeroOptimizer (11 keys) in files
      // named bf16_zero_pp_rank_*.
      {"zero2_bf16_plain_tp2_dp2", "gpt_plain.json", {"lp_dtype=\"bf16\""}, {2, 1, 2}, {1, 1, 1}, true, 2, "zero",
       "bfloat16"},
      // Rules from the checkpoint's universal_checkpoint_info patterns, no
      // rules file, as Megatron-DeepSpeed writes them; the pipeline stages by
      // partition_method "uniform" (recorded in args), to pp=3 and back.
      {"zero1_fp32_pipe_tp2_pp2_dp2_patterns_uniform",
       "gpt_pipe.json",
       {"uc_info=\"patterns\"", "partition_method=\"uniform\"", no_file_tie},
       {2, 2, 2},
       {1, 3, 1},
       false,
       1,
       "zero",
       "float32"},
      // savanna (StripedHyena 2 / Evo 2) with no rule flags: the savanna
      // preset, detected from the names, settles every tensor (2-, 3- and
      // 4-D, split on dim 0 or 1, names that clash but for their rank).
      // PipelineModule names (the tied output layer a TiedLayerSpec with
      // forward_fn, no file, as savanna builds it), to tp=1 dp=3 and back.
      {"savanna_pipe_tp2_dp2_no_flags", "savanna_pipe.json", {}, {2, 1, 2}, {1, 1, 3}, false, 1, "zero", "float32", 64},
      // Two stages (the tied embedding in both, with a file), partitioned by
      // type:ParallelBlockPipe, to tp=1 pp=1 and back; layer 2's input norm a
      // ScaleNorm (".g", [1]) so that stage 0's groups need padding.
      {"savanna_pipe_tp2_pp2_dp2_no_flags",
       "savanna_pipe.json",
       {"layers.10.forward_fn=false", "layers.2.module.0.name=\"input_layernorm.g\"", "layers.2.module.0.shape=[1]"},
       {2, 2, 2},
       {1, 1, 2},
       false,
       1,
       "zero",
       "float32",
       64},
      // The same at pp=1 as a plain module (sequential.<layer>.<path>), the
      // output layer untied, bf16 lp weights.
      {"savanna_plain_tp2_dp2_no_flags",
       "savanna_plain.json",
       {"lp_dtype=\"bf16\""},
       {2, 1, 2},
       {1, 1, 3},
       false,
       1,
       "zero",
       "bfloat16",
       64},
      // A Hugging Face LlamaForCausalLM as the Trainer saves it (tp=1, ZeRO-2,
      // two param groups, no rule flags; dp=3 so that the norms' group needs
      // padding): the hf-llama preset, detected from the names, splits it as
      // AutoTP does (q/k/v/gate/up/lm_head on dim 0, o/down on dim 1,
      // embeddings and norms whole) to tp=2 dp=2, and back.
      {"hf_llama_plain_tp1_dp3_no_flags", "hf_llama_plain.json", {}, {1, 1, 3}, {2, 1, 2}, false, 2, "zero", "float32"},
      // ZeRO-2 bf16 plain module with lm_head.weight tied to embed.weight:
      // the alias is neither in frozen_param_shapes nor in the optimizer,
      // and shared_params stays in global rank 0's file at tp=2.
      {"zero2_bf16_plain_tied_tp1_dp4", "plain_tied_zero2.json", {}, {1, 1, 4}, {2, 1, 2}, true, 2, "zero", "bfloat16"},
      // pp=1 with weight tying (sequential.10.word_embeddings.weight an
      // alias of sequential.0's, in shared_params of global rank 0's file
      // only), tp 2 -> 1 and back.
      {"savanna_plain_tied_tp2_dp2_no_flags",
       "savanna_plain_tied.json",
       {},
       {2, 1, 2},
       {1, 1, 1},
       false,
       1,
       "zero",
       "float32",
       64},
  };
}

INSTANTIATE_TEST_SUITE_P(Matrix, DsInteropTest, ::testing::ValuesIn(Matrix()),
                         [](const ::testing::TestParamInfo<InteropCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// The writer itself against real DeepSpeed 0.14.4 output: for the model of the
// fixtures it must write the same files with the same structure (keys and
// their order, container and object types, scalars, and every tensor's dtype,
// shape, stride, storage offset and size, requires_grad and storage sharing),
// values aside (the fixtures' come from training). Only the job's own state
// (config, args, random states) is left out.

struct FixtureCase {
  std::string name;
  std::string spec;
  std::vector<std::string> set;
  std::string fixture;
};

void PrintTo(const FixtureCase& c, std::ostream* os) { *os << c.name; }

class WriterVsDeepSpeedTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(WriterVsDeepSpeedTest, SameFilesAndStructureAsDeepSpeedWrote) {
  const FixtureCase& c = GetParam();
  const std::string root = JoinPath(FreshTempDir(absl::StrCat("writer_", c.name)), "ckpt");
  InteropCase ic;
  ic.spec = c.spec;
  ic.set = c.set;
  const Topology fixture_topology{2, 1, 2};  // every fixture compared here is tp=2 pp=1 dp=2
  absl::Status generated = Generate(ic, fixture_topology, root);
  ASSERT_TRUE(generated.ok()) << generated;
  std::vector<std::string> args = {"skeleton", JoinPath(root, "global_step4"),
                                   testing::FixturePath(c.fixture + "/global_step4")};
  for (const char* key :
       {"ds_config", "args", "random_rng_state", "np_rng_state", "torch_rng_state", "rng_tracker_states"}) {
    args.push_back("--ignore-key");
    args.push_back(key);
  }
  ExpectPythonCheck(args);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, WriterVsDeepSpeedTest,
    ::testing::Values(FixtureCase{"zero1_fp32_pipeline", "neox_fixture_pipe.json", {}, "neox-tp2-pp1-dp2"},
                      FixtureCase{"zero2_fp32_plain_module", "neox_fixture_plain.json", {}, "gpt-zero2-nopipe-tp2-dp2"},
                      FixtureCase{"bf16_optimizer_pipeline",
                                  "neox_fixture_pipe.json",
                                  {"optimizer=\"bf16\"", "lp_dtype=\"bf16\"", "micro_batch=2", "train_batch_size=4"},
                                  "neox-bf16-tp2-pp1-dp2"}),
    [](const ::testing::TestParamInfo<FixtureCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// Vocabulary padding rows hold values in a real run (Megatron initializes and
// trains the whole padded embedding); the universal checkpoint drops them.

// savanna at pp=1 with weight tying (PipelineModule.to_sequential(): the
// output layer is the embedding module again, so the module state dict holds
// sequential.10.word_embeddings.weight as an alias of sequential.0's), tp=2,
// converted with no rule flags: every trainable param is the writer's, the
// alias is kept as a module tensor. (Reshard and inspect of the same model:
// the matrix case savanna_plain_tied_tp2_dp2_no_flags.)
TEST(DsInteropSavannaTest, TiedSequentialModelConvertsWithNoRuleFlags) {
  InteropCase c;
  c.name = "savanna_plain_tied_tp2_dp2";
  c.spec = "savanna_plain_tied.json";
  c.source = {2, 1, 2};
  c.rules_file = false;
  c.original_vocab_size = 64;
  auto root = SourceRoot(c);
  ASSERT_TRUE(root.ok()) << root.status();
  auto tag_dir = TagFolder(*root);
  ASSERT_TRUE(tag_dir.ok());
  ops::ConvertOptions o;
  o.input_folder = *tag_dir;
  o.output_folder = JoinPath(FreshTempDir("convert_savanna_tied"), "universal");
  o.state = StateOptions(c, *root);
  auto result = ops::Convert(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->summary, ::testing::HasSubstr("preset: savanna (detected from param names)"));
  auto expected = torch::TorchFile::Open(JoinPath(*root, "expected.pt"));
  ASSERT_TRUE(expected.ok()) << expected.status();
  int trainable = 0;
  for (const auto& [k, e] : (*expected)->root()->dict_items()) {
    if (e->DictGet("role")->str() != "trainable") continue;
    ++trainable;
    for (const char* state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      ExpectUniversalState(o.output_folder, k->str(), state, **expected, *e);
    }
  }
  EXPECT_EQ(trainable, 86);
  auto alias = torch::TorchFile::Open(JoinPath(o.output_folder, "ucp_module/sequential.10.word_embeddings.weight.pt"));
  ASSERT_TRUE(alias.ok()) << alias.status();
  auto have = (*alias)->GetTensor(*(*alias)->root()->DictGet("param"));
  auto want = (*expected)->GetTensor(*(*expected)->root()->DictGet("sequential.0.word_embeddings.weight")->DictGet("fp32"));
  ASSERT_TRUE(have.ok() && want.ok());
  EXPECT_TRUE(have->BitwiseEqual(*want));
}

TEST(DsInteropVocabTest, ConvertStripsNonZeroVocabPadding) {
  InteropCase c;
  c.name = "vocab_padding_random";
  c.spec = "gpt_plain.json";
  c.set = {"vocab_padding=\"random\""};
  c.source = {2, 1, 3};
  auto root = SourceRoot(c);
  ASSERT_TRUE(root.ok()) << root.status();
  auto tag_dir = TagFolder(*root);
  ASSERT_TRUE(tag_dir.ok());
  const std::string out = JoinPath(FreshTempDir("convert_vocab_padding"), "universal");
  ops::ConvertOptions o;
  o.input_folder = *tag_dir;
  o.output_folder = out;
  o.state = StateOptions(c, *root);
  auto result = ops::Convert(o);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectPythonCheck({"universal", *root, out});
}

// ---------------------------------------------------------------------------
// Megatron-DeepSpeed and GPT-NeoX tie the output layer to the embedding with
// TiedLayerSpec(..., forward_fn=...). That layer is a functools.partial, so
// PipelineModule.save_state_dict writes no file for it and the checkpoint
// only shows the tied params in the last stage's param_shapes. ucp places the
// file-less use as the last layer spec (and says so), so the tied params stay
// in the last stage at every pp.
TEST(DsInteropTiedHeadTest, MegatronTiedOutputLayerStaysInTheLastStage) {
  InteropCase c;
  c.name = "megatron_tied_output_pp2";
  c.spec = "gpt_pipe.json";  // layer 6: {"tied": "embed", "forward_fn": true}
  c.source = {2, 2, 1};
  c.other = {1, 2, 2};
  auto root = SourceRoot(c);
  ASSERT_TRUE(root.ok()) << root.status();
  auto tag_dir = TagFolder(*root);
  ASSERT_TRUE(tag_dir.ok());
  const std::string work = FreshTempDir("megatron_tied_output_pp2");
  const std::string other_root = JoinPath(work, "writer_other");
  absl::Status generated = Generate(c, c.other, other_root);
  ASSERT_TRUE(generated.ok()) << generated;
  ops::ReshardOptions o;
  o.input_folder = *tag_dir;
  o.output_folder = JoinPath(work, "there/global_step4");
  o.write.target = c.other;
  o.zero_source = StateOptions(c, *root);
  auto r = ops::Reshard(o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> python_checks;
  ExpectSameCheckpoint(o.output_folder, JoinPath(other_root, "global_step4"), python_checks);
  ExpectPythonCheck(python_checks);
}

}  // namespace
}  // namespace ucp
