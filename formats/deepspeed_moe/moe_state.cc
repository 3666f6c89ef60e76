#include "formats/deepspeed_moe/moe_state.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "format/pickle/accessors.h"
#include "deepspeed/value_util.h"

namespace ucp::deepspeed_moe {

using deepspeed::ReadLatestTag;
namespace internal = ::ucp::deepspeed::internal;

namespace {

using internal::CheckDense;
using internal::FileError;
using internal::ForEachSliceMapping;
using internal::ShapeStr;
using internal::StringList;
using pickle::AsInt;
using pickle::AsSequence;
using pickle::AsTorchSize;
using pickle::GetField;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// layer_L_expert_E_mp_rank_XX_model_states.pt -> (L, E, XX).
bool ParseExpertFileName(const std::string& name, int* layer, int* expert, int* mp) {
  absl::string_view s = name;
  if (!absl::ConsumePrefix(&s, "layer_")) return false;
  const size_t a = s.find("_expert_");
  if (a == absl::string_view::npos || !absl::SimpleAtoi(s.substr(0, a), layer)) return false;
  s.remove_prefix(a + 8);
  const size_t b = s.find("_mp_rank_");
  if (b == absl::string_view::npos || !absl::SimpleAtoi(s.substr(0, b), expert)) return false;
  s.remove_prefix(b + 9);
  if (!absl::ConsumeSuffix(&s, "_model_states.pt")) return false;
  return absl::SimpleAtoi(s, mp);
}

std::string TagFolderOf(const std::string& path_in) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  auto names = ListDirectory(path);
  if (!names.ok()) return path;
  for (const auto& n : *names) {
    if (deepspeed::ParseCheckpointFileName(n) || absl::StartsWith(n, "layer_")) return path;
  }
  if (PathExists(JoinPath(path, deepspeed::kLatestFile))) {
    auto tag = ReadLatestTag(path, deepspeed::kLatestFile);
    if (tag.ok() && IsDirectory(JoinPath(path, *tag))) return JoinPath(path, *tag);
  }
  return path;
}

constexpr char kSupported[] =
    "ucp reads native MoE checkpoints of ZeRO stage 1/2 (DeepSpeedZeroOptimizer) at any pp, and at tp > 1 when every "
    "tp rank has model states (ep >= tp)";

// How Inputs names a flat partition of group `g` (state::kFp32State or a
// per-element state's key).
std::string PartitionName(int g, const std::string& state) {
  return state == state::kFp32State ? absl::StrCat("single_partition_of_fp32_groups[", g, "]")
                                    : absl::StrCat("base_optimizer_state.state[", g, "].", state);
}

absl::Status InvalidIn(const std::string& path, absl::string_view message) {
  return FileError(path, absl::StatusCode::kInvalidArgument, message);
}

}  // namespace

bool SplitExpertName(const std::string& name, std::string* prefix, int* id, std::string* suffix) {
  const size_t at = name.find(kExpertInfix);
  if (at == std::string::npos) return false;
  const size_t start = at + std::string(kExpertInfix).size();
  const size_t dot = name.find('.', start);
  if (dot == std::string::npos) return false;
  int n = 0;
  if (!absl::SimpleAtoi(absl::string_view(name).substr(start, dot - start), &n)) return false;
  *prefix = name.substr(0, at);
  *id = n;
  *suffix = name.substr(dot + 1);
  return true;
}

std::string ExpertName(const std::string& prefix, int id, const std::string& suffix) {
  return absl::StrCat(prefix, kExpertInfix, id, ".", suffix);
}

bool IsExpertFileName(const std::string& name) {
  int l, e, m;
  return ParseExpertFileName(name, &l, &e, &m);
}

bool IsMoeFolder(const std::string& path) {
  auto names = ListDirectory(TagFolderOf(path));
  if (!names.ok()) return false;
  for (const auto& n : *names) {
    int l, e, m;
    if (ParseExpertFileName(n, &l, &e, &m)) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<MoeState>> MoeState::Open(const std::string& path,
                                                         const deepspeed::ReadOptions& read) {
  std::unique_ptr<MoeState> s(new MoeState());
  s->read_ = read;
  s->dir_ = TagFolderOf(path);
  if (!IsDirectory(s->dir_)) return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint folder"));
  UCP_ASSIGN_OR_RETURN(const StageShape shape, PipelineStages(s->dir_, read));
  const int pp = shape.pp;
  if (pp == 1) {
    UCP_RETURN_IF_ERROR(s->Load());
    return s;
  }
  s->pp_ = pp;
  for (int stage = 0; stage < pp; ++stage) {
    std::unique_ptr<MoeState> st(new MoeState());
    st->read_ = read;
    st->dir_ = s->dir_;
    st->pp_ = pp;
    st->stage_tp_ = shape.tp;
    st->mp_base_ = stage * shape.tp;
    UCP_RETURN_IF_ERROR(st->Load());
    s->stages_.push_back(std::move(st));
  }
  UCP_RETURN_IF_ERROR(s->JoinStages());
  return s;
}

absl::StatusOr<MoeState::StageShape> MoeState::PipelineStages(const std::string& dir,
                                                              const deepspeed::ReadOptions& read) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  std::set<int> model_mp;
  for (const auto& n : names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kMpRank) model_mp.insert(parsed->mp_rank);
  }
  const int mp = static_cast<int>(model_mp.size());
  if (mp < 2 || *model_mp.begin() != 0 || *model_mp.rbegin() != mp - 1) return StageShape{};  // Load says what is wrong
  const torch::OpenOptions lazy = read.Files(/*verify_crc=*/false);  // their pickles only; checked when read
  std::vector<std::unique_ptr<torch::TorchFile>> files;
  auto open = [&](int m) -> absl::Status {
    UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(JoinPath(dir, deepspeed::MpRankFileName(m)), lazy));
    files.push_back(std::move(f));
    return absl::OkStatus();
  };
  UCP_RETURN_IF_ERROR(open(0));
  if (!files[0]->root()->is(Kind::kDict)) return StageShape{};
  const std::string path0 = files[0]->path();
  // 0.19.3 and later: engine.py _checkpoint_parallel_metadata.
  if (const Value* dims = files[0]->root()->DictGet("checkpoint_parallel_dimensions");
      dims != nullptr && dims->is(Kind::kDict)) {
    const Value* pp = dims->DictGet("pp_degree");
    const Value* tp = dims->DictGet("tp_degree");
    const int64_t p = pp != nullptr && pp->is(Kind::kInt) ? pp->int_value() : 1;
    const int64_t t = tp != nullptr && tp->is(Kind::kInt) ? tp->int_value() : 1;
    if (p <= 1) return StageShape{};
    if (t < 1 || p * t != mp) {
      return FileError(path0, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("checkpoint_parallel_dimensions says pp ", p, " x tp ", t, ", but the folder holds "
                                    "the model states of ", mp, " mp ranks"));
    }
    return StageShape{static_cast<int>(p), static_cast<int>(t)};
  }
  // Before: the tp ranks of a stage hold the same names, stages disjoint ones
  // but for the tied modules (PipelineModule's tied_modules.<key>: every stage
  // holding a layer of that key has a copy).
  for (int m = 1; m < mp; ++m) {
    UCP_RETURN_IF_ERROR(open(m));
    if (!files[m]->root()->is(Kind::kDict)) return StageShape{};
  }
  std::vector<std::set<std::string>> keys(mp);
  for (int m = 0; m < mp; ++m) {
    const Value* module = files[m]->root()->DictGet("module");
    if (module == nullptr || !module->is(Kind::kDict)) return StageShape{};
    for (const auto& [k, v] : module->dict_items()) {
      if (k->is(Kind::kStr) && !IsTiedName(k->str())) keys[m].insert(k->str());
    }
  }
  int tp = 1;
  while (tp < mp && keys[tp] == keys[0]) ++tp;
  if (tp == mp) return StageShape{};
  const int pp = mp / tp;
  for (int m = 0; m < mp; ++m) {
    const int stage = m / tp;
    bool ok = mp % tp == 0 && keys[m] == keys[stage * tp];
    for (int s = 0; ok && s < stage; ++s) {
      for (const auto& k : keys[m]) ok = ok && !keys[s * tp].count(k);
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": the modules of the ", mp, " mp ranks are neither tp ranks (the same names) nor pipeline stages of ",
          tp, " tp rank(s) each (disjoint names from stage to stage): ", deepspeed::MpRankFileName(m),
          " is not the stage of its place"));
    }
  }
  return StageShape{pp, tp};
}

