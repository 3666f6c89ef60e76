// The DeepSpeed ZeRO stage 3 format, as a source (zero3_state.h: zero_pp_rank_D_mp_rank_00_model_states.pt and
// *zero_pp_rank_D_mp_rank_00_optim_states.pt at any dp) and as a target (zero3_writer.h, at any dp and
// sub_group_size), registered under "deepspeed_zero3" (kind "zero3").
//
// Example:
//   formats::Registry r;
//   deepspeed_zero3::Register(r);
#ifndef UCP_FORMATS_DEEPSPEED_ZERO3_FORMAT_H_
#define UCP_FORMATS_DEEPSPEED_ZERO3_FORMAT_H_

#include "formats/format.h"

namespace ucp::deepspeed_zero3 {

inline constexpr char kName[] = "deepspeed_zero3";
inline constexpr char kKind[] = "zero3";

void Register(formats::Registry& registry);

}  // namespace ucp::deepspeed_zero3

#endif  // UCP_FORMATS_DEEPSPEED_ZERO3_FORMAT_H_
