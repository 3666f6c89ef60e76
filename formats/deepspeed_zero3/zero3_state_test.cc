// Zero3State on the real DeepSpeed 0.19.5 / 0.16.4 ZeRO-3 fixtures.
#include "formats/deepspeed_zero3/zero3_state.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/damage.h"
#include "testing/fixtures.h"
#include "format/torch/torch_file.h"
#include "format/torch/tree_copy.h"

namespace ucp::deepspeed_zero3 {
namespace {

using ucp::testing::FreshTempDir;
using ucp::testing::RunCommand;
using ucp::testing::VersionFixturePath;

// The sub-group sizes (params per sub-group) of a ZeRO-3 folder's param_shapes.
std::vector<int> FileSubGroups(const std::string& dir) {
  auto f = torch::TorchFile::Open(JoinPath(dir, "zero_pp_rank_0_mp_rank_00_model_states.pt"));
  EXPECT_TRUE(f.ok()) << f.status();
  std::vector<int> out;
  for (const auto& g : (*f)->root()->DictGet("param_shapes")->items()) {
    out.push_back(static_cast<int>(g->dict_items().size()));
  }
  return out;
}

TEST(Zero3StateTest, ReadsTheSubGroupsFixture) {
  const std::string dir = VersionFixturePath("0.19.5", "gpt-zero3-subgroups-dp2/global_step4");
  auto s = Zero3State::Open(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  const state::ModelInfo& info = (*s)->info();
  EXPECT_EQ(info.source_topology.dp, 2);
  EXPECT_EQ(info.zero_stage, 3);
  EXPECT_EQ(info.num_groups, 2);
  EXPECT_EQ(info.params.size(), 53u);
  EXPECT_EQ((*s)->num_sub_groups(), 20);
  EXPECT_EQ((*s)->sub_group_size(), 1000);
  EXPECT_EQ(info.state_keys, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(info.scalar_keys, (std::vector<std::string>{"step"}));
  // Every param's full fp32 master: one slice of its param_shapes shape.
  const state::ParamState* wte = info.Find("wte.weight");
  ASSERT_NE(wte, nullptr);
  auto slices = (*s)->Slices(*wte, 0, "fp32");
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 1u);
  EXPECT_EQ((*slices)[0].shape(), (std::vector<int64_t>{96, 64}));
  // ZeRO-3 saves no module weights.
  auto lp = (*s)->Slices(*wte, 0, "lp");
  EXPECT_FALSE(lp.ok());
  EXPECT_TRUE(absl::StrContains(lp.status().message(), "empty")) << lp.status();
}

// DeepSpeed's sub-groups: the same cut at dp2 (20) and dp1 (22) as the files.
// The training's make_vocab_size_divisible_by (Megatron's args) is recorded
// as the ZeRO-1/2 reader records it: a convert's manifest and a later reshard
// to tp > 1 need it. The fixture saved no args: a copy gets them.
TEST(Zero3StateTest, RecordsTheArgsVocabularyPadding) {
  const std::string src = VersionFixturePath("0.19.5", "gpt-zero3-dp2/global_step4");
  const std::string dir = JoinPath(FreshTempDir("z3_args"), "global_step4");
  ASSERT_TRUE(CopyTree(src, dir).ok());
  {
    auto plain = Zero3State::Open(dir);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_EQ((*plain)->info().make_vocab_size_divisible_by, 0);
  }
  const std::string path = JoinPath(dir, "zero_pp_rank_0_mp_rank_00_model_states.pt");
  {
    auto f = torch::TorchFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    torch::TorchWriter w;
    auto root = torch::CopyTreeForWrite(f->get(), (*f)->root(), w);
    ASSERT_TRUE(root.ok()) << root.status();
    pickle::ValuePtr args = pickle::Value::MakeDict();
    args->DictSet(pickle::Value::Str("make_vocab_size_divisible_by"), pickle::Value::Int(8));
    (*root)->DictSet(pickle::Value::Str("args"), args);
    const std::string tmp = path + ".new";
    ASSERT_TRUE(w.WriteFile(tmp, **root).ok());
    f->reset();
    ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
  }
  auto s = Zero3State::Open(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->info().make_vocab_size_divisible_by, 8);
}

TEST(Zero3StateTest, SubGroupsAsDeepSpeedCutsThem) {
  const std::string fx = "gpt-zero3-subgroups-dp2";
  for (const auto& [folder, dp] : std::vector<std::pair<std::string, int>>{
           {"global_step4", 2}, {"resaved-dp1-stepfix/global_step4", 1}}) {
    const std::string dir = VersionFixturePath("0.19.5", JoinPath(fx, folder));
    auto s = Zero3State::Open(dir);
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<int> ours;
    for (int g = 0; g < (*s)->info().num_groups; ++g) {
      std::vector<int64_t> numels;
      for (const auto& p : (*s)->info().params) {
        if (p.group != g) continue;
        int64_t n = 1;
        for (int64_t d : p.tp_shapes[0]) n *= d;
        numels.push_back(n);
      }
      for (int c : Zero3SubGroups(numels, dp, 1000)) ours.push_back(c);
    }
    EXPECT_EQ(ours, FileSubGroups(dir)) << folder;
  }
  EXPECT_EQ(Zero3SubGroups({10, 10}, 1, 1000000000), (std::vector<int>{2}));
  EXPECT_EQ(Zero3SubGroups({5, 5, 5}, 2, 3), (std::vector<int>{1, 1, 1}));  // ceil(5/2) = 3 each
  EXPECT_EQ(Zero3PartitionNumel(5, 2), 3);
}

TEST(Zero3StateTest, Bf16AndOneGroup) {
  auto bf16 = Zero3State::Open(VersionFixturePath("0.19.5", "gpt-zero3-bf16-dp2/global_step4"));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->info().lp_dtype, torch::DType::kBFloat16);
  EXPECT_TRUE((*bf16)->info().bf16_file_prefix);
  auto one = Zero3State::Open(VersionFixturePath("0.16.4", "gpt-zero3-onegroup-dp2/global_step4"));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->info().num_groups, 1);
  EXPECT_EQ((*one)->ds_version(), "0.16.4");
}

TEST(Zero3StateTest, IsZero3Folder) {
  EXPECT_TRUE(IsZero3Folder(VersionFixturePath("0.19.5", "gpt-zero3-dp2")));  // via latest
  EXPECT_TRUE(IsZero3Folder(VersionFixturePath("0.19.5", "gpt-zero3-dp2/global_step4")));
  EXPECT_FALSE(IsZero3Folder(VersionFixturePath("0.19.5", "gpt-zero1-padding-dp2/global_step4")));
}

// A bf16 job with every optimizer file gone: the missing file is named as
// DeepSpeed names it (bf16_ from the job's ds_config), not zero_pp_rank_*.
TEST(Zero3StateTest, MissingBf16OptimizerFilesAreNamedAsDeepSpeedNamesThem) {
  const std::string root = FreshTempDir("zero3_bf16_missing");
  const std::string src = VersionFixturePath("0.19.5", "gpt-zero3-bf16-dp2/global_step4");
  const std::string copy = JoinPath(root, "global_step4");
  ASSERT_TRUE(RunCommand(absl::StrCat("cp -rL '", src, "' '", copy, "' && chmod -R u+w '", copy, "'")).ok());
  ASSERT_TRUE(RunCommand(absl::StrCat("rm '", copy, "'/bf16_zero_pp_rank_*_optim_states.pt")).ok());
  auto s = Zero3State::Open(copy);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), "/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt: missing"))
      << s.status();
}

