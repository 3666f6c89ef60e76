#include "writers/target_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ucp::writers {

RunOptions ZeroRunOptions(const ZeroWriteOptions& options) {
  RunOptions run;
  run.num_threads = options.num_threads;
  run.overwrite = options.overwrite;
  run.inputs = options.inputs;
  run.update_latest = options.update_latest;
  run.write_latest = options.write_latest;
  run.progress = options.progress;
  run.fsync = options.fsync;
  return run;
}

int OptimPieces(int64_t bytes, int64_t piece_bytes) {
  if (piece_bytes == 0) piece_bytes = kOptimPieceBytes;
  constexpr int64_t kMaxPieces = 4096;
  if (piece_bytes < 0 || bytes < 2 * piece_bytes) return 1;
  return static_cast<int>(std::min(kMaxPieces, (bytes + piece_bytes - 1) / piece_bytes));
}

std::string LayerTypeName(const ZeroWriteOptions& options, int layer, const std::vector<std::string>& local_names) {
  auto it = options.layer_types.find(layer);
  if (it != options.layer_types.end()) return it->second;
  if (options.layer_type_name) return options.layer_type_name(local_names);
  return local_names.empty() ? "function" : "Layer";
}

std::string PartitionMethod(const ZeroWriteOptions& options, const std::string& recorded) {
  if (!options.partition_method.empty()) return options.partition_method;
  return recorded.empty() ? "parameters" : recorded;
}

RunOptions UniversalRunOptions(const UniversalWriteOptions& options) {
  RunOptions run;
  run.num_threads = options.num_threads;
  run.overwrite = options.overwrite;
  run.inputs = options.inputs;
  run.update_latest = options.update_latest;
  run.keep_temp_folder = options.keep_temp_folder;
  run.write_latest = options.write_latest;
  run.progress = options.progress;
  run.fsync = options.fsync;
  return run;
}

int64_t ExportTensor::nbytes() const {
  int64_t n = static_cast<int64_t>(torch::ItemSize(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<int64_t> ParseShardSize(const std::string& text) {
  std::string s(absl::StripAsciiWhitespace(text));
  int64_t bytes = 0;
  if (absl::SimpleAtoi(s, &bytes)) {
    if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("max_shard_size '", text, "' is negative"));
    return bytes;
  }
  auto bad = absl::InvalidArgumentError(absl::StrCat(
      "max_shard_size '", text, "': expected a number of bytes or a size with unit KB, MB, GB or TB (e.g. 5GB)"));
  if (s.size() < 3) return bad;
  const std::string unit = absl::AsciiStrToUpper(s.substr(s.size() - 2));
  const double mult = unit == "KB" ? 1e3 : unit == "MB" ? 1e6 : unit == "GB" ? 1e9 : unit == "TB" ? 1e12 : 0;
  double value = 0;
  if (mult == 0 || !absl::SimpleAtod(absl::StripAsciiWhitespace(s.substr(0, s.size() - 2)), &value) ||
      !std::isfinite(value) || value < 0 || value * mult > 9e18) {
    return bad;
  }
  return static_cast<int64_t>(value * mult);
}

RunOptions WeightsRunOptions(const ExportWriteOptions& options) {
  RunOptions run;
  run.num_threads = options.num_threads;
  run.overwrite = options.overwrite;
  run.inputs = options.inputs;
  run.update_latest = options.update_latest;
  run.keep_temp_folder = options.keep_temp_folder;
  run.write_latest = false;
  run.progress = options.progress;
  run.fsync = options.fsync;
  return run;
}

}  // namespace ucp::writers
