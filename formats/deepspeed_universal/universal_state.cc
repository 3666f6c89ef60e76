#include "formats/deepspeed_universal/universal_state.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/manifest.h"
#include "format/pickle/accessors.h"
#include "tp/merge.h"

namespace ucp::deepspeed_universal {

using deepspeed::ModelStatesFiles;
using deepspeed::LayerOfName;
using deepspeed::TiedKeyOfName;

namespace {

using state::ParamState;
using state::TensorRole;
using pickle::Kind;
using pickle::Value;

std::string LocalName(const std::string& name) {
  const int layer = LayerOfName(name);
  if (layer < 0) return name;
  return name.substr(name.find('.') + 1);
}

// A state file's metadata must say what the manifest (or the fp32 file) said
// of the param: averaged and replicated params look alike in the files.
absl::Status CheckRuleAgrees(const UniversalStateFile& f, const state::ParamState& param) {
  auto kind = [](MergeKind k) { return k == AVERAGE ? REPLICATED : k; };
  if (kind(f.rule.kind()) != kind(param.rule.kind())) {
    return absl::DataLossError(absl::StrCat(f.file->path(), ": its metadata says ", tp::MergeKindName(f.rule.kind()),
                                            ", the checkpoint's manifest says ", tp::MergeKindName(param.rule.kind()),
                                            " for param '", param.name, "'"));
  }
  return absl::OkStatus();
}

// What the folder's ucp manifest records (nothing without one): each param
// by name, and the layout.
struct Recorded {
  std::map<std::string, const Manifest::Param*> params;
  state::ModelInfo layout;
};

// Phase 1: read what the manifest records.
absl::StatusOr<Recorded> ReadRecorded(const UniversalCheckpoint& u) {
  Recorded rec;
  const std::optional<Manifest>& manifest = u.manifest();
  if (!manifest) return rec;
  for (const auto& p : manifest->param()) rec.params[p.name()] = &p;
  UCP_RETURN_IF_ERROR(Annotate(deepspeed::DecodeLayout(*manifest, &rec.layout),
                               absl::StrCat(u.dir(), "/", deepspeed::kManifestFile, ": ")));
  return rec;
}

// A param's place in the module (layer, local name, tied key): from its
// name, or from the manifest with what the files' metadata cannot say
// (averaged vs replicated, the rule's source, the role, the lp dtype).
absl::Status ApplyRecorded(const UniversalCheckpoint& u, const Recorded& rec, bool pipeline, ParamState& p) {
  auto it = rec.params.find(p.name);
  if (it == rec.params.end()) {
    p.layer = pipeline ? LayerOfName(p.name) : -1;
    p.local_name = pipeline ? LocalName(p.name) : p.name;
    p.tied_key = TiedKeyOfName(p.name);
    if (!p.tied_key.empty()) p.local_name = p.name.substr(std::string("tied_modules.").size() + p.tied_key.size() + 1);
    return absl::OkStatus();
  }
  const Manifest::Param& m = *it->second;
  UCP_ASSIGN_OR_RETURN(state::ParamState r, deepspeed::DecodeParam(m),
                       _.Prepend(absl::StrCat(u.dir(), "/", deepspeed::kManifestFile, ": ")));
  if (r.rule.kind() == AVERAGE && p.rule.kind() == REPLICATED) p.rule.set_kind(AVERAGE);
  p.source = r.source;
  p.origin = r.origin;
  p.autotp_cut = r.autotp_cut;
  p.layer = r.layer;
  p.local_name = r.local_name;
  p.tied_key = r.tied_key;
  p.tied_layers = r.tied_layers;
  if (!m.role().empty()) p.role = r.role;
  if (!m.lp_dtype().empty()) p.lp_dtype = r.lp_dtype;
  return absl::OkStatus();
}

// A param's full shape and rule: from the manifest when it records the
// whole rule (no file of the param is opened; each file is checked against
// it when a unit reads it), else from the fp32 (or module) file's metadata.
absl::Status ReadShapeAndRule(const UniversalCheckpoint& u, const Recorded& rec, bool module, ParamState& p) {
  auto it = rec.params.find(p.name);
  if (it != rec.params.end() && it->second->has_merge_rule()) {
    UCP_ASSIGN_OR_RETURN(state::ParamState r, deepspeed::DecodeParam(*it->second),
                         _.Prepend(absl::StrCat(u.dir(), "/", deepspeed::kManifestFile, ": ")));
    p.full_shape = r.full_shape;
    p.rule = r.rule;
    p.lp_dtype = module ? r.lp_dtype : p.lp_dtype;
    p.source = UNIVERSAL_METADATA;
    p.origin = "universal checkpoint metadata";
    return absl::OkStatus();
  }
  UCP_ASSIGN_OR_RETURN(UniversalStateFile f, module ? u.ReadModule(p.name) : u.ReadState(p.name, state::kFp32State));
  p.full_shape = f.param.sizes();
  p.rule = f.rule;
  p.source = UNIVERSAL_METADATA;
  p.origin = "universal checkpoint metadata";
  if (module) p.lp_dtype = f.param.dtype();
  if (p.rule.kind() == VOCAB) p.rule.set_original_vocab_size(p.full_shape.empty() ? 0 : p.full_shape[0]);
  return absl::OkStatus();
}

// Phase 2: the trainable params in global flatten order (group by group,
// stage by stage, as the model-state files list them), and each group's
// first param (whose step.pt the group's others must match).
absl::Status AddTrainableParams(const UniversalCheckpoint& u, const Recorded& rec, state::ModelInfo* info,
                                std::vector<std::string>* first_param_of_group) {
  const ModelStatesFiles& ms = u.model_states();
  std::set<std::string> seen;
  first_param_of_group->assign(info->num_groups, "");
  for (int g = 0; g < info->num_groups; ++g) {
    for (int st = 0; st < ms.topology().pp; ++st) {
      for (const std::string& name : ms.StageGroup(st, g)) {
        if (!seen.insert(name).second) continue;
        if ((*first_param_of_group)[g].empty()) (*first_param_of_group)[g] = name;
        state::ParamState p;
        p.name = name;
        p.group = g;
        p.role = state::TensorRole::kTrainable;
        p.lp_dtype = info->lp_dtype;
        UCP_RETURN_IF_ERROR(ReadShapeAndRule(u, rec, /*module=*/false, p));
        UCP_RETURN_IF_ERROR(ApplyRecorded(u, rec, info->pipeline, p));
        info->params.push_back(std::move(p));
      }
    }
  }
  return absl::OkStatus();
}

// Phase 3: the module tensors outside the optimizer (ucp_module/: frozen
// params and buffers), after the trainable params, in module order when the
// manifest records it (what frozen_param_shapes follows), not in
// ucp_module/'s file-name order.
absl::Status AddModuleTensors(const UniversalCheckpoint& u, const Recorded& rec, state::ModelInfo* info) {
  // A tied alias of a plain module names its owner in shared_params of the
  // model states (alias -> owner), which the manifest does not record.
  const Value* shared =
      u.model_states().file_names().empty() ? nullptr : u.model_states().file(0, 0).root()->DictGet("shared_params");
  for (const std::string& name : u.module_names()) {
    state::ParamState p;
    p.name = name;
    p.group = -1;
    p.role = state::TensorRole::kFrozen;
    UCP_RETURN_IF_ERROR(ReadShapeAndRule(u, rec, /*module=*/true, p));
    UCP_RETURN_IF_ERROR(ApplyRecorded(u, rec, info->pipeline, p));
    if (p.role == state::TensorRole::kTrainable) p.role = state::TensorRole::kFrozen;
    if (p.role == state::TensorRole::kTied && shared != nullptr && shared->is(Kind::kDict)) {
      const Value* owner = shared->DictGet(name);
      if (owner != nullptr && owner->is(Kind::kStr)) p.alias_of = owner->str();
    }
    info->params.push_back(std::move(p));
  }
  const std::optional<Manifest>& manifest = u.manifest();
  if (manifest && manifest->module_key_size() > 0) {
    std::map<std::string, int> position;
    for (const auto& k : manifest->module_key()) position.emplace(k.name(), static_cast<int>(position.size()));
    auto rank = [&](const state::ParamState& p) {
      auto it = position.find(p.name);
      return it == position.end() ? static_cast<int>(position.size()) : it->second;
    };
    auto first_module = std::find_if(info->params.begin(), info->params.end(),
                                     [](const state::ParamState& p) { return !p.trainable(); });
    std::stable_sort(first_module, info->params.end(),
                     [&](const state::ParamState& a, const state::ParamState& b) { return rank(a) < rank(b); });
  }
  return absl::OkStatus();
}

// Phase 4: the optimizer's state keys (recorded, else the first param's
// files in DeepSpeed's order), its kind (bf16 optimizer or ZeRO, from the
// common state's keys), ZeRO stage and bf16 file naming.
absl::Status ReadOptimizerLayout(const UniversalCheckpoint& u, const Recorded& rec, state::ModelInfo* info) {
  const bool manifest = u.manifest().has_value();
  if (manifest && !rec.layout.state_keys.empty()) {
    info->state_keys = rec.layout.state_keys;
    info->scalar_keys = rec.layout.scalar_keys;
  } else if (!info->params.empty() && info->params[0].trainable()) {
    std::vector<std::string> keys;
    for (const auto& s : u.StateFiles(info->params[0].name)) {
      if (s == "step") {
        info->scalar_keys.push_back(s);
      } else if (s != state::kFp32State) {
        keys.push_back(s);
      }
    }
    // DeepSpeed's order: exp_avg before exp_avg_sq, others after.
    std::stable_sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
      auto rank = [](const std::string& k) { return k == "exp_avg" ? 0 : k == "exp_avg_sq" ? 1 : 2; };
      return rank(a) < rank(b);
    });
    info->state_keys = keys;
  }
  const Value& common = *u.optimizer_state().root();
  if (!common.is(Kind::kDict)) {
    return absl::InvalidArgumentError(absl::StrCat(u.optimizer_state().path(), ": expected a dict"));
  }
  info->optimizer_kind = common.DictGet("zero_stage") == nullptr && common.DictGet("loss_scaler") == nullptr
                             ? state::OptimizerKind::kBf16
                             : state::OptimizerKind::kZero;
  if (const Value* zs = common.DictGet("zero_stage")) {
    UCP_ASSIGN_OR_RETURN(info->zero_stage, pickle::AsZeroStage(*zs, "zero_stage"),
                         _.Prepend(absl::StrCat(u.optimizer_state().path(), ": ")));
  }
  info->bf16_file_prefix = manifest ? rec.layout.bf16_file_prefix : info->lp_dtype == torch::DType::kBFloat16;
  return absl::OkStatus();
}

