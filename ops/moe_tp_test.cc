// Native MoE at tp 2 (testdata/moe_tp/ds0195_tp2_ep2_zero1_dp2: real DeepSpeed
// 0.19.5, tp 2 dp 2 ep 2, ZeRO-1) against the saving job's own dumps
// (ref/rank{0..3}.pt, realds/worker/dumps.py: per global rank r = dp rank x 2
// + tp rank, every param's lp, fp32, exp_avg, exp_avg_sq as that rank holds
// it: a dense param its tp slice gathered over its dp group, an expert of its
// ep rank r % 2 whole, under its global id; `split` the tp dim the model marked,
// None when not split):
//   - the reader's tp slices (MoeState::Slices) bitwise equal the dumps of
//     the ranks they belong to, the experts whole;
//   - `ucp reshard --tp=1` (dp 2 and dp 1) and `ucp export` hold the full
//     tensors, each the dumps' tp slices joined on their own split dim;
//   - negative controls: the same comparison with the tp ranks or the ep
//     ranks of the dumps swapped finds every split param / expert differing,
//     so a reader that swapped them would fail the first test.
//   - `ucp reshard --tp=2` (the writer): to the save's own topology and
//     through tp 1 and back, the save itself file for file; at dp 1 every
//     slice the dumps'; the same checks with the tp or ep ranks swapped fail;
//     ep < tp and pp > 1 of a plain module refused, saying why;
//   - a real 0.14.4 save at tp 2 dp 2 ep 4 (expert mappings of a window of
//     each expert group) resharded to its own topology, directly and through
//     tp 1, is that save file for file.
// The reader, reshard and export checks run again on the same model saved by
// DeepSpeed 0.18.9 (testdata/moe_tp/ds0189_tp2_ep2_zero1_dp2, no param_shapes).
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/fs.h"
#include "format/pickle/value.h"
#include "format/safetensors/safetensors.h"
#include "format/torch/torch_file.h"
#include "formats/deepspeed_moe/moe_state.h"
#include "gtest/gtest.h"
#include "ops/export.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "testing/compare.h"
#include "testing/fixtures.h"

