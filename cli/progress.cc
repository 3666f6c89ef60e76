#include "cli/progress.h"

#include <unistd.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ucp::cli {
namespace {

std::string Bytes(int64_t b) {
  const double x = static_cast<double>(b);
  if (x >= 1e12) return absl::StrFormat("%.2f TB", x / 1e12);
  if (x >= 1e9) return absl::StrFormat("%.2f GB", x / 1e9);
  if (x >= 1e6) return absl::StrFormat("%.1f MB", x / 1e6);
  if (x >= 1e3) return absl::StrFormat("%.1f kB", x / 1e3);
  return absl::StrCat(b, " B");
}

double Rate(const ProgressEvent& e, double elapsed_s) {
  return elapsed_s > 0 ? static_cast<double>(e.bytes_done) / 1e6 / elapsed_s : 0;
}

// Seconds left at the rate so far; -1 when unknown.
double Eta(const ProgressEvent& e, double elapsed_s) {
  if (e.bytes_done <= 0 || e.bytes_total <= e.bytes_done || elapsed_s <= 0) return e.bytes_done >= e.bytes_total ? 0 : -1;
  return elapsed_s * static_cast<double>(e.bytes_total - e.bytes_done) / static_cast<double>(e.bytes_done);
}

std::string Duration(double s) {
  if (s < 0) return "?";
  if (s < 60) return absl::StrFormat("%.0fs", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return absl::StrFormat("%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) % 3600) / 60);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<ProgressMode> ParseProgressMode(const std::string& s) {
  if (s == "auto") return ProgressMode::kAuto;
  if (s == "always") return ProgressMode::kAlways;
  if (s == "never") return ProgressMode::kNever;
  if (s == "json") return ProgressMode::kJson;
  return absl::InvalidArgumentError(absl::StrCat("--progress=", s, ": expected auto, always, never or json"));
}

std::string FormatProgress(const ProgressEvent& e, double elapsed_s) {
  std::string out = absl::StrCat(e.phase, "  ", Bytes(e.bytes_done), " / ", Bytes(e.bytes_total));
  if (e.bytes_total > 0) {
    absl::StrAppendFormat(&out, "  %3.0f%%", 100.0 * static_cast<double>(e.bytes_done) / static_cast<double>(e.bytes_total));
  }
  absl::StrAppendFormat(&out, "  %.0f MB/s", Rate(e, elapsed_s));
  absl::StrAppend(&out, "  ", e.units_done, "/", e.units_total, " units");
  absl::StrAppend(&out, "  ETA ", Duration(Eta(e, elapsed_s)));
  return out;
}

ProgressFigures FiguresOf(const ProgressEvent& e, double elapsed_s) {
  return ProgressFigures{elapsed_s, Rate(e, elapsed_s), Eta(e, elapsed_s)};
}

std::string ProgressJson(const std::string& command, const ProgressEvent& e, double elapsed_s) {
  const ProgressFigures f = FiguresOf(e, elapsed_s);
  return absl::StrFormat(
      "{\"command\": %s, \"phase\": %s, \"bytes_done\": %d, \"bytes_total\": %d, \"units_done\": %d, "
      "\"units_total\": %d, \"elapsed_s\": %.3f, \"mb_per_s\": %.1f, \"eta_s\": %.1f}",
      JsonString(command), JsonString(e.phase), e.bytes_done, e.bytes_total, e.units_done, e.units_total, f.elapsed_s,
      f.mb_per_s, f.eta_s);
}

ProgressPrinter::ProgressPrinter(std::string command, ProgressMode mode, FILE* out, int is_tty)
    : command_(std::move(command)), mode_(mode), out_(out) {
  const bool tty = is_tty >= 0 ? is_tty != 0 : isatty(fileno(out)) != 0;
  live_ = mode_ == ProgressMode::kAlways || (mode_ == ProgressMode::kAuto && tty);
  start_ = last_ = std::chrono::steady_clock::now();
}

ProgressPrinter::~ProgressPrinter() {
  std::lock_guard<std::mutex> lock(mu_);
  EndLine();
}

ProgressFn ProgressPrinter::Callback() {
  if (mode_ == ProgressMode::kNever) return nullptr;
  return [this](const ProgressEvent& e) { Report(e); };
}

void ProgressPrinter::EndLine() {
  if (!have_event_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (live_) {
    if (line_open_) std::fprintf(out_, "\n");
  } else if (mode_ == ProgressMode::kAuto) {
    std::fprintf(out_, "[%s] %s\n", command_.c_str(), FormatProgress(last_event_, elapsed).c_str());
  } else if (mode_ == ProgressMode::kJson) {
    std::fprintf(out_, "%s\n", ProgressJson(command_, last_event_, elapsed).c_str());
  }
  line_open_ = false;
  have_event_ = false;
  std::fflush(out_);
}

void ProgressPrinter::Report(const ProgressEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (have_event_ && e.phase != last_event_.phase) EndLine();
  const bool first = !have_event_;
  have_event_ = true;
  last_event_ = e;
  const bool done = e.units_done >= e.units_total;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (live_) {
    if (!first && !done && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    std::fprintf(out_, "\r[%s] %s\x1b[K", command_.c_str(), FormatProgress(e, elapsed).c_str());
    line_open_ = true;
    std::fflush(out_);
  } else if (mode_ == ProgressMode::kJson) {
    if (done) {
      EndLine();
      return;
    }
    if (!first && now - last_ < std::chrono::milliseconds(500)) return;
    last_ = now;
    std::fprintf(out_, "%s\n", ProgressJson(command_, e, elapsed).c_str());
    std::fflush(out_);
  } else if (done) {
    EndLine();  // auto, not a terminal: one line per phase
  }
}

}  // namespace ucp::cli
