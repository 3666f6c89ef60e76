// Checkpoint formats as plug-ins: what a source format (a folder layout ucp
// reads) and a target format (one it writes) each provide, and the registry
// that `ops/`, `ucp inspect`, `ucp verify` and the Python module ask, never an
// `if` chain of their own. Each format is one package under formats/
// (formats/deepspeed_zero/, ...) exposing one Register function; the list of
// built-in formats is formats/builtin/builtin.cc. docs/FORMATS.md says how
// to add one.
//
//   path ──ResolveFolder──> CheckpointFolder ──Registry::Detect──> SourceFormat
//        ──Open──> OpenedSource (a state::ModelState, rules decided)
//        ──TargetFormat::Plan──> writers::Plan ──RunPlan──> files
//
// Example:
//   const Registry& r = builtin::Formats();
//   UCP_ASSIGN_OR_RETURN(CheckpointFolder folder, ResolveFolder(r, "/ckpt"));
//   UCP_ASSIGN_OR_RETURN(const SourceFormat* f, r.Detect(folder));
//   UCP_ASSIGN_OR_RETURN(OpenedSource src, f->Open(folder, SourceOptions(), /*describe=*/false));
#ifndef UCP_FORMATS_FORMAT_H_
#define UCP_FORMATS_FORMAT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ucp.pb.h"
#include "rules/resolve.h"
#include "rules/rules.h"
#include "state/model_state.h"
#include "writers/plan.h"
#include "writers/target_options.h"

namespace ucp::formats {

// How a command reads its source: how file contents are trusted, and how the
// tp merges of a source that leaves them open are decided (rules/).
struct SourceOptions {
  rules::RuleResolver::Options rules;
  rules::ReplicatedMismatch replicated_mismatch = rules::ReplicatedMismatch::kError;
  int num_threads = 0;                       // 0 = all cores
  int64_t make_vocab_size_divisible_by = 0;  // 0 = from the checkpoint's args
  // Pipeline layers that use each tied module (--tied_layers=KEY:L1,L2;...).
  std::map<std::string, std::vector<int>> tied_layers;
  // A source's params no rule covers, when it exists at tp=1 only or the
  // command splits nothing (a reshard to tp=1), are whole tensors
  // (rules::ResolveOptions::tp1_whole_tensors).
  bool tp1_whole_tensors = false;
  // Read (and copy) files whose pickles name code-execution globals
  // (format/pickle/unsafe.h; --allow_unsafe_pickle). Never executed.
  bool allow_unsafe_pickles = false;
  // A ucp universal source: check every file against its manifest's digests
  // while opening.
  bool verify_checksums = false;
  // Options of one source format, by keys the format documents
  // (--source_option=KEY=VALUE,...; e.g. formats/deepspeed_zero0's
  // zero0_order). A format ignores the keys of others.
  std::map<std::string, std::string> format_options;

  rules::ResolveOptions resolve() const;
};

// A checkpoint folder as the user named it, resolved: `dir` holds the
// checkpoint's files; `root` and `tag` are its parent and name; `latest_file`
// is the file of `path` that named the tag ("" when `path` is `dir`).
struct CheckpointFolder {
  std::string path;
  std::string dir;
  std::string root;
  std::string tag;
  std::string latest_file;
  std::vector<std::string> names;  // the entries of `dir`
};

class SourceFormat;

// A source opened for a command, with what the command reports of it.
struct OpenedSource {
  std::unique_ptr<state::ModelState> state;
  const SourceFormat* format = nullptr;
  std::string dir;             // the checkpoint folder (a tag folder)
  MergeRules effective_rules;  // the rules in effect, for the manifest
  std::string preset;
  bool preset_detected = false;
};

// A source as its tp ranks hold it, its merges not decided yet, with the
// resolve options its format implies (SourceFormat::OpenSliced).
struct SlicedSource {
  std::shared_ptr<const state::SlicedState> state;
  rules::ResolveOptions resolve;
};

// What `ucp verify` found in one folder.
struct VerifyResult {
  std::string kind;                   // SourceFormat::kind(), or a finer one its Verify sets
  std::string dir;                    // the checkpoint folder checked
  int64_t files_checked = 0;
  std::vector<std::string> problems;  // one line each; empty: all good
};

// A format ucp reads. Implementations are stateless and thread-safe.
class SourceFormat {
 public:
  virtual ~SourceFormat() = default;
  // The registry name: the package's ("deepspeed_zero").
  virtual absl::string_view name() const = 0;
  // The kind reports, manifests and summaries show ("zero", "universal").
  virtual absl::string_view kind() const = 0;
  // What it is, for a user ("DeepSpeed ZeRO stage 1/2 checkpoint").
  virtual absl::string_view summary() const = 0;
  // The `latest`-style file a root of such checkpoints names its tag in
  // ("latest", "latest_universal"), or "" for none.
  virtual absl::string_view latest_file() const = 0;
  // Whether `folder.dir` holds a checkpoint of this format, from its file
  // names (`folder.names`) and at most a few small reads. The registry asks
  // the formats in priority order; the first that says yes reads it.
  virtual bool Detect(const CheckpointFolder& folder) const = 0;

