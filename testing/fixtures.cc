#include "testing/fixtures.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"

namespace ucp::testing {
namespace {

std::string RunfilesRoot() {
  if (const char* s = std::getenv("TEST_SRCDIR")) return s;
  return ".";
}

}  // namespace

std::string FixturePath(const std::string& rel) { return VersionFixturePath("0.14.4", rel); }

std::string VersionFixturePath(const std::string& version, const std::string& rel) {
  const std::string suffix = JoinPath(absl::StrCat("fixtures/deepspeed-", version), rel);
  for (const std::string& base : {JoinPath(RunfilesRoot(), "shared"), JoinPath(RunfilesRoot(), "ucp/external/shared"),
                                  std::string("external/shared"), std::string("../shared")}) {
    const std::string p = JoinPath(base, suffix);
    if (PathExists(p)) return p;
  }
  return JoinPath("../shared", suffix);
}

std::string RunfilePath(const std::string& rel) {
  const std::string p = JoinPath(JoinPath(RunfilesRoot(), "ucp"), rel);
  if (PathExists(p)) return p;
  return rel;
}

std::string FreshTempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(t != nullptr ? t : "/tmp", name);
  (void)RemoveTree(dir);
  (void)MakeDirs(dir);
  return dir;
}

absl::StatusOr<std::string> RunCommand(const std::string& command) {
  const std::string full = absl::StrCat(command, " 2>&1");
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("cannot run: ", command));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) return absl::InternalError(absl::StrCat("`", command, "` failed (", rc, "):\n", out));
  return out;
}

}  // namespace ucp::testing
