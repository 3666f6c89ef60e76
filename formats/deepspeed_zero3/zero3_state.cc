#include "formats/deepspeed_zero3/zero3_state.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "format/pickle/accessors.h"
#include "deepspeed/value_util.h"

namespace ucp::deepspeed_zero3 {

using deepspeed::ReadLatestTag;
namespace internal = ::ucp::deepspeed::internal;

namespace {

// How Inputs names a flat partition of sub-group `s` (state::kFp32State or a
// per-element state's key).
std::string PartitionName(int s, const std::string& state) {
  return state == state::kFp32State ? absl::StrCat("fp32_flat_groups[", s, "]")
                                    : absl::StrCat("optimizer_state_dict.state[", s, "].", state);
}

using internal::CheckDense;
using internal::DictPath;
using internal::FileError;
using internal::ShapeStr;
using internal::StringList;
using pickle::AsInt;
using pickle::AsSequence;
using pickle::AsTorchSize;
using pickle::GetField;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// The tag folder of `path` (following `latest` when `path` has no checkpoint
// files of its own), or "" when there is none.
std::string TagFolder(const std::string& path_in) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  auto names = ListDirectory(path);
  if (!names.ok()) return "";
  for (const auto& n : *names) {
    if (deepspeed::ParseCheckpointFileName(n)) return path;
  }
  if (PathExists(JoinPath(path, deepspeed::kLatestFile))) {
    auto tag = ReadLatestTag(path, deepspeed::kLatestFile);
    if (tag.ok() && IsDirectory(JoinPath(path, *tag))) return JoinPath(path, *tag);
  }
  return path;
}

}  // namespace

bool IsZero3Folder(const std::string& path) {
  const std::string dir = TagFolder(path);
  auto names = ListDirectory(dir);
  if (!names.ok()) return false;
  for (const auto& n : *names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kZero3Model) return true;
  }
  return false;
}


absl::StatusOr<std::unique_ptr<Zero3State>> Zero3State::Open(const std::string& path,
                                                             const deepspeed::ReadOptions& read) {
  std::unique_ptr<Zero3State> s(new Zero3State());
  s->read_ = read;
  s->dir_ = TagFolder(path);
  if (!IsDirectory(s->dir_)) return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint folder"));
  UCP_RETURN_IF_ERROR(s->Load());
  if (s->mp_world_ == 1) return s;
  // Tensor parallelism: each mp rank's files are a ZeRO-3 checkpoint of its
  // tp slice of every param; one state per rank, this one their union.
  std::unique_ptr<Zero3State> all(new Zero3State());
  all->read_ = read;
  all->dir_ = s->dir_;
  all->mp_world_ = s->mp_world_;
  all->tp_ranks_.push_back(std::move(s));
  for (int r = 1; r < all->mp_world_; ++r) {
    std::unique_ptr<Zero3State> rank(new Zero3State());
    rank->read_ = read;
    rank->dir_ = all->dir_;
    rank->mp_rank_ = r;
    UCP_RETURN_IF_ERROR(rank->Load());
    all->tp_ranks_.push_back(std::move(rank));
  }
  UCP_RETURN_IF_ERROR(all->BuildTpInfo());
  return all;
}

absl::StatusOr<std::unique_ptr<Zero3State>> Zero3State::OpenUniversal(const std::string& path,
                                                                      const deepspeed::ReadOptions& read) {
  std::unique_ptr<Zero3State> s(new Zero3State());
  s->read_ = read;
  s->dir_ = path;
  s->universal_ = true;
  if (!IsDirectory(s->dir_)) return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint folder"));
  UCP_RETURN_IF_ERROR(s->Load());
  return s;
}

std::string Zero3State::OptimPath(int dp) const {
  if (universal_) {
    return JoinPath(JoinPath(dir_, deepspeed::kUniversalZeroDir), deepspeed::kUniversalOptimizerStateFile);
  }
  return JoinPath(dir_, deepspeed::OptimFileName(dp, mp_rank_, bf16_prefix_));
}

std::string Zero3State::ParamStatePath(const Param& p, const std::string& state) const {
  return JoinPath(JoinPath(JoinPath(dir_, deepspeed::kUniversalZeroDir), p.name), state + ".pt");
}

// A ZeRO-3 checkpoint saved at tp > 1 in the stage-3 universal layout
// (ds_to_universal.py 0.19.5 on, `ucp convert`): each param's states merged
// over tp in the stage 1/2 dict, beside mp rank 0's model states (or every mp
// rank's), whose param_shapes are tp slices. Read at tp 1: each trainable
// param's shape is its fp32.pt 'param' tensor's (merged_). Frozen params
// there are mp rank 0's fragments of its slices: refused.
absl::Status Zero3State::ReadMergedShapes() {
  merged_ = mp_world_ != 1;
  if (!params_.empty()) {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f,
                         torch::TorchFile::Open(ParamStatePath(params_[0], state::kFp32State), read_.Files()));
    merged_ = merged_ || f->root()->is(Kind::kDict);
  }
  if (!merged_) return absl::OkStatus();
  if (!frozen_.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        dir_, ": the stage-3 universal folder of a ZeRO-3 checkpoint saved at tp > 1 with frozen params ('",
        frozen_[0].name, "', ...): it holds mp rank 0's fragments of their tp slices only; reshard the ZeRO-3 "
        "checkpoint it was converted from (`ucp reshard`)"));
  }
  for (Param& p : params_) {
    const std::string path = ParamStatePath(p, state::kFp32State);
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f, torch::TorchFile::Open(path, read_.Files()));
    const Value* t = f->root()->is(Kind::kDict) ? f->root()->DictGet("param") : nullptr;
    if (t == nullptr || !torch::TorchFile::IsTensor(*t)) {
      return FileError(path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("expected a dict with a 'param' tensor (param '", p.name,
                                    "' of a checkpoint saved at tp > 1: merged over tp), found ",
                                    f->root()->DebugString(60)));
    }
    UCP_ASSIGN_OR_RETURN(torch::Tensor full, f->GetTensor(*t));
    if (full.dim() != static_cast<int64_t>(p.shape.size())) {
      return FileError(path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("'param' has shape ", ShapeStr(full.sizes()), ", and param '", p.name,
                                    "' has tp slices of shape ", ShapeStr(p.shape), " in param_shapes"));
    }
    p.shape = full.sizes();
    p.numel = internal::Numel(p.shape);
    p.partition = Zero3PartitionNumel(p.numel, dp_);
  }
  return absl::OkStatus();
}

