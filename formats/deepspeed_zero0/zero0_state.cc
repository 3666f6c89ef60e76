#include "formats/deepspeed_zero0/zero0_state.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/engine_defaults.h"
#include "format/pickle/accessors.h"
#include "formats/deepspeed_zero0/param_order.h"

namespace ucp::deepspeed_zero0 {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using tp::TensorPlan;

std::string Shape(const std::vector<int64_t>& s) { return torch::ShapeString(s); }

// transformers' Trainer.get_decay_parameter_names, by name: no param whose
// lower-cased name matches one of its patterns. Its other test, the module
// being an nn.LayerNorm, cannot be made from a checkpoint: the LayerNorms of
// transformers' models whose names have no norm part are named ln_* (GPT-2,
// GPT-J, CodeGen: ln_1, ln_2, ln_f; Falcon: ln_attn, ln_mlp), so a module
// named ln_* counts as one.
bool HfDecays(const std::string& name) {
  static const std::regex* patterns =
      new std::regex(R"(bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)|(?:^|\.)ln_[^.]*\.)");
  return !std::regex_search(absl::AsciiStrToLower(name), *patterns);
}

}  // namespace

bool IsZero0Root(const Value& root) {
  if (!root.is(Kind::kDict)) return false;
  const Value* shapes = root.DictGet("param_shapes");
  const Value* opt = root.DictGet("optimizer");
  const Value* module = root.DictGet("module");
  if (shapes == nullptr || !shapes->is_none() || opt == nullptr || module == nullptr) return false;
  return opt->is_none() || opt->is(Kind::kDict);
}

absl::Status Zero0State::Error(const std::string& what) const {
  return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what));
}

absl::StatusOr<torch::Tensor> Zero0State::Tensor(const Value& v, const std::string& what) const {
  if (!torch::TorchFile::IsTensor(v)) return Error(absl::StrCat(what, " is not a tensor: ", v.DebugString(80)));
  absl::StatusOr<torch::Tensor> t = file_->GetTensor(v);
  if (!t.ok()) return Error(absl::StrCat(what, ": ", t.status().message()));
  return t;
}

absl::StatusOr<std::unique_ptr<Zero0State>> Zero0State::Open(const std::string& dir, const Zero0Options& options) {
  std::unique_ptr<Zero0State> s(new Zero0State());
  s->dir_ = dir;
  UCP_RETURN_IF_ERROR(s->Load(options));
  return s;
}

absl::Status Zero0State::Load(const Zero0Options& options) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir_));
  std::vector<std::string> mp_files;
  std::map<std::pair<int, int>, std::string> layer_files;
  for (const std::string& n : names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (!parsed) continue;
    switch (parsed->type) {
      case deepspeed::CheckpointFileName::Type::kMpRank:
        mp_files.push_back(n);
        break;
      case deepspeed::CheckpointFileName::Type::kLayer:
        layer_files[{parsed->layer, parsed->tp_rank}] = n;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            dir_, ": ", n, " beside a ZeRO stage 0 model-states file: the folder mixes a ZeRO checkpoint with a "
            "stage 0 one"));
    }
  }
  std::sort(mp_files.begin(), mp_files.end());
  for (size_t t = 0; t < mp_files.size(); ++t) {
    if (mp_files[t] != deepspeed::MpRankFileName(static_cast<int>(t))) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir_, ": ZeRO stage 0 model-states files ", absl::StrJoin(mp_files, ", "), ": expected ",
          deepspeed::MpRankFileName(static_cast<int>(t)), " (one file per model-parallel rank, numbered from 0)"));
    }
  }
  if (mp_files.empty()) return absl::InvalidArgumentError(absl::StrCat(dir_, ": no mp_rank_*_model_states.pt"));
  if (!layer_files.empty()) return LoadPipeline(mp_files, layer_files, options);
  if (mp_files.size() == 1) return LoadFile(mp_files[0], options);
  tp_ = static_cast<int>(mp_files.size());
  for (const std::string& f : mp_files) {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<Zero0State> r, OpenFile(dir_, f, options));
    tp_ranks_.push_back(std::move(r));
  }
  return CombineTpRanks();
}

absl::StatusOr<std::unique_ptr<Zero0State>> Zero0State::OpenStageFile(const std::string& dir, const std::string& file,
                                                                       const Zero0Options& options) {
  std::unique_ptr<Zero0State> s(new Zero0State());
  s->dir_ = dir;
  s->path_ = JoinPath(dir, file);
  UCP_ASSIGN_OR_RETURN(s->file_, torch::TorchFile::Open(s->path_, options.read.ModelStates()));
  const Value& root = *s->file_->root();
  if (!IsZero0Root(root)) {
    return s->Error("not a ZeRO stage 0 model-states file (expected param_shapes None and an optimizer dict)");
  }
  if (const Value* m = root.DictGet("module"); m == nullptr || !m->is_none()) {
    return s->Error("a PipelineModule's model states hold module None (the weights are in the layer files)");
  }
  if (const Value* v = root.DictGet("ds_version"); v != nullptr && v->is(Kind::kStr)) s->ds_version_ = v->str();
  UCP_RETURN_IF_ERROR(s->ReadOptimizer());
  return s;
}