// The stages' model info joined in DeepSpeed's global order: each group's
// trainable params stage by stage, then the module tensors in no group;
// module order, MoE layers (the ids a pp 1 save gives them) and notes in
// stage order.
absl::Status MoeState::JoinStages() {
  const MoeState& first = *stages_[0];
  const state::ModelInfo& i0 = first.info_;
  info_ = i0;
  info_.params.clear();
  info_.module_order.clear();
  info_.moe_layers.clear();
  info_.notes.clear();
  info_.source_topology = {first.tp_, pp_, first.dp_};
  dp_ = first.dp_;
  ep_ = first.ep_;
  std::set<std::string> in_module;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const MoeState& st = *stages_[s];
    const state::ModelInfo& i = st.info_;
    const std::string path = st.mp_->path();
    if (st.tp_ != first.tp_) {
      return InvalidIn(path, absl::StrCat("pipeline stage ", s, " has model states of ", st.tp_,
                                          " tp rank(s), stage 0 of ", first.tp_));
    }
    if (i.num_groups != i0.num_groups || i.expert_groups != i0.expert_groups || st.ep_ != first.ep_ ||
        st.dp_ != first.dp_ || i.zero_stage != i0.zero_stage || i.state_keys != i0.state_keys ||
        i.bf16_file_prefix != i0.bf16_file_prefix) {
      return InvalidIn(path, absl::StrCat(
          "pipeline stage ", s, " has ", i.num_groups, " param groups (", st.ep_, " ep, dp ", st.dp_, ", ZeRO ",
          i.zero_stage, "), stage 0 ", i0.num_groups, " (", first.ep_, " ep, dp ", first.dp_, ", ZeRO ", i0.zero_stage,
          "), or other expert groups or optimizer states: every stage holds the same groups"));
    }
    for (const auto& k : i.module_order) {
      if (in_module.insert(k.name).second) info_.module_order.push_back(k);  // a tied module once
    }
    for (const auto& l : i.moe_layers) info_.moe_layers.push_back(l);
  }
  if (info_.moe_layers.empty()) return InvalidIn(first.mp_->path(), "no MoE layer in any pipeline stage");
  std::map<std::string, size_t> index;  // name -> info_.params
  auto add = [&](int s, const state::ParamState& p) -> absl::Status {
    if (!stage_of_.insert({p.name, s}).second) {
      // A tied module's copy: one param held by several stages, read from the
      // first (DeepSpeed all-reduces the copies' gradients, so every stage
      // steps them alike; the copies are not compared, as the ZeRO reader's
      // tied layers are not).
      state::ParamState* q = IsTiedName(p.name) ? &info_.params[index.at(p.name)] : nullptr;
      if (q == nullptr || q->group != p.group || q->full_shape != p.full_shape || q->role != p.role) {
        return InvalidIn(stages_[s]->mp_->path(), absl::StrCat("'", p.name, "' is also in pipeline stage ",
                                                               stage_of_[p.name], "'s files",
                                                               q == nullptr ? "" : " with another group or shape"));
      }
      q->stages.push_back(s);
      return absl::OkStatus();
    }
    state::ParamState q = p;
    q.stages = {s};
    index[p.name] = info_.params.size();
    info_.params.push_back(std::move(q));
    return absl::OkStatus();
  };
  for (int g = 0; g < i0.num_groups; ++g) {
    for (size_t s = 0; s < stages_.size(); ++s) {
      for (const auto& p : stages_[s]->info_.params) {
        if (p.group == g) UCP_RETURN_IF_ERROR(add(static_cast<int>(s), p));
      }
    }
  }
  for (size_t s = 0; s < stages_.size(); ++s) {
    for (const auto& p : stages_[s]->info_.params) {
      if (p.group < 0 || p.group >= i0.num_groups) UCP_RETURN_IF_ERROR(add(static_cast<int>(s), p));
    }
  }
  info_.notes = i0.notes;
  info_.notes.push_back(absl::StrCat(
      "pipeline of ", pp_, " stages, each a mixture-of-experts save of its own at tp ", first.tp_,
      " under mp_rank_<stage x tp + tp rank> (its module, optimizer groups and expert files; expert file layer ids "
      "restart in every stage): ", info_.moe_layers.size(), " MoE layers in stage order"));
  info_.Reindex();
  empty_dict_ = Value::MakeDict();
  return absl::OkStatus();
}

const MoeState& MoeState::StageOf(const state::ParamState& param) const {
  auto it = stage_of_.find(param.name);
  return *stages_[it == stage_of_.end() ? 0 : it->second];
}

std::string MoeState::OptimPath(int rank) const {
  return JoinPath(dir_, deepspeed::OptimFileName(rank / tp_, mp_base_ + rank % tp_, bf16_prefix_));
}

std::string MoeState::ExpertPath(int layer, int expert) const {
  if (!stages_.empty()) {
    for (const auto& s : stages_) {
      const int n = static_cast<int>(s->moe_prefixes_.size());
      if (layer < n) return s->ExpertPath(layer, expert);
      layer -= n;
    }
    return "";
  }
  auto it = expert_files_.find({layer, expert});
  return it != expert_files_.end()
             ? it->second
             : JoinPath(dir_, absl::StrCat("layer_", layer, "_expert_", expert, "_mp_rank_",
                                           absl::Dec(mp_base_, absl::kZeroPad2), "_model_states.pt"));
}

int MoeState::LayerIndex(const std::string& prefix) const {
  return static_cast<int>(std::find(moe_prefixes_.begin(), moe_prefixes_.end(), prefix) - moe_prefixes_.begin());
}

absl::Status MoeState::Load() {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir_));
  UCP_RETURN_IF_ERROR(FindOptimPrefix(names));
  const std::string version = VersionForMessages();
  const std::string what = absl::StrCat("DeepSpeed ", version, " native mixture-of-experts checkpoint");
  UCP_ASSIGN_OR_RETURN(std::set<int> optim_dp, ListFiles(names, what));
  UCP_RETURN_IF_ERROR(CheckExpertOptimizerFiles(names, optim_dp, what));
  UCP_RETURN_IF_ERROR(OpenModelStates(optim_dp, version));
  UCP_RETURN_IF_ERROR(OpenTpModelStates(version));
  // Rank 0's optimizer file: the groups, which of them hold experts, ep.
  UCP_ASSIGN_OR_RETURN(Rank0Groups rank0, ReadRank0Groups(what));
  UCP_RETURN_IF_ERROR(ReadGroupMembers(rank0));
  UCP_RETURN_IF_ERROR(ReadTpParamShapes());
  optim_files_.Reset(world());
  UCP_RETURN_IF_ERROR(FindExpertGroups(rank0));
  window_mappings_ = legacy_ && ep_ > 1 && deepspeed::ExpertMappingsSizedByWorld(legacy_parsed_);
  if (legacy_) UCP_RETURN_IF_ERROR(GroupNamesFromMappings());
  UCP_RETURN_IF_ERROR(FindMoeLayers());
  UCP_RETURN_IF_ERROR(CheckExpertFilePlaces());
  if (legacy_) UCP_RETURN_IF_ERROR(GroupShapesFromTensors());
  UCP_RETURN_IF_ERROR(MakeLayouts());
  UCP_ASSIGN_OR_RETURN(const OptimFile* first, Optim(0));
  UCP_RETURN_IF_ERROR(BuildInfo(*first));
  empty_dict_ = Value::MakeDict();
  return absl::OkStatus();
}

// bf16 jobs name their optimizer files bf16_zero_pp_rank_* (engine.py, for
// DeepSpeedZeroOptimizer with bf16 weights as for BF16_Optimizer; only the
// former is read, checked in ReadRank0Groups): sets bf16_prefix_.
absl::Status MoeState::FindOptimPrefix(const std::vector<std::string>& names) {
  std::set<bool> prefixes;
  for (const auto& n : names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kOptim) prefixes.insert(parsed->bf16_prefix);
  }
  if (prefixes.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": mixes bf16_zero_pp_rank_* and zero_pp_rank_* files"));
  }
  bf16_prefix_ = prefixes.count(true) > 0;
  return absl::OkStatus();
}

// The saving DeepSpeed's version, for the messages of what is refused: the
// model states' ds_version, else (before 0.19.3 only the optimizer files
// name it) optimizer file 0's, else "(no ds_version)".
std::string MoeState::VersionForMessages() const {
  std::string version = "(no ds_version)";
  const torch::OpenOptions lazy = read_.Files(/*verify_crc=*/false);  // its pickle only
  if (auto f = torch::TorchFile::Open(JoinPath(dir_, deepspeed::MpRankFileName(mp_base_)), lazy); f.ok()) {
    const Value* v = (*f)->root()->is(Kind::kDict) ? (*f)->root()->DictGet("ds_version") : nullptr;
    if (v != nullptr && v->is(Kind::kStr)) version = v->str();
  }
  if (version == "(no ds_version)") {
    if (auto f = torch::TorchFile::Open(OptimPath(0), lazy); f.ok() && (*f)->root()->is(Kind::kDict)) {
      const Value* v = (*f)->root()->DictGet("ds_version");
      if (v != nullptr && v->is(Kind::kStr)) version = v->str();
    }
  }
  return version;
}

// A save at tp > 1 (files of an mp rank > 0) without the model states of
// some tp rank, refused. DeepSpeed (0.19.5, realds/README.md "Native MoE at
// tp > 1") writes mp_rank_XX_model_states.pt on expert data parallel rank 0
// only: at ep < tp the tp ranks >= ep have none (their dense slices are in no
// model-states file; DeepSpeed's own load refuses the folder).
absl::Status MoeState::RefuseIncompleteModelParallel(const std::vector<std::string>& names, const std::string& what) const {
  std::set<int> optim_mp, model_mp;
  std::string first;  // the first file of an mp rank > 0
  for (const auto& n : names) {
    int l, e, m;
    const bool expert = ParseExpertFileName(n, &l, &e, &m);
    const auto parsed = expert ? std::nullopt : deepspeed::ParseCheckpointFileName(n);
    if (!expert && !parsed) continue;
    using Type = deepspeed::CheckpointFileName::Type;
    if (parsed && (parsed->type == Type::kLayer || parsed->type == Type::kZero3Model)) {
      return absl::OkStatus();  // not the layout of a plain module under ZeRO 1/2: ListFiles says which
    }
    const int mp = expert ? m : parsed->mp_rank;
    if (parsed && parsed->type == Type::kOptim) optim_mp.insert(mp);
    if (parsed && parsed->type == Type::kMpRank) model_mp.insert(mp);
    if (mp > 0 && first.empty()) first = n;
  }
  if (first.empty()) return absl::OkStatus();
  const int tp = std::max(optim_mp.empty() ? 1 : *optim_mp.rbegin() + 1, model_mp.empty() ? 1 : *model_mp.rbegin() + 1);
  for (int t = 0; t < tp; ++t) {
    if (model_mp.count(t)) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        dir_, ": ", what, " at tp ", tp, " without ", deepspeed::MpRankFileName(t),
        " (DeepSpeed writes a tp rank's model states on expert data parallel rank 0 only, so at ep < tp tp rank ", t,
        "'s dense slices are in no model-states file; DeepSpeed's own load refuses this folder too): ", kSupported));
  }
  return absl::OkStatus();
}

// The folder's checkpoint files: expert files (expert_files_, the mp rank
// of each in expert_file_mp_), optimizer files zero_pp_rank_D_mp_rank_T and
// model states mp_rank_T (tp_: their count). Returns the optimizer files' dp
// ranks.
absl::StatusOr<std::set<int>> MoeState::ListFiles(const std::vector<std::string>& names, const std::string& what) {
  if (pp_ == 1) UCP_RETURN_IF_ERROR(RefuseIncompleteModelParallel(names, what));
  std::set<int> optim_dp, model_mp;
  std::set<std::pair<int, int>> optim;  // (dp, mp - mp_base_)
  for (const auto& n : names) {
    int l, e, m;
    if (ParseExpertFileName(n, &l, &e, &m)) {
      if (InOtherStage(m)) continue;
      m -= mp_base_;
      if (expert_files_.count({l, e})) {
        return absl::InvalidArgumentError(absl::StrCat(dir_, ": two files of MoE layer ", l, " expert ", e, ": ",
                                                       Basename(expert_files_[{l, e}]), " and ", n));
      }
      expert_files_[{l, e}] = JoinPath(dir_, n);
      expert_file_mp_[{l, e}] = m;
      continue;
    }
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (!parsed) continue;
    if ((parsed->type == deepspeed::CheckpointFileName::Type::kOptim ||
         parsed->type == deepspeed::CheckpointFileName::Type::kMpRank) &&
        InOtherStage(parsed->mp_rank)) {
      continue;
    }
    if (parsed->type == deepspeed::CheckpointFileName::Type::kOptim) {
      optim_dp.insert(parsed->dp_rank);
      optim.insert({parsed->dp_rank, parsed->mp_rank - mp_base_});
    } else if (parsed->type == deepspeed::CheckpointFileName::Type::kMpRank) {
      model_mp.insert(parsed->mp_rank - mp_base_);
    } else {
      return absl::UnimplementedError(absl::StrCat(dir_, ": ", what, " with ", n, ": ", kSupported));
    }
  }
  tp_ = model_mp.empty() ? 1 : *model_mp.rbegin() + 1;
  for (const auto& [d, m] : optim) {
    if (m >= tp_) {
      return absl::InvalidArgumentError(absl::StrCat(JoinPath(dir_, deepspeed::OptimFileName(d, m + mp_base_, bf16_prefix_)),
                                                     ": mp rank ", m, " but the model states are of ", tp_,
                                                     " tp rank(s)"));
    }
  }
  for (const auto& [key, m] : expert_file_mp_) {
    if (m >= tp_) {
      return absl::InvalidArgumentError(absl::StrCat(expert_files_[key], ": mp rank ", m, " but the model states are of ",
                                                     tp_, " tp rank(s)"));
    }
  }
  optim_tp_files_ = std::move(optim);
  return optim_dp;
}

