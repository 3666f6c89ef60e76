#include "format/torch/test_util.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ucp::torch::testing {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::filesystem::path p = std::filesystem::path(dir ? dir : "/tmp") / name;
  std::error_code ec;
  std::filesystem::create_directories(p.parent_path(), ec);
  return p.string();
}

std::string PackageDataPath(const std::string& relative) { return "format/torch/" + relative; }

std::string FixturesRoot() { return "external/shared/fixtures/deepspeed-0.14.4"; }

std::vector<std::string> FindTorchFiles(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(
           root, std::filesystem::directory_options::follow_directory_symlink, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->path().extension() == ".pt") out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}
}  // namespace

absl::StatusOr<std::string> RunPython(const std::string& script, const std::vector<std::string>& args) {
  std::string err_path = TempPath("python_stderr.txt");
  std::string cmd = "/usr/bin/python3 " + ShellQuote(script);
  for (const std::string& a : args) cmd += " " + ShellQuote(a);
  cmd += " 2>" + ShellQuote(err_path);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen failed");
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int rc = ::pclose(pipe);
  if (rc != 0) {
    std::string err = ReadFileToString(err_path).value_or("");
    if (err.size() > 4000) err = err.substr(err.size() - 4000);
    return absl::InternalError(absl::StrCat("python failed (", rc, "): ", cmd, "\n", err));
  }
  return out;
}

std::string DiffExcerpt(const std::string& expected, const std::string& actual, int context) {
  if (expected == actual) return "";
  std::vector<std::string> a = absl::StrSplit(expected, '\n');
  std::vector<std::string> b = absl::StrSplit(actual, '\n');
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  std::string out = absl::StrCat("first difference at line ", i + 1, " (expected ", a.size(), " lines, got ",
                                 b.size(), ")\n");
  size_t from = i > static_cast<size_t>(context) ? i - context : 0;
  for (size_t k = from; k < i; ++k) absl::StrAppend(&out, "  ", a[k], "\n");
  for (size_t k = i; k < std::min(a.size(), i + context); ++k) absl::StrAppend(&out, "- ", a[k], "\n");
  for (size_t k = i; k < std::min(b.size(), i + context); ++k) absl::StrAppend(&out, "+ ", b[k], "\n");
  return out;
}

int64_t RssKiB() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kib = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib;
}

}  // namespace ucp::torch::testing
