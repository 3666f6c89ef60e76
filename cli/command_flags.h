// The flags of `ucp convert`, `reshard` and `export` (and of a source
// checkpoint) as one object per command: it registers its flags on a FlagSet
// and, once they are parsed, fills the ops:: options. The CLI (tools/cmd_*.cc)
// and the Python module (python/ucp_module.cc, where keyword arguments become
// these flags) share them, so both accept exactly the same options with the
// same checks and defaults.
//
// Example:
//   FlagSet f("convert", "...");
//   ConvertFlags c;
//   c.Register(f);
//   UCP_ASSIGN_OR_RETURN(auto positional, f.Parse(argc, argv));
//   UCP_RETURN_IF_ERROR(c.Finish());
//   // c.options is ready but for options.write.progress and options.cluster.
#ifndef UCP_CLI_COMMAND_FLAGS_H_
#define UCP_CLI_COMMAND_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ops/convert.h"
#include "ops/export.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "cli/flags.h"

namespace ucp::cli {

// --progress=auto|always|never|json (cli/progress.h).
void RegisterProgressFlag(FlagSet& f, std::string* mode);
// --allow_unsafe_pickle: read (and copy) a checkpoint whose pickles name
// code-execution globals (Finish() sets the source's allow_unsafe_pickles).
void RegisterUnsafePickleFlag(FlagSet& f, bool* allow);
// --update_latest: repoint a `latest` in the input checkpoint's root.
void RegisterUpdateLatestFlag(FlagSet& f, bool* update);
// --fsync (default true): --fsync=false skips the fsync of the output before
// its rename into place (and the early writeback): faster, like cp -r, but
// not crash-safe. Finish() puts it in the command's write options.
void RegisterFsyncFlag(FlagSet& f, bool* fsync);

// Flags shared by convert, reshard, export (and the Python module's open) for
// reading a ZeRO checkpoint.
// --source_option: options of the source's format as KEY=VALUE,... (its help
// text, and its parse into formats::SourceOptions::format_options).
extern const char kSourceOptionHelp[];
absl::Status ParseSourceOptions(absl::string_view text, std::map<std::string, std::string>* out);

struct ZeroSourceFlags {
  std::string rules, preset, mismatch = "error", default_kind, tied_layers, source_options;
  int64_t original_vocab_size = 0;

  void Register(FlagSet& f);
  absl::StatusOr<ops::SourceOptions> Options(int threads, int64_t divisible_by) const;
};

// What convert, reshard and export share: the source checkpoint's flags, how
// it is read (--allow_unsafe_pickle) and the output written (--fsync), the
// progress display and the thread count. Each command registers them where
// its --help lists them, and Finish()es them into its options with
// SourceOptions() and FinishWrite().
struct CommandFlags {
  CommandFlags() = default;
  CommandFlags(const CommandFlags&) = delete;  // the FlagSet points into it
  CommandFlags& operator=(const CommandFlags&) = delete;

  ZeroSourceFlags src;
  bool allow_unsafe_pickle = false;
  bool fsync = true;
  bool timings = false;  // --timings: where the time went, by phase, on stderr
  std::string progress = "auto";

 protected:
  ~CommandFlags() = default;

  // --num_threads, with the command's help line.
  void RegisterThreadsFlag(FlagSet& f, const std::string& help);
  // --allow_unsafe_pickle, --fsync, then --timings.
  void RegisterReadWriteFlags(FlagSet& f);
  // --progress, the source flags, --allow_unsafe_pickle and --fsync, in
  // that order (the tail of reshard's and export's flags).
  void RegisterSharedFlags(FlagSet& f);
  // The source options (src's, with allow_unsafe_pickle).
  absl::StatusOr<ops::SourceOptions> SourceOptions(int threads, int64_t divisible_by) const;
  // --fsync and the threads into a command's write options.
  template <typename WriteOptions>
  void FinishWrite(int threads, WriteOptions& write) const {
    write.fsync = fsync;
    write.num_threads = threads;
  }

  int threads_ = 0;
};

struct ConvertFlags : CommandFlags {
  ops::ConvertOptions options;
  bool explain = false;

  void Register(FlagSet& f);
  absl::Status Finish();

 private:
  bool keep_ = false;
  int extract_workers_ = 0;
  int64_t divisible_by_ = 0;
  std::string digest_ = "xxh3";
  std::string hf_config_;
};

struct ReshardFlags : CommandFlags {
  ops::ReshardOptions options;

  void Register(FlagSet& f);
  absl::Status Finish();

 private:
  std::string layer_types_;
};

struct ExportFlags : CommandFlags {
  ops::ExportOptions options;

  void Register(FlagSet& f);
  absl::Status Finish();

 private:
  std::string format_ = "safetensors", max_shard_ = "5GB", hf_config_;
};

// The lines `ucp convert|reshard|export` print on stdout after a successful
// run (not a dry run: that prints the result's plan).
std::string ConvertReport(const ConvertFlags& flags, const ops::ConvertResult& result);
std::string ReshardReport(const ReshardFlags& flags, const ops::ReshardResult& result);
std::string ExportReport(const ExportFlags& flags, const ops::ExportResult& result);

}  // namespace ucp::cli

#endif  // UCP_CLI_COMMAND_FLAGS_H_
