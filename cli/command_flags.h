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
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
struct ZeroSourceFlags {
  std::string rules, preset, mismatch = "error", default_kind, tied_layers;
  int64_t original_vocab_size = 0;

  void Register(FlagSet& f);
  absl::StatusOr<ops::SourceOptions> Options(int threads, int64_t divisible_by) const;
};

struct ConvertFlags {
  ConvertFlags() = default;
  ConvertFlags(const ConvertFlags&) = delete;  // the FlagSet points into it
  ConvertFlags& operator=(const ConvertFlags&) = delete;

  ops::ConvertOptions options;
  ZeroSourceFlags src;
  bool explain = false;
  bool allow_unsafe_pickle = false;
  bool fsync = true;
  std::string progress = "auto";

  void Register(FlagSet& f);
  absl::Status Finish();

 private:
  bool keep_ = false;
  int threads_ = 0, extract_workers_ = 0;
  int64_t divisible_by_ = 0;
  std::string digest_ = "xxh3";
};

struct ReshardFlags {
  ReshardFlags() = default;
  ReshardFlags(const ReshardFlags&) = delete;  // the FlagSet points into it
  ReshardFlags& operator=(const ReshardFlags&) = delete;

  ops::ReshardOptions options;
  ZeroSourceFlags src;
  bool allow_unsafe_pickle = false;
  bool fsync = true;
  std::string progress = "auto";

  void Register(FlagSet& f);
  absl::Status Finish();

 private:
  int threads_ = 0;
  std::string layer_types_;
};

struct ExportFlags {
  ExportFlags() = default;
  ExportFlags(const ExportFlags&) = delete;  // the FlagSet points into it
  ExportFlags& operator=(const ExportFlags&) = delete;

  ops::ExportOptions options;
  ZeroSourceFlags src;
  bool allow_unsafe_pickle = false;
  bool fsync = true;
  std::string progress = "auto";

  void Register(FlagSet& f);
  absl::Status Finish();

 private:
  int threads_ = 0;
  std::string format_ = "safetensors", max_shard_ = "5GB", hf_config_;
};

// The lines `ucp convert|reshard|export` print on stdout after a successful
// run (not a dry run: that prints the result's plan).
std::string ConvertReport(const ConvertFlags& flags, const ops::ConvertResult& result);
std::string ReshardReport(const ReshardFlags& flags, const ops::ReshardResult& result);
std::string ExportReport(const ExportFlags& flags, const ops::ExportResult& result);

}  // namespace ucp::cli

#endif  // UCP_CLI_COMMAND_FLAGS_H_
