#include "formats/deepspeed_zero/zero_state.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"

namespace ucp::deepspeed_zero {

using deepspeed::ModelStatesFiles;
using deepspeed::ZeroParam;

namespace {

using state::ParamState;
using state::TensorRole;
using pickle::Kind;
using pickle::Value;
using tp::TensorPlan;

}  // namespace

absl::StatusOr<std::unique_ptr<ZeroSlicedState>> ZeroSlicedState::Make(std::shared_ptr<const ZeroCheckpoint> ckpt,
                                                                       const ZeroReadOptions& options) {
  std::unique_ptr<ZeroSlicedState> s(new ZeroSlicedState());
  s->ckpt_ = std::move(ckpt);
  UCP_RETURN_IF_ERROR(s->Build(options));
  return s;
}

absl::Status ZeroSlicedState::Build(const ZeroReadOptions& options) {
  const ZeroCheckpoint& c = *ckpt_;
  info_.source_topology = c.topology();
  info_.pipeline = c.pipeline();
  info_.lp_dtype = c.lp_dtype();
  info_.optimizer_kind = c.optimizer_kind();
  info_.zero_stage = c.zero_stage();
  info_.bf16_file_prefix = c.bf16_file_prefix();
  info_.num_groups = c.num_groups();
  info_.state_keys = c.state_keys();
  {
    UCP_ASSIGN_OR_RETURN(const OptimFile* f, c.Optim(0, 0, 0));
    if (!f->scalars.empty()) {
      for (const auto& [k, v] : f->scalars[0]) info_.scalar_keys.push_back(k);
    }
  }
  const ModelStatesFiles& ms = c.model_states();
  info_.make_vocab_size_divisible_by = options.make_vocab_size_divisible_by > 0
                                           ? options.make_vocab_size_divisible_by
                                           : ms.ArgInt({"make_vocab_size_divisible_by"});
  info_.partition_method = ms.RecordedPartitionMethod();
  info_.autotp = ms.autotp_size() >= 1 ||
                 ms.universal_checkpoint_info().DictGet("autotp_unsupported_parameter_patterns") != nullptr;
  info_.module_layers = c.layer_files();

  // Module entries by full name (tied names appear in several layers).
  std::map<std::string, std::vector<int>> entries_by_name;
  for (size_t i = 0; i < c.module_entries().size(); ++i) {
    entries_by_name[c.module_entries()[i].name].push_back(static_cast<int>(i));
  }
  // Trainable params in global flatten order: groups, then stages.
  std::set<std::string> seen;
  for (int g = 0; g < c.num_groups(); ++g) {
    for (int st = 0; st < c.topology().pp; ++st) {
      for (const std::string& name : c.StageGroup(st, g)) {
        if (!seen.insert(name).second) continue;
        const ZeroParam* zp = c.FindParam(name);
        state::ParamState p;
        p.name = name;
        p.group = g;
        p.role = state::TensorRole::kTrainable;
        p.lp_dtype = c.lp_dtype();
        p.layer = zp->layer;
        p.local_name = name;
        p.tied_key = zp->tied_key;
        p.tp_shapes = zp->tp_shapes;
        p.stages = zp->stages;
        auto it = entries_by_name.find(name);
        int entry = -1;
        if (it != entries_by_name.end()) {
          entry = it->second[0];
          const ModuleEntry& e = c.module_entries()[entry];
          p.lp_dtype = e.dtype;
          p.layer = e.layer;
          p.local_name = e.local_name;
          for (int idx : it->second) p.tied_layers.push_back(c.module_entries()[idx].layer);
          if (p.tied_layers.size() < 2) p.tied_layers.clear();
        }
        info_.params.push_back(std::move(p));
        zero_params_.push_back(zp);
        module_entry_.push_back(entry);
      }
    }
  }
  // Frozen params and buffers, in module order.
  for (size_t i = 0; i < c.module_entries().size(); ++i) {
    const ModuleEntry& e = c.module_entries()[i];
    info_.module_order.push_back({e.layer, e.name});
    if (e.role == state::TensorRole::kTrainable || seen.count(e.name)) continue;
    seen.insert(e.name);
    state::ParamState p;
    p.name = e.name;
    p.group = -1;
    p.role = e.role;
    p.lp_dtype = e.dtype;
    p.layer = e.layer;
    p.local_name = e.local_name;
    p.tied_key = e.tied_key;
    p.alias_of = e.alias_of;
    p.tp_shapes = e.tp_shapes;
    p.stages = {0};
    for (int idx : entries_by_name[e.name]) p.tied_layers.push_back(c.module_entries()[idx].layer);
    if (p.tied_layers.size() < 2) p.tied_layers.clear();
    info_.params.push_back(std::move(p));
    zero_params_.push_back(nullptr);
    module_entry_.push_back(static_cast<int>(i));
  }
  // Pipeline layer specs: every index up to the last one holding a file or a
  // param (trailing function layers leave no trace in a checkpoint).
  int max_layer = -1;
  for (int l : info_.module_layers) max_layer = std::max(max_layer, l);
  for (const auto& p : info_.params) max_layer = std::max(max_layer, p.layer);
  info_.num_layers = info_.pipeline ? max_layer + 1 : 0;
  if (info_.pipeline) UCP_RETURN_IF_ERROR(PlaceTiedModules(options, max_layer));
  info_.Reindex();
  return absl::OkStatus();
}

absl::Status ZeroSlicedState::PlaceTiedModules(const ZeroReadOptions& options, int max_layer) {
  const int pp = ckpt_->topology().pp;
  std::map<std::string, std::vector<int>> assumed;  // key -> layers incl. an assumed head
  for (size_t i = 0; i < info_.params.size(); ++i) {
    state::ParamState& p = info_.params[i];
    if (p.tied_key.empty()) continue;
    std::vector<int> layers = p.tied_layers;
    if (layers.empty() && p.layer >= 0) layers = {p.layer};
    auto given = options.tied_layers.find(p.tied_key);
    if (given != options.tied_layers.end()) {
      for (int l : layers) {
        if (std::find(given->second.begin(), given->second.end(), l) == given->second.end()) {
          return absl::InvalidArgumentError(absl::StrCat("--tied_layers: tied module '", p.tied_key,
                                                         "' is in the file of layer ", l, ", which the flag omits"));
        }
      }
      p.tied_layers = given->second;
      std::sort(p.tied_layers.begin(), p.tied_layers.end());
      p.layer = p.tied_layers.front();
      for (int l : p.tied_layers) info_.num_layers = std::max(info_.num_layers, l + 1);
      continue;
    }
    if (layers.size() >= 2) continue;  // every use has its layer file
    // One layer file holds the tied module. A tied head without a file
    // exists when the module is also in a later stage, and cannot be ruled
    // out at pp=1 (the checkpoint looks the same either way).
    const ZeroParam* zp = zero_params_[i];
    bool head = pp == 1;
    if (zp != nullptr && pp > 1) head = zp->stages.size() > 1;
    if (!head) continue;
    const int head_layer = max_layer + 1;
    if (!layers.empty() && layers[0] == head_layer) continue;
    p.tied_layers = layers;
    p.tied_layers.push_back(head_layer);
    assumed[p.tied_key] = p.tied_layers;
    info_.num_layers = std::max(info_.num_layers, head_layer + 1);
  }
  for (const auto& [key, layers] : assumed) {
    info_.notes.push_back(absl::StrCat(
        "tied module '", key, "' is in the layer file of layer ", layers.front(),
        " only; assumed it is also used by a file-less layer ", layers.back(),
        " at the end (the tied output head of Megatron-DeepSpeed and GPT-NeoX); pass --tied_layers=", key, ":",
        absl::StrJoin(layers, ","), " or another list to say otherwise"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorPlan>> ZeroSlicedState::Slices(const state::ParamState& param, int stage,
                                                               const std::string& state) const {
  const int i = info_.IndexOf(param.name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
  const int tp_degree = ckpt_->topology().tp;
  std::vector<TensorPlan> out;
  if (state == state::kLpState) {
    if (module_entry_[i] < 0) {
      return absl::NotFoundError(absl::StrCat("param '", param.name, "' has no module weight in the checkpoint"));
    }
    const ModuleEntry& e = ckpt_->module_entries()[module_entry_[i]];
    for (int t = 0; t < tp_degree; ++t) {
      UCP_ASSIGN_OR_RETURN(torch::Tensor w, ckpt_->ModuleTensor(e, t));
      out.push_back(TensorPlan::FromTensor(w));
    }
    return out;
  }
  const ZeroParam* zp = zero_params_[i];
  if (zp == nullptr) {
    return absl::NotFoundError(absl::StrCat("param '", param.name, "' is not in the optimizer (", 
                                            state::TensorRoleName(param.role), ")"));
  }
  for (int t = 0; t < tp_degree; ++t) {
    UCP_ASSIGN_OR_RETURN(std::vector<torch::Tensor> pieces, ckpt_->SlicePieces(*zp, stage, t, state));
    const torch::DType dtype = pieces.empty() ? torch::DType::kFloat32 : pieces[0].dtype();
    UCP_ASSIGN_OR_RETURN(TensorPlan plan, TensorPlan::FromPieces(dtype, zp->tp_shapes[t], pieces),
                         _.Prepend(absl::StrCat("param '", param.name, "' ", state, " tp rank ", t, ": ")));
    out.push_back(std::move(plan));
  }
  return out;
}

std::vector<state::InputRange> ZeroSlicedState::Inputs(const ParamState& param) const {
  std::vector<state::InputRange> out;
  const int i = info_.IndexOf(param.name);
  if (i < 0) return out;
  const int tp_degree = ckpt_->topology().tp;
  if (const ZeroParam* zp = zero_params_[i]) {
    const int stage = zp->stages[0];
    const int index = zp->index_in_group[0];
    for (int t = 0; t < tp_degree; ++t) {
      for (const auto& [rank, frag] : ckpt_->Layout(stage, t, zp->group).FragmentsOfParam(index)) {
        const std::string path = ckpt_->OptimPath(stage, t, rank);
        out.push_back({path, FlatTensorName(zp->group, "fp32"), frag.partition_offset * 4, frag.numel * 4});
        for (const std::string& key : info_.state_keys) {
          out.push_back({path, FlatTensorName(zp->group, key), frag.partition_offset * 4, frag.numel * 4});
        }
      }
    }
    return out;
  }
  const ModuleEntry& e = ckpt_->module_entries()[module_entry_[i]];
  for (int t = 0; t < tp_degree; ++t) {
    out.push_back({e.layer >= 0 ? ckpt_->LayerPath(e.layer, t) : ckpt_->MpRankPath(0, t),
                   e.layer >= 0 ? e.local_name : absl::StrCat("module.", e.name), 0, -1});
  }
  return out;
}

std::vector<state::InputRange> ZeroSlicedState::StateInputs(const ParamState& param, const std::string& state) const {
  std::vector<state::InputRange> all = Inputs(param);
  const int i = info_.IndexOf(param.name);
  if (i < 0 || zero_params_[i] == nullptr) return all;
  const int group = zero_params_[i]->group;
  if (state != state::kFp32State &&
      std::find(info_.state_keys.begin(), info_.state_keys.end(), state) == info_.state_keys.end()) {
    return all;
  }
  const std::string tensor = FlatTensorName(group, state);
  std::vector<state::InputRange> out;
  for (state::InputRange& r : all) {
    if (r.tensor == tensor) out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> ZeroSlicedState::InputFiles() const {
  std::vector<std::string> out;
  for (const std::string& f : ckpt_->files()) out.push_back(JoinPath(ckpt_->dir(), f));
  return out;
}

absl::StatusOr<state::FileValue> ZeroSlicedState::GroupScalar(int group, const std::string& key) const {
  UCP_ASSIGN_OR_RETURN(const OptimFile* f, ckpt_->Optim(0, 0, 0));
  UCP_ASSIGN_OR_RETURN(pickle::ValuePtr v, ckpt_->GroupScalar(0, 0, 0, group, key));
  return state::FileValue{v, state::Unowned(f->file.get())};
}

absl::StatusOr<state::FileValue> ZeroSlicedState::OptimizerCommon() const {
  UCP_ASSIGN_OR_RETURN(const OptimFile* f, ckpt_->Optim(0, 0, 0));
  const Value& osd = *f->osd;
  pickle::ValuePtr out = Value::MakeDict();
  for (const auto& [k, v] : osd.dict_items()) {
    if (k->is(Kind::kStr) && (k->str() == "base_optimizer_state" || k->str() == "param_slice_mappings" ||
                              k->str() == "single_partition_of_fp32_groups")) {
      continue;
    }
    out->DictSet(k, v);
  }
  const Value* base = osd.DictGet("base_optimizer_state");
  if (base != nullptr && base->is(Kind::kDict)) {
    if (pickle::ValuePtr groups = base->DictGetPtr("param_groups")) out->DictSet(Value::Str("param_groups"), groups);
  }
  return state::FileValue{out, state::Unowned(f->file.get())};
}

state::FileValue ZeroSlicedState::ModelStatesRoot(int pp, int tp) const {
  const auto& t = ckpt_->topology();
  const torch::TorchFile& f = ckpt_->MpRankFile(std::min(pp, t.pp - 1), std::min(tp, t.tp - 1));
  return state::FileValue{f.root(), state::Unowned(&f)};
}

std::string ZeroSlicedState::ModelStatesPath(int pp, int tp) const {
  const auto& t = ckpt_->topology();
  return ckpt_->MpRankPath(std::min(pp, t.pp - 1), std::min(tp, t.tp - 1));
}

}  // namespace ucp::deepspeed_zero
