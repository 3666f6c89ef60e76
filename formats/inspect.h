// `ucp inspect`: what a checkpoint folder or a single .pt file holds.
//
// For a folder (resolved and detected by the registry, formats/format.h;
// the format fills the report, SourceFormat::Inspect): its kind, tag,
// topology, param groups (sizes, paddings, partitions), and every parameter
// with its shape, dtype and where its fragments live (file, tp, pp and dp
// rank, offset in the flat partition). For a single file: the object tree,
// tensors summarized (dtype, shape, stride, storage offset). The report is
// an InspectReport message (proto/ucp.proto), printed as text or textproto.
#ifndef UCP_FORMATS_INSPECT_H_
#define UCP_FORMATS_INSPECT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"
#include "proto/ucp.pb.h"

namespace ucp::formats {

// Every .pt file of a checkpoint folder and its subfolders
// whose pickle names a code-execution global, as "FILE: module.name", sorted.
// Unreadable files are skipped (the readers report them).
std::vector<std::string> ScanUnsafeGlobals(const std::string& folder);

absl::StatusOr<InspectReport> Inspect(const Registry& registry, const std::string& path,
                                      const SourceOptions& options = SourceOptions());
// A human-readable rendering of the report.
std::string FormatReport(const InspectReport& report);

}  // namespace ucp::formats

#endif  // UCP_FORMATS_INSPECT_H_
