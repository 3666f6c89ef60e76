// Native DeepSpeed mixture-of-experts conformance (conformance/moe_gen.h), on
// random MoE models (RapidCheck; UCP_MOE_CASES cases, 100 by default):
//
//   SaveIsDeepSpeedsMoeLayout: save(M, dp, ep) holds, by formulas computed
//     here independently of the writer and of layout_math (engine.py
//     _save_moe_checkpoint, stage_1_and_2.py partitioning over dp for the
//     base groups and over the expert data parallel ranks dp / ep for the
//     expert groups, DeepSpeed's E + D rank order), every file DeepSpeed
//     writes: the module without experts, each expert's file under global
//     names, each dp rank's optimizer file with its ep rank's local experts
//     under local names, the fp32 / exp_avg / exp_avg_sq values of every
//     param (experts included) at the right offsets, group_paddings,
//     partition_count, param_slice_mappings, steps, the version's keys.
//   ReshardMatchesSave: reshard(save(M, T1), dp2, --expert_parallel=ep2,
//     --target_ds_version=V2) == save(M, T2) for V2, every file byte for byte.
//   RoundTripIsBitwise: reshard back to T1 for V1 gives save(M, T1) again.
//   ReadBackIsTheModel: ucp's MoE reader gives every param's (every
//     expert's) fp32 / exp_avg / exp_avg_sq and each group's step of M.
//
// And against the real fixture deepspeed-0.19.5/gpt-moe-ep2-zero2-dp2: the
// generator at its model and topology lays files out as DeepSpeed did; the
// layout of DeepSpeed before 0.19.3 (no param_shapes in the MoE model states)
// is refused with the version named.
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "conformance/layout_diff.h"
#include "conformance/moe_gen.h"
#include "conformance/properties.h"
#include "format/pickle/accessors.h"
#include "format/torch/torch_file.h"
#include "format/torch/tree_copy.h"
#include "format/torch/torch_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "rapidcheck.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"

