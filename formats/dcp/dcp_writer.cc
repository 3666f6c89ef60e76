#include "formats/dcp/dcp_writer.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/engine_defaults.h"
#include "deepspeed/facet.h"
#include "deepspeed/tree_copy.h"
#include "deepspeed/value_util.h"
#include "format/pickle/writer.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"
#include "tp/plan_io.h"

namespace ucp::dcp {
namespace {

using pickle::Value;
using pickle::ValuePtr;
using state::ParamState;
using writers::Unit;
using writers::UnitResult;
using writers::WriteStats;

constexpr char kModelDir[] = "model";
constexpr char kOptimDir[] = "optim";
constexpr char kCheckpointModule[] = "torch.distributed.checkpoint.metadata";

// One DCP entry: a key of the flattened state dict, the file holding it
// (one torch.save archive) and, for tensors, dtype and global size.
struct Entry {
  std::string key;                      // "model.fc1.weight", "optim.param_groups.0.lr"
  std::vector<ValuePtr> planner_path;   // planner_data: the key's nesting
  std::string file;                     // relative to the output folder
  bool tensor = false;
  torch::DType dtype = torch::DType::kFloat32;
  std::vector<int64_t> size;
};

// Names that would escape the output folder or cannot be file names.
absl::Status CheckName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos || name.size() > 200) {
    return absl::InvalidArgumentError(absl::StrCat("param name '", name, "' cannot be a file name in a DCP folder"));
  }
  return absl::OkStatus();
}

ValuePtr Global(const char* module, const std::string& name) { return Value::Global(module, name); }

// cls.__new__(cls) then BUILD(state): how pickle stores a dataclass.
ValuePtr NewObject(const ValuePtr& cls, ValuePtr state) {
  pickle::Object o;
  o.callable = cls;
  o.how = pickle::ObjectHow::kNewObj;
  o.args = Value::Tuple({});
  o.state = std::move(state);
  return Value::MakeObject(std::move(o));
}

ValuePtr Call(const ValuePtr& callable, std::vector<ValuePtr> args) {
  pickle::Object o;
  o.callable = callable;
  o.how = pickle::ObjectHow::kReduce;
  o.args = Value::Tuple(std::move(args));
  return Value::MakeObject(std::move(o));
}

ValuePtr IntTuple(const std::vector<int64_t>& v) {
  std::vector<ValuePtr> items;
  for (int64_t x : v) items.push_back(Value::Int(x));
  return Value::Tuple(std::move(items));
}

ValuePtr StrDict(std::vector<std::pair<const char*, ValuePtr>> items) {
  ValuePtr d = Value::MakeDict();
  for (auto& [k, v] : items) d->DictSet(Value::Str(k), std::move(v));
  return d;
}