// Phase 5: the vocabulary (unpadded size, padding multiple) and the
// pipeline layout (partition method, layers): recorded in the manifest,
// else from the model-state files' args, else inferred from the names
// (every layer index up to the last one).
void ReadVocabAndPipeline(const UniversalCheckpoint& u, const Recorded& rec, state::ModelInfo* info) {
  const ModelStatesFiles& ms = u.model_states();
  const bool manifest = u.manifest().has_value();
  const state::ModelInfo& layout = rec.layout;
  info->original_vocab_size = manifest ? layout.original_vocab_size : 0;
  if (info->original_vocab_size == 0) {
    const Value* ov = ms.universal_checkpoint_info().DictGet("original_vocab_size");
    if (ov != nullptr && ov->is(Kind::kInt)) info->original_vocab_size = ov->int_value();
  }
  info->make_vocab_size_divisible_by =
      manifest && layout.make_vocab_size_divisible_by > 0 ? layout.make_vocab_size_divisible_by
                                                           : ms.ArgInt({"make_vocab_size_divisible_by"});
  // Saved by AutoTP (ucp's output keeps the source's model states): no vocabulary padding.
  info->autotp = ms.autotp_size() >= 1 ||
                 ms.universal_checkpoint_info().DictGet("autotp_unsupported_parameter_patterns") != nullptr;
  info->partition_method = manifest ? layout.partition_method : "";
  if (info->partition_method.empty()) {
    info->partition_method = ms.RecordedPartitionMethod();
  }
  if (manifest && (layout.num_layers > 0 || !layout.pipeline)) {
    info->num_layers = layout.num_layers;
    info->module_layers = layout.module_layers;
    info->module_order = layout.module_order;
  } else if (info->pipeline) {
    int max_layer = -1;
    for (const auto& p : info->params) max_layer = std::max(max_layer, p.layer);
    info->num_layers = max_layer + 1;
    for (int l = 0; l < info->num_layers; ++l) info->module_layers.push_back(l);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<UniversalModelState>> UniversalModelState::Make(
    std::shared_ptr<const UniversalCheckpoint> ckpt) {
  std::unique_ptr<UniversalModelState> s(new UniversalModelState());
  s->ckpt_ = std::move(ckpt);
  UCP_RETURN_IF_ERROR(s->Build());
  return s;
}

absl::Status UniversalModelState::Build() {
  const UniversalCheckpoint& u = *ckpt_;
  const ModelStatesFiles& ms = u.model_states();
  UCP_ASSIGN_OR_RETURN(Recorded rec, ReadRecorded(u));
  info_.source_topology = ms.topology();
  info_.pipeline = ms.pipeline();
  info_.num_groups = ms.num_groups();
  info_.lp_dtype = ms.config_lp_dtype();
  if (u.manifest() && !u.manifest()->lp_dtype().empty()) info_.lp_dtype = rec.layout.lp_dtype;
  UCP_RETURN_IF_ERROR(AddTrainableParams(u, rec, &info_, &first_param_of_group_));
  UCP_RETURN_IF_ERROR(AddModuleTensors(u, rec, &info_));
  info_.Reindex();
  UCP_RETURN_IF_ERROR(ReadOptimizerLayout(u, rec, &info_));
  ReadVocabAndPipeline(u, rec, &info_);
  info_.Reindex();
  return absl::OkStatus();
}

absl::StatusOr<tp::TensorPlan> UniversalModelState::Full(const state::ParamState& param, const std::string& state) const {
  if (param.trainable()) {
    if (state == state::kLpState) {
      return absl::NotFoundError(absl::StrCat("param '", param.name,
                                              "': a universal checkpoint holds no lp weights of trainable params"));
    }
    UCP_ASSIGN_OR_RETURN(UniversalStateFile f, ckpt_->ReadState(param.name, state));
    if (f.param.dtype() != torch::DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.file->path(), ": 'param' of param '", param.name, "' is ", std::string(torch::DTypeName(f.param.dtype())),
          ", expected float32 (", state == state::kFp32State ? std::string("the fp32 master weights") : "optimizer state '" + state + "'",
          " of a universal checkpoint)"));
    }
    if (f.param.sizes() != param.full_shape) {
      return absl::InvalidArgumentError(absl::StrCat(f.file->path(), ": 'param' has shape ",
                                                     torch::ShapeString(f.param.sizes()), ", expected ",
                                                     torch::ShapeString(param.full_shape)));
    }
    UCP_RETURN_IF_ERROR(CheckRuleAgrees(f, param));
    UCP_RETURN_IF_ERROR(CheckStep(param));
    return tp::TensorPlan::FromTensor(f.param);
  }
  UCP_ASSIGN_OR_RETURN(UniversalStateFile f, ckpt_->ReadModule(param.name));
  if (f.param.sizes() != param.full_shape) {
    return absl::InvalidArgumentError(absl::StrCat(f.file->path(), ": 'param' has shape ",
                                                   torch::ShapeString(f.param.sizes()), ", expected ",
                                                   torch::ShapeString(param.full_shape)));
  }
  UCP_RETURN_IF_ERROR(CheckRuleAgrees(f, param));
  return tp::TensorPlan::FromTensor(f.param);
}

