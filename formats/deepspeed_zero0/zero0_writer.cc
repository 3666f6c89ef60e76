#include "formats/deepspeed_zero0/zero0_writer.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/client_args.h"
#include "deepspeed/engine_defaults.h"
#include "deepspeed/facet.h"
#include "deepspeed/layout_math.h"
#include "deepspeed/tree_copy.h"
#include "deepspeed/zero_target_parts.h"
#include "format/pickle/accessors.h"
#include "format/torch/torch_file.h"
#include "formats/deepspeed_zero/zero_writer.h"
#include "tp/plan_io.h"

namespace ucp::deepspeed_zero0 {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using state::ParamState;
using tp::TensorPlan;
using writers::UnitResult;
using writers::WriteStats;

class Zero0Plan : public writers::Plan {
 public:
  Zero0Plan(const state::ModelState& state, const writers::ZeroWriteOptions& options)
      : state_(state), info_(state.info()), options_(options) {}

  std::string ArgsNote() const { return deepspeed::DescribeArgsChanges(args_changes_); }

  absl::Status Build() {
    UCP_RETURN_IF_ERROR(options_.target.Validate());
    if (options_.target.pp != 1) {
      return absl::InvalidArgumentError(absl::StrCat("ZeRO stage 0 target ", options_.target.ToString(),
                                                     ": ucp writes ZeRO stage 0 checkpoints of plain modules (pp=1)"));
    }
    if (info_.pipeline && info_.num_layers > 0) {
      // A bf16 PipelineEngine without ZeRO runs BF16_Optimizer, and DeepSpeed
      // (0.19.5) cannot load what it saves: _load_checkpoint passes the mp_rank
      // file's optimizer dict to BF16_Optimizer._load_legacy_checkpoint, which
      // indexes it by dp rank (KeyError: 0).
      return absl::InvalidArgumentError(absl::StrCat(
          "ZeRO stage 0 target: the source is a PipelineModule (layer files); ucp writes stage 0 for plain modules",
          info_.lp_dtype == torch::DType::kBFloat16
              ? " (a bf16 pipeline without ZeRO runs BF16_Optimizer, whose stage 0 checkpoint DeepSpeed 0.19.5 cannot "
                "load back: KeyError 0 in BF16_Optimizer._load_legacy_checkpoint; target --zero_stage=1)"
              : "; target --zero_stage=1"));
    }
    if (info_.expert_parallel > 0) {
      return absl::InvalidArgumentError("ZeRO stage 0 target: a mixture-of-experts source is not supported");
    }
    UCP_ASSIGN_OR_RETURN(ds_, deepspeed::FacetOrDefaults(state_, options_.target_ds_version, &owned_facet_));
    UCP_ASSIGN_OR_RETURN(common_, ds_->OptimizerCommon());
    {
      auto v = deepspeed::ParseDsVersion(deepspeed::TargetDsVersion(state_, options_.target_ds_version));
      parallel_dims_ = v.ok() && *v >= deepspeed::DsVersion{0, 19, 5};
    }
    const Value* groups = common_.value ? common_.value->DictGet("param_groups") : nullptr;
    if (groups == nullptr || !groups->is(Kind::kList) || static_cast<int>(groups->size()) != info_.num_groups) {
      return absl::FailedPreconditionError(absl::StrCat("ZeRO stage 0 target: the source's optimizer state has ",
                                                        groups == nullptr ? 0 : groups->size(), " param_groups, its model ",
                                                        info_.num_groups));
    }
    tp_ = options_.target.tp;
    if (tp_ > 1) {
      // Each tp rank's slice shapes (vocabulary padding included) as the
      // ZeRO writer cuts them: a stage 0 file holds the same slices.
      writers::ZeroWriteOptions o = options_;
      o.zero_stage = 1;
      UCP_ASSIGN_OR_RETURN(layout_, deepspeed_zero::PlanTarget(info_, o, ds_version_of_source()));
    }
    // The padded vocabulary rows are compared at tp > 1 only (layout_ plans them).
    args_changes_ = deepspeed::TargetArgsChanges(state_, options_.target, tp_ > 1 ? &layout_.padded_rows : nullptr);
    for (int t = 0; t < tp_; ++t) {
      writers::Unit u;
      u.outputs.push_back(deepspeed::MpRankFileName(t));
      u.name = absl::StrCat("file ", u.outputs[0]);
      for (const ParamState& p : info_.params) {
        for (const auto& in : state_.Inputs(p)) u.inputs.push_back(in);
        int64_t n = 1;
        for (int64_t d : p.full_shape) n *= d;
        u.bytes += n * 4 * (2 + static_cast<int64_t>(info_.state_keys.size())) / tp_;
      }
      units_.push_back(std::move(u));
    }
    if (writers::AddVerifyUnit(state_, &units_)) has_verify_ = true;
    return absl::OkStatus();
  }