// The `.metadata` pickle of `entries` whose files have the sizes `sizes`.
absl::StatusOr<std::string> MetadataPickle(const std::vector<Entry>& entries,
                                           const std::map<std::string, int64_t>& sizes) {
  const ValuePtr tensor_md = Global(kCheckpointModule, "TensorStorageMetadata");
  const ValuePtr bytes_md = Global(kCheckpointModule, "BytesStorageMetadata");
  const ValuePtr properties = Global(kCheckpointModule, "TensorProperties");
  const ValuePtr chunk_md = Global(kCheckpointModule, "ChunkStorageMetadata");
  const ValuePtr index_cls = Global(kCheckpointModule, "MetadataIndex");
  const ValuePtr storage_info = Global("torch.distributed.checkpoint.filesystem", "_StorageInfo");
  const ValuePtr get_layout = Global("torch.serialization", "_get_layout");
  const ValuePtr mem_format = Global(kCheckpointModule, "_MEM_FORMAT_ENCODING");
  ValuePtr state_dict_md = Value::MakeDict();
  ValuePtr planner_data = Value::MakeDict();
  ValuePtr storage_data = Value::MakeDict();
  for (const Entry& e : entries) {
    auto size = sizes.find(e.file);
    if (size == sizes.end()) return absl::InternalError(absl::StrCat("no unit wrote ", e.file));
    ValuePtr index_state = StrDict({{"fqn", Value::Str(e.key)}, {"index", e.tensor ? Value::Int(0) : Value::None()}});
    if (e.tensor) {
      const std::vector<int64_t> zeros(e.size.size(), 0);
      index_state->DictSet(Value::Str("offset"), IntTuple(zeros));
      ValuePtr props = NewObject(
          properties, Value::Tuple({Global("torch", std::string(torch::DTypeName(e.dtype))),
                                    Call(get_layout, {Value::Str("torch.strided")}), Value::Bool(false),
                                    Call(mem_format, {Value::Int(0)}), Value::Bool(false)}));
      ValuePtr chunk = NewObject(chunk_md, StrDict({{"offsets", IntTuple(zeros)}, {"sizes", IntTuple(e.size)}}));
      state_dict_md->DictSet(Value::Str(e.key),
                             NewObject(tensor_md, StrDict({{"properties", props},
                                                           {"size", IntTuple(e.size)},
                                                           {"chunks", Value::List({chunk})}})));
    } else {
      pickle::Object o;
      o.callable = bytes_md;
      o.how = pickle::ObjectHow::kNewObj;
      o.args = Value::Tuple({});
      state_dict_md->DictSet(Value::Str(e.key), Value::MakeObject(std::move(o)));  // an empty dataclass: no BUILD
    }
    planner_data->DictSet(Value::Str(e.key), Value::Tuple(e.planner_path));
    storage_data->DictSet(NewObject(index_cls, index_state),
                          NewObject(storage_info, StrDict({{"relative_path", Value::Str(e.file)},
                                                           {"offset", Value::Int(0)},
                                                           {"length", Value::Int(size->second)}})));
  }
  ValuePtr root = NewObject(Global(kCheckpointModule, "Metadata"),
                            StrDict({{"state_dict_metadata", state_dict_md},
                                     {"planner_data", planner_data},
                                     {"storage_data", storage_data},
                                     {"storage_meta", Value::None()},
                                     {"version", Value::Str("1.0.0")}}));
  return pickle::Pickle(*root);
}

// A per-group scalar (Adam's step: a 0-d tensor or a number) as the 0-d
// float32 tensor torch's Adam keeps per param.
absl::StatusOr<torch::Tensor> StepTensor(const state::FileValue& step, const std::string& param) {
  double value = 0;
  if (torch::TorchFile::IsTensor(*step.value)) {
    if (step.file == nullptr) return absl::InternalError(absl::StrCat("param '", param, "': step tensor without its file"));
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, step.file->GetTensor(*step.value));
    if (t.numel() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("param '", param, "': optimizer step has ", t.numel(), " elements, expected 1"));
    }
    if (t.dtype() == torch::DType::kFloat32) return t.Contiguous();
    const std::string bytes = t.ContiguousBytes();
    switch (t.dtype()) {
      case torch::DType::kFloat64: { double d; std::memcpy(&d, bytes.data(), 8); value = d; break; }
      case torch::DType::kInt64: { int64_t i; std::memcpy(&i, bytes.data(), 8); value = static_cast<double>(i); break; }
      case torch::DType::kInt32: { int32_t i; std::memcpy(&i, bytes.data(), 4); value = i; break; }
      default:
        return absl::InvalidArgumentError(absl::StrCat("param '", param, "': optimizer step is a ",
                                                       std::string(torch::DTypeName(t.dtype())), " tensor, expected a number"));
    }
  } else {
    UCP_ASSIGN_OR_RETURN(value, pickle::AsFloat(*step.value, "step"), _.Prepend(absl::StrCat("param '", param, "': ")));
  }
  const float f = static_cast<float>(value);
  if (static_cast<double>(f) != value) {
    return absl::InvalidArgumentError(
        absl::StrCat("param '", param, "': optimizer step ", value, " is not exact in float32 (torch's Adam step)"));
  }
  std::string bytes(4, '\0');
  std::memcpy(bytes.data(), &f, 4);
  return torch::Tensor::FromBytes(torch::DType::kFloat32, {}, std::move(bytes));
}

class DcpPlan : public writers::Plan {
 public:
  DcpPlan(const state::ModelState& state, const writers::UniversalWriteOptions& options)
      : state_(state), info_(state.info()), options_(options) {}

