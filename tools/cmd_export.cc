// `ucp export`.
#include <iostream>
#include <string>
#include <vector>

#include "ops/export.h"
#include "tools/cli.h"
#include "cli/command_flags.h"
#include "tools/commands.h"
#include "cli/progress.h"

namespace ucp::tools {

int RunExport(int argc, char** argv) {
  FlagSet f("export",
            "any checkpoint (ZeRO at any tp/pp/dp, or universal) -> plain weights for inference and the Hugging Face "
            "Hub: safetensors or pytorch_model.bin shards (+ index json), zero_to_fp32.py's tensors and names by "
            "default, or Hugging Face transformers names and config.json");
  ExportFlags e;
  e.Register(f);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (absl::Status s = e.Finish(); !s.ok()) return Fail(s);
  auto mode = ParseProgressMode(e.progress);
  if (!mode.ok()) return Fail(mode.status());
  ProgressPrinter progress("export", *mode);
  e.options.write.progress = progress.Callback();
  CommandTimings timings("export", e.timings);
  auto result = ops::Export(e.options);
  timings.Print();
  if (!result.ok()) return Fail(result.status());
  for (const auto& n : result->notes) std::cerr << "ucp: note: " << n << "\n";
  std::cout << ExportReport(e, *result);
  return 0;
}

}  // namespace ucp::tools
