// Bad input: each case gets its specific error naming the file or param, and
// leaves neither an output folder, nor a staging folder, nor latest_universal.
#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "ops/convert.h"
#include "ops/export.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "format/torch/torch_file.h"
#include "gtest/gtest.h"
#include "testing/damage.h"
#include "testing/fixtures.h"

namespace ucp::ops {
namespace {

using ucp::testing::FixturePath;
using ucp::testing::FreshTempDir;

struct Case {
  std::string root;    // holds the damaged source and the output
  std::string source;  // the damaged checkpoint tag folder
  std::string output;
};

Case Prepare(const std::string& name, const std::string& fixture) {
  Case c;
  c.root = FreshTempDir(name);
  c.source = JoinPath(c.root, "src/global_step4");
  EXPECT_TRUE(CopyTree(FixturePath(fixture + "/global_step4"), c.source).ok());
  c.output = JoinPath(c.root, "out/global_step4_universal");
  return c;
}

// `preset` "none": no model preset, so merge rules come from the checkpoint
// and the evidence only.
absl::Status RunConvert(const Case& c, const std::string& preset = "") {
  ConvertOptions o;
  o.input_folder = c.source;
  o.output_folder = c.output;
  o.write.num_threads = 2;
  o.state.rules.preset = preset;
  return Convert(o).status();
}

// Flips a byte a third of the way into the module weight `name` of the
// model-states file `f`: not one of the elements the open compares with the
// fp32 masters (each fragment's first, middle and last), so only the
// record's CRC check can tell.
absl::Status DamageModuleWeight(const std::string& f, const std::string& name) {
  return ucp::testing::FlipByteInTensor(
      f,
      [&name](const pickle::Value& root) -> const pickle::Value* {
        const pickle::Value* module = root.DictGet("module");
        return module == nullptr ? nullptr : module->DictGet(name);
      },
      1.0 / 3);
}

// `s`, what `command` returned, is the CRC error of a record of `f`.
void ExpectDamage(const absl::Status& s, const std::string& f, const std::string& command) {
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << command << ": " << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), absl::StrCat(f, ": record '"))) << command << ": " << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "CRC-32 mismatch")) << command << ": " << s;
}

void ExpectNothingWritten(const Case& c) {
  EXPECT_FALSE(PathExists(c.output));
  const std::string out_root = JoinPath(c.root, "out");
  EXPECT_FALSE(PathExists(JoinPath(out_root, "latest_universal")));
  if (IsDirectory(out_root)) {
    auto names = ListDirectory(out_root);
    ASSERT_TRUE(names.ok());
    EXPECT_TRUE(names->empty()) << "left behind: " << (*names)[0];
  }
}

TEST(ConvertErrorsTest, MissingDpShard) {
  Case c = Prepare("missing_dp_shard", "neox-tp2-pp1-dp2");
  const std::string gone = JoinPath(c.source, "zero_pp_rank_1_mp_rank_01_optim_states.pt");
  ASSERT_EQ(unlink(gone.c_str()), 0);
  absl::Status s = RunConvert(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), absl::StrCat(gone, ": missing (dp_world_size 2 in mp_rank_01_model_states.pt)"));
  ExpectNothingWritten(c);
}

TEST(ConvertErrorsTest, ReplicatedCopiesDiffer) {
  Case c = Prepare("replicated_differ", "neox-tp2-pp1-dp1");
  // 2.input_layernorm.scale is the first param of group 1 on every tp rank:
  // nudge element 3 of tp rank 1's fp32 copy.
  auto out = ucp::testing::RunCommand(absl::StrCat(
      ucp::testing::kPython, " ", ucp::testing::RunfilePath("testdata/python/mutate_checkpoint.py"), " ",
      JoinPath(c.source, "zero_pp_rank_0_mp_rank_01_optim_states.pt"),
      " add-to-element optimizer_state_dict.single_partition_of_fp32_groups.1 3 0.25"));
  ASSERT_TRUE(out.ok()) << out.status();
  absl::Status s = RunConvert(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("1 replicated param(s) differ between tp ranks"), std::string::npos) << s;
  EXPECT_NE(s.message().find("2.input_layernorm.scale (preset gpt-neox"), std::string::npos) << s;
  EXPECT_NE(s.message().find("tp copies differ in fp32, largest |difference| 0.25"), std::string::npos) << s;
  ExpectNothingWritten(c);

  // Accepting the mismatch keeps the mean, or tp rank 0.
  ConvertOptions o;
  o.input_folder = c.source;
  o.output_folder = c.output;
  o.state.replicated_mismatch = rules::ReplicatedMismatch::kAverage;
  auto result = Convert(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->explain.find("2.input_layernorm.scale [64] average [preset]"), std::string::npos)
      << result->explain;
}

