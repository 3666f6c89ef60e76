#include "formats/dcp/format.h"

#include <memory>

#include "formats/dcp/dcp_writer.h"

namespace ucp::dcp {
namespace {

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

void Register(formats::Registry& registry) { registry.AddTarget(std::make_unique<Target>()); }

}  // namespace ucp::dcp
