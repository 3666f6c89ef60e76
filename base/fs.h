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
#include <functional>
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
// Reads a regular file whole. FIFOs, devices and other non-regular files are
// refused without blocking (kFailedPrecondition), and so is a file larger
// than `max_bytes` (kResourceExhausted), before anything is read.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, int64_t max_bytes = INT64_MAX);
// Opens `path` read-only, refusing anything but a regular file without
// blocking on a FIFO; returns the descriptor (the caller closes it).
absl::StatusOr<int> OpenRegularFile(const std::string& path);
absl::StatusOr<int64_t> FileSize(const std::string& path);
// Writes `contents` to a temporary file in the same folder, fsyncs it, renames
// it into place and fsyncs the folder.
absl::Status WriteFileAtomic(const std::string& path, const std::string& contents);
// Copies a file (byte-identical); returns the hex digest of its bytes of the
// kind `digest` says in `*hex` when it is not null. `written`, when given, is
// called after every kCopyStepBytes written (and after the last bytes) with
// the descriptor of `to` and the range just written, e.g. to start writing
// them back (flusher.h StartWriteback) while the copy goes on.
inline constexpr uint64_t kCopyStepBytes = uint64_t{32} << 20;
absl::Status CopyFile(const std::string& from, const std::string& to, std::string* hex = nullptr,
                      DigestKind digest = DigestKind::kSha256,
                      const std::function<void(int fd, uint64_t offset, uint64_t len)>& written = nullptr);
// Reads a file once, in pieces: its size, and its digest in `*hex`.
absl::StatusOr<int64_t> FileDigestOf(const std::string& path, DigestKind digest, std::string* hex);
// Copies a folder tree (cp -r).
absl::Status CopyTree(const std::string& from, const std::string& to);

// The file every ucp output folder holds (written into the staging folder
// first): what --overwrite recognizes as a folder ucp may replace.
inline constexpr char kUcpOutputMarker[] = ".ucp_output";
// True when `path` is a folder a ucp command wrote (it has kUcpOutputMarker,
// or a ucp_manifest.textproto from a universal output), or an empty folder.
bool IsReplaceableOutput(const std::string& path);

// The real path of `path`; for a path that does not exist (yet), the real
// path of its nearest existing ancestor joined with the rest.
std::string ResolvePath(const std::string& path);
// Refuses (kInvalidArgument) an output folder that is one of `inputs`, lies
// inside one of them, or contains one (symlinks, `..` and bind mounts
// resolved): writing or replacing it would destroy the input.
absl::Status CheckOutputApartFromInputs(const std::string& output, const std::vector<std::string>& inputs);

// fsyncs every file and folder under `path` (and `path` itself).
absl::Status SyncTree(const std::string& path);
// fsyncs one folder (after a rename in it).
absl::Status SyncDir(const std::string& path);

// Removes the staging folders (and half-written files) that dead ucp
// processes of this host left in `folder`: names `.NAME.ucp-tmp-HOST-PID`
// whose PID no longer runs on this host. A `.NAME.ucp-old-HOST-PID` (an
// output being replaced when its process died) is removed when NAME exists
// and renamed back to NAME otherwise. Returns what it did, one line each.
std::vector<std::string> RemoveStaleStaging(const std::string& folder);

// SIGINT, SIGTERM and SIGHUP (unless ignored when the process started)
// remove every live staging folder, then end the process by that signal.
// Call once, in main, before any thread starts.
void InstallStagingCleanupOnSignals();

// StagingDir: a temporary sibling `.<name>.ucp-tmp-<host>-<pid>` of the target.
class StagingDir {
 public:
  // Fails with kAlreadyExists if the target exists and !overwrite, and with
  // kFailedPrecondition if overwrite is asked for a target that is not a
  // previous ucp output (IsReplaceableOutput). Stale staging folders of dead
  // processes beside the target are removed first.
  // `sync` (the CLI's --fsync, default true): Commit makes the output
  // durable before renaming it into place, and syncs its parent after.
  // Without it a commit is as durable as cp -r: not crash-safe. On a local
  // ext4, xfs or btrfs (Linux 5.8 or later) that is one syncfs(2) of a folder
  // descriptor opened here, before anything is written (so that it reports
  // every writeback error since; one journal commit for all the files),
  // elsewhere an fsync of every file and folder.
  static absl::StatusOr<StagingDir> Create(const std::string& target, bool overwrite = false, bool sync = true);
  StagingDir(StagingDir&& other) noexcept;
  StagingDir& operator=(StagingDir&& other) noexcept;
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir();

  const std::string& path() const { return tmp_; }
  const std::string& target() const { return target_; }
  // Whether Commit fsyncs (Create's `sync`, kept through moves).
  bool syncs() const { return sync_; }
  // fsyncs the staging folder's files and folders, renames it to the target
  // (replacing an old target when created with overwrite) and fsyncs the
  // parent (no fsync when created without sync). After Commit the destructor does
  // nothing.
  absl::Status Commit();
  // Keeps the staging folder on destruction (ds_to_universal's --keep_temp_folder).
  void Keep();
  // Lines about stale staging folders removed by Create.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  StagingDir() = default;
  void Register();
  void Unregister();
  std::vector<std::string> notes_;
  int id_ = 0;
  std::string target_;
  std::string tmp_;
  bool overwrite_ = false;
  bool sync_ = true;
  bool done_ = false;
  bool keep_ = false;
  int syncfs_fd_ = -1;  // the staging folder, for Commit's syncfs (-1: fsync every file)
};

}  // namespace ucp

#endif  // UCP_BASE_FS_H_
