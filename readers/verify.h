// `ucp verify FOLDER`: a checkpoint folder checked end to end, every problem
// reported rather than the first one only.
//
// ZeRO folder: the mp_rank files and their cross-file agreement (topology,
// global_steps / iteration / ds_version), every optimizer file opened and
// checked against the partition math, its CRCs, its step against
// zero_pp_rank_0_mp_rank_00's, its fp32 masters sampled against the lp
// weights of its own tp/pp rank's layer or module file; every layer file and
// its CRCs; the layer files DeepSpeed's loader needs.
// ZeRO-3 and native MoE folders: what Zero3State / MoeState check when they
// open one (steps, partitions, expert layout), and every file's CRCs.
// Universal folder: the manifest's digests (when there is a manifest), every
// state file opened with its CRCs, the step of every param the same.
// DeepSpeed's ZeRO-3 universal layout (which ucp writes but does not read):
// the manifest's digests, every file's CRCs.
// All: pickles naming code-execution globals (UNSAFE), files that shrank
// while read.
#ifndef UCP_READERS_VERIFY_H_
#define UCP_READERS_VERIFY_H_

#include <string>
#include <vector>

namespace ucp::readers {

struct VerifyResult {
  std::string kind;                   // "zero", "zero3", "moe", "universal", "universal (ZeRO-3)"
  std::string dir;                    // the checkpoint folder checked
  int64_t files_checked = 0;
  std::vector<std::string> problems;  // one line each; empty: all good
};

VerifyResult VerifyFolder(const std::string& path);

}  // namespace ucp::readers

#endif  // UCP_READERS_VERIFY_H_
