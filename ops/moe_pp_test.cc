// Native MoE inside a pipeline at pp 2 (testdata/moe_pp: real DeepSpeed
// 0.19.5, 0.18.9 and 0.14.4 saves of a PipelineModule with MoE blocks in both
// stages, fp32 ZeRO-1, dp 2) against the saving ranks' own snapshots
// (ref/rank{0..3}.pt: every param each rank held right before the save, under
// the module's names, experts under their LOCAL ids; rank r is stage r / 2,
// dp rank r % 2, ep rank (r % 2) % ep). In fp32 training the fp32 masters are
// the weights bitwise, so both lp and fp32 are checked against them:
//   - the reader (MoeState, each stage read from its mp_rank_<stage> files)
//     holds every param of every stage, lp and fp32 equal to the snapshots;
//   - `ucp reshard --pp=1` (dp 1 ep 1, and dp 2 at the save's ep) writes a
//     pp 1 save whose every param is the snapshots' (its optimizer states the
//     source's), with one expert file per (MoE layer, expert) numbered over
//     the whole model and num_experts for every MoE layer;
//   - `ucp reshard --pp=2` at the save's dp and ep, from the save itself and
//     from its pp 1 reshard, writes DeepSpeed's own files: every file name,
//     key, scalar and tensor of the save (the stages cut as the training's
//     PipelineModule cut them: partition_method type:Block);
//   - a pp target whose stage would hold no MoE layer is refused, and the
//     `parameters` cut weighs a MoE block by one ep rank's local experts;
//   - a tied embedding (TiedLayerSpec at the first and last layers, saved by
//     both stages: testdata/moe_pp/ds0195_tp2_pp2_tied_bf16, tp 2 pp 2 bf16)
//     is read once and written in both stages: the save resharded to its own
//     topology, directly and through tp 1 pp 1, is DeepSpeed's own folder;
//   - `ucp export` holds every param, equal to the snapshots;
//   - a stage's missing optimizer file is refused, naming it.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "format/pickle/value.h"
#include "format/safetensors/safetensors.h"
#include "format/torch/torch_file.h"
#include "formats/deepspeed_moe/moe_state.h"
#include "gtest/gtest.h"
#include "ops/export.h"
#include "ops/reshard.h"
#include "testing/compare.h"
#include "testing/fixtures.h"

