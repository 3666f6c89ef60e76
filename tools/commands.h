// Subcommands that live outside ucp_main.cc (the conformance suite's demo,
// fuzz and golden), so that the main file stays a table of thin wrappers.
#ifndef UCP_TOOLS_COMMANDS_H_
#define UCP_TOOLS_COMMANDS_H_

#include <vector>

namespace ucp::tools {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);  // argv[0] is the command name
};

std::vector<Command> ExtraCommands();

}  // namespace ucp::tools

#endif  // UCP_TOOLS_COMMANDS_H_