TEST(ConvertErrorsTest, UnknownFileLayout) {
  Case c;
  c.root = FreshTempDir("unknown_layout");
  c.source = JoinPath(c.root, "src/global_step4");
  ASSERT_TRUE(MakeDirs(c.source).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(c.source, "model.safetensors"), "{}").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(c.source, "pytorch_model.bin"), "x").ok());
  c.output = JoinPath(c.root, "out/u");
  absl::Status s = RunConvert(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // The registry's refusal: the folder, every format ucp reads, what it holds.
  EXPECT_TRUE(absl::StartsWith(s.message(), absl::StrCat(c.source, ": unrecognized checkpoint layout: expected ")))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "a DeepSpeed ZeRO stage 1/2 checkpoint (mp_rank_XX_model_states.pt")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "a universal checkpoint")) << s;
  EXPECT_TRUE(absl::EndsWith(s.message(), "; found 2 other entries, e.g. 'model.safetensors'")) << s;
  ExpectNothingWritten(c);
}

TEST(ConvertErrorsTest, MixtureOfExpertsIsRefused) {
  Case c = Prepare("moe", "neox-tp2-pp1-dp1");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(c.source, "layer_02_expert_0_mp_rank_00_model_states.pt"), "x").ok());
  absl::Status s = RunConvert(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  // A pipeline checkpoint with an expert file: MoE, but not at tp=pp=1.
  EXPECT_NE(s.message().find("DeepSpeed 0.14.4 native mixture-of-experts checkpoint with layer_00-model_00"),
            std::string::npos)
      << s;
  ExpectNothingWritten(c);
}

