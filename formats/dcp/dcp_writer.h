// PyTorch Distributed Checkpoint (DCP) as a target of `ucp convert --to=dcp`:
// the training state as torch.distributed.checkpoint.FileSystemWriter lays it
// out for an FSDP2 model and its Adam(W) optimizer, which
// `torch.distributed.checkpoint.load` reads at any world size (DCP reshards
// on load) and `set_model_state_dict` / `set_optimizer_state_dict` apply:
//
//   model.<name>                          the fp32 master (trainable params), or
//                                         the module's tensor (frozen params,
//                                         buffers) in its dtype
//   optim.state.<name>.exp_avg|exp_avg_sq the optimizer's per-element states
//   optim.state.<name>.step               0-d float32, as torch's Adam keeps it
//   optim.param_groups.<g>.<hp>           every hyper-parameter of group g
//   optim.param_groups.<g>.params         the group's param names, in order
//
// (get_model_state_dict / get_optimizer_state_dict's default keys, flattened
// by dcp.save.) Every entry is one chunk covering the whole tensor. Files are
// named as FileSystemWriter names them (`__{rank}_{n}.distcp`): one file per
// unit, `__0_<unit>.distcp`, holding the unit's entries back to back, each a
// torch.save archive as written to a stream (records `archive/...`, zip
// offsets relative to the item), as DCP's own items are: a param's file holds
// its model entry, then its optimizer states and step; the last file every
// group's hyper-parameters and param names. `.metadata` (a pickle of
// torch.distributed.checkpoint.metadata.Metadata, protocol 2, torch.Size as
// plain tuples, no storage_meta) gives each entry's file, offset and length.
// Nothing in it executes code beyond DCP's own dataclasses, torch dtypes and
// the layout/memory-format constructors torch's own metadata names. One unit
// per param: threads and MPI ranks share the work as for every ucp writer.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto plan, dcp::PlanDcp(state, options));
//   UCP_ASSIGN_OR_RETURN(writers::WriteStats s, writers::RunPlan(*plan, "/out/step4_dcp", run));
#ifndef UCP_FORMATS_DCP_DCP_WRITER_H_
#define UCP_FORMATS_DCP_DCP_WRITER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "writers/plan.h"
#include "writers/target_options.h"

namespace ucp::dcp {

// The metadata file's name in a DCP folder.
inline constexpr char kMetadataFile[] = ".metadata";

absl::StatusOr<std::unique_ptr<writers::Plan>> PlanDcp(const state::ModelState& state,
                                                      const writers::UniversalWriteOptions& options);

}  // namespace ucp::dcp

#endif  // UCP_FORMATS_DCP_DCP_WRITER_H_
