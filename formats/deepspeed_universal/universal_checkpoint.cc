#include "formats/deepspeed_universal/universal_checkpoint.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/fs.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "state/model_state.h"
#include "deepspeed/universal_metadata.h"
#include "deepspeed/value_util.h"
#include "format/pickle/accessors.h"
#include "format/torch/zip.h"
#include "google/protobuf/text_format.h"

namespace ucp::deepspeed_universal {

using deepspeed::ZeroParam;
using deepspeed::ReadLatestTag;
namespace internal = ::ucp::deepspeed::internal;


bool LooksLikeUniversalFolder(const std::string& path) {
  if (IsDirectory(JoinPath(path, deepspeed::kUniversalZeroDir))) return true;
  if (!PathExists(JoinPath(path, deepspeed::kLatestUniversalFile)) || PathExists(JoinPath(path, deepspeed::kLatestFile))) {
    return false;
  }
  // A ZeRO tag folder that happens to hold a latest_universal (an output
  // written inside it) is still the ZeRO checkpoint.
  auto names = ListDirectory(path);
  if (names.ok()) {
    for (const auto& n : *names) {
      auto parsed = deepspeed::ParseCheckpointFileName(n);
      if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kOptim) return false;
    }
  }
  return true;
}
namespace {

using pickle::Kind;
using pickle::Value;

const std::vector<std::string>& EmptyList() {
  static const auto* empty = new std::vector<std::string>();
  return *empty;
}

// Where a checkpoint is: its folder and tag.
struct Folder {
  std::string dir, tag;
};

// Phase 1: the folder `path` names: itself, or, when it has no zero/ of its
// own but a latest_universal, the tag that file names.
absl::StatusOr<Folder> ResolveFolder(const std::string& path_in) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (!IsDirectory(path)) return absl::NotFoundError(absl::StrCat(path, ": no such universal checkpoint folder"));
  Folder folder;
  if (!IsDirectory(JoinPath(path, deepspeed::kUniversalZeroDir)) && PathExists(JoinPath(path, deepspeed::kLatestUniversalFile))) {
    UCP_ASSIGN_OR_RETURN(std::string tag, ReadLatestTag(path, deepspeed::kLatestUniversalFile));
    folder.dir = JoinPath(path, tag);
    folder.tag = tag;
  } else {
    folder.dir = path;
    folder.tag = Basename(path);
  }
  return folder;
}

// Phase 2: the ucp manifest (the one given, else the folder's, checked
// against the files' digests when asked, before anything is parsed); none
// for a folder DeepSpeed wrote, which cannot have its checksums verified.
absl::StatusOr<std::optional<Manifest>> ReadManifest(const std::string& dir, const UniversalCheckpoint::Options& options) {
  const std::string manifest_path = JoinPath(dir, deepspeed::kManifestFile);
  if (options.given_manifest) return options.given_manifest;
  if (PathExists(manifest_path)) {
    UCP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(manifest_path));
    Manifest m;
    if (!google::protobuf::TextFormat::ParseFromString(text, &m)) {
      return absl::DataLossError(absl::StrCat(manifest_path, ": not a valid ucp manifest"));
    }
    if (options.verify_checksums) UCP_RETURN_IF_ERROR(VerifyManifestDigests(dir, m));
    return std::optional<Manifest>(std::move(m));
  }
  if (options.verify_checksums) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": no ", deepspeed::kManifestFile, " to verify checksums against (not written by ucp)"));
  }
  return std::optional<Manifest>();
}

// The `.pt` files a manifest lists: each param folder's state files under
// zero/, and the module tensors under ucp_module/ (both without `.pt`).
struct ManifestFiles {
  std::map<std::string, std::vector<std::string>> states;
  std::vector<std::string> modules;
};

ManifestFiles FilesInManifest(const Manifest& manifest) {
  ManifestFiles out;
  const std::string zero_prefix = absl::StrCat(deepspeed::kUniversalZeroDir, "/");
  const std::string module_prefix = absl::StrCat(deepspeed::kUniversalModuleDir, "/");
  for (const FileDigest& d : manifest.file()) {
    absl::string_view rel = d.path();
    if (!absl::ConsumeSuffix(&rel, ".pt")) continue;
    if (absl::ConsumePrefix(&rel, zero_prefix)) {
      const size_t slash = rel.rfind('/');
      if (slash == absl::string_view::npos) continue;
      out.states[std::string(rel.substr(0, slash))].push_back(std::string(rel.substr(slash + 1)));
    } else if (absl::ConsumePrefix(&rel, module_prefix)) {
      out.modules.push_back(std::string(rel));
    }
  }
  return out;
}

