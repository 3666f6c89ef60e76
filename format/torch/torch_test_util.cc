#include "format/torch/torch_test_util.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "format/torch/test_util.h"
#include "format/torch/tree_copy.h"

namespace ucp::torch::testing {

absl::StatusOr<std::map<std::string, std::string>> PythonDumps(const std::vector<std::string>& files) {
  static int run = 0;
  const std::string list = TempPath(absl::StrCat("python_dumps/list", run, ".txt"));
  const std::string out = TempPath(absl::StrCat("python_dumps/out", run, ".txt"));
  ++run;
  absl::Status s = WriteFileAtomic(list, absl::StrJoin(files, "\n") + "\n");
  if (!s.ok()) return s;
  absl::StatusOr<std::string> ran = RunPython(PackageDataPath("testdata/canonical_dump.py"), {out, "@" + list});
  if (!ran.ok()) return ran.status();
  absl::StatusOr<std::string> text = ReadFileToString(out);
  if (!text.ok()) return text.status();
  std::map<std::string, std::string> dumps;
  std::string* current = nullptr;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (absl::ConsumePrefix(&line, "=== ")) {
      current = &dumps[std::string(line)];
      continue;
    }
    if (current != nullptr && !line.empty()) absl::StrAppend(current, line, "\n");
  }
  return dumps;
}

absl::Status RewriteTorchFile(const std::string& path, const std::function<void(pickle::Value&)>& edit) {
  absl::StatusOr<std::unique_ptr<TorchFile>> f = TorchFile::Open(path);
  if (!f.ok()) return f.status();
  TorchWriter w;
  absl::StatusOr<pickle::ValuePtr> root = CopyTreeForWrite(f->get(), (*f)->root(), w);
  if (!root.ok()) return root.status();
  edit(**root);
  const std::string tmp = path + ".new";
  absl::Status s = w.WriteFile(tmp, **root);
  if (!s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError(absl::StrCat("rename ", tmp));
  return absl::OkStatus();
}

}  // namespace ucp::torch::testing