std::string UniversalModelState::StatePath(const std::string& name, const std::string& state) const {
  return JoinPath(JoinPath(JoinPath(ckpt_->dir(), deepspeed::kUniversalZeroDir), name), state + ".pt");
}

std::optional<tp::TensorPlan> UniversalModelState::FullDeferred(const state::ParamState& param,
                                                                const std::string& state) const {
  if (!param.trainable() || state == state::kLpState) return std::nullopt;
  const auto& states = ckpt_->StateFiles(param.name);
  if (std::find(states.begin(), states.end(), state) == states.end()) return std::nullopt;  // Full says why
  tp::TensorPlan::DeferredSource s;
  s.dtype = torch::DType::kFloat32;  // as Full requires
  s.shape = param.full_shape;
  s.label = StatePath(param.name, state);
  s.files.push_back(s.label);
  if (std::find(states.begin(), states.end(), "step") != states.end()) s.files.push_back(StatePath(param.name, "step"));
  s.open = [this, param, state]() { return Full(param, state); };
  return tp::TensorPlan::Deferred(std::move(s));
}

std::vector<state::InputRange> UniversalModelState::Inputs(const state::ParamState& param) const {
  std::vector<state::InputRange> out;
  if (!param.trainable()) {
    out.push_back({JoinPath(JoinPath(ckpt_->dir(), deepspeed::kUniversalModuleDir), param.name + ".pt"), "", 0, -1});
    return out;
  }
  for (const std::string& s : ckpt_->StateFiles(param.name)) out.push_back({StatePath(param.name, s), "", 0, -1});
  return out;
}