// engine.py _save_checkpoint writes expp_rank_R_mp_rank_XX_optim_states.pt
// for every MoE job; with ZeRO (up to 0.16.x at least; 0.19.5 no longer
// writes them) they only hold {'optimizer': None}, the optimizer being in
// the zero_pp_rank files. Without ZeRO they hold the whole optimizer.
absl::Status MoeState::CheckExpertOptimizerFiles(const std::vector<std::string>& names, const std::set<int>& optim_dp,
                                                 const std::string& what) const {
  for (const auto& n : names) {
    if (!absl::StartsWith(n, "expp_rank_")) continue;
    if (optim_dp.empty()) {
      return absl::UnimplementedError(absl::StrCat(dir_, ": ", what, " without ZeRO (", n, "): ", kSupported));
    }
    const std::string path = JoinPath(dir_, n);
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f, torch::TorchFile::Open(path, read_.Files()));
    const Value* opt = f->root()->is(Kind::kDict) ? f->root()->DictGet("optimizer") : nullptr;
    if (opt == nullptr || !opt->is_none()) {
      return FileError(path, absl::StatusCode::kUnimplemented,
                       absl::StrCat(what, ": an expert optimizer file next to the ZeRO files holds ",
                                    opt == nullptr ? "no 'optimizer' key" : "an optimizer",
                                    ", expected {'optimizer': None}: ", kSupported));
    }
  }
  return absl::OkStatus();
}

// mp_rank_00's model states (mp_): dp_world_size (dp_) against the optimizer
// files present, no model parallelism, a plain module, no frozen params, and
// num_experts per MoE layer (num_experts_).
absl::Status MoeState::OpenModelStates(const std::set<int>& optim_dp, const std::string& version) {
  const std::string mp_path = JoinPath(dir_, deepspeed::MpRankFileName(mp_base_));
  UCP_ASSIGN_OR_RETURN(mp_, torch::TorchFile::Open(mp_path, read_.ModelStates()));
  const Value& root = *mp_->root();
  if (!root.is(Kind::kDict)) return InvalidIn(mp_path, "expected a dict of model states");
  {
    UCP_ASSIGN_OR_RETURN(const Value* d, GetField(root, "dp_world_size", "model states"), _.Prepend(mp_path + ": "));
    UCP_ASSIGN_OR_RETURN(int64_t dp, AsInt(*d, "dp_world_size"), _.Prepend(mp_path + ": "));
    if (dp < 1) return InvalidIn(mp_path, "dp_world_size < 1");
    dp_ = static_cast<int>(dp);
    const Value* m = root.DictGet("mp_world_size");
    if (m != nullptr && m->is(Kind::kInt) && m->int_value() != tp_ * pp_) {
      return FileError(mp_path, absl::StatusCode::kUnimplemented,
                       absl::StrCat("DeepSpeed ", version, " mixture-of-experts checkpoint with mp_world_size ",
                                    m->int_value(), " beside the model states of ", tp_, " tp rank(s)",
                                    pp_ > 1 ? absl::StrCat(" and ", pp_, " pipeline stages") : "", ": ", kSupported));
    }
    const Value* module = root.DictGet("module");
    if (module == nullptr || !module->is(Kind::kDict)) {
      return FileError(mp_path, absl::StatusCode::kUnimplemented,
                       "mixture-of-experts checkpoint of a PipelineModule (no module dict): not supported");
    }
  }
  UCP_RETURN_IF_ERROR(CheckOptimFiles());
  for (const char* key : {"frozen_param_shapes", "frozen_param_fragments"}) {
    const Value* f = root.DictGet(key);
    if (f != nullptr && f->is(Kind::kDict) && !f->dict_items().empty()) {
      return FileError(mp_path, absl::StatusCode::kUnimplemented,
                       absl::StrCat("mixture-of-experts checkpoint with frozen params (", key, "): not supported"));
    }
  }
  const Value* ne = root.DictGet("num_experts");
  if (ne == nullptr || !(ne->is(Kind::kList) || ne->is(Kind::kTuple))) {
    return InvalidIn(mp_path, "a mixture-of-experts checkpoint without a num_experts list");
  }
  for (const auto& v : ne->items()) {
    UCP_ASSIGN_OR_RETURN(int64_t n, AsInt(*v, "num_experts"), _.Prepend(mp_path + ": "));
    num_experts_.push_back(static_cast<int>(n));
  }
  return absl::OkStatus();
}

absl::Status MoeState::CheckOptimFiles() const {
  for (int r = 0; r < world(); ++r) {
    if (!optim_tp_files_.count({r / tp_, r % tp_})) {
      return absl::NotFoundError(absl::StrCat(OptimPath(r), ": missing (dp_world_size ", dp_, ", tp ", tp_, ")"));
    }
  }
  for (const auto& [d, m] : optim_tp_files_) {
    if (d >= dp_) {
      return absl::InvalidArgumentError(absl::StrCat(OptimPath(d * tp_ + m), ": dp rank ", d, " but dp_world_size is ", dp_));
    }
  }
  return absl::OkStatus();
}

// The model states of tp ranks 1 .. tp - 1 (mp_more_): as mp_rank_00's, the
// same dp_world_size, mp_world_size, num_experts, a module dict, no frozen
// params.
absl::Status MoeState::OpenTpModelStates(const std::string& version) {
  for (int t = 1; t < tp_; ++t) {
    const std::string path = JoinPath(dir_, deepspeed::MpRankFileName(mp_base_ + t));
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f, torch::TorchFile::Open(path, read_.ModelStates()));
    const Value& root = *f->root();
    if (!root.is(Kind::kDict)) return InvalidIn(path, "expected a dict of model states");
    for (const char* key : {"dp_world_size", "mp_world_size", "num_experts"}) {
      const Value* a = mp_->root()->DictGet(key);
      const Value* b = root.DictGet(key);
      if (a == nullptr || b == nullptr || a->DebugString() != b->DebugString()) {
        return InvalidIn(path, absl::StrCat(key, " is ", b ? b->DebugString() : "absent", ", ", mp_->path(), "'s ",
                                            a ? a->DebugString() : "absent"));
      }
    }
    const Value* module = root.DictGet("module");
    if (module == nullptr || !module->is(Kind::kDict)) return InvalidIn(path, "no module dict");
    for (const char* key : {"frozen_param_shapes", "frozen_param_fragments"}) {
      const Value* fr = root.DictGet(key);
      if (fr != nullptr && fr->is(Kind::kDict) && !fr->dict_items().empty()) {
        return FileError(path, absl::StatusCode::kUnimplemented,
                         absl::StrCat("mixture-of-experts checkpoint with frozen params (", key, "): not supported"));
      }
    }
    mp_more_.push_back(std::move(f));
  }
  return absl::OkStatus();
}

// Rank 0's optimizer file: its param_groups and partition_count (one count
// per group); a BF16_Optimizer's file refused.
absl::StatusOr<MoeState::Rank0Groups> MoeState::ReadRank0Groups(const std::string& what) const {
  Rank0Groups out;
  // Its pickle only: the partitions are checked when read (ParseOptim).
  UCP_ASSIGN_OR_RETURN(out.file, torch::TorchFile::Open(OptimPath(0), read_.Files(/*verify_crc=*/false)));
  const Value* root = out.file->root().get();
  out.param_groups = internal::DictPath(root, {"optimizer_state_dict", "base_optimizer_state", "param_groups"});
  out.partition_count = internal::DictPath(root, {"optimizer_state_dict", "partition_count"});
  if (out.param_groups == nullptr || !out.param_groups->is(Kind::kList) || out.param_groups->items().empty()) {
    return InvalidIn(OptimPath(0), "no optimizer_state_dict.base_optimizer_state.param_groups list");
  }
  if (const Value* osd = root->DictGet("optimizer_state_dict");
      osd != nullptr && osd->is(Kind::kDict) && osd->DictGet("zero_stage") == nullptr &&
      osd->DictGet("loss_scaler") == nullptr) {
    return FileError(OptimPath(0), absl::StatusCode::kUnimplemented,
                     absl::StrCat(what, " saved by BF16_Optimizer (no zero_stage, no loss_scaler): ", kSupported));
  }
  out.num_groups = out.param_groups->items().size();
  if (out.partition_count == nullptr || !out.partition_count->is(Kind::kList) ||
      out.partition_count->items().size() != out.num_groups) {
    return InvalidIn(OptimPath(0), "partition_count is not a list with one count per param group");
  }
  return out;
}