namespace ucp::conformance {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr char kInfix[] = ".deepspeed_moe.experts.deepspeed_experts.";

int Cases() {
  int n = 100;
  if (const char* s = std::getenv("UCP_MOE_CASES")) (void)absl::SimpleAtoi(s, &n);
  return n;
}

std::vector<std::string> Keys(const Value& d) {
  std::vector<std::string> k;
  for (const auto& [key, v] : d.dict_items()) k.push_back(key->is(Kind::kStr) ? key->str() : key->DebugString());
  return k;
}

std::tuple<int, int, int> Version(const std::string& v) {
  int a = 0, b = 0, c = 0;
  (void)sscanf(v.c_str(), "%d.%d.%d", &a, &b, &c);
  return {a, b, c};
}

// The model's params in module order, as the oracle sees them.
struct OracleParam {
  std::string name;       // global
  std::string prefix;     // experts: "h.<i>.moe"
  int layer = -1;         // MoE layer index (experts)
  int expert = -1;        // global expert id
  std::string suffix;     // experts: "fc.weight", ...
  int group = 0;
};

std::vector<OracleParam> OracleParams(const SyntheticMoeState& m) {
  std::vector<OracleParam> out;
  std::map<std::string, int> layer_of;
  for (size_t l = 0; l < m.info().moe_layers.size(); ++l) layer_of[m.info().moe_layers[l].prefix] = static_cast<int>(l);
  for (const auto& mk : m.info().module_order) {
    OracleParam p;
    p.name = mk.name;
    p.group = m.info().Find(mk.name)->group;
    const size_t at = mk.name.find(kInfix);
    if (at != std::string::npos) {
      p.prefix = mk.name.substr(0, at);
      const std::string rest = mk.name.substr(at + std::string(kInfix).size());
      p.expert = std::stoi(rest.substr(0, rest.find('.')));
      p.suffix = rest.substr(rest.find('.') + 1);
      p.layer = layer_of.at(p.prefix);
    }
    out.push_back(p);
  }
  return out;
}

// What differs between the folder and DeepSpeed's MoE layout of M at dp / ep
// for `version` (0.19.3 and later).
std::vector<std::string> MoeLayoutDiffs(const SyntheticMoeState& m, const std::string& dir, int dp, int ep,
                                        const std::string& version) {
  std::vector<std::string> diffs;
  auto diff = [&](const std::string& f, const std::string& what) {
    if (diffs.size() < 20) diffs.push_back(absl::StrCat(f, ": ", what));
  };
  const MoeCase& c = m.moe_case();
  const state::ModelInfo& info = m.info();
  const std::vector<OracleParam> params = OracleParams(m);
  const bool per_rank = Version(version) >= std::make_tuple(0, 16, 4);
  const bool parallel_dims = Version(version) >= std::make_tuple(0, 19, 5);
  // 0.19.3 made the MoE model states the common checkpoint state.
  const bool common = Version(version) >= std::make_tuple(0, 19, 3);
  const bool autoep = Version(version) >= std::make_tuple(0, 19, 2);
  // stage_1_and_2.py _link_all_hp_params before 0.14.5: partition size
  // flat / (whole dp world), start (rank in the group's dp group) * that.
  const bool world_window = Version(version) < std::make_tuple(0, 14, 5);
  auto lp_of = [&](const std::string& name) -> torch::Tensor {
    return *torch::Cast(*m.Tensor(name, "fp32"), info.lp_dtype);
  };
  // Files.
  std::set<std::string> want_files = {"mp_rank_00_model_states.pt"};
  for (size_t l = 0; l < info.moe_layers.size(); ++l) {
    for (int e = 0; e < info.moe_layers[l].num_experts; ++e) {
      want_files.insert(absl::StrCat("layer_", l, "_expert_", e, "_mp_rank_00_model_states.pt"));
    }
  }
  for (int d = 0; d < dp; ++d) want_files.insert(absl::StrCat("zero_pp_rank_", d, "_mp_rank_00_optim_states.pt"));
  // Up to 0.19.4 every ep rank's first expert data parallel rank saves an
  // expert optimizer file; with ZeRO it holds {'optimizer': None}.
  const bool expp = Version(version) < std::make_tuple(0, 19, 5);
  if (expp) {
    for (int e = 0; e < ep; ++e) want_files.insert(absl::StrCat("expp_rank_", e, "_mp_rank_00_optim_states.pt"));
  }
  auto listed = ListDirectory(dir);
  if (!listed.ok()) return {absl::StrCat(dir, ": ", listed.status().ToString())};
  std::set<std::string> got_files;
  for (const auto& f : *listed) {
    if (f != kUcpOutputMarker) got_files.insert(f);
  }
  if (got_files != want_files) {
    diff(dir, absl::StrCat("files [", absl::StrJoin(got_files, ", "), "], DeepSpeed's [", absl::StrJoin(want_files, ", "), "]"));
    return diffs;
  }
  // Each group on ep rank `e`: its params (global) and their file names (local ids).
  struct Member {
    std::string global, local;
  };
  auto members = [&](int g, int e) {
    std::vector<Member> out;
    for (const OracleParam& p : params) {
      if (p.group != g) continue;
      if (p.layer < 0) {
        out.push_back({p.name, p.name});
        continue;
      }
      const int local = info.moe_layers[p.layer].num_experts / ep;
      if (p.expert / local != e) continue;  // ep rank e holds global experts e * local ..
      out.push_back({p.name, absl::StrCat(p.prefix, kInfix, p.expert % local, ".", p.suffix)});
    }
    return out;
  };
  // mp_rank_00: the common state, num_experts, ds_autoep_layers, client state.
  {
    const std::string name = "mp_rank_00_model_states.pt";
    auto f = torch::TorchFile::Open(JoinPath(dir, name));
    if (!f.ok()) return {f.status().ToString()};
    const Value& root = *(*f)->root();
    std::vector<std::string> keys = {"module"};
    if (common) {
      for (const char* k : {"buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
                            "frozen_param_fragments"}) {
        keys.push_back(k);
      }
    }
    for (const char* k : {"lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names", "skipped_steps",
                          "global_steps", "global_samples", "dp_world_size", "mp_world_size"}) {
      keys.push_back(k);
    }
    if (common && parallel_dims) keys.push_back("checkpoint_parallel_dimensions");
    if (common) {
      keys.push_back("ds_config");
      keys.push_back("ds_version");
    }
    keys.push_back("num_experts");
    if (autoep) keys.push_back("ds_autoep_layers");
    keys.push_back("iteration");
    if (Keys(root) != keys) diff(name, absl::StrCat("keys [", absl::StrJoin(Keys(root), ", "), "]"));
    if (common && (root.DictGet("ds_version") == nullptr || root.DictGet("ds_version")->str() != version)) {
      diff(name, absl::StrCat("ds_version is not ", version));
    }
    if (root.DictGet("dp_world_size") == nullptr || root.DictGet("dp_world_size")->int_value() != dp) {
      diff(name, "dp_world_size is not dp");
    }
    std::vector<int64_t> ne;
    if (const Value* n = root.DictGet("num_experts"); n != nullptr && n->is(Kind::kList)) {
      for (const auto& v : n->items()) ne.push_back(v->int_value());
    }
    std::vector<int64_t> want_ne;
    for (const auto& l : info.moe_layers) want_ne.push_back(l.num_experts);
    if (ne != want_ne) diff(name, "num_experts is not each MoE layer's expert count");
    const Value* module = root.DictGet("module");
    std::vector<std::string> want_module;
    for (const OracleParam& p : params) {
      if (p.layer < 0) want_module.push_back(p.name);
    }
    if (module == nullptr || Keys(*module) != want_module) {
      diff(name, "module is not the non-expert params in module order");
    } else {
      for (const std::string& n : want_module) {
        auto t = (*f)->GetTensor(*module->DictGet(n));
        if (!t.ok() || !t->BitwiseEqual(lp_of(n))) diff(name, absl::StrCat("module['", n, "'] is not the model's"));
      }
    }
    const Value* shapes = root.DictGet("param_shapes");
    if (!common) {
      // no param_shapes before 0.19.3 (checked with the keys)
    } else if (shapes == nullptr || !shapes->is(Kind::kList) || static_cast<int>(shapes->items().size()) != info.num_groups) {
      diff(name, "param_shapes is not one dict per group");
    } else {
      for (int g = 0; g < info.num_groups; ++g) {
        std::vector<std::string> want;
        for (const Member& mb : members(g, 0)) want.push_back(mb.local);
        const Value& d = *shapes->items()[g];
        if (Keys(d) != want) diff(name, absl::StrCat("param_shapes[", g, "] names are not ep rank 0's (local ids)"));
        for (const auto& [k, v] : d.dict_items()) {
          if (!v->is(Kind::kTuple)) diff(name, absl::StrCat("param_shapes[", g, "]['", k->str(), "'] is not a tuple"));
        }
      }
    }
  }
  // Expert files: global names, lp weights.
  for (size_t l = 0; l < info.moe_layers.size(); ++l) {
    for (int e = 0; e < info.moe_layers[l].num_experts; ++e) {
      const std::string name = absl::StrCat("layer_", l, "_expert_", e, "_mp_rank_00_model_states.pt");
      auto f = torch::TorchFile::Open(JoinPath(dir, name));
      if (!f.ok()) {
        diff(name, f.status().ToString());
        continue;
      }
      std::vector<std::string> want;
      for (const OracleParam& p : params) {
        if (p.layer == static_cast<int>(l) && p.expert == e) want.push_back(p.name);
      }
      if (Keys(*(*f)->root()) != want) diff(name, "keys are not the expert's params (global names)");
      for (const std::string& n : want) {
        const Value* v = (*f)->root()->DictGet(n);
        auto t = v ? (*f)->GetTensor(*v) : absl::StatusOr<torch::Tensor>(absl::NotFoundError(n));
        if (!t.ok() || !t->BitwiseEqual(lp_of(n))) diff(name, absl::StrCat("'", n, "' is not the model's weight"));
      }
    }
  }
  for (int e = 0; expp && e < ep; ++e) {
    const std::string name = absl::StrCat("expp_rank_", e, "_mp_rank_00_optim_states.pt");
    auto f = torch::TorchFile::Open(JoinPath(dir, name));
    if (!f.ok() || Keys(*(*f)->root()) != std::vector<std::string>{"optimizer"} ||
        !(*f)->root()->DictGet("optimizer")->is_none()) {
      diff(name, "is not {'optimizer': None}");
    }
  }
  // Optimizer files.
  for (int d = 0; d < dp; ++d) {
    const std::string name = absl::StrCat("zero_pp_rank_", d, "_mp_rank_00_optim_states.pt");
    auto f = torch::TorchFile::Open(JoinPath(dir, name));
    if (!f.ok()) {
      diff(name, f.status().ToString());
      continue;
    }
    const Value& root = *(*f)->root();
    const Value* osd = root.DictGet("optimizer_state_dict");
    if (Keys(root) != std::vector<std::string>{"optimizer_state_dict", "ds_config", "ds_version"} || osd == nullptr) {
      diff(name, "top-level keys");
      continue;
    }
    if (Keys(*osd) != std::vector<std::string>{"loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad",
                                               "base_optimizer_state", "single_partition_of_fp32_groups", "zero_stage",
                                               "group_paddings", "partition_count", "ds_version",
                                               "param_slice_mappings"}) {
      diff(name, "optimizer_state_dict keys");
      continue;
    }
    for (const Value* v : {root.DictGet("ds_version"), osd->DictGet("ds_version")}) {
      if (!v->is(Kind::kStr) || v->str() != version) diff(name, absl::StrCat("ds_version is not ", version));
    }
    auto stage = pickle::AsZeroStage(*osd->DictGet("zero_stage"));
    if (!stage.ok() || *stage != c.zero_stage) diff(name, "zero_stage");
    const Value* groups = osd->DictGet("base_optimizer_state")->DictGet("param_groups");
    const Value* states = osd->DictGet("base_optimizer_state")->DictGet("state");
    for (int g = 0; g < info.num_groups; ++g) {
      const bool expert = m.ExpertGroup(g);
      const int parts = expert ? dp / ep : dp;
      const int rank = expert ? d / ep : d;  // E + D: dp rank d is ep rank d % ep
      const std::vector<Member> mb = members(g, expert ? d % ep : 0);
      std::vector<torch::Tensor> full;
      int64_t numel = 0;
      for (const Member& x : mb) numel += m.Tensor(x.global, "fp32")->numel();
      const int64_t align = 2 * static_cast<int64_t>(parts);
      const int64_t padded = (numel + align - 1) / align * align, part = padded / parts;
      const int64_t padding = !per_rank ? (rank == parts - 1 ? padded - numel : 0)
                              : numel <= rank * part ? part
                                                     : std::max<int64_t>(0, (rank + 1) * part - numel);
      if (osd->DictGet("group_paddings")->items()[g]->int_value() != padding) {
        diff(name, absl::StrCat("group_paddings[", g, "] is ", osd->DictGet("group_paddings")->items()[g]->int_value(),
                                ", DeepSpeed's ", padding));
      }
      if (osd->DictGet("partition_count")->items()[g]->int_value() != parts) {
        diff(name, absl::StrCat("partition_count[", g, "] is not ", parts));
      }
      const Value& pg = *groups->items()[g];
      if (expert && (pg.DictGet("name") == nullptr || pg.DictGet("name")->str() != absl::StrCat("ep_size_", ep) ||
                     pg.DictGet("moe") == nullptr || !pg.DictGet("moe")->bool_value())) {
        diff(name, absl::StrCat("param_groups[", g, "] is not named ep_size_", ep, " with moe True"));
      }
      const Value* st = states->DictGet(Value::Int(g));
      auto step = (*f)->GetTensor(*st->DictGet("step"));
      if (!step.ok() || *reinterpret_cast<const float*>(step->data()) != static_cast<float>(m.Step(g))) {
        diff(name, absl::StrCat("step of group ", g));
      }
      // The flat values of the group, then the rank's window.
      const int64_t lo = rank * part;
      std::vector<std::string> want_names;
      for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
        std::string flat;
        for (const Member& x : mb) flat += m.Tensor(x.global, state)->ContiguousBytes();
        flat.resize(static_cast<size_t>(padded) * 4, '\0');
        const Value* tv = state == "fp32" ? osd->DictGet("single_partition_of_fp32_groups")->items()[g].get()
                                          : st->DictGet(state);
        auto t = (*f)->GetTensor(*tv);
        const int64_t stop = part - padding;
        const int64_t want_numel = state == "fp32" ? (stop >= 0 ? stop : std::max<int64_t>(0, part + stop)) : part;
        if (!t.ok() || t->numel() != want_numel) {
          diff(name, absl::StrCat(state, " of group ", g, " has ", t.ok() ? t->numel() : -1, " elements, DeepSpeed's ",
                                  want_numel));
          continue;
        }
        if (t->ContiguousBytes() != flat.substr(static_cast<size_t>(lo) * 4, static_cast<size_t>(want_numel) * 4)) {
          diff(name, absl::StrCat(state, " of group ", g, " does not hold the model's values at [", lo, ", ",
                                  lo + want_numel, ")"));
        }
      }
      // param_slice_mappings: the params overlapping the window, by file name
      // (before 0.14.5 an expert group's window is sized by the whole dp).
      std::vector<std::string> got_names;
      const Value& mapping = *osd->DictGet("param_slice_mappings")->items()[g];
      const int64_t wsize = expert && world_window ? padded / dp : part;
      const int64_t wlo = rank * wsize;
      int64_t offset = 0;
      for (const Member& x : mb) {
        const int64_t n = m.Tensor(x.global, "fp32")->numel();
        const int64_t start = std::max(offset, wlo), end = std::min(offset + n, wlo + wsize);
        if (start < end) {
          want_names.push_back(x.local);
          const Value* a = mapping.DictGet(x.local);
          auto addr = a ? pickle::AsFragmentAddress(*a) : absl::StatusOr<pickle::FragmentAddress>(absl::NotFoundError(""));
          if (!addr.ok() || addr->numel != end - start || addr->start != start - wlo) {
            diff(name, absl::StrCat("param_slice_mappings[", g, "]['", x.local, "'] is not fragment_address(numel=",
                                    end - start, ", start=", start - wlo, ")"));
          }
        }
        offset += n;
      }
      if (Keys(mapping) != want_names) diff(name, absl::StrCat("param_slice_mappings[", g, "] names"));
    }
  }
  return diffs;
}

