// `ucp demo`, the one conformance command the shipped `ucp` binary has: the
// built-in example (demo.h) behind its flags. It links no RapidCheck and no
// random-model generator (ucp_conformance has `fuzz` and `golden`).
//
//   ucp demo [--workdir=DIR] [--num_threads=N]
#ifndef UCP_CONFORMANCE_DEMO_COMMAND_H_
#define UCP_CONFORMANCE_DEMO_COMMAND_H_

namespace ucp::conformance {

// argv[0] = "demo"; returns the process exit code (0 ok, 1 failure or bad usage).
int RunDemoCommand(int argc, char** argv);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_DEMO_COMMAND_H_
