// Comparing checkpoint files and folders the way the acceptance tests, the
// demo and `ucp golden` need it: dict keys in order, scalars exactly, tensors
// by dtype, shape and bytes (not by how the storage is laid out).
#ifndef UCP_TESTING_COMPARE_H_
#define UCP_TESTING_COMPARE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"

namespace ucp::testing {

struct CompareOptions {
  size_t max_differences = 20;
  bool compare_requires_grad = false;
  // Dicts with the same keys in another order are equal.
  bool ignore_key_order = false;
  // CompareFolders: files must be byte-identical (differences are then
  // explained by CompareFiles where it finds any).
  bool byte_identical = false;
};

// Differences between two value trees, as "path: what" lines.
std::vector<std::string> CompareTrees(const torch::TorchFile& a, const pickle::Value& va, const torch::TorchFile& b,
                                      const pickle::Value& vb, const CompareOptions& options = {});
// The same for two files.
absl::StatusOr<std::vector<std::string>> CompareFiles(const std::string& a, const std::string& b,
                                                      const CompareOptions& options = {});
// Every regular file under `dir`, relative paths, sorted (ucp's output
// marker, base/fs.h kUcpOutputMarker, left out).
absl::StatusOr<std::vector<std::string>> ListFilesRecursive(const std::string& dir);
// Two folders: the same relative file names, and each .pt pair equal by
// CompareFiles (other files byte for byte). `ignore` lists relative paths to skip.
absl::StatusOr<std::vector<std::string>> CompareFolders(const std::string& a, const std::string& b,
                                                        const std::vector<std::string>& ignore = {},
                                                        const CompareOptions& options = {});

// A universal folder's one mp_rank_00_model_states.pt (written for a plain
// module saved at tp > 1: writers::UniversalWriteOptions::single_mp_rank_file)
// against the source's tp rank 0 file: every difference but the ones it is
// meant to have (module without tensors, mp_world_size 1, tp_degree 1).
absl::StatusOr<std::vector<std::string>> CompareSingleMpRankFile(const std::string& single,
                                                                 const std::string& source_rank0);

}  // namespace ucp::testing

#endif  // UCP_TESTING_COMPARE_H_