// Damaged folders: a missing optimizer file, and a flat group of the wrong size.
TEST(Zero3StateTest, ClearErrors) {
  const std::string root = FreshTempDir("zero3_errors");
  const std::string src = VersionFixturePath("0.19.5", "gpt-zero3-dp2/global_step4");
  const std::string copy = JoinPath(root, "global_step4");
  ASSERT_TRUE(RunCommand(absl::StrCat("cp -rL '", src, "' '", copy, "' && chmod -R u+w '", copy, "'")).ok());
  ASSERT_TRUE(RunCommand(absl::StrCat("rm '", copy, "/zero_pp_rank_1_mp_rank_00_optim_states.pt'")).ok());
  auto s = Zero3State::Open(copy);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "zero_pp_rank_1_mp_rank_00_optim_states.pt: missing"))
      << s.status();
  // Rank 1's optimizer file in the place of rank 0's model states' partner
  // with another dp: its partition_count says 2, the model states say 1.
  ASSERT_TRUE(RunCommand(absl::StrCat("rm '", copy, "/zero_pp_rank_1_mp_rank_00_model_states.pt'")).ok());
  const std::string one = VersionFixturePath("0.19.5", "gpt-zero3-dp2/resaved-dp1-stepfix/global_step4");
  ASSERT_TRUE(RunCommand(absl::StrCat("cp -L '", one, "/zero_pp_rank_0_mp_rank_00_model_states.pt' '", copy,
                                      "/' && chmod u+w '", copy, "'/*"))
                  .ok());
  auto t = Zero3State::Open(copy);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "partition_count is 2, expected 1")) << t.status();
}