// Whether the files of M saved at dp / ep for `version` list every expert
// param in some rank's mappings: before 0.14.5 at ep > 1 every rank's
// mappings of an expert group list only the params overlapping
// [k * padded / dp, (k + 1) * padded / dp) (k its expert data parallel rank).
// A (layer, param) no window lists may still be placed by the partition
// sizes (the reader tries), or be refused: only then. Computed here from the
// model, independently of the reader.
bool ExpertGroupsListed(const SyntheticMoeState& m, int dp, int ep, const std::string& version) {
  if (!(Version(version) < std::make_tuple(0, 14, 5)) || ep == 1) return true;
  const state::ModelInfo& info = m.info();
  std::set<std::pair<std::string, std::string>> all, listed;
  int expert_groups = 0;
  for (int g = 0; g < info.num_groups; ++g) {
    if (!m.ExpertGroup(g)) continue;
    ++expert_groups;
    // The group on ep rank 0: its local experts in module order.
    std::vector<std::pair<std::pair<std::string, std::string>, int64_t>> members;
    for (const OracleParam& p : OracleParams(m)) {
      if (p.group != g || p.layer < 0) continue;
      all.insert({p.prefix, p.suffix});
      if (p.expert >= info.moe_layers[p.layer].num_experts / ep) continue;
      members.push_back({{p.prefix, p.suffix}, m.Tensor(p.name, "fp32")->numel()});
    }
    int64_t numel = 0;
    for (const auto& x : members) numel += x.second;
    const int parts = dp / ep;
    const int64_t align = 2 * static_cast<int64_t>(parts);
    const int64_t padded = (numel + align - 1) / align * align, size = padded / dp;
    for (int k = 0; k < parts; ++k) {
      int64_t offset = 0;
      for (const auto& x : members) {
        if (std::max(offset, k * size) < std::min(offset + x.second, (k + 1) * size)) listed.insert(x.first);
        offset += x.second;
      }
    }
  }
  (void)expert_groups;
  return listed == all;
}

