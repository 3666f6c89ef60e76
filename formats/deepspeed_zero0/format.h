// The DeepSpeed ZeRO stage 0 format (no ZeRO: the optimizer state inside
// mp_rank_00_model_states.pt) as a registry plug-in: a source format
// (zero0_state.h) and a training-state target (zero0_writer.h), which
// `ucp reshard` picks for a stage 0 source unless --zero_stage says
// otherwise, and which --format=deepspeed_zero0 names for any source.
#ifndef UCP_FORMATS_DEEPSPEED_ZERO0_FORMAT_H_
#define UCP_FORMATS_DEEPSPEED_ZERO0_FORMAT_H_

#include "formats/format.h"

namespace ucp::deepspeed_zero0 {

inline constexpr char kName[] = "deepspeed_zero0";
inline constexpr char kKind[] = "zero0";

void Register(formats::Registry& registry);

}  // namespace ucp::deepspeed_zero0

#endif  // UCP_FORMATS_DEEPSPEED_ZERO0_FORMAT_H_
