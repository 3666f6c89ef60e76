#include "formats/weights/export_writer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/parallel.h"
#include "base/status_macros.h"
#include "format/json/json.h"
#include "format/safetensors/safetensors.h"
#include "format/torch/torch_file.h"
#include "tp/plan_io.h"

namespace ucp::weights {

using writers::Plan;
using writers::Unit;
using writers::UnitResult;
using writers::WriteStats;
using writers::RunPlan;
using writers::AddUnitResults;
using writers::ExportTensor;
using writers::ExportWriteOptions;
using writers::WeightsRunOptions;

namespace {

constexpr int64_t kUnitBytes = int64_t{64} << 20;  // safetensors: small tensors batched into units this big

// Converts `count` elements of `from` at `in` to float32 at `out` as
// torch's .float() does (static_cast: round to nearest even).
template <typename T>
void IntsToFloat(const uint8_t* in, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, in + static_cast<size_t>(i) * sizeof(T), sizeof(T));
    out[i] = static_cast<float>(v);
  }
}

absl::StatusOr<torch::Tensor> ToFloat32(torch::DType from, int64_t count, const std::string& bytes) {
  if (torch::IsFloatingPoint(from)) {
    UCP_ASSIGN_OR_RETURN(torch::Tensor src, torch::Tensor::FromBytes(from, {count}, bytes));
    return torch::Cast(src, torch::DType::kFloat32);
  }
  std::string out(static_cast<size_t>(count) * 4, '\0');
  float* f = reinterpret_cast<float*>(out.data());
  const uint8_t* in = reinterpret_cast<const uint8_t*>(bytes.data());
  switch (from) {
    case torch::DType::kInt64: IntsToFloat<int64_t>(in, count, f); break;
    case torch::DType::kInt32: IntsToFloat<int32_t>(in, count, f); break;
    case torch::DType::kInt16: IntsToFloat<int16_t>(in, count, f); break;
    case torch::DType::kInt8: IntsToFloat<int8_t>(in, count, f); break;
    case torch::DType::kUInt8: IntsToFloat<uint8_t>(in, count, f); break;
    case torch::DType::kBool:
      for (int64_t i = 0; i < count; ++i) f[i] = in[i] != 0 ? 1.0f : 0.0f;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot convert ", std::string(torch::DTypeName(from)), " to a floating dtype"));
  }
  return torch::Tensor::FromBytes(torch::DType::kFloat32, {count}, std::move(out));
}

bool Convertible(torch::DType from, torch::DType to) {
  if (from == to) return true;
  if (!torch::IsFloatingPoint(to)) return false;
  return from != torch::DType::kComplex64 && from != torch::DType::kComplex128;
}

// Streams `plan` as `dtype` bytes: views of the sources where no conversion
// is needed; else converted a chunk at a time (floats: round to nearest
// even; integers: as torch's .float(), then to `dtype`).
safetensors::TensorBytes PlanBytes(const tp::TensorPlan& plan, torch::DType dtype) {
  const size_t out_isz = torch::ItemSize(dtype);
  const size_t in_isz = torch::ItemSize(plan.dtype());
  const torch::DType from = plan.dtype();
  return [plan, dtype, out_isz, in_isz, from](uint64_t offset, size_t len,
                                              uint8_t* scratch) -> absl::StatusOr<absl::Span<const uint8_t>> {
    if (offset % out_isz != 0 || len % out_isz != 0) {
      return absl::InternalError("chunk not aligned to the element size");
    }
    const int64_t start = static_cast<int64_t>(offset / out_isz);
    const int64_t count = static_cast<int64_t>(len / out_isz);
    if (from == dtype) return plan.ReadFlat(start, count, scratch);
    std::string buf(static_cast<size_t>(count) * in_isz, '\0');
    UCP_RETURN_IF_ERROR(plan.CopyFlat(start, count, reinterpret_cast<uint8_t*>(buf.data())));
    torch::Tensor cast;
    if (torch::IsFloatingPoint(from)) {
      UCP_ASSIGN_OR_RETURN(torch::Tensor src, torch::Tensor::FromBytes(from, {count}, std::move(buf)));
      UCP_ASSIGN_OR_RETURN(cast, torch::Cast(src, dtype));
    } else {
      UCP_ASSIGN_OR_RETURN(torch::Tensor f32, ToFloat32(from, count, buf));
      if (dtype == torch::DType::kFloat32) {
        cast = f32;
      } else {
        UCP_ASSIGN_OR_RETURN(cast, torch::Cast(f32, dtype));
      }
    }
    std::memcpy(scratch, cast.data(), len);
    return absl::MakeConstSpan(scratch, len);
  };
}

