#include "formats/deepspeed_universal/format.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/layout_math.h"
#include "deepspeed/manifest.h"
#include "deepspeed/read_options.h"
#include "formats/deepspeed_universal/universal_checkpoint.h"
#include "formats/deepspeed_universal/universal_state.h"
#include "formats/deepspeed_universal/universal_writer.h"
#include "formats/deepspeed_universal/zero3_universal.h"
#include "formats/deepspeed_source.h"
#include "formats/deepspeed_zero3/zero3_state.h"
#include "rules/resolve.h"

namespace ucp::deepspeed_universal {
namespace {

using deepspeed::ZeroParam;
using pickle::Kind;
using pickle::Value;

// What rank 0 opened, for the others: the folder's manifest, or one made of
// what rank 0 read of a folder without (every file listed), so that the
// others list no folder.
Manifest ReaderManifest(const UniversalCheckpoint& u, const state::ModelInfo& reader_info) {
  if (u.manifest() && u.manifest()->file_size() > 0) return *u.manifest();
  Manifest m = deepspeed::ToManifest(reader_info, {u.dir(), std::string(kKind)});
  for (const auto& name : u.param_names()) {
    for (const auto& s : u.StateFiles(name)) {
      m.add_file()->set_path(absl::StrCat(deepspeed::kUniversalZeroDir, "/", name, "/", s, ".pt"));
    }
  }
  for (const auto& name : u.module_names()) {
    m.add_file()->set_path(absl::StrCat(deepspeed::kUniversalModuleDir, "/", name, ".pt"));
  }
  return m;
}

absl::StatusOr<InspectReport> InspectUniversal(const std::string& path, const deepspeed::ReadOptions& read) {
  UniversalCheckpoint::Options o;
  o.read = read;
  UCP_ASSIGN_OR_RETURN(auto u, UniversalCheckpoint::Open(path, o));
  InspectReport report;
  report.set_path(u->dir());
  report.set_kind("universal");
  report.set_tag(u->tag());
  *report.mutable_topology() = u->model_states().topology().ToProto();
  report.set_pipeline(u->model_states().pipeline());
  report.set_lp_dtype(std::string(torch::DTypeName(u->model_states().config_lp_dtype())));
  const Value* ver = u->model_states().file(0, 0).root()->DictGet("ds_version");
  if (ver != nullptr && ver->is(Kind::kStr)) report.set_ds_version(ver->str());
  std::set<std::string> undecided;  // tp split unknown, by the manifest
  if (u->manifest()) {
    for (const auto& mp : u->manifest()->param()) {
      if (mp.source() == UNDECIDED) undecided.insert(mp.name());
    }
  }
  for (const ZeroParam& p : u->model_states().params()) {
    UCP_ASSIGN_OR_RETURN(UniversalStateFile f, u->ReadState(p.name, "fp32"));
    InspectReport::Param* ip = report.add_param();
    ip->set_name(p.name);
    for (int64_t d : f.param.sizes()) ip->add_shape(d);
    ip->set_dtype(std::string(torch::DTypeName(f.param.dtype())));
    ip->set_group(p.group);
    ip->set_layer(p.layer);
    ip->set_undecided(undecided.count(p.name) > 0);
    for (const auto& s : u->StateFiles(p.name)) {
      InspectReport::Fragment* fr = ip->add_fragment();
      fr->set_file(JoinPath(JoinPath(deepspeed::kUniversalZeroDir, p.name), s + ".pt"));
    }
  }
  for (const auto& name : u->module_names()) {
    UCP_ASSIGN_OR_RETURN(UniversalStateFile f, u->ReadModule(name));
    InspectReport::Param* ip = report.add_param();
    ip->set_name(name);
    for (int64_t d : f.param.sizes()) ip->add_shape(d);
    ip->set_dtype(std::string(torch::DTypeName(f.param.dtype())));
    ip->set_group(-1);
    ip->set_frozen(true);
    ip->add_fragment()->set_file(JoinPath(deepspeed::kUniversalModuleDir, name + ".pt"));
  }
  return report;
}

// A step value as text: a 0-dim tensor by value, anything else as Python.
std::string StepText(const torch::TorchFile& f, const Value& v) {
  const Value* x = &v;
  if (v.is(Kind::kDict)) {
    const Value* p = v.DictGet("param");
    if (p == nullptr) p = v.DictGet("step");
    if (p != nullptr) x = p;
  }
  if (torch::TorchFile::IsTensor(*x)) {
    auto t = f.GetTensor(*x);
    if (!t.ok() || t->numel() != 1) return x->DebugString(60);
    const std::string b = t->ContiguousBytes();
    if (t->dtype() == torch::DType::kFloat32 && b.size() == 4) {
      float y;
      std::memcpy(&y, b.data(), 4);
      return absl::StrCat(y);
    }
    if (t->dtype() == torch::DType::kInt64 && b.size() == 8) {
      int64_t y;
      std::memcpy(&y, b.data(), 8);
      return absl::StrCat(y);
    }
    return absl::StrCat(std::string(torch::DTypeName(t->dtype())), ":", absl::BytesToHexString(b));
  }
  return x->DebugString(60);
}

void VerifyUniversal(const std::string& path, const deepspeed::ReadOptions& read, formats::VerifyResult& r) {
  UniversalCheckpoint::Options o;
  o.read = read;
  absl::StatusOr<std::unique_ptr<UniversalCheckpoint>> opened = UniversalCheckpoint::Open(path, o);
  if (!opened.ok()) {
    r.problems.push_back(std::string(opened.status().message()));
    return;
  }
  const UniversalCheckpoint& u = **opened;
  r.dir = u.dir();
  if (u.manifest()) {
    absl::Status st = u.VerifyChecksums();
    if (!st.ok()) r.problems.push_back(std::string(st.message()));
  }
  std::map<std::string, std::string> first_step;  // step text -> the first param with it
  for (const std::string& name : u.param_names()) {
    for (const std::string& s : u.StateFiles(name)) {
      ++r.files_checked;
      if (s == "step") {
        absl::StatusOr<std::shared_ptr<const torch::TorchFile>> f = u.ReadStep(name);
        if (!f.ok()) {
          r.problems.push_back(std::string(f.status().message()));
        } else if (*f) {
          first_step.emplace(StepText(**f, *(*f)->root()), name);
        }
        continue;
      }
      absl::StatusOr<UniversalStateFile> f = u.ReadState(name, s);
      if (!f.ok()) r.problems.push_back(std::string(f.status().message()));
    }
  }
  if (first_step.size() > 1) {
    std::string line = absl::StrCat(JoinPath(u.dir(), deepspeed::kUniversalZeroDir),
                                    ": the params' step.pt disagree (files from different saves):");
    for (const auto& [step, name] : first_step) absl::StrAppend(&line, " step ", step, " in ", name, "/step.pt;");
    r.problems.push_back(line);
  }
  for (const std::string& name : u.module_names()) {
    ++r.files_checked;
    absl::StatusOr<UniversalStateFile> f = u.ReadModule(name);
    if (!f.ok()) r.problems.push_back(std::string(f.status().message()));
  }
}


class Source : public formats::SourceFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view kind() const override { return kKind; }
  absl::string_view summary() const override {
    return "a universal checkpoint (zero/<param>/<state>.pt beside the model states)";
  }
  absl::string_view latest_file() const override { return deepspeed::kLatestUniversalFile; }