  absl::Status Prepare(const std::string& staging) const override { return absl::OkStatus(); }

  absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const override {
    if (static_cast<int>(i) >= tp_) return writers::ExecuteVerifyUnit(state_, units_[i]);
    torch::TorchWriteOptions wo;
    wo.record_threads = 1;
    wo.writeback = options_.fsync;
    torch::TorchWriter w(wo);
    UCP_ASSIGN_OR_RETURN(ValuePtr root, Root(w, static_cast<int>(i)));
    return writers::WriteUnitFile(w, staging, units_[i].outputs[0], *root, result);
  }

  absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results, const std::string& staging) const override {
    WriteStats stats;
    writers::AddUnitResults(results, &stats);
    return stats;
  }

  std::string latest_file() const override { return deepspeed::kLatestFile; }
  const state::CheckpointState* source() const override { return &state_; }

 private:
  std::string ds_version_of_source() const {
    const Value* v = ds_->ModelStatesRoot(0, 0).value ? ds_->ModelStatesRoot(0, 0).value->DictGet("ds_version") : nullptr;
    return v != nullptr && v->is(Kind::kStr) ? v->str() : "";
  }

  // Param `i`'s `state` on tp rank `t`: the full tensor at tp 1, else the
  // rank's slice.
  absl::StatusOr<TensorPlan> Get(int i, const std::string& state, int t) const {
    if (tp_ == 1) return state_.Full(info_.params[i], state);
    return deepspeed_zero::TargetSlice(state_, layout_, i, state, t);
  }

  absl::StatusOr<ValuePtr> CopyCommon(torch::TorchWriter& w, const ValuePtr& v) const {
    return deepspeed::CopyTreeForWrite(state::FileValue{v, common_.file}, w);
  }

  // The module's state dict: module order, every tensor once (a tied name
  // shares its alias's tensor), trainable weights as their masters cast to
  // the lp dtype (what DeepSpeed's optimizers copy into them).
  absl::StatusOr<ValuePtr> Module(torch::TorchWriter& w, int t) const {
    ValuePtr sd = Value::MakeDict(/*ordered_dict=*/true);
    const std::vector<int> order = info_.ModuleOrderIndices();
    std::map<std::string, ValuePtr> added;
    for (int i : order) {
      const ParamState& p = info_.params[i];
      ValuePtr v;
      if (p.role == state::TensorRole::kTied && added.count(p.alias_of)) {
        v = added[p.alias_of];
      } else if (p.trainable()) {
        UCP_ASSIGN_OR_RETURN(TensorPlan fp32, Get(i, state::kFp32State, t));
        UCP_ASSIGN_OR_RETURN(v, tp::AddPlanAs(w, fp32, p.lp_dtype));
      } else {
        UCP_ASSIGN_OR_RETURN(TensorPlan lp, Get(i, state::kLpState, t));
        v = tp::AddPlan(w, lp);
      }
      added[p.name] = v;
      sd->DictSet(Value::Str(p.name), v);
    }
    state::FileValue src = ds_->ModelStatesRoot(0, t);
    const Value* module = src.value ? src.value->DictGet("module") : nullptr;
    if (module != nullptr && module->is(Kind::kDict) && module->dict_state()) {
      UCP_ASSIGN_OR_RETURN(ValuePtr metadata,
                           deepspeed::CopyTreeForWrite(state::FileValue{module->dict_state(), src.file}, w));
      sd->set_dict_state(std::move(metadata));
    }
    return sd;
  }

