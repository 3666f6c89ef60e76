// The ucp subcommands: each is a `Run*(argc, argv)` in its own file
// (tools/cmd_*.cc, argv[0] is the command name) listed in Commands(), which
// ucp_main.cc dispatches on and prints as usage.
#ifndef UCP_TOOLS_COMMANDS_H_
#define UCP_TOOLS_COMMANDS_H_

#include <vector>

namespace ucp::tools {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

// In the order `ucp --help` lists them.
const std::vector<Command>& Commands();

int RunInspect(int argc, char** argv);
int RunConvert(int argc, char** argv);
int RunReshard(int argc, char** argv);
int RunExport(int argc, char** argv);
int RunRules(int argc, char** argv);
int RunVerify(int argc, char** argv);

}  // namespace ucp::tools

#endif  // UCP_TOOLS_COMMANDS_H_