  bool Detect(const formats::CheckpointFolder& folder) const override {
    for (const std::string& n : folder.names) {
      if (n == deepspeed::kUniversalZeroDir) return IsDirectory(JoinPath(folder.dir, n));
    }
    return false;
  }

  absl::StatusOr<formats::OpenedSource> Open(const formats::CheckpointFolder& folder,
                                             const formats::SourceOptions& options,
                                             JobDescription* description) const override {
    if (IsZero3UniversalLayout(folder.names)) {
      // (verify_checksums: every file against ucp's manifest first, as for
      // the stage 1/2 layout; a folder without one is refused.)
      if (options.verify_checksums) UCP_RETURN_IF_ERROR(VerifyManifestChecksums(folder.dir));
      UCP_ASSIGN_OR_RETURN(auto z3, deepspeed_zero3::Zero3State::OpenUniversal(
                                        folder.dir, formats::DeepSpeedReadOptions(options)));
      return formats::ResolveSliced(this, std::move(z3), formats::WholeTensorResolve(options));
    }
    UniversalCheckpoint::Options o;
    o.verify_checksums = options.verify_checksums;
    o.read = formats::DeepSpeedReadOptions(options);
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<UniversalCheckpoint> u, UniversalCheckpoint::Open(folder.dir, o));
    std::shared_ptr<const UniversalCheckpoint> shared(std::move(u));
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<UniversalModelState> reader, UniversalModelState::Make(shared));
    formats::OpenedSource out;
    out.format = this;
    out.dir = shared->dir();
    // A folder DeepSpeed wrote without patterns: re-merge what it
    // concatenated on dim 0 where a rule source or the evidence knows better.
    const bool reinterpret = !reader->layout_recorded();
    if (description != nullptr) {
      *description->mutable_reader() = ReaderManifest(*shared, reader->info());
      description->set_reinterpreted(reinterpret);
    }
    if (reinterpret) {
      UCP_ASSIGN_OR_RETURN(out.state, rules::ReinterpretDeepSpeedUniversal(
                                          std::move(reader), shared->model_states().universal_checkpoint_info(),
                                          options.rules, shared->dir()));
    } else {
      out.state = std::move(reader);
    }
    return out;
  }

  absl::StatusOr<formats::OpenedSource> Reopen(const formats::CheckpointFolder& folder,
                                               const formats::SourceOptions& options,
                                               const JobDescription& description) const override {
    if (IsZero3UniversalLayout(folder.names)) {
      UCP_ASSIGN_OR_RETURN(auto z3, deepspeed_zero3::Zero3State::OpenUniversal(
                                        folder.dir, formats::DeepSpeedReadOptions(options)));
      UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, formats::DecidedModel(description));
      return formats::ResolveSliced(this, std::move(z3), formats::WholeTensorResolve(options), &decided);
    }
    UniversalCheckpoint::Options o;
    o.given_manifest = description.reader();
    o.read = formats::DeepSpeedReadOptions(options);
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<UniversalCheckpoint> u, UniversalCheckpoint::Open(folder.dir, o));
    std::shared_ptr<const UniversalCheckpoint> shared(std::move(u));
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<UniversalModelState> reader, UniversalModelState::Make(shared));
    formats::OpenedSource out;
    out.format = this;
    out.dir = shared->dir();
    if (description.reinterpreted()) {
      UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, formats::DecidedModel(description));
      UCP_ASSIGN_OR_RETURN(out.state, rules::ReinterpretDeepSpeedUniversal(
                                          std::move(reader), shared->model_states().universal_checkpoint_info(),
                                          options.rules, shared->dir(), &decided));
    } else {
      out.state = std::move(reader);
    }
    return out;
  }

  absl::StatusOr<InspectReport> Inspect(const formats::CheckpointFolder& folder,
                                        const formats::SourceOptions& options) const override {
    if (IsZero3UniversalLayout(folder.names)) {
      UCP_ASSIGN_OR_RETURN(auto z3, Zero3UniversalFolder::Open(folder.dir, formats::DeepSpeedReadOptions(options)));
      return z3->Report();
    }
    return InspectUniversal(folder.dir, formats::DeepSpeedReadOptions(options));
  }

  void Verify(const formats::CheckpointFolder& folder, const formats::SourceOptions& options,
              formats::VerifyResult* result) const override {
    if (IsZero3UniversalLayout(folder.names)) {
      result->kind = kZero3UniversalKind;
      absl::StatusOr<std::unique_ptr<Zero3UniversalFolder>> z3 = Zero3UniversalFolder::Open(folder.dir, formats::DeepSpeedReadOptions(options));
      if (!z3.ok()) {
        result->problems.push_back(std::string(z3.status().message()));
        return;
      }
      (*z3)->Verify(result);
      return;
    }
    VerifyUniversal(folder.dir, formats::DeepSpeedReadOptions(options), *result);
  }
};

