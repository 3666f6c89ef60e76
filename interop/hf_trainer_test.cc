// A Hugging Face Trainer's checkpoint-N around a checkpoint written at test
// time by the independent Python writer (testdata/python/make_ds_checkpoint.py,
// interop/testdata/hf_llama_plain.json: a LlamaForCausalLM's names, ZeRO-2,
// dp=2), with the Trainer's files beside it (made with torch.save like the
// Trainer's: rng_state_<i>.pth, scheduler.pt, training_args.bin; JSON files):
//   - reshard given the folder writes a checkpoint-N: global_stepN + latest
//     and each Trainer file copied or rewritten for the new process count
//     (and back to dp=2: the writer's files, value for value);
//   - convert given the folder writes <tag>_universal + latest_universal with
//     the Trainer's files;
//   - export --names=hf keeps the names, writes the checkpoint's own
//     config.json byte for byte with generation_config.json, or builds it
//     from the shapes without one;
//   - a pickle naming a code-execution global among the Trainer's files is
//     refused.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/json/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/convert.h"
#include "ops/export.h"
#include "ops/reshard.h"
#include "testing/compare.h"
#include "testing/fixtures.h"

namespace ucp {
namespace {

using testing::FreshTempDir;
using testing::kPython;
using testing::RunCommand;
using testing::RunfilePath;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kConfig[] =
    "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n  \"model_type\": \"llama\",\n"
    "  \"hidden_size\": 16,\n  \"intermediate_size\": 24,\n  \"num_attention_heads\": 4,\n"
    "  \"num_key_value_heads\": 2,\n  \"num_hidden_layers\": 2,\n  \"vocab_size\": 32\n}\n";
constexpr char kGeneration[] = "{\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2\n}\n";

// ROOT/checkpoint-3: the writer's global_step3 + latest, and the Trainer's files.
std::string MakeTrainerFolder(const std::string& name, bool with_config, const std::string& unsafe_args = "") {
  const std::string dir = JoinPath(FreshTempDir(name), "checkpoint-3");
  auto gen = RunCommand(absl::StrCat(kPython, " ", RunfilePath("testdata/python/make_ds_checkpoint.py"), " ",
                                     RunfilePath("interop/testdata/hf_llama_plain.json"), " ", dir,
                                     " --tag global_step3"));
  EXPECT_TRUE(gen.ok()) << gen.status();
  // The writer's own bookkeeping files are not the Trainer's.
  for (const char* f : {"expected.pt", "expected_optimizer_state.pt", "rules.textproto", "expected_inspect.textproto",
                        "layout.json"}) {
    if (PathExists(JoinPath(dir, f))) {
      EXPECT_TRUE(RemoveTree(JoinPath(dir, f)).ok());
    }
  }
  const std::string py = absl::StrCat(
      "import os, random, sys, torch\n"
      "d = sys.argv[1]\n"
      "for i in range(2):\n"
      "  random.seed(i); torch.manual_seed(i)\n"
      "  torch.save({'python': random.getstate(), 'cpu': torch.get_rng_state()}, f'{d}/rng_state_{i}.pth')\n"
      "torch.save({'base_lrs': [0.001, 0.001], 'last_epoch': 3, '_step_count': 4}, f'{d}/scheduler.pt')\n",
      unsafe_args.empty() ? "torch.save({'num_processes': 2, 'output_dir': 'out'}, f'{d}/training_args.bin')\n"
                          : "torch.save({'x': os.system}, f'{d}/training_args.bin')\n",
      "open(f'{d}/trainer_state.json', 'w').write('{\"global_step\": 3, \"epoch\": 0.1875}\\n')\n");
  auto made = RunCommand(absl::StrCat(kPython, " -c \"", py, "\" ", dir));
  EXPECT_TRUE(made.ok()) << made.status();
  if (with_config) {
    EXPECT_TRUE(WriteFileAtomic(JoinPath(dir, "config.json"), kConfig).ok());
    EXPECT_TRUE(WriteFileAtomic(JoinPath(dir, "generation_config.json"), kGeneration).ok());
  }
  return dir;
}

std::string Read(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

std::vector<std::string> List(const std::string& dir) {
  auto l = ListDirectory(dir);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : std::vector<std::string>();
}

TEST(HfTrainerFolderTest, ReshardWritesACheckpointFolderForTheNewProcessCount) {
  const std::string src = MakeTrainerFolder("trainer_reshard", /*with_config=*/true);
  const std::string work = FreshTempDir("trainer_reshard_out");
  ops::ReshardOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(work, "dp1/checkpoint-3");
  o.write.target = {1, 1, 1};
  o.write.num_threads = 2;
  auto r = ops::Reshard(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->trainer_folder, o.output_folder);
  const std::string out = o.output_folder;
  EXPECT_EQ(Read(JoinPath(out, "latest")), "global_step3");
  EXPECT_THAT(List(JoinPath(out, "global_step3")), Contains("zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_THAT(List(JoinPath(out, "global_step3")), Not(Contains("zero_pp_rank_1_mp_rank_00_optim_states.pt")));
  // One process reads rng_state.pth: process 0's states.
  EXPECT_EQ(Read(JoinPath(out, "rng_state.pth")), Read(JoinPath(src, "rng_state_0.pth")));
  EXPECT_FALSE(PathExists(JoinPath(out, "rng_state_0.pth")));
  EXPECT_FALSE(PathExists(JoinPath(out, "rng_state_1.pth")));
  for (const char* f : {"trainer_state.json", "training_args.bin", "scheduler.pt", "config.json",
                        "generation_config.json"}) {
    EXPECT_EQ(Read(JoinPath(out, f)), Read(JoinPath(src, f))) << f;
  }
  std::string summary;
  for (const auto& l : r->trainer_files) absl::StrAppend(&summary, l, "\n");
  EXPECT_THAT(summary, HasSubstr("rng_state.pth: the source's rng_state_0.pth"));
  EXPECT_THAT(summary, HasSubstr("training_args.bin: copied as is, never unpickled"));
  EXPECT_THAT(summary, HasSubstr("trainer_state.json: copied"));

  // Three processes: 0 and 1 keep theirs, 2 has none.
  ops::ReshardOptions three = o;
  three.output_folder = JoinPath(work, "dp3/checkpoint-3");
  three.write.target = {1, 1, 3};
  auto r3 = ops::Reshard(three);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(Read(JoinPath(three.output_folder, "rng_state_1.pth")), Read(JoinPath(src, "rng_state_1.pth")));
  EXPECT_FALSE(PathExists(JoinPath(three.output_folder, "rng_state_2.pth")));
  EXPECT_FALSE(PathExists(JoinPath(three.output_folder, "rng_state.pth")));
  EXPECT_THAT(List(JoinPath(three.output_folder, "global_step3")),
              Contains("zero_pp_rank_2_mp_rank_00_optim_states.pt"));

  // Back to dp=2 from the dp=1 folder: the DeepSpeed files are the source's.
  ops::ReshardOptions back = o;
  back.input_folder = out;
  back.output_folder = JoinPath(work, "back/checkpoint-3");
  back.write.target = {1, 1, 2};
  auto rb = ops::Reshard(back);
  ASSERT_TRUE(rb.ok()) << rb.status();
  for (const char* f : {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                        "mp_rank_00_model_states.pt"}) {
    auto diffs = testing::CompareFiles(JoinPath(JoinPath(back.output_folder, "global_step3"), f),
                                       JoinPath(JoinPath(src, "global_step3"), f));
    ASSERT_TRUE(diffs.ok()) << diffs.status();
    EXPECT_THAT(*diffs, ::testing::IsEmpty()) << f;
  }
  EXPECT_EQ(Read(JoinPath(back.output_folder, "rng_state_0.pth")), Read(JoinPath(src, "rng_state_0.pth")));

  // The tag folder given: only the DeepSpeed checkpoint, as for any source.
  ops::ReshardOptions tag = o;
  tag.input_folder = JoinPath(src, "global_step3");
  tag.output_folder = JoinPath(work, "tag/global_step3");
  auto rt = ops::Reshard(tag);
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_TRUE(rt->trainer_folder.empty());
  EXPECT_FALSE(PathExists(JoinPath(work, "tag/trainer_state.json")));

  // The output may not be the source folder or lie inside it.
  ops::ReshardOptions inside = o;
  inside.output_folder = JoinPath(src, "new");
  EXPECT_FALSE(ops::Reshard(inside).ok());
}

TEST(HfTrainerFolderTest, ConvertWritesTheUniversalFolderBesideTheTrainerFiles) {
  const std::string src = MakeTrainerFolder("trainer_convert", /*with_config=*/true);
  ops::ConvertOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(FreshTempDir("trainer_convert_out"), "checkpoint-3");
  o.write.num_threads = 2;
  auto r = ops::Convert(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Read(JoinPath(o.output_folder, "latest_universal")), "global_step3_universal");
  EXPECT_TRUE(IsDirectory(JoinPath(o.output_folder, "global_step3_universal/zero/model.layers.0.self_attn.q_proj.weight")));
  EXPECT_THAT(r->summary, HasSubstr("preset: hf-llama (detected from param names)"));
  for (const char* f : {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json", "config.json"}) {
    EXPECT_EQ(Read(JoinPath(o.output_folder, f)), Read(JoinPath(src, f))) << f;
  }
  // A job of one process reads rng_state.pth: process 0's, as reshard --dp=1 gives it.
  EXPECT_EQ(Read(JoinPath(o.output_folder, "rng_state.pth")), Read(JoinPath(src, "rng_state_0.pth")));
  std::string files;
  for (const auto& l : r->trainer_files) absl::StrAppend(&files, l, "\n");
  EXPECT_THAT(files, HasSubstr("rng_state.pth: the source's rng_state_0.pth (process 0's RNG states"));
  EXPECT_THAT(files, HasSubstr("rng_state_1.pth: the source's rng_state_1.pth (as it is"));
  EXPECT_FALSE(PathExists(JoinPath(o.output_folder, "global_step3")));
}

TEST(HfTrainerFolderTest, ConvertOfAOneProcessRunGivesProcessZeroItsStatesAtAnyDp) {
  // A run of one process saved rng_state.pth; process 0 of a job of several
  // reads rng_state_0.pth.
  const std::string src = MakeTrainerFolder("trainer_convert_one", /*with_config=*/true);
  ASSERT_TRUE(CopyFile(JoinPath(src, "rng_state_0.pth"), JoinPath(src, "rng_state.pth")).ok());
  ASSERT_TRUE(RemoveTree(JoinPath(src, "rng_state_0.pth")).ok());
  ASSERT_TRUE(RemoveTree(JoinPath(src, "rng_state_1.pth")).ok());
  ops::ConvertOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(FreshTempDir("trainer_convert_one_out"), "checkpoint-3");
  o.write.num_threads = 2;
  auto r = ops::Convert(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Read(JoinPath(o.output_folder, "rng_state.pth")), Read(JoinPath(src, "rng_state.pth")));
  EXPECT_EQ(Read(JoinPath(o.output_folder, "rng_state_0.pth")), Read(JoinPath(src, "rng_state.pth")));
  EXPECT_FALSE(PathExists(JoinPath(o.output_folder, "rng_state_1.pth")));
}

TEST(HfTrainerFolderTest, ExportWithTheCheckpointsOwnConfig) {
  const std::string src = MakeTrainerFolder("trainer_export", /*with_config=*/true);
  const std::string work = FreshTempDir("trainer_export_out");
  ops::ExportOptions hf;
  hf.input_folder = src;
  hf.output_folder = JoinPath(work, "hf");
  hf.names = "hf";
  hf.write.max_shard_size = 4000;  // several shards and the index
  auto r = ops::Export(hf);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->architecture, "LlamaForCausalLM");
  EXPECT_EQ(Read(JoinPath(hf.output_folder, "config.json")), kConfig);
  EXPECT_EQ(Read(JoinPath(hf.output_folder, "generation_config.json")), kGeneration);
  const std::string index = Read(JoinPath(hf.output_folder, "model.safetensors.index.json"));
  EXPECT_THAT(index, HasSubstr("\"model.layers.1.self_attn.k_proj.weight\""));
  EXPECT_THAT(index, HasSubstr("\"lm_head.weight\""));
  // The same tensors as --names=checkpoint, whose names are Hugging Face's already.
  ops::ExportOptions plain = hf;
  plain.output_folder = JoinPath(work, "plain");
  plain.names = "checkpoint";
  ASSERT_TRUE(ops::Export(plain).ok());
  // Every tensor's dtype, shape and bytes, read from the safetensors files
  // (8-byte header length, JSON header, data) with the standard library.
  auto same = RunCommand(absl::StrCat(
      kPython, " -c \"import glob, json, struct, sys\n"
               "def sd(d):\n  out = {}\n  for f in sorted(glob.glob(d + '/*.safetensors')):\n"
               "    b = open(f, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])\n"
               "    for k, v in h.items():\n      if k == '__metadata__': continue\n"
               "      s, e = v['data_offsets']; out[k] = (v['dtype'], v['shape'], b[8 + n + s:8 + n + e])\n"
               "  return out\n"
               "a, b = sd(sys.argv[1]), sd(sys.argv[2])\nassert sorted(a) == sorted(b), sorted(set(a) ^ set(b))\n"
               "assert all(a[k] == b[k] for k in a)\nassert len(a) == 21, len(a)\nprint(len(a))\" ",
      hf.output_folder, " ", plain.output_folder));
  EXPECT_TRUE(same.ok()) << same.status();
}

TEST(HfTrainerFolderTest, ExportWithoutAConfigBuildsOneFromTheShapes) {
  const std::string src = MakeTrainerFolder("trainer_export_noconfig", /*with_config=*/false);
  ops::ExportOptions hf;
  hf.input_folder = src;
  hf.output_folder = JoinPath(FreshTempDir("trainer_export_noconfig_out"), "hf");
  hf.names = "hf";
  auto refused = ops::Export(hf);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("--hf_config=num_attention_heads=VALUE"));
  hf.hf.config = {{"num_attention_heads", "4"}};
  auto r = ops::Export(hf);
  ASSERT_TRUE(r.ok()) << r.status();
  auto config = json::Parse(Read(JoinPath(hf.output_folder, "config.json")));
  ASSERT_TRUE(config.ok()) << config.status();
  auto get = [&](const char* k) { return config->Get(k) ? json::DumpCompact(*config->Get(k)) : "absent"; };
  EXPECT_EQ(get("architectures"), "[\"LlamaForCausalLM\"]");
  EXPECT_EQ(get("vocab_size"), "32");
  EXPECT_EQ(get("hidden_size"), "16");
  EXPECT_EQ(get("intermediate_size"), "24");
  EXPECT_EQ(get("num_hidden_layers"), "2");
  EXPECT_EQ(get("num_attention_heads"), "4");
  EXPECT_EQ(get("head_dim"), "4");
  EXPECT_EQ(get("num_key_value_heads"), "2");
  EXPECT_EQ(get("tie_word_embeddings"), "false");
  EXPECT_EQ(get("torch_dtype"), "\"float32\"");
}

TEST(HfTrainerFolderTest, APickleNamingACodeExecutionGlobalIsRefused) {
  const std::string src = MakeTrainerFolder("trainer_unsafe", /*with_config=*/false, "unsafe");
  ops::ReshardOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(FreshTempDir("trainer_unsafe_out"), "checkpoint-3");
  o.write.target = {1, 1, 1};
  auto r = ops::Reshard(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("training_args.bin"));
  EXPECT_FALSE(PathExists(o.output_folder));
  o.zero_source.allow_unsafe_pickles = true;
  EXPECT_TRUE(ops::Reshard(o).ok());
}

}  // namespace
}  // namespace ucp
