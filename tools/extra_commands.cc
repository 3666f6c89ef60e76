#include "tools/commands.h"

#include "conformance/commands.h"

namespace ucp::tools {

std::vector<Command> ExtraCommands() {
  return {
      {"fuzz", &conformance::RunFuzzCommand},
      {"golden", &conformance::RunGoldenCommand},
      {"demo", &conformance::RunDemoCommand},
  };
}

}  // namespace ucp::tools
