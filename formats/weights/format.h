// The weights-only target formats of `ucp export` (export_writer.h):
// "safetensors" (model.safetensors, sharded with an index) and "torch"
// (pytorch_model.bin), as Hugging Face and DeepSpeed's zero_to_fp32.py lay
// them out.
//
// Example:
//   formats::Registry r;
//   weights::Register(r);
#ifndef UCP_FORMATS_WEIGHTS_FORMAT_H_
#define UCP_FORMATS_WEIGHTS_FORMAT_H_

#include "formats/format.h"

namespace ucp::weights {

inline constexpr char kSafetensors[] = "safetensors";
inline constexpr char kTorch[] = "torch";

void Register(formats::Registry& registry);

}  // namespace ucp::weights

#endif  // UCP_FORMATS_WEIGHTS_FORMAT_H_