// A stage-3 universal folder's param state: the raw 1-D float32 tensor of
// its numel, as its shape; merged_: the dict's 'param' tensor of its shape.
absl::StatusOr<tp::TensorPlan> Zero3State::UniversalParamState(const Param& p, const std::string& state) const {
  const std::string path = ParamStatePath(p, state);
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f, torch::TorchFile::Open(path, read_.Files()));
  if (merged_) {
    const Value* t = f->root()->is(Kind::kDict) ? f->root()->DictGet("param") : nullptr;
    if (t == nullptr || !torch::TorchFile::IsTensor(*t)) {
      return FileError(path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("expected a dict with a 'param' tensor (the stage 1/2 dict of a checkpoint saved "
                                    "at tp > 1), found ", f->root()->DebugString(60)));
    }
    UCP_ASSIGN_OR_RETURN(torch::Tensor full, f->GetTensor(*t));
    if (full.dtype() != torch::DType::kFloat32 || full.sizes() != p.shape) {
      return FileError(path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("'param' is a ", std::string(torch::DTypeName(full.dtype())),
                                    ShapeStr(full.sizes()), " tensor, expected float32", ShapeStr(p.shape),
                                    " (param '", p.name, "', as its fp32.pt)"));
    }
    return tp::TensorPlan::FromTensor(full);
  }
  const Value& root = *f->root();
  if (!torch::TorchFile::IsTensor(root)) {
    return FileError(path, absl::StatusCode::kInvalidArgument,
                     absl::StrCat("expected a tensor (the stage-3 universal layout), found ", root.DebugString(60)));
  }
  UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(root));
  if (t.dtype() != torch::DType::kFloat32 || t.dim() != 1 || t.numel() != p.numel) {
    return FileError(path, absl::StatusCode::kInvalidArgument,
                     absl::StrCat("a ", std::string(torch::DTypeName(t.dtype())), ShapeStr(t.sizes()),
                                  " tensor, expected float32[", p.numel, "] (param '", p.name, "' of shape ",
                                  ShapeStr(p.shape), " in param_shapes)"));
  }
  return tp::TensorPlan::FromTensor(t).Reshape(p.shape);
}

std::string Zero3State::ModelPath(int dp) const {
  return JoinPath(dir_, deepspeed::Zero3ModelFileName(dp, mp_rank_));
}

// The union of the mp ranks' states: rank 0's model with each param's tp
// slices; every rank must hold the same params (names, roles, groups, dtypes)
// and the same optimizer states.
absl::Status Zero3State::BuildTpInfo() {
  const Zero3State& first = *tp_ranks_[0];
  info_ = first.info_;
  info_.source_topology.tp = mp_world_;
  for (int r = 1; r < mp_world_; ++r) {
    const Zero3State& rank = *tp_ranks_[static_cast<size_t>(r)];
    const state::ModelInfo& ri = rank.info_;
    const std::string where = absl::StrCat(rank.ModelPath(0), " (mp rank ", r, ") and ", first.ModelPath(0));
    if (ri.params.size() != info_.params.size() || ri.num_groups != info_.num_groups ||
        ri.state_keys != info_.state_keys || ri.source_topology.dp != info_.source_topology.dp) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " disagree: ", ri.params.size(), " vs ", info_.params.size(), " tensors, ", ri.num_groups, " vs ",
          info_.num_groups, " param groups, dp ", ri.source_topology.dp, " vs ", info_.source_topology.dp,
          ", optimizer states [", absl::StrJoin(ri.state_keys, ", "), "] vs [", absl::StrJoin(info_.state_keys, ", "),
          "]"));
    }
    for (state::ParamState& p : info_.params) {
      const state::ParamState* q = ri.Find(p.name);
      if (q == nullptr || q->role != p.role || q->group != p.group || q->lp_dtype != p.lp_dtype ||
          q->tp_shapes.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " disagree on '", p.name, "': ",
            q == nullptr ? "missing in the first"
                         : absl::StrCat(state::TensorRoleName(q->role), " of group ", q->group, " vs ",
                                        state::TensorRoleName(p.role), " of group ", p.group)));
      }
      p.tp_shapes.push_back(q->tp_shapes[0]);
    }
  }
  info_.Reindex();
  return absl::OkStatus();
}

Zero3State::TpRank Zero3State::RankParam(int r, const state::ParamState& param) const {
  const Zero3State& rank = *tp_ranks_[static_cast<size_t>(r)];
  return TpRank{&rank, rank.info_.Find(param.name)};
}

absl::Status Zero3State::Load() {
  UCP_ASSIGN_OR_RETURN(FolderFiles files, ListFiles());
  UCP_RETURN_IF_ERROR(OpenModelFiles(files));
  UCP_RETURN_IF_ERROR(ReadZeroConfig());
  UCP_ASSIGN_OR_RETURN(const std::vector<ValuePtr>* shape_list, ParseParamShapes());
  UCP_RETURN_IF_ERROR(CheckParamShapesAgree(*shape_list));
  UCP_RETURN_IF_ERROR(ParseFrozenParams());
  if (universal_) UCP_RETURN_IF_ERROR(ReadMergedShapes());
  ParseSharedParams();
  // Optimizer files: rank 0 now (its structure is every file's), the
  // others on first use.
  optim_files_.Reset(universal_ ? 1 : dp_);
  UCP_ASSIGN_OR_RETURN(const OptimFile* first, Optim(0));
  UCP_RETURN_IF_ERROR(ParseParamGroups(*first));
  UCP_RETURN_IF_ERROR(CheckScalarsAgree(*first));
  UCP_RETURN_IF_ERROR(BuildInfo(*first));
  empty_dict_ = Value::MakeDict();
  return absl::OkStatus();
}

// The folder's checkpoint files: ZeRO-3 model and optimizer files of mp
// rank 0 only, all with the bf16_ prefix or none (sets bf16_prefix_).
absl::StatusOr<Zero3State::FolderFiles> Zero3State::ListFiles() {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir_));
  FolderFiles files;
  std::set<int> mp_ranks;
  std::set<int> bf16_values;
  for (const auto& n : names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (!parsed) continue;
    const bool mine = parsed->mp_rank == mp_rank_;
    switch (parsed->type) {
      case deepspeed::CheckpointFileName::Type::kZero3Model:
        if (mine) files.model_dp.insert(parsed->dp_rank);
        mp_ranks.insert(parsed->mp_rank);
        break;
      case deepspeed::CheckpointFileName::Type::kOptim:
        if (mine) files.optim_dp.insert(parsed->dp_rank);
        mp_ranks.insert(parsed->mp_rank);
        bf16_values.insert(parsed->bf16_prefix ? 1 : 0);
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            dir_, ": ZeRO stage 3 checkpoint (zero_pp_rank_*_model_states.pt) that also holds '", n,
            "' (a stage 1/2 or pipeline file): mixed layouts"));
    }
  }
  // mp ranks 0 .. N-1 (tensor parallelism), each with files of every dp rank.
  if (mp_ranks.empty() || *mp_ranks.begin() != 0 || *mp_ranks.rbegin() + 1 != static_cast<int>(mp_ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": ZeRO stage 3 files of mp ranks ",
                                                   absl::StrJoin(mp_ranks, ","), ": expected 0 to N-1"));
  }
  mp_world_ = static_cast<int>(mp_ranks.size());
  if (bf16_values.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": mixes bf16_zero_pp_rank_* and zero_pp_rank_* files"));
  }
  bf16_prefix_ = bf16_values.count(1) > 0;
  return files;
}