// What zero/ holds: the param folders and each one's state files, whether
// optimizer_state.pt is there, and, when the manifest lists the files
// (`recorded`), the module tensors it lists.
struct StateFolders {
  std::vector<std::string> param_names;
  std::map<std::string, std::vector<std::string>> state_files;
  bool has_optimizer_state = false;
  bool recorded = false;
  std::vector<std::string> recorded_modules;
};

// Phase 3: the param folders under `zero` and their state files. A ucp
// manifest lists every file: then no param folder needs listing (one
// metadata operation per param on a parallel file system), but each folder
// it lists must be there and none it does not list.
absl::StatusOr<StateFolders> ListStateFolders(const std::string& zero, const std::optional<Manifest>& manifest) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDirectory(zero));
  StateFolders out;
  ManifestFiles listed;
  if (manifest && manifest->file_size() > 0) listed = FilesInManifest(*manifest);
  out.recorded = !listed.states.empty();
  for (const auto& e : entries) {
    const std::string full = JoinPath(zero, e);
    if (e == deepspeed::kUniversalOptimizerStateFile) {
      out.has_optimizer_state = true;
      continue;
    }
    if (out.recorded) {
      if (!listed.states.count(e) && IsDirectory(full)) {
        return absl::InvalidArgumentError(
            absl::StrCat(full, ": a param folder the manifest ", deepspeed::kManifestFile, " does not list"));
      }
      continue;
    }
    if (!IsDirectory(full)) continue;
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(full));
    std::vector<std::string> states;
    for (const auto& f : files) {
      if (absl::EndsWith(f, ".pt")) states.push_back(f.substr(0, f.size() - 3));
    }
    out.param_names.push_back(e);
    out.state_files[e] = std::move(states);
  }
  if (out.recorded) {
    const std::set<std::string> present(entries.begin(), entries.end());
    for (auto& [name, states] : listed.states) {
      if (!present.count(name)) {
        return absl::NotFoundError(absl::StrCat(JoinPath(zero, name), ": missing (listed in ", deepspeed::kManifestFile,
                                                ")"));
      }
      std::sort(states.begin(), states.end());
      out.param_names.push_back(name);
      out.state_files[name] = std::move(states);
    }
    out.recorded_modules = std::move(listed.modules);
  }
  return out;
}

// Phase 4: the module tensors (ucp_module/<name>.pt): the manifest's list
// when it lists the files, else the folder's, if there is one.
absl::StatusOr<std::vector<std::string>> ListModules(const std::string& dir, StateFolders& folders) {
  std::vector<std::string> names;
  const std::string module_dir = JoinPath(dir, deepspeed::kUniversalModuleDir);
  if (folders.recorded) {
    names = std::move(folders.recorded_modules);
    std::sort(names.begin(), names.end());
  } else if (IsDirectory(module_dir)) {
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(module_dir));
    for (const auto& f : files) {
      if (absl::EndsWith(f, ".pt")) names.push_back(f.substr(0, f.size() - 3));
    }
  }
  return names;
}