TEST(ConvertErrorsTest, TruncatedTensorFile) {
  Case c = Prepare("truncated", "neox-tp2-pp1-dp1");
  const std::string f = JoinPath(c.source, "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  auto size = FileSize(f);
  ASSERT_TRUE(size.ok());
  ASSERT_EQ(truncate(f.c_str(), *size / 2), 0);
  absl::Status s = RunConvert(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message().rfind(f, 0), 0u) << "the message should start with the file: " << s;
  ExpectNothingWritten(c);
}

// Layer files are CRC-checked per tensor, when a tensor is read: a damaged
// lp weight is reported (file, record) the moment anything uses it.
TEST(ConvertErrorsTest, DamagedLayerRecordIsCaughtWhenRead) {
  Case c = Prepare("damaged_layer_record", "neox-tp2-pp1-dp1");
  const std::string f = JoinPath(c.source, "layer_02-model_01-model_states.pt");
  // Flip one byte in the middle of the record behind 'attention.dense.weight'.
  ASSERT_TRUE(ucp::testing::FlipByteInTensor(f, [](const pickle::Value& root) {
                return root.DictGet("attention.dense.weight");
              }).ok());
  auto ckpt = deepspeed_zero::ZeroCheckpoint::Open(c.source);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const deepspeed_zero::ModuleEntry* entry = nullptr;
  for (const auto& e : (*ckpt)->module_entries()) {
    if (e.name == "2.attention.dense.weight") entry = &e;
  }
  ASSERT_NE(entry, nullptr);
  EXPECT_TRUE((*ckpt)->ModuleTensor(*entry, 0).ok());
  auto damaged = (*ckpt)->ModuleTensor(*entry, 1);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_EQ(damaged.status().message().rfind(f, 0), 0u) << damaged.status();
  EXPECT_NE(damaged.status().message().find("CRC-32 mismatch"), std::string::npos) << damaged.status();
}

// The model-states files' tensor records (the module's weights) are
// CRC-checked beside the units rather than when the file is opened: a
// damaged one still stops a convert (which copies the file byte for byte),
// its dry run, a reshard and an export, naming the file and the record, and
// nothing is written.
TEST(ConvertErrorsTest, DamagedModelStatesRecordStopsEveryCommand) {
  Case c = Prepare("damaged_model_states_record", "gpt-zero2-nopipe-tp2-dp2");
  const std::string f = JoinPath(c.source, "mp_rank_01_model_states.pt");
  ASSERT_TRUE(DamageModuleWeight(f, "sequential.2.attention.dense.weight").ok());
  auto expect_damage = [&](const absl::Status& s, const std::string& command) { ExpectDamage(s, f, command); };
  expect_damage(RunConvert(c), "convert");
  ConvertOptions dry;
  dry.input_folder = c.source;
  dry.output_folder = c.output;
  dry.dry_run_ranks = 2;
  expect_damage(Convert(dry).status(), "convert --dry_run");
  ReshardOptions r;
  r.input_folder = c.source;
  r.output_folder = JoinPath(c.root, "out/global_step4_tp1");
  r.write.num_threads = 2;
  expect_damage(Reshard(r).status(), "reshard to tp 1");
  ExportOptions e;
  e.input_folder = c.source;
  e.output_folder = JoinPath(c.root, "out/weights");
  expect_damage(Export(e).status(), "export");
  ExpectNothingWritten(c);
}

TEST(ConvertErrorsTest, ExistingOutputIsNotReplaced) {
  Case c = Prepare("existing_output", "neox-tp2-pp1-dp1");
  ASSERT_TRUE(MakeDirs(c.output).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(c.output, "keep"), "x").ok());
  absl::Status s = RunConvert(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(PathExists(JoinPath(c.output, "keep")));
}

// Saved at tp=1, nothing needs merging: convert keeps the params no rule
// decides whole (undecided); only a reshard that splits them over tp > 1
// refuses, asking for their kind, and writes nothing.
TEST(ConvertErrorsTest, UndecidedParamsOfATp1CheckpointStopOnlyASplit) {
  Case c = Prepare("ambiguous_tp1", "neox-tp1-pp2-dp1");
  EXPECT_TRUE(RunConvert(c, "none").ok());
  EXPECT_TRUE(PathExists(JoinPath(c.output, "ucp_manifest.textproto")));
  ReshardOptions o;
  o.input_folder = c.source;
  o.output_folder = JoinPath(c.root, "tp2/global_step4");
  o.write.target.tp = 2;
  o.zero_source.rules.preset = "none";
  absl::Status s = Reshard(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("the target splits params over tp > 1, but "), std::string::npos) << s;
  EXPECT_NE(s.message().find("have no known tp split: saved at tp=1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("FILL IN the kind"), std::string::npos) << s;
  EXPECT_FALSE(PathExists(JoinPath(c.root, "tp2")));
}

TEST(ConvertErrorsTest, AmbiguousParamsAreListedWithTheRuleThatSettlesThem) {
  Case c = Prepare("ambiguous", "neox-tp2-pp1-dp1");
  absl::Status s = RunConvert(c, "none");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // Every partitioned param is counted (34 weights + 2x8 column biases), and
  // each family (names but for the layer index) gets one suggestion, with
  // the kind the evidence gives: attention.dense is row-parallel (its slice
  // [64, 32] keeps hidden_size 64 whole on dim 0), query_key_value column.
  EXPECT_NE(s.message().find("cannot tell how to merge the tp slices of 50 param(s) in 8 families"), std::string::npos)
      << s;
  EXPECT_EQ(s.message().find("Saved at tp=1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("rule { pattern: \"\\\\d+\\\\.attention\\\\.dense\\\\.weight$\" kind: ROW }"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("rule { pattern: \"\\\\d+\\\\.attention\\\\.query_key_value\\\\.weight$\" kind: COLUMN }"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("8 params, e.g. 2.attention.dense.weight, tp slice [64, 32]: tp copies differ"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.message().find("kind: REPLICATED"), std::string::npos) << s;
  ExpectNothingWritten(c);
}


// The real DeepSpeed 0.19.5 MoE checkpoint: convert refuses it (no
// DeepSpeed universal loader places native experts), naming the version and
// the layout and pointing to `ucp reshard`, and writes nothing.
TEST(ConvertErrorsTest, RealMixtureOfExpertsIsRefusedByVersionAndLayout) {
  const std::string root = FreshTempDir("moe_0195");
  ConvertOptions o;
  o.input_folder = ucp::testing::VersionFixturePath("0.19.5", "gpt-moe-ep2-zero2-dp2/global_step4");
  o.output_folder = JoinPath(root, "u");
  absl::Status s = Convert(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("DeepSpeed 0.19.5 native mixture-of-experts checkpoint (ZeRO stage 2, ep=2)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("use `ucp reshard"), std::string::npos) << s;
  EXPECT_FALSE(PathExists(JoinPath(root, "u")));
}

// The real DeepSpeed 0.19.5 MoE checkpoint's mp_rank_00 (the non-expert
// weights) is checked beside the units as the dense model states are: one
// damaged byte of a weight stops a reshard and an export, naming the file
// and the record, and nothing is written.
TEST(ConvertErrorsTest, DamagedMixtureOfExpertsModelStatesRecordStopsReshardAndExport) {
  Case c;
  c.root = FreshTempDir("moe_damaged_model_states");
  c.source = JoinPath(c.root, "src/global_step4");
  c.output = JoinPath(c.root, "out/global_step4");
  const std::string& src = c.source;
  ASSERT_TRUE(CopyTree(ucp::testing::VersionFixturePath("0.19.5", "gpt-moe-ep2-zero2-dp2/global_step4"), src).ok());
  const std::string f = JoinPath(src, "mp_rank_00_model_states.pt");
  ASSERT_TRUE(DamageModuleWeight(f, "h.0.mlp_fc.weight").ok());
  auto expect_damage = [&](const absl::Status& s, const std::string& command) { ExpectDamage(s, f, command); };
  {
    // Under a command's checks the open reads only the file's pickle: the
    // record is owed, not read before the units.
    torch::OwedCrcChecks owed;
    auto opened = OpenModelState(src, SourceOptions());
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(owed.files(), 1u);
    expect_damage(owed.CheckAll(), "the owed checks");
  }
  EXPECT_EQ(OpenModelState(src, SourceOptions()).status().code(), absl::StatusCode::kDataLoss);
  ReshardOptions r;
  r.input_folder = src;
  r.output_folder = c.output;
  r.write.target = state::Topology{1, 1, 1};
  r.write.num_threads = 2;
  expect_damage(Reshard(r).status(), "reshard to dp 1");
  ExportOptions e;
  e.input_folder = src;
  e.output_folder = JoinPath(c.root, "out/weights");
  expect_damage(Export(e).status(), "export");
  ExpectNothingWritten(c);
}

// ZeRO-3 universal checkpoints for loaders that cannot read them are
// refused, naming the version: 0.16.4's stage-3 loader reads one param
// group (and DeepSpeed 0.16.4's own converter fails on this checkpoint);
// before 0.15.0 there is none. For 0.19.5 the same checkpoint converts.
TEST(ConvertErrorsTest, Zero3UniversalOnlyForLoadersThatReadIt) {
  const std::string root = FreshTempDir("zero3_versions");
  const std::string src = ucp::testing::VersionFixturePath("0.16.4", "gpt-zero3-dp2/global_step4");
  ConvertOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(root, "u0164");
  absl::Status s = Convert(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("DeepSpeed 0.16.4's ZeRO stage 3 universal loader reads one param group"),
            std::string::npos)
      << s;
  EXPECT_FALSE(PathExists(o.output_folder));
  o.write.target_ds_version = "0.14.4";
  o.output_folder = JoinPath(root, "u0144");
  s = Convert(o).status();
  EXPECT_NE(s.message().find("DeepSpeed 0.14.4 has no ZeRO stage 3 universal checkpoint loader"), std::string::npos)
      << s;
  EXPECT_FALSE(PathExists(o.output_folder));
  o.write.target_ds_version = "0.19.5";
  o.output_folder = JoinPath(root, "u0195");
  auto ok = Convert(o);
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(PathExists(JoinPath(o.output_folder, "zero/optimizer_state.pt")));
}

// DeepSpeed 0.15 to 0.17's stage-3 universal loader puts every param into
// sub-group 0 and load_state_dict()s rank 0's optimizer_state_dict: a source
// whose rank 0 has several sub-groups cannot load there (DeepSpeed 0.16.4 in
// the lab: "loaded state dict contains a parameter group that doesn't match
// the size of optimizer's group"). ucp refused only several param groups and
// wrote such a folder; now it refuses, and 0.18+ still converts it.
TEST(ConvertErrorsTest, Zero3SubGroupsNeedTheLoaderOf018) {
  const std::string root = FreshTempDir("zero3_subgroups_versions");
  // DeepSpeed 0.16.4's one-group ZeRO-3 (one sub-group) converts for 0.16.4 ...
  ConvertOptions o;
  o.input_folder = ucp::testing::VersionFixturePath("0.16.4", "gpt-zero3-onegroup-dp2/global_step4");
  o.output_folder = JoinPath(root, "one_sub_group");
  auto one = Convert(o);
  EXPECT_TRUE(one.ok()) << one.status();
  // ... but not once split into sub-groups of at most 5000 elements.
  ReshardOptions r;
  r.input_folder = o.input_folder;
  r.output_folder = JoinPath(root, "sub/global_step4");
  r.write.target = state::Topology{1, 1, 2};
  r.write.sub_group_size = 5000;
  auto resharded = Reshard(r);
  ASSERT_TRUE(resharded.ok()) << resharded.status();
  o.input_folder = r.output_folder;
  o.output_folder = JoinPath(root, "u0164");
  absl::Status s = Convert(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("DeepSpeed 0.16.4's ZeRO stage 3 universal loader reads one sub-group, and rank 0 of "
                             "this checkpoint has "),
            std::string::npos)
      << s;
  EXPECT_FALSE(PathExists(o.output_folder));
  o.write.target_ds_version = "0.18.0";
  o.output_folder = JoinPath(root, "u0180");
  auto ok = Convert(o);
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(PathExists(JoinPath(o.output_folder, "zero/optimizer_state.pt")));
}

// --to names a registered target of the universal family; anything else is
// refused with the names it takes, and nothing is written.
TEST(ConvertErrorsTest, UnknownTargetIsRefusedWithTheKnownOnes) {
  Case c = Prepare("unknown_to", "neox-tp2-pp1-dp1");
  ConvertOptions o;
  o.input_folder = c.source;
  o.output_folder = c.output;
  o.to = "safetensors";  // a target of `ucp export`, not of convert
  absl::Status s = Convert(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "--to=safetensors: expected one of universal, dcp");
  ExpectNothingWritten(c);
}

// --names=hf names DCP entries; a universal checkpoint keeps the
// checkpoint's names. And a model with no Hugging Face equivalent (RMSNorm
// NeoX) is refused with the reason, before anything is written.
TEST(ConvertErrorsTest, HfNamesOnlyForDcpAndOnlyForAFaithfulModel) {
  Case c = Prepare("names_hf", "neox-tp2-pp1-dp1");
  ConvertOptions o;
  o.input_folder = c.source;
  o.output_folder = c.output;
  o.names = "hf";
  absl::Status s = Convert(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("only with --to=dcp"), std::string::npos) << s;
  o.names = "huggingface";
  o.to = "dcp";
  s = Convert(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--names must be checkpoint or hf"), std::string::npos) << s;
  o.names = "hf";
  s = Convert(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("RMSNorm"), std::string::npos) << s;
  ExpectNothingWritten(c);
}

}  // namespace
}  // namespace ucp::ops
