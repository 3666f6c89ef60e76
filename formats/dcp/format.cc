#include "formats/dcp/format.h"

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "formats/deepspeed_source.h"
#include "formats/dcp/dcp_metadata.h"
#include "formats/dcp/dcp_state.h"
#include "formats/dcp/dcp_writer.h"

namespace ucp::dcp {
namespace {

class Source : public formats::SlicedStateSource<DcpState> {
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

 protected:
  absl::StatusOr<std::unique_ptr<DcpState>> OpenState(const formats::CheckpointFolder& folder,
                                                      const formats::SourceOptions& options) const override {
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
  rules::ResolveOptions ReopenResolve(const formats::SourceOptions& options) const override {
    return ResolveOf(options);
  }
  std::string DsVersion(const DcpState&) const override { return ""; }
  void Describe(const DcpState& s, InspectReport* report) const override {
    report->set_kind_detail(absl::StrCat("PyTorch Distributed Checkpoint saved by ", s.info().source_topology.dp,
                                         " ranks, ", s.metadata().entries.size(), " entries in ",
                                         s.metadata().Files().size(), " files: ", s.layout()));
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
