#include "base/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "base/parallel.h"

#include "absl/strings/str_cat.h"
#include "base/phases.h"
#include "base/sha256.h"

namespace ucp {
namespace {

absl::Status ErrnoError(const std::string& path, const char* what) {
  const int e = errno;
  const std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == EEXIST) return absl::AlreadyExistsError(msg);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  if (e == ENOSPC) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return absl::StrCat(a, "/", b);
}

std::string Dirname(const std::string& path) {
  std::string s = path;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const size_t slash = s.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return s.substr(0, slash);
}

std::string Basename(const std::string& path) {
  std::string s = path;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const size_t slash = s.rfind('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty() || IsDirectory(path)) return absl::OkStatus();
  const std::string parent = Dirname(path);
  if (parent != path) {
    absl::Status s = MakeDirs(parent);
    if (!s.ok()) return s;
  }
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoError(path, "cannot create folder");
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError(path, "cannot stat");
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* d = opendir(path.c_str());
    if (d == nullptr) return ErrnoError(path, "cannot list");
    std::vector<std::string> children;
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") children.push_back(JoinPath(path, n));
    }
    closedir(d);
    for (const auto& c : children) {
      absl::Status s = RemoveTree(c);
      if (!s.ok()) return s;
    }
    if (rmdir(path.c_str()) != 0) return ErrnoError(path, "cannot remove folder");
    return absl::OkStatus();
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError(path, "cannot remove");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return ErrnoError(path, "cannot list folder");
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<int> OpenRegularFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(path, "cannot open");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError(path, "cannot stat");
    close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    const char* what = S_ISFIFO(st.st_mode)  ? "a FIFO"
                       : S_ISCHR(st.st_mode) ? "a character device"
                       : S_ISBLK(st.st_mode) ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISDIR(st.st_mode) ? "a folder"
                                             : "not a regular file";
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", what, ", expected a regular file"));
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<int> opened = OpenRegularFile(path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size > max_bytes) {
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": ", st.st_size, " bytes, more than the ", max_bytes, " expected of this file"));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError(path, "cannot read");
      close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": more than the ", max_bytes, " bytes expected of this file (it grew while read)"));
    }
  }
  close(fd);
  return out;
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoError(path, "cannot stat");
  return static_cast<int64_t>(st.st_size);
}

namespace {

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0) return "localhost";
  std::string h(buf);
  for (char& c : h) {
    if (c == '/' || c == 0) c = '_';
  }
  return h;
}

const std::string& ThisHost() {
  static const std::string* host = new std::string(HostName());
  return *host;
}

// `.NAME.ucp-tmp-HOST-PID` (kind "tmp") or `.NAME.ucp-old-HOST-PID` ("old").
std::string TempName(const std::string& name, const char* kind) {
  return absl::StrCat(".", name, ".ucp-", kind, "-", ThisHost(), "-", getpid());
}

}  // namespace

absl::Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  const std::string tmp = JoinPath(Dirname(path), TempName(Basename(path), "tmp"));
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(tmp, "cannot create");
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError(tmp, "cannot write");
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    absl::Status s = ErrnoError(tmp, "cannot fsync");
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  if (close(fd) != 0) {
    absl::Status s = ErrnoError(tmp, "cannot close");
    unlink(tmp.c_str());
    return s;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoError(path, "cannot rename into place");
    unlink(tmp.c_str());
    return s;
  }
  return SyncDir(Dirname(path));
}

absl::StatusOr<int64_t> FileDigestOf(const std::string& path, DigestKind digest, std::string* hex) {
  absl::StatusOr<int> opened = OpenRegularFile(path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  StreamDigest hash(digest);
  std::vector<char> buf(size_t{1} << 20);
  int64_t total = 0;
  while (true) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError(path, "cannot read");
      close(fd);
      return s;
    }
    if (n == 0) break;
    hash.Update(buf.data(), static_cast<size_t>(n));
    total += n;
  }
  close(fd);
  *hex = hash.HexDigest();
  return total;
}