// The layout, by the keys present and the version the optimizer files
// name. DeepSpeed before 0.19.3 saved MoE model states without
// param_shapes (nor buffer_names, ds_config, ds_version: engine.py
// _save_moe_checkpoint): the groups' members and their order then come from
// every rank's param_slice_mappings, the shapes from the module (non-expert
// params) and the expert files (experts), later (legacy_, legacy_version_;
// groups_ sized). From 0.19.3 param_shapes gives each group's local names
// and shapes (groups_).
absl::Status MoeState::ReadGroupMembers(const Rank0Groups& rank0) {
  const std::string mp_path = mp_->path();
  const Value& root = *mp_->root();
  legacy_ = root.DictGet("param_shapes") == nullptr;
  if (legacy_) {
    const Value* v = rank0.file->root()->is(Kind::kDict) ? rank0.file->root()->DictGet("ds_version") : nullptr;
    if (v == nullptr || !v->is(Kind::kStr)) {
      return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("no ds_version, and ", mp_path, " has no param_shapes: cannot tell which DeepSpeed ",
                                    "mixture-of-experts layout this is (0.19.3+ saves param_shapes, earlier versions ",
                                    "a ds_version in the optimizer files)"));
    }
    auto parsed = deepspeed::ParseDsVersion(v->str());
    if (!parsed.ok()) {
      return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("ds_version '", v->str(), "' is not a version"));
    }
    if (!(*parsed < deepspeed::DsVersion{0, 19, 3})) {
      return FileError(mp_path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("no param_shapes, but the optimizer files say DeepSpeed ", v->str(),
                                    ", whose mixture-of-experts model states have them (0.19.3 and later)"));
    }
    legacy_version_ = v->str();
    legacy_parsed_ = *parsed;
    groups_.resize(rank0.num_groups);
    return absl::OkStatus();
  }
  UCP_RETURN_IF_ERROR(ReadParamShapes(*mp_, &groups_));
  if (groups_.size() != rank0.num_groups) {
    return InvalidIn(OptimPath(0), absl::StrCat("expected ", groups_.size(),
                                                " base_optimizer_state.param_groups (param_shapes of mp_rank_00)"));
  }
  return absl::OkStatus();
}

// The groups of `f`'s param_shapes: each one's names and shapes.
absl::Status MoeState::ReadParamShapes(const torch::TorchFile& f, std::vector<Group>* out) const {
  const std::string& path = f.path();
  UCP_ASSIGN_OR_RETURN(const Value* shapes_v, GetField(*f.root(), "param_shapes", "model states"), _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(auto* shape_list, AsSequence(*shapes_v, "param_shapes"), _.Prepend(path + ": "));
  for (size_t g = 0; g < shape_list->size(); ++g) {
    const Value& d = *(*shape_list)[g];
    if (!d.is(Kind::kDict)) return InvalidIn(path, absl::StrCat("param_shapes[", g, "] is not a dict"));
    Group group;
    for (const auto& [k, v] : d.dict_items()) {
      if (!k->is(Kind::kStr)) return InvalidIn(path, absl::StrCat("param_shapes[", g, "] has a non-string key"));
      UCP_ASSIGN_OR_RETURN(std::vector<int64_t> shape, AsTorchSize(*v, absl::StrCat("param_shapes[", g, "]")),
                           _.Prepend(path + ": "));
      group.names.push_back(k->str());
      group.shapes.push_back(std::move(shape));
    }
    out->push_back(std::move(group));
  }
  return absl::OkStatus();
}

// At tp > 1 (0.19.3+ layout only): every tp rank's param_shapes lists the
// same groups and names as mp_rank_00's, a dense param's tp slice shape its
// own (Group::tp_shapes), an expert group's shapes those of mp_rank_00 (its
// experts are whole). Whether a group holds experts is known later
// (FindExpertGroups), so both are recorded here and checked in MakeLayouts.
absl::Status MoeState::ReadTpParamShapes() {
  if (legacy_) return absl::OkStatus();  // every tp rank's shapes come from its module (GroupShapesFromTensors)
  for (Group& g : groups_) g.tp_shapes = {g.shapes};
  for (int t = 1; t < tp_; ++t) {
    std::vector<Group> other;
    UCP_RETURN_IF_ERROR(ReadParamShapes(Mp(t), &other));
    if (other.size() != groups_.size()) {
      return InvalidIn(Mp(t).path(), absl::StrCat("param_shapes lists ", other.size(), " groups, ", mp_->path(),
                                                  "'s ", groups_.size()));
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (other[g].names != groups_[g].names) {
        return InvalidIn(Mp(t).path(), absl::StrCat("param_shapes[", g, "] lists [", absl::StrJoin(other[g].names, ", "),
                                                    "], ", mp_->path(), "'s [", absl::StrJoin(groups_[g].names, ", "),
                                                    "]"));
      }
      groups_[g].tp_shapes.push_back(std::move(other[g].shapes));
    }
  }
  return absl::OkStatus();
}

// Expert groups: 'moe': True in rank 0's param_groups, each partitioned over
// the same divisor of dp (the expert data parallel degree; ep_ = dp / it),
// named 'ep_size_<ep>'; every other group over all of dp.
absl::Status MoeState::FindExpertGroups(const Rank0Groups& rank0) {
  int edp = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Value& pg = *rank0.param_groups->items()[g];
    groups_[g].expert = pg.is(Kind::kDict) && internal::Truthy(pg.DictGet("moe"));
    UCP_ASSIGN_OR_RETURN(int64_t count, AsInt(*rank0.partition_count->items()[g], "partition_count"),
                         _.Prepend(OptimPath(0) + ": "));
    if (!groups_[g].expert) {
      if (count != dp_) {
        return InvalidIn(OptimPath(0), absl::StrCat("partition_count[", g, "] is ", count, ", expected ", dp_,
                                                    " (dp_world_size) for a group without experts"));
      }
      continue;
    }
    if (count < 1 || world() % count != 0 || (edp != 0 && count != edp)) {
      return InvalidIn(OptimPath(0), absl::StrCat("partition_count[", g, "] is ", count, " for an expert group: expected ",
                                                  "the same divisor of dp_world_size ", dp_,
                                                  tp_ > 1 ? absl::StrCat(" x tp ", tp_) : "", " for every expert group"));
    }
    edp = static_cast<int>(count);
    const Value* name = pg.DictGet("name");
    ep_ = world() / edp;
    if (name != nullptr && name->is(Kind::kStr) && name->str() != absl::StrCat("ep_size_", ep_)) {
      return InvalidIn(OptimPath(0), absl::StrCat("expert param group ", g, " is named '", name->str(),
                                                  "', expected 'ep_size_", ep_, "' (dp x tp ", world(),
                                                  " / partition_count ", count, ")"));
    }
  }
  if (edp == 0) return InvalidIn(OptimPath(0), "no expert param group ('moe': True) in a checkpoint with expert files");
  return absl::OkStatus();
}

// MoE layers in order of appearance in the expert groups (moe_prefixes_),
// one per num_experts entry, each with a multiple of ep experts and every
// expert's file, and no expert file beyond num_experts.
absl::Status MoeState::FindMoeLayers() {
  const std::string mp_path = mp_->path();
  for (const Group& g : groups_) {
    if (!g.expert) continue;
    for (const std::string& n : g.names) {
      std::string prefix, suffix;
      int id = 0;
      if (!SplitExpertName(n, &prefix, &id, &suffix)) {
        return InvalidIn(mp_path, absl::StrCat("'", n, "' is in an expert param group but is not named '<prefix>",
                                               kExpertInfix, "<id>.<name>'"));
      }
      if (std::find(moe_prefixes_.begin(), moe_prefixes_.end(), prefix) == moe_prefixes_.end()) {
        moe_prefixes_.push_back(prefix);
      }
    }
  }
  if (moe_prefixes_.size() != num_experts_.size()) {
    return InvalidIn(mp_path, absl::StrCat("num_experts lists ", num_experts_.size(),
                                           " MoE layers, the expert groups hold ", moe_prefixes_.size()));
  }
  for (size_t l = 0; l < num_experts_.size(); ++l) {
    if (num_experts_[l] % ep_ != 0) {
      return InvalidIn(mp_path,
                       absl::StrCat("MoE layer ", l, " has ", num_experts_[l], " experts, not a multiple of ep ", ep_));
    }
    for (int e = 0; e < num_experts_[l]; ++e) {
      if (!expert_files_.count({static_cast<int>(l), e})) {
        return absl::NotFoundError(absl::StrCat(ExpertPath(static_cast<int>(l), e), ": missing (num_experts ",
                                                num_experts_[l], ")"));
      }
    }
  }
  for (const auto& [key, path] : expert_files_) {
    if (key.first >= static_cast<int>(num_experts_.size()) || key.second >= num_experts_[key.first]) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not an expert of num_experts ",
                                                     absl::StrJoin(num_experts_, ",")));
    }
  }
  return absl::OkStatus();
}

// Each expert file under the mp rank DeepSpeed writes it from: ep rank e's
// experts by global rank e (expert data parallel rank 0), tp rank e % tp.
absl::Status MoeState::CheckExpertFilePlaces() const {
  for (const auto& [key, m] : expert_file_mp_) {
    const int e = key.second / (num_experts_[key.first] / ep_);
    if (m != e % tp_) {
      return absl::InvalidArgumentError(absl::StrCat(
          expert_files_.at(key), ": expert ", key.second, " of MoE layer ", key.first, " is ep rank ", e, "'s (ep ",
          ep_, "), written under mp_rank_", absl::Dec(mp_base_ + e % tp_, absl::kZeroPad2), " at tp ", tp_,
          ", found mp rank ", mp_base_ + m));
    }
  }
  return absl::OkStatus();
}

// Each group's ZeRO layout (non-expert groups over dp, expert groups over
// dp / ep); every expert param's local id below its layer's experts per ep
// rank.
absl::Status MoeState::MakeLayouts() {
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    if (g.tp_shapes.empty()) g.tp_shapes = {g.shapes};
    g.tp_layouts.clear();
    for (size_t t = 0; t < g.tp_shapes.size(); ++t) {
      if (g.expert && g.tp_shapes[t] != g.shapes) {
        return InvalidIn(Mp(static_cast<int>(t)).path(),
                         absl::StrCat("param_shapes[", gi, "] (an expert group) differs from ", mp_->path(),
                                      "'s: experts are whole on every tp rank"));
      }
      std::vector<int64_t> numels;
      for (const auto& s : g.tp_shapes[t]) numels.push_back(internal::Numel(s));
      g.tp_layouts.push_back(deepspeed::ZeroGroupLayout::Make(std::move(numels), g.expert ? world() / ep_ : dp_));
    }
    g.layout = g.tp_layouts[0];
    if (!g.expert) continue;
    for (const std::string& n : g.names) {
      std::string prefix, suffix;
      int id = 0;
      SplitExpertName(n, &prefix, &id, &suffix);
      const int layer = LayerIndex(prefix);
      if (id >= num_experts_[layer] / ep_) {
        return InvalidIn(mp_->path(), absl::StrCat("'", n, "': local expert ", id, " but MoE layer ", layer, " has ",
                                                   num_experts_[layer] / ep_, " per ep rank"));
      }
    }
  }
  return absl::OkStatus();
}

