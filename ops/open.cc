#include "ops/open.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/manifest.h"
#include "readers/universal_checkpoint.h"
#include "readers/universal_state.h"
#include "readers/moe_state.h"
#include "readers/zero3_state.h"

namespace ucp::ops {

readers::ZeroReadOptions SourceOptions::read() const {
  readers::ZeroReadOptions o;
  o.make_vocab_size_divisible_by = make_vocab_size_divisible_by;
  o.tied_layers = tied_layers;
  return o;
}

rules::ResolveOptions SourceOptions::resolve() const {
  rules::ResolveOptions o;
  o.rules = rules;
  o.replicated_mismatch = replicated_mismatch;
  o.num_threads = num_threads;
  o.tp1_whole_tensors = tp1_whole_tensors;
  return o;
}

bool IsUniversalFolder(const std::string& path) { return readers::LooksLikeUniversalFolder(path); }

absl::StatusOr<std::unique_ptr<rules::ResolvedState>> OpenZeroState(const std::string& path,
                                                                    const SourceOptions& options) {
  if (readers::IsZero3Folder(path)) {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::Zero3State> z3, readers::Zero3State::Open(path));
    rules::ResolveOptions resolve = options.resolve();
    resolve.tp1_whole_tensors = true;
    return rules::ResolveRules(std::move(z3), resolve);
  }
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroCheckpoint> ckpt, readers::ZeroCheckpoint::Open(path));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroSlicedState> sliced,
                       readers::ZeroSlicedState::Make(std::move(ckpt), options.read()));
  return rules::ResolveRules(std::move(sliced), options.resolve());
}

absl::StatusOr<rules::SuggestReport> SuggestZeroRules(const std::string& path, const SourceOptions& options) {
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroCheckpoint> ckpt, readers::ZeroCheckpoint::Open(path));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroSlicedState> sliced,
                       readers::ZeroSlicedState::Make(std::move(ckpt), options.read()));
  return rules::SuggestRules(std::move(sliced), options.resolve());
}

absl::StatusOr<std::unique_ptr<state::ModelState>> OpenModelState(const std::string& path,
                                                                      const SourceOptions& options,
                                                                      bool verify_checksums) {
  UCP_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(path, options, verify_checksums, /*zero_only=*/false, nullptr));
  return std::move(src.state);
}