// Every dp rank's model states (model_files_): rank 0's dp_world_size (dp_,
// no model parallelism) is every file's, and each rank has both its files.
absl::Status Zero3State::OpenModelFiles(const FolderFiles& files) {
  const std::string first_model = ModelPath(0);
  if (!files.model_dp.count(0)) return absl::NotFoundError(absl::StrCat(first_model, ": missing"));
  UCP_ASSIGN_OR_RETURN(auto m0, torch::TorchFile::Open(first_model, read_.Files()));
  const Value& root0 = *m0->root();
  if (!root0.is(Kind::kDict)) {
    return FileError(first_model, absl::StatusCode::kInvalidArgument,
                     absl::StrCat("expected a dict of model states, found ", root0.DebugString(60)));
  }
  {
    UCP_ASSIGN_OR_RETURN(const Value* d, GetField(root0, "dp_world_size", "model states"), _.Prepend(first_model + ": "));
    UCP_ASSIGN_OR_RETURN(int64_t dp, AsInt(*d, "dp_world_size"), _.Prepend(first_model + ": "));
    if (dp < 1) return FileError(first_model, absl::StatusCode::kInvalidArgument, "dp_world_size < 1");
    dp_ = static_cast<int>(dp);
    const Value* mpw = root0.DictGet("mp_world_size");
    if (mpw != nullptr && mpw->is(Kind::kInt) && mpw->int_value() != mp_world_) {
      return FileError(first_model, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("mp_world_size is ", mpw->int_value(), ", but the folder holds ZeRO stage 3 "
                                    "files of ", mp_world_, " mp rank(s)"));
    }
  }
  if (files.optim_dp.empty()) {
    // No optimizer file left to name the prefix: the job's config does
    // (engine.py _get_zero_ckpt_prefix: bf16_ for every bf16 job), so that a
    // missing file is named as DeepSpeed named it.
    const Value* bf16 = DictPath(&root0, {"ds_config", "bf16", "enabled"});
    if (bf16 == nullptr) bf16 = DictPath(&root0, {"ds_config", "bfloat16", "enabled"});
    bf16_prefix_ = internal::Truthy(bf16);
  }
  for (int d = 0; d < dp_; ++d) {
    if (!files.model_dp.count(d)) {
      return absl::NotFoundError(absl::StrCat(ModelPath(d), ": missing (dp_world_size ", dp_, " in ",
                                              deepspeed::Zero3ModelFileName(0, mp_rank_), ")"));
    }
    if (!files.optim_dp.count(d) && !universal_) {
      return absl::NotFoundError(absl::StrCat(OptimPath(d), ": missing (dp_world_size ", dp_, ")"));
    }
  }
  for (int d : files.model_dp) {
    if (d >= dp_) {
      return absl::InvalidArgumentError(absl::StrCat(ModelPath(d), ": dp rank ", d, " but dp_world_size is ", dp_));
    }
  }
  for (int d : files.optim_dp) {
    if (d >= dp_) {
      return absl::InvalidArgumentError(absl::StrCat(OptimPath(d), ": dp rank ", d, " but dp_world_size is ", dp_));
    }
  }
  model_files_.push_back(std::move(m0));
  for (int d = 1; d < dp_; ++d) {
    const std::string p = ModelPath(d);
    UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(p, read_.Files()));
    const Value* dw = f->root()->is(Kind::kDict) ? f->root()->DictGet("dp_world_size") : nullptr;
    if (dw == nullptr || !dw->is(Kind::kInt) || dw->int_value() != dp_) {
      return FileError(p, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("dp_world_size is ", dw ? dw->DebugString() : "missing", ", expected ", dp_,
                                    " as in ", deepspeed::Zero3ModelFileName(0, mp_rank_)));
    }
    model_files_.push_back(std::move(f));
  }
  return absl::OkStatus();
}

// ds_version and the zero config (sub_group_size) of rank 0's model states.
absl::Status Zero3State::ReadZeroConfig() {
  const Value& root0 = *model_files_[0]->root();
  if (const Value* v = root0.DictGet("ds_version"); v != nullptr && v->is(Kind::kStr)) ds_version_ = v->str();
  if (const Value* sg = DictPath(&root0, {"ds_config", "zero_optimization", "sub_group_size"})) {
    if (sg->is(Kind::kInt)) sub_group_size_ = sg->int_value();
    if (sg->is(Kind::kFloat)) sub_group_size_ = static_cast<int64_t>(sg->float_value());
  }
  return absl::OkStatus();
}

// Rank 0's param_shapes, one dict per sub-group: the trainable params
// (params_) and where each lies in its sub-group's flat partition
// (sub_groups_), at this dp. Returns the list.
absl::StatusOr<const std::vector<ValuePtr>*> Zero3State::ParseParamShapes() {
  const std::string first_model = ModelPath(0);
  const Value& root0 = *model_files_[0]->root();
  UCP_ASSIGN_OR_RETURN(const Value* shapes_v, GetField(root0, "param_shapes", "model states"),
                       _.Prepend(first_model + ": "));
  UCP_ASSIGN_OR_RETURN(auto* shape_list, AsSequence(*shapes_v, "param_shapes"), _.Prepend(first_model + ": "));
  std::set<std::string> seen;
  for (size_t s = 0; s < shape_list->size(); ++s) {
    const Value& d = *(*shape_list)[s];
    if (!d.is(Kind::kDict)) {
      return FileError(first_model, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("param_shapes[", s, "] is a ", pickle::KindName(d.kind()), ", expected a dict"));
    }
    SubGroup sg;
    for (const auto& [k, v] : d.dict_items()) {
      if (!k->is(Kind::kStr)) {
        return FileError(first_model, absl::StatusCode::kInvalidArgument,
                         absl::StrCat("param_shapes[", s, "] has a non-string key ", k->DebugString()));
      }
      if (!seen.insert(k->str()).second) {
        return FileError(first_model, absl::StatusCode::kInvalidArgument,
                         absl::StrCat("param '", k->str(), "' is listed twice in param_shapes"));
      }
      Param p;
      p.name = k->str();
      UCP_ASSIGN_OR_RETURN(p.shape, AsTorchSize(*v, absl::StrCat("param_shapes[", s, "]['", p.name, "']")),
                           _.Prepend(first_model + ": "));
      p.numel = internal::Numel(p.shape);
      p.partition = Zero3PartitionNumel(p.numel, dp_);
      p.sub_group = static_cast<int>(s);
      p.offset = sg.flat_numel;
      sg.flat_numel += p.partition;
      params_.push_back(std::move(p));
    }
    sub_groups_.push_back(sg);
  }
  return shape_list;
}

// The other ranks' param_shapes list the same params in the same sub-groups.
absl::Status Zero3State::CheckParamShapesAgree(const std::vector<ValuePtr>& shape_list) const {
  for (int d = 1; d < dp_; ++d) {
    const Value* other = model_files_[d]->root()->DictGet("param_shapes");
    const std::string what = other == nullptr ? "missing" : other->DebugString(60);
    bool same = other != nullptr && (other->is(Kind::kList) || other->is(Kind::kTuple)) &&
                other->items().size() == shape_list.size();
    for (size_t s = 0; same && s < shape_list.size(); ++s) {
      const Value& a = *shape_list[s];
      const Value& b = *other->items()[s];
      same = b.is(Kind::kDict) && a.dict_items().size() == b.dict_items().size();
      for (size_t i = 0; same && i < a.dict_items().size(); ++i) {
        same = b.dict_items()[i].first->is(Kind::kStr) && b.dict_items()[i].first->str() == a.dict_items()[i].first->str();
      }
    }
    if (!same) {
      return FileError(model_files_[d]->path(), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("param_shapes differ from ", deepspeed::Zero3ModelFileName(0, mp_rank_), " (found ", what,
                                    ")"));
    }
  }
  return absl::OkStatus();
}

