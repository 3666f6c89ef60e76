// `ucp inspect` and `ucp verify` over the built-in formats
// (formats/builtin/builtin.h): what the CLI and the Python module call.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(InspectReport r, Inspect("/ckpt/global_step4"));
//   std::cout << formats::FormatReport(r);
#ifndef UCP_OPS_INSPECT_H_
#define UCP_OPS_INSPECT_H_

#include <string>

#include "absl/status/statusor.h"
#include "formats/format.h"
#include "formats/inspect.h"
#include "formats/verify.h"
#include "proto/ucp.pb.h"

namespace ucp::ops {

// A checkpoint folder (a tag folder, or a root whose latest file names one)
// or a single .pt file (formats::Inspect).
absl::StatusOr<InspectReport> Inspect(const std::string& path,
                                      const formats::SourceOptions& options = formats::SourceOptions());
// A checkpoint folder checked end to end (formats::VerifyFolder).
formats::VerifyResult Verify(const std::string& path, const formats::SourceOptions& options = formats::SourceOptions());

}  // namespace ucp::ops

#endif  // UCP_OPS_INSPECT_H_