absl::StatusOr<tp::TensorPlan> SourcePlan(const ExportTensor& t) {
  if (!t.source) return absl::InternalError(absl::StrCat("tensor '", t.name, "' has no source"));
  UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, t.source(), _.Prepend(absl::StrCat("tensor '", t.name, "': ")));
  if (plan.shape() != t.shape) {
    return absl::InternalError(absl::StrCat("tensor '", t.name, "': its value has shape ",
                                            torch::ShapeString(plan.shape()), ", expected ",
                                            torch::ShapeString(t.shape)));
  }
  if (!Convertible(plan.dtype(), t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': cannot write ",
                                                   std::string(torch::DTypeName(plan.dtype())), " as ",
                                                   std::string(torch::DTypeName(t.dtype))));
  }
  return plan;
}

std::string ShardName(ExportFormat format, int k, int n) {
  const char* base = format == ExportFormat::kSafetensors ? "model" : "pytorch_model";
  const char* ext = format == ExportFormat::kSafetensors ? ".safetensors" : ".bin";
  if (n == 1) return absl::StrCat(base, ext);
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "-%05d-of-%05d", k + 1, n);
  return absl::StrCat(base, suffix, ext);
}

class ExportPlan : public Plan {
 public:
  ExportPlan(std::vector<ExportTensor> tensors, ExportFormat format, const ExportWriteOptions& options)
      : tensors_(std::move(tensors)), format_(format), options_(options) {}

  const state::CheckpointState* read_ahead_source() const override { return options_.read_ahead; }

  absl::Status Build() {
    std::map<std::string, int> seen;
    for (const ExportTensor& t : tensors_) {
      for (const std::string* n : [&] {
             std::vector<const std::string*> v{&t.name};
             for (const auto& a : t.aliases) v.push_back(&a);
             return v;
           }()) {
        if (n->empty() || !seen.emplace(*n, 1).second) {
          return absl::InvalidArgumentError(absl::StrCat("export tensor name '", *n, "' is empty or repeated"));
        }
      }
      for (int64_t d : t.shape) {
        if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has a negative dim"));
      }
    }
    if (tensors_.empty()) return absl::InvalidArgumentError("nothing to export: no tensors");
    split_ = SplitIntoShards(tensors_, format_, options_.max_shard_size);
    if (format_ == ExportFormat::kSafetensors) return BuildSafetensors();
    for (size_t s = 0; s < split_.files.size(); ++s) {
      Unit u;
      u.name = absl::StrCat("shard ", split_.files[s]);
      u.outputs.push_back(split_.files[s]);
      for (size_t i : split_.tensors[s]) {
        u.bytes += tensors_[i].nbytes();
        u.inputs.insert(u.inputs.end(), tensors_[i].inputs.begin(), tensors_[i].inputs.end());
      }
      unit_shard_.push_back(static_cast<int>(s));
      units_.push_back(std::move(u));
    }
    return absl::OkStatus();
  }

  absl::Status Prepare(const std::string& staging) const override {
    for (size_t s = 0; s < layouts_.size(); ++s) {
      UCP_RETURN_IF_ERROR(safetensors::CreateFile(JoinPath(staging, split_.files[s]), layouts_[s]));
    }
    return absl::OkStatus();
  }

  absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const override {
    if (format_ == ExportFormat::kSafetensors) {
      const SafetensorsUnit& u = st_units_[i];
      const std::string path = JoinPath(staging, split_.files[u.shard]);
      for (size_t k = u.first; k < u.last; ++k) {
        const safetensors::PlacedTensor& placed = layouts_[u.shard].tensors[k];
        const ExportTensor& t = tensors_[layout_tensor_[u.shard][k]];
        UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, SourcePlan(t));
        UCP_RETURN_IF_ERROR(safetensors::WriteTensor(path, layouts_[u.shard], k, PlanBytes(plan, placed.spec.dtype),
                                                     size_t{4} << 20, /*writeback=*/options_.fsync));
      }
      return absl::OkStatus();
    }
    const int s = unit_shard_[i];
    torch::TorchWriteOptions wo;
    const int threads = options_.num_threads > 0 ? options_.num_threads : DefaultThreadCount();
    wo.record_threads = std::max(1, threads / static_cast<int>(std::max<size_t>(1, split_.files.size())));
    wo.writeback = options_.fsync;
    torch::TorchWriter w(wo);
    pickle::ValuePtr root = pickle::Value::MakeDict();
    std::vector<std::pair<std::string, pickle::ValuePtr>> followers;
    for (size_t idx : split_.tensors[s]) {
      const ExportTensor& t = tensors_[idx];
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, SourcePlan(t));
      pickle::ValuePtr v;
      if (plan.dtype() == t.dtype) {
        v = tp::AddPlan(w, plan);
      } else {
        safetensors::TensorBytes bytes = PlanBytes(plan, t.dtype);
        v = w.AddStreamedTensor(t.dtype, t.shape, plan.numel(), 0,
                                [bytes](uint64_t offset, size_t len, uint8_t* scratch) { return bytes(offset, len, scratch); });
      }
      root->DictSet(pickle::Value::Str(t.name), v);
      for (const std::string& a : t.aliases) followers.emplace_back(a, v);
    }
    for (auto& [name, v] : followers) root->DictSet(pickle::Value::Str(name), v);
    const std::string path = JoinPath(staging, split_.files[s]);
    UCP_RETURN_IF_ERROR(w.WriteFile(path, *root));
    FileDigest d;
    d.set_path(split_.files[s]);
    d.set_size(static_cast<int64_t>(w.bytes_written()));
    result->files.push_back(d);
    return absl::OkStatus();
  }

  absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results, const std::string& staging) const override {
    WriteStats stats;
    AddUnitResults(results, &stats);
    for (const auto& l : layouts_) {
      stats.files += 1;
      stats.bytes += static_cast<int64_t>(l.file_size);
    }
    std::vector<std::pair<std::string, std::string>> files = options_.extra_files;
    if (split_.files.size() > 1) {
      json::Value weight_map = json::Value::Object();
      for (size_t s = 0; s < split_.files.size(); ++s) {
        for (size_t i : split_.tensors[s]) {
          weight_map.Set(tensors_[i].name, json::Value::String(split_.files[s]));
          // Safetensors shards hold no alias (see the file comment).
          if (format_ == ExportFormat::kTorch) {
            for (const auto& a : tensors_[i].aliases) weight_map.Set(a, json::Value::String(split_.files[s]));
          }
        }
      }
      json::Value meta = json::Value::Object();
      meta.Set("total_size", json::Value::Int(split_.total_size));
      json::Value index = json::Value::Object();
      index.Set("metadata", std::move(meta));
      index.Set("weight_map", std::move(weight_map));
      files.emplace_back(format_ == ExportFormat::kSafetensors ? "model.safetensors.index.json"
                                                                        : "pytorch_model.bin.index.json",
                         json::DumpPython(index) + "\n");
    }
    for (const auto& [name, contents] : files) {
      UCP_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging, name), contents));
      stats.files += 1;
      stats.bytes += static_cast<int64_t>(contents.size());
    }
    stats.params = static_cast<int64_t>(tensors_.size());
    return stats;
  }

  std::string latest_file() const override { return ""; }

 private:
  struct SafetensorsUnit {
    int shard = 0;
    size_t first = 0, last = 0;  // tensors [first, last) of the shard's layout
  };

  absl::Status BuildSafetensors() {
    for (size_t s = 0; s < split_.files.size(); ++s) {
      std::vector<safetensors::TensorSpec> specs;
      std::vector<std::pair<std::string, std::string>> metadata = {{"format", "pt"}};
      std::map<std::string, size_t> by_name;
      for (size_t i : split_.tensors[s]) {
        specs.push_back({tensors_[i].name, tensors_[i].dtype, tensors_[i].shape});
        by_name[tensors_[i].name] = i;
        for (const auto& a : tensors_[i].aliases) metadata.emplace_back(a, tensors_[i].name);
      }
      UCP_ASSIGN_OR_RETURN(safetensors::FileLayout layout, safetensors::Layout(std::move(specs), metadata),
                           _.Prepend(absl::StrCat(split_.files[s], ": ")));
      std::vector<size_t> order;
      for (const auto& p : layout.tensors) order.push_back(by_name.at(p.spec.name));
      // Units: runs of tensors in data order, each at least kUnitBytes or one tensor.
      SafetensorsUnit cur{static_cast<int>(s), 0, 0};
      Unit u;
      auto flush = [&] {
        if (cur.last == cur.first) return;
        u.name = absl::StrCat(split_.files[s], " tensors ", layout.tensors[cur.first].spec.name,
                              cur.last - cur.first > 1 ? absl::StrCat(" .. ", layout.tensors[cur.last - 1].spec.name) : "");
        u.outputs = {split_.files[s]};
        st_units_.push_back(cur);
        units_.push_back(std::move(u));
        u = Unit();
        cur.first = cur.last;
      };
      for (size_t k = 0; k < layout.tensors.size(); ++k) {
        const ExportTensor& t = tensors_[order[k]];
        const int64_t b = t.nbytes();
        if (b >= kUnitBytes) flush();
        cur.last = k + 1;
        u.bytes += b;
        u.inputs.insert(u.inputs.end(), t.inputs.begin(), t.inputs.end());
        if (u.bytes >= kUnitBytes) flush();
      }
      flush();
      layouts_.push_back(std::move(layout));
      layout_tensor_.push_back(std::move(order));
    }
    return absl::OkStatus();
  }

  std::vector<ExportTensor> tensors_;
  ExportFormat format_;
  ExportWriteOptions options_;
  ShardSplit split_;
  std::vector<int> unit_shard_;                      // torch: unit -> shard
  std::vector<safetensors::FileLayout> layouts_;     // safetensors: per shard
  std::vector<std::vector<size_t>> layout_tensor_;   // per shard: layout index -> tensors_ index
  std::vector<SafetensorsUnit> st_units_;
};

}  // namespace