  absl::Status Build() {
    UCP_ASSIGN_OR_RETURN(ds_, deepspeed::FacetOrDefaults(state_, options_.target_ds_version, &owned_facet_));
    UCP_RETURN_IF_ERROR(PlanParams());
    UCP_RETURN_IF_ERROR(PlanParamGroups());
    if (writers::AddVerifyUnit(state_, &units_)) {
      unit_params_.push_back(-1);
      unit_entries_.emplace_back();
    }
    return absl::OkStatus();
  }

  absl::Status Prepare(const std::string& staging) const override {
    UCP_RETURN_IF_ERROR(MakeDirs(JoinPath(staging, kModelDir)));
    return MakeDirs(JoinPath(staging, kOptimDir));
  }

  absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const override {
    if (i == groups_unit_) return WriteParamGroups(staging, result);
    if (unit_params_[i] < 0) return writers::ExecuteVerifyUnit(state_, units_[i]);
    return WriteParam(outputs_[static_cast<size_t>(unit_params_[i])], unit_entries_[i], staging, result);
  }

  absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results, const std::string& staging) const override {
    std::map<std::string, int64_t> sizes;
    for (const UnitResult& r : results) {
      for (const FileDigest& f : r.files) sizes[f.path()] = f.size();
    }
    UCP_ASSIGN_OR_RETURN(std::string metadata, MetadataPickle(entries_, sizes));
    UCP_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging, kMetadataFile), metadata));
    WriteStats stats;
    writers::AddUnitResults(results, &stats);
    stats.files += 1;
    stats.bytes += static_cast<int64_t>(metadata.size());
    stats.params = static_cast<int64_t>(outputs_.size());
    return stats;
  }

  std::string latest_file() const override { return ""; }
  const state::CheckpointState* source() const override { return &state_; }

 private:
  // The entries' tensors: the checkpoint's params under their own names
  // (length 0: every row), or options_.renamed (each rows of one param).
  using Output = writers::UniversalWriteOptions::RenamedTensor;
  absl::Status PlanOutputs() {
    if (options_.renamed.empty()) {
      for (size_t i = 0; i < info_.params.size(); ++i) {
        outputs_.push_back({info_.params[i].name, static_cast<int>(i), 1, 0, 0, info_.params[i].full_shape});
      }
      return absl::OkStatus();
    }
    std::set<std::string> seen;
    for (const auto& r : options_.renamed) {
      if (r.param < 0 || static_cast<size_t>(r.param) >= info_.params.size()) {
        return absl::InternalError(absl::StrCat("tensor '", r.name, "' names no param"));
      }
      if (!seen.insert(r.name).second) return absl::InternalError(absl::StrCat("tensor '", r.name, "' twice"));
      outputs_.push_back(r);
    }
    return absl::OkStatus();
  }

  // One unit per tensor of the model: its model entry and, when trained,
  // its optimizer states and step.
  absl::Status PlanParams() {
    UCP_RETURN_IF_ERROR(PlanOutputs());
    for (size_t o = 0; o < outputs_.size(); ++o) {
      const Output& out = outputs_[o];
      const ParamState& p = info_.params[static_cast<size_t>(out.param)];
      UCP_RETURN_IF_ERROR(CheckName(out.name));
      Unit u;
      u.name = absl::StrCat("param ", out.name);
      std::vector<size_t> mine;
      auto add = [&](std::string key, std::vector<ValuePtr> path, std::string file, torch::DType dtype,
                     std::vector<int64_t> size) {
        Entry e{std::move(key), std::move(path), std::move(file), true, dtype, std::move(size)};
        u.outputs.push_back(e.file);
        u.bytes += torch::ItemSize(e.dtype) * deepspeed::internal::Numel(e.size);
        mine.push_back(entries_.size());
        entries_.push_back(std::move(e));
      };
      const torch::DType model_dtype =
          p.trainable() || p.role == state::TensorRole::kTied ? torch::DType::kFloat32 : p.lp_dtype;
      add(absl::StrCat("model.", out.name), {Value::Str("model"), Value::Str(out.name)},
          JoinPath(kModelDir, out.name + ".distcp"), model_dtype, out.shape);
      if (p.trainable()) {
        for (const std::string& s : info_.state_keys) {
          add(absl::StrCat("optim.state.", out.name, ".", s),
              {Value::Str("optim"), Value::Str("state"), Value::Str(out.name), Value::Str(s)},
              JoinPath(kOptimDir, absl::StrCat(out.name, ".", s, ".distcp")), torch::DType::kFloat32, out.shape);
        }
        if (HasStep()) {
          add(absl::StrCat("optim.state.", out.name, ".step"),
              {Value::Str("optim"), Value::Str("state"), Value::Str(out.name), Value::Str("step")},
              JoinPath(kOptimDir, absl::StrCat(out.name, ".step.distcp")), torch::DType::kFloat32, {});
        }
      }
      for (const auto& r : state_.Inputs(p)) u.inputs.push_back(r);
      units_.push_back(std::move(u));
      unit_params_.push_back(static_cast<int>(o));
      unit_entries_.push_back(std::move(mine));
    }
    return absl::OkStatus();
  }

  // One unit for every param group's hyper-parameters and param names.
  absl::Status PlanParamGroups() {
    UCP_ASSIGN_OR_RETURN(state::FileValue common, ds_->OptimizerCommon());
    const Value* groups = common.value != nullptr && common.value->is(pickle::Kind::kDict)
                              ? common.value->DictGet("param_groups")
                              : nullptr;
    if (groups == nullptr || !groups->is(pickle::Kind::kList) ||
        static_cast<int>(groups->items().size()) != info_.num_groups) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the source's optimizer state has ", groups != nullptr && groups->is(pickle::Kind::kList) ? groups->items().size() : 0,
          " param_groups, expected ", info_.num_groups, ": cannot write the DCP optimizer entries"));
    }
    common_ = common;
    Unit u;
    u.name = "param groups";
    u.bytes = 4096;
    for (int g = 0; g < info_.num_groups; ++g) {
      const Value& group = *groups->items()[g];
      if (!group.is(pickle::Kind::kDict)) {
        return absl::FailedPreconditionError(absl::StrCat("param_groups[", g, "] of the source is not a dict"));
      }
      for (const auto& [k, v] : group.dict_items()) {
        if (!k->is(pickle::Kind::kStr) || k->str() == "params") continue;
        group_values_.push_back(v);
        AddGroupEntry(g, k->str(), &u);
      }
      std::vector<ValuePtr> names;
      for (const Output& out : outputs_) {
        const ParamState& p = info_.params[static_cast<size_t>(out.param)];
        if (p.trainable() && p.group == g) names.push_back(Value::Str(out.name));
      }
      group_values_.push_back(Value::List(std::move(names)));
      AddGroupEntry(g, "params", &u);
    }
    groups_unit_ = units_.size();
    units_.push_back(std::move(u));
    unit_params_.push_back(-2);
    unit_entries_.emplace_back();
    return absl::OkStatus();
  }

  void AddGroupEntry(int g, const std::string& hp, Unit* u) {
    Entry e;
    e.key = absl::StrCat("optim.param_groups.", g, ".", hp);
    e.planner_path = {Value::Str("optim"), Value::Str("param_groups"), Value::Int(g), Value::Str(hp)};
    e.file = JoinPath(kOptimDir, absl::StrCat("param_groups.", g, ".", hp, ".distcp"));
    u->outputs.push_back(e.file);
    group_entries_.push_back(entries_.size());
    entries_.push_back(std::move(e));
  }

  bool HasStep() const {
    for (const std::string& k : info_.scalar_keys) {
      if (k == "step") return true;
    }
    return false;
  }

  torch::TorchWriteOptions WriteOptions() const {
    torch::TorchWriteOptions o;
    o.writeback = options_.fsync;
    return o;
  }

  absl::Status WriteOne(const std::string& staging, const Entry& e, torch::TorchWriter& w, const Value& root,
                        UnitResult* result) const {
    return writers::WriteUnitFile(w, staging, e.file, root, result);
  }

  // The tensor a model entry holds: the fp32 master of a trained param (of
  // the param it aliases, for a tied name), else the module's tensor.
  absl::StatusOr<tp::TensorPlan> ModelTensor(const ParamState& p) const {
    if (p.trainable()) return state_.Full(p, state::kFp32State);
    if (p.role == state::TensorRole::kTied) {
      const ParamState* of = info_.Find(p.alias_of);
      if (of == nullptr) return absl::InternalError(absl::StrCat("tied name '", p.name, "' aliases no param"));
      return state_.Full(*of, state::kFp32State);
    }
    return state_.Full(p, state::kLpState);
  }

  // Rows `out` takes of a full tensor of its param.
  static absl::StatusOr<tp::TensorPlan> Rows(const Output& out, const tp::TensorPlan& full) {
    if (out.length == 0) return full;
    return tp::GroupRows(full, out.groups, out.start, out.length);
  }

  absl::Status WriteParam(const Output& out, const std::vector<size_t>& mine, const std::string& staging,
                          UnitResult* result) const {
    const ParamState& p = info_.params[static_cast<size_t>(out.param)];
    size_t k = 0;
    {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan full, ModelTensor(p));
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, Rows(out, full));
      UCP_RETURN_IF_ERROR(CheckPlan(out.name, "model", plan, entries_[mine[k]]));
      torch::TorchWriter w(WriteOptions());
      ValuePtr t = tp::AddPlan(w, plan);
      UCP_RETURN_IF_ERROR(WriteOne(staging, entries_[mine[k++]], w, *t, result));
    }
    if (!p.trainable()) return absl::OkStatus();
    for (const std::string& s : info_.state_keys) {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan full, state_.Full(p, s));
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, Rows(out, full));
      UCP_RETURN_IF_ERROR(CheckPlan(out.name, s, plan, entries_[mine[k]]));
      torch::TorchWriter w(WriteOptions());
      ValuePtr t = tp::AddPlan(w, plan);
      UCP_RETURN_IF_ERROR(WriteOne(staging, entries_[mine[k++]], w, *t, result));
    }
    if (HasStep()) {
      UCP_ASSIGN_OR_RETURN(state::FileValue step, state_.GroupScalar(p.group, "step"));
      if (step.value == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat("param '", p.name, "': group ", p.group, " has no step"));
      }
      UCP_ASSIGN_OR_RETURN(torch::Tensor t, StepTensor(step, p.name));
      torch::TorchWriter w(WriteOptions());
      ValuePtr v = w.AddTensor(t);
      UCP_RETURN_IF_ERROR(WriteOne(staging, entries_[mine[k++]], w, *v, result));
    }
    return absl::OkStatus();
  }

  static absl::Status CheckPlan(const std::string& name, const std::string& what, const tp::TensorPlan& plan,
                                const Entry& e) {
    if (plan.shape() != e.size || plan.dtype() != e.dtype) {
      return absl::InternalError(absl::StrCat("tensor '", name, "' ", what, ": ", std::string(torch::DTypeName(plan.dtype())),
                                              torch::ShapeString(plan.shape()), ", planned ", std::string(torch::DTypeName(e.dtype)),
                                              torch::ShapeString(e.size)));
    }
    return absl::OkStatus();
  }

  absl::Status WriteParamGroups(const std::string& staging, UnitResult* result) const {
    for (size_t j = 0; j < group_entries_.size(); ++j) {
      torch::TorchWriter w(WriteOptions());
      UCP_ASSIGN_OR_RETURN(ValuePtr v, deepspeed::CopyTreeForWrite(state::FileValue{group_values_[j], common_.file}, w));
      UCP_RETURN_IF_ERROR(WriteOne(staging, entries_[group_entries_[j]], w, *v, result));
    }
    return absl::OkStatus();
  }

  const state::ModelState& state_;
  const state::ModelInfo& info_;
  writers::UniversalWriteOptions options_;
  std::unique_ptr<deepspeed::DeepSpeedFacet> owned_facet_;
  const deepspeed::DeepSpeedFacet* ds_ = nullptr;
  state::FileValue common_;
  std::vector<Entry> entries_;
  std::vector<Output> outputs_;
  std::vector<int> unit_params_;                 // output index; -1 verify unit; -2 param groups
  std::vector<std::vector<size_t>> unit_entries_;  // entries each param unit writes, in order
  size_t groups_unit_ = static_cast<size_t>(-1);
  std::vector<size_t> group_entries_;  // entries of the param-groups unit
  std::vector<ValuePtr> group_values_;  // their values, in the same order
};

}  // namespace

absl::StatusOr<std::unique_ptr<writers::Plan>> PlanDcp(const state::ModelState& state,
                                                      const writers::UniversalWriteOptions& options) {
  auto plan = std::make_unique<DcpPlan>(state, options);
  UCP_RETURN_IF_ERROR(plan->Build());
  return plan;
}

}  // namespace ucp::dcp
