// The conformance suite's subcommands of `ucp` (listed in
// tools/commands.cc): thin flag wiring over properties.h, golden.h and
// demo.h. Each takes argv with argv[0] = the command name and returns the
// process exit code (0 ok, 1 failure or bad usage).
//
//   ucp fuzz --seed=S --cases=N [--properties=abcde] [--case=FILE]
//   ucp golden check --golden=DIR --universal=DIR
//   ucp golden update --golden=DIR
//   ucp golden source --golden=DIR --output=ROOT
//   ucp demo [--workdir=DIR]
#ifndef UCP_CONFORMANCE_COMMANDS_H_
#define UCP_CONFORMANCE_COMMANDS_H_

namespace ucp::conformance {

int RunFuzzCommand(int argc, char** argv);
int RunGoldenCommand(int argc, char** argv);
int RunDemoCommand(int argc, char** argv);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_COMMANDS_H_