// ucp reads every param of M back from `dir`.
std::vector<std::string> ReadBackDiffs(const SyntheticMoeState& m, const std::string& dir) {
  ops::SourceOptions whole;
  whole.tp1_whole_tensors = true;
  auto s = ops::OpenModelState(dir, whole, false);
  if (!s.ok()) return {s.status().ToString()};
  std::vector<std::string> diffs;
  if ((*s)->info().params.size() != m.info().params.size()) diffs.push_back("param count");
  for (const auto& p : m.info().params) {
    const state::ParamState* q = (*s)->info().Find(p.name);
    if (q == nullptr) {
      diffs.push_back(absl::StrCat(p.name, ": not read"));
      continue;
    }
    if (q->group != p.group) diffs.push_back(absl::StrCat(p.name, ": group ", q->group, " vs ", p.group));
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto want = m.Full(p, state);
      auto got = (*s)->Full(*q, state);
      auto eq = want.ok() && got.ok() ? tp::TensorPlan::BitwiseEqual(*want, *got) : absl::StatusOr<bool>(false);
      if (!eq.ok() || !*eq) diffs.push_back(absl::StrCat(p.name, "/", state, " differs"));
    }
  }
  for (int g = 0; g < m.info().num_groups; ++g) {
    auto v = (*s)->GroupScalar(g, "step");
    auto t = v.ok() && v->value ? v->file->GetTensor(*v->value) : absl::StatusOr<torch::Tensor>(absl::NotFoundError(""));
    if (!t.ok() || *reinterpret_cast<const float*>(t->data()) != static_cast<float>(m.Step(g))) {
      diffs.push_back(absl::StrCat("step of group ", g));
    }
  }
  return diffs;
}

// `piece_bytes`: ZeroWriteOptions::piece_bytes (-1: each optimizer file one
// unit; small: in many pieces, written by `threads` threads).
absl::StatusOr<std::string> Reshard(const std::string& in, const std::string& out, int dp, int ep,
                                    const std::string& version, int64_t piece_bytes = -1, int threads = 1) {
  ops::ReshardOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.target = state::Topology{1, 1, dp};
  o.write.expert_parallel = ep;
  o.write.target_ds_version = version;
  o.write.num_threads = threads;
  o.write.piece_bytes = piece_bytes;
  UCP_RETURN_IF_ERROR(ops::Reshard(o).status());
  return out;
}

std::string Tag(const SyntheticMoeState& m) { return absl::StrCat("global_step", static_cast<int64_t>(m.Step(0))); }

