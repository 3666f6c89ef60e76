#include "deepspeed/checkpoint_files.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/fs.h"
#include "base/status_macros.h"

namespace ucp::deepspeed {

std::string MpRankFileName(int mp_rank) { return absl::StrFormat("mp_rank_%02d_model_states.pt", mp_rank); }

std::string OptimFileName(int dp_rank, int mp_rank, bool bf16_prefix) {
  return absl::StrFormat("%szero_pp_rank_%d_mp_rank_%02d_optim_states.pt", bf16_prefix ? "bf16_" : "", dp_rank,
                         mp_rank);
}

std::string LayerFileName(int layer, int tp_rank) {
  return absl::StrFormat("layer_%02d-model_%02d-model_states.pt", layer, tp_rank);
}

std::string Zero3ModelFileName(int dp_rank, int mp_rank) {
  return absl::StrFormat("zero_pp_rank_%d_mp_rank_%02d_model_states.pt", dp_rank, mp_rank);
}

namespace {

// Consumes a run of decimal digits at the front of `s`.
bool ConsumeNumber(absl::string_view& s, int& out) {
  size_t n = 0;
  while (n < s.size() && std::isdigit(static_cast<unsigned char>(s[n]))) ++n;
  if (n == 0 || n > 9) return false;
  if (!absl::SimpleAtoi(s.substr(0, n), &out)) return false;
  s.remove_prefix(n);
  return true;
}

}  // namespace

std::optional<CheckpointFileName> ParseCheckpointFileName(absl::string_view name) {
  CheckpointFileName out;
  absl::string_view s = name;
  if (absl::ConsumePrefix(&s, "mp_rank_")) {
    if (!ConsumeNumber(s, out.mp_rank) || s != "_model_states.pt") return std::nullopt;
    out.type = CheckpointFileName::Type::kMpRank;
    return out;
  }
  if (absl::ConsumePrefix(&s, "layer_")) {
    if (!ConsumeNumber(s, out.layer) || !absl::ConsumePrefix(&s, "-model_") || !ConsumeNumber(s, out.tp_rank) ||
        s != "-model_states.pt") {
      return std::nullopt;
    }
    out.type = CheckpointFileName::Type::kLayer;
    return out;
  }
  out.bf16_prefix = absl::ConsumePrefix(&s, "bf16_");
  if (absl::ConsumePrefix(&s, "zero_pp_rank_")) {
    if (!ConsumeNumber(s, out.dp_rank) || !absl::ConsumePrefix(&s, "_mp_rank_") || !ConsumeNumber(s, out.mp_rank)) {
      return std::nullopt;
    }
    if (s == "_optim_states.pt" || s == "optim_states.pt") {  // the second is DeepSpeed's old spelling
      out.type = CheckpointFileName::Type::kOptim;
      return out;
    }
    if (s == "_model_states.pt") {
      out.type = CheckpointFileName::Type::kZero3Model;
      return out;
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ReadLatestTag(const std::string& root, const std::string& file_name) {
  const std::string path = JoinPath(root, file_name);
  // A tag is a folder name: NAME_MAX bytes at most, plus a newline. Larger
  // files are refused before they are read (and never echoed whole).
  constexpr int64_t kMaxLatestBytes = 4096;
  UCP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kMaxLatestBytes));
  std::string tag(absl::StripAsciiWhitespace(text));
  auto shown = [&] { return absl::CHexEscape(tag.substr(0, 80)) + (tag.size() > 80 ? "..." : ""); };
  if (tag.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a tag folder name, found text with a NUL byte ('", shown(), "')"));
  }
  if (tag.empty() || tag.size() > 255 || tag.find('/') != std::string::npos || tag == "." || tag == ".." ||
      tag.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a tag folder name, found '", shown(), "' (",
                                                   tag.size(), " bytes)"));
  }
  return tag;
}

}  // namespace ucp::deepspeed