  // Opens the source with every tp merge decided. `describe`: also fill
  // `*description` for the other ranks of an MPI job, so that they open it
  // (Reopen) without reading its metadata or repeating the decisions.
  virtual absl::StatusOr<OpenedSource> Open(const CheckpointFolder& folder, const SourceOptions& options,
                                            JobDescription* description) const = 0;
  virtual absl::StatusOr<OpenedSource> Reopen(const CheckpointFolder& folder, const SourceOptions& options,
                                              const JobDescription& description) const = 0;
  // The source before its tp merges are decided (`ucp rules --suggest`);
  // by default kFailedPrecondition: the format records every merge.
  virtual absl::StatusOr<SlicedSource> OpenSliced(const CheckpointFolder& folder, const SourceOptions& options) const;
  // `ucp inspect`: the folder's kind, topology, groups and every param's
  // fragments. `options.allow_unsafe_pickles` is set: inspecting reads what
  // it reports.
  virtual absl::StatusOr<InspectReport> Inspect(const CheckpointFolder& folder, const SourceOptions& options) const = 0;
  // `ucp verify`: every file opened and checked as thoroughly as reading it
  // for a command would (CRCs, structure, agreement with the other files),
  // every problem reported. `result` has kind and dir set.
  virtual void Verify(const CheckpointFolder& folder, const SourceOptions& options, VerifyResult* result) const = 0;
};

// Which command family writes a target, and from what.
enum class TargetFamily {
  kUniversal,      // `ucp convert`: the full training state, laid out for any topology
  kTrainingState,  // `ucp reshard`: the full training state at a topology
  kWeights,        // `ucp export`: weights only, from a list of tensors
};

// A format ucp writes. Implementations are stateless and thread-safe.
class TargetFormat {
 public:
  virtual ~TargetFormat() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::string_view summary() const = 0;
  virtual TargetFamily family() const = 0;
  // kTrainingState: whether `reshard` writes `info`'s model at `options`
  // with this target when no target is named. Targets are asked in priority
  // order; the first that says yes writes it.
  virtual bool PicksFor(const state::ModelInfo& info, const writers::ZeroWriteOptions& options) const {
    return false;
  }
  // kTrainingState. `summary` (may be null) receives what the target chose.
  virtual absl::StatusOr<std::unique_ptr<writers::Plan>> PlanTrainingState(const state::ModelState& state,
                                                                           const writers::ZeroWriteOptions& options,
                                                                           writers::TargetSummary* summary) const;
  virtual writers::RunOptions TrainingStateRunOptions(const writers::ZeroWriteOptions& options) const;
  // kUniversal.
  virtual absl::StatusOr<std::unique_ptr<writers::Plan>> PlanUniversal(
      const state::ModelState& state, const writers::UniversalWriteOptions& options) const;
  // kUniversal: what the user should know about loading what was written
  // (one line each), e.g. loaders known to drift on such a source.
  virtual std::vector<std::string> UniversalNotes(const state::ModelState& state,
                                                  const writers::UniversalWriteOptions& options) const {
    return {};
  }
  // kWeights: the tensors are moved in.
  virtual absl::StatusOr<std::unique_ptr<writers::Plan>> PlanWeights(std::vector<writers::ExportTensor> tensors,
                                                                     const writers::ExportWriteOptions& options) const;
};

// The formats a binary knows, in priority order.
class Registry {
 public:
  void AddSource(std::unique_ptr<SourceFormat> format);
  void AddTarget(std::unique_ptr<TargetFormat> format);

