// UniversalCheckpoint: a universal checkpoint folder (written by ucp or by
// deepspeed/checkpoint/ds_to_universal.py), opened and checked, with lazy
// access to each param's state files.
//
//   <dir>/mp_rank_XX_model_states.pt   the source's model states (topology, groups)
//   <dir>/zero/optimizer_state.pt      the unsharded optimizer state
//   <dir>/zero/<param>/<state>.pt      {'param': full tensor, metadata keys}
//   <dir>/zero/<param>/step.pt         the step
//   <dir>/ucp_module/<name>.pt         ucp only: frozen params and buffers
//   <dir>/ucp_manifest.textproto       ucp only: rules, layout, sha256 of files
//
// The merge rule of a param comes from the ucp manifest when there is one,
// else from its files' metadata exactly as DeepSpeed's loader reads it
// (`cat_dim`, `vocab_tensor`, `param_n_sub_params`, `sub_param_shape`; no
// metadata = replicated), never from a shape comparison.
#ifndef UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_CHECKPOINT_H_
#define UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_CHECKPOINT_H_

#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/model_states_files.h"
#include "deepspeed/read_options.h"
#include "format/torch/tensor.h"
#include "format/torch/mapped_file.h"
#include "format/torch/torch_file.h"
#include "proto/ucp.pb.h"

namespace ucp::deepspeed_universal {

// One `<state>.pt` of a param: its tensor and the rule its metadata implies.
struct UniversalStateFile {
  std::shared_ptr<const torch::TorchFile> file;
  torch::Tensor param;
  MergeRule rule;  // from the metadata keys (pattern = the param name)
};

// Whether `path` is a universal checkpoint folder (or a root whose
// latest_universal names one): it has `zero/`; or, without optimizer files
// of its own (a ZeRO tag folder), a latest_universal and no latest.
bool LooksLikeUniversalFolder(const std::string& path);

// Compares every file `manifest` lists (paths relative to `dir`) with its
// size and digest (XXH3-128 or SHA-256); kDataLoss naming the first that differs.
absl::Status VerifyManifestDigests(const std::string& dir, const Manifest& manifest);
// The folder's ucp manifest read and every file it lists verified
// (VerifyManifestDigests), as UniversalCheckpoint::Open does with
// verify_checksums; kFailedPrecondition for a folder without one (not written
// by ucp).
absl::Status VerifyManifestChecksums(const std::string& dir);

class UniversalCheckpoint {
 public:
  struct Options {
    // Check every file against the manifest's sha256 while opening.
    bool verify_checksums = false;
    // How files are opened (unsafe pickle globals refused unless allowed).
    deepspeed::ReadOptions read;
    // Most state files kept open (memory-mapped) at once.
    size_t max_open_files = 1024;
    // What another process (an MPI job's rank 0) read of this folder: its
    // manifest, or one it made of a folder without (every file listed), used
    // instead of reading and listing the folder again.
    std::optional<Manifest> given_manifest;
  };
  // `path`: the universal folder, or a root holding `latest_universal`.
  static absl::StatusOr<std::unique_ptr<UniversalCheckpoint>> Open(const std::string& path, const Options& options);
  static absl::StatusOr<std::unique_ptr<UniversalCheckpoint>> Open(const std::string& path) {
    return Open(path, Options());
  }

  const std::string& dir() const { return dir_; }
  const std::string& tag() const { return tag_; }
  const deepspeed::ModelStatesFiles& model_states() const { return *ms_; }
  // Trainable params found under zero/, and the state files each has.
  const std::vector<std::string>& param_names() const { return param_names_; }
  const std::vector<std::string>& StateFiles(const std::string& name) const;
  // Module tensors under ucp_module/ (frozen params, buffers).
  const std::vector<std::string>& module_names() const { return module_names_; }
  const std::optional<Manifest>& manifest() const { return manifest_; }

  // zero/<name>/<state>.pt (cached, thread-safe).
  absl::StatusOr<UniversalStateFile> ReadState(const std::string& name, const std::string& state) const;
  // ucp_module/<name>.pt.
  absl::StatusOr<UniversalStateFile> ReadModule(const std::string& name) const;
  // zero/<name>/step.pt: the file and its root value; null file if absent.
  absl::StatusOr<std::shared_ptr<const torch::TorchFile>> ReadStep(const std::string& name) const;
  const torch::TorchFile& optimizer_state() const { return *optimizer_state_; }

  // The files this process CRC-checks when it opens them
  // (state::CheckpointState::SetCheckedInputs, keys "path|"); null: all.
  void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const {
    std::lock_guard<std::mutex> lock(mu_);
    checked_inputs_ = std::move(keys);
  }

  // Compares every file listed in the manifest with its sha256 and size.
  absl::Status VerifyChecksums() const;

 private:
  UniversalCheckpoint() = default;
  absl::StatusOr<std::shared_ptr<const torch::TorchFile>> OpenCached(const std::string& rel) const;
  absl::StatusOr<UniversalStateFile> ReadParamDict(const std::string& rel, const std::string& name) const;

  std::string dir_, tag_;
  Options options_;
  std::unique_ptr<deepspeed::ModelStatesFiles> ms_;
  std::vector<std::string> param_names_;
  std::map<std::string, std::vector<std::string>> state_files_;
  std::vector<std::string> module_names_;
  std::optional<Manifest> manifest_;
  std::unique_ptr<torch::TorchFile> optimizer_state_;

  mutable std::mutex mu_;
  mutable std::shared_ptr<const std::set<std::string>> checked_inputs_;  // guarded by mu_
  mutable std::list<std::string> lru_;
  mutable std::map<std::string, std::pair<std::shared_ptr<const torch::TorchFile>, std::list<std::string>::iterator>>
      cache_;
};

}  // namespace ucp::deepspeed_universal

#endif  // UCP_FORMATS_DEEPSPEED_UNIVERSAL_UNIVERSAL_CHECKPOINT_H_