std::vector<state::InputRange> UniversalModelState::StateInputs(const state::ParamState& param,
                                                                    const std::string& state) const {
  if (!param.trainable() || state == state::kLpState) return Inputs(param);
  // Full(param, state) reads the state's file and checks the param's step.pt.
  std::vector<state::InputRange> out;
  for (const std::string& s : ckpt_->StateFiles(param.name)) {
    if (s == state || s == "step") out.push_back({StatePath(param.name, s), "", 0, -1});
  }
  return out;
}

absl::StatusOr<state::FileValue> UniversalModelState::GroupScalar(int group, const std::string& key) const {
  if (key != "step" || group < 0 || group >= static_cast<int>(first_param_of_group_.size()) ||
      first_param_of_group_[group].empty()) {
    return state::FileValue{};
  }
  UCP_ASSIGN_OR_RETURN(std::shared_ptr<const torch::TorchFile> f, ckpt_->ReadStep(first_param_of_group_[group]));
  if (!f) return state::FileValue{};
  return state::FileValue{f->root(), f};
}

namespace {

// The bytes a step.pt holds (its tensor's, or the value's text).
std::string StepBytes(const torch::TorchFile& f) {
  const pickle::Value* v = f.root().get();
  if (v->is(pickle::Kind::kDict)) {
    const pickle::Value* p = v->DictGet("param");
    if (p != nullptr) v = p;
  }
  if (torch::TorchFile::IsTensor(*v)) {
    auto t = f.GetTensor(*v);
    if (t.ok()) return absl::StrCat(std::string(torch::DTypeName(t->dtype())), ":", t->ContiguousBytes());
  }
  return v->DebugString(80);
}

}  // namespace