namespace ucp::ops {
namespace {

using pickle::Kind;
using pickle::Value;
using ucp::testing::FreshTempDir;
using ucp::testing::RunfilePath;

struct Save {
  const char* dir;
  int dp, ep;
  int moe_layers;  // over both stages
  size_t params;   // every param of the model
};
constexpr int kPp = 2, kExperts = 4;

const Save kSaves[] = {
    // MoE in blocks 0, 1 (stage 0: expert files layer_0, layer_1) and 3
    // (stage 1: layer_0 again).
    {"testdata/moe_pp/ds0195_pp2_ep2_zero1_dp2_moe013", 2, 2, 3, 66},
    {"testdata/moe_pp/ds0189_pp2_ep1_zero1_dp2", 2, 1, 2, 53},   // no param_shapes
    {"testdata/moe_pp/ds0144_pp2_ep2_zero1_dp2", 2, 2, 2, 53},   // expert mappings of a window
};

// Every rank's snapshot: global name -> the tensors of the ranks holding it.
struct Snapshots {
  std::vector<std::unique_ptr<torch::TorchFile>> files;
  std::map<std::string, std::vector<torch::Tensor>> params;
};

Snapshots ReadSnapshots(const Save& save) {
  Snapshots out;
  for (int r = 0; r < kPp * save.dp; ++r) {
    const std::string path = RunfilePath(absl::StrCat(save.dir, "/ref/rank", r, ".pt"));
    auto f = torch::TorchFile::Open(path);
    EXPECT_TRUE(f.ok()) << path << ": " << f.status();
    if (!f.ok()) return {};
    const Value* params = (*f)->root()->DictGet("params");
    EXPECT_TRUE(params != nullptr && params->is(Kind::kDict)) << path;
    if (params == nullptr) return {};
    const int ep_rank = (r % save.dp) % save.ep;
    for (const auto& [k, v] : params->dict_items()) {
      std::string name = k->str(), prefix, suffix;
      int id = 0;
      if (deepspeed_moe::SplitExpertName(name, &prefix, &id, &suffix)) {
        name = deepspeed_moe::ExpertName(prefix, ep_rank * (kExperts / save.ep) + id, suffix);
      }
      auto t = (*f)->GetTensor(*v);
      EXPECT_TRUE(t.ok()) << path << ": " << name << ": " << t.status();
      if (t.ok()) out.params[name].push_back(*t);
    }
    out.files.push_back(*std::move(f));
  }
  return out;
}

// The (param, state) pairs of `s` not equal to the snapshots; `compared`
// counts the pairs compared.
std::vector<std::string> Mismatches(const deepspeed_moe::MoeState& s, const Snapshots& snap,
                                    const std::vector<std::string>& states, int* compared) {
  std::vector<std::string> bad;
  *compared = 0;
  for (const state::ParamState& p : s.info().params) {
    auto it = snap.params.find(p.name);
    if (it == snap.params.end()) {
      bad.push_back(absl::StrCat(p.name, ": in no snapshot"));
      continue;
    }
    for (const std::string& state : states) {
      auto slices = s.Slices(p, p.stages.empty() ? 0 : p.stages[0], state);
      if (!slices.ok() || slices->size() != 1) {
        bad.push_back(absl::StrCat(p.name, " ", state, ": ", slices.status().ToString()));
        continue;
      }
      auto got = (*slices)[0].Materialize();
      ++*compared;
      bool eq = got.ok();
      for (const torch::Tensor& want : it->second) eq = eq && got->BitwiseEqual(want);
      if (!eq) bad.push_back(absl::StrCat(p.name, " ", state));
    }
  }
  return bad;
}

class MoePpTest : public ::testing::TestWithParam<Save> {};

TEST_P(MoePpTest, EveryStageIsWhatItsRanksHeld) {
  const Save& save = GetParam();
  const Snapshots snap = ReadSnapshots(save);
  ASSERT_EQ(snap.params.size(), save.params);
  auto s = deepspeed_moe::MoeState::Open(RunfilePath(absl::StrCat(save.dir, "/global_step3")));
  ASSERT_TRUE(s.ok()) << s.status();
  const state::ModelInfo& info = (*s)->info();
  EXPECT_EQ(info.source_topology, (state::Topology{1, kPp, save.dp}));
  EXPECT_EQ(info.expert_parallel, save.ep);
  ASSERT_EQ(info.moe_layers.size(), static_cast<size_t>(save.moe_layers));
  for (const auto& l : info.moe_layers) EXPECT_EQ(l.num_experts, kExperts) << l.prefix;
  EXPECT_EQ(info.params.size(), save.params);
  std::set<int> stages;
  for (const auto& p : info.params) {
    ASSERT_EQ(p.stages.size(), 1u) << p.name;
    stages.insert(p.stages[0]);
  }
  EXPECT_EQ(stages, (std::set<int>{0, 1}));
  int compared = 0;
  const std::vector<std::string> bad = Mismatches(**s, snap, {"lp", "fp32"}, &compared);
  EXPECT_TRUE(bad.empty()) << bad.size() << " differ, first: " << bad[0];
  EXPECT_EQ(compared, static_cast<int>(2 * save.params));
}

TEST_P(MoePpTest, ToPp1IsTheSnapshots) {
  const Save& save = GetParam();
  const Snapshots snap = ReadSnapshots(save);
  auto src = deepspeed_moe::MoeState::Open(RunfilePath(absl::StrCat(save.dir, "/global_step3")));
  ASSERT_TRUE(src.ok()) << src.status();
  const std::string root = FreshTempDir("moe_pp_reshard");
  for (const auto& [dp, ep] : std::vector<std::pair<int, int>>{{1, 1}, {save.dp, save.ep}}) {
    ReshardOptions o;
    o.input_folder = RunfilePath(absl::StrCat(save.dir, "/global_step3"));
    o.output_folder = JoinPath(root, absl::StrCat("dp", dp, "_ep", ep, "/global_step3"));
    o.write.target = state::Topology{1, 1, dp};
    o.write.expert_parallel = ep;
    o.write.num_threads = 2;
    auto r = Reshard(o);
    ASSERT_TRUE(r.ok()) << r.status();
    auto out = deepspeed_moe::MoeState::Open(o.output_folder);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)->info().source_topology, (state::Topology{1, 1, dp}));
    EXPECT_EQ((*out)->info().params.size(), save.params);
    int compared = 0;
    std::vector<std::string> bad = Mismatches(**out, snap, {"lp", "fp32"}, &compared);
    EXPECT_TRUE(bad.empty()) << "dp " << dp << ": " << bad.size() << " differ, first: " << bad[0];
    EXPECT_EQ(compared, static_cast<int>(2 * save.params));
    // The Adam moments are the source's.
    for (const state::ParamState& p : (*out)->info().params) {
      if (!p.trainable()) continue;
      const state::ParamState* q = (*src)->info().Find(p.name);
      ASSERT_NE(q, nullptr) << p.name;
      for (const char* key : {"exp_avg", "exp_avg_sq"}) {
        auto a = (*out)->Slices(p, 0, key);
        auto b = (*src)->Slices(*q, q->stages[0], key);
        ASSERT_TRUE(a.ok() && b.ok()) << p.name << " " << key;
        auto ta = (*a)[0].Materialize();
        auto tb = (*b)[0].Materialize();
        ASSERT_TRUE(ta.ok() && tb.ok()) << p.name << " " << key;
        EXPECT_TRUE(ta->BitwiseEqual(*tb)) << p.name << " " << key;
      }
    }
    // One expert file per MoE layer and expert, the layers numbered over the
    // whole model; num_experts of every MoE layer.
    for (int l = 0; l < save.moe_layers; ++l) {
      for (int e = 0; e < kExperts; ++e) {
        EXPECT_TRUE(PathExists(
            JoinPath(o.output_folder, absl::StrCat("layer_", l, "_expert_", e, "_mp_rank_00_model_states.pt"))))
            << l << " " << e;
      }
    }
    EXPECT_FALSE(PathExists(JoinPath(o.output_folder, absl::StrCat("layer_", save.moe_layers,
                                                                   "_expert_0_mp_rank_00_model_states.pt"))));
    EXPECT_FALSE(PathExists(JoinPath(o.output_folder, "mp_rank_01_model_states.pt")));
    auto mp = torch::TorchFile::Open(JoinPath(o.output_folder, "mp_rank_00_model_states.pt"));
    ASSERT_TRUE(mp.ok()) << mp.status();
    const Value* ne = (*mp)->root()->DictGet("num_experts");
    ASSERT_TRUE(ne != nullptr && ne->is(Kind::kList));
    ASSERT_EQ(ne->items().size(), static_cast<size_t>(save.moe_layers));
    for (const auto& v : ne->items()) EXPECT_EQ(v->int_value(), kExperts);
  }
}

