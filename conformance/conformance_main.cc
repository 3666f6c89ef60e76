// ucp_conformance: the conformance suite's commands (commands.h), apart from
// the shipped `ucp` binary.
//
//   ucp_conformance fuzz --seed=S --cases=N ...
//   ucp_conformance golden check|update|source --golden=DIR ...
#include <cstring>
#include <iostream>

#include "conformance/commands.h"

int main(int argc, char** argv) {
  const char* usage =
      "usage: ucp_conformance COMMAND [FLAGS]   (COMMAND --help for its flags)\n"
      "  fuzz    run the conformance properties on random models and topologies\n"
      "  golden  check (or update) a golden description of a universal checkpoint\n";
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << usage;
    return argc < 2 ? 1 : 0;
  }
  if (std::strcmp(argv[1], "fuzz") == 0) return ucp::conformance::RunFuzzCommand(argc - 1, argv + 1);
  if (std::strcmp(argv[1], "golden") == 0) return ucp::conformance::RunGoldenCommand(argc - 1, argv + 1);
  std::cerr << "ucp_conformance: unknown command '" << argv[1] << "'\n" << usage;
  return 1;
}