namespace {

JobDescription::ModuleEntry EncodeModuleEntry(const readers::ModuleEntry& e) {
  JobDescription::ModuleEntry m;
  m.set_name(e.name);
  m.set_local_name(e.local_name);
  m.set_layer(e.layer);
  m.set_role(state::TensorRoleName(e.role));
  m.set_tied_key(e.tied_key);
  m.set_dtype(std::string(torch::DTypeName(e.dtype)));
  for (const auto& shape : e.tp_shapes) {
    auto* t = m.add_tp_shape();
    for (int64_t d : shape) t->add_dim(d);
  }
  return m;
}

absl::StatusOr<readers::ModuleEntry> DecodeModuleEntry(const JobDescription::ModuleEntry& m) {
  readers::ModuleEntry e;
  e.name = m.name();
  e.local_name = m.local_name();
  e.layer = m.layer();
  e.role = m.role() == "trainable" ? state::TensorRole::kTrainable
           : m.role() == "buffer"  ? state::TensorRole::kBuffer
           : m.role() == "tied"    ? state::TensorRole::kTied
                                   : state::TensorRole::kFrozen;
  e.tied_key = m.tied_key();
  UCP_ASSIGN_OR_RETURN(e.dtype, torch::ParseDType(m.dtype()));
  for (const auto& t : m.tp_shape()) e.tp_shapes.emplace_back(t.dim().begin(), t.dim().end());
  return e;
}

// What rank 0 opened, described for the others.
absl::StatusOr<JobDescription> Describe(const OpenedSource& src, const readers::ZeroCheckpoint* zero,
                                        const readers::UniversalCheckpoint* universal,
                                        const state::ModelInfo* universal_reader, bool reinterpreted) {
  JobDescription d;
  d.set_source_kind(src.kind);
  d.set_source_dir(src.dir);
  d.set_preset(src.preset);
  d.set_preset_detected(src.preset_detected);
  *d.mutable_effective_rules() = src.effective_rules;
  *d.mutable_resolved() = deepspeed::ToManifest(src.state->info(), {src.dir, src.kind});
  for (const auto& n : src.state->info().notes) d.add_note(n);
  d.set_reinterpreted(reinterpreted);
  if (zero != nullptr) {
    d.set_has_module_entries(true);
    for (const auto& e : zero->module_entries()) *d.add_module_entry() = EncodeModuleEntry(e);
  }
  if (universal != nullptr) {
    if (universal->manifest() && universal->manifest()->file_size() > 0) {
      *d.mutable_reader() = *universal->manifest();
    } else {
      // A folder without a manifest: one made of what rank 0 read, every
      // file listed, so that the others list no folder.
      Manifest m = deepspeed::ToManifest(*universal_reader, {src.dir, "universal"});
      for (const auto& name : universal->param_names()) {
        for (const auto& s : universal->StateFiles(name)) {
          m.add_file()->set_path(absl::StrCat(deepspeed::kUniversalZeroDir, "/", name, "/", s, ".pt"));
        }
      }
      for (const auto& name : universal->module_names()) {
        m.add_file()->set_path(absl::StrCat(deepspeed::kUniversalModuleDir, "/", name, ".pt"));
      }
      *d.mutable_reader() = std::move(m);
    }
  }
  return d;
}

// A ZeRO-layout source once its rules are resolved: the state, and what the
// resolver decided (the manifest records the rules and the preset).
OpenedSource FromResolved(std::string kind, std::string dir, std::unique_ptr<rules::ResolvedState> state) {
  OpenedSource out;
  out.kind = std::move(kind);
  out.dir = std::move(dir);
  out.effective_rules = state->resolver().EffectiveRules();
  out.preset = state->resolver().preset();
  out.preset_detected = state->resolver().preset_detected();
  out.state = std::move(state);
  return out;
}

// Rank 0's work: open, resolve, and (`describe`) describe for the others.
absl::StatusOr<std::pair<OpenedSource, JobDescription>> OpenAndDescribe(const std::string& path,
                                                                        const SourceOptions& options,
                                                                        bool verify_checksums, bool zero_only,
                                                                        bool describe) {
  OpenedSource out;
  if (IsUniversalFolder(path)) {
    if (zero_only) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": a universal checkpoint; this command reads ZeRO ones"));
    }
    readers::UniversalCheckpoint::Options o;
    o.verify_checksums = verify_checksums;
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::UniversalCheckpoint> u, readers::UniversalCheckpoint::Open(path, o));
    std::shared_ptr<const readers::UniversalCheckpoint> shared(std::move(u));
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::UniversalModelState> reader,
                         readers::UniversalModelState::Make(shared));
    out.kind = "universal";
    out.dir = shared->dir();
    const bool reinterpret = !reader->layout_recorded();
    JobDescription d;
    if (reinterpret) {
      state::ModelInfo reader_info = reader->info();  // described: the others re-merge it too
      UCP_ASSIGN_OR_RETURN(out.state, rules::ReinterpretDeepSpeedUniversal(
                                          std::move(reader), shared->model_states().universal_checkpoint_info(),
                                          options.rules, shared->dir()));
      if (describe) {
        UCP_ASSIGN_OR_RETURN(d, Describe(out, nullptr, shared.get(), &reader_info, true));
      }
    } else {
      out.state = std::move(reader);
      if (describe) {
        UCP_ASSIGN_OR_RETURN(d, Describe(out, nullptr, shared.get(), &out.state->info(), false));
      }
    }
    return std::make_pair(std::move(out), std::move(d));
  }
  if (readers::IsMoeFolder(path)) {
    // Native mixture of experts: tp = pp = 1, experts under global ids.
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::MoeState> moe, readers::MoeState::Open(path));
    const std::string dir = moe->dir();
    rules::ResolveOptions resolve = options.resolve();
    resolve.tp1_whole_tensors = true;
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<rules::ResolvedState> state, rules::ResolveRules(std::move(moe), resolve));
    out = FromResolved("moe", dir, std::move(state));
    JobDescription d;
    if (describe) {
      UCP_ASSIGN_OR_RETURN(d, Describe(out, nullptr, nullptr, nullptr, false));
    }
    return std::make_pair(std::move(out), std::move(d));
  }
  if (readers::IsZero3Folder(path)) {
    // ZeRO stage 3: tp = pp = 1, nothing to merge.
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::Zero3State> z3, readers::Zero3State::Open(path));
    const std::string dir = z3->dir();
    rules::ResolveOptions resolve = options.resolve();
    resolve.tp1_whole_tensors = true;
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<rules::ResolvedState> state, rules::ResolveRules(std::move(z3), resolve));
    out = FromResolved("zero3", dir, std::move(state));
    JobDescription d;
    if (describe) {
      UCP_ASSIGN_OR_RETURN(d, Describe(out, nullptr, nullptr, nullptr, false));
    }
    return std::make_pair(std::move(out), std::move(d));
  }
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroCheckpoint> ckpt, readers::ZeroCheckpoint::Open(path));
  std::shared_ptr<const readers::ZeroCheckpoint> shared(std::move(ckpt));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroSlicedState> sliced,
                       readers::ZeroSlicedState::Make(shared, options.read()));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<rules::ResolvedState> state,
                       rules::ResolveRules(std::move(sliced), options.resolve()));
  out = FromResolved("zero", shared->dir(), std::move(state));
  JobDescription d;
  if (describe) {
    UCP_ASSIGN_OR_RETURN(d, Describe(out, shared.get(), nullptr, nullptr, false));
  }
  return std::make_pair(std::move(out), std::move(d));
}

