#include "writers/universal_writer.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/parallel.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/manifest.h"
#include "deepspeed/tree_copy.h"
#include "deepspeed/universal_metadata.h"
#include "google/protobuf/text_format.h"
#include "tp/plan_io.h"

namespace ucp::writers {
namespace {

using deepspeed::ParamState;
using pickle::Value;
using pickle::ValuePtr;

// Rejects names that would escape the output folder or cannot be file names.
absl::Status CheckParamName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos || name.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("param name '", name, "' cannot be a folder name in a universal checkpoint"));
  }
  return absl::OkStatus();
}

// Universal files are listed in the manifest with their sha256.
torch::TorchWriteOptions HashedWrites() {
  torch::TorchWriteOptions o;
  o.sha256 = true;
  return o;
}

class FileList {
 public:
  void Add(const std::string& rel, int64_t size, const std::string& sha) {
    std::lock_guard<std::mutex> lock(mu_);
    FileDigest d;
    d.set_path(rel);
    d.set_size(size);
    d.set_sha256(sha);
    files_.push_back(std::move(d));
  }
  std::vector<FileDigest> Sorted() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<FileDigest> out = files_;
    std::sort(out.begin(), out.end(), [](const FileDigest& a, const FileDigest& b) { return a.path() < b.path(); });
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<FileDigest> files_;
};

}  // namespace

