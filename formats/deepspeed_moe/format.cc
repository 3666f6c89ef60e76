#include "formats/deepspeed_moe/format.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/facet.h"
#include "deepspeed/read_options.h"
#include "deepspeed/sliced_report.h"
#include "formats/deepspeed_moe/moe_state.h"
#include "formats/deepspeed_moe/moe_writer.h"

namespace ucp::deepspeed_moe {
namespace {

deepspeed::ReadOptions ReadOf(const formats::SourceOptions& options) {
  deepspeed::ReadOptions r;
  r.allow_unsafe_pickles = options.allow_unsafe_pickles;
  return r;
}

// MoeState exists at tp = pp = 1: a param no rule covers is a whole tensor.
rules::ResolveOptions ResolveOf(const formats::SourceOptions& options) {
  rules::ResolveOptions r = options.resolve();
  r.tp1_whole_tensors = true;
  return r;
}

class Source : public formats::SourceFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view kind() const override { return kKind; }
  absl::string_view summary() const override { return "a DeepSpeed native mixture-of-experts checkpoint (layer_L_expert_E_mp_rank_XX_model_states.pt beside mp_rank_00_model_states.pt)"; }
  absl::string_view latest_file() const override { return deepspeed::kLatestFile; }

  bool Detect(const formats::CheckpointFolder& folder) const override {
    for (const std::string& n : folder.names) {
      if (IsExpertFileName(n)) return true;
    }
    return false;
  }

  absl::StatusOr<formats::OpenedSource> Open(const formats::CheckpointFolder& folder,
                                             const formats::SourceOptions& options,
                                             JobDescription* description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<MoeState> s, MoeState::Open(folder.dir, ReadOf(options)));
    return formats::ResolveSliced(this, std::move(s), ResolveOf(options));
  }

  absl::StatusOr<formats::OpenedSource> Reopen(const formats::CheckpointFolder& folder,
                                               const formats::SourceOptions& options,
                                               const JobDescription& description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<MoeState> s, MoeState::Open(folder.dir, ReadOf(options)));
    UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, formats::DecidedModel(description));
    return formats::ResolveSliced(this, std::move(s), options.resolve(), &decided);
  }

  absl::StatusOr<formats::SlicedSource> OpenSliced(const formats::CheckpointFolder& folder,
                                                   const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<MoeState> s, MoeState::Open(folder.dir, ReadOf(options)));
    return formats::SlicedSource{std::move(s), ResolveOf(options)};
  }

  absl::StatusOr<InspectReport> Inspect(const formats::CheckpointFolder& folder,
                                        const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<MoeState> s, MoeState::Open(folder.dir, ReadOf(options)));
    UCP_ASSIGN_OR_RETURN(InspectReport report, deepspeed::SlicedReport(*s, kKind, deepspeed::SourceDsVersion(*s)));
    report.set_kind_detail(
        absl::StrFormat("native mixture of experts, ZeRO stage %d; experts under global ids", report.zero_stage()));
    return report;
  }

  void Verify(const formats::CheckpointFolder& folder, const formats::SourceOptions& options,
              formats::VerifyResult* result) const override {
    absl::StatusOr<std::unique_ptr<MoeState>> s = MoeState::Open(folder.dir, ReadOf(options));
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
  absl::string_view summary() const override { return "a DeepSpeed native mixture-of-experts checkpoint at any dp and expert parallel degree"; }
  formats::TargetFamily family() const override { return formats::TargetFamily::kTrainingState; }
  bool PicksFor(const state::ModelInfo& info, const writers::ZeroWriteOptions& options) const override {
    return info.expert_parallel > 0;
  }
  absl::StatusOr<std::unique_ptr<writers::Plan>> PlanTrainingState(const state::ModelState& state,
                                                                   const writers::ZeroWriteOptions& options,
                                                                   writers::TargetSummary* summary) const override {
    return PlanMoe(state, options);
  }
};

}  // namespace

void Register(formats::Registry& registry) {
  registry.AddSource(std::make_unique<Source>());
  registry.AddTarget(std::make_unique<Target>());
}

}  // namespace ucp::deepspeed_moe
