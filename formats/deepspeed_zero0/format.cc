#include "formats/deepspeed_zero0/format.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/sliced_report.h"
#include "format/torch/torch_file.h"
#include "formats/deepspeed_source.h"
#include "formats/deepspeed_zero0/zero0_state.h"
#include "formats/deepspeed_zero0/zero0_writer.h"

namespace ucp::deepspeed_zero0 {
namespace {

absl::StatusOr<Zero0Options> OptionsOf(const formats::SourceOptions& options) {
  Zero0Options o;
  o.read = formats::DeepSpeedReadOptions(options);
  o.make_vocab_size_divisible_by = options.make_vocab_size_divisible_by;
  auto it = options.format_options.find(kOrderOption);
  if (it != options.format_options.end()) {
    if (it->second != kOrderHfTrainer) {
      return absl::InvalidArgumentError(absl::StrCat("--source_option=", kOrderOption, "=", it->second,
                                                     ": expected ", kOrderHfTrainer));
    }
    o.order = it->second;
  }
  return o;
}

class Source : public formats::SlicedStateSource<Zero0State> {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view kind() const override { return kKind; }
  absl::string_view summary() const override {
    return "a DeepSpeed checkpoint without ZeRO (zero_optimization.stage 0: mp_rank_00_model_states.pt holding the "
           "optimizer state, no *_optim_states.pt)";
  }
  absl::string_view latest_file() const override { return deepspeed::kLatestFile; }

  // Model-states files only, and the first one's pickle (not its tensors)
  // says stage 0: param_shapes None (ZeRO writes them, also without
  // optimizer files) and the optimizer inside.
  bool Detect(const formats::CheckpointFolder& folder) const override {
    bool mp_rank = false;
    for (const std::string& n : folder.names) {
      auto parsed = deepspeed::ParseCheckpointFileName(n);
      if (!parsed) continue;
      if (parsed->type != deepspeed::CheckpointFileName::Type::kMpRank &&
          parsed->type != deepspeed::CheckpointFileName::Type::kLayer) {
        return false;
      }
      if (parsed->type == deepspeed::CheckpointFileName::Type::kMpRank) mp_rank = true;
    }
    if (!mp_rank) return false;
    torch::OpenOptions o;
    o.verify_crc = false;
    o.refuse_unsafe_globals = false;  // only looked at; Open applies the user's choice
    auto f = torch::TorchFile::Open(JoinPath(folder.dir, deepspeed::MpRankFileName(0)), o);
    // Model states and nothing else, the first unreadable (truncated,
    // damaged): no other format can be it, and Open says what is wrong
    // with that file (not that optimizer files are missing).
    if (!f.ok()) return f.status().code() == absl::StatusCode::kDataLoss;
    return IsZero0Root(*(*f)->root());
  }

 protected:
  absl::StatusOr<std::unique_ptr<Zero0State>> OpenState(const formats::CheckpointFolder& folder,
                                                        const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(Zero0Options o, OptionsOf(options));
    return Zero0State::Open(folder.dir, o);
  }
  std::string DsVersion(const Zero0State& s) const override { return s.ds_version(); }
  void Describe(const Zero0State& s, InspectReport* report) const override {
    report->set_zero_stage(0);
    report->set_kind_detail(absl::StrCat("ZeRO stage 0 (no ZeRO): ", s.layout(),
                                         " inside the model states; param order decided by ", s.evidence()));
  }
};

class Target : public formats::TargetFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override {
    return "a DeepSpeed checkpoint without ZeRO (stage 0) of a plain module at any tp and dp";
  }
  formats::TargetFamily family() const override { return formats::TargetFamily::kTrainingState; }
  bool PicksFor(const state::ModelInfo& info, const writers::ZeroWriteOptions& options) const override {
    return options.zero_stage == 0 && info.zero_stage == 0 && info.expert_parallel == 0;
  }
  absl::StatusOr<std::unique_ptr<writers::Plan>> PlanTrainingState(const state::ModelState& state,
                                                                   const writers::ZeroWriteOptions& options,
                                                                   writers::TargetSummary* summary) const override {
    return PlanZero0(state, options, summary);
  }
};

}  // namespace

void Register(formats::Registry& registry) {
  registry.AddSource(std::make_unique<Source>());
  registry.AddTarget(std::make_unique<Target>());
}

}  // namespace ucp::deepspeed_zero0