absl::Status UniversalModelState::CheckStep(const state::ParamState& param) const {
  const int group = param.group;
  if (group < 0 || group >= static_cast<int>(first_param_of_group_.size()) || first_param_of_group_[group].empty() ||
      param.name == first_param_of_group_[group]) {
    return absl::OkStatus();
  }
  {
    std::lock_guard<std::mutex> lock(steps_mu_);
    auto it = steps_checked_.find(param.name);
    if (it != steps_checked_.end()) return it->second;
  }
  // The files are read outside the lock (two threads may both read one).
  auto step_bytes = [&](const std::string& name) -> absl::StatusOr<std::string> {
    UCP_ASSIGN_OR_RETURN(std::shared_ptr<const torch::TorchFile> f, ckpt_->ReadStep(name));
    return f ? StepBytes(*f) : std::string();
  };
  std::optional<absl::StatusOr<std::string>> first;
  {
    std::lock_guard<std::mutex> lock(steps_mu_);
    auto it = group_steps_.find(group);
    if (it != group_steps_.end()) first = it->second;
  }
  if (!first) {
    first = step_bytes(first_param_of_group_[group]);
    std::lock_guard<std::mutex> lock(steps_mu_);
    group_steps_.emplace(group, *first);
  }
  absl::Status status = first->status();
  if (status.ok()) {
    absl::StatusOr<std::string> mine = step_bytes(param.name);
    if (!mine.ok()) {
      status = mine.status();
    } else if (!(*first)->empty() && !mine->empty() && *mine != **first) {
      status = absl::InvalidArgumentError(absl::StrCat(
          StatePath(param.name, "step"),
          ": step differs from that of ", first_param_of_group_[group], " (param group ", group,
          "): the params' states come from different saves"));
    }
  }
  std::lock_guard<std::mutex> lock(steps_mu_);
  steps_checked_.emplace(param.name, status);
  return status;
}

absl::StatusOr<state::FileValue> UniversalModelState::OptimizerCommon() const {
  return state::FileValue{ckpt_->optimizer_state().root(), state::Unowned(&ckpt_->optimizer_state())};
}

state::FileValue UniversalModelState::ModelStatesRoot(int pp, int tp) const {
  const auto& t = ckpt_->model_states().topology();
  const torch::TorchFile& f = ckpt_->model_states().file(std::min(pp, t.pp - 1), std::min(tp, t.tp - 1));
  return state::FileValue{f.root(), state::Unowned(&f)};
}

std::string UniversalModelState::ModelStatesPath(int pp, int tp) const {
  const auto& t = ckpt_->model_states().topology();
  return ckpt_->model_states().path(std::min(pp, t.pp - 1), std::min(tp, t.tp - 1));
}

}  // namespace ucp::deepspeed_universal
