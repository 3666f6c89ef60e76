// `ucp verify`.
#include <iostream>
#include <string>
#include <vector>

#include "ops/inspect.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace ucp::tools {

int RunVerify(int argc, char** argv) {
  FlagSet f("verify",
            "check a checkpoint folder (ZeRO or universal) end to end: manifest digests, every CRC, cross-file "
            "agreement (steps, versions, topology, fp32 masters against lp weights), unsafe pickles. Prints one line "
            "per problem and exits 1 if there is any. Usage: ucp verify FOLDER");
  std::string source_options;
  f.String("source_option", &source_options, cli::kSourceOptionHelp);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (positional.size() != 1) return Fail(absl::InvalidArgumentError("usage: ucp verify FOLDER"));
  formats::SourceOptions options;
  if (absl::Status s = cli::ParseSourceOptions(source_options, &options.format_options); !s.ok()) return Fail(s);
  const formats::VerifyResult r = ops::Verify(positional[0], options);
  for (const std::string& p : r.problems) std::cout << "PROBLEM " << p << "\n";
  if (!r.problems.empty()) {
    std::cout << r.dir << ": " << r.problems.size() << " problem(s) (" << r.kind << " checkpoint, "
              << r.files_checked << " files checked)\n";
    return 1;
  }
  std::cout << r.dir << ": OK (" << r.kind << " checkpoint, " << r.files_checked << " files checked)\n";
  return 0;
}

}  // namespace ucp::tools
