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
#include <utility>

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

// A source format whose checkpoint is `State` (a state::SlicedState with
// `static absl::StatusOr<std::unique_ptr<State>> Open(dir, deepspeed::ReadOptions)`).
template <typename State>
class SlicedStateSource : public SourceFormat {
 public:
  absl::string_view latest_file() const override { return deepspeed::kLatestFile; }

  absl::StatusOr<OpenedSource> Open(const CheckpointFolder& folder, const SourceOptions& options,
                                    JobDescription* description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<State> s, State::Open(folder.dir, DeepSpeedReadOptions(options)));
    return ResolveSliced(this, std::move(s), ResolveOf(options));
  }

  absl::StatusOr<OpenedSource> Reopen(const CheckpointFolder& folder, const SourceOptions& options,
                                      const JobDescription& description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<State> s, State::Open(folder.dir, DeepSpeedReadOptions(options)));
    UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, DecidedModel(description));
    return ResolveSliced(this, std::move(s), options.resolve(), &decided);
  }

  absl::StatusOr<SlicedSource> OpenSliced(const CheckpointFolder& folder,
                                          const SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<State> s, State::Open(folder.dir, DeepSpeedReadOptions(options)));
    return SlicedSource{std::move(s), ResolveOf(options)};
  }

  absl::StatusOr<InspectReport> Inspect(const CheckpointFolder& folder,
                                        const SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<State> s, State::Open(folder.dir, DeepSpeedReadOptions(options)));
    UCP_ASSIGN_OR_RETURN(InspectReport report, deepspeed::SlicedReport(*s, std::string(kind()), DsVersion(*s)));
    report.set_kind_detail(KindDetail(report));
    return report;
  }

  void Verify(const CheckpointFolder& folder, const SourceOptions& options, VerifyResult* result) const override {
    absl::StatusOr<std::unique_ptr<State>> s = State::Open(folder.dir, DeepSpeedReadOptions(options));
    if (!s.ok()) {
      result->problems.push_back(std::string(s.status().message()));
      return;
    }
    VerifyStateInputs(**s, result);
  }

 protected:
  // The DeepSpeed version `inspect` reports for the state.
  virtual std::string DsVersion(const State& s) const = 0;
  // `inspect`'s kind detail, given the report made of the state.
  virtual std::string KindDetail(const InspectReport& report) const = 0;

 private:
  // The state exists at tp = pp = 1: a param no rule covers is a whole tensor.
  static rules::ResolveOptions ResolveOf(const SourceOptions& options) {
    rules::ResolveOptions r = options.resolve();
    r.tp1_whole_tensors = true;
    return r;
  }
};

}  // namespace ucp::formats

#endif  // UCP_FORMATS_DEEPSPEED_SOURCE_H_
