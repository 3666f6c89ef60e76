#include "tools/commands.h"

#include "conformance/demo_command.h"

namespace ucp::tools {

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"inspect", "PATH: what a checkpoint folder (ZeRO or universal) or a .pt file holds", &RunInspect},
      {"convert", "ZeRO checkpoint -> universal checkpoint (drop-in for ds_to_universal.py)", &RunConvert},
      {"reshard", "any checkpoint -> regular ZeRO checkpoint at a new tp/pp/dp", &RunReshard},
      {"export",
       "any checkpoint -> plain weights: safetensors / pytorch_model.bin shards, zero_to_fp32.py's or Hugging Face "
       "names (+ config.json)",
       &RunExport},
      {"verify",
       "FOLDER: check a checkpoint end to end (digests, CRCs, cross-file agreement, unsafe pickles), one line per "
       "problem",
       &RunVerify},
      {"rules", "print the built-in merge-rule presets, or (--suggest) rules for what a checkpoint leaves open", &RunRules},
      {"demo",
       "the built-in example: generate a GPT-NeoX-style tp=2 ZeRO-1 checkpoint, convert it, reshard it to tp=1, "
       "verify it bitwise",
       &conformance::RunDemoCommand},
  };
  return *commands;
}

}  // namespace ucp::tools