// Rank 0's frozen_param_shapes (frozen_), checked against every rank's
// frozen_param_shapes and frozen_param_fragments: the same names and shapes,
// each fragment a dense 1-D tensor of ceil(numel / dp) elements, one dtype
// per param on every rank. None (stage 1/2 layouts, exclude_frozen_parameters)
// or empty: no frozen params.
absl::Status Zero3State::ParseFrozenParams() {
  const std::string first_model = ModelPath(0);
  const Value& root0 = *model_files_[0]->root();
  const Value* shapes = root0.DictGet("frozen_param_shapes");
  const Value* fragments = root0.DictGet("frozen_param_fragments");
  auto listed = [](const Value* v) { return v != nullptr && v->is(Kind::kDict) && !v->dict_items().empty(); };
  if (!listed(shapes)) {
    if (listed(fragments)) {
      return FileError(first_model, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("frozen_param_fragments lists ", fragments->dict_items().size(),
                                    " params but frozen_param_shapes is ",
                                    shapes == nullptr ? "missing" : shapes->DebugString(40)));
    }
    return absl::OkStatus();
  }
  std::set<std::string> trainable;
  for (const Param& p : params_) trainable.insert(p.name);
  for (const auto& [k, v] : shapes->dict_items()) {
    if (!k->is(Kind::kStr)) {
      return FileError(first_model, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("frozen_param_shapes has a non-string key ", k->DebugString(40)));
    }
    FrozenParam f;
    f.name = k->str();
    if (trainable.count(f.name)) {
      return FileError(first_model, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("param '", f.name, "' is listed both in param_shapes (trained) and in ",
                                    "frozen_param_shapes"));
    }
    if (frozen_index_.count(f.name)) {
      return FileError(first_model, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("frozen param '", f.name, "' is listed twice in frozen_param_shapes"));
    }
    UCP_ASSIGN_OR_RETURN(f.shape, AsTorchSize(*v, absl::StrCat("frozen_param_shapes['", f.name, "']")),
                         _.Prepend(first_model + ": "));
    UCP_ASSIGN_OR_RETURN(f.numel, internal::CheckedShapeNumel(f.shape, first_model,
                                                              absl::StrCat("frozen_param_shapes['", f.name, "']")));
    f.partition = Zero3PartitionNumel(f.numel, dp_);
    frozen_index_[f.name] = static_cast<int>(frozen_.size());
    frozen_.push_back(std::move(f));
  }
  for (int d = 0; d < dp_; ++d) UCP_RETURN_IF_ERROR(CheckFrozenFragments(d));
  return absl::OkStatus();
}

// Rank d's frozen_param_shapes equal rank 0's (names, order, shapes), and its
// frozen_param_fragments hold its partition of each of them (sets the dtype
// from rank 0's).
absl::Status Zero3State::CheckFrozenFragments(int d) {
  const std::string path = ModelPath(d);
  const torch::TorchFile& file = *model_files_[d];
  const Value& root = *file.root();
  auto err = [&](absl::string_view what) { return FileError(path, absl::StatusCode::kInvalidArgument, what); };
  const Value* shapes = root.DictGet("frozen_param_shapes");
  if (d > 0) {
    if (shapes == nullptr || !shapes->is(Kind::kDict) || shapes->dict_items().size() != frozen_.size()) {
      return err(absl::StrCat("frozen_param_shapes lists ",
                              shapes != nullptr && shapes->is(Kind::kDict) ? absl::StrCat(shapes->dict_items().size())
                                                                            : std::string("no"),
                              " params, ", deepspeed::Zero3ModelFileName(0, mp_rank_), " lists ", frozen_.size()));
    }
    for (size_t i = 0; i < frozen_.size(); ++i) {
      const auto& [k, v] = shapes->dict_items()[i];
      const FrozenParam& f = frozen_[i];
      if (!k->is(Kind::kStr) || k->str() != f.name) {
        return err(absl::StrCat("frozen_param_shapes[", i, "] is ", k->DebugString(60), ", ",
                                deepspeed::Zero3ModelFileName(0, mp_rank_), " has '", f.name, "' there"));
      }
      auto shape = AsTorchSize(*v, "frozen_param_shapes");
      if (!shape.ok() || *shape != f.shape) {
        return err(absl::StrCat("frozen param '", f.name, "' has shape ", v->DebugString(60), ", ",
                                deepspeed::Zero3ModelFileName(0, mp_rank_), " says ", ShapeStr(f.shape)));
      }
    }
  }
  const Value* fragments = root.DictGet("frozen_param_fragments");
  if (fragments == nullptr || !fragments->is(Kind::kDict)) {
    return err(absl::StrCat("frozen_param_fragments is ", fragments == nullptr ? "missing" : fragments->DebugString(40),
                            ", but frozen_param_shapes lists ", frozen_.size(), " frozen params"));
  }
  for (const auto& [k, v] : fragments->dict_items()) {
    if (!k->is(Kind::kStr) || !frozen_index_.count(k->str())) {
      return err(absl::StrCat("frozen_param_fragments holds ", k->DebugString(60),
                              ", which frozen_param_shapes does not list"));
    }
  }
  for (FrozenParam& f : frozen_) {
    const Value* v = fragments->DictGet(f.name);
    if (v == nullptr) return err(absl::StrCat("frozen_param_fragments has no fragment of frozen param '", f.name, "'"));
    if (!torch::TorchFile::IsTensor(*v)) {
      return err(absl::StrCat("frozen_param_fragments['", f.name, "'] is not a tensor: ", v->DebugString(60)));
    }
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, file.GetTensor(*v), _.Prepend(path + ": "));
    UCP_RETURN_IF_ERROR(CheckDense(t, path, absl::StrCat("frozen_param_fragments['", f.name, "']")));
    if (d == 0) f.dtype = t.dtype();
    if (t.dim() != 1 || t.numel() != f.partition || t.dtype() != f.dtype) {
      return err(absl::StrCat("frozen_param_fragments['", f.name, "'] is ", std::string(torch::DTypeName(t.dtype())),
                              ShapeStr(t.sizes()), ", expected ", std::string(torch::DTypeName(f.dtype)), "[",
                              f.partition, "] (rank ", d, "'s partition of its ", ShapeStr(f.shape),
                              ": ceil(", f.numel, " / dp ", dp_, ") elements", d > 0 ? ", dtype of rank 0's" : "",
                              ")"));
    }
  }
  return absl::OkStatus();
}

// Rank 0's shared_params (engine._get_shared_params runs on global rank 0
// only): module keys that are another name of a param (aliases_).
void Zero3State::ParseSharedParams() {
  const Value* sp = model_files_[0]->root()->DictGet("shared_params");
  if (sp == nullptr || !sp->is(Kind::kDict)) return;
  std::set<std::string> params;
  for (const Param& p : params_) params.insert(p.name);
  for (const auto& [k, v] : sp->dict_items()) {
    if (!k->is(Kind::kStr) || !v->is(Kind::kStr) || k->str() == v->str()) continue;
    if (params.count(v->str()) || frozen_index_.count(v->str())) aliases_[k->str()] = v->str();
  }
}

