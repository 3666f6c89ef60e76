#include "formats/dcp/format.h"

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/sliced_report.h"
#include "formats/dcp/dcp_metadata.h"
#include "formats/dcp/dcp_state.h"
#include "formats/dcp/dcp_writer.h"

namespace ucp::dcp {
namespace {

absl::StatusOr<std::unique_ptr<DcpState>> OpenState(const formats::CheckpointFolder& folder,
                                                   const formats::SourceOptions& options) {
  DcpReadOptions o;
  o.allow_unsafe_pickles = options.allow_unsafe_pickles;
  if (auto it = options.format_options.find(kClipGradOption); it != options.format_options.end()) {
    if (!absl::SimpleAtod(it->second, &o.clip_grad) || !(o.clip_grad >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("--source_option=", kClipGradOption, "=", it->second,
                                                     ": expected a number >= 0 (0 = no clipping)"));
    }
  }
  return DcpState::Open(folder.dir, o);
}

// tp = pp = 1: a param no rule covers is a whole tensor; a preset or rules
// say how to split it for a reshard to tp > 1.
rules::ResolveOptions ResolveOf(const formats::SourceOptions& options) {
  rules::ResolveOptions r = options.resolve();
  r.tp1_whole_tensors = true;
  return r;
}

class Source : public formats::SourceFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view kind() const override { return kName; }
  absl::string_view summary() const override {
    return "a PyTorch Distributed Checkpoint (torch.distributed.checkpoint: .metadata + __R_n.distcp; FSDP2, "
           "torchtitan) of a model and its torch Adam(W) optimizer";
  }
  absl::string_view latest_file() const override { return ""; }

  // A `.metadata` file whose pickle is DCP's Metadata (its first bytes name
  // the class: read at most 4 KiB).
  bool Detect(const formats::CheckpointFolder& folder) const override {
    bool has = false;
    for (const std::string& n : folder.names) has = has || n == kMetadataFile;
    if (!has) return false;
    absl::StatusOr<std::string> head = ReadFileToString(JoinPath(folder.dir, kMetadataFile), 4096);
    if (!head.ok()) {
      // Larger than 4 KiB: read the start only.
      FILE* f = fopen(JoinPath(folder.dir, kMetadataFile).c_str(), "rb");
      if (f == nullptr) return false;
      char buf[4096];
      size_t n = fread(buf, 1, sizeof buf, f);
      fclose(f);
      head = std::string(buf, n);
    }
    return head->find("torch.distributed.checkpoint.metadata") != std::string::npos &&
           head->find("Metadata") != std::string::npos;
  }

  absl::StatusOr<formats::OpenedSource> Open(const formats::CheckpointFolder& folder,
                                             const formats::SourceOptions& options,
                                             JobDescription* description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<DcpState> s, OpenState(folder, options));
    return formats::ResolveSliced(this, std::move(s), ResolveOf(options));
  }

  absl::StatusOr<formats::OpenedSource> Reopen(const formats::CheckpointFolder& folder,
                                               const formats::SourceOptions& options,
                                               const JobDescription& description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<DcpState> s, OpenState(folder, options));
    UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, formats::DecidedModel(description));
    return formats::ResolveSliced(this, std::move(s), ResolveOf(options), &decided);
  }

  absl::StatusOr<formats::SlicedSource> OpenSliced(const formats::CheckpointFolder& folder,
                                                   const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<DcpState> s, OpenState(folder, options));
    return formats::SlicedSource{std::move(s), ResolveOf(options)};
  }

  absl::StatusOr<InspectReport> Inspect(const formats::CheckpointFolder& folder,
                                        const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<DcpState> s, OpenState(folder, options));
    UCP_ASSIGN_OR_RETURN(InspectReport report, deepspeed::SlicedReport(*s, std::string(kind()), ""));
    report.set_kind_detail(absl::StrCat("PyTorch Distributed Checkpoint saved by ", s->info().source_topology.dp,
                                        " ranks, ", s->metadata().entries.size(), " entries in ",
                                        s->metadata().Files().size(), " files: ", s->layout()));
    return report;
  }

  void Verify(const formats::CheckpointFolder& folder, const formats::SourceOptions& options,
              formats::VerifyResult* result) const override {
    absl::StatusOr<std::unique_ptr<DcpState>> s = OpenState(folder, options);
    if (!s.ok()) {
      result->problems.push_back(std::string(s.status().message()));
      return;
    }
    formats::VerifyStateInputs(**s, result);
  }
};

class Target : public formats::TargetFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override {
    return "PyTorch Distributed Checkpoint (.metadata + .distcp files) for an FSDP2 model and its Adam optimizer";
  }
  formats::TargetFamily family() const override { return formats::TargetFamily::kUniversal; }
  absl::StatusOr<std::unique_ptr<writers::Plan>> PlanUniversal(
      const state::ModelState& state, const writers::UniversalWriteOptions& options) const override {
    return PlanDcp(state, options);
  }
};

}  // namespace

void Register(formats::Registry& registry) {
  registry.AddSource(std::make_unique<Source>());
  registry.AddTarget(std::make_unique<Target>());
}

}  // namespace ucp::dcp
