#include "ops/inspect.h"

#include "formats/builtin/builtin.h"

namespace ucp::ops {

absl::StatusOr<InspectReport> Inspect(const std::string& path, const formats::SourceOptions& options) {
  return formats::Inspect(formats::builtin::Formats(), path, options);
}

formats::VerifyResult Verify(const std::string& path, const formats::SourceOptions& options) {
  return formats::VerifyFolder(formats::builtin::Formats(), path, options);
}

}  // namespace ucp::ops