namespace ucp::ops {
namespace {

using pickle::Kind;
using pickle::Value;
using ucp::testing::FreshTempDir;
using ucp::testing::RunfilePath;

constexpr char kSave[] = "testdata/moe_tp/ds0195_tp2_ep2_zero1_dp2";
// The same model saved by 0.18.9 (before param_shapes: each tp rank's params
// from its dp group's param_slice_mappings, shapes from its module): the
// reader, reshard and export tests run on both saves.
constexpr char kSave0189[] = "testdata/moe_tp/ds0189_tp2_ep2_zero1_dp2";
constexpr int kTp = 2, kEp = 2, kRanks = 4;
const std::vector<std::string> kStates = {"lp", "fp32", "exp_avg", "exp_avg_sq"};

// One rank's dump: param name -> state -> tensor, and the param's split.
struct Dump {
  std::unique_ptr<torch::TorchFile> file;
  std::map<std::string, std::map<std::string, torch::Tensor>> params;
  std::map<std::string, int> split;  // -1: None
};

std::vector<Dump> ReadDumps(const std::string& save = kSave) {
  std::vector<Dump> out(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    const std::string path = RunfilePath(absl::StrCat(save, "/ref/rank", r, ".pt"));
    auto f = torch::TorchFile::Open(path);
    EXPECT_TRUE(f.ok()) << path << ": " << f.status();
    if (!f.ok()) return {};
    const Value* params = (*f)->root()->DictGet("params");
    EXPECT_TRUE(params != nullptr && params->is(Kind::kDict)) << path;
    if (params == nullptr) return {};
    for (const auto& [k, v] : params->dict_items()) {
      for (const std::string& s : kStates) {
        const Value* t = v->DictGet(s);
        EXPECT_NE(t, nullptr) << path << ": " << k->str() << " has no " << s;
        if (t == nullptr) continue;
        auto tensor = (*f)->GetTensor(*t);
        EXPECT_TRUE(tensor.ok()) << path << ": " << k->str() << " " << s << ": " << tensor.status();
        if (tensor.ok()) out[r].params[k->str()][s] = *tensor;
      }
      const Value* split = v->DictGet("split");
      out[r].split[k->str()] = split != nullptr && split->is(Kind::kInt) ? static_cast<int>(split->int_value()) : -1;
    }
    out[r].file = *std::move(f);
  }
  return out;
}

bool IsExpert(const std::string& name) {
  std::string prefix, suffix;
  int id = 0;
  return deepspeed_moe::SplitExpertName(name, &prefix, &id, &suffix);
}

// The global rank whose dump holds tp slice `t` (dp rank 0), or expert `id`
// (its ep rank, expert data parallel rank 0; 1 expert per ep rank here).
// `swap_tp` / `swap_ep`: the negative controls' wrong placements.
int TpRank(int t, bool swap_tp) { return swap_tp ? kTp - 1 - t : t; }
int EpRankOf(int id, bool swap_ep) { return swap_ep ? kEp - 1 - id : id; }

// The reader's slices of every trainable param against the dumps: the names
// of the (param, state) pairs that differ; `compared` counts the pairs.
std::vector<std::string> SliceMismatches(const deepspeed_moe::MoeState& s, const std::vector<Dump>& dumps,
                                         bool swap_tp, bool swap_ep, int* compared) {
  std::vector<std::string> bad;
  *compared = 0;
  for (const state::ParamState& p : s.info().params) {
    for (const std::string& state : kStates) {
      auto slices = s.Slices(p, 0, state);
      EXPECT_TRUE(slices.ok()) << p.name << " " << state << ": " << slices.status();
      if (!slices.ok()) continue;
      std::string prefix, suffix;
      int id = 0;
      const bool expert = deepspeed_moe::SplitExpertName(p.name, &prefix, &id, &suffix);
      EXPECT_EQ(slices->size(), expert ? 1u : static_cast<size_t>(kTp)) << p.name;
      for (size_t t = 0; t < slices->size(); ++t) {
        const int rank = expert ? EpRankOf(id, swap_ep) : TpRank(static_cast<int>(t), swap_tp);
        // Swapped experts: expert id read as the other ep rank's expert.
        const std::string name = expert ? deepspeed_moe::ExpertName(prefix, EpRankOf(id, swap_ep), suffix) : p.name;
        auto it = dumps[rank].params.find(name);
        EXPECT_NE(it, dumps[rank].params.end()) << "rank " << rank << "'s dump has no " << name;
        if (it == dumps[rank].params.end()) continue;
        auto got = (*slices)[t].Materialize();
        EXPECT_TRUE(got.ok()) << got.status();
        ++*compared;
        if (!got.ok() || !got->BitwiseEqual(it->second.at(state))) {
          bad.push_back(absl::StrCat(p.name, " ", state, " tp slice ", t));
        }
      }
    }
  }
  return bad;
}

class MoeTpSaveTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeTpSaveTest, EverySliceIsWhatTheSavingRanksHeld) {
  const std::vector<Dump> dumps = ReadDumps(GetParam());
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kRanks));
  auto s = deepspeed_moe::MoeState::Open(RunfilePath(absl::StrCat(GetParam(), "/global_step3")));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->info().source_topology.tp, 2);
  EXPECT_EQ((*s)->info().source_topology.dp, 2);
  EXPECT_EQ((*s)->info().expert_parallel, 2);
  int compared = 0;
  const std::vector<std::string> bad = SliceMismatches(**s, dumps, false, false, &compared);
  EXPECT_TRUE(bad.empty()) << absl::StrJoin(bad, "\n");
  // 10 dense params x 2 tp slices + 2 experts x 4 params, 4 states each;
  // every param of the dumps is one of them.
  EXPECT_EQ(compared, (10 * 2 + 2 * 4) * 4);
  EXPECT_EQ((*s)->info().params.size(), dumps[0].params.size() + 4);  // rank 0 holds expert 0 only
}