absl::Status Zero0State::SolveStage(const Zero0State& parent, int t, size_t begin, size_t end,
                                    const Zero0Options& options) {
  entries_.clear();
  assigned_.clear();
  std::set<std::string> buffers;
  if (const Value* b = file_->root()->DictGet("buffer_names"); b != nullptr && b->is(Kind::kList)) {
    for (const ValuePtr& n : b->items()) {
      if (n->is(Kind::kStr)) buffers.insert(n->str());
    }
  }
  for (size_t l = begin; l < end; ++l) {
    for (Entry e : parent.layer_entries_[t][l]) {
      e.role = buffers.count(e.name) ? state::TensorRole::kBuffer : state::TensorRole::kFrozen;
      entries_.push_back(std::move(e));
    }
  }
  return SolveOrder(options);
}

absl::Status Zero0State::LoadPipeline(const std::vector<std::string>& mp_files,
                                      const std::map<std::pair<int, int>, std::string>& layer_files,
                                      const Zero0Options& options) {
  std::set<int> tps;
  for (const auto& [key, n] : layer_files) {
    if (layers_.empty() || layers_.back() != key.first) layers_.push_back(key.first);
    tps.insert(key.second);
  }
  tp_ = static_cast<int>(tps.size());
  for (int l : layers_) {
    for (int t = 0; t < tp_; ++t) {
      if (!layer_files.count({l, t})) {
        return absl::InvalidArgumentError(absl::StrCat(dir_, ": ", deepspeed::LayerFileName(l, t),
                                                       " is missing (the layer files show tp=", tp_, ")"));
      }
    }
  }
  if (static_cast<int>(mp_files.size()) % tp_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": ", mp_files.size(), " mp_rank files for tp=", tp_,
                                                   " (the layer files'): expected pp * tp"));
  }
  pp_ = static_cast<int>(mp_files.size()) / tp_;
  layer_entries_.assign(tp_, std::vector<std::vector<Entry>>(layers_.size()));
  for (int t = 0; t < tp_; ++t) {
    for (size_t li = 0; li < layers_.size(); ++li) {
      const std::string path = JoinPath(dir_, layer_files.at({layers_[li], t}));
      UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f, torch::TorchFile::Open(path, options.read.ModelStates()));
      if (!f->root()->is(Kind::kDict)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a state dict"));
      for (const auto& [k, v] : f->root()->dict_items()) {
        if (!k->is(Kind::kStr) || !torch::TorchFile::IsTensor(*v)) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": key ", k->DebugString(40), " is not a tensor"));
        }
        Entry e;
        e.local_name = k->str();
        e.layer = layers_[li];
        e.name = absl::StrCat(layers_[li], ".", e.local_name);
        UCP_ASSIGN_OR_RETURN(e.tensor, f->GetTensor(*v), _.Prepend(absl::StrCat(path, ": '", e.local_name, "': ")));
        layer_entries_[t][li].push_back(std::move(e));
      }
      layer_files_.push_back(std::move(f));
    }
  }
  for (const std::string& f : mp_files) {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<Zero0State> r, OpenStageFile(dir_, f, options));
    tp_ranks_.push_back(std::move(r));
  }
  // Stage s: the fewest layers after stage s-1's whose tensors its optimizer fits.
  size_t begin = 0;
  for (int s = 0; s < pp_; ++s) {
    Zero0State& r = *tp_ranks_[s * tp_];
    size_t end = s + 1 == pp_ ? layers_.size() : begin + 1;
    absl::Status st = absl::InvalidArgumentError("no layers left");
    for (; end <= layers_.size(); ++end) {
      st = r.SolveStage(*this, 0, begin, end, options);
      if (st.code() != absl::StatusCode::kInvalidArgument) break;
    }
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat(
          st.message(), " (pipeline stage ", s, " of ", pp_, ", its layers from layer ",
          begin < layers_.size() ? layers_[begin] : -1, " on; a stage 0 pipeline's tied modules (TiedLayerSpec) "
          "are not supported: nothing in the files names them)"));
    }
    stage_layers_.push_back({begin, end});
    for (int t = 1; t < tp_; ++t) UCP_RETURN_IF_ERROR(tp_ranks_[s * tp_ + t]->SolveStage(*this, t, begin, end, options));
    for (int t = 0; t < tp_; ++t) {
      Zero0State& rt = *tp_ranks_[s * tp_ + t];
      UCP_RETURN_IF_ERROR(rt.BuildInfo());
      UCP_RETURN_IF_ERROR(rt.BuildCommon());
      rt.RecordArgs(options);
    }
    begin = end;
  }
  return CombinePipeline();
}