ShardSplit SplitIntoShards(const std::vector<ExportTensor>& tensors, ExportFormat format, int64_t max_shard_size) {
  // Aliases share their owner's storage and follow it; so do all empty
  // tensors after the first (torch gives every empty storage data pointer 0,
  // so the hub sees one storage id for them).
  ShardSplit out;
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> open;
  int64_t open_size = 0;
  std::vector<int> shard_of(tensors.size(), -1);  // -1 until placed; open shard = -2
  std::vector<size_t> empty_followers;
  int first_empty = -1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t size = tensors[i].nbytes();
    if (size == 0) {
      if (first_empty >= 0) {
        empty_followers.push_back(i);
        continue;
      }
      first_empty = static_cast<int>(i);
    }
    if (max_shard_size > 0 && size > max_shard_size) {
      shards.push_back({i});
      out.total_size += size;
      continue;
    }
    if (max_shard_size > 0 && open_size + size > max_shard_size && !open.empty()) {
      shards.push_back(open);
      open.clear();
      open_size = 0;
    }
    open.push_back(i);
    open_size += size;
    out.total_size += size;
  }
  if (!open.empty()) shards.push_back(open);
  if (!empty_followers.empty()) {
    for (auto& s : shards) {
      if (std::find(s.begin(), s.end(), static_cast<size_t>(first_empty)) != s.end()) {
        s.insert(s.end(), empty_followers.begin(), empty_followers.end());
      }
    }
  }
  const int n = static_cast<int>(shards.size());
  for (int k = 0; k < n; ++k) out.files.push_back(ShardName(format, k, n));
  out.tensors = std::move(shards);
  return out;
}

absl::StatusOr<std::unique_ptr<Plan>> PlanExport(std::vector<ExportTensor> tensors, ExportFormat format,
                                                 const ExportWriteOptions& options) {
  auto plan = std::make_unique<ExportPlan>(std::move(tensors), format, options);
  UCP_RETURN_IF_ERROR(plan->Build());
  return std::unique_ptr<Plan>(std::move(plan));
}

absl::StatusOr<WriteStats> WriteExport(std::vector<ExportTensor> tensors, const std::string& output_folder,
                                       ExportFormat format, const ExportWriteOptions& options) {
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, PlanExport(std::move(tensors), format, options));
  return RunPlan(*plan, output_folder, WeightsRunOptions(options));
}

}  // namespace ucp::weights