// Swapping the tp ranks or the ep ranks of the dumps makes the comparison
// fail for every tp-split param / every expert: the check above would catch
// a reader that placed them so.
TEST_P(MoeTpSaveTest, SwappedTpOrEpRanksAreDetected) {
  const std::vector<Dump> dumps = ReadDumps(GetParam());
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kRanks));
  auto s = deepspeed_moe::MoeState::Open(RunfilePath(absl::StrCat(GetParam(), "/global_step3")));
  ASSERT_TRUE(s.ok()) << s.status();
  int compared = 0;
  std::vector<std::string> bad = SliceMismatches(**s, dumps, false, true, &compared);
  int experts = 0;
  for (const std::string& b : bad) experts += IsExpert(b) ? 1 : 0;
  EXPECT_EQ(experts, 2 * 4 * 4) << absl::StrJoin(bad, "\n");
  EXPECT_EQ(bad.size(), static_cast<size_t>(experts));
  bad = SliceMismatches(**s, dumps, true, false, &compared);
  int split = 0;
  for (const auto& [name, dim] : dumps[0].split) split += dim >= 0 && !IsExpert(name) ? 1 : 0;
  EXPECT_GE(split, 5);
  EXPECT_EQ(bad.size(), static_cast<size_t>(split * 2 * 4)) << absl::StrJoin(bad, "\n");
}

// `a` and `b` (contiguous) joined on dim `dim`.
torch::Tensor Cat(const torch::Tensor& a, const torch::Tensor& b, int dim) {
  std::vector<int64_t> shape = a.sizes();
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const size_t item = torch::ItemSize(a.dtype());
  const std::string x = a.ContiguousBytes(), y = b.ContiguousBytes();
  const size_t ca = a.sizes()[dim] * inner * item, cb = b.sizes()[dim] * inner * item;
  std::string out;
  for (int64_t o = 0; o < outer; ++o) {
    out += x.substr(o * ca, ca);
    out += y.substr(o * cb, cb);
  }
  shape[dim] += b.sizes()[dim];
  return *torch::Tensor::FromBytes(a.dtype(), shape, out);
}

// The full tensor of `name`'s `state` by the dumps: an expert as its ep
// rank holds it; a dense param tp rank 0's and 1's slices joined on the dim
// the model split it on, or (not split) tp rank 0's, checked equal to tp
// rank 1's.
torch::Tensor Expected(const std::vector<Dump>& dumps, const std::string& name, const std::string& state) {
  std::string prefix, suffix;
  int id = 0;
  if (deepspeed_moe::SplitExpertName(name, &prefix, &id, &suffix)) return dumps[id].params.at(name).at(state);
  const torch::Tensor& a = dumps[0].params.at(name).at(state);
  const torch::Tensor& b = dumps[1].params.at(name).at(state);
  const int dim = dumps[0].split.at(name);
  if (dim < 0) {
    EXPECT_TRUE(a.BitwiseEqual(b)) << name << " " << state << ": not split, but tp ranks 0 and 1 differ";
    return a;
  }
  return Cat(a, b, dim);
}

// Every param of a tp 1 checkpoint (Full) against the dumps; returns the
// params compared.
int CompareFull(const std::string& dir, const std::vector<Dump>& dumps) {
  auto st = OpenModelState(dir, SourceOptions(), false);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return 0;
  EXPECT_EQ((*st)->info().source_topology.tp, 1);
  int n = 0;
  for (const state::ParamState& p : (*st)->info().params) {
    for (const std::string& state : kStates) {
      auto full = (*st)->Full(p, state);
      EXPECT_TRUE(full.ok()) << p.name << " " << state << ": " << full.status();
      if (!full.ok()) continue;
      auto got = full->Materialize();
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok()) continue;
      EXPECT_TRUE(got->BitwiseEqual(Expected(dumps, p.name, state))) << dir << ": " << p.name << " " << state;
    }
    ++n;
  }
  return n;
}

TEST_P(MoeTpSaveTest, ToTp1IsTheDumpsJoined) {
  const std::vector<Dump> dumps = ReadDumps(GetParam());
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kRanks));
  const std::string root = FreshTempDir("moe_tp_reshard");
  for (int dp : {2, 1}) {
    ReshardOptions o;
    o.input_folder = RunfilePath(absl::StrCat(GetParam(), "/global_step3"));
    o.output_folder = JoinPath(root, absl::StrCat("dp", dp, "/global_step3"));
    o.write.target = state::Topology{1, 1, dp};
    o.write.num_threads = 2;
    auto r = Reshard(o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(CompareFull(o.output_folder, dumps), 10 + 2 * 4) << "dp " << dp;
    // ep 2 at dp 2 (as the source), 1 at dp 1; each expert file once, under mp_rank_00.
    for (int e = 0; e < 2; ++e) {
      EXPECT_TRUE(PathExists(JoinPath(o.output_folder, absl::StrCat("layer_0_expert_", e, "_mp_rank_00_model_states.pt"))));
    }
    EXPECT_FALSE(PathExists(JoinPath(o.output_folder, "mp_rank_01_model_states.pt")));
  }
}