// The pipeline cut of the saves' training (testdata/moe_pp/gen/moepp.py):
// layer 0 Embed, layers 1-4 Block, layer 5 Head; partition_method type:Block.
void CutAsTheTraining(ReshardOptions* o) {
  o->write.partition_method = "type:Block";
  o->write.layer_types = {{0, "Embed"}, {1, "Block"}, {2, "Block"}, {3, "Block"}, {4, "Block"}, {5, "Head"}};
}

// `from` resharded to pp 2 at the save's dp and ep, in `out`.
absl::Status ReshardToPp2(const Save& save, const std::string& from, const std::string& out) {
  ReshardOptions o;
  o.input_folder = from;
  o.output_folder = out;
  o.write.target = state::Topology{1, kPp, save.dp};
  o.write.expert_parallel = save.ep;
  o.write.num_threads = 2;
  CutAsTheTraining(&o);
  return Reshard(o).status();
}

TEST_P(MoePpTest, ToPp2IsDeepSpeedsOwnFiles) {
  const Save& save = GetParam();
  const std::string src = RunfilePath(absl::StrCat(save.dir, "/global_step3"));
  const std::string root = FreshTempDir("moe_pp_to_pp2");
  // From the save itself.
  const std::string direct = JoinPath(root, "direct/global_step3");
  ASSERT_TRUE(ReshardToPp2(save, src, direct).ok());
  auto diff = testing::CompareFolders(src, direct);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_TRUE(diff->empty()) << diff->size() << " differences, first: " << (*diff)[0];
  // Through pp 1: one module, the MoE layers numbered over the model, cut
  // into stages again.
  ReshardOptions o;
  o.input_folder = src;
  o.output_folder = JoinPath(root, "pp1/global_step3");
  o.write.target = state::Topology{1, 1, save.dp};
  o.write.expert_parallel = save.ep;
  o.write.num_threads = 2;
  ASSERT_TRUE(Reshard(o).ok());
  ASSERT_FALSE(PathExists(JoinPath(o.output_folder, "mp_rank_01_model_states.pt")));
  const std::string back = JoinPath(root, "back/global_step3");
  absl::Status st = ReshardToPp2(save, o.output_folder, back);
  ASSERT_TRUE(st.ok()) << st;
  diff = testing::CompareFolders(src, back);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_TRUE(diff->empty()) << diff->size() << " differences, first: " << (*diff)[0];
}

