#include "formats/builtin/builtin.h"

#include "formats/dcp/format.h"
#include "formats/deepspeed_moe/format.h"
#include "formats/deepspeed_universal/format.h"
#include "formats/deepspeed_zero/format.h"
#include "formats/deepspeed_zero0/format.h"
#include "formats/deepspeed_zero3/format.h"
#include "formats/hf/format.h"
#include "formats/weights/format.h"

namespace ucp::formats::builtin {
namespace {

Registry* Build() {
  auto* r = new Registry();
  // Priority order. Sources: the first whose Detect says yes reads a folder
  // (a universal folder's zero/ first; a native MoE folder also has
  // mp_rank_00 files, so before ZeRO 1/2; so is a stage 0 folder, which
  // has nothing else). Training-state targets: the first whose PicksFor
  // says yes writes a reshard.
  deepspeed_universal::Register(*r);
  deepspeed_moe::Register(*r);
  deepspeed_zero3::Register(*r);
  deepspeed_zero0::Register(*r);
  deepspeed_zero::Register(*r);
  weights::Register(*r);
  dcp::Register(*r);
  hf::Register(*r);  // last: a folder of any other format may also hold config.json
  return r;
}

}  // namespace

const Registry& Formats() {
  static const Registry* registry = Build();
  return *registry;
}

}  // namespace ucp::formats::builtin
