// `ucp convert`.
#include <iostream>
#include <string>
#include <vector>

#include "ops/convert.h"
#include "tools/cli.h"
#include "cli/command_flags.h"
#include "tools/commands.h"
#include "cli/progress.h"

namespace ucp::tools {

int RunConvert(int argc, char** argv) {
  FlagSet f("convert",
            "DeepSpeed ZeRO checkpoint -> universal checkpoint (a drop-in for deepspeed/checkpoint/ds_to_universal.py "
            "that merges every param's tp slices by an explicit rule)");
  ConvertFlags c;
  c.Register(f);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (absl::Status s = c.Finish(); !s.ok()) return Fail(s);
  auto mode = ParseProgressMode(c.progress);
  if (!mode.ok()) return Fail(mode.status());
  ProgressPrinter progress("convert", *mode);
  c.options.write.progress = progress.Callback();
  c.options.cluster = JobCluster();
  CommandTimings timings("convert", c.timings);
  auto result = ops::Convert(c.options);
  timings.Print();
  if (!result.ok()) return Fail(result.status());
  if (!PrintsResults()) return 0;
  if (c.options.dry_run_ranks > 0) {
    std::cout << result->plan;
    return 0;
  }
  for (const auto& w : result->warnings) std::cerr << "ucp: note: " << w << "\n";
  std::cout << ConvertReport(c, *result);
  if (!result->trainer_folder.empty()) {
    std::cout << "Hugging Face Trainer folder " << result->trainer_folder
              << " (resume with \"checkpoint\": {\"load_universal\": true} in the DeepSpeed config):\n";
    for (const auto& line : result->trainer_files) std::cout << "  " << line << "\n";
  }
  return 0;
}

}  // namespace ucp::tools