// An optimizer file with no param group (nothing to read group 0's state
// names from) is refused, naming the file.
TEST(Zero3StateTest, OptimizerWithoutParamGroupsIsRefused) {
  const std::string dir = JoinPath(FreshTempDir("zero3_no_groups"), "global_step4");
  ASSERT_TRUE(CopyTree(VersionFixturePath("0.19.5", "gpt-zero3-dp2/global_step4"), dir).ok());
  const std::string optim0 = JoinPath(dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  auto out = RunCommand(absl::StrCat(ucp::testing::kPython, " ",
                                     ucp::testing::RunfilePath("testdata/python/mutate_checkpoint.py"), " ", optim0,
                                     " clear optimizer_state_dict.optimizer_state_dict.param_groups"));
  ASSERT_TRUE(out.ok()) << out.status();
  auto s = Zero3State::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_EQ(s.status().message(),
            absl::StrCat(optim0, ": optimizer_state_dict.optimizer_state_dict.param_groups is empty, expected at "
                                 "least one param group (DeepSpeed's optimizer holds every trainable param)"));
}

// The optimizer files' flat partitions are CRC-checked when read, not at
// open (a command checks only the records it uses, e.g. export the fp32
// masters alone): a byte flipped in rank 1's exp_avg of sub-group 0 leaves
// every fp32 master readable, and is reported, naming the file, by a read of
// that exp_avg and by VerifyInput.
TEST(Zero3StateTest, DamagedPartitionIsCaughtWhenRead) {
  const std::string dir = JoinPath(FreshTempDir("zero3_damaged_partition"), "global_step4");
  ASSERT_TRUE(CopyTree(VersionFixturePath("0.19.5", "gpt-zero3-dp2/global_step4"), dir).ok());
  const std::string f = JoinPath(dir, "zero_pp_rank_1_mp_rank_00_optim_states.pt");
  ASSERT_TRUE(ucp::testing::FlipByteInTensor(f, [](const pickle::Value& root) -> const pickle::Value* {
                const pickle::Value* st = root.DictGet("optimizer_state_dict")->DictGet("optimizer_state_dict")
                                              ->DictGet("state")->DictGet(pickle::Value::Int(0));
                return st == nullptr ? nullptr : st->DictGet("exp_avg");
              }).ok());
  auto s = Zero3State::Open(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  int fp32 = 0, damaged = 0;
  for (const auto& p : (*s)->info().params) {
    if (!p.trainable() || !p.alias_of.empty()) continue;
    auto master = (*s)->Slices(p, 0, state::kFp32State);
    EXPECT_TRUE(master.ok()) << p.name << ": " << master.status();
    fp32 += master.ok() ? 1 : 0;
    auto exp_avg = (*s)->Slices(p, 0, "exp_avg");
    if (!exp_avg.ok()) {
      ++damaged;
      EXPECT_EQ(exp_avg.status().code(), absl::StatusCode::kDataLoss) << exp_avg.status();
      EXPECT_THAT(std::string(exp_avg.status().message()), ::testing::HasSubstr(f));
    }
  }
  EXPECT_GT(fp32, 0);
  EXPECT_GT(damaged, 0);
  const absl::Status v = (*s)->VerifyInput(f);
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss) << v;
  EXPECT_TRUE((*s)->VerifyInput(JoinPath(dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt")).ok());
}

}  // namespace
}  // namespace ucp::deepspeed_zero3
