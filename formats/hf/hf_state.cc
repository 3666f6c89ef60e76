#include "formats/hf/hf_state.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/engine_defaults.h"
#include "format/torch/torch_file.h"
#include "rules/hf_import.h"

namespace ucp::hf {
namespace {

using pickle::Value;
using pickle::ValuePtr;
using tp::TensorPlan;

constexpr int64_t kMaxJsonBytes = int64_t{64} << 20;

std::string Shape(torch::DType dtype, const std::vector<int64_t>& size) {
  return absl::StrCat(std::string(torch::DTypeName(dtype)), "[", absl::StrJoin(size, ", "), "]");
}

absl::StatusOr<json::Value> ReadJsonObject(const std::string& path) {
  UCP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kMaxJsonBytes), _.Prepend(absl::StrCat(path, ": ")));
  UCP_ASSIGN_OR_RETURN(json::Value v, json::Parse(text), _.Prepend(absl::StrCat(path, ": ")));
  if (v.type() != json::Value::Type::kObject) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a JSON object"));
  }
  return v;
}

// A shard file name of the index: a plain name in the folder.
absl::Status CheckShardName(const std::string& index, const std::string& tensor, const std::string& file) {
  if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
      file.find('\\') != std::string::npos || file.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(index, ": weight_map['", tensor, "'] = '", file,
                                                   "': expected a file name in the folder"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfState>> HfState::Open(const std::string& dir, const HfReadOptions& options) {
  std::unique_ptr<HfState> s(new HfState());
  s->dir_ = dir;
  UCP_ASSIGN_OR_RETURN(s->config_, ReadJsonObject(JoinPath(dir, kConfigFile)));
  UCP_RETURN_IF_ERROR(s->OpenFiles());
  UCP_RETURN_IF_ERROR(s->BuildInfo(options.preset));
  UCP_ASSIGN_OR_RETURN(s->step_, deepspeed::FreshAdamStep());
  return s;
}

// transformers' order: model.safetensors when there is one, else the index
// and its shards.
absl::Status HfState::OpenFiles() {
  const std::string single = JoinPath(dir_, kSingleFile);
  if (PathExists(single)) {
    UCP_ASSIGN_OR_RETURN(auto f, safetensors::SafetensorsFile::Open(single), _.Prepend(absl::StrCat(single, ": ")));
    for (const std::string& n : f->header_order()) tensors_.emplace_back(n, f.get());
    files_.push_back(std::move(f));
    return absl::OkStatus();
  }
  const std::string index = JoinPath(dir_, kIndexFile);
  if (!PathExists(index)) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": a Hugging Face folder (", kConfigFile, ") without ",
                                                   kSingleFile, " or ", kIndexFile,
                                                   " (ucp reads the safetensors weights, not pytorch_model.bin)"));
  }
  UCP_ASSIGN_OR_RETURN(json::Value idx, ReadJsonObject(index));
  const json::Value* map = idx.Get("weight_map");
  if (map == nullptr || map->type() != json::Value::Type::kObject || map->members().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(index, ": expected a non-empty object 'weight_map'"));
  }
  std::map<std::string, const safetensors::SafetensorsFile*> by_file;
  std::map<std::string, std::set<std::string>> listed;  // file -> tensors the index puts there
  for (const auto& [tensor, file] : map->members()) {
    if (file.type() != json::Value::Type::kString) {
      return absl::InvalidArgumentError(absl::StrCat(index, ": weight_map['", tensor, "'] is not a file name"));
    }
    const std::string& name = file.string_value();
    UCP_RETURN_IF_ERROR(CheckShardName(index, tensor, name));
    if (!by_file.count(name)) {
      const std::string path = JoinPath(dir_, name);
      if (!PathExists(path)) {
        return absl::NotFoundError(absl::StrCat(index, ": weight_map['", tensor, "'] names ", name,
                                                ", which is not in the folder"));
      }
      UCP_ASSIGN_OR_RETURN(auto f, safetensors::SafetensorsFile::Open(path), _.Prepend(absl::StrCat(path, ": ")));
      by_file[name] = f.get();
      files_.push_back(std::move(f));
    }
    listed[name].insert(tensor);
    const safetensors::SafetensorsFile* f = by_file[name];
    if (!f->header_order().empty() && std::find(f->header_order().begin(), f->header_order().end(), tensor) ==
                                          f->header_order().end()) {
      return absl::InvalidArgumentError(absl::StrCat(index, ": weight_map puts '", tensor, "' in ", f->path(),
                                                     ", which has no such tensor"));
    }
    tensors_.emplace_back(tensor, f);
  }
  for (const auto& f : files_) {
    const std::string base = f->path().substr(f->path().find_last_of('/') + 1);
    for (const std::string& n : f->header_order()) {
      if (!listed[base].count(n)) {
        return absl::InvalidArgumentError(absl::StrCat(f->path(), ": tensor '", n, "' is not in ", index,
                                                       "'s weight_map for this file"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status HfState::BuildInfo(const std::string& preset) {
  std::vector<rules::HfImportInput> inputs;
  std::set<torch::DType> dtypes;
  for (const auto& [name, file] : tensors_) {
    const int i = [&] {
      for (size_t k = 0; k < file->tensors().size(); ++k) {
        if (file->tensors()[k].spec.name == name) return static_cast<int>(k);
      }
      return -1;
    }();
    const safetensors::TensorSpec& spec = file->tensors()[static_cast<size_t>(i)].spec;
    if (!torch::IsFloatingPoint(spec.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": tensor '", name, "' is ",
                                                     Shape(spec.dtype, spec.shape),
                                                     ": expected a floating-point weight (ucp imports module weights)"));
    }
    dtypes.insert(spec.dtype);
    inputs.push_back({name, spec.shape});
  }
  if (inputs.empty()) return absl::InvalidArgumentError(absl::StrCat(dir_, ": the safetensors hold no tensor"));
  if (dtypes.size() > 1) {
    std::vector<std::string> names;
    for (torch::DType d : dtypes) names.push_back(std::string(torch::DTypeName(d)));
    return absl::UnimplementedError(absl::StrCat(dir_, ": the weights are of several dtypes (",
                                                 absl::StrJoin(names, ", "),
                                                 "); DeepSpeed keeps one dtype for a model's weights"));
  }
  UCP_ASSIGN_OR_RETURN(rules::HfImportPlan plan, rules::PlanHfImport(inputs, config_, preset),
                       _.Prepend(absl::StrCat(dir_, ": ")));
  architecture_ = plan.architecture;
  preset_ = plan.preset;
  const torch::DType dtype = *dtypes.begin();
  args_ = plan.args;
  for (const rules::HfImportTensor& t : plan.tensors) {
    Entry entry;
    entry.fused = !t.parts.empty();
    for (const rules::HfImportPart& part : t.parts) {
      const auto& [hf_name, file] = tensors_[static_cast<size_t>(part.input)];
      entry.parts.push_back(Part{hf_name, file, part.groups, part.start, part.length});
    }
    if (!entry.fused) {
      const auto& [hf_name, file] = tensors_[static_cast<size_t>(t.input)];
      entry.parts.push_back(Part{hf_name, file});
    }
    state::ParamState p;
    p.name = t.name;
    p.full_shape = t.shape;
    p.group = 0;
    p.role = state::TensorRole::kTrainable;
    p.lp_dtype = dtype;
    p.layer = t.layer;
    p.local_name = t.local_name;
    p.tied_key = t.tied_key;
    p.tied_layers = t.tied_layers;
    p.tp_shapes = {p.full_shape};
    p.stages = {0};
    info_.module_order.push_back({t.layer, t.name});
    info_.params.push_back(std::move(p));
    entries_[t.name] = std::move(entry);
  }
  info_.num_groups = 1;
  info_.state_keys = {"exp_avg", "exp_avg_sq"};
  info_.scalar_keys = {"step"};
  info_.pipeline = true;
  info_.num_layers = plan.num_layers;
  info_.module_layers = plan.module_layers;
  info_.partition_method = plan.partition_method;
  info_.lp_dtype = dtype;
  info_.optimizer_kind = state::OptimizerKind::kZero;
  info_.zero_stage = 1;
  info_.source_topology = state::Topology{1, 1, 1};
  // The heads tp splits (Megatron and GPT-NeoX give each tp rank whole heads,
  // and with GQA whole kv groups): a reshard to a tp that does not divide
  // them is refused (ops/reshard.cc).
  for (const char* key : {"num_attention_heads", "n_head", "num_key_value_heads"}) {
    const json::Value* v = config_.Get(key);
    if (v != nullptr && v->type() == json::Value::Type::kInt && v->int_value() > 0) {
      info_.tp_divisors.push_back({key, v->int_value(), JoinPath(dir_, kConfigFile)});
    }
  }
  info_.notes = plan.notes;
  info_.notes.push_back(absl::StrCat(
      "Hugging Face source: no optimizer state; written fresh (fp32 masters = the ", std::string(torch::DTypeName(dtype)),
      " weights, exp_avg and exp_avg_sq 0, step 0, DeepSpeed's default param group): load it in DeepSpeed with "
      "load_checkpoint(..., load_module_only=True) so that the job's own optimizer starts from the weights (a plain "
      "load maps the fresh partitions by position, in ucp's order of the params, not necessarily the model's)"));
  info_.Reindex();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorPlan>> HfState::Slices(const state::ParamState& param, int stage,
                                                       const std::string& state) const {
  auto it = entries_.find(param.name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("no param '", param.name, "' in ", dir_));
  const Entry& e = it->second;
  const bool zero = state == "exp_avg" || state == "exp_avg_sq";
  if (state != state::kLpState && state != state::kFp32State && !zero) {
    return absl::NotFoundError(absl::StrCat("param '", param.name, "' has no state '", state, "' (", dir_,
                                            " is a Hugging Face folder: the optimizer state is fresh)"));
  }
  if (zero) return std::vector<TensorPlan>{TensorPlan::Zeros(torch::DType::kFloat32, param.full_shape)};
  const bool fp32 = state == state::kFp32State;
  if (!e.fused) {
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, Read(e.parts[0], fp32));
    return std::vector<TensorPlan>{TensorPlan::FromTensor(t)};
  }
  // A fused param: group by group, each part's rows of that group (parts by start).
  std::vector<TensorPlan> parts, rows;
  for (const Part& part : e.parts) {
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, Read(part, fp32));
    parts.push_back(TensorPlan::FromTensor(t));
  }
  const int64_t groups = e.parts[0].groups;
  for (int64_t g = 0; g < groups; ++g) {
    for (size_t k = 0; k < parts.size(); ++k) {
      UCP_ASSIGN_OR_RETURN(TensorPlan r, parts[k].Narrow(0, g * e.parts[k].length, e.parts[k].length));
      rows.push_back(std::move(r));
    }
  }
  UCP_ASSIGN_OR_RETURN(TensorPlan full, TensorPlan::Cat(rows, 0));
  if (full.shape() != param.full_shape) {
    return absl::InternalError(absl::StrCat(dir_, ": fused '", param.name, "' assembled as [",
                                            absl::StrJoin(full.shape(), ", "), "], expected [",
                                            absl::StrJoin(param.full_shape, ", "), "]"));
  }
  return std::vector<TensorPlan>{std::move(full)};
}

// One HF tensor, cast to float32 for the fp32 masters.
absl::StatusOr<torch::Tensor> HfState::Read(const Part& part, bool fp32) const {
  UCP_ASSIGN_OR_RETURN(torch::Tensor t, part.file->GetTensor(part.hf_name),
                       _.Prepend(absl::StrCat(part.file->path(), ": ")));
  if (fp32 && t.dtype() != torch::DType::kFloat32) return torch::Cast(t, torch::DType::kFloat32);
  return t;
}

absl::StatusOr<state::FileValue> HfState::GroupScalar(int group, const std::string& key) const {
  if (group != 0 || key != "step") return state::FileValue{nullptr, nullptr};
  return step_;
}

std::vector<std::string> HfState::Files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

std::vector<std::string> HfState::InputFiles() const {
  std::vector<std::string> out = Files();
  out.push_back(JoinPath(dir_, kConfigFile));
  return out;
}

// Opened and checked in Open (safetensors has no checksums); the check is
// that the file is still one of them.
absl::Status HfState::VerifyInput(const std::string& path) const {
  for (const std::string& f : InputFiles()) {
    if (f == path) return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat(path, " is not a file of ", dir_));
}

}  // namespace ucp::hf
