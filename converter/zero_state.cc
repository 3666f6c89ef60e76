#include "converter/zero_state.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/parallel.h"
#include "base/status_macros.h"
#include "tp/merge.h"

namespace ucp::converter {
namespace {

using deepspeed::ModuleEntry;
using deepspeed::ParamState;
using deepspeed::TensorRole;
using deepspeed::ZeroParam;
using pickle::Kind;
using pickle::Value;
using tp::TensorPlan;

// A suggestion for the rules file that would settle an ambiguous param.
std::string SuggestRule(const std::string& name, const std::vector<int64_t>& slice_shape) {
  std::string kinds = slice_shape.size() >= 2 ? "COLUMN (cat dim 0) or ROW (cat dim 1)" : "COLUMN or REPLICATED";
  std::string escaped;
  for (char c : name) {
    if (c == '.') escaped += "\\\\.";
    else escaped += c;
  }
  return absl::StrCat("rule { pattern: \"", escaped, "$\" kind: ", slice_shape.size() >= 2 ? "COLUMN" : "REPLICATED",
                      " }  # tp slice ", torch::ShapeString(slice_shape), ": ", kinds);
}

// Evidence for one param: are the tp copies (and pipeline copies) equal?
struct Evidence {
  bool tp_equal = true;
  double tp_max_diff = 0;
  std::string tp_diff_state;
  bool stages_equal = true;
  std::string stage_diff_state;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ZeroModelState>> ZeroModelState::Make(
    std::shared_ptr<const deepspeed::ZeroCheckpoint> ckpt, const ZeroStateOptions& options) {
  std::unique_ptr<ZeroModelState> s(new ZeroModelState());
  s->ckpt_ = std::move(ckpt);
  UCP_RETURN_IF_ERROR(s->Resolve(options));
  return s;
}

absl::Status ZeroModelState::Resolve(const ZeroStateOptions& options) {
  const deepspeed::ZeroCheckpoint& c = *ckpt_;
  const int tp_degree = c.topology().tp;
  info_.source_topology = c.topology();
  info_.pipeline = c.pipeline();
  info_.lp_dtype = c.lp_dtype();
  info_.optimizer_kind = c.optimizer_kind();
  info_.zero_stage = c.zero_stage();
  info_.bf16_file_prefix = c.bf16_file_prefix();
  info_.num_groups = c.num_groups();
  info_.state_keys = c.state_keys();
  {
    UCP_ASSIGN_OR_RETURN(const deepspeed::OptimFile* f, c.Optim(0, 0, 0));
    if (!f->groups.empty()) {
      for (const auto& [k, v] : f->groups[0].scalars) info_.scalar_keys.push_back(k);
    }
  }
  const deepspeed::ModelStatesFiles& ms = c.model_states();
  info_.make_vocab_size_divisible_by = options.make_vocab_size_divisible_by > 0
                                           ? options.make_vocab_size_divisible_by
                                           : ms.ArgInt({"make_vocab_size_divisible_by"});
  info_.partition_method = ms.RecordedPartitionMethod();
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
        ParamState p;
        p.name = name;
        p.group = g;
        p.role = TensorRole::kTrainable;
        p.lp_dtype = c.lp_dtype();
        p.layer = zp->layer;
        p.local_name = name;
        p.tied_key = zp->tied_key;
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
    if (e.role == TensorRole::kTrainable || seen.count(e.name)) continue;
    seen.insert(e.name);
    ParamState p;
    p.name = e.name;
    p.group = -1;
    p.role = e.role;
    p.lp_dtype = e.dtype;
    p.layer = e.layer;
    p.local_name = e.local_name;
    p.tied_key = e.tied_key;
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

  // Rules.
  std::vector<std::string> names;
  for (const auto& p : info_.params) names.push_back(p.name);
  UCP_ASSIGN_OR_RETURN(resolver_, RuleResolver::Make(options.rules, c.universal_checkpoint_info(), names));
  info_.original_vocab_size = resolver_.original_vocab_size();

  std::vector<RuleDecision> decisions(info_.params.size());
  std::vector<char> needs_data(info_.params.size(), 0);
  for (size_t i = 0; i < info_.params.size(); ++i) {
    decisions[i] = resolver_.Decide(info_.params[i].name);
    // Megatron-DeepSpeed's fused swiglu h_to_4h (args.swiglu) holds two
    // sub-params per rank: only the preset's plain column guess is upgraded.
    if (decisions[i].rule && decisions[i].source == PRESET && decisions[i].rule->kind() == COLUMN &&
        ms.ArgBool("swiglu") && absl::StrContains(info_.params[i].name, "mlp.dense_h_to_4h.")) {
      decisions[i].rule->set_kind(SUB_PARAMS);
      decisions[i].rule->set_num_sub_params(2);
      decisions[i].rule->set_cat_dim(0);
      absl::StrAppend(&decisions[i].origin, " (args.swiglu: 2 sub-params)");
    }
    const bool replicated = decisions[i].rule && (decisions[i].rule->kind() == REPLICATED);
    const bool multi_stage = zero_params_[i] != nullptr && zero_params_[i]->stages.size() > 1;
    needs_data[i] = !decisions[i].rule || (replicated && tp_degree > 1) || multi_stage;
  }

  // Evidence, in parallel over the params that need it.
  std::vector<Evidence> evidence(info_.params.size());
  std::vector<size_t> todo;
  for (size_t i = 0; i < info_.params.size(); ++i) {
    if (needs_data[i]) todo.push_back(i);
  }
  UCP_RETURN_IF_ERROR(ParallelFor(todo.size(), options.num_threads, [&](size_t k) -> absl::Status {
    const size_t i = todo[k];
    const ParamState& p = info_.params[i];
    const ZeroParam* zp = zero_params_[i];
    std::vector<std::string> states;
    if (p.trainable()) {
      states.push_back(deepspeed::kFp32State);
      for (const auto& key : info_.state_keys) states.push_back(key);
    } else {
      states.push_back(deepspeed::kLpState);
    }
    Evidence& ev = evidence[i];
    const int first_stage = zp != nullptr ? zp->stages[0] : 0;
    for (const std::string& state : states) {
      UCP_ASSIGN_OR_RETURN(std::vector<TensorPlan> slices, Slices(p, first_stage, state));
      for (size_t t = 1; t < slices.size(); ++t) {
        UCP_ASSIGN_OR_RETURN(bool eq, TensorPlan::BitwiseEqual(slices[0], slices[t]));
        if (!eq) {
          if (ev.tp_equal) ev.tp_diff_state = state;
          ev.tp_equal = false;
          if (slices[0].shape() == slices[t].shape() && torch::IsFloatingPoint(slices[0].dtype())) {
            UCP_ASSIGN_OR_RETURN(torch::Tensor a, slices[0].Materialize());
            UCP_ASSIGN_OR_RETURN(torch::Tensor b, slices[t].Materialize());
            UCP_ASSIGN_OR_RETURN(double d, torch::MaxAbsDiff(a, b));
            ev.tp_max_diff = std::max(ev.tp_max_diff, d);
          }
        }
      }
      if (zp != nullptr) {
        for (size_t si = 1; si < zp->stages.size(); ++si) {
          UCP_ASSIGN_OR_RETURN(std::vector<TensorPlan> other, Slices(p, zp->stages[si], state));
          for (size_t t = 0; t < slices.size(); ++t) {
            UCP_ASSIGN_OR_RETURN(bool eq, TensorPlan::BitwiseEqual(slices[t], other[t]));
            if (!eq && ev.stages_equal) {
              ev.stages_equal = false;
              ev.stage_diff_state = absl::StrCat(state, " (tp rank ", t, ", stages ", zp->stages[0], " and ",
                                                 zp->stages[si], ")");
            }
          }
        }
      }
    }
    return absl::OkStatus();
  }));

  std::vector<std::string> ambiguous, mismatched, tied_mismatch;
  for (size_t i = 0; i < info_.params.size(); ++i) {
    ParamState& p = info_.params[i];
    RuleDecision d = decisions[i];
    const Evidence& ev = evidence[i];
    if (!ev.stages_equal) {
      tied_mismatch.push_back(absl::StrCat("'", p.name, "' differs between pipeline stages in ", ev.stage_diff_state));
    }
    if (!d.rule) {
      d = resolver_.DecideWithoutRules(p.name, tp_degree > 1 ? std::optional<bool>(ev.tp_equal) : std::nullopt);
      if (!d.rule) {
        const std::vector<int64_t> shape = zero_params_[i] != nullptr
                                               ? zero_params_[i]->tp_shapes[0]
                                               : ckpt_->module_entries()[module_entry_[i]].tp_shapes[0];
        std::string why = tp_degree > 1
                              ? absl::StrCat("tp copies differ (", ev.tp_diff_state, ", max |diff| ", ev.tp_max_diff, ")")
                              : "tp=1: no copies to compare";
        ambiguous.push_back(absl::StrCat("  ", p.name, ": ", why, "\n      ", SuggestRule(p.name, shape)));
        continue;
      }
    } else if (d.rule->kind() == REPLICATED && tp_degree > 1 && !ev.tp_equal) {
      switch (options.replicated_mismatch) {
        case ReplicatedMismatch::kError:
          mismatched.push_back(absl::StrCat("  ", p.name, " (", d.origin, "): tp copies differ in ", ev.tp_diff_state,
                                            ", largest |difference| ", ev.tp_max_diff));
          break;
        case ReplicatedMismatch::kAverage:
          d.rule->set_kind(AVERAGE);
          absl::StrAppend(&d.origin, "; tp copies differ (max |diff| ", ev.tp_max_diff,
                          "): averaged (--replicated_mismatch=average)");
          break;
        case ReplicatedMismatch::kFirst:
          absl::StrAppend(&d.origin, "; tp copies differ (max |diff| ", ev.tp_max_diff,
                          "): tp rank 0 kept (--replicated_mismatch=first)");
          break;
      }
    }
    p.rule = *d.rule;
    p.rule.set_pattern(d.rule->pattern());
    p.source = d.source;
    p.origin = d.origin;
  }
  if (!tied_mismatch.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(c.dir(), ": params tied across pipeline stages are not equal:\n  ",
                     absl::StrJoin(tied_mismatch, "\n  ")));
  }
  if (!mismatched.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        c.dir(), ": ", mismatched.size(), " replicated param(s) differ between tp ranks (use ",
        "--replicated_mismatch=average or =first to accept):\n", absl::StrJoin(mismatched, "\n")));
  }
  if (!ambiguous.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        c.dir(), ": cannot tell how to merge the tp slices of ", ambiguous.size(),
        " param(s); no rule file, checkpoint pattern or preset",
        resolver_.preset().empty() ? "" : absl::StrCat(" (", resolver_.preset(), ")"),
        " covers them. Settle them with --rules=FILE (a MergeRules textproto), --preset, or --default_kind:\n",
        absl::StrJoin(ambiguous, "\n")));
  }
  // Full shapes.
  for (size_t i = 0; i < info_.params.size(); ++i) {
    ParamState& p = info_.params[i];
    const std::vector<int64_t>& slice = zero_params_[i] != nullptr
                                            ? zero_params_[i]->tp_shapes[0]
                                            : ckpt_->module_entries()[module_entry_[i]].tp_shapes[0];
    UCP_ASSIGN_OR_RETURN(p.full_shape, tp::FullShapeFromSlice(p.rule, slice, tp_degree, p.name),
                         _.Prepend(absl::StrCat(c.dir(), ": ")));
    if (p.rule.kind() == VOCAB && p.rule.original_vocab_size() > 0) {
      if (p.rule.original_vocab_size() > p.full_shape[0]) {
        return absl::InvalidArgumentError(absl::StrCat(c.dir(), ": param '", p.name, "': original vocab size ",
                                                       p.rule.original_vocab_size(), " exceeds its ",
                                                       p.full_shape[0], " rows"));
      }
      p.full_shape[0] = p.rule.original_vocab_size();
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroModelState::PlaceTiedModules(const ZeroStateOptions& options, int max_layer) {
  const int pp = ckpt_->topology().pp;
  std::map<std::string, std::vector<int>> assumed;  // key -> layers incl. an assumed head
  for (size_t i = 0; i < info_.params.size(); ++i) {
    ParamState& p = info_.params[i];
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

absl::StatusOr<std::vector<TensorPlan>> ZeroModelState::Slices(const ParamState& param, int stage,
                                                               const std::string& state) const {
  const int i = info_.IndexOf(param.name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
  const int tp_degree = ckpt_->topology().tp;
  std::vector<TensorPlan> out;
  if (state == deepspeed::kLpState) {
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
                                            deepspeed::TensorRoleName(param.role), ")"));
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

absl::StatusOr<TensorPlan> ZeroModelState::Full(const ParamState& param, const std::string& state) const {
  const int i = info_.IndexOf(param.name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
  const int stage = zero_params_[i] != nullptr ? zero_params_[i]->stages[0] : 0;
  UCP_ASSIGN_OR_RETURN(std::vector<TensorPlan> slices, Slices(info_.params[i], stage, state));
  return tp::MergeSlices(info_.params[i].rule, slices, info_.original_vocab_size, param.name);
}

absl::StatusOr<deepspeed::FileValue> ZeroModelState::GroupScalar(int group, const std::string& key) const {
  UCP_ASSIGN_OR_RETURN(const deepspeed::OptimFile* f, ckpt_->Optim(0, 0, 0));
  UCP_ASSIGN_OR_RETURN(pickle::ValuePtr v, ckpt_->GroupScalar(0, 0, 0, group, key));
  return deepspeed::FileValue{v, deepspeed::Unowned(f->file.get())};
}

absl::StatusOr<deepspeed::FileValue> ZeroModelState::OptimizerCommon() const {
  UCP_ASSIGN_OR_RETURN(const deepspeed::OptimFile* f, ckpt_->Optim(0, 0, 0));
  const Value& osd = *f->optimizer_state_dict;
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
  return deepspeed::FileValue{out, deepspeed::Unowned(f->file.get())};
}

deepspeed::FileValue ZeroModelState::ModelStatesRoot(int pp, int tp) const {
  const auto& t = ckpt_->topology();
  const torch::TorchFile& f = ckpt_->MpRankFile(std::min(pp, t.pp - 1), std::min(tp, t.tp - 1));
  return deepspeed::FileValue{f.root(), deepspeed::Unowned(&f)};
}

std::string ZeroModelState::ModelStatesPath(int pp, int tp) const {
  const auto& t = ckpt_->topology();
  return ckpt_->MpRankPath(std::min(pp, t.pp - 1), std::min(tp, t.tp - 1));
}

}  // namespace ucp::converter
