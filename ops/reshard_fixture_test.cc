// Acceptance tests of `ucp reshard` against what DeepSpeed 0.14.4 itself saved
// after loading the correct universal checkpoint at a new topology
// (the fixtures' resaved-* folders).
#include <cstdio>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/fs.h"
#include "ops/convert.h"
#include "testing/compare.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "format/torch/torch_file.h"
#include "format/torch/tree_copy.h"
#include "format/torch/torch_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/reshard.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"

namespace ucp::ops {
namespace {

using ::testing::IsEmpty;
using ucp::testing::FixturePath;
using ucp::testing::VersionFixturePath;
using ucp::testing::FreshTempDir;

// What differs between two checkpoints of the same model state at the same
// topology written by different jobs: the loading job's config and random
// states, which ucp carries over from the source instead. The client's 'args'
// are compared: GPT-NeoX records its model_parallel_size and pipe_parallel_size
// there and refuses a checkpoint whose values are not its job's
// (deepspeed/client_args.h).
const std::vector<std::string> kJobState = {"ds_config", "random_rng_state", "np_rng_state", "torch_rng_state",
                                            "rng_tracker_states"};

// DeepSpeed's Adam state dicts list `step` first when saved by a training run
// (ucp writes that order) and last when resaved right after a universal load
// (the resaved-* fixtures): both load the same.
bool IsAdamStateOrder(const std::string& diff) {
  return absl::StrContains(diff, "base_optimizer_state.state.") && absl::EndsWith(diff, "keys in a different order");
}

absl::StatusOr<ReshardResult> DoReshard(const std::string& in, const std::string& out, state::Topology t) {
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.target = t;
  o.write.num_threads = 2;
  return Reshard(o);
}

// Compares two ZeRO checkpoint folders file by file; in model-state and
// optimizer files the job state above is skipped.
std::vector<std::string> CompareCheckpoints(const std::string& ours, const std::string& theirs) {
  std::vector<std::string> diffs;
  auto fa = testing::ListFilesRecursive(ours);
  auto fb = testing::ListFilesRecursive(theirs);
  if (!fa.ok() || !fb.ok()) return {"cannot list"};
  if (*fa != *fb) {
    diffs.push_back(absl::StrCat("files differ: [", absl::StrJoin(*fa, ", "), "] vs [", absl::StrJoin(*fb, ", "), "]"));
    return diffs;
  }
  for (const auto& f : *fa) {
    auto a = torch::TorchFile::Open(JoinPath(ours, f));
    auto b = torch::TorchFile::Open(JoinPath(theirs, f));
    if (!a.ok() || !b.ok()) {
      diffs.push_back(absl::StrCat(f, ": cannot open"));
      continue;
    }
    const pickle::Value& ra = *(*a)->root();
    const pickle::Value& rb = *(*b)->root();
    // Keys in the same order.
    std::vector<std::string> ka, kb;
    for (const auto& [k, v] : ra.dict_items()) ka.push_back(k->DebugString());
    for (const auto& [k, v] : rb.dict_items()) kb.push_back(k->DebugString());
    if (ka != kb) diffs.push_back(absl::StrCat(f, ": keys [", absl::StrJoin(ka, ", "), "] vs [", absl::StrJoin(kb, ", "), "]"));
    for (const auto& [k, v] : ra.dict_items()) {
      const std::string key = k->is(pickle::Kind::kStr) ? k->str() : "";
      if (std::find(kJobState.begin(), kJobState.end(), key) != kJobState.end()) continue;
      const pickle::Value* w = rb.DictGet(k);
      if (w == nullptr) continue;
      for (const auto& d : testing::CompareTrees(**a, *v, **b, *w)) {
        if (!IsAdamStateOrder(d)) diffs.push_back(absl::StrCat(f, ": ", key, ".", d));
      }
    }
  }
  return diffs;
}

class ReshardFixtureTest : public ::testing::TestWithParam<std::tuple<std::string, state::Topology>> {};

TEST_P(ReshardFixtureTest, MatchesWhatDeepSpeedSaved) {
  const auto& [fixture, t] = GetParam();
  const std::string name = absl::StrCat("tp", t.tp, "-pp", t.pp, "-dp", t.dp);
  const std::string root = FreshTempDir(absl::StrCat("reshard_", fixture, "_", name));
  auto result = DoReshard(FixturePath(fixture + "/global_step4"), JoinPath(root, "global_step4"), t);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<std::string> diffs =
      CompareCheckpoints(JoinPath(root, "global_step4"), FixturePath(fixture + "/resaved-" + name + "/global_step4"));
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
  auto latest = ReadFileToString(JoinPath(root, "latest"));
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, "global_step4");
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ReshardFixtureTest,
    ::testing::Values(std::make_tuple("neox-tp2-pp1-dp1", state::Topology{1, 1, 1}),
                      std::make_tuple("neox-tp2-pp1-dp1", state::Topology{1, 1, 2}),
                      std::make_tuple("neox-tp2-pp1-dp1", state::Topology{2, 1, 2}),
                      std::make_tuple("neox-tp2-pp1-dp1", state::Topology{1, 2, 1}),
                      std::make_tuple("neox-bf16-tp2-pp1-dp2", state::Topology{1, 1, 1})));

// The second hop: what DeepSpeed 0.14.4 saved after loading a universal
// checkpoint at tp2 dp2 / tp1 dp2 (its ranks list the Adam states in
// different orders: [exp_avg_sq, exp_avg] and [exp_avg, exp_avg_sq]) is a
// valid source. Resharded back to the topology of another of DeepSpeed's own
// saves of the same state, it equals that save; it also converts.
TEST(SecondHopTest, DeepSpeedsSaveAfterAUniversalLoadIsASource) {
  struct Hop {
    std::string from, expected;
    state::Topology topo;
  };
  for (const Hop& h : {Hop{"resaved-tp2-pp1-dp2", "resaved-tp1-pp1-dp1", {1, 1, 1}},
                       Hop{"resaved-tp1-pp1-dp2", "resaved-tp1-pp1-dp1", {1, 1, 1}},
                       Hop{"resaved-tp1-pp1-dp2", "resaved-tp1-pp2-dp1", {1, 2, 1}}}) {
    SCOPED_TRACE(h.from + " -> " + h.expected);
    const std::string src = FixturePath("neox-tp2-pp1-dp1/" + h.from + "/global_step4");
    const std::string root = FreshTempDir("second_hop_" + h.from + "_" + h.expected);
    auto result = DoReshard(src, JoinPath(root, "global_step4"), h.topo);
    ASSERT_TRUE(result.ok()) << result.status();
    const std::vector<std::string> diffs =
        CompareCheckpoints(JoinPath(root, "global_step4"), FixturePath("neox-tp2-pp1-dp1/" + h.expected + "/global_step4"));
    EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
    ConvertOptions c;
    c.input_folder = src;
    c.output_folder = JoinPath(root, "universal");
    auto converted = Convert(c);
    EXPECT_TRUE(converted.ok()) << converted.status();
  }
}

// Checkpoints of later DeepSpeed versions: `from` resharded to `topo`
// equals `expected`, both folders of fixtures/deepspeed-<version>/<fixture>.
struct VersionCase {
  std::string version, fixture, from, expected;
  state::Topology topo;
};

void PrintTo(const VersionCase& c, std::ostream* os) {
  *os << c.version << "/" << c.fixture << ":" << c.from << "->" << c.expected;
}

class VersionReshardTest : public ::testing::TestWithParam<VersionCase> {};

TEST_P(VersionReshardTest, MatchesWhatDeepSpeedSaved) {
  const VersionCase& c = GetParam();
  const std::string root = FreshTempDir(absl::StrCat("reshard_", c.version, "_", c.fixture, "_",
                                                     absl::StrReplaceAll(c.from, {{"/", "_"}})));
  const std::string out = JoinPath(root, "global_step4");
  auto result = DoReshard(VersionFixturePath(c.version, JoinPath(c.fixture, c.from)), out, c.topo);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<std::string> diffs =
      CompareCheckpoints(out, VersionFixturePath(c.version, JoinPath(c.fixture, c.expected)));
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
}

INSTANTIATE_TEST_SUITE_P(
    Versions, VersionReshardTest,
    ::testing::Values(
        // 0.19.5 records group_paddings per rank ([0,0,1] and [0,0,2], rank
        // 1 saving a 0-element partition): dp2 -> dp1 is DeepSpeed's resave ...
        VersionCase{"0.19.5", "gpt-zero1-padding-dp2", "global_step4", "resaved-dp1/global_step4", {1, 1, 1}},
        // ... and its resave back to dp2 is the original, per-rank paddings
        // included (ucp writes 0.19.5's convention).
        VersionCase{"0.19.5", "gpt-zero1-padding-dp2", "resaved-dp1/global_step4", "global_step4", {1, 1, 2}},
        // checkpoint_parallel_dimensions and the rest of the 0.19.5 / 0.16.4
        // model states, unchanged at the same topology.
        VersionCase{"0.19.5", "neox-tp2-pp1-dp1", "global_step4", "global_step4", {2, 1, 1}},
        VersionCase{"0.19.5", "neox-bf16-tp2-pp1-dp2", "global_step4", "global_step4", {2, 1, 2}},
        VersionCase{"0.16.4", "neox-tp2-pp1-dp1", "global_step4", "global_step4", {2, 1, 1}},
        VersionCase{"0.16.4", "neox-bf16-tp2-pp1-dp2", "global_step4", "global_step4", {2, 1, 2}},
        // ZeRO-3, dp2 -> dp1: what DeepSpeed saves after its universal load,
        // with every sub-group's step its own tensor (the -stepfix resaves).
        VersionCase{"0.19.5", "gpt-zero3-dp2", "global_step4", "resaved-dp1-stepfix/global_step4", {1, 1, 1}},
        VersionCase{"0.19.5", "gpt-zero3-subgroups-dp2", "global_step4", "resaved-dp1-stepfix/global_step4",
                    {1, 1, 1}},
        VersionCase{"0.19.5", "gpt-zero3-bf16-dp2", "global_step4", "resaved-dp1/global_step4", {1, 1, 1}},
        VersionCase{"0.16.4", "gpt-zero3-onegroup-dp2", "global_step4", "resaved-dp1/global_step4", {1, 1, 1}},
        // ... and back: dp1 -> dp2 re-cuts the sub-groups (22 -> 20 with
        // sub_group_size 1000) into exactly what the dp2 job saved.
        VersionCase{"0.19.5", "gpt-zero3-subgroups-dp2", "resaved-dp1-stepfix/global_step4", "global_step4",
                    {1, 1, 2}},
        VersionCase{"0.19.5", "gpt-zero3-dp2", "resaved-dp1-stepfix/global_step4", "global_step4", {1, 1, 2}}));

// Every sub-group's `step` is a tensor of its own in what ucp writes (DeepSpeed
// 0.18 - 0.19.5's universal load gives all of them one tensor, which Adam then
// increments once per sub-group).
// The stage-3 universal layout read back: ucp convert of a ZeRO-3
// checkpoint, then ucp reshard of that folder to dp 1, gives what DeepSpeed
// itself saved at dp 1 (as the direct reshard does).
TEST(Zero3ReshardTest, ThroughTheStage3UniversalLayoutMatchesWhatDeepSpeedSaved) {
  for (const auto& [fixture, expected] : std::vector<std::pair<std::string, std::string>>{
           {"gpt-zero3-subgroups-dp2", "resaved-dp1-stepfix/global_step4"},
           {"gpt-zero3-bf16-dp2", "resaved-dp1/global_step4"}}) {
    SCOPED_TRACE(fixture);
    const std::string root = FreshTempDir(absl::StrCat("reshard_z3_universal_", fixture));
    ConvertOptions c;
    c.input_folder = VersionFixturePath("0.19.5", JoinPath(fixture, "global_step4"));
    c.output_folder = JoinPath(root, "global_step4_universal");
    c.write.fsync = false;
    auto converted = Convert(c);
    ASSERT_TRUE(converted.ok()) << converted.status();
    const std::string out = JoinPath(root, "out/global_step4");
    auto result = DoReshard(c.output_folder, out, {1, 1, 1});
    ASSERT_TRUE(result.ok()) << result.status();
    const std::vector<std::string> diffs =
        CompareCheckpoints(out, VersionFixturePath("0.19.5", JoinPath(fixture, expected)));
    EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
  }
}

// DeepSpeed 0.19.5's own ds_to_universal.py output of a ZeRO-3 checkpoint
// (the stage-3 layout, no ucp manifest) as a reshard source: to dp 1, what
// DeepSpeed saved at dp 1.
TEST(Zero3ReshardTest, DeepSpeedsOwnStage3UniversalFolderIsASource) {
  const std::string root = FreshTempDir("reshard_z3_ds_universal");
  const std::string out = JoinPath(root, "global_step4");
  auto result = DoReshard(VersionFixturePath("0.19.5", "gpt-zero3-dp2/global_step4_universal_deepspeed"), out, {1, 1, 1});
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<std::string> diffs =
      CompareCheckpoints(out, VersionFixturePath("0.19.5", "gpt-zero3-dp2/resaved-dp1-stepfix/global_step4"));
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
}

TEST(Zero3ReshardTest, EverySubGroupHasItsOwnStep) {
  const std::string root = FreshTempDir("reshard_zero3_steps");
  const std::string out = JoinPath(root, "global_step4");
  auto result =
      DoReshard(VersionFixturePath("0.19.5", "gpt-zero3-subgroups-dp2/global_step4"), out, state::Topology{1, 1, 1});
  ASSERT_TRUE(result.ok()) << result.status();
  auto f = torch::TorchFile::Open(JoinPath(out, "zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  ASSERT_TRUE(f.ok()) << f.status();
  const pickle::Value* state = (*f)->root()->DictGet("optimizer_state_dict")->DictGet("optimizer_state_dict")->DictGet("state");
  ASSERT_NE(state, nullptr);
  ASSERT_EQ(state->dict_items().size(), 22u);  // sub_group_size 1000 at dp1
  std::set<const torch::Storage*> storages;
  for (const auto& [k, v] : state->dict_items()) {
    auto step = (*f)->GetTensor(*v->DictGet("step"));
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->dim(), 0);
    storages.insert(step->storage().get());
  }
  EXPECT_EQ(storages.size(), 22u);
}

// 0.16.4, two param groups (which DeepSpeed 0.16.4 cannot convert to
// universal): dp2 -> dp1 -> dp2 gives back exactly the files it saved.
TEST(Zero3ReshardTest, RoundTrip0164TwoGroups) {
  const std::string src = VersionFixturePath("0.16.4", "gpt-zero3-dp2/global_step4");
  const std::string root = FreshTempDir("reshard_zero3_0164");
  auto one = DoReshard(src, JoinPath(root, "dp1/global_step4"), state::Topology{1, 1, 1});
  ASSERT_TRUE(one.ok()) << one.status();
  auto two = DoReshard(JoinPath(root, "dp1/global_step4"), JoinPath(root, "dp2/global_step4"),
                       state::Topology{1, 1, 2});
  ASSERT_TRUE(two.ok()) << two.status();
  const std::vector<std::string> diffs = CompareCheckpoints(JoinPath(root, "dp2/global_step4"), src);
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
}

// Stage changes: ZeRO-3 -> ZeRO-1 (dp2) keeps every tensor, and back to
// ZeRO-3 gives the files DeepSpeed saved; ZeRO-1 -> ZeRO-3 keeps every tensor.
TEST(Zero3ReshardTest, StageChangesBothWays) {
  const std::string src = VersionFixturePath("0.19.5", "gpt-zero3-subgroups-dp2/global_step4");
  const std::string root = FreshTempDir("reshard_zero3_stages");
  ReshardOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(root, "z1/global_step4");
  o.write.target = state::Topology{1, 1, 2};
  o.write.zero_stage = 1;
  o.write.num_threads = 2;
  auto one = Reshard(o);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(PathExists(JoinPath(o.output_folder, "mp_rank_00_model_states.pt")));
  SourceOptions whole;
  whole.tp1_whole_tensors = true;
  auto a = OpenModelState(src, whole, false);
  auto b = OpenModelState(o.output_folder, whole, false);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->info().zero_stage, 1);
  ASSERT_EQ((*a)->info().params.size(), (*b)->info().params.size());
  for (const auto& p : (*a)->info().params) {
    const state::ParamState* q = (*b)->info().Find(p.name);
    ASSERT_NE(q, nullptr) << p.name;
    EXPECT_EQ(q->group, p.group);
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto x = (*a)->Full(p, state);
      auto y = (*b)->Full(*q, state);
      ASSERT_TRUE(x.ok() && y.ok()) << p.name;
      EXPECT_TRUE(*tp::TensorPlan::BitwiseEqual(*x, *y)) << p.name << " " << state;
    }
  }
  // ZeRO-1 optimizer files: one flat param per group.
  auto f = torch::TorchFile::Open(JoinPath(o.output_folder, "zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  ASSERT_TRUE(f.ok()) << f.status();
  const pickle::Value* groups =
      (*f)->root()->DictGet("optimizer_state_dict")->DictGet("base_optimizer_state")->DictGet("param_groups");
  EXPECT_EQ(groups->items()[1]->DictGet("params")->DebugString(), "[1]");
  // Back to ZeRO-3 at dp2 (the sub_group_size carried in ds_config): DeepSpeed's files.
  ReshardOptions back;
  back.input_folder = o.output_folder;
  back.output_folder = JoinPath(root, "z3/global_step4");
  back.write.target = state::Topology{1, 1, 2};
  back.write.zero_stage = 3;
  back.write.num_threads = 2;
  auto three = Reshard(back);
  ASSERT_TRUE(three.ok()) << three.status();
  const std::vector<std::string> diffs = CompareCheckpoints(back.output_folder, src);
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
}

// bf16 ZeRO-3 -> ZeRO-1: DeepSpeed's DeepSpeedZeroOptimizer layout, unless
// the job accumulates gradients in fp32 (then DeepSpeed uses BF16_Optimizer,
// which ucp does not write from a ZeRO source): refused, nothing written.
TEST(Zero3ReshardTest, Bf16ToZero1FollowsTheGradAccumDtype) {
  const std::string root = FreshTempDir("reshard_zero3_bf16_stage1");
  const std::string src = JoinPath(root, "src/global_step4");
  ASSERT_TRUE(ucp::testing::RunCommand(absl::StrCat("mkdir -p '", Dirname(src), "' && cp -rL '",
                                                    VersionFixturePath("0.19.5", "gpt-zero3-bf16-dp2/global_step4"),
                                                    "' '", src, "' && chmod -R u+w '", src, "'"))
                  .ok());
  ReshardOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(root, "ok/global_step4");
  o.write.target = state::Topology{1, 1, 1};
  o.write.zero_stage = 1;
  o.write.num_threads = 2;
  auto ok = Reshard(o);
  ASSERT_TRUE(ok.ok()) << ok.status();  // no data_types: bf16 gradient accumulation
  EXPECT_TRUE(PathExists(JoinPath(o.output_folder, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")));
  // The same job with data_types.grad_accum_dtype fp32.
  for (int d = 0; d < 2; ++d) {
    const std::string path = JoinPath(src, absl::StrCat("zero_pp_rank_", d, "_mp_rank_00_model_states.pt"));
    ASSERT_TRUE(torch::testing::RewriteTorchFile(path, [](pickle::Value& root) {
                  pickle::ValuePtr types = pickle::Value::MakeDict();
                  types->DictSet(pickle::Value::Str("grad_accum_dtype"), pickle::Value::Str("fp32"));
                  root.DictGetPtr("ds_config")->DictSet(pickle::Value::Str("data_types"), types);
                }).ok());
  }
  o.output_folder = JoinPath(root, "refused/global_step4");
  auto refused = Reshard(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "BF16_Optimizer")) << refused.status();
  EXPECT_FALSE(PathExists(JoinPath(root, "refused")));
}

// --sub_group_size of the target job decides its sub-groups.
TEST(Zero3ReshardTest, SubGroupSizeOfTheTarget) {
  const std::string root = FreshTempDir("reshard_zero3_subgroup_size");
  const std::string out = JoinPath(root, "global_step4");
  ReshardOptions o;
  o.input_folder = VersionFixturePath("0.19.5", "gpt-zero3-dp2/global_step4");
  o.output_folder = out;
  o.write.target = state::Topology{1, 1, 2};
  o.write.sub_group_size = 1000;
  o.write.num_threads = 2;
  auto result = Reshard(o);
  ASSERT_TRUE(result.ok()) << result.status();
  // gpt-zero3-dp2 and gpt-zero3-subgroups-dp2 are the same model and run but
  // for sub_group_size: the same dp2 checkpoint, cut into its 20 sub-groups.
  std::vector<std::string> diffs =
      CompareCheckpoints(out, VersionFixturePath("0.19.5", "gpt-zero3-subgroups-dp2/global_step4"));
  // The runs differ in their values (sub-groups step separately), not in layout.
  for (const auto& d : diffs) {
    EXPECT_TRUE(absl::StrContains(d, "tensor bytes differ")) << d;
  }
}

// Native MoE (0.19.5, ep2, ZeRO-2, dp2) resharded to dp1 (ep1): every
// expert's fp32 master, Adam states and weights equal the originals, under
// the same global expert ids; the non-expert params too.
TEST(MoeReshardTest, Dp1KeepsEveryExpert) {
  const std::string src = VersionFixturePath("0.19.5", "gpt-moe-ep2-zero2-dp2/global_step4");
  const std::string root = FreshTempDir("reshard_moe_dp1");
  const std::string out = JoinPath(root, "global_step4");
  auto result = DoReshard(src, out, state::Topology{1, 1, 1});
  ASSERT_TRUE(result.ok()) << result.status();
  auto a = OpenModelState(src, SourceOptions(), false);
  auto b = OpenModelState(out, SourceOptions(), false);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*a)->info().expert_parallel, 2);
  EXPECT_EQ((*b)->info().expert_parallel, 1);
  ASSERT_EQ((*a)->info().params.size(), (*b)->info().params.size());
  int experts = 0;
  for (const auto& p : (*a)->info().params) {
    const state::ParamState* q = (*b)->info().Find(p.name);
    ASSERT_NE(q, nullptr) << p.name;
    EXPECT_EQ(q->group, p.group) << p.name;
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto x = (*a)->Full(p, state);
      auto y = (*b)->Full(*q, state);
      ASSERT_TRUE(x.ok() && y.ok()) << p.name << " " << state;
      auto eq = tp::TensorPlan::BitwiseEqual(*x, *y);
      ASSERT_TRUE(eq.ok());
      EXPECT_TRUE(*eq) << p.name << " " << state;
    }
    if (absl::StrContains(p.name, ".deepspeed_experts.")) ++experts;
  }
  EXPECT_EQ(experts, 2 * 4 * 4);  // 2 MoE layers x 4 experts x (fc, proj) x (weight, bias)
  // The expert files: the same weights under the same names.
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      const std::string f = absl::StrCat("layer_", l, "_expert_", e, "_mp_rank_00_model_states.pt");
      auto d = testing::CompareFiles(JoinPath(out, f), JoinPath(src, f));
      ASSERT_TRUE(d.ok()) << f << ": " << d.status();
      EXPECT_THAT(*d, IsEmpty()) << f << "\n" << absl::StrJoin(*d, "\n");
    }
  }
  // One optimizer file, groups named for ep 1, experts partitioned over dp 1.
  auto f = torch::TorchFile::Open(JoinPath(out, "zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  ASSERT_TRUE(f.ok()) << f.status();
  const pickle::Value* osd = (*f)->root()->DictGet("optimizer_state_dict");
  EXPECT_EQ(osd->DictGet("partition_count")->DebugString(), "[1, 1, 1, 1]");
  const pickle::Value* groups = osd->DictGet("base_optimizer_state")->DictGet("param_groups");
  EXPECT_EQ(groups->items()[2]->DictGet("name")->str(), "ep_size_1");
  EXPECT_EQ(groups->items()[1]->DictGet("name")->str(), "no_decay");
  EXPECT_FALSE(PathExists(JoinPath(out, "zero_pp_rank_1_mp_rank_00_optim_states.pt")));
}

// And back: dp1 (ep1) -> dp2 (ep2) is exactly what DeepSpeed saved at dp2 ep2.
TEST(MoeReshardTest, RoundTripIsWhatDeepSpeedSaved) {
  const std::string src = VersionFixturePath("0.19.5", "gpt-moe-ep2-zero2-dp2/global_step4");
  const std::string root = FreshTempDir("reshard_moe_roundtrip");
  auto one = DoReshard(src, JoinPath(root, "dp1/global_step4"), state::Topology{1, 1, 1});
  ASSERT_TRUE(one.ok()) << one.status();
  ReshardOptions o;
  o.input_folder = JoinPath(root, "dp1/global_step4");
  o.output_folder = JoinPath(root, "dp2/global_step4");
  o.write.target = state::Topology{1, 1, 2};
  o.write.expert_parallel = 2;
  o.write.num_threads = 2;
  auto two = Reshard(o);
  ASSERT_TRUE(two.ok()) << two.status();
  const std::vector<std::string> diffs = CompareCheckpoints(JoinPath(root, "dp2/global_step4"), src);
  EXPECT_THAT(diffs, IsEmpty()) << absl::StrJoin(diffs, "\n");
}

// --target_ds_version decides the group_paddings convention: 0.16.3 puts the
// whole padding on the last rank (which then saves group[:-1] of its 2
// elements), 0.19.5 gives each rank its own; both read back to the same
// tensors.
TEST(VersionConventionTest, TargetVersionDecidesThePaddings) {
  const std::string src = VersionFixturePath("0.19.5", "gpt-zero1-padding-dp2/resaved-dp1/global_step4");
  const std::string root = FreshTempDir("reshard_target_version");
  for (const auto& [version, rank0, rank1, lean1] :
       std::vector<std::tuple<std::string, std::string, std::string, int64_t>>{
           {"0.16.3", "[0, 0, 0]", "[0, 0, 3]", 1}, {"0.19.5", "[0, 0, 1]", "[0, 0, 2]", 0},
           // master edaa72212: 0.19.5's ZeRO 1/2 layout
           {"0.19.6", "[0, 0, 1]", "[0, 0, 2]", 0}}) {
    ReshardOptions o;
    o.input_folder = src;
    o.output_folder = JoinPath(root, version + "/global_step4");
    o.write.target = state::Topology{1, 1, 2};
    o.write.target_ds_version = version;
    o.write.num_threads = 2;
    auto r = Reshard(o);
    ASSERT_TRUE(r.ok()) << r.status();
    std::string paddings[2];
    for (int d = 0; d < 2; ++d) {
      auto f = torch::TorchFile::Open(JoinPath(o.output_folder, absl::StrCat("zero_pp_rank_", d, "_mp_rank_00_optim_states.pt")));
      ASSERT_TRUE(f.ok()) << f.status();
      const pickle::Value* osd = (*f)->root()->DictGet("optimizer_state_dict");
      paddings[d] = osd->DictGet("group_paddings")->DebugString();
      EXPECT_EQ(osd->DictGet("ds_version")->str(), version);
      EXPECT_EQ((*f)->root()->DictGet("ds_version")->str(), version);
      if (d == 1) {
        auto fp32 = (*f)->GetTensor(*osd->DictGet("single_partition_of_fp32_groups")->items()[2]);
        ASSERT_TRUE(fp32.ok());
        EXPECT_EQ(fp32->numel(), lean1) << version;
      }
    }
    EXPECT_EQ(paddings[0], rank0) << version;
    EXPECT_EQ(paddings[1], rank1) << version;
    auto c = deepspeed_zero::ZeroCheckpoint::Open(o.output_folder);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->padding_convention(), version == "0.16.3" ? deepspeed::PaddingConvention::kLastRank
                                                               : deepspeed::PaddingConvention::kPerRank);
    SourceOptions whole;  // tp=1: whole tensors, no rules needed
    whole.tp1_whole_tensors = true;
    auto a = OpenModelState(src, whole, false);
    auto b = OpenModelState(o.output_folder, whole, false);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    for (const auto& p : (*a)->info().params) {
      if (!p.trainable()) continue;
      for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
        auto x = (*a)->Full(p, state);
        auto y = (*b)->Full(*(*b)->info().Find(p.name), state);
        ASSERT_TRUE(x.ok() && y.ok()) << p.name;
        EXPECT_TRUE(*tp::TensorPlan::BitwiseEqual(*x, *y)) << version << " " << p.name << " " << state;
      }
    }
  }
  // Versions outside 0.12 - 0.19.6 are refused, naming the version.
  ReshardOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(root, "future/global_step4");
  o.write.target = state::Topology{1, 1, 2};
  o.write.target_ds_version = "0.20.0";
  auto r = Reshard(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "DeepSpeed 0.20.0")) << r.status();
  EXPECT_FALSE(PathExists(JoinPath(root, "future")));
}

}  // namespace
}  // namespace ucp::ops