// `ucp rules --suggest`: nothing left to suggest. The router is decided by
// ucp's rule for DeepSpeed's own modules (not by its equal tp copies), and
// the whole experts need no rule.
TEST(MoeTpRulesTest, NothingToSuggestForTheRouterOrTheExperts) {
  auto r = SuggestRules(RunfilePath(absl::StrCat(kSave, "/global_step3")), SourceOptions());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->undecided_params, 0);
  EXPECT_EQ(r->replicated_by_evidence, 0);
  EXPECT_TRUE(r->suggestions.empty()) << r->text;
  EXPECT_EQ(r->text.find("deepspeed_experts"), std::string::npos) << r->text;
}

// `ucp reshard` of the save to tp 2 at `dp` and `ep` into `root`/NAME/global_step3.
std::string ReshardToTp2(const std::string& input, const std::string& root, const std::string& name, int dp, int ep,
                         const std::string& rules_file = "") {
  ReshardOptions o;
  o.input_folder = input;
  o.output_folder = JoinPath(root, absl::StrCat(name, "/global_step3"));
  o.write.target = state::Topology{2, 1, dp};
  o.write.expert_parallel = ep;
  o.write.num_threads = 2;
  o.zero_source.rules.rules_file = rules_file;
  auto r = Reshard(o);
  EXPECT_TRUE(r.ok()) << name << ": " << r.status();
  return o.output_folder;
}

// The tp 2 output `dir` read back: every tp slice and expert bitwise what the
// saving job's ranks held (the dumps), as the reader test checks the save.
void ExpectTheDumps(const std::string& dir, const std::vector<Dump>& dumps, int dp) {
  auto s = deepspeed_moe::MoeState::Open(dir);
  ASSERT_TRUE(s.ok()) << dir << ": " << s.status();
  EXPECT_EQ((*s)->info().source_topology.tp, 2) << dir;
  EXPECT_EQ((*s)->info().source_topology.dp, dp) << dir;
  EXPECT_EQ((*s)->info().expert_parallel, 2) << dir;
  int compared = 0;
  const std::vector<std::string> bad = SliceMismatches(**s, dumps, false, false, &compared);
  EXPECT_TRUE(bad.empty()) << dir << ":\n" << absl::StrJoin(bad, "\n");
  EXPECT_EQ(compared, (10 * 2 + 2 * 4) * 4) << dir;
}

// ucp writes native MoE at tp 2 as DeepSpeed 0.19.5 does: resharded to its
// own topology (tp 2 dp 2 ep 2) the save comes back file for file (keys in
// order, values, tensors bitwise); at dp 1 every slice is still the dumps'.
TEST_P(MoeTpSaveTest, ToTp2IsTheSaveItself) {
  const std::vector<Dump> dumps = ReadDumps(GetParam());
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kRanks));
  const std::string input = RunfilePath(absl::StrCat(GetParam(), "/global_step3"));
  const std::string root = FreshTempDir("moe_tp_to_tp2");
  const std::string same = ReshardToTp2(input, root, "dp2", 2, 2);
  auto diff = ucp::testing::CompareFolders(input, same);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_TRUE(diff->empty()) << absl::StrJoin(*diff, "\n");
  ExpectTheDumps(same, dumps, 2);
  const std::string dp1 = ReshardToTp2(input, root, "dp1", 1, 2);
  ExpectTheDumps(dp1, dumps, 1);
  auto files = ucp::testing::ListFilesRecursive(dp1);
  ASSERT_TRUE(files.ok()) << files.status();
  // (0.18.9: the expert optimizer placeholders, each under its writer's tp rank)
  const std::string expp = std::string(GetParam()) == kSave0189
                               ? "expp_rank_0_mp_rank_00_optim_states.pt expp_rank_1_mp_rank_01_optim_states.pt "
                               : "";
  EXPECT_EQ(absl::StrJoin(*files, " "),
            expp + "layer_0_expert_0_mp_rank_00_model_states.pt layer_0_expert_1_mp_rank_01_model_states.pt "
                   "mp_rank_00_model_states.pt mp_rank_01_model_states.pt zero_pp_rank_0_mp_rank_00_optim_states.pt "
                   "zero_pp_rank_0_mp_rank_01_optim_states.pt");
}

