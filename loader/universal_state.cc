#include "loader/universal_state.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "format/pickle/accessors.h"
#include "tp/merge.h"

namespace ucp::loader {
namespace {

using deepspeed::ParamState;
using deepspeed::TensorRole;
using pickle::Kind;
using pickle::Value;

TensorRole RoleFromName(const std::string& role) {
  if (role == "buffer") return TensorRole::kBuffer;
  if (role == "trainable") return TensorRole::kTrainable;
  return TensorRole::kFrozen;
}

std::string LocalName(const std::string& name) {
  const int layer = deepspeed::LayerOfName(name);
  if (layer < 0) return name;
  return name.substr(name.find('.') + 1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<UniversalModelState>> UniversalModelState::Make(
    std::shared_ptr<const deepspeed::UniversalCheckpoint> ckpt, const Options& options) {
  std::unique_ptr<UniversalModelState> s(new UniversalModelState());
  s->ckpt_ = std::move(ckpt);
  UCP_RETURN_IF_ERROR(s->Build(options));
  return s;
}

absl::Status UniversalModelState::Build(const Options& options) {
  const deepspeed::UniversalCheckpoint& u = *ckpt_;
  const deepspeed::ModelStatesFiles& ms = u.model_states();
  const std::optional<Manifest>& manifest = u.manifest();
  std::map<std::string, const Manifest::Param*> recorded;
  if (manifest) {
    for (const auto& p : manifest->param()) recorded[p.name()] = &p;
  }
  info_.source_topology = ms.topology();
  info_.pipeline = ms.pipeline();
  info_.num_groups = ms.num_groups();
  info_.lp_dtype = ms.config_lp_dtype();
  if (manifest && !manifest->lp_dtype().empty()) {
    UCP_ASSIGN_OR_RETURN(info_.lp_dtype, torch::ParseDType(manifest->lp_dtype()));
  }

  auto apply_recorded = [&](ParamState& p) -> absl::Status {
    auto it = recorded.find(p.name);
    if (it == recorded.end()) {
      p.layer = info_.pipeline ? deepspeed::LayerOfName(p.name) : -1;
      p.local_name = info_.pipeline ? LocalName(p.name) : p.name;
      p.tied_key = deepspeed::TiedKeyOfName(p.name);
      if (!p.tied_key.empty()) p.local_name = p.name.substr(std::string("tied_modules.").size() + p.tied_key.size() + 1);
      return absl::OkStatus();
    }
    const Manifest::Param& m = *it->second;
    if (m.kind() == AVERAGE && p.rule.kind() == REPLICATED) p.rule.set_kind(AVERAGE);
    p.source = m.source();
    p.origin = m.rule();
    p.layer = m.layer();
    p.local_name = m.local_name();
    p.tied_key = m.tied_key();
    p.tied_layers.assign(m.tied_layer().begin(), m.tied_layer().end());
    if (!m.role().empty()) p.role = RoleFromName(m.role());
    if (!m.lp_dtype().empty()) {
      UCP_ASSIGN_OR_RETURN(p.lp_dtype, torch::ParseDType(m.lp_dtype()));
    }
    return absl::OkStatus();
  };

  // Trainable params in global flatten order.
  std::set<std::string> seen;
  first_param_of_group_.assign(info_.num_groups, "");
  for (int g = 0; g < info_.num_groups; ++g) {
    for (int st = 0; st < ms.topology().pp; ++st) {
      for (const std::string& name : ms.StageGroup(st, g)) {
        if (!seen.insert(name).second) continue;
        if (first_param_of_group_[g].empty()) first_param_of_group_[g] = name;
        UCP_ASSIGN_OR_RETURN(deepspeed::UniversalStateFile f, u.ReadState(name, deepspeed::kFp32State));
        ParamState p;
        p.name = name;
        p.group = g;
        p.role = TensorRole::kTrainable;
        p.full_shape = f.param.sizes();
        p.rule = f.rule;
        p.source = UNIVERSAL_METADATA;
        p.origin = "universal checkpoint metadata";
        p.lp_dtype = info_.lp_dtype;
        if (p.rule.kind() == VOCAB) p.rule.set_original_vocab_size(p.full_shape.empty() ? 0 : p.full_shape[0]);
        UCP_RETURN_IF_ERROR(apply_recorded(p));
        info_.params.push_back(std::move(p));
      }
    }
  }
  // Module tensors outside the optimizer.
  for (const std::string& name : u.module_names()) {
    UCP_ASSIGN_OR_RETURN(deepspeed::UniversalStateFile f, u.ReadModule(name));
    ParamState p;
    p.name = name;
    p.group = -1;
    p.role = TensorRole::kFrozen;
    p.full_shape = f.param.sizes();
    p.rule = f.rule;
    p.source = UNIVERSAL_METADATA;
    p.origin = "universal checkpoint metadata";
    p.lp_dtype = f.param.dtype();
    if (p.rule.kind() == VOCAB) p.rule.set_original_vocab_size(p.full_shape.empty() ? 0 : p.full_shape[0]);
    UCP_RETURN_IF_ERROR(apply_recorded(p));
    if (p.role == TensorRole::kTrainable) p.role = TensorRole::kFrozen;
    info_.params.push_back(std::move(p));
  }
  // ModelInfo lists frozen params and buffers in module order (what
  // frozen_param_shapes follows), not in ucp_module/'s file-name order.
  if (manifest && manifest->module_key_size() > 0) {
    std::map<std::string, int> position;
    for (const auto& k : manifest->module_key()) position.emplace(k.name(), static_cast<int>(position.size()));
    auto rank = [&](const ParamState& p) {
      auto it = position.find(p.name);
      return it == position.end() ? static_cast<int>(position.size()) : it->second;
    };
    auto first_module = std::find_if(info_.params.begin(), info_.params.end(),
                                     [](const ParamState& p) { return !p.trainable(); });
    std::stable_sort(first_module, info_.params.end(),
                     [&](const ParamState& a, const ParamState& b) { return rank(a) < rank(b); });
  }
  info_.Reindex();

  // Optimizer states.
  if (manifest && manifest->state_key_size() > 0) {
    info_.state_keys.assign(manifest->state_key().begin(), manifest->state_key().end());
    info_.scalar_keys.assign(manifest->scalar_key().begin(), manifest->scalar_key().end());
  } else if (!info_.params.empty() && info_.params[0].trainable()) {
    std::vector<std::string> keys;
    for (const auto& s : u.StateFiles(info_.params[0].name)) {
      if (s == "step") {
        info_.scalar_keys.push_back(s);
      } else if (s != deepspeed::kFp32State) {
        keys.push_back(s);
      }
    }
    // DeepSpeed's order: exp_avg before exp_avg_sq, others after.
    std::stable_sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
      auto rank = [](const std::string& k) { return k == "exp_avg" ? 0 : k == "exp_avg_sq" ? 1 : 2; };
      return rank(a) < rank(b);
    });
    info_.state_keys = keys;
  }
  const Value& common = *u.optimizer_state().root();
  if (!common.is(Kind::kDict)) {
    return absl::InvalidArgumentError(absl::StrCat(u.optimizer_state().path(), ": expected a dict"));
  }
  info_.optimizer_kind = common.DictGet("zero_stage") == nullptr && common.DictGet("loss_scaler") == nullptr
                             ? deepspeed::OptimizerKind::kBf16
                             : deepspeed::OptimizerKind::kZero;
  if (const Value* zs = common.DictGet("zero_stage")) {
    UCP_ASSIGN_OR_RETURN(info_.zero_stage, pickle::AsZeroStage(*zs, "zero_stage"),
                         _.Prepend(absl::StrCat(u.optimizer_state().path(), ": ")));
  }
  info_.bf16_file_prefix = manifest ? manifest->bf16_file_prefix() : info_.lp_dtype == torch::DType::kBFloat16;

  // Vocabulary and pipeline layout.
  info_.original_vocab_size = manifest ? manifest->original_vocab_size() : 0;
  if (info_.original_vocab_size == 0) {
    const Value* ov = ms.universal_checkpoint_info().DictGet("original_vocab_size");
    if (ov != nullptr && ov->is(Kind::kInt)) info_.original_vocab_size = ov->int_value();
  }
  info_.make_vocab_size_divisible_by =
      manifest && manifest->make_vocab_size_divisible_by() > 0 ? manifest->make_vocab_size_divisible_by()
                                                               : ms.ArgInt({"make_vocab_size_divisible_by"});
  info_.partition_method = manifest ? manifest->partition_method() : "";
  if (info_.partition_method.empty()) {
    info_.partition_method = ms.RecordedPartitionMethod();
  }
  if (manifest && (manifest->num_layers() > 0 || !manifest->pipeline())) {
    info_.num_layers = manifest->num_layers();
    info_.module_layers.assign(manifest->module_layer().begin(), manifest->module_layer().end());
    for (const auto& k : manifest->module_key()) info_.module_order.push_back({k.layer(), k.name()});
  } else if (info_.pipeline) {
    int max_layer = -1;
    for (const auto& p : info_.params) max_layer = std::max(max_layer, p.layer);
    info_.num_layers = max_layer + 1;
    for (int l = 0; l < info_.num_layers; ++l) info_.module_layers.push_back(l);
  }
  stored_rule_.assign(info_.params.size(), std::nullopt);
  if (!manifest) UCP_RETURN_IF_ERROR(Reinterpret(options));
  return absl::OkStatus();
}

absl::Status UniversalModelState::Reinterpret(const Options& options) {
  const deepspeed::UniversalCheckpoint& u = *ckpt_;
  const int tp_src = u.model_states().topology().tp;
  std::vector<std::string> names;
  for (const auto& p : info_.params) names.push_back(p.name);
  UCP_ASSIGN_OR_RETURN(converter::RuleResolver resolver,
                       converter::RuleResolver::Make(options.rules, u.model_states().universal_checkpoint_info(), names));
  if (resolver.original_vocab_size() > 0 && info_.original_vocab_size == 0) {
    info_.original_vocab_size = resolver.original_vocab_size();
  }
  auto same = [](MergeRule a, MergeRule b) {
    for (MergeRule* r : {&a, &b}) {
      r->clear_pattern();
      r->clear_comment();
      r->clear_original_vocab_size();
    }
    return a.SerializeAsString() == b.SerializeAsString();
  };
  for (size_t i = 0; i < info_.params.size(); ++i) {
    ParamState& p = info_.params[i];
    // Only DeepSpeed's default for names no pattern matched is suspect.
    if (!p.trainable() || p.rule.kind() != COLUMN) continue;
    const MergeRule stored = p.rule;
    converter::RuleDecision d = resolver.Decide(p.name);
    if (!d.rule && tp_src > 1) {
      // Evidence: tp equal copies concatenated on dim 0 are a replicated param.
      bool equal = true;
      std::vector<std::string> states = {deepspeed::kFp32State};
      states.insert(states.end(), info_.state_keys.begin(), info_.state_keys.end());
      for (const std::string& state : states) {
        UCP_ASSIGN_OR_RETURN(deepspeed::UniversalStateFile f, u.ReadState(p.name, state));
        tp::TensorPlan plan = tp::TensorPlan::FromTensor(f.param);
        auto first = tp::SplitFull(stored, plan, tp_src, 0, 0, p.name);
        if (!first.ok()) {
          equal = false;
          break;
        }
        for (int t = 1; t < tp_src && equal; ++t) {
          UCP_ASSIGN_OR_RETURN(tp::TensorPlan other, tp::SplitFull(stored, plan, tp_src, t, 0, p.name));
          UCP_ASSIGN_OR_RETURN(equal, tp::TensorPlan::BitwiseEqual(*first, other));
        }
        if (!equal) break;
      }
      if (equal) {
        MergeRule r;
        r.set_pattern(p.name);
        r.set_kind(REPLICATED);
        d.rule = r;
        d.source = EVIDENCE;
        d.origin = absl::StrCat("DeepSpeed stored ", tp_src, " bitwise equal tp copies concatenated on dim 0");
      }
    }
    if (d.rule && d.rule->kind() == REPLICATED && d.source != EVIDENCE && tp_src > 1) {
      // A rule says replicated: the tp copies DeepSpeed concatenated must agree.
      std::vector<std::string> states = {deepspeed::kFp32State};
      states.insert(states.end(), info_.state_keys.begin(), info_.state_keys.end());
      for (const std::string& state : states) {
        UCP_ASSIGN_OR_RETURN(deepspeed::UniversalStateFile f, u.ReadState(p.name, state));
        tp::TensorPlan plan = tp::TensorPlan::FromTensor(f.param);
        UCP_ASSIGN_OR_RETURN(tp::TensorPlan first, tp::SplitFull(stored, plan, tp_src, 0, 0, p.name),
                             _.Prepend(absl::StrCat(f.file->path(), ": ")));
        for (int t = 1; t < tp_src; ++t) {
          UCP_ASSIGN_OR_RETURN(tp::TensorPlan other, tp::SplitFull(stored, plan, tp_src, t, 0, p.name));
          UCP_ASSIGN_OR_RETURN(bool equal, tp::TensorPlan::BitwiseEqual(first, other));
          if (!equal) {
            return absl::FailedPreconditionError(absl::StrCat(
                f.file->path(), ": param '", p.name, "' is replicated (", d.origin, ") but the ", tp_src,
                " tp copies DeepSpeed concatenated on dim 0 differ in ", state));
          }
        }
      }
    }
    if (!d.rule || same(*d.rule, stored)) {
      if (d.rule) {
        p.source = d.source;
        p.origin = d.origin;
      }
      continue;
    }
    UCP_ASSIGN_OR_RETURN(std::vector<int64_t> slice, tp::SliceShapeFromFull(stored, p.full_shape, tp_src, 0, p.name),
                         _.Prepend(absl::StrCat(u.dir(), ": ")));
    UCP_ASSIGN_OR_RETURN(std::vector<int64_t> full, tp::FullShapeFromSlice(*d.rule, slice, tp_src, p.name),
                         _.Prepend(absl::StrCat(u.dir(), ": ")));
    if (d.rule->kind() == VOCAB) {
      const int64_t v = d.rule->original_vocab_size() > 0 ? d.rule->original_vocab_size() : info_.original_vocab_size;
      if (v > 0 && v <= full[0]) full[0] = v;
      d.rule->set_original_vocab_size(v > 0 ? v : full[0]);
    }
    stored_rule_[i] = stored;
    p.rule = *d.rule;
    p.full_shape = full;
    p.source = d.source;
    p.origin = absl::StrCat(d.origin, "; re-merged from DeepSpeed's ", tp::DescribeRule(stored), " of the tp=", tp_src,
                            " slices");
  }
  return absl::OkStatus();
}

absl::StatusOr<tp::TensorPlan> UniversalModelState::Full(const ParamState& param, const std::string& state) const {
  if (param.trainable()) {
    if (state == deepspeed::kLpState) {
      return absl::NotFoundError(absl::StrCat("param '", param.name,
                                              "': a universal checkpoint holds no lp weights of trainable params"));
    }
    UCP_ASSIGN_OR_RETURN(deepspeed::UniversalStateFile f, ckpt_->ReadState(param.name, state));
    const int i = info_.IndexOf(param.name);
    if (i >= 0 && stored_rule_[i]) {
      // DeepSpeed's concatenation of the source's tp slices, re-merged.
      const int tp_src = ckpt_->model_states().topology().tp;
      tp::TensorPlan stored = tp::TensorPlan::FromTensor(f.param);
      std::vector<tp::TensorPlan> slices;
      for (int t = 0; t < tp_src; ++t) {
        UCP_ASSIGN_OR_RETURN(tp::TensorPlan s, tp::SplitFull(*stored_rule_[i], stored, tp_src, t, 0, param.name));
        slices.push_back(std::move(s));
      }
      return tp::MergeSlices(info_.params[i].rule, slices, info_.original_vocab_size, param.name);
    }
    if (f.param.sizes() != param.full_shape) {
      return absl::InvalidArgumentError(absl::StrCat(f.file->path(), ": 'param' has shape ",
                                                     torch::ShapeString(f.param.sizes()), ", fp32.pt has ",
                                                     torch::ShapeString(param.full_shape)));
    }
    return tp::TensorPlan::FromTensor(f.param);
  }
  UCP_ASSIGN_OR_RETURN(deepspeed::UniversalStateFile f, ckpt_->ReadModule(param.name));
  return tp::TensorPlan::FromTensor(f.param);
}

absl::StatusOr<deepspeed::FileValue> UniversalModelState::GroupScalar(int group, const std::string& key) const {
  if (key != "step" || group < 0 || group >= static_cast<int>(first_param_of_group_.size()) ||
      first_param_of_group_[group].empty()) {
    return deepspeed::FileValue{};
  }
  UCP_ASSIGN_OR_RETURN(std::shared_ptr<const torch::TorchFile> f, ckpt_->ReadStep(first_param_of_group_[group]));
  if (!f) return deepspeed::FileValue{};
  return deepspeed::FileValue{f->root(), f};
}

absl::StatusOr<deepspeed::FileValue> UniversalModelState::OptimizerCommon() const {
  return deepspeed::FileValue{ckpt_->optimizer_state().root(), deepspeed::Unowned(&ckpt_->optimizer_state())};
}

deepspeed::FileValue UniversalModelState::ModelStatesRoot(int pp, int tp) const {
  const auto& t = ckpt_->model_states().topology();
  const torch::TorchFile& f = ckpt_->model_states().file(std::min(pp, t.pp - 1), std::min(tp, t.tp - 1));
  return deepspeed::FileValue{f.root(), deepspeed::Unowned(&f)};
}

std::string UniversalModelState::ModelStatesPath(int pp, int tp) const {
  const auto& t = ckpt_->model_states().topology();
  return ckpt_->model_states().path(std::min(pp, t.pp - 1), std::min(tp, t.tp - 1));
}

}  // namespace ucp::loader
