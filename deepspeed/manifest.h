// The ucp manifest (`ucp_manifest.textproto`, the Manifest message of
// proto/ucp.proto) and a ModelInfo, in both directions side by side: what a
// writer records of the model beside a checkpoint (each param's rule and its
// source, the pipeline layout, the optimizer's state keys) and what a reader
// recovers from it. Like LevelDB's BlockHandle::EncodeTo / DecodeFrom: one
// place knows the mapping, and a round-trip test holds the two together.
//
// The manifest records each param's whole rule (`merge_rule`; manifests of
// earlier ucp versions only its kind), so a reader needs no file of a param
// to know its shape and rule; the universal files' metadata
// (universal_metadata.h), which stock DeepSpeed reads, says the same.
//
// Example:
//   Manifest m = ToManifest(info, header);
//   ... add m.file() digests, m.rules() ...
//   UCP_ASSIGN_OR_RETURN(state::ModelInfo back, FromManifest(m));
#ifndef UCP_DEEPSPEED_MANIFEST_H_
#define UCP_DEEPSPEED_MANIFEST_H_

#include <string>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "proto/ucp.pb.h"

namespace ucp::deepspeed {

inline constexpr char kUcpVersion[] = "ucp 0.1";

struct ManifestHeader {
  std::string source_folder;
  std::string source_kind;  // "zero", "universal"
};

// ---- encode ----

void EncodeParam(const state::ParamState& p, Manifest::Param* out);
// Everything but the params, the files and the rules.
void EncodeLayout(const state::ModelInfo& info, Manifest* out);
// Header, layout and every param, in ModelInfo order.
Manifest ToManifest(const state::ModelInfo& info, const ManifestHeader& header);

// ---- decode ----

// name, full shape, rule (only its kind from a manifest without merge_rule),
// source, origin, group, role, layer, local name, tied key and layers, lp dtype.
absl::StatusOr<state::ParamState> DecodeParam(const Manifest::Param& m);
absl::Status DecodeLayout(const Manifest& m, state::ModelInfo* out);
absl::StatusOr<state::ModelInfo> FromManifest(const Manifest& m);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_MANIFEST_H_