// Rank 0's optimizer param_groups: which sub-groups each param group holds
// (group_sub_groups_, sub_groups_[s].group), every sub-group in exactly one,
// numbered group by group, no group empty.
absl::Status Zero3State::ParseParamGroups(const OptimFile& first) {
  const Value* inner = first.osd->DictGet("optimizer_state_dict");
  const Value* groups = inner != nullptr && inner->is(Kind::kDict) ? inner->DictGet("param_groups") : nullptr;
  if (groups == nullptr || !groups->is(Kind::kList)) {
    return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                     "optimizer_state_dict.optimizer_state_dict.param_groups is missing or not a list");
  }
  if (groups->items().empty()) {
    return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                     "optimizer_state_dict.optimizer_state_dict.param_groups is empty, expected at least one "
                     "param group (DeepSpeed's optimizer holds every trainable param)");
  }
  std::vector<int> group_of(sub_groups_.size(), -1);
  for (size_t g = 0; g < groups->items().size(); ++g) {
    const Value* ids = groups->items()[g]->is(Kind::kDict) ? groups->items()[g]->DictGet("params") : nullptr;
    if (ids == nullptr || !ids->is(Kind::kList)) {
      return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("param_groups[", g, "] has no 'params' list"));
    }
    group_sub_groups_.emplace_back();
    for (const auto& id : ids->items()) {
      if (!id->is(Kind::kInt) || id->int_value() < 0 || id->int_value() >= static_cast<int64_t>(sub_groups_.size()) ||
          group_of[id->int_value()] >= 0) {
        return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("param_groups[", g, "]['params'] holds ", id->DebugString(),
                                      ", expected each of the sub-groups 0..", sub_groups_.size() - 1,
                                      " (one per param_shapes entry) once"));
      }
      group_of[id->int_value()] = static_cast<int>(g);
      group_sub_groups_.back().push_back(static_cast<int>(id->int_value()));
    }
  }
  for (size_t s = 0; s < sub_groups_.size(); ++s) {
    if (group_of[s] < 0) {
      return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("sub-group ", s, " is in no param group's 'params'"));
    }
    // DeepSpeed numbers sub-groups group by group.
    if (s > 0 && group_of[s] < group_of[s - 1]) {
      return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("sub-group ", s, " is in param group ", group_of[s], " after sub-group ", s - 1,
                                    " of group ", group_of[s - 1], ": expected sub-groups numbered group by group"));
    }
    sub_groups_[s].group = group_of[s];
  }
  for (size_t g = 0; g < group_sub_groups_.size(); ++g) {
    if (group_sub_groups_[g].empty()) {
      return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument, absl::StrCat("param group ", g, " is empty"));
    }
  }
  return absl::OkStatus();
}

// Every sub-group of a group has the same scalars (step): one per group is
// what a universal checkpoint or another sub-grouping can carry.
absl::Status Zero3State::CheckScalarsAgree(const OptimFile& first) const {
  for (size_t s = 1; s < sub_groups_.size(); ++s) {
    const int g = sub_groups_[s].group;
    const int s0 = group_sub_groups_[g][0];
    for (size_t k = 0; k < first.scalars[s].size(); ++k) {
      const auto& [key, v] = first.scalars[s][k];
      const pickle::Value* v0 = nullptr;
      for (const auto& [key0, w] : first.scalars[s0]) {
        if (key0 == key) v0 = w.get();
      }
      bool same = v0 != nullptr;
      if (same && torch::TorchFile::IsTensor(*v) && torch::TorchFile::IsTensor(*v0)) {
        auto a = first.file->GetTensor(*v);
        auto b = first.file->GetTensor(*v0);
        same = a.ok() && b.ok() && a->BitwiseEqual(*b);
      } else if (same) {
        same = v->DebugString(80) == v0->DebugString(80);
      }
      if (!same) {
        return FileError(OptimPath(0), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("sub-group ", s, " has '", key, "' ", v->DebugString(60), ", sub-group ", s0,
                                      " of the same param group ", g, " has ",
                                      v0 ? v0->DebugString(60) : "none", ": ucp carries one per param group"));
      }
    }
  }
  return absl::OkStatus();
}

// The model info: topology and optimizer kind, the module's tensors checked
// (params empty, every other tensor a buffer) in module order, then the
// trainable params in param_shapes order and the buffers in module order.
absl::Status Zero3State::BuildInfo(const OptimFile& first) {
  const std::string first_model = ModelPath(0);
  const Value& root0 = *model_files_[0]->root();
  info_.source_topology = {1, 1, dp_};
  info_.pipeline = false;
  info_.zero_stage = 3;
  info_.optimizer_kind = state::OptimizerKind::kZero;
  info_.bf16_file_prefix = bf16_prefix_;
  info_.num_groups = static_cast<int>(group_sub_groups_.size());
  info_.state_keys = first.StateNames(0);
  info_.scalar_keys = first.ScalarNames(0);
  // The training's vocabulary padding, as the ZeRO-1/2 reader records it
  // (Megatron's args.make_vocab_size_divisible_by; 0 when not saved).
  if (const Value* a = args(); a != nullptr && a->is(Kind::kDict)) {
    const Value* v = a->DictGet("make_vocab_size_divisible_by");
    if (v != nullptr && v->is(Kind::kInt) && v->fits_int64()) info_.make_vocab_size_divisible_by = v->int_value();
  }
  // DeepSpeed's AutoTP training (as the ZeRO-1/2 reader reads it): its tp
  // splits are AutoTP's (no vocabulary padding, uneven widths); a job of
  // autotp_size 1 (ucp's tp 1 reshard of one) is AutoTP's too.
  {
    const Value* a = DictPath(&root0, {"ds_config", "tensor_parallel", "autotp_size"});
    const Value* info = root0.DictGet("universal_checkpoint_info");
    info_.autotp = (a != nullptr && a->is(Kind::kInt) && a->int_value() >= 1) ||
                   (info != nullptr && info->is(Kind::kDict) &&
                    info->DictGet("autotp_unsupported_parameter_patterns") != nullptr);
  }
  const Value* module = root0.DictGet("module");
  if (module == nullptr || !module->is(Kind::kDict)) {
    return FileError(first_model, absl::StatusCode::kInvalidArgument, "expected a module state dict");
  }
  const std::vector<std::string> buffers = StringList(root0.DictGet("buffer_names"));
  const std::set<std::string> buffer_set(buffers.begin(), buffers.end());
  std::map<std::string, int> trainable;
  for (size_t i = 0; i < params_.size(); ++i) trainable[params_[i].name] = static_cast<int>(i);
  bool lp_known = false;
  for (const auto& [k, v] : module->dict_items()) {
    if (!k->is(Kind::kStr) || !torch::TorchFile::IsTensor(*v)) continue;
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, model_files_[0]->GetTensor(*v));
    info_.module_order.push_back({-1, k->str()});
    auto it = trainable.find(k->str());
    if (it != trainable.end()) {
      if (t.numel() != 0) {
        return FileError(first_model, absl::StatusCode::kInvalidArgument,
                         absl::StrCat("module['", k->str(), "'] has shape ", ShapeStr(t.sizes()),
                                      ", expected an empty tensor (ZeRO-3 saves params partitioned)"));
      }
      if (!lp_known) info_.lp_dtype = t.dtype();
      lp_known = true;
      continue;
    }
    if (frozen_index_.count(k->str()) || aliases_.count(k->str())) {
      if (t.numel() != 0) {
        return FileError(first_model, absl::StatusCode::kInvalidArgument,
                         absl::StrCat("module['", k->str(), "'] has shape ", ShapeStr(t.sizes()), ", expected an empty ",
                                      "tensor (ZeRO-3 saves ", frozen_index_.count(k->str()) ? "frozen params in "
                                      "frozen_param_fragments)" : "params partitioned)"));
      }
      continue;
    }
    if (!buffer_set.count(k->str())) {
      return FileError(first_model, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("module['", k->str(), "'] is neither in param_shapes, frozen_param_shapes, ",
                                    "shared_params nor buffer_names"));
    }
  }
  if (!lp_known && !frozen_.empty()) info_.lp_dtype = frozen_[0].dtype;
  // Trainable params in param_shapes order, then buffers in module order.
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& zp = params_[i];
    state::ParamState p;
    p.name = zp.name;
    p.local_name = zp.name;
    p.group = sub_groups_[zp.sub_group].group;
    p.role = state::TensorRole::kTrainable;
    p.lp_dtype = info_.lp_dtype;
    p.tp_shapes = {zp.shape};
    p.stages = {0};
    info_.params.push_back(std::move(p));
    info_param_.push_back(static_cast<int>(i));
  }
  UCP_RETURN_IF_ERROR(AddModuleTensors(*module, trainable));
  for (const std::string& name : buffers) {
    if (!module->DictGet(name)) {
      return FileError(first_model, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("buffer '", name, "' of buffer_names is not in module"));
    }
  }
  info_.Reindex();
  return absl::OkStatus();
}

