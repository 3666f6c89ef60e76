#include "formats/format.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/manifest.h"
#include "format/json/json.h"

namespace ucp::formats {

rules::ResolveOptions SourceOptions::resolve() const {
  rules::ResolveOptions o;
  o.rules = rules;
  o.replicated_mismatch = replicated_mismatch;
  o.num_threads = num_threads;
  o.tp1_whole_tensors = tp1_whole_tensors;
  return o;
}

namespace {

absl::Status NotWritten(const TargetFormat& t, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("target format ", t.name(), " (", t.summary(), ") does not write ",
                                                 what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<writers::Plan>> TargetFormat::PlanTrainingState(
    const state::ModelState& state, const writers::ZeroWriteOptions& options, writers::TargetSummary* summary) const {
  return NotWritten(*this, "a training state at a topology (`ucp reshard`)");
}

writers::RunOptions TargetFormat::TrainingStateRunOptions(const writers::ZeroWriteOptions& options) const {
  return writers::ZeroRunOptions(options);
}

absl::StatusOr<std::unique_ptr<writers::Plan>> TargetFormat::PlanUniversal(
    const state::ModelState& state, const writers::UniversalWriteOptions& options) const {
  return NotWritten(*this, "a universal checkpoint (`ucp convert`)");
}

absl::StatusOr<std::unique_ptr<writers::Plan>> TargetFormat::PlanWeights(
    std::vector<writers::ExportTensor> tensors, const writers::ExportWriteOptions& options) const {
  return NotWritten(*this, "weights (`ucp export`)");
}

absl::StatusOr<SlicedSource> SourceFormat::OpenSliced(const CheckpointFolder& folder,
                                                     const SourceOptions& options) const {
  return absl::FailedPreconditionError(absl::StrCat(folder.dir, ": ", summary(),
                                                    " records how every param merges; no rule is left to decide"));
}

void Registry::AddSource(std::unique_ptr<SourceFormat> format) { sources_.push_back(std::move(format)); }
void Registry::AddTarget(std::unique_ptr<TargetFormat> format) { targets_.push_back(std::move(format)); }

const SourceFormat* Registry::FindSource(absl::string_view name) const {
  for (const auto& f : sources_) {
    if (f->name() == name) return f.get();
  }
  return nullptr;
}

const TargetFormat* Registry::FindTarget(absl::string_view name) const {
  for (const auto& f : targets_) {
    if (f->name() == name) return f.get();
  }
  return nullptr;
}

absl::StatusOr<const SourceFormat*> Registry::Detect(const CheckpointFolder& folder) const {
  for (const auto& f : sources_) {
    if (f->Detect(folder)) return f.get();
  }
  std::vector<std::string> known;
  for (const auto& f : sources_) known.push_back(std::string(f->summary()));
  return absl::InvalidArgumentError(absl::StrCat(
      folder.dir, ": unrecognized checkpoint layout: expected ", absl::StrJoin(known, ", or "), "; found ",
      folder.names.empty() ? "an empty folder"
                           : absl::StrCat(folder.names.size(), " other entries, e.g. '", folder.names.front(), "'")));
}

absl::StatusOr<const TargetFormat*> Registry::PickTrainingStateTarget(const state::ModelInfo& info,
                                                                     const writers::ZeroWriteOptions& options,
                                                                     absl::string_view name) const {
  if (!name.empty()) {
    const TargetFormat* t = FindTarget(name);
    if (t == nullptr || t->family() != TargetFamily::kTrainingState) {
      std::vector<std::string> names;
      for (const auto& f : targets_) {
        if (f->family() == TargetFamily::kTrainingState) names.push_back(std::string(f->name()));
      }
      return absl::InvalidArgumentError(absl::StrCat("--format=", name, ": expected one of ", absl::StrJoin(names, ", ")));
    }
    return t;
  }
  for (const auto& f : targets_) {
    if (f->family() == TargetFamily::kTrainingState && f->PicksFor(info, options)) return f.get();
  }
  return absl::FailedPreconditionError("no target format writes this model at the requested topology");
}

absl::StatusOr<CheckpointFolder> ResolveFolder(const Registry& registry, const std::string& path_in) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (!PathExists(path)) return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint folder"));
  if (!IsDirectory(path)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a folder"));
  CheckpointFolder folder;
  folder.path = path;
  folder.dir = path;
  folder.tag = Basename(path);
  folder.root = Dirname(path);
  UCP_ASSIGN_OR_RETURN(folder.names, ListDirectory(path));
  for (const auto& f : registry.sources()) {
    if (f->Detect(folder)) return folder;
  }
  // A root: the tag its latest file names. DeepSpeed's own `latest` first
  // (what load_checkpoint follows unless told to load a universal
  // checkpoint), then the other formats' latest files in registry order.
  std::vector<std::string> latest_files;
  for (const auto& f : registry.sources()) {
    const std::string l(f->latest_file());
    if (l.empty() || std::find(latest_files.begin(), latest_files.end(), l) != latest_files.end()) continue;
    if (l == deepspeed::kLatestFile) {
      latest_files.insert(latest_files.begin(), l);
    } else {
      latest_files.push_back(l);
    }
  }
  for (const std::string& latest : latest_files) {
    if (!PathExists(JoinPath(path, latest))) continue;
    UCP_ASSIGN_OR_RETURN(std::string tag, deepspeed::ReadLatestTag(path, latest));
    CheckpointFolder tagged;
    tagged.path = path;
    tagged.root = path;
    tagged.tag = tag;
    tagged.dir = JoinPath(path, tag);
    tagged.latest_file = latest;
    if (!IsDirectory(tagged.dir)) {
      return absl::NotFoundError(absl::StrCat(JoinPath(path, latest), " names tag '", tag, "' but ", tagged.dir,
                                              " is not a folder"));
    }
    UCP_ASSIGN_OR_RETURN(tagged.names, ListDirectory(tagged.dir));
    return tagged;
  }
  return folder;
}

absl::StatusOr<OpenedSource> ResolveSliced(const SourceFormat* format, std::shared_ptr<const state::SlicedState> sliced,
                                           const rules::ResolveOptions& options, const state::ModelInfo* decided) {
  OpenedSource out;
  out.format = format;
  out.dir = sliced->dir();
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<rules::ResolvedState> state,
                       rules::ResolveRules(std::move(sliced), options, decided));
  out.effective_rules = state->resolver().EffectiveRules();
  out.preset = state->resolver().preset();
  out.preset_detected = state->resolver().preset_detected();
  out.state = std::move(state);
  return out;
}

void VerifyStateInputs(const state::CheckpointState& state, VerifyResult* result) {
  for (const std::string& path : state.InputFiles()) {
    ++result->files_checked;
    absl::Status s = state.VerifyInput(path);
    if (!s.ok()) result->problems.push_back(std::string(s.message()));
  }
}

absl::StatusOr<state::ModelInfo> DecidedModel(const JobDescription& description) {
  return deepspeed::FromManifest(description.resolved());
}

absl::StatusOr<HfFolder> HfFolderOf(const std::string& checkpoint_dir) {
  HfFolder out;
  std::string dir = checkpoint_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string parent = Dirname(dir);
  if (parent.empty() || parent == dir) return out;
  const std::string config = JoinPath(parent, "config.json");
  out.trainer = PathExists(JoinPath(parent, "trainer_state.json"));
  const bool has_config = PathExists(config) && !IsDirectory(config);
  if (!out.trainer && !has_config) return out;
  out.dir = parent;
  if (!has_config) return out;
  UCP_ASSIGN_OR_RETURN(out.config_json, ReadFileToString(config, int64_t{64} << 20));
  absl::StatusOr<json::Value> v = json::Parse(out.config_json);
  if (!v.ok() || v->type() != json::Value::Type::kObject) {
    return absl::DataLossError(absl::StrCat(config, ": not a JSON object",
                                            v.ok() ? "" : absl::StrCat(" (", v.status().message(), ")")));
  }
  if (const json::Value* t = v->Get("model_type"); t != nullptr && t->type() == json::Value::Type::kString) {
    out.model_type = t->string_value();
  }
  if (const json::Value* a = v->Get("architectures");
      a != nullptr && a->type() == json::Value::Type::kArray && !a->items().empty() &&
      a->items()[0].type() == json::Value::Type::kString) {
    out.architecture = a->items()[0].string_value();
  }
  return out;
}

absl::StatusOr<DetectedFolder> DetectFolder(const Registry& registry, const std::string& path) {
  DetectedFolder out;
  UCP_ASSIGN_OR_RETURN(out.folder, ResolveFolder(registry, path));
  UCP_ASSIGN_OR_RETURN(out.format, registry.Detect(out.folder));
  return out;
}

}  // namespace ucp::formats