// The other ranks' work: open from rank 0's description.
absl::StatusOr<OpenedSource> OpenFromDescription(const std::string& path, const SourceOptions& options,
                                                 const JobDescription& d) {
  OpenedSource out;
  out.kind = d.source_kind();
  out.dir = d.source_dir();
  out.effective_rules = d.effective_rules();
  out.preset = d.preset();
  out.preset_detected = d.preset_detected();
  UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, deepspeed::FromManifest(d.resolved()));
  if (d.source_kind() == "universal") {
    readers::UniversalCheckpoint::Options o;
    o.given_manifest = d.reader();
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::UniversalCheckpoint> u, readers::UniversalCheckpoint::Open(path, o));
    std::shared_ptr<const readers::UniversalCheckpoint> shared(std::move(u));
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::UniversalModelState> reader,
                         readers::UniversalModelState::Make(shared));
    if (d.reinterpreted()) {
      UCP_ASSIGN_OR_RETURN(out.state, rules::ReinterpretDeepSpeedUniversal(
                                          std::move(reader), shared->model_states().universal_checkpoint_info(),
                                          options.rules, shared->dir(), &decided));
    } else {
      out.state = std::move(reader);
    }
    return out;
  }
  if (d.source_kind() == "moe") {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::MoeState> moe, readers::MoeState::Open(path));
    UCP_ASSIGN_OR_RETURN(out.state, rules::ResolveRules(std::move(moe), options.resolve(), &decided));
    return out;
  }
  if (d.source_kind() == "zero3") {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::Zero3State> z3, readers::Zero3State::Open(path));
    UCP_ASSIGN_OR_RETURN(out.state, rules::ResolveRules(std::move(z3), options.resolve(), &decided));
    return out;
  }
  std::vector<readers::ModuleEntry> entries;
  for (const auto& m : d.module_entry()) {
    UCP_ASSIGN_OR_RETURN(readers::ModuleEntry e, DecodeModuleEntry(m));
    entries.push_back(std::move(e));
  }
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroCheckpoint> ckpt,
                       readers::ZeroCheckpoint::Open(path, std::move(entries)));
  std::shared_ptr<const readers::ZeroCheckpoint> shared(std::move(ckpt));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroSlicedState> sliced,
                       readers::ZeroSlicedState::Make(shared, options.read()));
  UCP_ASSIGN_OR_RETURN(out.state, rules::ResolveRules(std::move(sliced), options.resolve(), &decided));
  return out;
}

}  // namespace

absl::StatusOr<OpenedSource> OpenSource(const std::string& path, const SourceOptions& options, bool verify_checksums,
                                        bool zero_only, Cluster* cluster) {
  if (cluster == nullptr || cluster->size() == 1) {
    UCP_ASSIGN_OR_RETURN(auto opened, OpenAndDescribe(path, options, verify_checksums, zero_only, /*describe=*/false));
    return std::move(opened.first);
  }
  JobMessage mine;
  std::optional<OpenedSource> src;
  if (cluster->rank() == 0) {
    auto opened = OpenAndDescribe(path, options, verify_checksums, zero_only, /*describe=*/true);
    if (opened.ok()) {
      mine.set_payload(opened->second.SerializeAsString());
      src = std::move(opened->first);
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

}  // namespace ucp::ops
