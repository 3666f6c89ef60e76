#include "formats/hf/format.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "deepspeed/sliced_report.h"
#include "formats/hf/hf_state.h"

namespace ucp::hf {
namespace {

absl::StatusOr<std::unique_ptr<HfState>> OpenState(const formats::CheckpointFolder& folder,
                                                  const formats::SourceOptions& options) {
  HfReadOptions o;
  o.preset = options.rules.preset;
  return HfState::Open(folder.dir, o);
}

// tp = pp = 1: the preset's rules split each param for a reshard to tp > 1.
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

  absl::StatusOr<formats::OpenedSource> Open(const formats::CheckpointFolder& folder,
                                             const formats::SourceOptions& options,
                                             JobDescription* description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<HfState> s, OpenState(folder, options));
    return formats::ResolveSliced(this, std::move(s), ResolveOf(options));
  }

  absl::StatusOr<formats::OpenedSource> Reopen(const formats::CheckpointFolder& folder,
                                               const formats::SourceOptions& options,
                                               const JobDescription& description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<HfState> s, OpenState(folder, options));
    UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, formats::DecidedModel(description));
    return formats::ResolveSliced(this, std::move(s), ResolveOf(options), &decided);
  }

  absl::StatusOr<formats::SlicedSource> OpenSliced(const formats::CheckpointFolder& folder,
                                                   const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<HfState> s, OpenState(folder, options));
    return formats::SlicedSource{std::move(s), ResolveOf(options)};
  }

  absl::StatusOr<InspectReport> Inspect(const formats::CheckpointFolder& folder,
                                        const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<HfState> s, OpenState(folder, options));
    UCP_ASSIGN_OR_RETURN(InspectReport report, deepspeed::SlicedReport(*s, std::string(kind()), ""));
    report.set_kind_detail(absl::StrCat("Hugging Face ", s->architecture(), " (", s->Files().size(),
                                        " safetensors files) under preset '", s->preset(), "' names"));
    return report;
  }

  void Verify(const formats::CheckpointFolder& folder, const formats::SourceOptions& options,
              formats::VerifyResult* result) const override {
    absl::StatusOr<std::unique_ptr<HfState>> s = OpenState(folder, options);
    if (!s.ok()) {
      result->problems.push_back(std::string(s.status().message()));
      return;
    }
    formats::VerifyStateInputs(**s, result);
  }
};

}  // namespace

void Register(formats::Registry& registry) { registry.AddSource(std::make_unique<Source>()); }

}  // namespace ucp::hf