// After the trainable params, the module's other tensors in module order:
// frozen params, tied aliases (with their owner's shape and dtype), buffers;
// then any frozen param `module` does not hold.
absl::Status Zero3State::AddModuleTensors(const Value& module, const std::map<std::string, int>& trainable) {
  auto add_frozen = [&](const FrozenParam& f) {
    state::ParamState p;
    p.name = f.name;
    p.local_name = f.name;
    p.role = state::TensorRole::kFrozen;
    p.lp_dtype = f.dtype;
    p.tp_shapes = {f.shape};
    p.stages = {0};
    info_.params.push_back(std::move(p));
    info_param_.push_back(-1);
  };
  std::set<std::string> added;
  for (const auto& [k, v] : module.dict_items()) {
    if (!k->is(Kind::kStr) || !torch::TorchFile::IsTensor(*v) || trainable.count(k->str())) continue;
    if (auto it = frozen_index_.find(k->str()); it != frozen_index_.end()) {
      if (added.insert(k->str()).second) add_frozen(frozen_[it->second]);
      continue;
    }
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, model_files_[0]->GetTensor(*v));
    state::ParamState p;
    p.name = k->str();
    p.local_name = p.name;
    p.stages = {0};
    if (auto it = aliases_.find(k->str()); it != aliases_.end()) {
      const std::string& owner = it->second;
      p.role = state::TensorRole::kTied;
      p.alias_of = owner;
      if (auto f = frozen_index_.find(owner); f != frozen_index_.end()) {
        p.lp_dtype = frozen_[f->second].dtype;
        p.tp_shapes = {frozen_[f->second].shape};
      } else {
        p.lp_dtype = info_.lp_dtype;
        for (const Param& q : params_) {
          if (q.name == owner) p.tp_shapes = {q.shape};
        }
      }
    } else {
      p.role = state::TensorRole::kBuffer;
      p.lp_dtype = t.dtype();
      p.tp_shapes = {t.sizes()};
    }
    info_.params.push_back(std::move(p));
    info_param_.push_back(-1);
  }
  for (const FrozenParam& f : frozen_) {
    if (added.insert(f.name).second) add_frozen(f);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Zero3State::OptimFile>> Zero3State::ParseOptim(int dp) const {
  const std::string path = OptimPath(dp);
  auto out = std::make_unique<OptimFile>();
  out->path = path;
  // The flat partitions are CRC-checked when used (Slices), the rest below.
  UCP_ASSIGN_OR_RETURN(out->file, torch::TorchFile::Open(path, read_.Files(/*verify_crc=*/false)));
  auto err = [&](absl::string_view what) { return FileError(path, absl::StatusCode::kInvalidArgument, what); };
  const Value& root = *out->file->root();
  if (!root.is(Kind::kDict)) return err(absl::StrCat("expected a dict, found ", root.DebugString(60)));
  // A stage-3 universal folder's zero/optimizer_state.pt is rank 0's
  // optimizer_state_dict itself (with param_groups added).
  const Value* osd = &root;
  if (!universal_) {
    UCP_ASSIGN_OR_RETURN(osd, GetField(root, "optimizer_state_dict", "optimizer states"), _.Prepend(path + ": "));
  }
  if (!osd->is(Kind::kDict)) return err("optimizer_state_dict is not a dict");
  out->osd = osd;
  UCP_ASSIGN_OR_RETURN(const Value* zs, GetField(*osd, "zero_stage", "optimizer_state_dict"), _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(int stage, pickle::AsZeroStage(*zs, "optimizer_state_dict.zero_stage"), _.Prepend(path + ": "));
  if (stage != 3) {
    return err(absl::StrCat("zero_stage is ", stage, " in a ZeRO stage 3 folder (zero_pp_rank_*_model_states.pt)"));
  }
  UCP_ASSIGN_OR_RETURN(const Value* pc, GetField(*osd, "partition_count", "optimizer_state_dict"),
                       _.Prepend(path + ": "));
  std::vector<int64_t> counts;
  if (pc->is(Kind::kInt)) {
    counts.push_back(pc->int_value());
  } else {
    UCP_ASSIGN_OR_RETURN(auto* seq, AsSequence(*pc, "partition_count"), _.Prepend(path + ": "));
    for (const auto& c : *seq) {
      UCP_ASSIGN_OR_RETURN(int64_t n, AsInt(*c, "partition_count"), _.Prepend(path + ": "));
      counts.push_back(n);
    }
  }
  for (int64_t c : counts) {
    if (c != dp_) {
      return err(absl::StrCat("partition_count is ", pc->DebugString(60), ", expected ", dp_, " (dp_world_size)"));
    }
  }
  UCP_ASSIGN_OR_RETURN(const Value* flat_v, GetField(*osd, "fp32_flat_groups", "optimizer_state_dict"),
                       _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(auto* flats, AsSequence(*flat_v, "fp32_flat_groups"), _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(const Value* inner, GetField(*osd, "optimizer_state_dict", "optimizer_state_dict"),
                       _.Prepend(path + ": "));
  const Value* state = inner->is(Kind::kDict) ? inner->DictGet("state") : nullptr;
  if (state == nullptr || !state->is(Kind::kDict)) return err("optimizer_state_dict.optimizer_state_dict.state is not a dict");
  const size_t n = sub_groups_.size();
  if (flats->size() != n || state->dict_items().size() != n) {
    return err(absl::StrCat("expected ", n, " sub-groups (param_shapes of ", deepspeed::Zero3ModelFileName(0, mp_rank_),
                            "), found ", flats->size(), " fp32_flat_groups and ", state->dict_items().size(),
                            " optimizer states"));
  }
  for (size_t s = 0; s < n; ++s) {
    const int64_t want = sub_groups_[s].flat_numel;
    if (!torch::TorchFile::IsTensor(*(*flats)[s])) return err(absl::StrCat("fp32_flat_groups[", s, "] is not a tensor"));
    UCP_ASSIGN_OR_RETURN(torch::Tensor flat, out->file->GetTensor(*(*flats)[s]));
    UCP_RETURN_IF_ERROR(CheckDense(flat, path, absl::StrCat("fp32_flat_groups[", s, "]")));
    if (flat.dim() != 1 || flat.numel() != want || flat.dtype() != torch::DType::kFloat32) {
      return err(absl::StrCat("fp32_flat_groups[", s, "] is ", std::string(torch::DTypeName(flat.dtype())), ShapeStr(flat.sizes()),
                              ", expected float32[", want, "] (the partitions of its ",
                              "params: ceil(numel / ", dp_, ") each)"));
    }
    out->fp32.push_back(std::move(flat));
    const Value* st = state->DictGet(Value::Int(static_cast<int64_t>(s)));
    if (st == nullptr || !st->is(Kind::kDict)) return err(absl::StrCat("no optimizer state for sub-group ", s));
    UCP_ASSIGN_OR_RETURN(internal::GroupStates split,
                         deepspeed::SplitFlatStates(*out->file, path, *st, s,
                                                    {"sub-group", want, /*lean_numel=*/-1,
                                                     deepspeed::FlatStatesSpec::Dense::kPerElement}));
    if (!out->states.empty()) {
      std::vector<std::string> a = out->StateNames(0), b;
      for (const auto& e : split.per_element) b.push_back(e.first);
      if (a != b) {
        return err(absl::StrCat("sub-group ", s, " has optimizer states [", absl::StrJoin(b, ", "),
                                "], sub-group 0 has [", absl::StrJoin(a, ", "), "]"));
      }
    }
    out->states.push_back(std::move(split.per_element));
    out->scalars.push_back(std::move(split.scalars));
  }
  UCP_RETURN_IF_ERROR(out->VerifyStoragesButPartitions());
  return out;
}

absl::StatusOr<const Zero3State::OptimFile*> Zero3State::Optim(int dp) const {
  if (!optim_files_.Has(dp)) {
    return absl::NotFoundError(absl::StrCat(OptimPath(dp), ": not part of this checkpoint"));
  }
  return optim_files_.Get(dp, [&](int d) -> absl::StatusOr<std::unique_ptr<OptimFile>> {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<OptimFile> file, ParseOptim(d));
    // Every rank holds rank 0's optimizer states (compared by name).
    if (const OptimFile* first = d > 0 ? optim_files_.Parsed(0) : nullptr) {
      const std::vector<std::string> a = first->StateNames(0), b = file->StateNames(0);
      if (!internal::SameStateNames(a, b)) {
        return FileError(OptimPath(d), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("optimizer states [", absl::StrJoin(b, ", "), "] differ from [",
                                      absl::StrJoin(a, ", "), "] in ", OptimPath(0)));
      }
    }
    return file;
  });
}

std::optional<state::SlicedState::WholeFile> Zero3State::WholeStateFile(const state::ParamState& param,
                                                                        const std::string& state) const {
  if (!universal_ || !tp_ranks_.empty() || state == state::kLpState) return std::nullopt;
  const int i = info_.IndexOf(param.name);
  if (i < 0 || info_param_[i] < 0) return std::nullopt;
  return WholeFile{ParamStatePath(params_[info_param_[i]], state), torch::DType::kFloat32};
}

absl::StatusOr<std::vector<tp::TensorPlan>> Zero3State::Slices(const state::ParamState& param, int stage,
                                                              const std::string& state) const {
  if (!tp_ranks_.empty()) {
    std::vector<tp::TensorPlan> out;
    for (int r = 0; r < mp_world_; ++r) {
      const TpRank rank = RankParam(r, param);
      if (rank.param == nullptr) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
      UCP_ASSIGN_OR_RETURN(std::vector<tp::TensorPlan> one, rank.state->Slices(*rank.param, stage, state));
      out.push_back(std::move(one[0]));
    }
    return out;
  }
  const int i = info_.IndexOf(param.name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
  if (info_param_[i] < 0) {
    const state::ParamState& p = info_.params[i];
    if (state != state::kLpState) {
      return absl::NotFoundError(absl::StrCat(state::TensorRoleName(p.role), " '", param.name,
                                              "' has no optimizer state '", state, "'"));
    }
    if (p.role == state::TensorRole::kFrozen) {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, FrozenFull(frozen_[frozen_index_.at(p.name)]));
      return std::vector<tp::TensorPlan>{std::move(plan)};
    }
    if (p.role == state::TensorRole::kTied) {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, TiedFull(p));
      return std::vector<tp::TensorPlan>{std::move(plan)};
    }
    const Value* v = model_files_[0]->root()->DictGet("module")->DictGet(param.name);
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, model_files_[0]->GetTensor(*v));
    return std::vector<tp::TensorPlan>{tp::TensorPlan::FromTensor(t)};
  }
  const Param& zp = params_[info_param_[i]];
  if (state == state::kLpState) {
    return absl::NotFoundError(absl::StrCat(
        "param '", param.name, "': a ZeRO stage 3 checkpoint saves no module weights (module holds empty "
        "tensors); use the fp32 masters"));
  }
  if (universal_) {
    UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, UniversalParamState(zp, state));
    return std::vector<tp::TensorPlan>{std::move(plan)};
  }
  std::vector<torch::Tensor> pieces;
  for (int r = 0; r < dp_; ++r) {
    const int64_t begin = static_cast<int64_t>(r) * zp.partition;
    const int64_t len = std::min(zp.partition, zp.numel - begin);
    if (len <= 0) break;
    UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(r));
    const torch::Tensor* flat = f->Flat(zp.sub_group, state);
    if (flat == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(OptimPath(r), ": sub-group ", zp.sub_group, " has no optimizer state '", state, "'"));
    }
    UCP_RETURN_IF_ERROR(f->VerifyPartitionIfChecked(*flat, checked_inputs_, PartitionName(zp.sub_group, state)));
    UCP_ASSIGN_OR_RETURN(torch::Tensor piece, flat->Narrow(0, zp.offset, len),
                         _.Prepend(absl::StrCat(OptimPath(r), ": param '", zp.name, "' ", state, ": ")));
    pieces.push_back(std::move(piece));
  }
  UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, tp::TensorPlan::FromPieces(torch::DType::kFloat32, zp.shape, pieces),
                       _.Prepend(absl::StrCat("param '", zp.name, "' ", state, ": ")));
  return std::vector<tp::TensorPlan>{std::move(plan)};
}

