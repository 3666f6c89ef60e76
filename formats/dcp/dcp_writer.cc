#include "formats/dcp/dcp_writer.h"

#include <cstring>
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

constexpr char kCheckpointModule[] = "torch.distributed.checkpoint.metadata";

// The record stem of each item: torch.save names an archive written to a
// stream "archive", as every item of a FileSystemWriter file is.
constexpr char kItemStem[] = "archive";

// The file of unit `unit`: FileSystemWriter's name for file `unit` of rank 0
// (`__{rank}_{file}.distcp`; it writes one file per rank and thread, ucp one
// per unit, each holding that unit's entries back to back).
std::string UnitFile(size_t unit) { return absl::StrCat("__0_", unit, ".distcp"); }

// One DCP entry: a key of the flattened state dict, the file holding it
// (one torch.save archive among the file's items) and, for tensors, dtype
// and global size.
struct Entry {
  std::string key;                      // "model.fc1.weight", "optim.param_groups.0.lr"
  std::vector<ValuePtr> planner_path;   // planner_data: the key's nesting
  std::string file;                     // relative to the output folder
  bool tensor = false;
  torch::DType dtype = torch::DType::kFloat32;
  std::vector<int64_t> size;
};

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

// Where an entry's archive sits in its file.
struct Place {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The `.metadata` pickle of `entries`, entry i at places[i] of its file.
absl::StatusOr<std::string> MetadataPickle(const std::vector<Entry>& entries, const std::vector<Place>& places) {
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
  if (places.size() != entries.size()) {
    return absl::InternalError(absl::StrCat(entries.size(), " DCP entries, ", places.size(), " written"));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
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
                                                           {"offset", Value::Int(static_cast<int64_t>(places[i].offset))},
                                                           {"length", Value::Int(static_cast<int64_t>(places[i].length))}})));
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

  absl::Status Prepare(const std::string&) const override { return absl::OkStatus(); }

  absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const override {
    if (i == groups_unit_) return WriteParamGroups(staging, result);
    if (unit_params_[i] < 0) return writers::ExecuteVerifyUnit(state_, units_[i]);
    return WriteParam(outputs_[static_cast<size_t>(unit_params_[i])], unit_entries_[i], staging, result);
  }

  absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results, const std::string& staging) const override {
    UCP_ASSIGN_OR_RETURN(std::vector<Place> places, Places(results));
    UCP_ASSIGN_OR_RETURN(std::string metadata, MetadataPickle(entries_, places));
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
  // Where each entry landed: unit i wrote its entries (unit_entries_[i], or
  // group_entries_ for the param groups) as its items, in that order.
  absl::StatusOr<std::vector<Place>> Places(const std::vector<UnitResult>& results) const {
    std::vector<Place> places(entries_.size());
    std::vector<bool> seen(entries_.size(), false);
    for (size_t u = 0; u < results.size() && u < units_.size(); ++u) {
      const std::vector<size_t>& mine = u == groups_unit_ ? group_entries_ : unit_entries_[u];
      if (results[u].items.size() != mine.size()) {
        return absl::InternalError(absl::StrCat("unit '", units_[u].name, "' wrote ", results[u].items.size(),
                                                " DCP items, planned ", mine.size()));
      }
      for (size_t k = 0; k < mine.size(); ++k) {
        const FileItem& item = results[u].items[k];
        if (item.path() != entries_[mine[k]].file) {
          return absl::InternalError(absl::StrCat("DCP entry '", entries_[mine[k]].key, "' went to ", item.path(),
                                                  ", planned ", entries_[mine[k]].file));
        }
        places[mine[k]] = {item.offset(), item.length()};
        seen[mine[k]] = true;
      }
    }
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!seen[i]) return absl::InternalError(absl::StrCat("no unit wrote DCP entry '", entries_[i].key, "'"));
    }
    return places;
  }

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
      Unit u;
      u.name = absl::StrCat("param ", out.name);
      u.outputs.push_back(UnitFile(units_.size()));
      std::vector<size_t> mine;
      auto add = [&](std::string key, std::vector<ValuePtr> path, torch::DType dtype, std::vector<int64_t> size) {
        Entry e{std::move(key), std::move(path), u.outputs[0], true, dtype, std::move(size)};
        u.bytes += torch::ItemSize(e.dtype) * deepspeed::internal::Numel(e.size);
        mine.push_back(entries_.size());
        entries_.push_back(std::move(e));
      };
      const torch::DType model_dtype =
          p.trainable() || p.role == state::TensorRole::kTied ? torch::DType::kFloat32 : p.lp_dtype;
      add(absl::StrCat("model.", out.name), {Value::Str("model"), Value::Str(out.name)}, model_dtype, out.shape);
      if (p.trainable()) {
        for (const std::string& s : info_.state_keys) {
          add(absl::StrCat("optim.state.", out.name, ".", s),
              {Value::Str("optim"), Value::Str("state"), Value::Str(out.name), Value::Str(s)}, torch::DType::kFloat32,
              out.shape);
        }
        if (HasStep()) {
          add(absl::StrCat("optim.state.", out.name, ".step"),
              {Value::Str("optim"), Value::Str("state"), Value::Str(out.name), Value::Str("step")},
              torch::DType::kFloat32, {});
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
    u.outputs.push_back(UnitFile(units_.size()));
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
    if (group_entries_.empty()) u.outputs.clear();  // no group: no file
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
    e.file = u->outputs[0];
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

  // A unit's items, built before its file is written: one torch.save
  // archive (a writer and its root) per entry, in the unit's entry order.
  class Items {
   public:
    explicit Items(torch::TorchWriteOptions options) : options_(options) {}
    torch::TorchWriter& Next() {
      writers_.push_back(std::make_unique<torch::TorchWriter>(options_));
      return *writers_.back();
    }
    void SetRoot(ValuePtr root) { roots_.push_back(std::move(root)); }
    absl::Status Write(const std::string& staging, const std::string& file, UnitResult* result) const {
      std::vector<torch::TorchWriter*> w;
      std::vector<const Value*> r;
      for (const auto& x : writers_) w.push_back(x.get());
      for (const auto& x : roots_) r.push_back(x.get());
      return writers::WriteUnitItems(w, staging, file, kItemStem, r, result);
    }

   private:
    torch::TorchWriteOptions options_;
    std::vector<std::unique_ptr<torch::TorchWriter>> writers_;
    std::vector<ValuePtr> roots_;
  };

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
    Items items(WriteOptions());
    size_t k = 0;
    {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan full, ModelTensor(p));
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, Rows(out, full));
      UCP_RETURN_IF_ERROR(CheckPlan(out.name, "model", plan, entries_[mine[k++]]));
      torch::TorchWriter& w = items.Next();
      items.SetRoot(tp::AddPlan(w, plan));
    }
    if (p.trainable()) UCP_RETURN_IF_ERROR(AddStates(out, p, mine, &k, &items));
    return items.Write(staging, entries_[mine[0]].file, result);
  }

  // The optimizer entries of a trained param: each state, then the step.
  absl::Status AddStates(const Output& out, const ParamState& p, const std::vector<size_t>& mine, size_t* k,
                         Items* items) const {
    for (const std::string& s : info_.state_keys) {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan full, state_.Full(p, s));
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, Rows(out, full));
      UCP_RETURN_IF_ERROR(CheckPlan(out.name, s, plan, entries_[mine[(*k)++]]));
      torch::TorchWriter& w = items->Next();
      items->SetRoot(tp::AddPlan(w, plan));
    }
    if (HasStep()) {
      UCP_ASSIGN_OR_RETURN(state::FileValue step, state_.GroupScalar(p.group, "step"));
      if (step.value == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat("param '", p.name, "': group ", p.group, " has no step"));
      }
      UCP_ASSIGN_OR_RETURN(torch::Tensor t, StepTensor(step, p.name));
      torch::TorchWriter& w = items->Next();
      items->SetRoot(w.AddTensor(t));
      ++*k;
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
    if (group_entries_.empty()) return absl::OkStatus();
    Items items(WriteOptions());
    for (size_t j = 0; j < group_entries_.size(); ++j) {
      torch::TorchWriter& w = items.Next();
      UCP_ASSIGN_OR_RETURN(ValuePtr v, deepspeed::CopyTreeForWrite(state::FileValue{group_values_[j], common_.file}, w));
      items.SetRoot(std::move(v));
    }
    return items.Write(staging, units_[groups_unit_].outputs[0], result);
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