absl::Status Zero0State::CombinePipeline() {
  const Zero0State& r0 = Rank(0, 0);
  path_ = r0.path_;
  ds_version_ = r0.ds_version_;
  layout_ = r0.layout_;
  evidence_ = absl::StrCat(r0.evidence_, ", on each of the ", pp_, " pipeline stages x ", tp_,
                           " tp ranks (a stage: the fewest layers its optimizer fits)");
  info_ = state::ModelInfo();
  info_.num_groups = r0.info_.num_groups;
  info_.state_keys = r0.state_keys_;
  info_.scalar_keys = r0.scalar_keys_;
  info_.pipeline = true;
  info_.optimizer_kind = state::OptimizerKind::kZero;
  info_.zero_stage = 0;
  info_.lp_dtype = r0.info_.lp_dtype;
  info_.bf16_file_prefix = r0.info_.bf16_file_prefix;
  info_.module_layers = layers_;
  info_.num_layers = layers_.empty() ? 0 : layers_.back() + 1;
  info_.source_topology = state::Topology{tp_, pp_, r0.info_.source_topology.dp};
  info_.make_vocab_size_divisible_by = r0.info_.make_vocab_size_divisible_by;
  info_.partition_method = r0.info_.partition_method;
  for (size_t i = 0; i < tp_ranks_.size(); ++i) {
    const Zero0State& r = *tp_ranks_[i];
    const Zero0State& first = Rank(static_cast<int>(i) / tp_, 0);
    if (r.info_.num_groups != info_.num_groups || r.state_keys_ != info_.state_keys ||
        r.scalar_keys_ != info_.scalar_keys || r.layout_ != layout_ || r.info_.params.size() != first.info_.params.size()) {
      return r.Error(absl::StrCat("its optimizer (", r.info_.num_groups, " groups, ", r.layout_, ", ",
                                  r.info_.params.size(), " tensors) differs from ", first.path_, "'s"));
    }
    for (size_t j = 0; j < r.info_.params.size(); ++j) {
      const state::ParamState& a = first.info_.params[j];
      const state::ParamState& b = r.info_.params[j];
      if (a.name != b.name || a.role != b.role || a.group != b.group) {
        return r.Error(absl::StrCat("tensor ", j, " is '", b.name, "' (group ", b.group, "), ", first.path_,
                                    "'s '", a.name, "' (group ", a.group, "): the tp ranks of a stage hold the same params"));
      }
    }
  }
  auto add = [&](int s, const state::ParamState& src) {
    state::ParamState p = src;
    p.stages = {s};
    p.tp_shapes.clear();
    for (int t = 0; t < tp_; ++t) p.tp_shapes.push_back(Rank(s, t).info_.Find(src.name)->tp_shapes[0]);
    info_.params.push_back(std::move(p));
  };
  for (int g = 0; g < info_.num_groups; ++g) {
    for (int s = 0; s < pp_; ++s) {
      for (const state::ParamState& p : Rank(s, 0).info_.params) {
        if (p.trainable() && p.group == g) add(s, p);
      }
    }
  }
  for (int s = 0; s < pp_; ++s) {
    for (const state::ParamState& p : Rank(s, 0).info_.params) {
      if (!p.trainable()) add(s, p);
    }
    for (const auto& k : Rank(s, 0).info_.module_order) info_.module_order.push_back(k);
  }
  info_.notes.push_back(absl::StrCat("ZeRO stage 0 pipeline source (", layout_, ", pp=", pp_, " tp=", tp_,
                                     "): which module param each optimizer state belongs to was decided by ",
                                     evidence_));
  info_.Reindex();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Zero0State>> Zero0State::OpenFile(const std::string& dir, const std::string& file,
                                                                  const Zero0Options& options) {
  std::unique_ptr<Zero0State> s(new Zero0State());
  s->dir_ = dir;
  UCP_RETURN_IF_ERROR(s->LoadFile(file, options));
  return s;
}

absl::Status Zero0State::LoadFile(const std::string& file, const Zero0Options& options) {
  path_ = JoinPath(dir_, file);
  UCP_ASSIGN_OR_RETURN(file_, torch::TorchFile::Open(path_, options.read.ModelStates()));
  const Value& root = *file_->root();
  if (!IsZero0Root(root)) {
    return Error("not a ZeRO stage 0 model-states file (expected param_shapes None and an optimizer dict)");
  }
  if (const Value* v = root.DictGet("ds_version"); v != nullptr && v->is(Kind::kStr)) ds_version_ = v->str();
  UCP_RETURN_IF_ERROR(ReadModule());
  UCP_RETURN_IF_ERROR(ReadOptimizer());
  UCP_RETURN_IF_ERROR(SolveOrder(options));
  UCP_RETURN_IF_ERROR(BuildInfo());
  UCP_RETURN_IF_ERROR(BuildCommon());
  RecordArgs(options);
  return absl::OkStatus();
}

void Zero0State::RecordArgs(const Zero0Options& options) {
  const Value* a = args();
  auto get = [&](const char* key) { return a != nullptr && a->is(Kind::kDict) ? a->DictGet(key) : nullptr; };
  info_.make_vocab_size_divisible_by = options.make_vocab_size_divisible_by;
  if (const Value* v = get("make_vocab_size_divisible_by");
      info_.make_vocab_size_divisible_by <= 0 && v != nullptr && v->is(Kind::kInt) && v->fits_int64()) {
    info_.make_vocab_size_divisible_by = v->int_value();
  }
  for (const char* key : {"pipe_partition_method", "partition_method", "partition-method"}) {
    if (const Value* v = get(key); v != nullptr && v->is(Kind::kStr) && info_.partition_method.empty()) {
      info_.partition_method = v->str();
    }
  }
}

absl::Status Zero0State::CombineTpRanks() {
  const int tp = static_cast<int>(tp_ranks_.size());
  const Zero0State& r0 = *tp_ranks_[0];
  path_ = r0.path_;
  ds_version_ = r0.ds_version_;
  layout_ = r0.layout_;
  evidence_ = absl::StrCat(r0.evidence_, ", on each of the ", tp, " tp ranks");
  info_ = r0.info_;
  for (state::ParamState& p : info_.params) p.tp_shapes.clear();
  for (int t = 0; t < tp; ++t) {
    const Zero0State& r = *tp_ranks_[t];
    auto differs = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(r.path_, ": ", what, " (tp rank ", t, ") differs from ",
                                                     r0.path_, "'s: the tp ranks of one model hold the same params"));
    };
    if (const Value* v = r.file_->root()->DictGet("mp_world_size"); v != nullptr && v->is(Kind::kInt) &&
                                                                    v->int_value() != tp) {
      return r.Error(absl::StrCat("mp_world_size is ", v->int_value(), ", but the folder holds ", tp,
                                  " mp_rank files (a ZeRO stage 0 pipeline keeps layer files: none here)"));
    }
    if (r.info_.params.size() != r0.info_.params.size()) {
      return differs(absl::StrCat("its ", r.info_.params.size(), " tensors"));
    }
    if (r.info_.num_groups != r0.info_.num_groups || r.state_keys_ != r0.state_keys_ ||
        r.scalar_keys_ != r0.scalar_keys_ || r.layout_ != r0.layout_) {
      return differs(absl::StrCat("its optimizer (", r.info_.num_groups, " groups, ", r.layout_, ", states ",
                                  absl::StrJoin(r.state_keys_, "/"), ")"));
    }
    for (size_t i = 0; i < info_.params.size(); ++i) {
      const state::ParamState& a = r0.info_.params[i];
      const state::ParamState& b = r.info_.params[i];
      if (a.name != b.name || a.role != b.role || a.group != b.group || a.lp_dtype != b.lp_dtype ||
          a.alias_of != b.alias_of) {
        return differs(absl::StrCat("tensor ", i, " '", b.name, "' (", state::TensorRoleName(b.role), ", group ",
                                    b.group, "; rank 0: '", a.name, "', ", state::TensorRoleName(a.role), ", group ",
                                    a.group, ")"));
      }
      info_.params[i].tp_shapes.push_back(b.tp_shapes[0]);
    }
  }
  info_.source_topology.tp = tp;
  info_.notes.clear();
  info_.notes.push_back(absl::StrCat("ZeRO stage 0 source (", layout_, ", ", tp,
                                     " tp ranks): which module param each optimizer state belongs to was decided by ",
                                     evidence_));
  info_.Reindex();
  return absl::OkStatus();
}