TEST(MoeConformanceTest, Properties) {
  std::map<std::string, std::map<std::string, int>> dist;
  int cases = 0;
  const std::string scratch = DefaultScratchDir("moe_conformance");
  auto property = [&]() {
    const MoeCase c = *GenMoeCase();
    ++cases;
    ++dist["dp1/ep1"][absl::StrCat(c.dp1, "/", c.ep1)];
    ++dist["dp2/ep2"][absl::StrCat(c.dp2, "/", c.ep2)];
    ++dist["experts"][absl::StrJoin(c.experts, ",")];
    ++dist["optimizer"][absl::StrCat(c.lp_dtype, "/zero", c.zero_stage, "/groups", 2 * c.base_groups)];
    ++dist["ds_version T1->T2"][absl::StrCat(c.ds_version, "->", c.target_ds_version)];
    for (const auto& f : MoeCaseFeatures(c)) ++dist["features (cases)"][f];
    auto m = SyntheticMoeState::Make(c);
    RC_ASSERT(m.ok());
    (void)RemoveTree(scratch);
    const std::string s1 = JoinPath(scratch, "t1/" + Tag(**m));
    const std::string s2 = JoinPath(scratch, "t2/" + Tag(**m));
    auto w1 = SaveMoe(**m, s1, c.dp1, c.ep1, "");
    RC_ASSERT(w1.ok());
    auto w2 = SaveMoe(**m, s2, c.dp2, c.ep2, c.target_ds_version);
    RC_ASSERT(w2.ok());
    // save(M, T) is DeepSpeed's layout.
    for (const auto& [dir, dp, ep, v] : {std::make_tuple(s1, c.dp1, c.ep1, c.ds_version),
                                         std::make_tuple(s2, c.dp2, c.ep2, c.target_ds_version)}) {
      const std::vector<std::string> d = MoeLayoutDiffs(**m, dir, dp, ep, v);
      if (!d.empty()) RC_FAIL(absl::StrCat("save(M, dp=", dp, ", ep=", ep, ") as ", v, ":\n  ", absl::StrJoin(d, "\n  ")));
    }
    // Files that cannot tell an expert param's group (DeepSpeed before
    // 0.14.5) are refused, saying so.
    // A refusal is right only where the files leave an expert param's
    // group open (before 0.14.5, no window lists it), and must say so.
    auto readable = [&](const std::string& dir, int dp, int ep, const std::string& v, const char* side) {
      ops::SourceOptions whole;
      whole.tp1_whole_tensors = true;
      auto s = ops::OpenModelState(dir, whole, false);
      const bool listed = ExpertGroupsListed(**m, dp, ep, v);
      ++dist["expert groups in the mappings"][absl::StrCat(
          side, listed ? " every expert param listed" : s.ok() ? " some placed by partition sizes" : " refused")];
      if (s.ok()) return true;
      if (listed || s.status().message().find("param group is unknown") == absl::string_view::npos) {
        RC_FAIL(absl::StrCat(dir, ": ", s.status().ToString()));
      }
      return false;
    };
    if (!readable(s1, c.dp1, c.ep1, c.ds_version, "T1")) {
      (void)readable(s2, c.dp2, c.ep2, c.target_ds_version, "T2");
      (void)RemoveTree(scratch);
      return;
    }
    // ucp reads M back.
    if (auto d = ReadBackDiffs(**m, s1); !d.empty()) RC_FAIL(absl::StrCat("read back:\n  ", absl::StrJoin(d, "\n  ")));
    // reshard(save(M, T1), T2) == save(M, T2).
    // Its optimizer files whole or in pieces of 16-512 bytes, by 1-3 threads:
    // the same bytes either way.
    const int64_t piece_bytes = *rc::gen::element<int64_t>(-1, -1, 16, 64, 512);
    const int threads = *rc::gen::inRange(1, 4);
    ++dist["T2 optimizer files"][piece_bytes < 0 ? "whole" : absl::StrCat("pieces of ", piece_bytes, " bytes")];
    auto r = Reshard(s1, JoinPath(scratch, "t1_to_t2/" + Tag(**m)), c.dp2, c.ep2, c.target_ds_version, piece_bytes,
                     threads);
    if (!r.ok()) RC_FAIL(absl::StrCat("reshard to T2: ", r.status().ToString()));
    auto diffs = FolderByteDiffs(*r, s2);
    RC_ASSERT(diffs.ok());
    if (!diffs->empty()) RC_FAIL(absl::StrCat("reshard != save at T2:\n  ", absl::StrJoin(*diffs, "\n  ")));
    if (!readable(*r, c.dp2, c.ep2, c.target_ds_version, "T2")) {
      (void)RemoveTree(scratch);
      return;
    }
    // Round trip back to T1 (and V1): bitwise the original.
    auto back = Reshard(*r, JoinPath(scratch, "t2_to_t1/" + Tag(**m)), c.dp1, c.ep1, c.ds_version);
    if (!back.ok()) RC_FAIL(absl::StrCat("reshard back to T1: ", back.status().ToString()));
    diffs = FolderByteDiffs(*back, s1);
    RC_ASSERT(diffs.ok());
    if (!diffs->empty()) RC_FAIL(absl::StrCat("round trip != save at T1:\n  ", absl::StrJoin(*diffs, "\n  ")));
    (void)RemoveTree(scratch);
  };
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = Cases();
  rc::detail::TestMetadata metadata;
  metadata.id = "moe_conformance";
  metadata.description = "MoE save / reshard / round trip / read back";
  const rc::detail::TestResult result = rc::detail::checkTestable(property, metadata, params);
  (void)RemoveTree(scratch);
  std::string text = absl::StrCat("MoE distribution over ", cases, " cases:\n");
  for (const auto& [dim, values] : dist) {
    std::vector<std::string> parts;
    for (const auto& [k, n] : values) parts.push_back(absl::StrCat(k, ":", n));
    absl::StrAppend(&text, "  ", dim, "  ", absl::StrJoin(parts, "  "), "\n");
  }
  std::cout << text;
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << os.str();
  if (result.template is<rc::detail::SuccessResult>()) {
    EXPECT_EQ(result.template get<rc::detail::SuccessResult>().numSuccess, Cases());
  }
}

