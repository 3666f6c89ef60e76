// The universal checkpoint format (written by ucp or by DeepSpeed's
// ds_to_universal.py), as a source (universal_checkpoint.h,
// universal_state.h; DeepSpeed's stage-3 universal layout is verified and
// inspected, zero3_universal.h) and as a target (universal_writer.h, what
// `ucp convert` writes), registered under "deepspeed_universal" (kind
// "universal").
//
// Example:
//   formats::Registry r;
//   deepspeed_universal::Register(r);
#ifndef UCP_FORMATS_DEEPSPEED_UNIVERSAL_FORMAT_H_
#define UCP_FORMATS_DEEPSPEED_UNIVERSAL_FORMAT_H_

#include "formats/format.h"

namespace ucp::deepspeed_universal {

inline constexpr char kName[] = "deepspeed_universal";
inline constexpr char kKind[] = "universal";
// What `ucp verify` calls DeepSpeed's stage-3 universal layout (zero3_universal.h).
inline constexpr char kZero3UniversalKind[] = "universal (ZeRO-3)";

void Register(formats::Registry& registry);

}  // namespace ucp::deepspeed_universal

#endif  // UCP_FORMATS_DEEPSPEED_UNIVERSAL_FORMAT_H_