class Target : public formats::TargetFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override {
    return "a universal checkpoint (DeepSpeed's layout, loadable at any tp/pp/dp)";
  }
  formats::TargetFamily family() const override { return formats::TargetFamily::kUniversal; }
  absl::StatusOr<std::unique_ptr<writers::Plan>> PlanUniversal(
      const state::ModelState& state, const writers::UniversalWriteOptions& options) const override {
    return deepspeed_universal::PlanUniversal(state, options);
  }
  std::vector<std::string> UniversalNotes(const state::ModelState& state,
                                          const writers::UniversalWriteOptions& options) const override {
    std::vector<std::string> notes;
    const state::ModelInfo& info = state.info();
    if (PlainModuleAtTpAboveOne(info) && !options.single_mp_rank_file) {
      notes.push_back(absl::StrCat(
          "a plain (non-pipeline) module at tp=", info.source_topology.tp, ": the folder keeps its ",
          info.source_topology.tp, " mp_rank files, which DeepSpeed (0.12 to 0.19.5) universal-loads only at tp >= ",
          info.source_topology.tp, " (for a smaller tp its loader merges them by Megatron's key names and asserts "
          "they exist); for a smaller tp, convert without --single_mp_rank_file=false or `ucp reshard` to the target"));
    }
    if (info.zero_stage == 3 && info.source_topology.tp > 1) {
      // Measured on 0.19.5 and master (realds/README.md): their stage-3
      // loader cuts a param's tp slice from the merged tensor for AutoTP
      // params only, and their ZeRO-1/2 engines glob mp_rank_*_model_states.pt.
      const int tp = info.source_topology.tp;
      notes.push_back(absl::StrCat(
          "ZeRO stage 3 at tp=", tp, ": every param merged over tp (as DeepSpeed's converter writes it), ",
          options.single_mp_rank_file
              ? "mp rank 0's model states as a tp=1 job's (one file per dp rank): DeepSpeed's load_universal "
                "(0.19.5 and later) reads it with ZeRO-3 at tp 1 and, for an AutoTP model, at tp > 1 (its loader cuts "
                "each rank's slice; seen at tp 2); a Megatron-style module (no AutoTP) only at tp 1, since the loader "
                "takes the whole tensor as its tp slice"
              : absl::StrCat("every mp rank's model states copied: DeepSpeed's load_universal (0.19.5 and later) "
                             "reads it with ZeRO-3 at tp=", tp, " only, and for an AutoTP model only (at another tp "
                             "it merges or splits the model-state files by Megatron's key names)"),
          "; not with ZeRO-1/2 (no mp_rank_*_model_states.pt); `ucp reshard` writes any of those"));
    }
    if (info.zero_stage == 3) {
      // The files are DeepSpeed's own layout (ds_to_universal.py writes the
      // same); the drift comes from DeepSpeed's stage-3 universal loader, seen
      // with 0.18.9 and 0.19.5 (../shared/docs/DEEPSPEED-VERSIONS.md, result 3).
      const std::string version = UniversalLoaderVersion(state, options);
      auto v = deepspeed::ParseDsVersion(version);
      if (v.ok() && !(*v < deepspeed::DsVersion{0, 18, 0})) {
        notes.push_back(absl::StrCat(
            "ZeRO stage 3: DeepSpeed ", version, "'s stage-3 universal loader (0.18.0 to 0.19.6) gives every sub-group "
            "of the loading job one shared `step` tensor",
            info.num_groups > 1 ? absl::StrCat(" and all ", info.num_groups,
                                               " param groups group 0's hyper-parameters (lr, weight_decay, ...)")
                                : "",
            ", so a resumed run drifts; `ucp reshard --dp=N --sub_group_size=S` writes a ZeRO-3 checkpoint for the "
            "new topology that keeps every sub-group's step and each group's own hyper-parameters"));
      }
    }
    return notes;
  }
};

}  // namespace

void Register(formats::Registry& registry) {
  registry.AddSource(std::make_unique<Source>());
  registry.AddTarget(std::make_unique<Target>());
}

}  // namespace ucp::deepspeed_universal