// The generator at the real fixture's model and topology (GPT with MoE in
// blocks 1 and 3, 4 experts each, ep 2, dp 2, ZeRO-2, fp32, 0.19.5) writes
// every file DeepSpeed wrote, with the same value trees (tensor values aside).
TEST(MoeConformanceTest, GeneratorLaysOutTheFixtureAsDeepSpeedDid) {
  MoeCase c;
  c.hidden = 64;
  c.ffn = 128;
  c.vocab = 96;
  c.positions = 16;
  c.experts = {0, 4, 0, 4};
  c.base_groups = 2;
  c.no_decay_weight_decay = 0.01;  // the fixture's job
  c.zero_stage = 2;
  c.lp_dtype = "fp32";
  c.dp1 = 2;
  c.ep1 = 2;
  c.ds_version = "0.19.5";
  auto m = SyntheticMoeState::Make(c);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string out = JoinPath(ucp::testing::FreshTempDir("moe_fixture_layout"), "global_step4");
  ASSERT_TRUE(SaveMoe(**m, out, 2, 2, "").ok());
  const std::string theirs = ucp::testing::VersionFixturePath("0.19.5", "gpt-moe-ep2-zero2-dp2/global_step4");
  const std::vector<std::string> diffs = LayoutDiffs(out, theirs);
  EXPECT_THAT(diffs, ::testing::IsEmpty()) << absl::StrJoin(diffs, "\n");
  // The comparison sees a change of expert parallelism.
  const std::string ep1 = JoinPath(ucp::testing::FreshTempDir("moe_fixture_layout_ep1"), "global_step4");
  ASSERT_TRUE(SaveMoe(**m, ep1, 2, 1, "").ok());
  EXPECT_THAT(LayoutDiffs(ep1, theirs), ::testing::Not(::testing::IsEmpty()));
}

// Rewrites one torch file through `edit` of its root.
void Rewrite(const std::string& path, const std::function<void(Value&)>& edit) {
  ASSERT_TRUE(torch::testing::RewriteTorchFile(path, edit).ok()) << path;
}

