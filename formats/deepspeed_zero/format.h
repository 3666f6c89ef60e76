// The DeepSpeed ZeRO stage 1/2 format (and BF16_Optimizer's), as a source
// (zero_checkpoint.h, zero_state.h: mp_rank_XX_model_states.pt,
// *zero_pp_rank_D_mp_rank_XX_optim_states.pt, layer files) and as a target
// at any tp/pp/dp (zero_writer.h), registered under "deepspeed_zero" (kind
// "zero").
//
// Example:
//   formats::Registry r;
//   deepspeed_zero::Register(r);
#ifndef UCP_FORMATS_DEEPSPEED_ZERO_FORMAT_H_
#define UCP_FORMATS_DEEPSPEED_ZERO_FORMAT_H_

#include "formats/format.h"

namespace ucp::deepspeed_zero {

inline constexpr char kName[] = "deepspeed_zero";
inline constexpr char kKind[] = "zero";

void Register(formats::Registry& registry);

}  // namespace ucp::deepspeed_zero

#endif  // UCP_FORMATS_DEEPSPEED_ZERO_FORMAT_H_