std::vector<std::string> Zero0State::InputFiles() const {
  if (tp_ranks_.empty()) return {path_};
  std::vector<std::string> out;
  for (const auto& r : tp_ranks_) out.push_back(r->path_);
  for (const auto& f : layer_files_) out.push_back(f->path());
  return out;
}

absl::Status Zero0State::VerifyInput(const std::string& path) const {
  for (const auto& r : tp_ranks_) {
    if (r->path_ == path) return r->file_->VerifyAllCrcs();
  }
  for (const auto& f : layer_files_) {
    if (f->path() == path) return f->VerifyAllCrcs();
  }
  return file_ != nullptr ? file_->VerifyAllCrcs() : tp_ranks_[0]->file_->VerifyAllCrcs();
}

absl::Status Zero0State::ReadModule() {
  const Value& root = *file_->root();
  const Value* module = root.DictGet("module");
  if (module == nullptr || !module->is(Kind::kDict)) return Error("'module' is not a dict");
  std::set<std::string> buffers;
  if (const Value* b = root.DictGet("buffer_names"); b != nullptr && (b->is(Kind::kList) || b->is(Kind::kTuple))) {
    for (const ValuePtr& n : b->items()) {
      if (n->is(Kind::kStr)) buffers.insert(n->str());
    }
  }
  for (const auto& [k, v] : module->dict_items()) {
    if (!k->is(Kind::kStr)) return Error(absl::StrCat("module key ", k->DebugString(40), " is not a string"));
    Entry e;
    e.name = k->str();
    UCP_ASSIGN_OR_RETURN(e.tensor, Tensor(*v, absl::StrCat("module['", e.name, "']")));
    e.role = buffers.count(e.name) ? state::TensorRole::kBuffer : state::TensorRole::kFrozen;
    if (e.role != state::TensorRole::kBuffer) {
      // A tied weight: the module's state_dict holds it under every name,
      // model.parameters() (the optimizer) once: the same storage, offset
      // and shape as an earlier param.
      for (const Entry& o : entries_) {
        if (o.role == state::TensorRole::kBuffer || o.role == state::TensorRole::kTied) continue;
        if (o.tensor.storage() == e.tensor.storage() && o.tensor.storage_offset() == e.tensor.storage_offset() &&
            o.tensor.sizes() == e.tensor.sizes() && o.tensor.strides() == e.tensor.strides()) {
          e.role = state::TensorRole::kTied;
          e.alias_of = o.name;
          break;
        }
      }
    }
    entries_.push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status Zero0State::ReadOptimizer() {
  const Value* opt = file_->root()->DictGet("optimizer");
  if (opt->is_none()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": a DeepSpeed stage 0 checkpoint saved without optimizer state ('optimizer' is None): only its "
        "module weights exist, which `ucp export` of a training checkpoint cannot take; load it with "
        "DeepSpeed's load_module_only"));
  }
  if (opt->DictGet("fp32_groups_flat") != nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        path_, ": FP16_Optimizer's fused layout (fp32_groups_flat: fp16 with FusedAdam on GPU) is not supported; "
        "the unfused layout (fp32_groups) and fp32 are"));
  }
  if (const Value* inner = opt->DictGet("optimizer_state_dict")) {
    wrapper_ = opt;
    optimizer_ = inner;
    layout_ = "FP16_UnfusedOptimizer (fp32 masters in fp32_groups)";
  } else {
    optimizer_ = opt;
    layout_ = "the torch optimizer's state_dict (fp32: the module weights are the masters)";
  }
  if (!optimizer_->is(Kind::kDict)) return Error("the optimizer state_dict is not a dict");
  const Value* st = optimizer_->DictGet("state");
  const Value* pgs = optimizer_->DictGet("param_groups");
  if (st == nullptr || !st->is(Kind::kDict) || pgs == nullptr || !pgs->is(Kind::kList)) {
    return Error("the optimizer state_dict has no 'state' dict and 'param_groups' list (not a torch optimizer's)");
  }
  const Value* fp32_groups = nullptr;
  if (wrapper_ != nullptr) {
    fp32_groups = wrapper_->DictGet("fp32_groups");
    if (fp32_groups == nullptr || !fp32_groups->is(Kind::kList) || fp32_groups->size() != pgs->size()) {
      return Error(absl::StrCat("optimizer['fp32_groups'] must list one group per param group (",
                                pgs->size(), "), found ", fp32_groups == nullptr ? "none" : fp32_groups->DebugString(60)));
    }
  }
  std::set<int64_t> seen;
  for (size_t g = 0; g < pgs->size(); ++g) {
    const Value& group = *pgs->items()[g];
    const Value* params = group.is(Kind::kDict) ? group.DictGet("params") : nullptr;
    if (params == nullptr || !params->is(Kind::kList)) {
      return Error(absl::StrCat("param_groups[", g, "] has no 'params' list"));
    }
    if (fp32_groups != nullptr && fp32_groups->items()[g]->size() != params->size()) {
      return Error(absl::StrCat("param group ", g, " lists ", params->size(), " params but fp32_groups[", g,
                                "] holds ", fp32_groups->items()[g]->size(), " masters"));
    }
    std::vector<Slot> slots;
    for (size_t j = 0; j < params->size(); ++j) {
      Slot s;
      UCP_ASSIGN_OR_RETURN(s.index, pickle::AsInt(*params->items()[j], "param index"),
                           _.Prepend(absl::StrCat(path_, ": param_groups[", g, "]['params'][", j, "]: ")));
      if (!seen.insert(s.index).second) {
        return Error(absl::StrCat("optimizer param index ", s.index, " is listed twice in param_groups"));
      }
      s.state = st->DictGet(Value::Int(s.index));
      if (fp32_groups != nullptr) {
        s.master = fp32_groups->items()[g]->items()[j].get();
        UCP_ASSIGN_OR_RETURN(torch::Tensor m, Tensor(*s.master, absl::StrCat("fp32_groups[", g, "][", j, "]")));
        if (m.dtype() != torch::DType::kFloat32) {
          return Error(absl::StrCat("fp32_groups[", g, "][", j, "] is ", std::string(torch::DTypeName(m.dtype())), ", expected float32"));
        }
        s.shape = m.sizes();
      }
      if (s.state == nullptr) {
        return absl::UnimplementedError(absl::StrCat(
            path_, ": optimizer param ", s.index, " (group ", g, ", position ", j,
            ") has no optimizer state: it never received a gradient before the save; such a checkpoint is not "
            "supported"));
      }
      if (!s.state->is(Kind::kDict)) return Error(absl::StrCat("optimizer state ", s.index, " is not a dict"));
      // Per-element states have the param's shape; the rest are scalars.
      std::vector<std::string> tensors, scalars;
      for (const auto& [k, v] : s.state->dict_items()) {
        if (!k->is(Kind::kStr)) return Error(absl::StrCat("optimizer state ", s.index, " has a non-string key"));
        if (torch::TorchFile::IsTensor(*v)) {
          UCP_ASSIGN_OR_RETURN(torch::Tensor t, Tensor(*v, absl::StrCat("state[", s.index, "]['", k->str(), "']")));
          if (t.dim() == 0) {
            scalars.push_back(k->str());
            continue;
          }
          if (t.dtype() != torch::DType::kFloat32) {
            return Error(absl::StrCat("state[", s.index, "]['", k->str(), "'] is ", std::string(torch::DTypeName(t.dtype())),
                                      ", expected float32"));
          }
          if (s.shape.empty() && fp32_groups == nullptr) s.shape = t.sizes();
          if (t.sizes() != s.shape) {
            return Error(absl::StrCat("state[", s.index, "]['", k->str(), "'] has shape ", Shape(t.sizes()),
                                      ", expected ", Shape(s.shape), fp32_groups ? " (its fp32 master's)" : ""));
          }
          tensors.push_back(k->str());
        } else if (v->is(Kind::kInt) || v->is(Kind::kFloat)) {
          scalars.push_back(k->str());
        } else {
          return Error(absl::StrCat("state[", s.index, "]['", k->str(), "'] is neither a tensor nor a number"));
        }
      }
      if (tensors.empty()) {
        return Error(absl::StrCat("optimizer state ", s.index, " holds no per-element state (", s.state->DebugString(80), ")"));
      }
      if (state_keys_.empty() && scalar_keys_.empty()) {
        state_keys_ = tensors;
        scalar_keys_ = scalars;
      } else if (tensors != state_keys_ || scalars != scalar_keys_) {
        return Error(absl::StrCat("optimizer state ", s.index, " has keys [", absl::StrJoin(scalars, ", "), "; ",
                                  absl::StrJoin(tensors, ", "), "], the first one [", absl::StrJoin(scalar_keys_, ", "),
                                  "; ", absl::StrJoin(state_keys_, ", "), "]"));
      }
      slots.push_back(std::move(s));
    }
    groups_.push_back(std::move(slots));
  }
  // States of no listed param.
  for (const auto& [k, v] : st->dict_items()) {
    if (!k->is(Kind::kInt) || !seen.count(k->int_value())) {
      return Error(absl::StrCat("optimizer state ", k->DebugString(20), " belongs to no param group"));
    }
  }
  return absl::OkStatus();
}

