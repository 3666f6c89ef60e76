#include "formats/verify.h"

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/torch/mapped_file.h"
#include "formats/inspect.h"

namespace ucp::formats {
namespace {

std::string StatusLine(const absl::Status& s) { return std::string(s.message()); }

}  // namespace

VerifyResult VerifyFolder(const Registry& registry, const std::string& path, const SourceOptions& options) {
  VerifyResult r;
  r.dir = path;
  if (!IsDirectory(path)) {
    r.problems.push_back(absl::StrCat(path, ": not a folder"));
    return r;
  }
  absl::StatusOr<DetectedFolder> detected = DetectFolder(registry, path);
  if (!detected.ok()) {
    r.problems.push_back(StatusLine(detected.status()));
    return r;
  }
  r.kind = std::string(detected->format->kind());
  r.dir = detected->folder.dir;
  // Unsafe pickles are problems; the rest of the folder is still checked.
  for (const std::string& u : ScanUnsafeGlobals(detected->folder.dir)) {
    r.problems.push_back(absl::StrCat(u, ": UNSAFE pickle global (code torch.load would run)"));
  }
  SourceOptions read = options;
  read.allow_unsafe_pickles = true;  // reported above; check the rest too
  detected->format->Verify(detected->folder, read, &r);
  absl::Status intact = torch::MappedFile::CheckAllIntact();
  if (!intact.ok()) r.problems.push_back(StatusLine(intact));
  return r;
}

}  // namespace ucp::formats
