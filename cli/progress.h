// Progress of a long command on stderr, the way tools of this field show it:
//   auto    a live line on a terminal ("[convert] write  1.2 GB / 3.0 GB  40%
//           850 MB/s  ETA 2s"), refreshed at most 10 times a second; when
//           stderr is not a terminal, one line per phase as it completes
//   always  the live line even when stderr is not a terminal
//   never   nothing
//   json    one JSON object per line (at most 2 a second, and each phase's
//           last event): {"command", "phase", "bytes_done", "bytes_total",
//           "units_done", "units_total", "elapsed_s", "mb_per_s", "eta_s"},
//           for CI logs
//
// Example:
//   UCP_ASSIGN_OR_RETURN(ProgressMode mode, ParseProgressMode(flag));
//   ProgressPrinter printer("convert", mode);
//   options.progress = printer.Callback();
#ifndef UCP_CLI_PROGRESS_H_
#define UCP_CLI_PROGRESS_H_

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "base/progress.h"

namespace ucp::cli {

enum class ProgressMode { kAuto, kAlways, kNever, kJson };
absl::StatusOr<ProgressMode> ParseProgressMode(const std::string& s);

// One rendering of an event, e.g. "write 1.2 GB / 3.0 GB 40% 850 MB/s ETA 2s".
std::string FormatProgress(const ProgressEvent& e, double elapsed_s);
std::string ProgressJson(const std::string& command, const ProgressEvent& e, double elapsed_s);
// The figures a JSON line (and the Python module's progress callback) adds
// to an event: seconds since the start, MB/s of bytes done so far, and the
// seconds left at that rate (-1 when unknown, 0 when done).
struct ProgressFigures {
  double elapsed_s = 0;
  double mb_per_s = 0;
  double eta_s = 0;
};
ProgressFigures FiguresOf(const ProgressEvent& e, double elapsed_s);

class ProgressPrinter {
 public:
  // `out` is stderr unless a test passes another stream; `is_tty` overrides
  // the terminal check of `out` (tests).
  ProgressPrinter(std::string command, ProgressMode mode, FILE* out = stderr, int is_tty = -1);
  ~ProgressPrinter();
  ProgressPrinter(const ProgressPrinter&) = delete;
  ProgressPrinter& operator=(const ProgressPrinter&) = delete;

  // Empty when the mode prints nothing.
  ProgressFn Callback();
  void Report(const ProgressEvent& e);

 private:
  void EndLine();

  std::string command_;
  ProgressMode mode_;
  FILE* out_;
  bool live_;  // a refreshed line
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_;
  std::string phase_;
  ProgressEvent last_event_;
  bool line_open_ = false;
  bool have_event_ = false;
};

}  // namespace ucp::cli

#endif  // UCP_CLI_PROGRESS_H_
