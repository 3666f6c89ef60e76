// PyTorch Distributed Checkpoint as a source format (dcp_state.h: every
// command reads a DCP folder of a model and its torch optimizer) and as a
// target (dcp_writer.h: `ucp convert --to=dcp`).
#ifndef UCP_FORMATS_DCP_FORMAT_H_
#define UCP_FORMATS_DCP_FORMAT_H_

#include "formats/format.h"

namespace ucp::dcp {

inline constexpr char kName[] = "dcp";

void Register(formats::Registry& registry);

}  // namespace ucp::dcp

#endif  // UCP_FORMATS_DCP_FORMAT_H_
