// `ucp demo`: the end-to-end example, with nothing but ucp.
//
//   1. generate the built-in GPT-NeoX-style model (the DeepSpeed fixtures'
//      shape: hidden 64, 8 layers, vocab 96) and save it as DeepSpeed 0.14.4
//      saves a tp=2 ZeRO-1 PipelineModule checkpoint, without
//      universal_checkpoint_info patterns (the conformance writer,
//      synthetic_state.h);
//   2. convert it with ops::Convert, no extra options;
//   3. reshard the universal checkpoint to tp=1 with ops::Reshard;
//   4. verify every weight, fp32 master, exp_avg and exp_avg_sq of the tp=1
//      checkpoint bitwise against the generated model (its full tensors,
//      i.e. its tp=2 slices merged by its rules);
//   5. summarize: merge kinds per rule source, files, bytes, verification.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(DemoReport r, RunDemo(DemoOptions{.workdir = "/tmp/demo"}));
//   std::cout << r.summary;
#ifndef UCP_CONFORMANCE_DEMO_H_
#define UCP_CONFORMANCE_DEMO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ucp::conformance {

struct DemoOptions {
  std::string workdir;  // "" = a fresh folder under /tmp, removed afterwards
  bool keep = false;    // keep the workdir's checkpoints
  int num_threads = 0;
};

struct DemoReport {
  std::string summary;      // printable
  int64_t verified_tensors = 0;
  std::vector<std::string> mismatches;  // empty when every tensor is bitwise equal
  std::string source, universal, target;  // the folders written
};

absl::StatusOr<DemoReport> RunDemo(const DemoOptions& options);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_DEMO_H_
