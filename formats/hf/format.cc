#include "formats/hf/format.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "formats/deepspeed_source.h"
#include "formats/hf/hf_state.h"

namespace ucp::hf {
namespace {

class Source : public formats::SlicedStateSource<HfState> {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view kind() const override { return kName; }
  absl::string_view summary() const override {
    return "a Hugging Face model folder (config.json + model.safetensors or model-*-of-*.safetensors with "
           "model.safetensors.index.json), imported by a preset's names (--preset)";
  }
  absl::string_view latest_file() const override { return ""; }

  bool Detect(const formats::CheckpointFolder& folder) const override {
    bool config = false, weights = false;
    for (const std::string& n : folder.names) {
      // A DeepSpeed root beside the weights (the Trainer's checkpoint-N:
      // config.json, model.safetensors, latest, global_stepN/): the training
      // state is the DeepSpeed checkpoint its latest file names, not this.
      if (n == "latest" || n == "latest_universal" || absl::StartsWith(n, "global_step")) return false;
      config = config || n == kConfigFile;
      weights = weights || n == kSingleFile || n == kIndexFile;
    }
    return config && weights;
  }

  // The import's args (HfState::import_args) decide the preset's
  // argument-conditional rules (megatron-deepspeed: swiglu's gate/up as 2
  // sub-params).
  absl::StatusOr<formats::OpenedSource> Open(const formats::CheckpointFolder& folder,
                                             const formats::SourceOptions& options,
                                             JobDescription* description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<HfState> s, OpenState(folder, options));
    rules::ResolveOptions r = ResolveOf(options);
    r.args = s->import_args();
    return formats::ResolveSliced(this, std::move(s), r);
  }
  absl::StatusOr<formats::SlicedSource> OpenSliced(const formats::CheckpointFolder& folder,
                                                   const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<HfState> s, OpenState(folder, options));
    rules::ResolveOptions r = ResolveOf(options);
    r.args = s->import_args();
    return formats::SlicedSource{std::move(s), r};
  }

 protected:
  absl::StatusOr<std::unique_ptr<HfState>> OpenState(const formats::CheckpointFolder& folder,
                                                     const formats::SourceOptions& options) const override {
    HfReadOptions o;
    o.preset = options.rules.preset;
    return HfState::Open(folder.dir, o);
  }
  // tp = pp = 1: the preset's rules split each param for a reshard to tp > 1.
  rules::ResolveOptions ReopenResolve(const formats::SourceOptions& options) const override {
    return ResolveOf(options);
  }
  std::string DsVersion(const HfState&) const override { return ""; }
  void Describe(const HfState& s, InspectReport* report) const override {
    report->set_kind_detail(absl::StrCat("Hugging Face ", s.architecture(), " (", s.Files().size(),
                                         " safetensors files) under preset '", s.preset(), "' names"));
  }
};

}  // namespace

void Register(formats::Registry& registry) { registry.AddSource(std::make_unique<Source>()); }

}  // namespace ucp::hf
