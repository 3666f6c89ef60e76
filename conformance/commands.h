// The conformance suite's commands, in a binary of their own
// (//conformance:ucp_conformance, conformance_main.cc) so that the shipped
// `ucp` links no RapidCheck and no random-model generator (`ucp demo` is
// demo_command.h): thin flag wiring over properties.h and golden.h. Each
// takes argv with argv[0] = the command name and returns the process exit
// code (0 ok, 1 failure or bad usage).
//
//   ucp_conformance fuzz --seed=S --cases=N [--properties=abcde] [--case=FILE]
//   ucp_conformance golden check --golden=DIR --universal=DIR
//   ucp_conformance golden update --golden=DIR
//   ucp_conformance golden source --golden=DIR --output=ROOT
#ifndef UCP_CONFORMANCE_COMMANDS_H_
#define UCP_CONFORMANCE_COMMANDS_H_

namespace ucp::conformance {

int RunFuzzCommand(int argc, char** argv);
int RunGoldenCommand(int argc, char** argv);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_COMMANDS_H_
