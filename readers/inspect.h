// `ucp inspect`: what a checkpoint folder or a single .pt file holds.
//
// For a folder: its kind (ZeRO stage and optimizer layout, or universal),
// tag, topology, param groups (sizes, paddings, partitions), and every
// parameter with its shape, dtype and where its fragments live (file, tp,
// pp and dp rank, offset in the flat partition). For a single file: the
// object tree, tensors summarized (dtype, shape, stride, storage offset).
// The report is an InspectReport message (proto/ucp.proto), printed as text
// or textproto.
#ifndef UCP_READERS_INSPECT_H_
#define UCP_READERS_INSPECT_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/ucp.pb.h"

namespace ucp::readers {

absl::StatusOr<InspectReport> Inspect(const std::string& path);
// A human-readable rendering of the report.
std::string FormatReport(const InspectReport& report);

}  // namespace ucp::readers

#endif  // UCP_READERS_INSPECT_H_
