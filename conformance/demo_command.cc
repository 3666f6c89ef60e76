#include "conformance/demo_command.h"

#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "cli/flags.h"
#include "conformance/demo.h"

namespace ucp::conformance {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "ucp: " << s.message() << " [" << absl::StatusCodeToString(s.code()) << "]\n";
  return 1;
}

}  // namespace

int RunDemoCommand(int argc, char** argv) {
  cli::FlagSet f("demo",
                   "the built-in example: generates a GPT-NeoX-style tp=2 ZeRO-1 checkpoint as DeepSpeed 0.14.4 "
                   "saves it, converts it to a universal checkpoint, reshards that to tp=1, verifies every weight, "
                   "fp32 master, exp_avg and exp_avg_sq bitwise against the generated model, and prints a summary");
  DemoOptions o;
  f.String("workdir", &o.workdir, "where to write the checkpoints (kept); default: a temporary folder, removed");
  f.Int32("num_threads", &o.num_threads, "threads (0 = all cores)");
  auto pos = f.Parse(argc, argv);
  if (!pos.ok()) return Fail(pos.status());
  if (f.help_requested()) {
    std::cout << f.Usage();
    return 0;
  }
  auto r = RunDemo(o);
  if (!r.ok()) return Fail(r.status());
  std::cout << r->summary;
  return r->mismatches.empty() ? 0 : 1;
}

}  // namespace ucp::conformance