absl::StatusOr<tp::TensorPlan> Zero3State::FrozenFull(const FrozenParam& f) const {
  std::vector<torch::Tensor> pieces;
  for (int r = 0; r < dp_; ++r) {
    const int64_t begin = static_cast<int64_t>(r) * f.partition;
    const int64_t len = std::min(f.partition, f.numel - begin);
    if (len <= 0) break;
    const Value* v = model_files_[r]->root()->DictGet("frozen_param_fragments")->DictGet(f.name);
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, model_files_[r]->GetTensor(*v));  // checked at Open
    UCP_ASSIGN_OR_RETURN(torch::Tensor piece, t.Narrow(0, 0, len),
                         _.Prepend(absl::StrCat(ModelPath(r), ": frozen param '", f.name, "': ")));
    pieces.push_back(std::move(piece));
  }
  return tp::TensorPlan::FromPieces(f.dtype, f.shape, pieces);
}

absl::StatusOr<tp::TensorPlan> Zero3State::TiedFull(const state::ParamState& alias) const {
  if (auto f = frozen_index_.find(alias.alias_of); f != frozen_index_.end()) return FrozenFull(frozen_[f->second]);
  const state::ParamState* owner = info_.Find(alias.alias_of);
  if (owner == nullptr) return absl::NotFoundError(absl::StrCat("tied param '", alias.name, "': no param '", alias.alias_of, "'"));
  UCP_ASSIGN_OR_RETURN(std::vector<tp::TensorPlan> fp32, Slices(*owner, 0, state::kFp32State));
  if (alias.lp_dtype == torch::DType::kFloat32) return fp32[0];
  // The owner's module weight in bf16/fp16: its fp32 master rounded to the lp
  // dtype (how DeepSpeed's optimizers derive it after each step), read when
  // first used.
  tp::TensorPlan::DeferredSource src;
  src.dtype = alias.lp_dtype;
  src.shape = fp32[0].shape();
  src.label = absl::StrCat("tied param '", alias.name, "' (the lp weight of '", owner->name, "')");
  for (const state::InputRange& in : Inputs(*owner)) src.files.push_back(in.path);
  const tp::TensorPlan master = fp32[0];
  const torch::DType dtype = alias.lp_dtype;
  src.open = [master, dtype]() -> absl::StatusOr<tp::TensorPlan> {
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, master.Materialize());
    UCP_ASSIGN_OR_RETURN(torch::Tensor c, torch::Cast(t, dtype));
    return tp::TensorPlan::FromTensor(c);
  };
  return tp::TensorPlan::Deferred(std::move(src));
}

