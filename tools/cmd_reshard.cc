// `ucp reshard`.
#include <iostream>
#include <string>
#include <vector>

#include "ops/reshard.h"
#include "tools/cli.h"
#include "cli/command_flags.h"
#include "tools/commands.h"
#include "cli/progress.h"

namespace ucp::tools {

int RunReshard(int argc, char** argv) {
  FlagSet f("reshard",
            "any checkpoint (universal, or ZeRO read in one pass) -> a regular DeepSpeed ZeRO checkpoint at a target "
            "tp/pp/dp that any DeepSpeed version loads with a plain load_checkpoint");
  ReshardFlags r;
  r.Register(f);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (absl::Status s = r.Finish(); !s.ok()) return Fail(s);
  auto mode = ParseProgressMode(r.progress);
  if (!mode.ok()) return Fail(mode.status());
  ProgressPrinter progress("reshard", *mode);
  r.options.write.progress = progress.Callback();
  r.options.cluster = JobCluster();
  CommandTimings timings("reshard", r.timings);
  auto result = ops::Reshard(r.options);
  timings.Print();
  if (!result.ok()) return Fail(result.status());
  if (!PrintsResults()) return 0;
  if (r.options.dry_run_ranks > 0) {
    std::cout << result->plan;
    return 0;
  }
  for (const auto& n : result->notes) std::cerr << "ucp: note: " << n << "\n";
  std::cout << ReshardReport(r, *result);
  if (!result->trainer_folder.empty()) {
    std::cout << "Hugging Face Trainer folder " << result->trainer_folder << ":\n";
    for (const auto& line : result->trainer_files) std::cout << "  " << line << "\n";
  }
  return 0;
}

}  // namespace ucp::tools
