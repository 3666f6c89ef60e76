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
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "gtest/gtest.h"
#include "format/safetensors/safetensors.h"
#include "ops/convert.h"
#include "ops/export.h"
#include "ops/open.h"
#include "tp/tensor_plan.h"
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

// `ucp convert --to=dcp --names=hf` of a Megatron-DeepSpeed Llama at tp 2:
// the DCP entries are LlamaForCausalLM's (q/k/v and gate/up split out of the
// fused params). Checked without ucp's name plan: every model entry equals
// `ucp export --names=hf`'s tensor of that name bitwise (which
// check_hf_llama.py above proves against the fused tensors), and every
// element of each optimizer state sits where its weight element does: the
// weights' values locate each element in the checkpoint's own params (values
// that occur more than once are skipped), whose exp_avg / exp_avg_sq there
// must equal the entry's. Read back by ucp's DCP reader (which
// interop/dcp:dcp_load_test checks against torch's own).
TEST(HfLlamaDcpTest, OptimizerStatesAreSplitAsTheWeights) {
  const std::string root = Generate("llama_megatron_pipe.json", "dcp_hf_llama", "");
  const std::string tmp = Dirname(root);
  auto convert = [&](const std::string& names, const std::string& out) {
    ops::ConvertOptions c;
    c.input_folder = root;
    c.output_folder = JoinPath(tmp, out);
    c.to = "dcp";
    c.names = names;
    c.state.rules.original_vocab_size = 40;
    c.write.fsync = false;
    return ops::Convert(c);
  };
  auto hf = convert("hf", "dcp_hf");
  ASSERT_TRUE(hf.ok()) << hf.status();
  auto own = convert("checkpoint", "dcp_own");
  ASSERT_TRUE(own.ok()) << own.status();
  ops::ExportOptions e;
  e.input_folder = root;
  e.output_folder = JoinPath(tmp, "dcp_hf_export");
  e.names = "hf";
  e.state.rules.original_vocab_size = 40;
  e.write.fsync = false;
  auto exported = ops::Export(e);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto st = safetensors::SafetensorsFile::Open(JoinPath(e.output_folder, "model.safetensors"));
  ASSERT_TRUE(st.ok()) << st.status();

  auto open = [](const std::string& dir) { return ops::OpenModelState(dir, ops::SourceOptions()); };
  auto h = open(JoinPath(tmp, "dcp_hf"));
  ASSERT_TRUE(h.ok()) << h.status();
  auto o = open(JoinPath(tmp, "dcp_own"));
  ASSERT_TRUE(o.ok()) << o.status();
  auto values = [](const std::unique_ptr<state::ModelState>& s, const state::ParamState& p,
                   const std::string& k) -> std::vector<uint32_t> {
    auto full = s->Full(p, k);
    if (!full.ok()) return {};
    auto t = full->Materialize();
    if (!t.ok()) return {};
    const std::string b = t->ContiguousBytes();
    std::vector<uint32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
  };
  // Where each weight value sits in the checkpoint's own params.
  std::map<uint32_t, std::pair<int, size_t>> where;
  std::set<uint32_t> repeated;
  const auto& own_params = (*o)->info().params;
  std::vector<std::map<std::string, std::vector<uint32_t>>> own_states(own_params.size());
  for (size_t i = 0; i < own_params.size(); ++i) {
    if (!own_params[i].trainable()) continue;
    for (const char* k : {"fp32", "exp_avg", "exp_avg_sq"}) own_states[i][k] = values(*o, own_params[i], k);
    const std::vector<uint32_t>& w = own_states[i]["fp32"];
    for (size_t j = 0; j < w.size(); ++j) {
      if (!where.emplace(w[j], std::make_pair(static_cast<int>(i), j)).second) repeated.insert(w[j]);
    }
  }
  int64_t checked = 0, skipped = 0;
  int tensors = 0;
  for (const state::ParamState& p : (*h)->info().params) {
    SCOPED_TRACE(p.name);
    auto full = (*h)->Full(p, "fp32");
    ASSERT_TRUE(full.ok()) << full.status();
    auto view = (*st)->GetTensor(p.name);
    ASSERT_TRUE(view.ok()) << view.status() << " (not in the export)";
    absl::StatusOr<bool> same = tp::TensorPlan::BitwiseEqual(*full, tp::TensorPlan::FromTensor(*view));
    EXPECT_TRUE(same.ok() && *same) << "model entry differs from the export's tensor";
    ++tensors;
    const std::vector<uint32_t> w = values(*h, p, "fp32");
    const std::vector<uint32_t> m = values(*h, p, "exp_avg"), v = values(*h, p, "exp_avg_sq");
    ASSERT_EQ(m.size(), w.size());
    ASSERT_EQ(v.size(), w.size());
    for (size_t j = 0; j < w.size(); ++j) {
      auto it = where.find(w[j]);
      if (it == where.end() || repeated.count(w[j])) {
        ++skipped;
        continue;
      }
      const auto& [param, pos] = it->second;
      ASSERT_EQ(m[j], own_states[param]["exp_avg"][pos]) << "element " << j;
      ASSERT_EQ(v[j], own_states[param]["exp_avg_sq"][pos]) << "element " << j;
      ++checked;
    }
  }
  EXPECT_EQ(tensors, static_cast<int>((*st)->tensors().size()));
  EXPECT_GT(checked, 20 * skipped) << checked << " elements checked, " << skipped << " skipped";
}

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
