// DeepSpeed's native mixture of experts (ZeRO 1/2 with expert parallelism), as a source (moe_state.h: layer_L_expert_E_mp_rank_XX files,
// experts under global ids) and as a target (moe_writer.h, at any dp and expert parallel degree), registered under "deepspeed_moe" (kind "moe").
//
// Example:
//   formats::Registry r;
//   deepspeed_moe::Register(r);
#ifndef UCP_FORMATS_DEEPSPEED_MOE_FORMAT_H_
#define UCP_FORMATS_DEEPSPEED_MOE_FORMAT_H_

#include "formats/format.h"

namespace ucp::deepspeed_moe {

inline constexpr char kName[] = "deepspeed_moe";
inline constexpr char kKind[] = "moe";

void Register(formats::Registry& registry);

}  // namespace ucp::deepspeed_moe

#endif  // UCP_FORMATS_DEEPSPEED_MOE_FORMAT_H_