// tp 2 -> tp 1 -> tp 2: the save again, file for file. A tp 1 checkpoint
// cannot say how the router splits (one copy): ucp knows DeepSpeed's router
// is replicated (rules::DeepSpeedModuleRules), so no rules file is needed;
// a rules file that says otherwise is obeyed (and the result is not the save).
TEST_P(MoeTpSaveTest, Tp1ToTp2RoundTripIsTheSave) {
  const std::vector<Dump> dumps = ReadDumps(GetParam());
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kRanks));
  const std::string input = RunfilePath(absl::StrCat(GetParam(), "/global_step3"));
  const std::string root = FreshTempDir("moe_tp_round_trip");
  ReshardOptions o;
  o.input_folder = input;
  o.output_folder = JoinPath(root, "tp1/global_step3");
  o.write.target = state::Topology{1, 1, 2};
  ASSERT_TRUE(Reshard(o).ok());
  const std::string back = ReshardToTp2(o.output_folder, root, "back", 2, 2);
  auto diff = ucp::testing::CompareFolders(input, back);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_TRUE(diff->empty()) << absl::StrJoin(*diff, "\n");
  ExpectTheDumps(back, dumps, 2);
  // A rules file overrides ucp's own rule: the router split over tp (COLUMN).
  const std::string rules = JoinPath(root, "gate.textproto");
  ASSERT_TRUE(
      WriteFileAtomic(rules, R"(rule { pattern: ".*\\.deepspeed_moe\\.gate\\.wg\\.weight$" kind: COLUMN })").ok());
  const std::string split = ReshardToTp2(o.output_folder, root, "split", 2, 2, rules);
  auto differs = ucp::testing::CompareFolders(input, split);
  ASSERT_TRUE(differs.ok()) << differs.status();
  EXPECT_FALSE(differs->empty());
  bool names_router = false;
  for (const std::string& d : *differs) names_router |= d.find("gate.wg.weight") != std::string::npos;
  EXPECT_TRUE(names_router) << absl::StrJoin(*differs, "\n");
}

// DeepSpeed 0.14.4 at tp 2 dp 2 ep 4 (testdata/moe_tp/ds0144_tp2_ep4_zero1_dp2):
// before 0.14.5 each rank's param_slice_mappings of an expert group list a
// window of padded numel / dp (here half the group) at its expert data
// parallel index, not its partition. Read (the groups rebuilt from the
// expert files and every rank's window) and written at tp 2 in that
// version's files, directly and through tp 1 dp 4 ep 2, it is DeepSpeed's
// own save file for file.
TEST(MoeTpWriterTest, WindowsOf0144AtTp2AreTheSave) {
  const std::string input = RunfilePath("testdata/moe_tp/ds0144_tp2_ep4_zero1_dp2/global_step3");
  const std::string root = FreshTempDir("moe_tp_0144");
  const std::string same = ReshardToTp2(input, root, "same", 2, 4);
  auto diff = ucp::testing::CompareFolders(input, same);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_TRUE(diff->empty()) << absl::StrJoin(*diff, "\n");
  ReshardOptions o;
  o.input_folder = input;
  o.output_folder = JoinPath(root, "tp1/global_step3");
  o.write.target = state::Topology{1, 1, 4};
  o.write.expert_parallel = 2;
  ASSERT_TRUE(Reshard(o).ok());
  const std::string back = ReshardToTp2(o.output_folder, root, "back", 2, 4);
  diff = ucp::testing::CompareFolders(input, back);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_TRUE(diff->empty()) << absl::StrJoin(*diff, "\n");
}

