#include "formats/weights/format.h"

#include <memory>
#include <utility>
#include <vector>

#include "formats/weights/export_writer.h"

namespace ucp::weights {
namespace {

class Target : public formats::TargetFormat {
 public:
  Target(const char* name, const char* summary, ExportFormat format)
      : name_(name), summary_(summary), format_(format) {}
  absl::string_view name() const override { return name_; }
  absl::string_view summary() const override { return summary_; }
  formats::TargetFamily family() const override { return formats::TargetFamily::kWeights; }
  absl::StatusOr<std::unique_ptr<writers::Plan>> PlanWeights(
      std::vector<writers::ExportTensor> tensors, const writers::ExportWriteOptions& options) const override {
    return PlanExport(std::move(tensors), format_, options);
  }

 private:
  const char* name_;
  const char* summary_;
  ExportFormat format_;
};

}  // namespace

void Register(formats::Registry& registry) {
  registry.AddTarget(std::make_unique<Target>(
      kSafetensors, "model.safetensors (sharded with model.safetensors.index.json)", ExportFormat::kSafetensors));
  registry.AddTarget(std::make_unique<Target>(
      kTorch, "pytorch_model.bin (sharded with pytorch_model.bin.index.json)", ExportFormat::kTorch));
}

}  // namespace ucp::weights
