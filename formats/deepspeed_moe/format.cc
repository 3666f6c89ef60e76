#include "formats/deepspeed_moe/format.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/facet.h"
#include "formats/deepspeed_source.h"
#include "formats/deepspeed_moe/moe_state.h"
#include "formats/deepspeed_moe/moe_writer.h"

namespace ucp::deepspeed_moe {
namespace {

class Source : public formats::SlicedStateSource<MoeState> {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view kind() const override { return kKind; }
  absl::string_view summary() const override { return "a DeepSpeed native mixture-of-experts checkpoint (layer_L_expert_E_mp_rank_XX_model_states.pt beside mp_rank_00_model_states.pt)"; }

  bool Detect(const formats::CheckpointFolder& folder) const override {
    for (const std::string& n : folder.names) {
      if (IsExpertFileName(n)) return true;
    }
    return false;
  }

 protected:
  std::string DsVersion(const MoeState& s) const override { return deepspeed::SourceDsVersion(s); }
  std::string KindDetail(const InspectReport& report) const override {
    return absl::StrFormat("native mixture of experts, ZeRO stage %d; experts under global ids", report.zero_stage());
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
    return PlanMoe(state, options, summary);
  }
};

}  // namespace

void Register(formats::Registry& registry) {
  registry.AddSource(std::make_unique<Source>());
  registry.AddTarget(std::make_unique<Target>());
}

}  // namespace ucp::deepspeed_moe