// Uniform partitioning of the six layers into three stages puts layers 0 and
// 1 (Embed and a dense block) in stage 0: no MoE layer there, which
// DeepSpeed cannot train (it hangs in the first step). Refused before
// anything is written.
TEST(MoePpTargetTest, StageWithoutMoeIsRefused) {
  ReshardOptions o;
  o.input_folder = RunfilePath("testdata/moe_pp/ds0189_pp2_ep1_zero1_dp2/global_step3");
  o.output_folder = JoinPath(FreshTempDir("moe_pp_refused"), "global_step3");
  o.write.target = state::Topology{1, 3, 1};
  o.write.partition_method = "uniform";
  auto r = Reshard(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("pipeline stage 0 (layers 0 to 1, uniform partitioning) holds none of the 2 "
                                      "MoE layers"),
            std::string::npos)
      << r.status();
  EXPECT_FALSE(PathExists(o.output_folder));
}

// `parameters` partitioning weighs a layer as one rank builds it
// (PipelineModule._count_layer_params): a MoE block holds num_experts / ep
// local experts. The 0.18.9 save's six layers (Embed, dense block, MoE
// block, MoE block, dense block, Head) weigh, per target ep:
//   ep 1 (4 local experts): 512, 1104, 4384, 4384, 1104, 544 -> pp 3 cuts
//        [0, 3) [3, 4) [4, 6): stage 2 holds no MoE block;
//   ep 4 (1 local expert):  512, 1104, 1168, 1168, 1104, 544 -> pp 3 cuts
//        [0, 2) [2, 4) [4, 6): stage 0 holds no MoE block.
// Either is refused, naming the stage the cut leaves without MoE.
TEST(MoePpTargetTest, ParametersPartitioningWeighsOneRanksExperts) {
  const std::string root = FreshTempDir("moe_pp_parameters");
  for (const auto& [ep, message] : std::vector<std::pair<int, std::string>>{
           {1, "pipeline stage 2 (layers 4 to 5, parameters partitioning) holds none of the 2 MoE layers"},
           {4, "pipeline stage 0 (layers 0 to 1, parameters partitioning) holds none of the 2 MoE layers"}}) {
    ReshardOptions o;
    o.input_folder = RunfilePath("testdata/moe_pp/ds0189_pp2_ep1_zero1_dp2/global_step3");
    o.output_folder = JoinPath(root, absl::StrCat("ep", ep, "/global_step3"));
    o.write.target = state::Topology{1, 3, 4};
    o.write.expert_parallel = ep;
    auto r = Reshard(o);
    ASSERT_FALSE(r.ok()) << "ep " << ep;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << "ep " << ep << ": " << r.status();
  }
}