absl::Status Zero0State::SolveOrder(const Zero0Options& options) {
  OrderProblem p;
  std::vector<int> candidates;  // problem index -> entries_ index
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].role != state::TensorRole::kFrozen) continue;
    candidates.push_back(static_cast<int>(i));
    p.module_shapes.push_back(entries_[i].tensor.sizes());
  }
  for (const auto& slots : groups_) {
    p.group_shapes.emplace_back();
    for (const Slot& s : slots) p.group_shapes.back().push_back(s.shape);
  }
  const FitFn shapes = ShapeFit(p);
  OrderResult r = deepspeed_zero0::SolveOrder(p, shapes);
  evidence_ = "the shapes of the optimizer states against the module params in module order";
  // bf16/fp16: the master cast to the lp dtype is the module weight (the
  // optimizer copies masters into the lp params after every step).
  if (r.count > 1 && wrapper_ != nullptr) {
    absl::flat_hash_map<int64_t, bool> cache;
    absl::Status err;
    FitFn cast = [&](int m, int g, int j) {
      if (!shapes(m, g, j)) return false;
      const int64_t key = (static_cast<int64_t>(m) << 32) | (static_cast<int64_t>(g) << 20) | j;
      auto it = cache.find(key);
      if (it != cache.end()) return it->second;
      bool fit = false;
      absl::StatusOr<torch::Tensor> master = file_->GetTensor(*groups_[g][j].master);
      const torch::Tensor& lp = entries_[candidates[m]].tensor;
      if (master.ok()) {
        absl::StatusOr<torch::Tensor> c = torch::Cast(*master, lp.dtype());
        if (c.ok()) fit = c->BitwiseEqual(lp.Contiguous());
      }
      cache[key] = fit;
      return fit;
    };
    OrderResult rc = deepspeed_zero0::SolveOrder(p, cast);
    if (rc.count >= 1) {
      r = std::move(rc);
      evidence_ = "shapes, and the fp32 masters cast to the lp dtype equal to the module weights bitwise";
    }
  }
  if (r.count > 1 && options.order == kOrderHfTrainer) {
    std::vector<bool> decays;
    for (int e : candidates) decays.push_back(HfDecays(entries_[e].name));
    std::vector<int> group_decay;  // 1: weight_decay > 0, 0: == 0
    const Value* pgs = optimizer_->DictGet("param_groups");
    for (const ValuePtr& g : pgs->items()) {
      const Value* wd = g->DictGet("weight_decay");
      double v = 0;
      if (wd != nullptr) v = wd->is(Kind::kFloat) ? wd->float_value() : static_cast<double>(wd->int_value());
      group_decay.push_back(v > 0 ? 1 : 0);
    }
    const FitFn prev = shapes;
    FitFn hf = [&](int m, int g, int j) { return prev(m, g, j) && decays[m] == (group_decay[g] == 1); };
    OrderResult rh = deepspeed_zero0::SolveOrder(p, hf);
    if (rh.count == 0) {
      return Error(absl::StrCat(
          "--source_option=", kOrderOption, "=", kOrderHfTrainer,
          ": no assignment of the module params to the optimizer's groups follows the Hugging Face Trainer's rule "
          "(groups with weight_decay > 0 hold the params whose names contain no bias/layernorm/rmsnorm/norm)"));
    }
    r = std::move(rh);
    evidence_ = "shapes and the Hugging Face Trainer's decay / no-decay rule (--source_option=zero0_order=hf_trainer)";
  }
  if (r.count == 0) {
    std::string where;
    if (r.stuck_group >= 0) {
      const Slot& s = groups_[r.stuck_group][r.stuck_position];
      where = absl::StrCat(": the furthest assignment found no module param for optimizer param ", s.index,
                           " (group ", r.stuck_group, ", position ", r.stuck_position, ", shape ", Shape(s.shape), ")");
    }
    return Error(absl::StrCat("the optimizer's ", groups_.size(), " param groups do not fit the module's ",
                              candidates.size(),
                              " params (each group must be the module's params of its shapes in module order, "
                              "the params of no group frozen)",
                              where));
  }
  if (r.count > 1) {
    std::vector<std::string> diffs;
    for (size_t g = 0; g < r.first.size(); ++g) {
      for (size_t j = 0; j < r.first[g].size(); ++j) {
        if (r.first[g][j] == r.second[g][j] || diffs.size() >= 8) continue;
        diffs.push_back(absl::StrCat("optimizer param ", groups_[g][j].index, " (group ", g, ") is '",
                                     entries_[candidates[r.first[g][j]]].name, "' or '",
                                     entries_[candidates[r.second[g][j]]].name, "'"));
      }
    }
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": the optimizer state is keyed by param index and no name map is saved at ZeRO stage 0; ",
        "several assignments of the module params to the optimizer's params fit (", evidence_, "): ",
        absl::StrJoin(diffs, "; "),
        ". If the client built its optimizer as the Hugging Face Trainer does (weight decay for all but biases and "
        "norms), say so with --source_option=", kOrderOption, "=", kOrderHfTrainer));
  }
  assigned_.clear();
  for (const auto& g : r.first) {
    assigned_.emplace_back();
    for (int m : g) assigned_.back().push_back(candidates[m]);
  }
  for (const auto& g : assigned_) {
    for (int e : g) entries_[e].role = state::TensorRole::kTrainable;
  }
  return absl::OkStatus();
}