  const std::vector<std::unique_ptr<SourceFormat>>& sources() const { return sources_; }
  const std::vector<std::unique_ptr<TargetFormat>>& targets() const { return targets_; }
  const SourceFormat* FindSource(absl::string_view name) const;
  const TargetFormat* FindTarget(absl::string_view name) const;

  // The source format of a resolved folder: the first that detects it, else
  // kInvalidArgument naming the folder, what it holds and what ucp reads.
  absl::StatusOr<const SourceFormat*> Detect(const CheckpointFolder& folder) const;
  // `reshard`'s target for `info` at `options`: the one named (--format),
  // else the first kTrainingState target that picks it.
  absl::StatusOr<const TargetFormat*> PickTrainingStateTarget(const state::ModelInfo& info,
                                                             const writers::ZeroWriteOptions& options,
                                                             absl::string_view name = "") const;

 private:
  std::vector<std::unique_ptr<SourceFormat>> sources_;
  std::vector<std::unique_ptr<TargetFormat>> targets_;
};

// The one resolution of a checkpoint path for every command: a folder some
// format detects is the checkpoint; else a root whose `latest` (or another
// latest file a format names, in registry order) names the tag folder.
// kNotFound for a missing path or a tag folder that is not there.
absl::StatusOr<CheckpointFolder> ResolveFolder(const Registry& registry, const std::string& path);

// A Hugging Face model folder around a checkpoint: the Trainer's
// `checkpoint-N/` (config.json, generation_config.json, trainer_state.json,
// rng_state_*.pth, ... beside the DeepSpeed tag folder `global_stepN/` and
// `latest`), or any folder whose tag folder sits beside a config.json.
struct HfFolder {
  std::string dir;          // "" = the checkpoint has none
  bool trainer = false;     // trainer_state.json is there (a Trainer's checkpoint-N)
  std::string config_json;  // the contents of config.json ("" = none)
  std::string model_type;   // its model_type ("" = none)
  std::string architecture; // its architectures[0] ("" = none)
};
// The folder holding the checkpoint folder `checkpoint_dir` (a tag folder),
// when it has a config.json or a trainer_state.json; a config.json that is
// not a JSON object is an error naming it.
absl::StatusOr<HfFolder> HfFolderOf(const std::string& checkpoint_dir);

// Resolves and detects: the folder and its format.
struct DetectedFolder {
  CheckpointFolder folder;
  const SourceFormat* format = nullptr;
};
absl::StatusOr<DetectedFolder> DetectFolder(const Registry& registry, const std::string& path);

// For a format that reads a SlicedState: its OpenedSource with every rule
// decided (rules::ResolveRules), or taken from `decided` (another rank's).
absl::StatusOr<OpenedSource> ResolveSliced(const SourceFormat* format, std::shared_ptr<const state::SlicedState> sliced,
                                           const rules::ResolveOptions& options,
                                           const state::ModelInfo* decided = nullptr);
// For a format whose state lists its files (CheckpointState::InputFiles):
// every file checked by VerifyInput, one problem per failure.
void VerifyStateInputs(const state::CheckpointState& state, VerifyResult* result);
// The model rank 0 decided (JobDescription::resolved), for Reopen.
absl::StatusOr<state::ModelInfo> DecidedModel(const JobDescription& description);

}  // namespace ucp::formats

#endif  // UCP_FORMATS_FORMAT_H_
