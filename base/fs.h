// Small POSIX file-system helpers with Abseil statuses, and `StagingDir`, the
// way every ucp output is written: into a temporary folder beside the target,
// renamed into place only when complete, removed on any failure.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::Create("/ckpt/step4_universal"));
//   ... write files under staging.path() ...
//   UCP_RETURN_IF_ERROR(staging.Commit());   // rename(2) into place
//   UCP_RETURN_IF_ERROR(WriteFileAtomic("/ckpt/latest_universal", "step4_universal"));
#ifndef UCP_BASE_FS_H_
#define UCP_BASE_FS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/digest.h"

namespace ucp {

std::string JoinPath(const std::string& a, const std::string& b);
std::string Dirname(const std::string& path);
std::string Basename(const std::string& path);
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
// mkdir -p.
absl::Status MakeDirs(const std::string& path);
// rm -rf; OK when the path does not exist.
absl::Status RemoveTree(const std::string& path);
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);  // sorted, no . and ..
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::StatusOr<int64_t> FileSize(const std::string& path);
// Writes `contents` to a temporary file in the same folder and renames it.
absl::Status WriteFileAtomic(const std::string& path, const std::string& contents);
// Copies a file (byte-identical); returns the hex digest of its bytes of the
// kind `digest` says in `*hex` when it is not null.
absl::Status CopyFile(const std::string& from, const std::string& to, std::string* hex = nullptr,
                      DigestKind digest = DigestKind::kSha256);
// Reads a file once, in pieces: its size, and its digest in `*hex`.
absl::StatusOr<int64_t> FileDigestOf(const std::string& path, DigestKind digest, std::string* hex);
// Copies a folder tree (cp -r).
absl::Status CopyTree(const std::string& from, const std::string& to);

// StagingDir: a temporary sibling `.<name>.ucp-tmp-<pid>` of the target.
class StagingDir {
 public:
  // Fails with kAlreadyExists if the target exists and !overwrite.
  static absl::StatusOr<StagingDir> Create(const std::string& target, bool overwrite = false);
  StagingDir(StagingDir&& other) noexcept;
  StagingDir& operator=(StagingDir&& other) noexcept;
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir();

  const std::string& path() const { return tmp_; }
  const std::string& target() const { return target_; }
  // Renames the staging folder to the target (replacing an old target when
  // created with overwrite). After Commit the destructor does nothing.
  absl::Status Commit();
  // Keeps the staging folder on destruction (ds_to_universal's --keep_temp_folder).
  void Keep() { keep_ = true; }

 private:
  StagingDir() = default;
  std::string target_;
  std::string tmp_;
  bool overwrite_ = false;
  bool done_ = false;
  bool keep_ = false;
};

}  // namespace ucp

#endif  // UCP_BASE_FS_H_