absl::Status Zero0State::BuildInfo() {
  info_.num_groups = static_cast<int>(groups_.size());
  info_.state_keys = state_keys_;
  info_.scalar_keys = scalar_keys_;
  info_.pipeline = false;
  info_.optimizer_kind = state::OptimizerKind::kZero;
  info_.zero_stage = 0;
  info_.lp_dtype = torch::DType::kFloat32;
  for (const auto& g : assigned_) {
    if (!g.empty()) {
      info_.lp_dtype = entries_[g[0]].tensor.dtype();
      break;
    }
  }
  // DeepSpeed names a bf16 job's ZeRO optimizer files bf16_zero_pp_rank_*
  // (engine.py _get_zero_ckpt_prefix: bfloat16_enabled(), whatever the
  // optimizer), so a ZeRO target of this model is named so too.
  info_.bf16_file_prefix = info_.lp_dtype == torch::DType::kBFloat16;
  if (wrapper_ == nullptr && info_.lp_dtype != torch::DType::kFloat32) {
    return Error(absl::StrCat("the module weights are ", std::string(torch::DTypeName(info_.lp_dtype)),
                              " but the optimizer keeps no fp32 masters (no fp32_groups)"));
  }
  const Value& root = *file_->root();
  int64_t dp = 1;
  if (const Value* v = root.DictGet("dp_world_size"); v != nullptr && v->is(Kind::kInt)) dp = v->int_value();
  info_.source_topology = state::Topology{1, 1, static_cast<int>(std::max<int64_t>(dp, 1))};
  auto add = [&](int e, int group, const Slot* slot) {
    const Entry& en = entries_[e];
    state::ParamState p;
    p.name = en.name;
    p.group = group;
    p.role = en.role;
    p.lp_dtype = en.tensor.dtype();
    p.local_name = en.local_name.empty() ? en.name : en.local_name;
    p.layer = en.layer;
    p.alias_of = en.alias_of;
    p.tp_shapes = {en.tensor.sizes()};
    p.stages = {0};
    info_.params.push_back(std::move(p));
    info_entry_.push_back(e);
    info_slot_.push_back(slot);
  };
  for (size_t g = 0; g < assigned_.size(); ++g) {
    for (size_t j = 0; j < assigned_[g].size(); ++j) add(assigned_[g][j], static_cast<int>(g), &groups_[g][j]);
  }
  for (size_t e = 0; e < entries_.size(); ++e) {
    info_.module_order.push_back({entries_[e].layer, entries_[e].name});
    if (entries_[e].role != state::TensorRole::kTrainable) add(static_cast<int>(e), -1, nullptr);
  }
  info_.notes.push_back(absl::StrCat("ZeRO stage 0 source (", layout_, "): which module param each optimizer state ",
                                     "belongs to was decided by ", evidence_));
  info_.Reindex();
  // Every group's scalars (step) agree: a ZeRO target keeps one per group.
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const std::string& key : scalar_keys_) {
      const Value* first = groups_[g].empty() ? nullptr : groups_[g][0].state->DictGet(key);
      for (const Slot& s : groups_[g]) {
        const Value* v = s.state->DictGet(key);
        bool same = v->kind() == first->kind();
        if (same && torch::TorchFile::IsTensor(*v)) {
          UCP_ASSIGN_OR_RETURN(torch::Tensor a, Tensor(*first, key));
          UCP_ASSIGN_OR_RETURN(torch::Tensor b, Tensor(*v, key));
          same = a.BitwiseEqual(b);
        } else if (same) {
          same = v->is(Kind::kFloat) ? v->float_value() == first->float_value() : v->int_value() == first->int_value();
        }
        if (!same) {
          return absl::UnimplementedError(absl::StrCat(
              path_, ": the params of group ", g, " have different '", key, "' (optimizer params ",
              groups_[g][0].index, " and ", s.index, "): a param skipped some steps; a ZeRO or universal checkpoint "
              "keeps one per group"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Zero0State::BuildCommon() {
  const Value& root = *file_->root();
  // The ZeRO optimizer's keys DeepSpeed's defaults give this model; then
  // the source's loss scale, clip_grad and param groups.
  deepspeed::EngineDefaults d;
  if (!ds_version_.empty()) d.ds_version = ds_version_;
  if (const Value* v = root.DictGet("global_steps"); v != nullptr && v->is(Kind::kInt)) d.global_steps = v->int_value();
  absl::StatusOr<state::FileValue> defaults = deepspeed::DefaultOptimizerCommon(info_, d);
  if (!defaults.ok()) {
    d.ds_version = deepspeed::kNewestDsVersion;  // a version the defaults do not know
    UCP_ASSIGN_OR_RETURN(defaults, deepspeed::DefaultOptimizerCommon(info_, d));
  }
  ValuePtr c = Value::MakeDict();
  for (const auto& [k, v] : defaults->value->dict_items()) c->DictSet(k, v);
  if (wrapper_ != nullptr) {
    const Value* scale = wrapper_->DictGet("cur_scale");
    const Value* dynamic = wrapper_->DictGet("dynamic_loss_scale");
    if (scale != nullptr && (scale->is(Kind::kFloat) || scale->is(Kind::kInt)) && dynamic != nullptr &&
        !dynamic->bool_value()) {
      c->DictSet(Value::Str("loss_scaler"),
                 pickle::MakeLossScaler(scale->is(Kind::kFloat) ? scale->float_value() : scale->int_value()));
    }
  }
  // clip_grad: the job's gradient_clipping (ZeRO optimizers keep it).
  if (const Value* cfg = root.DictGet("ds_config"); cfg != nullptr && cfg->is(Kind::kDict)) {
    if (const Value* gc = cfg->DictGet("gradient_clipping"); gc != nullptr && (gc->is(Kind::kFloat) || gc->is(Kind::kInt))) {
      c->DictSet(Value::Str("clip_grad"), Value::Float(gc->is(Kind::kFloat) ? gc->float_value() : gc->int_value()));
    } else {
      c->DictSet(Value::Str("clip_grad"), Value::Float(0.0));
    }
  }
  c->DictSet(Value::Str("param_groups"), optimizer_->DictGetPtr("param_groups"));
  common_ = state::FileValue{c, state::Unowned(file_.get())};
  // The model states as a ZeRO target keeps them: no optimizer inside.
  // The model states as a ZeRO job saves them, which writers and the
  // universal format expect: no optimizer inside, param_shapes (one
  // OrderedDict name -> torch.Size per group) and shared_params (tied
  // names) filled.
  std::vector<ValuePtr> shapes;
  for (int g = 0; g < info_.num_groups; ++g) {
    ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
    for (const state::ParamState& p : info_.params) {
      if (p.trainable() && p.group == g) d->DictSet(Value::Str(p.name), pickle::MakeTorchSize(p.tp_shapes[0]));
    }
    shapes.push_back(d);
  }
  ValuePtr shared = Value::MakeDict();
  for (const state::ParamState& p : info_.params) {
    if (p.role == state::TensorRole::kTied) shared->DictSet(Value::Str(p.name), Value::Str(p.alias_of));
  }
  root_copy_ = Value::MakeDict();
  for (const auto& [k, v] : root.dict_items()) {
    const std::string key = k->is(Kind::kStr) ? k->str() : "";
    if (key == "optimizer") {
      root_copy_->DictSet(k, Value::None());
    } else if (key == "param_shapes") {
      root_copy_->DictSet(k, Value::List(shapes));
    } else if (key == "shared_params") {
      root_copy_->DictSet(k, shared);
    } else {
      root_copy_->DictSet(k, v);
    }
  }
  return absl::OkStatus();
}

state::FileValue Zero0State::ModelStatesRoot(int pp, int tp) const {
  if (!tp_ranks_.empty()) return Rank(std::clamp(pp, 0, pp_ - 1), std::clamp(tp, 0, tp_ - 1)).ModelStatesRoot(0, 0);
  return state::FileValue{root_copy_, state::Unowned(file_.get())};
}

absl::StatusOr<std::vector<TensorPlan>> Zero0State::Slices(const state::ParamState& param, int stage,
                                                           const std::string& state) const {
  if (!tp_ranks_.empty()) {
    if (stage < 0 || stage >= pp_) return absl::InvalidArgumentError(absl::StrCat("no pipeline stage ", stage));
    std::vector<TensorPlan> out;
    for (int t = 0; t < tp_; ++t) {
      UCP_ASSIGN_OR_RETURN(std::vector<TensorPlan> one, Rank(stage, t).Slices(param, 0, state));
      out.push_back(std::move(one[0]));
    }
    return out;
  }
  const int i = info_.IndexOf(param.name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
  const Entry& e = entries_[info_entry_[i]];
  if (state == state::kLpState) return std::vector<TensorPlan>{TensorPlan::FromTensor(e.tensor)};
  const Slot* s = info_slot_[i];
  if (s == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("param '", param.name, "' is not in the optimizer (", state::TensorRoleName(param.role), ")"));
  }
  if (state == state::kFp32State) {
    if (s->master == nullptr) return std::vector<TensorPlan>{TensorPlan::FromTensor(e.tensor)};
    UCP_ASSIGN_OR_RETURN(torch::Tensor m, Tensor(*s->master, absl::StrCat("fp32 master of '", param.name, "'")));
    return std::vector<TensorPlan>{TensorPlan::FromTensor(m)};
  }
  const Value* v = s->state->DictGet(state);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("param '", param.name, "' has no optimizer state '", state, "'"));
  UCP_ASSIGN_OR_RETURN(torch::Tensor t, Tensor(*v, absl::StrCat(state, " of '", param.name, "'")));
  return std::vector<TensorPlan>{TensorPlan::FromTensor(t)};
}

absl::StatusOr<state::FileValue> Zero0State::GroupScalar(int group, const std::string& key) const {
  for (const auto& r : tp_ranks_) {  // the first stage whose optimizer holds a param of the group
    if (group >= 0 && group < static_cast<int>(r->groups_.size()) && !r->groups_[group].empty()) {
      return r->GroupScalar(group, key);
    }
  }
  if (!tp_ranks_.empty()) return tp_ranks_[0]->GroupScalar(group, key);
  if (group < 0 || group >= static_cast<int>(groups_.size()) || groups_[group].empty()) {
    return state::FileValue{nullptr, nullptr};
  }
  return state::FileValue{groups_[group][0].state->DictGetPtr(key), state::Unowned(file_.get())};
}

std::vector<state::InputRange> Zero0State::Inputs(const state::ParamState& param) const {
  if (!tp_ranks_.empty()) {
    std::vector<state::InputRange> out;
    const int stage = param.stages.empty() ? 0 : param.stages[0];
    for (int t = 0; t < tp_; ++t) {
      out.push_back(state::InputRange{Rank(stage, t).path_, "", 0, -1});
      if (param.layer >= 0) out.push_back(state::InputRange{JoinPath(dir_, deepspeed::LayerFileName(param.layer, t)), "", 0, -1});
    }
    return out;
  }
  return {state::InputRange{path_, "", 0, -1}};
}

}  // namespace ucp::deepspeed_zero0
