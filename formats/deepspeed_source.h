// What the DeepSpeed source formats (formats/deepspeed_*) share: the read
// options a command's SourceOptions give their files, and the source format of
// a checkpoint read as one sliced state at tp = pp = 1 (ZeRO stage 3, native
// MoE), whose open, reopen, inspect and verify differ only in the state class.
//
// Example (formats/deepspeed_zero3/format.cc):
//   class Source : public formats::SlicedStateSource<Zero3State> {
//     ... name, kind, summary, Detect, KindDetail, DsVersion
//   };
#ifndef UCP_FORMATS_DEEPSPEED_SOURCE_H_
#define UCP_FORMATS_DEEPSPEED_SOURCE_H_

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/read_options.h"
#include "deepspeed/sliced_report.h"
#include "formats/format.h"

namespace ucp::formats {

// How a DeepSpeed reader opens the files of a command with these options.
inline deepspeed::ReadOptions DeepSpeedReadOptions(const SourceOptions& options) {
  deepspeed::ReadOptions r;
  r.allow_unsafe_pickles = options.allow_unsafe_pickles;
  return r;
}

// The resolve options of a source that exists at tp = pp = 1: a param no rule
// covers is a whole tensor.
inline rules::ResolveOptions WholeTensorResolve(const SourceOptions& options) {
  rules::ResolveOptions r = options.resolve();
  r.tp1_whole_tensors = true;
  return r;
}

template <typename S, typename = void>
struct OpensWithReadOptions : std::false_type {};
template <typename S>
struct OpensWithReadOptions<S, std::void_t<decltype(S::Open(std::string(), deepspeed::ReadOptions()))>>
    : std::true_type {};

// A source format whose checkpoint is `State` (a state::SlicedState with
// `static absl::StatusOr<std::unique_ptr<State>> Open(dir, deepspeed::ReadOptions)`,
// or another way to open it: OpenState). Also the sources of other stacks read
// as one sliced state at tp = pp = 1 (formats/deepspeed_zero0, formats/dcp,
// formats/hf), which override OpenState, latest_file and ReopenResolve.
template <typename State>
class SlicedStateSource : public SourceFormat {
 public:
  absl::string_view latest_file() const override { return deepspeed::kLatestFile; }

  absl::StatusOr<OpenedSource> Open(const CheckpointFolder& folder, const SourceOptions& options,
                                    JobDescription* description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<State> s, OpenState(folder, options));
    return ResolveSliced(this, std::move(s), ResolveOf(options));
  }

  absl::StatusOr<OpenedSource> Reopen(const CheckpointFolder& folder, const SourceOptions& options,
                                      const JobDescription& description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<State> s, OpenState(folder, options));
    UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, DecidedModel(description));
    return ResolveSliced(this, std::move(s), ReopenResolve(options), &decided);
  }

  absl::StatusOr<SlicedSource> OpenSliced(const CheckpointFolder& folder,
                                          const SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<State> s, OpenState(folder, options));
    return SlicedSource{std::move(s), ResolveOf(options)};
  }

  absl::StatusOr<InspectReport> Inspect(const CheckpointFolder& folder,
                                        const SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<State> s, OpenState(folder, options));
    UCP_ASSIGN_OR_RETURN(InspectReport report, deepspeed::SlicedReport(*s, std::string(kind()), DsVersion(*s)));
    Describe(*s, &report);
    return report;
  }

  void Verify(const CheckpointFolder& folder, const SourceOptions& options, VerifyResult* result) const override {
    absl::StatusOr<std::unique_ptr<State>> s = OpenState(folder, options);
    if (!s.ok()) {
      result->problems.push_back(std::string(s.status().message()));
      return;
    }
    VerifyStateInputs(**s, result);
  }

 protected:
  // Opens the state of a folder: State::Open with the DeepSpeed read options;
  // a State opened otherwise (no such Open) must override it.
  virtual absl::StatusOr<std::unique_ptr<State>> OpenState(const CheckpointFolder& folder,
                                                           const SourceOptions& options) const {
    if constexpr (OpensWithReadOptions<State>::value) {
      return State::Open(folder.dir, DeepSpeedReadOptions(options));
    } else {
      return absl::InternalError(absl::StrCat(name(), ": no OpenState for this source"));
    }
  }
  // The resolve options of a reopen (an MPI rank, the model decided by rank 0).
  virtual rules::ResolveOptions ReopenResolve(const SourceOptions& options) const { return options.resolve(); }
  // The DeepSpeed version `inspect` reports for the state.
  virtual std::string DsVersion(const State& s) const = 0;
  // `inspect`'s kind detail, given the report made of the state.
  virtual std::string KindDetail(const InspectReport& report) const { return ""; }
  // What `inspect` adds to the report made of the state (default: KindDetail).
  virtual void Describe(const State& s, InspectReport* report) const { report->set_kind_detail(KindDetail(*report)); }

  // The state exists at tp = pp = 1: a param no rule covers is a whole tensor.
  static rules::ResolveOptions ResolveOf(const SourceOptions& options) { return WholeTensorResolve(options); }
};

}  // namespace ucp::formats

#endif  // UCP_FORMATS_DEEPSPEED_SOURCE_H_