// Negative controls of the two tests above: the same comparisons fail for
// a writer that swapped the tp ranks or the ep ranks (every split param /
// every expert differs; tp rank 1's model states are not tp rank 0's).
TEST(MoeTpWriterTest, SwappedTpOrEpRanksOfTheOutputAreDetected) {
  const std::vector<Dump> dumps = ReadDumps();
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kRanks));
  const std::string input = RunfilePath(absl::StrCat(kSave, "/global_step3"));
  const std::string out = ReshardToTp2(input, FreshTempDir("moe_tp_to_tp2_swapped"), "dp1", 1, 2);
  auto s = deepspeed_moe::MoeState::Open(out);
  ASSERT_TRUE(s.ok()) << s.status();
  int compared = 0;
  std::vector<std::string> bad = SliceMismatches(**s, dumps, false, true, &compared);
  int experts = 0;
  for (const std::string& b : bad) experts += IsExpert(b) ? 1 : 0;
  EXPECT_EQ(experts, 2 * 4 * 4) << absl::StrJoin(bad, "\n");
  EXPECT_EQ(bad.size(), static_cast<size_t>(experts));
  bad = SliceMismatches(**s, dumps, true, false, &compared);
  int split = 0;
  for (const auto& [name, dim] : dumps[0].split) split += dim >= 0 && !IsExpert(name) ? 1 : 0;
  EXPECT_GE(split, 5);
  EXPECT_EQ(bad.size(), static_cast<size_t>(split * 2 * 4)) << absl::StrJoin(bad, "\n");
  auto diff = ucp::testing::CompareFiles(JoinPath(input, "mp_rank_01_model_states.pt"),
                                         JoinPath(out, "mp_rank_00_model_states.pt"));
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_FALSE(diff->empty());
}

// What ucp does not write stays refused, saying what it expects and what it
// found, before anything is written: ep < tp (tp ranks >= ep would have no
// model states), pp > 1 of a module that is not a PipelineModule (its names
// carry no layer index to cut stages by).
TEST(MoeTpWriterTest, WhatCannotBeWrittenIsRefused) {
  const std::string root = FreshTempDir("moe_tp_refused");
  struct Refused {
    state::Topology target;
    int ep;
    std::string version;
    std::string message;
  };
  const std::vector<Refused> cases = {
      {state::Topology{2, 1, 2}, 1, "",
       "--expert_parallel=1 at tp=2: expected an expert parallel degree >= tp (found 1 < 2): DeepSpeed writes a tp "
       "rank's model states on expert data parallel rank 0 only, so tp ranks >= ep would have none and DeepSpeed "
       "could not load the checkpoint"},
      {state::Topology{2, 2, 1}, 2, "",
       "mixture-of-experts target tp=2 pp=2 dp=1: param 'sequential.0.word_embeddings.weight' has no pipeline layer "
       "index (expected '<layer>.<name>', the names of a DeepSpeed PipelineModule): only a PipelineModule's "
       "checkpoint can be cut into pipeline stages"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    ReshardOptions o;
    o.input_folder = RunfilePath(absl::StrCat(kSave, "/global_step3"));
    o.output_folder = JoinPath(root, absl::StrCat(i, "/global_step3"));
    o.write.target = cases[i].target;
    o.write.expert_parallel = cases[i].ep;
    o.write.target_ds_version = cases[i].version;
    auto r = Reshard(o);
    ASSERT_FALSE(r.ok()) << i;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_EQ(r.status().message(), cases[i].message);
    EXPECT_FALSE(PathExists(o.output_folder)) << i;
  }
}

TEST_P(MoeTpSaveTest, ExportIsTheDumpsJoined) {
  const std::vector<Dump> dumps = ReadDumps(GetParam());
  ASSERT_EQ(dumps.size(), static_cast<size_t>(kRanks));
  ExportOptions o;
  o.input_folder = RunfilePath(absl::StrCat(GetParam(), "/global_step3"));
  o.output_folder = JoinPath(FreshTempDir("moe_tp_export"), "out");
  auto r = Export(o);
  ASSERT_TRUE(r.ok()) << r.status();
  auto st = safetensors::SafetensorsFile::Open(JoinPath(o.output_folder, "model.safetensors"));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ((*st)->tensors().size(), 10u + 2 * 4);
  std::set<std::string> names;  // rank 0 holds expert 0, rank 1 expert 1
  for (int r : {0, 1}) {
    for (const auto& [name, e] : dumps[r].params) names.insert(name);
  }
  int equal = 0;
  for (const std::string& n : names) {
    auto got = (*st)->GetTensor(n);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status();
    const bool eq = got->BitwiseEqual(Expected(dumps, n, "fp32"));
    EXPECT_TRUE(eq) << n;
    equal += eq ? 1 : 0;
  }
  EXPECT_EQ(equal, 10 + 2 * 4);
}

INSTANTIATE_TEST_SUITE_P(Saves, MoeTpSaveTest, ::testing::Values(kSave, kSave0189),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param).find("0189") != std::string::npos ? "ds0189" : "ds0195";
                         });

}  // namespace
}  // namespace ucp::ops
