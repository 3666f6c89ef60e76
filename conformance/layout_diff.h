// Layout comparison of two checkpoint folders, for tests that hold what
// ucp writes against the files a real DeepSpeed wrote (the fixtures): the same
// files, and in each the same value tree but for tensor values: kinds, dict
// keys in order, sequence lengths, scalars; tensors by dtype, shape, storage
// size, offset and requires_grad. ZeroStageEnum compares by stage, whatever
// its encoding. Top-level keys whose values depend on the job (ds_config,
// args, rng states, iteration, global_steps, global_samples,
// universal_checkpoint_info) are skipped.
#ifndef UCP_CONFORMANCE_LAYOUT_DIFF_H_
#define UCP_CONFORMANCE_LAYOUT_DIFF_H_

#include <string>
#include <vector>

namespace ucp::conformance {

// One line per difference, "FILE: PATH: what"; empty when the layouts agree.
// module_storage false: the tensors of a top-level `module` dict compare
// without their storage size and offset (DeepSpeed before 0.19 saved a MoE
// module's tensors as views into each param group's whole flat buffer).
std::vector<std::string> LayoutDiffs(const std::string& ours, const std::string& theirs, bool module_storage = true);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_LAYOUT_DIFF_H_
