#include "ops/open.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "deepspeed/facet.h"
#include "deepspeed/manifest.h"
#include "formats/builtin/builtin.h"
#include "rules/hf_names.h"
#include "rules/presets.h"

namespace ucp::ops {
namespace {

const formats::Registry& Formats() { return formats::builtin::Formats(); }


// A Hugging Face model folder around the checkpoint (the Trainer's
// checkpoint-N): its config.json's model_type helps detect the preset.
absl::StatusOr<SourceOptions> WithHfModelType(const SourceOptions& options, const formats::CheckpointFolder& folder) {
  SourceOptions opts = options;
  if (opts.rules.hf_model_type.empty()) {
    // A config.json that does not parse helps nothing and is not the
    // checkpoint's: detection goes by the names alone.
    absl::StatusOr<formats::HfFolder> hf = formats::HfFolderOf(folder.dir);
    if (hf.ok()) opts.rules.hf_model_type = hf->model_type;
  }
  return opts;
}

absl::StatusOr<formats::DetectedFolder> Detect(const std::string& path, const OpenRequest& request) {
  UCP_ASSIGN_OR_RETURN(formats::DetectedFolder d, formats::DetectFolder(Formats(), path));
  if (!request.refuse_format.empty() && d.format->name() == request.refuse_format) {
    if (d.format->kind() == "universal") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": a universal checkpoint; this command reads ZeRO ones"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": already ", d.format->summary(), ", the format --to=", d.format->name(), " writes"));
  }
  return d;
}

// Rank 0's work: open, resolve, and (`description` not null) describe for
// the others. The description's common part: the format, the folder, the
// decisions (every param's rule, source, full shape), the rules and preset
// for the manifest, the notes; the format adds its own (SourceFormat::Open).
absl::StatusOr<OpenedSource> OpenAndDescribe(const std::string& path, const SourceOptions& options,
                                             const OpenRequest& request, JobDescription* description) {
  UCP_ASSIGN_OR_RETURN(formats::DetectedFolder d, Detect(path, request));
  UCP_ASSIGN_OR_RETURN(SourceOptions opts, WithHfModelType(options, d.folder));
  UCP_ASSIGN_OR_RETURN(OpenedSource src, d.format->Open(d.folder, opts, description));
  if (description != nullptr) {
    description->set_source_kind(std::string(d.format->name()));
    description->set_source_dir(src.dir);
    description->set_preset(src.preset);
    description->set_preset_detected(src.preset_detected);
    *description->mutable_effective_rules() = src.effective_rules;
    *description->mutable_resolved() =
        deepspeed::ToManifest(src.state->info(), {src.dir, std::string(d.format->kind())});
    for (const auto& n : src.state->info().notes) description->add_note(n);
  }
  return src;
}

// The other ranks' work: open from rank 0's description.
absl::StatusOr<OpenedSource> OpenFromDescription(const std::string& path, const SourceOptions& options,
                                                 const JobDescription& d) {
  const formats::SourceFormat* format = Formats().FindSource(d.source_kind());
  if (format == nullptr) {
    return absl::InternalError(absl::StrCat("rank 0 described a source of format '", d.source_kind(),
                                            "', which this binary does not know"));
  }
  UCP_ASSIGN_OR_RETURN(formats::CheckpointFolder folder, formats::ResolveFolder(Formats(), path));
  UCP_ASSIGN_OR_RETURN(OpenedSource out, format->Reopen(folder, options, d));
  out.dir = d.source_dir();
  out.effective_rules = d.effective_rules();
  out.preset = d.preset();
  out.preset_detected = d.preset_detected();
  return out;
}

}  // namespace

bool IsUniversalFolder(const std::string& path) {
  absl::StatusOr<formats::DetectedFolder> d = formats::DetectFolder(Formats(), path);
  return d.ok() && d->format->kind() == "universal";
}

absl::StatusOr<std::unique_ptr<rules::ResolvedState>> OpenResolvedState(const std::string& path,
                                                                        const SourceOptions& options) {
  UCP_ASSIGN_OR_RETURN(formats::DetectedFolder d, formats::DetectFolder(Formats(), path));
  UCP_ASSIGN_OR_RETURN(SourceOptions opts, WithHfModelType(options, d.folder));
  UCP_ASSIGN_OR_RETURN(formats::SlicedSource sliced, d.format->OpenSliced(d.folder, opts));
  return rules::ResolveRules(std::move(sliced.state), sliced.resolve);
}