  // The torch optimizer's state_dict over the trainable params, numbered
  // group by group.
  absl::StatusOr<ValuePtr> TorchOptimizer(torch::TorchWriter& w, ValuePtr* fp32_groups, int t) const {
    ValuePtr st = Value::MakeDict();
    std::vector<ValuePtr> groups, masters;
    const Value& src_groups = *common_.value->DictGet("param_groups");
    int64_t index = 0;
    for (int g = 0; g < info_.num_groups; ++g) {
      std::vector<ValuePtr> params, group_masters;
      for (size_t i = 0; i < info_.params.size(); ++i) {
        const ParamState& p = info_.params[i];
        if (!p.trainable() || p.group != g) continue;
        ValuePtr s = Value::MakeDict();
        for (const std::string& key : info_.scalar_keys) {
          UCP_ASSIGN_OR_RETURN(state::FileValue sv, state_.GroupScalar(g, key));
          if (!sv.value) continue;
          UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(sv, w));
          s->DictSet(Value::Str(key), c);
        }
        for (const std::string& key : info_.state_keys) {
          UCP_ASSIGN_OR_RETURN(TensorPlan plan, Get(static_cast<int>(i), key, t));
          s->DictSet(Value::Str(key), tp::AddPlan(w, plan));
        }
        st->DictSet(Value::Int(index), s);
        params.push_back(Value::Int(index));
        if (fp32_groups != nullptr) {
          UCP_ASSIGN_OR_RETURN(TensorPlan fp32, Get(static_cast<int>(i), state::kFp32State, t));
          group_masters.push_back(tp::AddPlan(w, fp32));
        }
        ++index;
      }
      const Value& sg = *src_groups.items()[g];
      if (!sg.is(Kind::kDict)) return absl::FailedPreconditionError(absl::StrCat("param_groups[", g, "] is not a dict"));
      ValuePtr group = Value::MakeDict();
      for (const auto& [k, v] : sg.dict_items()) {
        if (k->is(Kind::kStr) && k->str() == "params") {
          group->DictSet(k, Value::List(params));
        } else {
          UCP_ASSIGN_OR_RETURN(ValuePtr c, CopyCommon(w, v));
          group->DictSet(k, c);
        }
      }
      if (group->DictGet("params") == nullptr) group->DictSet(Value::Str("params"), Value::List(params));
      groups.push_back(group);
      masters.push_back(Value::List(std::move(group_masters)));
    }
    ValuePtr osd = Value::MakeDict();
    osd->DictSet(Value::Str("state"), st);
    osd->DictSet(Value::Str("param_groups"), Value::List(std::move(groups)));
    if (fp32_groups != nullptr) *fp32_groups = Value::List(std::move(masters));
    return osd;
  }

  // FP16_UnfusedOptimizer.state_dict around the torch optimizer's.
  absl::StatusOr<ValuePtr> Optimizer(torch::TorchWriter& w, int64_t global_steps, int t) const {
    if (info_.lp_dtype == torch::DType::kFloat32) return TorchOptimizer(w, nullptr, t);
    ValuePtr fp32_groups;
    UCP_ASSIGN_OR_RETURN(ValuePtr inner, TorchOptimizer(w, &fp32_groups, t));
    double scale = 1.0;
    bool dynamic = false;
    const Value* scaler_state = nullptr;
    if (const Value* ls = common_.value->DictGet("loss_scaler")) {
      auto info = pickle::AsLossScaler(*ls);
      if (info.ok()) {
        scale = info->cur_scale;
        dynamic = info->dynamic;
        scaler_state = info->state;
      }
    }
    ValuePtr out = Value::MakeDict();
    out->DictSet(Value::Str("dynamic_loss_scale"), Value::Bool(dynamic));
    out->DictSet(Value::Str("cur_scale"), Value::Float(scale));
    out->DictSet(Value::Str("cur_iter"), Value::Int(global_steps));
    if (dynamic && scaler_state != nullptr) {
      for (const char* key : {"last_overflow_iter", "scale_factor", "scale_window"}) {
        if (scaler_state->DictGet(key) != nullptr) {
          UCP_ASSIGN_OR_RETURN(ValuePtr c, CopyCommon(w, scaler_state->DictGetPtr(key)));
          out->DictSet(Value::Str(key), c);
        }
      }
    }
    out->DictSet(Value::Str("optimizer_state_dict"), inner);
    out->DictSet(Value::Str("fp32_groups"), fp32_groups);
    return out;
  }

  absl::StatusOr<ValuePtr> Root(torch::TorchWriter& w, int t) const {
    state::FileValue src = ds_->ModelStatesRoot(0, t);
    if (!src.value || !src.value->is(Kind::kDict)) {
      return absl::FailedPreconditionError("the source has no model states to carry over");
    }
    int64_t global_steps = 0;
    if (const Value* v = src.value->DictGet("global_steps"); v != nullptr && v->is(Kind::kInt)) {
      global_steps = v->int_value();
    }
    ValuePtr out = Value::MakeDict();
    auto put = [&](const char* key, ValuePtr v) { out->DictSet(Value::Str(key), std::move(v)); };
    for (const auto& [k, v] : src.value->dict_items()) {
      const std::string key = k->is(Kind::kStr) ? k->str() : "";
      if (key == "module") {
        UCP_ASSIGN_OR_RETURN(ValuePtr m, Module(w, t));
        out->DictSet(k, m);
      } else if (key == "optimizer") {
        UCP_ASSIGN_OR_RETURN(ValuePtr o, Optimizer(w, global_steps, t));
        out->DictSet(k, o);
      } else if (key == "param_shapes" || key == "frozen_param_shapes" || key == "shared_params" ||
                 key == "frozen_param_fragments") {
        out->DictSet(k, Value::None());  // engine.py writes them for ZeRO only
      } else if (key == "buffer_names") {
        std::vector<ValuePtr> names;
        for (const ParamState& p : info_.params) {
          if (p.role == state::TensorRole::kBuffer) names.push_back(Value::Str(p.name));
        }
        out->DictSet(k, Value::List(std::move(names)));
      } else if (key == "dp_world_size") {
        out->DictSet(k, Value::Int(options_.target.dp));
      } else if (key == "mp_world_size") {
        out->DictSet(k, Value::Int(tp_));
        if (parallel_dims_ && src.value->DictGet("checkpoint_parallel_dimensions") == nullptr) {
          put("checkpoint_parallel_dimensions", ParallelDimensions());
        }
      } else if (key == "checkpoint_parallel_dimensions") {
        if (parallel_dims_) out->DictSet(k, ParallelDimensions());
      } else if (key == "ds_config") {
        UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::RetargetDsConfig(state::FileValue{v, src.file}, w, /*stage=*/0, /*sub_group_size=*/0,
                                                                           /*tp=*/1));
        out->DictSet(k, c);
      } else if (key == "ds_version" && !options_.target_ds_version.empty()) {
        out->DictSet(k, Value::Str(options_.target_ds_version));
      } else {
        UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(state::FileValue{v, src.file}, w));
        if (key == "args") UCP_RETURN_IF_ERROR(deepspeed::ApplyArgsChanges(*c, args_changes_));
        out->DictSet(k, c);
      }
    }
    if (out->DictGet("optimizer") == nullptr) {
      UCP_ASSIGN_OR_RETURN(ValuePtr o, Optimizer(w, global_steps, t));
      put("optimizer", o);
    }
    return out;
  }

  // engine.py:_checkpoint_parallel_metadata (0.19.5): the saving job's degrees.
  ValuePtr ParallelDimensions() const {
    if (tp_ == 1) return deepspeed::SingleRankParallelDimensions();
    ValuePtr dims = Value::MakeDict();
    dims->DictSet(Value::Str("pp_degree"), Value::Int(1));
    dims->DictSet(Value::Str("tp_degree"), Value::Int(tp_));
    return dims;
  }

  const state::ModelState& state_;
  const state::ModelInfo& info_;
  writers::ZeroWriteOptions options_;
  int tp_ = 1;
  std::vector<deepspeed::ArgsChange> args_changes_;  // the client state 'args' at the target
  deepspeed_zero::TargetLayout layout_;  // tp > 1: the tp slices
  std::unique_ptr<deepspeed::DeepSpeedFacet> owned_facet_;
  const deepspeed::DeepSpeedFacet* ds_ = nullptr;
  state::FileValue common_;
  bool parallel_dims_ = false;
  bool has_verify_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<writers::Plan>> PlanZero0(const state::ModelState& state,
                                                         const writers::ZeroWriteOptions& options,
                                                         writers::TargetSummary* summary) {
  auto plan = std::make_unique<Zero0Plan>(state, options);
  UCP_RETURN_IF_ERROR(plan->Build());
  if (summary != nullptr) {
    summary->topo = options.target;
    summary->zero_stage = 0;
    const std::string note = plan->ArgsNote();
    if (!note.empty()) summary->notes.push_back(note);
  }
  return plan;
}

}  // namespace ucp::deepspeed_zero0
