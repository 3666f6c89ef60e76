#include "ops/model_folder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "formats/format.h"

namespace ucp::ops {
namespace {

constexpr int64_t kMaxModelFileBytes = int64_t{1} << 30;

}  // namespace

const std::vector<std::string>& ModelFolderFileNames() {
  static const std::vector<std::string>* names = new std::vector<std::string>{
      "config.json",           "generation_config.json", "tokenizer.json",    "tokenizer_config.json",
      "special_tokens_map.json", "tokenizer.model",      "vocab.json",        "merges.txt",
      "added_tokens.json",     "chat_template.jinja",    "chat_template.json", "preprocessor_config.json",
  };
  return *names;
}

absl::StatusOr<std::string> ModelFilesSource(const std::string& source_kind, const std::string& source_dir) {
  if (source_kind == "hf") return source_dir;
  // A config.json that is not a JSON object names no model: nothing is
  // carried (the checkpoint itself is read as ever).
  absl::StatusOr<formats::HfFolder> folder = formats::HfFolderOf(source_dir);
  if (!folder.ok() || folder->trainer || folder->config_json.empty()) return std::string();
  return folder->dir;
}

std::string OutputRoot(const std::string& output_folder) {
  std::string dir = output_folder;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string parent = Dirname(dir);
  return parent.empty() ? "." : parent;
}

absl::Status CheckModelFilesTarget(const std::string& from_dir, const std::string& out_root) {
  if (from_dir.empty() || !PathExists(out_root)) return absl::OkStatus();
  for (const std::string& name : ModelFolderFileNames()) {
    const std::string from = JoinPath(from_dir, name), to = JoinPath(out_root, name);
    if (!PathExists(from) || IsDirectory(from) || !PathExists(to)) continue;
    UCP_ASSIGN_OR_RETURN(std::string a, ReadFileToString(from, kMaxModelFileBytes));
    absl::StatusOr<std::string> b = ReadFileToString(to, kMaxModelFileBytes);
    if (b.ok() && a == *b) continue;
    return absl::AlreadyExistsError(absl::StrCat(
        to, " exists and is not ", from, ": the checkpoint's root keeps the model's ", name,
        " beside its tags (`ucp export --names=hf` reads it), and this one is another model's; write the output "
        "under another folder, or remove that file"));
  }
  return absl::OkStatus();
}

absl::Status CopyModelFiles(const std::string& from_dir, const std::string& out_root, std::vector<std::string>* notes) {
  if (from_dir.empty()) return absl::OkStatus();
  std::vector<std::string> copied;
  for (const std::string& name : ModelFolderFileNames()) {
    const std::string from = JoinPath(from_dir, name), to = JoinPath(out_root, name);
    if (!PathExists(from) || IsDirectory(from)) continue;
    UCP_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(from, kMaxModelFileBytes));
    if (PathExists(to)) {
      absl::StatusOr<std::string> old = ReadFileToString(to, kMaxModelFileBytes);
      if (old.ok() && *old == bytes) continue;
    }
    absl::Status s = WriteFileAtomic(to, bytes);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("the checkpoint itself is complete and committed, but writing ", to,
                                                 " failed: ", s.message(), ". Copy ", from,
                                                 " there yourself: `ucp export --names=hf` reads it"));
    }
    copied.push_back(name);
  }
  if (!copied.empty()) {
    notes->push_back(absl::StrCat("the model's ", absl::StrJoin(copied, ", "), " copied from ", from_dir, " to ",
                                  out_root, " (beside the tags: `ucp export --names=hf` takes the model from it)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<writers::WriteStats> RunPlanWithModelFiles(const writers::Plan& plan, const std::string& output_folder,
                                                          const writers::RunOptions& run, Cluster* cluster,
                                                          const std::string& model_dir) {
  const bool lead = cluster == nullptr || cluster->rank() == 0;
  const std::string out_root = OutputRoot(output_folder);
  absl::Status checked = lead ? CheckModelFilesTarget(model_dir, out_root) : absl::OkStatus();
  if (cluster != nullptr) checked = AgreeOnStatus(*cluster, checked);
  UCP_RETURN_IF_ERROR(checked);
  UCP_ASSIGN_OR_RETURN(writers::WriteStats stats, cluster != nullptr
                                                      ? writers::RunPlanOnCluster(plan, output_folder, run, *cluster)
                                                      : writers::RunPlan(plan, output_folder, run));
  if (lead) UCP_RETURN_IF_ERROR(CopyModelFiles(model_dir, out_root, &stats.notes));
  return stats;
}

}  // namespace ucp::ops