// The model info: topology, optimizer kind and state names, MoE layers; the
// params (trainable non-expert params and experts under global ids, then the
// module's other tensors), module order (the module's tensors, then each
// expert file's keys) and notes.
absl::Status MoeState::BuildInfo(const OptimFile& first) {
  info_.source_topology = {tp_, 1, dp_};
  info_.pipeline = false;
  info_.optimizer_kind = state::OptimizerKind::kZero;
  info_.bf16_file_prefix = bf16_prefix_;
  info_.num_groups = static_cast<int>(groups_.size());
  {
    const Value* zs = first.osd->DictGet("zero_stage");
    UCP_ASSIGN_OR_RETURN(info_.zero_stage, pickle::AsZeroStage(*zs, "zero_stage"), _.Prepend(OptimPath(0) + ": "));
  }
  info_.state_keys = first.StateNames(0);
  info_.scalar_keys = first.ScalarNames(0);
  info_.expert_parallel = ep_;
  for (size_t l = 0; l < num_experts_.size(); ++l) info_.moe_layers.push_back({moe_prefixes_[l], num_experts_[l]});
  for (const Group& g : groups_) info_.expert_groups.push_back(g.expert);
  torch::DType lp = torch::DType::kFloat32;
  for (const auto& [k, v] : mp_->root()->DictGet("module")->dict_items()) {
    if (!k->is(Kind::kStr) || !torch::TorchFile::IsTensor(*v)) continue;
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, mp_->GetTensor(*v));
    info_.module_order.push_back({-1, k->str()});
    lp = t.dtype();
  }
  info_.lp_dtype = lp;
  TrainableShapes trainable;
  UCP_RETURN_IF_ERROR(AddTrainableParams(lp, &trainable));
  UCP_RETURN_IF_ERROR(AddModuleBuffers(trainable));
  UCP_RETURN_IF_ERROR(AddExpertModuleOrder(trainable));
  AddNotes();
  info_.Reindex();
  return absl::OkStatus();
}

// Every group's params, an expert group's once per ep rank under the global
// ids of that rank's experts (where_ says where each lies); `trainable` gets
// their shapes.
absl::Status MoeState::AddTrainableParams(torch::DType lp, TrainableShapes* trainable) {
  const std::string mp_path = mp_->path();
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Group& grp = groups_[g];
    for (int e = 0; e < (grp.expert ? ep_ : 1); ++e) {
      for (size_t i = 0; i < grp.names.size(); ++i) {
        state::ParamState p;
        p.name = grp.names[i];
        if (grp.expert) {
          std::string prefix, suffix;
          int id = 0;
          SplitExpertName(grp.names[i], &prefix, &id, &suffix);
          const int layer = LayerIndex(prefix);
          p.name = ExpertName(prefix, e * (num_experts_[layer] / ep_) + id, suffix);
        } else {
          for (int t = 0; t < tp_; ++t) {
            if (!Mp(t).root()->DictGet("module")->DictGet(p.name)) {
              return InvalidIn(Mp(t).path(), absl::StrCat("param '", p.name, "' of param_shapes is not in module"));
            }
          }
        }
        p.local_name = p.name;
        p.group = static_cast<int>(g);
        p.role = state::TensorRole::kTrainable;
        p.lp_dtype = lp;
        p.tp_shapes = {grp.shapes[i]};
        if (!grp.expert) {
          for (int t = 1; t < tp_; ++t) p.tp_shapes.push_back(grp.tp_shapes[t][i]);
        }
        p.tp_whole = grp.expert;
        p.stages = {0};
        if (!trainable->insert({p.name, grp.shapes[i]}).second) return InvalidIn(mp_path, absl::StrCat("param '", p.name, "' is in param_shapes twice"));
        info_.params.push_back(std::move(p));
        where_.push_back({static_cast<int>(g), static_cast<int>(i), grp.expert ? e : -1});
      }
    }
  }
  return absl::OkStatus();
}

// The module's tensors in no group, kept as they are (role kBuffer): the
// buffer_names (0.19.3+); before 0.19.3 any, recorded as untold_ (nothing
// tells a buffer from a frozen or tied param).
absl::Status MoeState::AddModuleBuffers(const TrainableShapes& trainable) {
  const Value& root = *mp_->root();
  const std::vector<std::string> buffers = StringList(root.DictGet("buffer_names"));
  for (const auto& [k, v] : root.DictGet("module")->dict_items()) {
    if (!k->is(Kind::kStr) || !torch::TorchFile::IsTensor(*v) || trainable.count(k->str())) continue;
    if (std::find(buffers.begin(), buffers.end(), k->str()) == buffers.end()) {
      if (!legacy_) {
        return InvalidIn(mp_->path(),
                         absl::StrCat("module['", k->str(), "'] is neither a param of the optimizer nor a buffer"));
      }
      untold_.push_back(k->str());
    }
    state::ParamState p;
    for (int r = 0; r < tp_; ++r) {
      const Value* b = Mp(r).root()->DictGet("module")->DictGet(k->str());
      if (b == nullptr) return InvalidIn(Mp(r).path(), absl::StrCat("module has no '", k->str(), "' (", mp_->path(), " has)"));
      UCP_ASSIGN_OR_RETURN(torch::Tensor t, Mp(r).GetTensor(*b), _.Prepend(Mp(r).path() + ": "));
      p.lp_dtype = t.dtype();
      p.tp_shapes.push_back(t.sizes());
    }
    p.name = k->str();
    p.local_name = p.name;
    p.role = state::TensorRole::kBuffer;
    p.stages = {0};
    info_.params.push_back(std::move(p));
    where_.push_back({});
  }
  return absl::OkStatus();
}

// The experts' module keys, in their files' order (expert files are opened
// for their keys only; their weights are checked when read): each a weight
// of its layer and expert, in an expert group, of its group's shape.
absl::Status MoeState::AddExpertModuleOrder(const TrainableShapes& trainable) {
  for (size_t l = 0; l < num_experts_.size(); ++l) {
    for (int e = 0; e < num_experts_[l]; ++e) {
      const torch::OpenOptions lazy = read_.Files(/*verify_crc=*/false);
      const std::string path = ExpertPath(static_cast<int>(l), e);
      UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path, lazy));
      if (!f->root()->is(Kind::kDict)) return InvalidIn(path, "expected a dict of expert weights");
      for (const auto& [k, v] : f->root()->dict_items()) {
        std::string prefix, suffix;
        int id = -1;
        if (!k->is(Kind::kStr) || !SplitExpertName(k->str(), &prefix, &id, &suffix) || prefix != moe_prefixes_[l] ||
            id != e) {
          return InvalidIn(path, absl::StrCat("key ", k->DebugString(), " is not a weight of MoE layer ", l, " ('",
                                              moe_prefixes_[l], "') expert ", e));
        }
        auto shape = trainable.find(k->str());
        if (shape == trainable.end()) {
          return InvalidIn(path, absl::StrCat("'", k->str(), "' is in no expert param group of the optimizer files"));
        }
        if (torch::TorchFile::IsTensor(*v)) {
          UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(*v), _.Prepend(path + ": "));
          if (t.sizes() != shape->second) {
            return InvalidIn(path, absl::StrCat("'", k->str(), "' has shape ", ShapeStr(t.sizes()), ", its param group ",
                                                legacy_ ? "(ep rank 0's local expert) " : "(param_shapes) ",
                                                ShapeStr(shape->second)));
          }
        }
        info_.module_order.push_back({-1, k->str()});
      }
    }
  }
  return absl::OkStatus();
}

// What the model info says of the layout: the legacy layout's sources, the
// module tensors it cannot classify, the expert parallelism.
void MoeState::AddNotes() {
  if (legacy_) {
    info_.notes.push_back(absl::StrCat(
        "DeepSpeed ", legacy_version_, " mixture-of-experts layout (before 0.19.3: no param_shapes): each group's params "
        "and their order taken from the optimizer files' param_slice_mappings, shapes from the module and the expert "
        "files", window_mappings_ ? "; the expert groups (mapped only in part before 0.14.5) from the expert files, "
                                    "checked against every rank's window and partition size" : ""));
    if (!untold_.empty()) {
      info_.notes.push_back(absl::StrCat(
          "module tensors in no optimizer group (", absl::StrJoin(untold_, ", "), "): kept as they are; the files of ",
          "DeepSpeed before 0.19.3 do not say whether they are buffers or frozen params"));
    }
  }
  if (tp_ == 1) {
    info_.notes.push_back(absl::StrCat("mixture of experts: ", num_experts_.size(), " MoE layers, ep=", ep_,
                                       ", experts named by global id; dp rank d taken as ep rank d % ", ep_,
                                       " (DeepSpeed's default E + D rank order)"));
    return;
  }
  info_.notes.push_back(absl::StrCat(
      "mixture of experts at tp ", tp_, ": ", num_experts_.size(), " MoE layers, ep=", ep_,
      ", experts named by global id and whole (no tp split); global rank r = dp rank x ", tp_,
      " + tp rank taken as ep rank r % ", ep_, " and expert data parallel rank r / ", ep_,
      " (DeepSpeed's expert groups over global ranks, as 0.19.5 builds them)"));
}

absl::Status MoeState::GroupNamesFromMappings() {
  UCP_ASSIGN_OR_RETURN(RankMappings ranks, ReadRankMappings());
  const size_t n = groups_.size();
  legacy_numels_.assign(n, {});
  const int edp = world() / ep_;
  if (window_mappings_) UCP_RETURN_IF_ERROR(ExpertGroupsFromExpertFiles(ranks));
  for (size_t g = 0; g < n; ++g) {
    Group& grp = groups_[g];
    if (grp.expert && window_mappings_) continue;
    if (!grp.expert) {
      // Each tp rank's slices over its dp group (global ranks d x tp + t): the
      // same params, in the same order, with that rank's numels.
      for (int t = 0; t < tp_; ++t) {
        std::vector<int> ranks_of_t;
        for (int d = 0; d < dp_; ++d) ranks_of_t.push_back(d * tp_ + t);
        std::vector<std::string> names;
        std::vector<int64_t> numels;
        UCP_RETURN_IF_ERROR(MergeMappings(ranks, g, ranks_of_t, &names, &numels));
        if (t == 0) {
          grp.names = std::move(names);
        } else if (names != grp.names) {
          return FileError(OptimPath(t), absl::StatusCode::kInvalidArgument,
                           absl::StrCat("param_slice_mappings[", g, "] of tp rank ", t, " list [",
                                        absl::StrJoin(names, ", "), "], tp rank 0's [", absl::StrJoin(grp.names, ", "),
                                        "]: every tp rank holds a slice of the same params"));
        }
        legacy_numels_[g].push_back(std::move(numels));
      }
    } else {
      // Every ep rank holds the same local experts (local ids): its expert
      // data parallel ranks e, e + ep, ... list them all.
      for (int e = 0; e < ep_; ++e) {
        std::vector<int> ranks_of_e;
        for (int k = 0; k < edp; ++k) ranks_of_e.push_back(DpRank(e, k));
        std::vector<std::string> names;
        std::vector<int64_t> numels;
        UCP_RETURN_IF_ERROR(MergeMappings(ranks, g, ranks_of_e, &names, &numels));
        if (e == 0) {
          grp.names = std::move(names);
          legacy_numels_[g] = {std::move(numels)};
        } else if (names != grp.names || numels != legacy_numels_[g][0]) {
          return FileError(OptimPath(DpRank(e, 0)), absl::StatusCode::kInvalidArgument,
                           absl::StrCat("param_slice_mappings[", g, "] of ep rank ", e, " (dp ranks ", e, ", ", e + ep_,
                                        ", ...) list [", absl::StrJoin(names, ", "), "], ep rank 0's [",
                                        absl::StrJoin(grp.names, ", "),
                                        "] (or other sizes): every ep rank holds the same local experts"));
        }
      }
    }
    if (grp.names.empty()) {
      return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("param group ", g, " has no param in any rank's param_slice_mappings"));
    }
  }
  return absl::OkStatus();
}