absl::StatusOr<WriteStats> WriteUniversal(const deepspeed::ModelState& state, const std::string& output_folder,
                                          const UniversalWriteOptions& options) {
  const deepspeed::ModelInfo& info = state.info();
  for (const ParamState& p : info.params) UCP_RETURN_IF_ERROR(CheckParamName(p.name));
  UCP_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::Create(output_folder, options.overwrite));
  if (options.keep_temp_folder) staging.Keep();
  const std::string out = staging.path();
  const std::string zero_dir = JoinPath(out, deepspeed::kUniversalZeroDir);
  UCP_RETURN_IF_ERROR(MakeDirs(zero_dir));
  bool any_module = false;
  for (const ParamState& p : info.params) any_module |= !p.trainable();
  if (any_module) UCP_RETURN_IF_ERROR(MakeDirs(JoinPath(out, deepspeed::kUniversalModuleDir)));

  FileList files;
  std::atomic<int64_t> bytes{0};
  std::atomic<size_t> done{0};
  // Writes out/rels[k] from writers[k] and roots[k] (when several, their
  // hashes are computed two at a time: TorchWriter::WriteFiles) and lists
  // them for the manifest.
  auto write_files = [&](const std::vector<std::string>& rels, const std::vector<torch::TorchWriter*>& writers,
                         const std::vector<const Value*>& roots) -> absl::Status {
    std::vector<std::string> paths;
    for (const std::string& rel : rels) paths.push_back(JoinPath(out, rel));
    UCP_RETURN_IF_ERROR(torch::TorchWriter::WriteFiles(writers, paths, roots));
    for (size_t k = 0; k < rels.size(); ++k) {
      files.Add(rels[k], static_cast<int64_t>(writers[k]->bytes_written()), writers[k]->sha256_hex());
      bytes += static_cast<int64_t>(writers[k]->bytes_written());
    }
    return absl::OkStatus();
  };
  auto write_file = [&](const std::string& rel, torch::TorchWriter& w, const Value& root) {
    return write_files({rel}, {&w}, {&root});
  };

  // Largest params first, so that the threads finish together rather than
  // one of them ending alone on a large param.
  std::vector<size_t> order(info.params.size());
  std::vector<int64_t> numel(info.params.size(), 1);
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
    for (int64_t d : info.params[i].full_shape) numel[i] *= d;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numel[a] > numel[b]; });
  UCP_RETURN_IF_ERROR(ParallelFor(order.size(), options.num_threads, [&](size_t k) -> absl::Status {
    const ParamState& p = info.params[order[k]];
    if (p.trainable()) {
      const std::string rel_dir = JoinPath(deepspeed::kUniversalZeroDir, p.name);
      UCP_RETURN_IF_ERROR(MakeDirs(JoinPath(out, rel_dir)));
      // The step, the fp32 master and the optimizer states, written together.
      std::vector<std::unique_ptr<torch::TorchWriter>> owned;
      std::vector<torch::TorchWriter*> writers;
      std::vector<ValuePtr> roots;
      std::vector<std::string> rels;
      auto add_file = [&](std::string rel) -> torch::TorchWriter& {
        owned.push_back(std::make_unique<torch::TorchWriter>(HashedWrites()));
        writers.push_back(owned.back().get());
        rels.push_back(std::move(rel));
        return *owned.back();
      };
      UCP_ASSIGN_OR_RETURN(deepspeed::FileValue step, state.GroupScalar(p.group, "step"));
      if (step.value) {
        torch::TorchWriter& w = add_file(JoinPath(rel_dir, "step.pt"));
        UCP_ASSIGN_OR_RETURN(ValuePtr v, deepspeed::CopyTreeForWrite(step, w));
        roots.push_back(std::move(v));
      }
      std::vector<std::string> states = {deepspeed::kFp32State};
      states.insert(states.end(), info.state_keys.begin(), info.state_keys.end());
      for (const std::string& s : states) {
        UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, state.Full(p, s));
        if (plan.shape() != p.full_shape) {
          return absl::InternalError(absl::StrCat("param '", p.name, "' ", s, ": merged shape ",
                                                  torch::ShapeString(plan.shape()), " differs from ",
                                                  torch::ShapeString(p.full_shape)));
        }
        torch::TorchWriter& w = add_file(JoinPath(rel_dir, s + ".pt"));
        ValuePtr t = tp::AddPlan(w, plan);  // the writer keeps a copy of the plan
        // DeepSpeed's fp32 masters keep requires_grad=True through the merge.
        if (s == deepspeed::kFp32State) UCP_RETURN_IF_ERROR(tp::SetRequiresGrad(*t, true));
        roots.push_back(deepspeed::UniversalParamDict(p.rule, t));
      }
      std::vector<const Value*> root_ptrs;
      for (const ValuePtr& r : roots) root_ptrs.push_back(r.get());
      UCP_RETURN_IF_ERROR(write_files(rels, writers, root_ptrs));
    } else {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, state.Full(p, deepspeed::kLpState));
      torch::TorchWriter w(HashedWrites());
      ValuePtr t = tp::AddPlan(w, plan);
      UCP_RETURN_IF_ERROR(write_file(JoinPath(deepspeed::kUniversalModuleDir, p.name + ".pt"), w,
                                     *deepspeed::UniversalParamDict(p.rule, t)));
    }
    const size_t n = ++done;
    if (options.progress) options.progress(n, info.params.size());
    return absl::OkStatus();
  }));

  // Optimizer state without the sharded parts.
  {
    UCP_ASSIGN_OR_RETURN(deepspeed::FileValue common, state.OptimizerCommon());
    torch::TorchWriter w(HashedWrites());
    UCP_ASSIGN_OR_RETURN(ValuePtr v, deepspeed::CopyTreeForWrite(common, w));
    UCP_RETURN_IF_ERROR(
        write_file(JoinPath(deepspeed::kUniversalZeroDir, deepspeed::kUniversalOptimizerStateFile), w, *v));
  }
  // The model-state files, byte for byte.
  const deepspeed::Topology& src = info.source_topology;
  for (int pp = 0; pp < src.pp; ++pp) {
    for (int t = 0; t < src.tp; ++t) {
      const std::string rel = deepspeed::MpRankFileName(src.mp_rank(pp, t));
      const std::string from = state.ModelStatesPath(pp, t);
      if (!from.empty()) {
        std::string sha;
        UCP_RETURN_IF_ERROR(CopyFile(from, JoinPath(out, rel), &sha));
        UCP_ASSIGN_OR_RETURN(int64_t size, FileSize(JoinPath(out, rel)));
        files.Add(rel, size, sha);
        bytes += size;
      } else {
        deepspeed::FileValue root = state.ModelStatesRoot(pp, t);
        if (!root.value) {
          return absl::FailedPreconditionError(absl::StrCat("no model states for stage ", pp, " tp rank ", t));
        }
        torch::TorchWriter w(HashedWrites());
        UCP_ASSIGN_OR_RETURN(ValuePtr v, deepspeed::CopyTreeForWrite(root, w));
        UCP_RETURN_IF_ERROR(write_file(rel, w, *v));
      }
    }
  }
  // The manifest.
  deepspeed::ManifestHeader header;
  header.source_folder = options.source_folder;
  header.source_kind = "zero";
  Manifest manifest = deepspeed::ToManifest(info, header);
  for (auto& f : files.Sorted()) *manifest.add_file() = f;
  *manifest.mutable_rules() = options.rules;
  std::string text;
  google::protobuf::TextFormat::PrintToString(manifest, &text);
  UCP_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(out, deepspeed::kManifestFile), text));

  WriteStats stats;
  stats.files = static_cast<int64_t>(manifest.file_size()) + 1;
  stats.bytes = bytes.load() + static_cast<int64_t>(text.size());
  stats.params = static_cast<int64_t>(info.params.size());
  UCP_RETURN_IF_ERROR(staging.Commit());
  if (options.write_latest) {
    UCP_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(Dirname(staging.target()), deepspeed::kLatestUniversalFile),
                                        Basename(staging.target())));
  }
  return stats;
}

}  // namespace ucp::writers
