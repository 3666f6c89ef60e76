#include "tools/commands.h"

namespace ucp::tools {

std::vector<Command> ExtraCommands() { return {}; }

}  // namespace ucp::tools