// Phase 5: every optimizer param of the model-state files has its folder
// with an fp32 state, and no other folder is there.
absl::Status CheckParamsAgree(const std::string& zero, const deepspeed::ModelStatesFiles& ms,
                              const std::vector<std::string>& param_names,
                              const std::map<std::string, std::vector<std::string>>& state_files) {
  for (const ZeroParam& p : ms.params()) {
    auto it = state_files.find(p.name);
    if (it == state_files.end()) {
      return absl::NotFoundError(absl::StrCat(JoinPath(zero, p.name), ": missing (param '", p.name,
                                              "' is in the param_shapes of ", deepspeed::MpRankFileName(0), ")"));
    }
    if (std::find(it->second.begin(), it->second.end(), "fp32") == it->second.end()) {
      return absl::NotFoundError(absl::StrCat(JoinPath(JoinPath(zero, p.name), "fp32.pt"), ": missing"));
    }
  }
  for (const auto& name : param_names) {
    if (ms.FindParam(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(JoinPath(zero, name), ": no param '", name,
                                                     "' in the param_shapes of the model-state files"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyManifestChecksums(const std::string& dir) {
  UniversalCheckpoint::Options o;
  o.verify_checksums = true;
  return ReadManifest(dir, o).status();
}


absl::StatusOr<std::unique_ptr<UniversalCheckpoint>> UniversalCheckpoint::Open(const std::string& path_in,
                                                                               const Options& options) {
  UCP_ASSIGN_OR_RETURN(Folder folder, ResolveFolder(path_in));
  std::unique_ptr<UniversalCheckpoint> u(new UniversalCheckpoint());
  u->options_ = options;
  u->dir_ = std::move(folder.dir);
  u->tag_ = std::move(folder.tag);
  const std::string zero = JoinPath(u->dir_, deepspeed::kUniversalZeroDir);
  if (!IsDirectory(zero)) {
    return absl::InvalidArgumentError(absl::StrCat(u->dir_, ": not a universal checkpoint: no '", deepspeed::kUniversalZeroDir,
                                                   "' folder"));
  }
  UCP_ASSIGN_OR_RETURN(u->manifest_, ReadManifest(u->dir_, options));
  UCP_ASSIGN_OR_RETURN(u->ms_, deepspeed::ModelStatesFiles::Open(u->dir_, 0, options.read));
  UCP_ASSIGN_OR_RETURN(StateFolders folders, ListStateFolders(zero, u->manifest_));
  u->param_names_ = std::move(folders.param_names);
  u->state_files_ = std::move(folders.state_files);
  if (!folders.has_optimizer_state) {
    return absl::NotFoundError(absl::StrCat(JoinPath(zero, deepspeed::kUniversalOptimizerStateFile), ": missing"));
  }
  UCP_ASSIGN_OR_RETURN(u->optimizer_state_,
                       torch::TorchFile::Open(JoinPath(zero, deepspeed::kUniversalOptimizerStateFile), options.read.Files()));
  UCP_ASSIGN_OR_RETURN(u->module_names_, ListModules(u->dir_, folders));
  UCP_RETURN_IF_ERROR(CheckParamsAgree(zero, *u->ms_, u->param_names_, u->state_files_));
  return u;
}

const std::vector<std::string>& UniversalCheckpoint::StateFiles(const std::string& name) const {
  auto it = state_files_.find(name);
  return it == state_files_.end() ? EmptyList() : it->second;
}

absl::StatusOr<std::shared_ptr<const torch::TorchFile>> UniversalCheckpoint::OpenCached(const std::string& rel) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(rel);
    if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  const std::string path = JoinPath(dir_, rel);
  bool check = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check = checked_inputs_ == nullptr || checked_inputs_->count(state::InputKey(path, ""));
  }
  // Unchecked: another rank checks it (SetCheckedInputs).
  const torch::OpenOptions open_options = options_.read.Files(/*verify_crc=*/check);
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f, torch::TorchFile::Open(path, open_options));
  // A checked file is read whole, now: start reading it in the background.
  // Not when its check is deferred (a unit of ExecuteUnits opening it): the
  // background check reads the files in the order they were opened, one
  // after the other, which is all the read-ahead they need; asking the
  // kernel for every opened file at once (a unit writing one optimizer file
  // opens every param's state files: gigabytes) makes the open wait in the
  // block layer's queue until most of the input has been read, so no unit
  // writes anything meanwhile.
  if (check && f->mapped_file() != nullptr && torch::DeferredCrcChecks::Current() == nullptr) {
    f->mapped_file()->AdviseWillNeed(0, f->mapped_file()->size());
  }
  std::shared_ptr<const torch::TorchFile> shared(std::move(f));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(rel);
  if (it != cache_.end()) return it->second.first;
  lru_.push_front(rel);
  cache_[rel] = {shared, lru_.begin()};
  while (cache_.size() > std::max<size_t>(options_.max_open_files, 1)) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  return shared;
}

absl::StatusOr<UniversalStateFile> UniversalCheckpoint::ReadParamDict(const std::string& rel,
                                                                      const std::string& name) const {
  UCP_ASSIGN_OR_RETURN(std::shared_ptr<const torch::TorchFile> f, OpenCached(rel));
  const Value& root = *f->root();
  if (!root.is(Kind::kDict)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f->path(), ": expected a dict with 'param', found ", root.DebugString(60)));
  }
  const Value* param = root.DictGet("param");
  if (param == nullptr || !torch::TorchFile::IsTensor(*param)) {
    return absl::InvalidArgumentError(absl::StrCat(f->path(), ": no tensor under 'param'"));
  }
  UniversalStateFile out;
  out.file = f;
  UCP_ASSIGN_OR_RETURN(out.param, f->GetTensor(*param));
  UCP_RETURN_IF_ERROR(internal::CheckDense(out.param, f->path(), "'param'"));
  UCP_ASSIGN_OR_RETURN(out.rule, deepspeed::RuleFromUniversalMetadata(root, name), _.Prepend(absl::StrCat(f->path(), ": ")));
  return out;
}

