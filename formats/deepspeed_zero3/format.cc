#include "formats/deepspeed_zero3/format.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/facet.h"
#include "formats/deepspeed_source.h"
#include "formats/deepspeed_zero3/zero3_state.h"
#include "formats/deepspeed_zero3/zero3_writer.h"

namespace ucp::deepspeed_zero3 {
namespace {

class Source : public formats::SlicedStateSource<Zero3State> {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view kind() const override { return kKind; }
  absl::string_view summary() const override { return "a DeepSpeed ZeRO stage 3 checkpoint (zero_pp_rank_D_mp_rank_00_model_states.pt, *zero_pp_rank_D_mp_rank_00_optim_states.pt)"; }

  bool Detect(const formats::CheckpointFolder& folder) const override {
    for (const std::string& n : folder.names) {
      auto parsed = deepspeed::ParseCheckpointFileName(n);
      if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kZero3Model) return true;
    }
    return false;
  }

 protected:
  std::string DsVersion(const Zero3State& s) const override { return s.ds_version(); }
  std::string KindDetail(const InspectReport& report) const override {
    return "ZeRO stage 3: every param partitioned over dp, fp32_flat_groups per sub-group";
  }
};

class Target : public formats::TargetFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override { return "a DeepSpeed ZeRO stage 3 checkpoint at any dp and sub_group_size"; }
  formats::TargetFamily family() const override { return formats::TargetFamily::kTrainingState; }
  bool PicksFor(const state::ModelInfo& info, const writers::ZeroWriteOptions& options) const override {
    if (info.expert_parallel > 0) return false;
    return (options.zero_stage > 0 ? options.zero_stage : info.zero_stage) == 3;
  }
  absl::StatusOr<std::unique_ptr<writers::Plan>> PlanTrainingState(const state::ModelState& state,
                                                                   const writers::ZeroWriteOptions& options,
                                                                   writers::TargetSummary* summary) const override {
    return PlanZero3(state, options, summary);
  }
};

}  // namespace

void Register(formats::Registry& registry) {
  registry.AddSource(std::make_unique<Source>());
  registry.AddTarget(std::make_unique<Target>());
}

}  // namespace ucp::deepspeed_zero3
