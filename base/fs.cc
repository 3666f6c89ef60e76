#include "base/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open");
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
  }
  close(fd);
  return out;
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoError(path, "cannot stat");
  return static_cast<int64_t>(st.st_size);
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  const std::string tmp = JoinPath(Dirname(path), absl::StrCat(".", Basename(path), ".ucp-tmp-", getpid()));
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
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FileDigestOf(const std::string& path, DigestKind digest, std::string* hex) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open");
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

absl::Status CopyFile(const std::string& from, const std::string& to, std::string* hex, DigestKind digest) {
  const int in = open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return ErrnoError(from, "cannot open");
  const int out = open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    absl::Status s = ErrnoError(to, "cannot create");
    close(in);
    return s;
  }
  StreamDigest hash(digest);
  std::vector<char> buf(size_t{4} << 20);
  absl::Status status;
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
  }
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

absl::StatusOr<StagingDir> StagingDir::Create(const std::string& target_in, bool overwrite) {
  std::string target = target_in;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  if (PathExists(target) && !overwrite) {
    return absl::AlreadyExistsError(absl::StrCat(target, ": output folder already exists (remove it or pass --overwrite)"));
  }
  const std::string parent = Dirname(target);
  absl::Status s = MakeDirs(parent);
  if (!s.ok()) return s;
  StagingDir d;
  d.target_ = target;
  d.overwrite_ = overwrite;
  d.tmp_ = JoinPath(parent, absl::StrCat(".", Basename(target), ".ucp-tmp-", getpid()));
  s = RemoveTree(d.tmp_);
  if (!s.ok()) return s;
  if (mkdir(d.tmp_.c_str(), 0755) != 0) return ErrnoError(d.tmp_, "cannot create staging folder");
  return d;
}

StagingDir::StagingDir(StagingDir&& o) noexcept
    : target_(std::move(o.target_)), tmp_(std::move(o.tmp_)), overwrite_(o.overwrite_), done_(o.done_), keep_(o.keep_) {
  o.done_ = true;
}

StagingDir& StagingDir::operator=(StagingDir&& o) noexcept {
  if (this != &o) {
    if (!done_ && !keep_) (void)RemoveTree(tmp_);
    target_ = std::move(o.target_);
    tmp_ = std::move(o.tmp_);
    overwrite_ = o.overwrite_;
    done_ = o.done_;
    keep_ = o.keep_;
    o.done_ = true;
  }
  return *this;
}

StagingDir::~StagingDir() {
  if (!done_ && !keep_) (void)RemoveTree(tmp_);
}

absl::Status StagingDir::Commit() {
  if (done_) return absl::FailedPreconditionError(absl::StrCat(target_, ": staging folder already committed"));
  std::string old;
  if (PathExists(target_)) {
    if (!overwrite_) return absl::AlreadyExistsError(absl::StrCat(target_, ": appeared while writing"));
    old = JoinPath(Dirname(target_), absl::StrCat(".", Basename(target_), ".ucp-old-", getpid()));
    if (rename(target_.c_str(), old.c_str()) != 0) return ErrnoError(target_, "cannot move the old output away");
  }
  if (rename(tmp_.c_str(), target_.c_str()) != 0) {
    absl::Status s = ErrnoError(target_, "cannot rename the staging folder into place");
    if (!old.empty()) (void)rename(old.c_str(), target_.c_str());
    return s;
  }
  done_ = true;
  if (!old.empty()) return RemoveTree(old);
  return absl::OkStatus();
}

}  // namespace ucp
