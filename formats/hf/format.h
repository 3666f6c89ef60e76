// A Hugging Face model folder (config.json + safetensors) as a source: the
// registry entry of formats/hf (hf_state.h). Registered last in
// formats/builtin: every DeepSpeed or DCP layout detects first, and a
// folder with `latest` (a Trainer's checkpoint-N) resolves to its tag.
#ifndef UCP_FORMATS_HF_FORMAT_H_
#define UCP_FORMATS_HF_FORMAT_H_

#include "formats/format.h"

namespace ucp::hf {

inline constexpr char kName[] = "hf";

void Register(formats::Registry& registry);

}  // namespace ucp::hf

#endif  // UCP_FORMATS_HF_FORMAT_H_
