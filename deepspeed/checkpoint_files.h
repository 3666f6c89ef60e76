// File names of a DeepSpeed 0.14.4 checkpoint folder and the ucp additions.
//
//   mp_rank_XX_model_states.pt                      XX = pp_rank * tp + tp_rank
//   [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt  D = dp rank (ZeRO 1/2, BF16_Optimizer)
//   layer_LL-model_TT-model_states.pt               PipelineModule layer LL, tp rank TT
//   zero_pp_rank_D_mp_rank_XX_model_states.pt       ZeRO stage 3: one per dp rank (with
//                                                   [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt)
//
// Mirrors deepspeed/runtime/engine.py (_get_ckpt_name, _get_rank_zero_ckpt_name)
// and deepspeed/runtime/pipe/module.py (ckpt_layer_path): numbers are printed
// with at least two digits (`{:02d}`), the dp rank without padding.
#ifndef UCP_DEEPSPEED_CHECKPOINT_FILES_H_
#define UCP_DEEPSPEED_CHECKPOINT_FILES_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include <string_view>

namespace ucp::deepspeed {

std::string MpRankFileName(int mp_rank);
std::string OptimFileName(int dp_rank, int mp_rank, bool bf16_prefix);
std::string LayerFileName(int layer, int tp_rank);
std::string Zero3ModelFileName(int dp_rank, int mp_rank);

// CheckpointFileName: what a file name in a checkpoint folder denotes.
struct CheckpointFileName {
  enum class Type { kMpRank, kOptim, kLayer, kZero3Model };
  Type type = Type::kMpRank;
  int mp_rank = -1;
  int dp_rank = -1;
  int layer = -1;
  int tp_rank = -1;
  bool bf16_prefix = false;
};
// nullopt for names that are not checkpoint files.
std::optional<CheckpointFileName> ParseCheckpointFileName(absl::string_view name);

// The universal checkpoint's state files and keys
// (deepspeed/checkpoint/constants.py).
inline constexpr char kUniversalZeroDir[] = "zero";
inline constexpr char kUniversalOptimizerStateFile[] = "optimizer_state.pt";
inline constexpr char kLatestFile[] = "latest";
inline constexpr char kLatestUniversalFile[] = "latest_universal";
inline constexpr char kManifestFile[] = "ucp_manifest.textproto";
// ucp's own side folder of a universal checkpoint: module tensors outside the
// optimizer (frozen params, buffers), which stock DeepSpeed ignores.
inline constexpr char kUniversalModuleDir[] = "ucp_module";

// Reads `<root>/latest` (or `latest_universal`) and returns the tag, trimmed.
absl::StatusOr<std::string> ReadLatestTag(const std::string& root, const std::string& file_name);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_CHECKPOINT_FILES_H_