absl::Status CopyFile(const std::string& from, const std::string& to, std::string* hex, DigestKind digest,
                      const std::function<void(int fd, uint64_t offset, uint64_t len)>& written) {
  absl::StatusOr<int> opened = OpenRegularFile(from);
  if (!opened.ok()) return opened.status();
  const int in = *opened;
  const int out = open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    absl::Status s = ErrnoError(to, "cannot create");
    close(in);
    return s;
  }
  StreamDigest hash(digest);
  std::vector<char> buf(size_t{4} << 20);
  absl::Status status;
  uint64_t pos = 0, reported = 0;  // bytes written, and reported to `written`
  while (true) {
    const ssize_t n = read(in, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      status = ErrnoError(from, "cannot read");
      break;
    }
    if (n == 0) break;
    if (hex != nullptr) hash.Update(buf.data(), static_cast<size_t>(n));
    size_t done = 0;
    while (done < static_cast<size_t>(n)) {
      const ssize_t w = write(out, buf.data() + done, static_cast<size_t>(n) - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        status = ErrnoError(to, "cannot write");
        break;
      }
      done += static_cast<size_t>(w);
    }
    if (!status.ok()) break;
    pos += static_cast<uint64_t>(n);
    if (written && pos >= reported + kCopyStepBytes) {
      written(out, reported, pos - reported);
      reported = pos;
    }
  }
  if (status.ok() && written && pos > reported) written(out, reported, pos - reported);
  close(in);
  if (close(out) != 0 && status.ok()) status = ErrnoError(to, "cannot close");
  if (!status.ok()) {
    unlink(to.c_str());
    return status;
  }
  if (hex != nullptr) *hex = hash.HexDigest();
  return absl::OkStatus();
}

absl::Status CopyTree(const std::string& from, const std::string& to) {
  absl::Status s = MakeDirs(to);
  if (!s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(from);
  if (!names.ok()) return names.status();
  for (const auto& n : *names) {
    const std::string a = JoinPath(from, n), b = JoinPath(to, n);
    s = IsDirectory(a) ? CopyTree(a, b) : CopyFile(a, b);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

bool IsReplaceableOutput(const std::string& path) {
  if (!IsDirectory(path)) return false;
  if (PathExists(JoinPath(path, kUcpOutputMarker)) || PathExists(JoinPath(path, "ucp_manifest.textproto"))) {
    return true;
  }
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(path);
  return names.ok() && names->empty();
}

std::string ResolvePath(const std::string& path_in) {
  std::string path = path_in.empty() ? "." : path_in;
  std::string rest;
  while (true) {
    char buf[PATH_MAX];
    if (realpath(path.c_str(), buf) != nullptr) return rest.empty() ? std::string(buf) : JoinPath(buf, rest);
    const std::string parent = Dirname(path);
    const std::string base = Basename(path);
    if (parent == path) return JoinPath(path, rest);
    if (base != "." && !base.empty()) rest = rest.empty() ? base : JoinPath(base, rest);
    path = parent;
  }
}

namespace {

struct DevIno {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const DevIno& o) const { return dev == o.dev && ino == o.ino; }
};

bool StatOf(const std::string& path, DevIno* out) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  *out = {st.st_dev, st.st_ino};
  return true;
}

// The existing folders from `path` (resolved) up to /, as (dev, inode).
std::vector<DevIno> AncestorsOrSelf(const std::string& resolved) {
  std::vector<DevIno> out;
  std::string p = resolved;
  while (true) {
    DevIno d;
    if (StatOf(p, &d)) out.push_back(d);
    const std::string parent = Dirname(p);
    if (parent == p) break;
    p = parent;
  }
  return out;
}

}  // namespace

absl::Status CheckOutputApartFromInputs(const std::string& output, const std::vector<std::string>& inputs) {
  const std::string out = ResolvePath(output);
  const std::vector<DevIno> out_chain = AncestorsOrSelf(out);
  DevIno out_self;
  const bool out_exists = StatOf(out, &out_self);
  for (const std::string& in_path : inputs) {
    if (in_path.empty()) continue;
    const std::string in = ResolvePath(in_path);
    DevIno in_self;
    if (!StatOf(in, &in_self)) continue;
    // The output is the input or lies inside it.
    bool inside = out == in || absl::StartsWith(out, in + "/");
    for (const DevIno& d : out_chain) inside |= d == in_self;
    if (inside) {
      return absl::InvalidArgumentError(absl::StrCat(
          output, ": the output folder ", out == in ? "is" : "lies inside", " the input ", in_path,
          " (refused, --overwrite included: writing there would change or destroy the input; choose a folder "
          "outside it)"));
    }
    // The output contains the input: replacing it would delete the input.
    bool contains = absl::StartsWith(in, out + "/");
    if (out_exists) {
      for (const DevIno& d : AncestorsOrSelf(in)) contains |= d == out_self;
    }
    if (contains) {
      return absl::InvalidArgumentError(absl::StrCat(
          output, ": the output folder contains the input ", in_path,
          " (refused, --overwrite included: replacing it would delete the input; choose a folder outside it)"));
    }
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open folder to fsync");
  if (fsync(fd) != 0 && errno != EINVAL) {
    absl::Status s = ErrnoError(path, "cannot fsync folder");
    close(fd);
    return s;
  }
  close(fd);
  return absl::OkStatus();
}

namespace {

absl::Status ListTree(const std::string& path, std::vector<std::string>* files, std::vector<std::string>* dirs) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(path);
  if (!names.ok()) return names.status();
  for (const auto& n : *names) {
    const std::string p = JoinPath(path, n);
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) return ErrnoError(p, "cannot stat");
    if (S_ISDIR(st.st_mode)) {
      absl::Status s = ListTree(p, files, dirs);
      if (!s.ok()) return s;
    } else if (S_ISREG(st.st_mode)) {
      files->push_back(p);
    }
  }
  dirs->push_back(path);  // after its children
  return absl::OkStatus();
}

absl::Status SyncFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open to fsync");
  if (fsync(fd) != 0) {
    absl::Status s = ErrnoError(path, "cannot fsync");
    close(fd);
    return s;
  }
  close(fd);
  return absl::OkStatus();
}