absl::StatusOr<UniversalStateFile> UniversalCheckpoint::ReadState(const std::string& name,
                                                                  const std::string& state) const {
  const auto& states = StateFiles(name);
  if (std::find(states.begin(), states.end(), state) == states.end()) {
    return absl::NotFoundError(absl::StrCat(JoinPath(JoinPath(JoinPath(dir_, deepspeed::kUniversalZeroDir), name), state + ".pt"),
                                            ": missing"));
  }
  return ReadParamDict(JoinPath(JoinPath(deepspeed::kUniversalZeroDir, name), state + ".pt"), name);
}

absl::StatusOr<UniversalStateFile> UniversalCheckpoint::ReadModule(const std::string& name) const {
  return ReadParamDict(JoinPath(deepspeed::kUniversalModuleDir, name + ".pt"), name);
}

absl::StatusOr<std::shared_ptr<const torch::TorchFile>> UniversalCheckpoint::ReadStep(const std::string& name) const {
  const auto& states = StateFiles(name);
  if (std::find(states.begin(), states.end(), "step") == states.end()) {
    return std::shared_ptr<const torch::TorchFile>();
  }
  return OpenCached(JoinPath(JoinPath(deepspeed::kUniversalZeroDir, name), "step.pt"));
}

absl::Status UniversalCheckpoint::VerifyChecksums() const {
  if (!manifest_) return absl::FailedPreconditionError(absl::StrCat(dir_, ": no manifest"));
  return VerifyManifestDigests(dir_, *manifest_);
}

absl::Status VerifyManifestDigests(const std::string& dir, const Manifest& manifest) {
  for (const FileDigest& d : manifest.file()) {
    if (d.path().find("..") != std::string::npos || (!d.path().empty() && d.path()[0] == '/')) {
      return absl::DataLossError(absl::StrCat(JoinPath(dir, deepspeed::kManifestFile), ": bad file path '", d.path(), "'"));
    }
    const std::string path = JoinPath(dir, d.path());
    const DigestKind kind = !d.xxh3_128().empty() ? DigestKind::kXxh3_128
                            : !d.sha256().empty() ? DigestKind::kSha256
                                                  : DigestKind::kNone;
    if (kind == DigestKind::kNone) {
      return absl::DataLossError(
          absl::StrCat(JoinPath(dir, deepspeed::kManifestFile), ": no digest for '", d.path(), "'"));
    }
    const std::string& want = kind == DigestKind::kSha256 ? d.sha256() : d.xxh3_128();
    std::string got;
    UCP_ASSIGN_OR_RETURN(int64_t size, FileDigestOf(path, kind, &got));
    if (size != d.size()) {
      return absl::DataLossError(absl::StrCat(path, ": ", size, " bytes, the manifest says ", d.size()));
    }
    if (got != want) {
      return absl::DataLossError(absl::StrCat(path, ": ", DigestKindName(kind), " ", got,
                                              " differs from the manifest's ", want));
    }
  }
  return absl::OkStatus();
}

}  // namespace ucp::deepspeed_universal