absl::StatusOr<rules::SuggestReport> SuggestRules(const std::string& path, const SourceOptions& options) {
  UCP_ASSIGN_OR_RETURN(formats::DetectedFolder d, formats::DetectFolder(Formats(), path));
  UCP_ASSIGN_OR_RETURN(SourceOptions opts, WithHfModelType(options, d.folder));
  UCP_ASSIGN_OR_RETURN(formats::SlicedSource sliced, d.format->OpenSliced(d.folder, opts));
  return rules::SuggestRules(std::move(sliced.state), sliced.resolve);
}

absl::StatusOr<std::unique_ptr<state::ModelState>> OpenModelState(const std::string& path,
                                                                  const SourceOptions& options,
                                                                  bool verify_checksums) {
  SourceOptions o = options;
  o.verify_checksums = o.verify_checksums || verify_checksums;
  UCP_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(path, o, nullptr));
  return std::move(src.state);
}

absl::StatusOr<OpenedSource> OpenSource(const std::string& path, const SourceOptions& options, Cluster* cluster,
                                        const OpenRequest& request) {
  if (cluster == nullptr || cluster->size() == 1) return OpenAndDescribe(path, options, request, nullptr);
  JobMessage mine;
  std::optional<OpenedSource> src;
  if (cluster->rank() == 0) {
    JobDescription description;
    absl::StatusOr<OpenedSource> opened = OpenAndDescribe(path, options, request, &description);
    if (opened.ok()) {
      mine.set_payload(description.SerializeAsString());
      src = *std::move(opened);
    } else {
      mine.set_code(static_cast<int>(opened.status().code()));
      mine.set_message(std::string(opened.status().message()));
    }
  }
  std::string bytes = cluster->rank() == 0 ? mine.SerializeAsString() : std::string();
  UCP_RETURN_IF_ERROR(cluster->Broadcast(&bytes, 0));
  JobMessage got;
  if (!got.ParseFromString(bytes)) return absl::InternalError("rank 0 sent a description that does not parse");
  UCP_RETURN_IF_ERROR(absl::Status(static_cast<absl::StatusCode>(got.code()), got.message()));
  absl::Status opened = absl::OkStatus();
  if (cluster->rank() != 0) {
    JobDescription d;
    if (!d.ParseFromString(got.payload())) {
      opened = absl::InternalError("rank 0 sent a description that does not parse");
    } else {
      absl::StatusOr<OpenedSource> o = OpenFromDescription(path, options, d);
      if (o.ok()) {
        src = *std::move(o);
      } else {
        opened = o.status();
      }
    }
  }
  UCP_RETURN_IF_ERROR(AgreeOnStatus(*cluster, opened));
  return *std::move(src);
}

std::vector<std::string> TpSummedNotes(const state::ModelState& state, const std::string& preset, int target_tp) {
  const state::ModelInfo& info = state.info();
  const int source_tp = std::max(1, info.source_topology.tp);
  if (target_tp == source_tp) return {};
  std::string family = preset == rules::kNoPreset ? "" : preset;
  if (family.empty()) {  // the note is about the model, whatever decides its merges
    std::vector<std::string> names;
    for (const auto& p : info.params) names.push_back(p.name);
    family = rules::DetectPreset(names).value_or("");
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> summed =
      rules::TpSummedParams(info, deepspeed::ArgsOf(state), family);
  if (!summed.ok()) return {absl::StrCat("could not check for params added once per tp rank: ", summed.status().message())};
  if (summed->empty()) return {};
  std::vector<std::string> names;
  for (const auto& [name, flag] : *summed) names.push_back(absl::StrCat("'", name, "'"));
  const std::string list =
      names.size() <= 4 ? absl::StrJoin(names, ", ")
                        : absl::StrCat(absl::StrJoin(names.begin(), names.begin() + 4, ", "), " and ", names.size() - 4, " more");
  return {absl::StrCat(
      "the model changes: ", names.size(), " params (", list, ") are added once per tp rank before the all-reduce (",
      (*summed)[0].second, " is true), so the model uses tp x the stored value. ",
      target_tp > 0 ? absl::StrCat("Written unchanged at tp ", target_tp, " (saved at tp ", source_tp,
                                   "), the model's value becomes ", target_tp, "/", source_tp, " of what it was")
                    : absl::StrCat("The output holds the stored value (saved at tp ", source_tp,
                                   "): loaded at another tp, the model's value changes in proportion"),
      ", as with DeepSpeed's own converter; `ucp export --names=hf` writes their sum")};
}

}  // namespace ucp::ops