// syncfs(2) reports writeback errors since Linux 5.8; before, it returned 0
// whatever happened, and the per-file fsyncs must follow it.
bool KernelReportsSyncfsErrors() {
  static const bool reports = [] {
    struct utsname u;
    if (uname(&u) != 0) return false;
    int major = 0, minor = 0;
    if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
    return major > 5 || (major == 5 && minor >= 8);
  }();
  return reports;
}

// Whether one syncfs(2) is the cheaper way to make a folder's new files
// durable: on a local journaling filesystem each fsync commits the journal
// (and flushes the disk's cache), a syncfs does it once for all of them (a
// universal checkpoint has hundreds of files). Elsewhere (NFS, Lustre, GPFS,
// ...) a syncfs may flush far more than this folder: one fsync per file.
bool SyncfsIsCheaper(const std::string& path) {
  struct statfs fs;
  if (statfs(path.c_str(), &fs) != 0) return false;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53UL:      // ext2, ext3, ext4
    case 0x58465342UL:  // xfs
    case 0x9123683EUL:  // btrfs
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status SyncTree(const std::string& path) {
  std::vector<std::string> files, dirs;
  absl::Status s = ListTree(path, &files, &dirs);
  if (!s.ok()) return s;
  s = ParallelFor(files.size(), 0, [&](size_t i) { return SyncFile(files[i]); });
  if (!s.ok()) return s;
  for (const auto& d : dirs) {
    s = SyncDir(d);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// `.NAME.ucp-KIND-HOST-PID`: NAME, KIND ("tmp", "old"), HOST, PID.
struct TempEntry {
  std::string name, kind, host;
  pid_t pid = 0;
};

bool ParseTempName(const std::string& entry, TempEntry* out) {
  if (entry.empty() || entry[0] != '.') return false;
  for (const char* kind : {"tmp", "old"}) {
    const std::string mark = absl::StrCat(".ucp-", kind, "-");
    const size_t at = entry.rfind(mark);
    if (at == std::string::npos || at < 1) continue;
    const std::string tail = entry.substr(at + mark.size());
    const size_t dash = tail.rfind('-');
    if (dash == std::string::npos || dash == 0) continue;
    int64_t pid = 0;
    if (!absl::SimpleAtoi(tail.substr(dash + 1), &pid) || pid <= 0 || pid > INT_MAX) continue;
    out->name = entry.substr(1, at - 1);
    out->kind = kind;
    out->host = tail.substr(0, dash);
    out->pid = static_cast<pid_t>(pid);
    return true;
  }
  return false;
}

bool ProcessIsGone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

std::vector<std::string> RemoveStaleStaging(const std::string& folder) {
  std::vector<std::string> notes;
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(folder);
  if (!names.ok()) return notes;
  for (const std::string& n : *names) {
    TempEntry e;
    if (!ParseTempName(n, &e)) continue;
    // Another host's process may be alive (a shared file system): only this
    // host's dead processes are known to be dead.
    if (e.host != ThisHost() || e.pid == getpid() || !ProcessIsGone(e.pid)) continue;
    const std::string path = JoinPath(folder, n);
    if (e.kind == "old" && !PathExists(JoinPath(folder, e.name))) {
      if (rename(path.c_str(), JoinPath(folder, e.name).c_str()) == 0) {
        notes.push_back(absl::StrCat("restored ", JoinPath(folder, e.name), " from ", path, " (process ", e.pid,
                                     " died while replacing it)"));
      }
      continue;
    }
    if (RemoveTree(path).ok()) {
      notes.push_back(absl::StrCat("removed ", path, ", left by process ", e.pid, " which is gone"));
    }
  }
  return notes;
}

// ---- the live staging folders, for the signal thread ----
namespace {

struct LiveStaging {
  std::mutex mu;
  int next_id = 1;
  std::map<int, std::string> paths;  // id -> staging path (not kept)
};

LiveStaging& Live() {
  static LiveStaging* live = new LiveStaging();
  return *live;
}

void CleanupAndDie(int sig) {
  {
    std::lock_guard<std::mutex> lock(Live().mu);  // waits for a Commit in progress
    for (const auto& [id, path] : Live().paths) {
      // Out of the way first, so that no worker thread adds to it, then gone.
      const std::string dead = absl::StrCat(path, "-dead");
      if (rename(path.c_str(), dead.c_str()) == 0) (void)RemoveTree(dead);
      (void)RemoveTree(path);
    }
    Live().paths.clear();
    // Keep the lock: no staging folder may be committed from now on.
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    raise(sig);
    _exit(128 + sig);
  }
}

}  // namespace

void InstallStagingCleanupOnSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;  // e.g. nohup
    sigaddset(&set, sig);
  }
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return;
  std::thread([set]() {
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    CleanupAndDie(sig);
  }).detach();
}

void StagingDir::Register() {
  std::lock_guard<std::mutex> lock(Live().mu);
  id_ = Live().next_id++;
  Live().paths[id_] = tmp_;
}

void StagingDir::Unregister() {
  if (id_ == 0) return;
  std::lock_guard<std::mutex> lock(Live().mu);
  Live().paths.erase(id_);
  id_ = 0;
}

void StagingDir::Keep() {
  keep_ = true;
  Unregister();
}

absl::StatusOr<StagingDir> StagingDir::Create(const std::string& target_in, bool overwrite, bool sync) {
  std::string target = target_in;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  if (target.empty()) return absl::InvalidArgumentError("the output folder is empty");
  if (PathExists(target) && !overwrite) {
    return absl::AlreadyExistsError(absl::StrCat(target, ": output folder already exists (remove it or pass --overwrite)"));
  }
  if (PathExists(target) && !IsReplaceableOutput(target)) {
    return absl::FailedPreconditionError(absl::StrCat(
        target, ": exists and is not a ucp output (no ", kUcpOutputMarker,
        " or ucp_manifest.textproto in it); --overwrite only replaces a previous ucp output: move it away yourself"));
  }
  const std::string parent = Dirname(target);
  absl::Status s = MakeDirs(parent);
  if (!s.ok()) return s;
  StagingDir d;
  d.notes_ = RemoveStaleStaging(parent);
  d.target_ = target;
  d.overwrite_ = overwrite;
  d.sync_ = sync;
  d.tmp_ = JoinPath(parent, TempName(Basename(target), "tmp"));
  s = RemoveTree(d.tmp_);
  if (!s.ok()) return s;
  if (mkdir(d.tmp_.c_str(), 0755) != 0) return ErrnoError(d.tmp_, "cannot create staging folder");
  d.Register();
  if (sync && KernelReportsSyncfsErrors() && SyncfsIsCheaper(d.tmp_)) {
    d.syncfs_fd_ = open(d.tmp_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // -1: per-file fsyncs
  }
  s = WriteFileAtomic(JoinPath(d.tmp_, kUcpOutputMarker), "written by ucp; `ucp --overwrite` may replace this folder\n");
  if (!s.ok()) return s;
  return d;
}

StagingDir::StagingDir(StagingDir&& o) noexcept
    : notes_(std::move(o.notes_)), id_(o.id_), target_(std::move(o.target_)), tmp_(std::move(o.tmp_)),
      overwrite_(o.overwrite_), sync_(o.sync_), done_(o.done_), keep_(o.keep_), syncfs_fd_(o.syncfs_fd_) {
  o.done_ = true;
  o.id_ = 0;
  o.syncfs_fd_ = -1;
  if (id_ != 0) {
    std::lock_guard<std::mutex> lock(Live().mu);
    Live().paths[id_] = tmp_;
  }
}

StagingDir& StagingDir::operator=(StagingDir&& o) noexcept {
  if (this != &o) {
    if (!done_ && !keep_) (void)RemoveTree(tmp_);
    Unregister();
    notes_ = std::move(o.notes_);
    id_ = o.id_;
    target_ = std::move(o.target_);
    tmp_ = std::move(o.tmp_);
    overwrite_ = o.overwrite_;
    sync_ = o.sync_;
    done_ = o.done_;
    keep_ = o.keep_;
    if (syncfs_fd_ >= 0) close(syncfs_fd_);
    syncfs_fd_ = o.syncfs_fd_;
    o.done_ = true;
    o.id_ = 0;
    o.syncfs_fd_ = -1;
  }
  return *this;
}

StagingDir::~StagingDir() {
  if (syncfs_fd_ >= 0) close(syncfs_fd_);
  Unregister();
  if (!done_ && !keep_) (void)RemoveTree(tmp_);
}

absl::Status StagingDir::Commit() {
  if (done_) return absl::FailedPreconditionError(absl::StrCat(target_, ": staging folder already committed"));
  // Every byte on disk before the folder gets its final name.
  if (sync_) {
    PhaseTimer timer(Phase::kFsync);
    absl::Status synced = syncfs_fd_ >= 0 ? (syncfs(syncfs_fd_) == 0 ? absl::OkStatus()
                                                                     : ErrnoError(tmp_, "cannot sync the filesystem (syncfs)"))
                                          : SyncTree(tmp_);
    if (!synced.ok()) return synced;
  }
  PhaseTimer timer(Phase::kCommit);
  std::unique_lock<std::mutex> lock(Live().mu);  // no signal cleanup mid-rename
  if (Live().paths.count(id_) == 0 && id_ != 0) {
    return absl::CancelledError(absl::StrCat(target_, ": interrupted"));
  }
  std::string old;
  if (PathExists(target_)) {
    if (!overwrite_) return absl::AlreadyExistsError(absl::StrCat(target_, ": appeared while writing"));
    if (!IsReplaceableOutput(target_)) {
      return absl::FailedPreconditionError(absl::StrCat(target_, ": appeared while writing and is not a ucp output"));
    }
    old = JoinPath(Dirname(target_), TempName(Basename(target_), "old"));
    if (rename(target_.c_str(), old.c_str()) != 0) return ErrnoError(target_, "cannot move the old output away");
  }
  if (rename(tmp_.c_str(), target_.c_str()) != 0) {
    absl::Status s = ErrnoError(target_, "cannot rename the staging folder into place");
    if (!old.empty()) (void)rename(old.c_str(), target_.c_str());
    return s;
  }
  done_ = true;
  Live().paths.erase(id_);
  id_ = 0;
  lock.unlock();
  absl::Status s = sync_ ? SyncDir(Dirname(target_)) : absl::OkStatus();
  if (!old.empty()) {
    absl::Status r = RemoveTree(old);
    if (s.ok()) s = r;
  }
  return s;
}

}  // namespace ucp