// bf16 jobs (DeepSpeedZeroOptimizer with bf16 weights) name the optimizer
// files bf16_zero_pp_rank_*: read as any other MoE checkpoint, and written
// under the same names; mixed names and BF16_Optimizer's state dict (no
// zero_stage, no loss_scaler) are refused naming the folder or file.
TEST(MoeConformanceTest, Bf16FileNamesAreReadAndKept) {
  MoeCase c;
  c.experts = {0, 4};
  c.dp1 = 2;
  c.ep1 = 2;
  c.ds_version = "0.19.5";
  auto m = SyntheticMoeState::Make(c);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string root = ucp::testing::FreshTempDir("moe_bf16_names");
  const std::string src = JoinPath(root, "in/" + Tag(**m));
  ASSERT_TRUE(SaveMoe(**m, src, c.dp1, c.ep1, "").ok());
  auto renamed = [&](const std::string& name, int files) {
    const std::string dir = JoinPath(root, name + "/" + Tag(**m));
    EXPECT_TRUE(CopyTree(src, dir).ok());
    for (int d = 0; d < files; ++d) {
      const std::string f = absl::StrCat("zero_pp_rank_", d, "_mp_rank_00_optim_states.pt");
      EXPECT_EQ(rename(JoinPath(dir, f).c_str(), JoinPath(dir, "bf16_" + f).c_str()), 0);
    }
    return dir;
  };
  const std::string bf16 = renamed("bf16", 2);
  EXPECT_THAT(ReadBackDiffs(**m, bf16), ::testing::IsEmpty());
  auto r = Reshard(bf16, JoinPath(root, "out/" + Tag(**m)), 1, 1, "");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(PathExists(JoinPath(*r, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")));
  EXPECT_FALSE(PathExists(JoinPath(*r, "zero_pp_rank_0_mp_rank_00_optim_states.pt")));
  EXPECT_THAT(ReadBackDiffs(**m, *r), ::testing::IsEmpty());

  ops::SourceOptions whole;
  whole.tp1_whole_tensors = true;
  const std::string mixed = renamed("mixed", 1);
  absl::Status s = ops::OpenModelState(mixed, whole, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("mixes bf16_zero_pp_rank_* and zero_pp_rank_* files"));

  const std::string bf16_optimizer = renamed("bf16_optimizer", 2);
  Rewrite(JoinPath(bf16_optimizer, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"), [](Value& r) {
    ValuePtr osd = r.DictGetPtr("optimizer_state_dict");
    osd->DictErase("zero_stage");
    osd->DictErase("loss_scaler");
  });
  s = ops::OpenModelState(bf16_optimizer, whole, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("BF16_Optimizer"));
}

// DeepSpeed before 0.19.3 saved MoE model states without param_shapes,
// ds_config, ds_version or buffer_names: ucp reads the groups from the
// optimizer files' param_slice_mappings and the shapes from the tensors, and
// refuses, naming the file and what is missing, what those cannot tell.
TEST(MoeConformanceTest, ModelStatesBefore0193AreReadFromTheOptimizerFiles) {
  MoeCase c;
  c.experts = {0, 4};
  c.dp1 = 4;
  c.ep1 = 2;
  c.ds_version = "0.16.4";
  auto m = SyntheticMoeState::Make(c);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string root = ucp::testing::FreshTempDir("moe_legacy");
  const std::string src = JoinPath(root, "in/" + Tag(**m));
  ASSERT_TRUE(SaveMoe(**m, src, c.dp1, c.ep1, "").ok());
  {
    auto mp = torch::TorchFile::Open(JoinPath(src, "mp_rank_00_model_states.pt"));
    ASSERT_TRUE(mp.ok());
    EXPECT_EQ((*mp)->root()->DictGet("param_shapes"), nullptr);
    EXPECT_EQ((*mp)->root()->DictGet("ds_version"), nullptr);
  }
  EXPECT_THAT(ReadBackDiffs(**m, src), ::testing::IsEmpty());
  // Reshard to the 0.19.5 layout and back to 0.16.4's.
  auto r = Reshard(src, JoinPath(root, "new/" + Tag(**m)), 2, 1, "0.19.5");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(MoeLayoutDiffs(**m, *r, 2, 1, "0.19.5"), ::testing::IsEmpty());
  auto back = Reshard(*r, JoinPath(root, "back/" + Tag(**m)), c.dp1, c.ep1, "0.16.4");
  ASSERT_TRUE(back.ok()) << back.status();
  auto same = FolderByteDiffs(*back, src);
  ASSERT_TRUE(same.ok());
  EXPECT_THAT(*same, ::testing::IsEmpty());

  auto damaged = [&](const std::string& name, const std::string& file,
                     const std::function<void(Value&)>& edit) -> absl::Status {
    const std::string dir = JoinPath(root, name + "/" + Tag(**m));
    EXPECT_TRUE(CopyTree(src, dir).ok());
    Rewrite(JoinPath(dir, file), edit);
    ops::SourceOptions whole;
    whole.tp1_whole_tensors = true;
    return ops::OpenModelState(dir, whole, false).status();
  };
  auto expect = [](const absl::Status& s, absl::StatusCode code, std::vector<std::string> words) {
    EXPECT_EQ(s.code(), code) << s;
    for (const std::string& w : words) EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(w)) << s;
  };
  // No mappings on rank 3: the groups cannot be known.
  expect(damaged("no_mappings", "zero_pp_rank_3_mp_rank_00_optim_states.pt",
                 [](Value& r) { r.DictGetPtr("optimizer_state_dict")->DictErase("param_slice_mappings"); }),
         absl::StatusCode::kInvalidArgument,
         {"zero_pp_rank_3_mp_rank_00_optim_states.pt", "param_slice_mappings", "0.16.4", "no param_shapes"});
  // A param of group 0 missing from the module: its shape is unknown.
  expect(damaged("no_module_param", "mp_rank_00_model_states.pt",
                 [](Value& r) { r.DictGetPtr("module")->DictErase("wte.weight"); }),
         absl::StatusCode::kInvalidArgument, {"mp_rank_00_model_states.pt", "wte.weight", "shape is unknown"});
  // An expert weight missing from its file.
  expect(damaged("no_expert_weight", "layer_0_expert_1_mp_rank_00_model_states.pt",
                 [](Value& r) { r.DictErase("h.1.moe.deepspeed_moe.experts.deepspeed_experts.1.fc.bias"); }),
         absl::StatusCode::kInvalidArgument, {"layer_0_expert_1_mp_rank_00_model_states.pt", "fc.bias"});
  // The optimizer files of a version that writes param_shapes.
  expect(damaged("says_0195", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                 [](Value& r) { r.DictSet(Value::Str("ds_version"), Value::Str("0.19.5")); }),
         absl::StatusCode::kInvalidArgument, {"mp_rank_00_model_states.pt", "no param_shapes", "0.19.5"});
  // No version at all.
  expect(damaged("no_version", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                 [](Value& r) { r.DictErase("ds_version"); }),
         absl::StatusCode::kInvalidArgument, {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "no ds_version"});
  // Mappings whose sizes do not add up to the module's shape.
  expect(damaged("short_mapping", "mp_rank_00_model_states.pt",
                 [](Value& r) {
                   ValuePtr module = r.DictGetPtr("module");
                   module->DictSet(Value::Str("wpe.weight"), module->DictGetPtr("ln_f.weight"));
                 }),
         absl::StatusCode::kInvalidArgument, {"mp_rank_00_model_states.pt", "wpe.weight", "param_slice_mappings[0]"});

  // A module tensor in no group: a buffer or a frozen param, the files do not
  // say. Kept for a target before 0.19.3; refused for the 0.19.3+ layout,
  // which records buffer_names.
  {
    const std::string dir = JoinPath(root, "buffer/" + Tag(**m));
    ASSERT_TRUE(CopyTree(src, dir).ok());
    Rewrite(JoinPath(dir, "mp_rank_00_model_states.pt"), [](Value& r) {
      ValuePtr module = r.DictGetPtr("module");
      module->DictSet(Value::Str("h.0.attn_mask"), module->DictGetPtr("ln_f.bias"));
    });
    auto old = Reshard(dir, JoinPath(root, "buffer_old/" + Tag(**m)), 2, 1, "0.15.4");
    ASSERT_TRUE(old.ok()) << old.status();
    auto mp = torch::TorchFile::Open(JoinPath(*old, "mp_rank_00_model_states.pt"));
    ASSERT_TRUE(mp.ok());
    const Value* t = (*mp)->root()->DictGet("module")->DictGet("h.0.attn_mask");
    ASSERT_NE(t, nullptr);
    auto got = (*mp)->GetTensor(*t);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(got->BitwiseEqual(*m.value()->Tensor("ln_f.bias", "fp32")));
    const std::string out = JoinPath(root, "buffer_new/" + Tag(**m));
    auto refused = Reshard(dir, out, 2, 1, "0.19.3");
    expect(refused.status(), absl::StatusCode::kFailedPrecondition, {"h.0.attn_mask", "buffer_names", "0.19.3"});
    EXPECT_FALSE(PathExists(out));
  }
}

// DeepSpeed before 0.14.5 maps only a window of each expert group at ep > 1:
// the groups come from the expert files, and every rank's window is checked.
TEST(MoeConformanceTest, ExpertMappingWindowsBefore0145) {
  MoeCase c;
  c.experts = {4};
  c.dp1 = 4;
  c.ep1 = 2;
  c.ds_version = "0.14.4";
  auto m = SyntheticMoeState::Make(c);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(ExpertGroupsListed(**m, c.dp1, c.ep1, c.ds_version));
  const std::string root = ucp::testing::FreshTempDir("moe_window");
  const std::string src = JoinPath(root, "in/" + Tag(**m));
  ASSERT_TRUE(SaveMoe(**m, src, c.dp1, c.ep1, "").ok());
  EXPECT_THAT(MoeLayoutDiffs(**m, src, c.dp1, c.ep1, "0.14.4"), ::testing::IsEmpty());
  // The oracle sees the difference from 0.14.5's full mappings.
  EXPECT_THAT(MoeLayoutDiffs(**m, src, c.dp1, c.ep1, "0.14.5"), ::testing::Not(::testing::IsEmpty()));
  EXPECT_THAT(ReadBackDiffs(**m, src), ::testing::IsEmpty());
  // A window listing other params than the expert files' order gives is refused.
  const std::string dir = JoinPath(root, "bad/" + Tag(**m));
  ASSERT_TRUE(CopyTree(src, dir).ok());
  Rewrite(JoinPath(dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt"), [](Value& r) {
    ValuePtr groups = r.DictGetPtr("optimizer_state_dict")->DictGetPtr("param_slice_mappings");
    const Value& g = *groups->items()[2];  // the decay experts
    // Its first entry renamed to local expert 1's param of the same name.
    ValuePtr renamed = Value::MakeDict(/*ordered_dict=*/true);
    for (const auto& [k, v] : g.dict_items()) {
      std::string name = k->str();
      if (renamed->dict_items().empty()) name.replace(name.find(".0."), 3, ".1.");
      renamed->DictSet(Value::Str(name), v);
    }
    groups->mutable_items()[2] = renamed;
  });
  ops::SourceOptions whole;
  whole.tp1_whole_tensors = true;
  auto s = ops::OpenModelState(dir, whole, false);
  absl::Status st = s.status();
  if (st.ok()) st = (*s)->VerifyInput(JoinPath(dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  // One expert per ep rank: no window lists the experts' proj params; the
  // partition sizes place them (one assignment fits).
  MoeCase u = c;
  u.experts = {2};
  u.dp1 = 2;
  u.hidden = 4;
  u.ffn = 6;
  auto mu = SyntheticMoeState::Make(u);
  ASSERT_TRUE(mu.ok());
  ASSERT_FALSE(ExpertGroupsListed(**mu, u.dp1, u.ep1, u.ds_version));
  const std::string usrc = JoinPath(root, "unlisted/" + Tag(**mu));
  ASSERT_TRUE(SaveMoe(**mu, usrc, u.dp1, u.ep1, "").ok());
  EXPECT_THAT(ReadBackDiffs(**mu, usrc), ::testing::IsEmpty());
  // An expert file whose unlisted param has another size than the one the
  // partitions hold: no assignment fits, its group is unknown: refused.
  const std::string bad_sizes = JoinPath(root, "bad_sizes/" + Tag(**mu));
  ASSERT_TRUE(CopyTree(usrc, bad_sizes).ok());
  Rewrite(JoinPath(bad_sizes, "layer_0_expert_0_mp_rank_00_model_states.pt"), [](Value& r) {
    r.DictSet(Value::Str("h.0.moe.deepspeed_moe.experts.deepspeed_experts.0.proj.weight"),
              r.DictGetPtr("h.0.moe.deepspeed_moe.experts.deepspeed_experts.0.fc.bias"));
  });
  auto refused = ops::OpenModelState(bad_sizes, whole, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  for (const char* w : {"param group is unknown", "0.14.4", "proj.weight", "no assignment"}) {
    EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr(w));
  }
}

// What real DeepSpeed 0.14.4 and 0.16.4 wrote (testdata/moe_ds_old): ucp
// rewriting each at its own dp / ep and version lays every file out as
// DeepSpeed did (same files, same value trees: the model states without
// param_shapes, the expp_rank placeholders, 0.14.4's windowed expert
// mappings, each version's paddings), and a change of ep does not.
TEST(MoeConformanceTest, OldLayoutsAreWrittenAsRealDeepSpeedWroteThem) {
  const std::string root = ucp::testing::FreshTempDir("moe_real_old_layout");
  for (const std::string name : {"ds0144_zero2_ep2_dp2", "ds0144_zero1_odd_ep2_dp2", "ds0164_zero2_2moe_ep2_dp2"}) {
    const std::string theirs = ucp::testing::RunfilePath("testdata/moe_ds_old/" + name + "/global_step4");
    auto same = Reshard(theirs, JoinPath(root, name + "/same/global_step4"), 2, 2, "");
    ASSERT_TRUE(same.ok()) << name << ": " << same.status();
    // DeepSpeed 0.14.4 / 0.16.4 saved the MoE module's tensors as views into
    // each param group's whole flat bit16 buffer (no clone before the save);
    // ucp gives each its own storage: that alone is not compared. It is there:
    EXPECT_THAT(LayoutDiffs(*same, theirs), ::testing::Not(::testing::IsEmpty())) << name;
    const std::vector<std::string> diffs = LayoutDiffs(*same, theirs, /*module_storage=*/false);
    EXPECT_THAT(diffs, ::testing::IsEmpty()) << name << ":\n" << absl::StrJoin(diffs, "\n");
    auto ep1 = Reshard(theirs, JoinPath(root, name + "/ep1/global_step4"), 2, 1, "");
    ASSERT_TRUE(ep1.ok()) << name << ": " << ep1.status();
    EXPECT_THAT(LayoutDiffs(*ep1, theirs), ::testing::Not(::testing::IsEmpty())) << name;
  }
}

}  // namespace
}  // namespace ucp::conformance