// Every rank's param_slice_mappings: (name, fragment numel) per group; and
// each rank's saved fp32 partition sizes (fp32_numels_, -1 when unreadable).
absl::StatusOr<MoeState::RankMappings> MoeState::ReadRankMappings() {
  const size_t n = groups_.size();
  RankMappings ranks(world());
  for (int d = 0; d < world(); ++d) {  // d: the global rank (dp rank x tp + tp rank)
    const std::string path = OptimPath(d);
    const torch::OpenOptions lazy = read_.Files(/*verify_crc=*/false);  // checked when the file is read for its tensors
    UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path, lazy));
    const Value* mappings = internal::DictPath(f->root().get(), {"optimizer_state_dict", "param_slice_mappings"});
    if (mappings == nullptr || !mappings->is(Kind::kList) || mappings->items().size() != n) {
      return FileError(path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("no param_slice_mappings with one dict per param group (", n,
                                    "): the mixture-of-experts layout of DeepSpeed ", legacy_version_,
                                    " names its params only there (its model states have no param_shapes)"));
    }
    ranks[d].resize(n);
    fp32_numels_.resize(world());
    fp32_numels_[d].assign(n, -1);
    if (const Value* fp32s = internal::DictPath(f->root().get(), {"optimizer_state_dict", "single_partition_of_fp32_groups"});
        fp32s != nullptr && fp32s->is(Kind::kList) && fp32s->items().size() == n) {
      for (size_t g = 0; g < n; ++g) {
        if (torch::TorchFile::IsTensor(*fp32s->items()[g])) {
          if (auto t = f->GetTensor(*fp32s->items()[g]); t.ok()) fp32_numels_[d][g] = t->numel();
        }
      }
    }
    for (size_t g = 0; g < n; ++g) {
      UCP_RETURN_IF_ERROR(ForEachSliceMapping(path, *mappings->items()[g], g, [&](const std::string& name, const Value& v) -> absl::Status {
        UCP_ASSIGN_OR_RETURN(pickle::FragmentAddress a, pickle::AsFragmentAddress(v, name), _.Prepend(path + ": "));
        ranks[d][g].push_back({name, a.numel});
        return absl::OkStatus();
      }));
    }
  }
  return ranks;
}

// Group `g`'s params in flatten order over `dp_ranks` (partition order): a
// param split between two ranks ends one rank's list and starts the next's.
absl::Status MoeState::MergeMappings(const RankMappings& ranks, size_t g, const std::vector<int>& dp_ranks,
                                     std::vector<std::string>* names, std::vector<int64_t>* numels) const {
  for (int d : dp_ranks) {
    const auto& list = ranks[d][g];
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& [name, numel] = list[i];
      if (i == 0 && !names->empty() && names->back() == name) {
        numels->back() += numel;
        continue;
      }
      if (std::find(names->begin(), names->end(), name) != names->end()) {
        return FileError(OptimPath(d), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("param_slice_mappings[", g, "] lists '", name,
                                      "', which an earlier partition of the group already ended"));
      }
      names->push_back(name);
      numels->push_back(numel);
    }
  }
  return absl::OkStatus();
}

absl::Status MoeState::ExpertGroupsFromExpertFiles(const RankMappings& ranks) {
  UCP_ASSIGN_OR_RETURN(ExpertGroupOf group_of, ExpertGroupsInWindows(ranks));
  std::vector<int> expert_groups;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].expert) expert_groups.push_back(static_cast<int>(g));
  }
  UCP_ASSIGN_OR_RETURN(ExpertTemplate tmpl, ReadExpertTemplate(group_of));
  std::vector<std::vector<std::string>> names;
  std::vector<std::vector<int64_t>> numels;
  if (tmpl.unknown.empty()) {
    ExpertGroupMembers(tmpl, group_of, &names, &numels);
  } else {
    UCP_RETURN_IF_ERROR(AssignUnlistedExpertParams(ranks, tmpl, group_of, expert_groups, &names, &numels));
  }
  for (int g : expert_groups) {
    groups_[g].names = names[g];
    legacy_numels_[g] = {numels[g]};
  }
  return absl::OkStatus();
}

// Which expert group each (MoE layer prefix, expert param suffix) is in, as
// any rank's mappings show it (they list only a window of each group).
absl::StatusOr<MoeState::ExpertGroupOf> MoeState::ExpertGroupsInWindows(const RankMappings& ranks) const {
  ExpertGroupOf group_of;
  for (int d = 0; d < world(); ++d) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!groups_[g].expert) continue;
      for (const auto& [name, numel] : ranks[d][g]) {
        std::string prefix, suffix;
        int id = 0;
        if (!SplitExpertName(name, &prefix, &id, &suffix)) {
          return FileError(OptimPath(d), absl::StatusCode::kInvalidArgument,
                           absl::StrCat("'", name, "' is in expert param group ", g, " but is not named '<prefix>",
                                        kExpertInfix, "<id>.<name>'"));
        }
        auto [it, fresh] = group_of.insert({{prefix, suffix}, static_cast<int>(g)});
        if (!fresh && it->second != static_cast<int>(g)) {
          return FileError(OptimPath(d), absl::StatusCode::kInvalidArgument,
                           absl::StrCat("expert param '", suffix, "' of '", prefix, "' is in param groups ", it->second,
                                        " and ", g));
        }
      }
    }
  }
  return group_of;
}

// Each MoE layer's prefix and expert params (suffixes, in module order)
// from its global expert 0 (ep rank 0's local expert 0); every local expert
// is a copy of it (deepspeed.moe.experts.Experts), which the optimizer
// files' windows and partition sizes then confirm (ParseOptim). Params no
// window lists (not in `group_of`) are `unknown`.
absl::StatusOr<MoeState::ExpertTemplate> MoeState::ReadExpertTemplate(const ExpertGroupOf& group_of) const {
  ExpertTemplate out;
  out.suffixes.resize(num_experts_.size());
  for (size_t l = 0; l < num_experts_.size(); ++l) {
    const std::string path = ExpertPath(static_cast<int>(l), 0);
    const torch::OpenOptions lazy = read_.Files(/*verify_crc=*/false);
    UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path, lazy));
    if (!f->root()->is(Kind::kDict)) {
      return FileError(path, absl::StatusCode::kInvalidArgument, "expected a dict of expert weights");
    }
    std::string layer_prefix;
    for (const auto& [k, v] : f->root()->dict_items()) {
      std::string prefix, suffix;
      int id = -1;
      if (!k->is(Kind::kStr) || !SplitExpertName(k->str(), &prefix, &id, &suffix) || id != 0 ||
          (!layer_prefix.empty() && prefix != layer_prefix)) {
        return FileError(path, absl::StatusCode::kInvalidArgument,
                         absl::StrCat("key ", k->DebugString(), " is not a weight of one MoE layer's expert 0"));
      }
      layer_prefix = prefix;
      UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(*v), _.Prepend(path + ": "));
      out.suffixes[l].push_back(suffix);
      out.numel_of[{prefix, suffix}] = t.numel();
      if (!group_of.count({prefix, suffix})) out.unknown.push_back({prefix, suffix});
    }
    if (layer_prefix.empty()) return FileError(path, absl::StatusCode::kInvalidArgument, "holds no expert weight");
    out.prefixes.push_back(layer_prefix);
  }
  return out;
}

// Each expert group's local names and numels in module order (MoE layers,
// local experts, params) when expert params are in the groups `of` says.
void MoeState::ExpertGroupMembers(const ExpertTemplate& tmpl, const ExpertGroupOf& of,
                                  std::vector<std::vector<std::string>>* names,
                                  std::vector<std::vector<int64_t>>* numels) const {
  names->assign(groups_.size(), {});
  numels->assign(groups_.size(), {});
  for (size_t l = 0; l < tmpl.prefixes.size(); ++l) {
    for (int k = 0; k < num_experts_[l] / ep_; ++k) {
      for (const std::string& suffix : tmpl.suffixes[l]) {
        const int g = of.at({tmpl.prefixes[l], suffix});
        (*names)[g].push_back(ExpertName(tmpl.prefixes[l], k, suffix));
        (*numels)[g].push_back(tmpl.numel_of.at({tmpl.prefixes[l], suffix}));
      }
    }
  }
}

// Whether every rank's window and fp32 partition are what the expert groups
// `names` / `numels` give.
bool MoeState::WindowsFit(const RankMappings& ranks, const std::vector<int>& expert_groups,
                          const std::vector<std::vector<std::string>>& names,
                          const std::vector<std::vector<int64_t>>& numels) const {
  const int edp = world() / ep_;
  for (int g : expert_groups) {
    const auto layout = deepspeed::ZeroGroupLayout::Make(numels[g], edp);
    int64_t total = 0;
    for (int k = 0; k < edp; ++k) {
      total += fp32_numels_[DpRank(0, k)][g];
      const auto [start, size] = deepspeed::ExpertMappingWindow(layout, k, dp_);
      const auto frags = layout.FragmentsOfWindow(start, size);
      for (int e = 0; e < ep_; ++e) {
        const auto& listed = ranks[DpRank(e, k)][g];
        if (listed.size() != frags.size()) return false;
        for (size_t i = 0; i < frags.size(); ++i) {
          if (listed[i].first != names[g][frags[i].param_index] || listed[i].second != frags[i].numel) return false;
        }
      }
    }
    if (total != layout.numel()) return false;
  }
  return true;
}

