// `ucp export` against checkpoints written at test time by the independent
// Python writer (testdata/python/make_ds_checkpoint.py), checked by
//   - DeepSpeed's own zero_to_fp32.py, the copies the 0.19.5 and 0.16.4
//     fixtures ship, run by testdata/python/run_zero_to_fp32.py: ucp's
//     torch-format export equals its output tensor for tensor, bitwise, names,
//     dtypes, key order per shard, tied aliases sharing a storage, shard files
//     and index json byte for byte; and its safetensors output (on a model
//     without tied weights, which its safetensors path cannot write) byte for
//     byte;
//   - for --names=hf (LlamaForCausalLM from Megatron-DeepSpeed), rebuilding
//     the fused query_key_value and swiglu dense_h_to_4h from the split
//     Hugging Face tensors with Megatron-DeepSpeed's layout gives the writer's
//     originals bitwise (testdata/python/check_hf_llama.py), config.json from
//     the args.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "gtest/gtest.h"
#include "ops/export.h"
#include "testing/fixtures.h"

namespace ucp {
namespace {

using testing::FixturePath;
using testing::FreshTempDir;
using testing::kPython;
using testing::RunCommand;
using testing::RunfilePath;

std::string Script(const std::string& name) { return RunfilePath("testdata/python/" + name); }
std::string Spec(const std::string& name) { return RunfilePath("interop/testdata/" + name); }

std::string Generate(const std::string& spec, const std::string& name, const std::string& extra = "") {
  const std::string root = JoinPath(FreshTempDir(name), "ckpt");
  auto r = RunCommand(absl::StrCat(kPython, " ", Script("make_ds_checkpoint.py"), " ", Spec(spec), " ", root, " ",
                                   extra));
  EXPECT_TRUE(r.ok()) << r.status();
  return root;
}

absl::StatusOr<ops::ExportResult> RunExport(const std::string& in, const std::string& out,
                                            const std::string& format, int64_t shard,
                                            const std::string& names = "checkpoint") {
  ops::ExportOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.format = format;
  o.write.max_shard_size = shard;
  o.names = names;
  return ops::Export(o);
}

void ExpectSameFiles(const std::string& a, const std::string& b) {
  auto la = ListDirectory(a);
  auto lb = ListDirectory(b);
  ASSERT_TRUE(la.ok() && lb.ok());
  // ucp's output marker (what --overwrite recognizes) is not content.
  la->erase(std::remove(la->begin(), la->end(), std::string(kUcpOutputMarker)), la->end());
  EXPECT_EQ(*la, *lb);
  for (const std::string& f : *la) {
    auto x = ReadFileToString(JoinPath(a, f));
    auto y = ReadFileToString(JoinPath(b, f));
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_TRUE(*x == *y) << f << " differs from zero_to_fp32.py's";
  }
}

class ZeroToFp32Test : public ::testing::TestWithParam<std::string> {};

TEST_P(ZeroToFp32Test, TorchExportEqualsZeroToFp32) {
  const std::string script = FixturePath(GetParam());
  const std::string root = Generate("plain_tied_zero2.json", "z2f_torch");
  const std::string dir = Dirname(root);
  const std::string ref = JoinPath(dir, "zero_to_fp32"), ref_sd = JoinPath(dir, "zero_to_fp32.pt");
  // 1KB shards: the 2240-byte embedding gets a shard of its own, the tied
  // lm_head.weight follows it.
  auto z = RunCommand(absl::StrCat(kPython, " ", Script("run_zero_to_fp32.py"), " ", script, " ", root, " ", ref,
                                   " --max_shard_size 1KB --state_dict ", ref_sd));
  ASSERT_TRUE(z.ok()) << z.status();
  const std::string out = JoinPath(dir, "ucp");
  auto r = RunExport(root, out, "torch", 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  auto check = RunCommand(absl::StrCat(kPython, " ", Script("check_export.py"), " ", out, " torch pt:", ref_sd,
                                       " --ordered --tied lm_head.weight=embed.weight"));
  EXPECT_TRUE(check.ok()) << check.status();
  // The index byte for byte, and each shard's tensors, keys in order, against
  // zero_to_fp32's own shard files.
  auto ia = ReadFileToString(JoinPath(out, "pytorch_model.bin.index.json"));
  auto ib = ReadFileToString(JoinPath(ref, "pytorch_model.bin.index.json"));
  ASSERT_TRUE(ia.ok() && ib.ok());
  EXPECT_EQ(*ia, *ib);
  auto shards = RunCommand(absl::StrCat(
      kPython, " -c \"import sys, torch\nfor f in sorted(__import__('os').listdir(sys.argv[1])):\n"
               "  if not f.endswith('.bin'): continue\n"
               "  a = torch.load(sys.argv[1] + '/' + f, weights_only=True); b = torch.load(sys.argv[2] + '/' + f)\n"
               "  assert list(a) == list(b), (f, list(a), list(b))\n"
               "  assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a), f\n"
               "print('ok')\" ",
      out, " ", ref));
  EXPECT_TRUE(shards.ok()) << shards.status();
}

TEST_P(ZeroToFp32Test, SafetensorsExportIsZeroToFp32sBytes) {
  const std::string script = FixturePath(GetParam());
  // Without the tie (zero_to_fp32 --safe_serialization cannot write tied
  // weights): the same model minus lm_head.weight.
  const std::string root =
      Generate("plain_tied_zero2.json", "z2f_st",
               "--set 'module=" +
                   std::string("[{\"name\":\"embed.weight\",\"shape\":[50,10],\"split\":\"vocab\",\"group\":0},"
                               "{\"name\":\"norm.weight\",\"shape\":[10],\"group\":1},"
                               "{\"name\":\"inv_freq\",\"shape\":[5],\"buffer\":true},"
                               "{\"name\":\"qkv.weight\",\"shape\":[30,10],\"group\":0},"
                               "{\"name\":\"frozen.weight\",\"shape\":[6,10],\"frozen\":true},"
                               "{\"name\":\"out.bias\",\"shape\":[10],\"group\":1}]'"));
  const std::string dir = Dirname(root);
  const std::string ref = JoinPath(dir, "zero_to_fp32");
  auto z = RunCommand(absl::StrCat(kPython, " ", Script("run_zero_to_fp32.py"), " ", script, " ", root, " ", ref,
                                   " --safe --max_shard_size 1KB"));
  ASSERT_TRUE(z.ok()) << z.status();
  const std::string out = JoinPath(dir, "ucp");
  ASSERT_TRUE(RunExport(root, out, "safetensors", 1000).ok());
  ExpectSameFiles(out, ref);
}

INSTANTIATE_TEST_SUITE_P(Versions, ZeroToFp32Test,
                         ::testing::Values("../deepspeed-0.19.5/gpt-zero3-dp2/zero_to_fp32.py",
                                           "../deepspeed-0.16.4/gpt-zero3-dp2/zero_to_fp32.py"));

// ZeRO-3 (the real 0.19.5 / 0.16.4 fixtures: sub-groups, bf16, one or two
// param groups): ucp's torch export equals the state dict DeepSpeed's own
// zero_to_fp32.py (the copy each fixture ships) rebuilds, names in its order,
// every tensor bitwise.
class Zero3ZeroToFp32Test : public ::testing::TestWithParam<std::string> {};

TEST_P(Zero3ZeroToFp32Test, TorchExportEqualsZeroToFp32) {
  const std::string fixture = FixturePath(GetParam());
  const std::string dir = FreshTempDir("z3f_" + Basename(GetParam()));
  const std::string ref = JoinPath(dir, "zero_to_fp32"), ref_sd = JoinPath(dir, "zero_to_fp32.pt");
  auto z = RunCommand(absl::StrCat(kPython, " ", Script("run_zero_to_fp32.py"), " ", JoinPath(fixture, "zero_to_fp32.py"),
                                   " ", fixture, " ", ref, " --state_dict ", ref_sd));
  ASSERT_TRUE(z.ok()) << z.status();
  const std::string out = JoinPath(dir, "ucp");
  auto r = RunExport(JoinPath(fixture, "global_step4"), out, "torch", 5'000'000'000);
  ASSERT_TRUE(r.ok()) << r.status();
  auto check = RunCommand(absl::StrCat(kPython, " ", Script("check_export.py"), " ", out, " torch pt:", ref_sd,
                                       " --ordered"));
  EXPECT_TRUE(check.ok()) << check.status();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Zero3ZeroToFp32Test,
                         ::testing::Values("../deepspeed-0.19.5/gpt-zero3-dp2", "../deepspeed-0.19.5/gpt-zero3-subgroups-dp2",
                                           "../deepspeed-0.19.5/gpt-zero3-bf16-dp2", "../deepspeed-0.16.4/gpt-zero3-dp2",
                                           "../deepspeed-0.16.4/gpt-zero3-onegroup-dp2"));

struct HfCase {
  std::string name;
  std::string extra;   // make_ds_checkpoint.py flags
  std::string layout;  // what the fused rows are
  int tp;
};

class HfLlamaTest : public ::testing::TestWithParam<HfCase> {};

TEST_P(HfLlamaTest, SplitTensorsRebuildTheFusedOnesBitwise) {
  const HfCase& c = GetParam();
  const std::string root = Generate("llama_megatron_pipe.json", "hf_" + c.name, c.extra);
  const std::string out = JoinPath(Dirname(root), "hf");
  ops::ExportOptions o;
  o.input_folder = root;
  o.output_folder = out;
  o.names = "hf";
  o.state.rules.original_vocab_size = 40;
  auto r = ops::Export(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->architecture, "LlamaForCausalLM");
  auto check = RunCommand(absl::StrCat(kPython, " ", Script("check_hf_llama.py"), " ", out, " ", root, " ",
                                       Spec("llama_megatron_pipe.json"), " ", c.layout, " ", c.tp));
  EXPECT_TRUE(check.ok()) << check.status();
  // The other layout's reading must not pass (the check can fail).
  if (c.tp == 1) {
    auto wrong = RunCommand(absl::StrCat(kPython, " ", Script("check_hf_llama.py"), " ", out, " ", root, " ",
                                         Spec("llama_megatron_pipe.json"), " ",
                                         c.layout == "grouped" ? "block" : "grouped", " ", c.tp));
    EXPECT_FALSE(wrong.ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HfLlamaTest,
    ::testing::Values(HfCase{"grouped_tp2", "", "grouped", 2}, HfCase{"grouped_tp1", "--tp 1", "grouped", 1},
                      HfCase{"block_tp1", "--tp 1 --set args.ds_sequence_parallel_fpdt=false", "block", 1}),
    [](const ::testing::TestParamInfo<HfCase>& i) { return i.param.name; });

TEST(HfLlamaRefusalTest, LayerNormModelIsNotLlama) {
  const std::string root = Generate("llama_megatron_pipe.json", "hf_refuse", "--set args.normalization=\\\"layernorm\\\"");
  ops::ExportOptions o;
  o.input_folder = root;
  o.output_folder = JoinPath(Dirname(root), "hf");
  o.names = "hf";
  auto r = ops::Export(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rmsnorm"), std::string::npos) << r.status();
  EXPECT_FALSE(PathExists(o.output_folder));
}

}  // namespace
}  // namespace ucp