std::vector<state::InputRange> Zero3State::FrozenInputs(const FrozenParam& f) const {
  std::vector<state::InputRange> out;
  for (int r = 0; r < dp_; ++r) {
    const int64_t begin = static_cast<int64_t>(r) * f.partition;
    const int64_t len = std::min(f.partition, f.numel - begin);
    if (len <= 0) break;
    out.push_back({ModelPath(r), absl::StrCat("frozen_param_fragments.", f.name), 0,
                   len * static_cast<int64_t>(torch::ItemSize(f.dtype))});
  }
  return out;
}

absl::StatusOr<state::FileValue> Zero3State::GroupScalar(int group, const std::string& key) const {
  if (!tp_ranks_.empty()) return tp_ranks_[0]->GroupScalar(group, key);
  if (group < 0 || group >= static_cast<int>(group_sub_groups_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no param group ", group));
  }
  UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(0));
  return f->Scalar(group_sub_groups_[group][0], key);
}

std::vector<state::InputRange> Zero3State::Inputs(const state::ParamState& param) const {
  std::vector<state::InputRange> out;
  if (!tp_ranks_.empty()) {
    for (int r = 0; r < mp_world_; ++r) {
      const TpRank rank = RankParam(r, param);
      if (rank.param == nullptr) continue;
      for (state::InputRange& in : rank.state->Inputs(*rank.param)) out.push_back(std::move(in));
    }
    return out;
  }
  const int i = info_.IndexOf(param.name);
  if (i < 0) return out;
  if (info_param_[i] < 0) {
    const state::ParamState& p = info_.params[i];
    if (p.role == state::TensorRole::kFrozen) return FrozenInputs(frozen_[frozen_index_.at(p.name)]);
    if (p.role == state::TensorRole::kTied) {
      if (auto f = frozen_index_.find(p.alias_of); f != frozen_index_.end()) return FrozenInputs(frozen_[f->second]);
      if (const state::ParamState* owner = info_.Find(p.alias_of)) return Inputs(*owner);
      return out;
    }
    out.push_back({model_files_[0]->path(), absl::StrCat("module.", param.name), 0, -1});
    return out;
  }
  const Param& zp = params_[info_param_[i]];
  if (universal_) {
    out.push_back({ParamStatePath(zp, state::kFp32State), "", 0, -1});
    for (const std::string& key : info_.state_keys) out.push_back({ParamStatePath(zp, key), "", 0, -1});
    return out;
  }
  for (int r = 0; r < dp_; ++r) {
    const int64_t begin = static_cast<int64_t>(r) * zp.partition;
    const int64_t len = std::min(zp.partition, zp.numel - begin);
    if (len <= 0) break;
    out.push_back({OptimPath(r), PartitionName(zp.sub_group, state::kFp32State), zp.offset * 4, len * 4});
    for (const std::string& key : info_.state_keys) {
      out.push_back({OptimPath(r), PartitionName(zp.sub_group, key), zp.offset * 4, len * 4});
    }
  }
  return out;
}

std::vector<std::string> Zero3State::InputFiles() const {
  std::vector<std::string> out;
  for (const auto& rank : tp_ranks_) {
    for (std::string& f : rank->InputFiles()) out.push_back(std::move(f));
  }
  if (!tp_ranks_.empty()) return out;
  for (int d = 0; d < dp_; ++d) {
    out.push_back(model_files_[d]->path());
    if (!universal_) out.push_back(OptimPath(d));
  }
  if (universal_) {
    out.push_back(OptimPath(0));
    for (const Param& p : params_) {
      out.push_back(ParamStatePath(p, state::kFp32State));
      for (const std::string& key : info_.state_keys) out.push_back(ParamStatePath(p, key));
    }
  }
  return out;
}

void Zero3State::SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const {
  for (const auto& rank : tp_ranks_) rank->SetCheckedInputs(keys);
  checked_inputs_.Set(std::move(keys));
}

absl::Status Zero3State::VerifyInput(const std::string& path) const {
  for (const auto& rank : tp_ranks_) {
    for (const std::string& f : rank->InputFiles()) {
      if (f == path) return rank->VerifyInput(path);
    }
  }
  for (int d = 0; d < dp_; ++d) {
    if (path == OptimPath(d)) {
      UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(universal_ ? 0 : d));
      return f->VerifyPartitions();
    }
    if (path == model_files_[d]->path()) return absl::OkStatus();  // checked at Open
  }
  for (const Param& p : params_) {
    if (!universal_) break;
    if (path == ParamStatePath(p, state::kFp32State)) return UniversalParamState(p, state::kFp32State).status();
    for (const std::string& key : info_.state_keys) {
      if (path == ParamStatePath(p, key)) return UniversalParamState(p, key).status();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a file of the checkpoint ", dir_));
}

absl::StatusOr<state::FileValue> Zero3State::OptimizerCommon() const {
  if (!tp_ranks_.empty()) return tp_ranks_[0]->OptimizerCommon();
  UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(0));
  ValuePtr out = Value::MakeDict();
  for (const auto& [k, v] : f->osd->dict_items()) out->DictSet(k, v);
  const Value* inner = f->osd->DictGet("optimizer_state_dict");
  if (pickle::ValuePtr groups = inner->DictGetPtr("param_groups")) out->DictSet(Value::Str("param_groups"), groups);
  return state::FileValue{out, state::Unowned(f->file.get())};
}

state::FileValue Zero3State::ModelStatesRoot(int pp, int tp) const {
  if (!tp_ranks_.empty()) return tp_ranks_[static_cast<size_t>(tp >= 0 && tp < mp_world_ ? tp : 0)]->ModelStatesRoot(pp, 0);
  return state::FileValue{model_files_[0]->root(), state::Unowned(model_files_[0].get())};
}

std::string Zero3State::ModelStatesPath(int pp, int tp) const {
  if (!tp_ranks_.empty()) return tp_ranks_[static_cast<size_t>(tp >= 0 && tp < mp_world_ ? tp : 0)]->ModelStatesPath(pp, 0);
  return model_files_[0]->path();
}

std::string Zero3State::DpModelStatesPath(int dp, int tp) const {
  if (!tp_ranks_.empty()) return tp >= 0 && tp < mp_world_ ? tp_ranks_[static_cast<size_t>(tp)]->DpModelStatesPath(dp, 0) : "";
  return dp >= 0 && dp < dp_ && tp == 0 ? model_files_[dp]->path() : "";
}

const pickle::Value& Zero3State::checkpoint_info() const {
  if (!tp_ranks_.empty()) return tp_ranks_[0]->checkpoint_info();
  const Value* v = model_files_[0]->root()->DictGet("universal_checkpoint_info");
  return v != nullptr ? *v : *empty_dict_;
}

const pickle::Value* Zero3State::args() const {
  if (!tp_ranks_.empty()) return tp_ranks_[0]->args();
  const Value* v = model_files_[0]->root()->DictGet("args");
  if (v == nullptr || v->is_none()) return nullptr;
  if (v->is(Kind::kDict)) return v;
  auto ns = pickle::AsNamespace(*v);
  return ns.ok() ? *ns : nullptr;
}

}  // namespace ucp::deepspeed_zero3