// Tries every assignment of the params no window lists to the expert
// groups: the one whose windows and partition sizes are the files', if
// exactly one is, gives `names` / `numels`.
absl::Status MoeState::AssignUnlistedExpertParams(const RankMappings& ranks, const ExpertTemplate& tmpl,
                                                  const ExpertGroupOf& group_of, const std::vector<int>& expert_groups,
                                                  std::vector<std::vector<std::string>>* names,
                                                  std::vector<std::vector<int64_t>>* numels) const {
  int64_t combos = 1;
  for (size_t i = 0; i < tmpl.unknown.size() && combos <= 4096; ++i) {
    combos *= static_cast<int64_t>(expert_groups.size());
  }
  std::vector<std::string> unknown_names;
  for (const auto& [prefix, suffix] : tmpl.unknown) unknown_names.push_back(absl::StrCat(prefix, ".<expert>.", suffix));
  const std::string why = absl::StrCat(
      "DeepSpeed ", legacy_version_, " (before 0.14.5) lists only a window of 1/ep of each expert group in "
      "param_slice_mappings, and no window lists ", absl::StrJoin(unknown_names, ", "));
  if (combos > 4096) {
    return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                     absl::StrCat(why, ": too many expert params of unknown param group to tell"));
  }
  int found = 0;
  for (int64_t c = 0; c < combos; ++c) {
    ExpertGroupOf of = group_of;
    int64_t x = c;
    for (const auto& key : tmpl.unknown) {
      of[key] = expert_groups[x % expert_groups.size()];
      x /= static_cast<int64_t>(expert_groups.size());
    }
    std::vector<std::vector<std::string>> n;
    std::vector<std::vector<int64_t>> m;
    ExpertGroupMembers(tmpl, of, &n, &m);
    if (!WindowsFit(ranks, expert_groups, n, m)) continue;
    if (++found > 1) break;
    *names = std::move(n);
    *numels = std::move(m);
  }
  if (found != 1) {
    return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                     absl::StrCat(why, ": their param group is unknown (", found == 0 ? "no" : "more than one",
                                  " assignment to the expert groups gives the files' windows and partition sizes)"));
  }
  return absl::OkStatus();
}

absl::Status MoeState::GroupShapesFromTensors() {
  std::map<std::pair<int, int>, std::unique_ptr<torch::TorchFile>> experts;
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& grp = groups_[g];
    grp.tp_shapes.clear();
    // Each tp rank's shapes: a dense param's slice from that rank's module,
    // an expert group's whole (the same on every tp rank) from the expert files.
    for (int t = 0; t < tp_; ++t) {
      if (grp.expert && t > 0) {
        grp.tp_shapes.push_back(grp.tp_shapes[0]);
        continue;
      }
      const std::vector<int64_t>& listed = legacy_numels_[g][grp.expert ? 0 : t];
      const std::string mappings =
          tp_ == 1 || grp.expert ? "the optimizer files' param_slice_mappings"
                                 : absl::StrCat("tp rank ", t, "'s param_slice_mappings");
      std::vector<std::vector<int64_t>> shapes;
      for (size_t i = 0; i < grp.names.size(); ++i) {
        const std::string& name = grp.names[i];
        std::string from;
        torch::Tensor tensor;
        if (!grp.expert) {
          from = Mp(t).path();
          const Value* v = Mp(t).root()->DictGet("module")->DictGet(name);
          if (v == nullptr || !torch::TorchFile::IsTensor(*v)) {
            return FileError(from, absl::StatusCode::kInvalidArgument,
                             absl::StrCat("module has no tensor '", name, "', a param of group ", g, " in ", mappings,
                                          ": its shape is unknown (DeepSpeed ", legacy_version_,
                                          " saves no param_shapes for mixture-of-experts models)"));
          }
          UCP_ASSIGN_OR_RETURN(tensor, Mp(t).GetTensor(*v), _.Prepend(from + ": "));
        } else {
          // Local expert `id` of ep rank 0 is global expert `id`.
          std::string prefix, suffix;
          int id = 0;
          SplitExpertName(name, &prefix, &id, &suffix);
          const int layer = LayerIndex(prefix);
          from = ExpertPath(layer, id);
          auto& f = experts[{layer, id}];
          if (f == nullptr) {
            const torch::OpenOptions lazy = read_.Files(/*verify_crc=*/false);  // checked when the weights are read
            UCP_ASSIGN_OR_RETURN(f, torch::TorchFile::Open(from, lazy));
          }
          const Value* v = f->root()->is(Kind::kDict) ? f->root()->DictGet(name) : nullptr;
          if (v == nullptr || !torch::TorchFile::IsTensor(*v)) {
            return FileError(from, absl::StatusCode::kInvalidArgument,
                             absl::StrCat("no tensor '", name, "' (expert param of group ", g,
                                          " in the optimizer files): its shape is unknown"));
          }
          UCP_ASSIGN_OR_RETURN(tensor, f->GetTensor(*v), _.Prepend(from + ": "));
        }
        std::vector<int64_t> shape(tensor.sizes().begin(), tensor.sizes().end());
        if (listed[i] >= 0 && internal::Numel(shape) != listed[i]) {
          return FileError(from, absl::StatusCode::kInvalidArgument,
                           absl::StrCat("'", name, "' has shape ", ShapeStr(shape), " (", internal::Numel(shape),
                                        " elements), but ", mappings, "[", g, "] hold ", listed[i],
                                        " elements of it"));
        }
        shapes.push_back(std::move(shape));
      }
      grp.tp_shapes.push_back(std::move(shapes));
    }
    grp.shapes = grp.tp_shapes[0];
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MoeState::OptimFile>> MoeState::ParseOptim(int dp) const {
  const std::string path = OptimPath(dp);
  auto out = std::make_unique<OptimFile>();
  out->path = path;
  // The flat partitions are CRC-checked when used (OptimSlice), the rest below.
  UCP_ASSIGN_OR_RETURN(out->file, torch::TorchFile::Open(path, read_.Files(/*verify_crc=*/false)));
  auto err = [&](absl::string_view what) { return FileError(path, absl::StatusCode::kInvalidArgument, what); };
  const Value& root = *out->file->root();
  UCP_ASSIGN_OR_RETURN(const Value* osd, GetField(root, "optimizer_state_dict", "optimizer states"), _.Prepend(path + ": "));
  out->osd = osd;
  const Value* gp = osd->DictGet("group_paddings");
  const Value* fp32s = osd->DictGet("single_partition_of_fp32_groups");
  const Value* mappings = osd->DictGet("param_slice_mappings");
  const Value* states = internal::DictPath(osd, {"base_optimizer_state", "state"});
  const size_t n = groups_.size();
  if (gp == nullptr || fp32s == nullptr || mappings == nullptr || states == nullptr || !gp->is(Kind::kList) ||
      !fp32s->is(Kind::kList) || !mappings->is(Kind::kList) || !states->is(Kind::kDict) || gp->items().size() != n ||
      fp32s->items().size() != n || mappings->items().size() != n) {
    return err(absl::StrCat("expected group_paddings, single_partition_of_fp32_groups, param_slice_mappings and "
                            "base_optimizer_state.state for ", n, " param groups"));
  }
  const int ep_rank = dp % ep_, edp_rank = dp / ep_;  // dp: the global rank
  for (size_t g = 0; g < n; ++g) {
    const Group& grp = groups_[g];
    const int rank = grp.expert ? edp_rank : dp / tp_;
    const deepspeed::ZeroGroupLayout& layout = grp.expert ? grp.layout : grp.tp_layouts[dp % tp_];
    const int64_t p = layout.partition_numel();
    UCP_ASSIGN_OR_RETURN(int64_t padding, AsInt(*gp->items()[g], "group_paddings"), _.Prepend(path + ": "));
    const int64_t last = layout.PaddingAs(rank, deepspeed::PaddingConvention::kLastRank);
    const int64_t per = layout.PaddingAs(rank, deepspeed::PaddingConvention::kPerRank);
    if (padding != last && padding != per) {
      return err(absl::StrCat("group_paddings[", g, "] is ", padding, ", expected ", per, " or ", last));
    }
    const int64_t lean = layout.LeanNumel(padding);
    UCP_ASSIGN_OR_RETURN(torch::Tensor fp32, out->file->GetTensor(*fp32s->items()[g]), _.Prepend(path + ": "));
    UCP_RETURN_IF_ERROR(CheckDense(fp32, path, absl::StrCat("single_partition_of_fp32_groups[", g, "]")));
    if (fp32.dim() != 1 || (fp32.numel() != lean && fp32.numel() != p)) {
      return err(absl::StrCat("single_partition_of_fp32_groups[", g, "] has shape ", ShapeStr(fp32.sizes()),
                              ", expected [", lean, "]"));
    }
    out->fp32.push_back(std::move(fp32));
    const Value* st = states->DictGet(Value::Int(static_cast<int64_t>(g)));
    if (st == nullptr || !st->is(Kind::kDict)) return err(absl::StrCat("no optimizer state for group ", g));
    UCP_ASSIGN_OR_RETURN(internal::GroupStates split,
                         deepspeed::SplitFlatStates(*out->file, path, *st, g,
                                                    {"group", p, lean, deepspeed::FlatStatesSpec::Dense::kPerElement}));
    if (!out->states.empty()) {
      std::vector<std::string> a = out->StateNames(0), b;
      for (const auto& e : split.per_element) b.push_back(e.first);
      if (a != b) {
        return err(absl::StrCat("group ", g, " has optimizer states [", absl::StrJoin(b, ", "), "], group 0 has [",
                                absl::StrJoin(a, ", "), "]"));
      }
    }
    out->states.push_back(std::move(split.per_element));
    out->scalars.push_back(std::move(split.scalars));
    // param_slice_mappings: local names, fragments of the layout.
    const Value& m = *mappings->items()[g];
    const auto expected = grp.expert && window_mappings_ ? std::apply(
                                                               [&](int64_t start, int64_t size) {
                                                                 return layout.FragmentsOfWindow(start, size);
                                                               },
                                                               deepspeed::ExpertMappingWindow(layout, rank, dp_))
                                                         : layout.Fragments(rank);
    if (!m.is(Kind::kDict) || m.dict_items().size() != expected.size()) {
      return err(absl::StrCat("param_slice_mappings[", g, "] lists ", m.is(Kind::kDict) ? m.dict_items().size() : 0,
                              " params, expected ", expected.size(), grp.expert ? absl::StrCat(" (ep rank ", ep_rank, ")") : ""));
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& [k, v] = m.dict_items()[i];
      const std::string& want = grp.names[expected[i].param_index];
      if (!k->is(Kind::kStr) || k->str() != want) {
        return err(absl::StrCat("param_slice_mappings[", g, "] entry ", i, " is ", k->DebugString(), ", expected '",
                                want, "'"));
      }
      UCP_ASSIGN_OR_RETURN(pickle::FragmentAddress a, pickle::AsFragmentAddress(*v, want), _.Prepend(path + ": "));
      if (a.numel != expected[i].numel || a.start != expected[i].partition_offset) {
        return err(absl::StrCat("param '", want, "' has fragment_address(numel=", a.numel, ", start=", a.start,
                                "), expected (numel=", expected[i].numel, ", start=", expected[i].partition_offset, ")"));
      }
    }
  }
  UCP_RETURN_IF_ERROR(out->VerifyStoragesButPartitions());
  return out;
}

absl::StatusOr<const MoeState::OptimFile*> MoeState::Optim(int dp) const {
  if (!optim_files_.Has(dp)) {
    return absl::NotFoundError(absl::StrCat(OptimPath(dp), ": not part of this checkpoint"));
  }
  return optim_files_.Get(dp, [&](int d) { return ParseOptim(d); });
}

absl::StatusOr<std::vector<tp::TensorPlan>> MoeState::Slices(const state::ParamState& param, int stage,
                                                            const std::string& state) const {
  if (!stages_.empty()) return StageOf(param).Slices(param, 0, state);
  const int i = info_.IndexOf(param.name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
  const Where& w = where_[i];
  if (state == state::kLpState) {
    std::string prefix, suffix;
    int id = 0;
    if (w.ep_rank >= 0 && SplitExpertName(param.name, &prefix, &id, &suffix)) {
      const int layer = LayerIndex(prefix);
      const std::string path = ExpertPath(layer, id);
      const torch::TorchFile* f = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto& cached = expert_cache_[{layer, id}];
        if (cached == nullptr) {
          UCP_ASSIGN_OR_RETURN(cached, torch::TorchFile::Open(path, read_.Files()));
        }
        f = cached.get();
      }
      const Value* v = f->root()->is(Kind::kDict) ? f->root()->DictGet(param.name) : nullptr;
      if (v == nullptr) return absl::NotFoundError(absl::StrCat(path, ": no '", param.name, "'"));
      UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(*v));
      return std::vector<tp::TensorPlan>{tp::TensorPlan::FromTensor(t)};
    }
    std::vector<tp::TensorPlan> out;
    for (int t = 0; t < tp_; ++t) {
      const Value* v = Mp(t).root()->DictGet("module")->DictGet(param.name);
      if (v == nullptr) return absl::NotFoundError(absl::StrCat(Mp(t).path(), ": module has no '", param.name, "'"));
      UCP_ASSIGN_OR_RETURN(torch::Tensor tensor, Mp(t).GetTensor(*v));
      out.push_back(tp::TensorPlan::FromTensor(tensor));
    }
    return out;
  }
  if (w.group < 0) {
    return absl::NotFoundError(absl::StrCat("'", param.name, "' has no optimizer state '", state, "'"));
  }
  const Group& grp = groups_[w.group];
  std::vector<tp::TensorPlan> out;
  for (int t = 0; t < (grp.expert ? 1 : tp_); ++t) {
    UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, OptimSlice(param, w, t, state));
    out.push_back(std::move(plan));
  }
  return out;
}