// A PipelineModule with a tied embedding (the neox family: TiedLayerSpec
// 'embed' at layer 0 and the last layer), tp 2 pp 2 ep 2, bf16: both stages
// save tied_modules.embed.*. Read once (one param, both stages holding it),
// written at pp 2 in the first and last stages, directly and through tp 1
// pp 1 it is DeepSpeed's own folder file for file.
TEST(MoePpTargetTest, TiedEmbeddingIsInTheFirstAndLastStages) {
  const std::string src = RunfilePath("testdata/moe_pp/ds0195_tp2_pp2_tied_bf16/global_step2");
  auto s = deepspeed_moe::MoeState::Open(src);
  ASSERT_TRUE(s.ok()) << s.status();
  const state::ParamState* tied = (*s)->info().Find("tied_modules.embed.word_embeddings.weight");
  ASSERT_NE(tied, nullptr);
  EXPECT_EQ(tied->stages, (std::vector<int>{0, 1}));
  const std::string root = FreshTempDir("moe_pp_tied");
  auto reshard = [&](const std::string& from, const std::string& name, state::Topology t) {
    ReshardOptions o;
    o.input_folder = from;
    o.output_folder = JoinPath(root, name + "/global_step2");
    o.write.target = t;
    o.write.expert_parallel = 2;
    o.write.num_threads = 2;
    o.write.partition_method = "type:transformer|mlp";  // the neox family's
    auto r = Reshard(o);
    EXPECT_TRUE(r.ok()) << name << ": " << r.status();
    if (r.ok()) {
      // The tie is assumed (the files do not record it), so the report says so at pp > 1 only.
      const std::string note =
          "tied module(s) tied_modules.embed taken as pipeline layers 0 and 7 (an embedding tied to the output layer";
      int said = 0;
      for (const std::string& n : r->notes) said += absl::StrContains(n, note) && absl::StrContains(n, "stage(s) 0 and 1");
      EXPECT_EQ(said, t.pp > 1 ? 1 : 0) << name << ": " << absl::StrJoin(r->notes, "\n");
    }
    return o.output_folder;
  };
  for (const std::string& out :
       {reshard(src, "same", {2, 2, 1}), reshard(reshard(src, "pp1", {1, 1, 2}), "back", {2, 2, 1})}) {
    auto diff = testing::CompareFolders(src, out);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_TRUE(diff->empty()) << out << ": " << diff->size() << " differences, first: " << (*diff)[0];
  }
}

TEST_P(MoePpTest, ExportIsTheSnapshots) {
  const Save& save = GetParam();
  const Snapshots snap = ReadSnapshots(save);
  ExportOptions o;
  o.input_folder = RunfilePath(absl::StrCat(save.dir, "/global_step3"));
  o.output_folder = JoinPath(FreshTempDir("moe_pp_export"), "out");
  auto r = Export(o);
  ASSERT_TRUE(r.ok()) << r.status();
  auto st = safetensors::SafetensorsFile::Open(JoinPath(o.output_folder, "model.safetensors"));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ((*st)->tensors().size(), save.params);
  int equal = 0;
  for (const auto& [name, tensors] : snap.params) {
    auto got = (*st)->GetTensor(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    bool eq = true;
    for (const torch::Tensor& want : tensors) eq = eq && got->BitwiseEqual(want);
    EXPECT_TRUE(eq) << name;
    equal += eq ? 1 : 0;
  }
  EXPECT_EQ(equal, static_cast<int>(save.params));
}

// A stage's optimizer file missing: refused, naming it.
TEST_P(MoePpTest, MissingStageFileIsRefused) {
  const Save& save = GetParam();
  const std::string dir = JoinPath(FreshTempDir("moe_pp_missing"), "global_step3");
  ASSERT_TRUE(CopyTree(RunfilePath(absl::StrCat(save.dir, "/global_step3")), dir).ok());
  const std::string missing = "zero_pp_rank_1_mp_rank_01_optim_states.pt";
  ASSERT_TRUE(RemoveTree(JoinPath(dir, missing)).ok());
  auto s = deepspeed_moe::MoeState::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(JoinPath(dir, missing)), std::string::npos) << s.status();
}

INSTANTIATE_TEST_SUITE_P(Saves, MoePpTest, ::testing::ValuesIn(kSaves),
                         [](const ::testing::TestParamInfo<Save>& info) {
                           const std::string d = info.param.dir;
                           return d.substr(d.rfind('/') + 1, 6);
                         });

}  // namespace
}  // namespace ucp::ops