// A trainable param's `state` from the optimizer files: a dense param's tp
// slice `t` (the partitions of tp rank t's dp group), an expert whole (the
// partitions of its ep rank's expert data parallel group).
absl::StatusOr<tp::TensorPlan> MoeState::OptimSlice(const state::ParamState& param, const Where& w, int t,
                                                    const std::string& state) const {
  const Group& grp = groups_[w.group];
  std::vector<torch::Tensor> pieces;
  for (const auto& [rank, frag] : grp.tp_layouts[t].FragmentsOfParam(w.index)) {
    const int d = grp.expert ? DpRank(w.ep_rank, rank) : rank * tp_ + t;
    UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(d));
    const torch::Tensor* flat = f->Flat(w.group, state);
    if (flat == nullptr) {
      return absl::NotFoundError(absl::StrCat(OptimPath(d), ": group ", w.group, " has no optimizer state '", state, "'"));
    }
    UCP_RETURN_IF_ERROR(f->VerifyPartitionIfChecked(*flat, checked_inputs_, PartitionName(w.group, state)));
    UCP_ASSIGN_OR_RETURN(torch::Tensor piece, flat->Narrow(0, frag.partition_offset, frag.numel),
                         _.Prepend(absl::StrCat(OptimPath(d), ": param '", param.name, "' ", state, ": ")));
    pieces.push_back(std::move(piece));
  }
  return tp::TensorPlan::FromPieces(torch::DType::kFloat32, grp.tp_shapes[t][w.index], pieces);
}

absl::StatusOr<state::FileValue> MoeState::GroupScalar(int group, const std::string& key) const {
  // Pipeline stages step together: stage 0's scalars are every stage's.
  if (!stages_.empty()) return stages_[0]->GroupScalar(group, key);
  UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(0));
  if (group < 0 || group >= static_cast<int>(f->scalars.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no param group ", group));
  }
  return f->Scalar(group, key);
}

std::vector<state::InputRange> MoeState::Inputs(const state::ParamState& param) const {
  if (!stages_.empty()) return StageOf(param).Inputs(param);
  std::vector<state::InputRange> out;
  const int i = info_.IndexOf(param.name);
  if (i < 0) return out;
  const Where& w = where_[i];
  if (w.group < 0) {
    for (int t = 0; t < tp_; ++t) out.push_back({Mp(t).path(), absl::StrCat("module.", param.name), 0, -1});
    return out;
  }
  const Group& grp = groups_[w.group];
  for (int t = 0; t < (grp.expert ? 1 : tp_); ++t) {
    for (const auto& [rank, frag] : grp.tp_layouts[t].FragmentsOfParam(w.index)) {
      const int d = grp.expert ? DpRank(w.ep_rank, rank) : rank * tp_ + t;
      out.push_back({OptimPath(d), PartitionName(w.group, state::kFp32State), frag.partition_offset * 4,
                     frag.numel * 4});
      for (const std::string& key : info_.state_keys) {
        out.push_back({OptimPath(d), PartitionName(w.group, key), frag.partition_offset * 4, frag.numel * 4});
      }
    }
  }
  return out;
}

std::vector<std::string> MoeState::InputFiles() const {
  std::vector<std::string> out;
  if (!stages_.empty()) {
    for (const auto& s : stages_) {
      for (auto& f : s->InputFiles()) out.push_back(std::move(f));
    }
    return out;
  }
  for (int t = 0; t < tp_; ++t) out.push_back(Mp(t).path());
  for (int r = 0; r < world(); ++r) out.push_back(OptimPath(r));
  for (const auto& [key, path] : expert_files_) out.push_back(path);
  return out;
}

absl::Status MoeState::VerifyInput(const std::string& path) const {
  if (!stages_.empty()) {
    for (const auto& s : stages_) {
      const std::vector<std::string> files = s->InputFiles();
      if (std::find(files.begin(), files.end(), path) != files.end()) return s->VerifyInput(path);
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a file of the checkpoint ", dir_));
  }
  for (int r = 0; r < world(); ++r) {
    if (path != OptimPath(r)) continue;
    UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(r));
    return f->VerifyPartitions();
  }
  for (int t = 0; t < tp_; ++t) {
    if (path == Mp(t).path()) return absl::OkStatus();
  }
  for (const auto& [key, p] : expert_files_) {
    if (p == path) return torch::TorchFile::Open(path, read_.Files()).status();  // every CRC
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a file of the checkpoint ", dir_));
}

void MoeState::SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const {
  for (const auto& s : stages_) s->SetCheckedInputs(keys);
  checked_inputs_.Set(std::move(keys));
}

absl::StatusOr<state::FileValue> MoeState::OptimizerCommon() const {
  if (!stages_.empty()) return stages_[0]->OptimizerCommon();
  UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(0));
  ValuePtr out = Value::MakeDict();
  for (const auto& [k, v] : f->osd->dict_items()) {
    if (k->is(Kind::kStr) && (k->str() == "base_optimizer_state" || k->str() == "param_slice_mappings" ||
                              k->str() == "single_partition_of_fp32_groups")) {
      continue;
    }
    out->DictSet(k, v);
  }
  const Value* base = f->osd->DictGet("base_optimizer_state");
  if (base != nullptr && base->is(Kind::kDict)) {
    if (ValuePtr groups = base->DictGetPtr("param_groups")) out->DictSet(Value::Str("param_groups"), groups);
  }
  return state::FileValue{out, state::Unowned(f->file.get())};
}

state::FileValue MoeState::ModelStatesRoot(int pp, int tp) const {
  if (!stages_.empty()) return stages_[std::max(0, std::min(pp, pp_ - 1))]->ModelStatesRoot(0, tp);
  const torch::TorchFile& f = Mp(std::max(0, std::min(tp, tp_ - 1)));
  return state::FileValue{f.root(), state::Unowned(&f)};
}

std::string MoeState::ModelStatesPath(int pp, int tp) const {
  if (!stages_.empty()) return stages_[std::max(0, std::min(pp, pp_ - 1))]->ModelStatesPath(0, tp);
  return Mp(std::max(0, std::min(tp, tp_ - 1))).path();
}

state::FileValue MoeState::SavedDsConfig() const {
  if (!stages_.empty()) return stages_[0]->SavedDsConfig();
  if (ValuePtr c = mp_->root()->DictGetPtr("ds_config")) return state::FileValue{c, state::Unowned(mp_.get())};
  auto f = Optim(0);
  if (!f.ok() || !(*f)->file->root()->is(Kind::kDict)) return state::FileValue{};
  return state::FileValue{(*f)->file->root()->DictGetPtr("ds_config"), state::Unowned((*f)->file.get())};
}

const pickle::Value& MoeState::checkpoint_info() const {
  if (!stages_.empty()) return stages_[0]->checkpoint_info();
  const Value* v = mp_->root()->DictGet("universal_checkpoint_info");
  return v != nullptr ? *v : *empty_dict_;
}

const pickle::Value* MoeState::args() const {
  if (!stages_.empty()) return stages_[0]->args();
  const Value* v = mp_->root()->DictGet("args");
  if (v == nullptr || v->is_none()) return nullptr;
  if (v->is(Kind::kDict)) return v;
  auto ns = pickle::AsNamespace(*v);
  return ns.ok() ? *ns : nullptr;
}

}  // namespace ucp::deepspeed_moe
