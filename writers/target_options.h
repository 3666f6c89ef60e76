// What a command asks of a target format (formats/format.h): the options of
// each family of targets, shared by the registry's interface, the target
// packages (formats/<name>/) and the commands (ops/) that fill them.
//
//   ZeroWriteOptions       `ucp reshard`: a training state at a topology
//                          (DeepSpeed ZeRO 1/2, ZeRO-3, native MoE; named
//                          for ZeRO, whose layouts came first)
//   UniversalWriteOptions  `ucp convert`: a universal checkpoint
//   ExportWriteOptions     `ucp export`: weights only, from ExportTensors
#ifndef UCP_WRITERS_TARGET_OPTIONS_H_
#define UCP_WRITERS_TARGET_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/digest.h"
#include "base/progress.h"
#include "format/torch/dtype.h"
#include "proto/ucp.pb.h"
#include "state/model_state.h"
#include "state/topology.h"
#include "tp/tensor_plan.h"
#include "writers/plan.h"

namespace ucp::writers {

struct ZeroWriteOptions {
  state::Topology target;
  int zero_stage = 0;                 // 0 = the source's; 3 writes ZeRO-3 (zero3_writer.h)
  // ZeRO-3 targets: the target job's zero_optimization.sub_group_size;
  // 0 = the source's (ZeRO-3 sources record it), else DeepSpeed's 1e9.
  int64_t sub_group_size = 0;
  // Mixture-of-experts sources (ModelInfo::expert_parallel > 0): the target's
  // expert parallel degree; 0 = the source's when it divides the target dp,
  // else the largest divisor of dp below it that divides every layer's
  // expert count (formats/deepspeed_moe/moe_writer.h).
  int expert_parallel = 0;
  std::string partition_method;       // "" = the recorded one, else "parameters"
  int64_t make_vocab_size_divisible_by = 0;  // 0 = the source's
  int num_layers = 0;                 // pipeline layer specs; 0 = inferred
  // Class names of pipeline layers, for type:REGEX partitioning: `layer_types`
  // first, else `layer_type_name` of the layer's param names (local names);
  // without it a layer is "Layer" ("function" when it holds no tensors).
  std::map<int, std::string> layer_types;
  std::function<std::string(const std::vector<std::string>& local_names)> layer_type_name;
  // The DeepSpeed version the target is written for: its group_paddings
  // convention (layout_math.h, PaddingConvention) and the ds_version the
  // files record. "" = the source's ds_version (0.14.4's conventions when
  // the source records none).
  std::string target_ds_version;
  int num_threads = 0;
  // An optimizer file of more than twice this many bytes is written in
  // pieces of about this size by separate units (threads, MPI ranks) into
  // one file (TorchWriter::WritePiece), so that one large file is not
  // written by one thread of one rank (at most 4096 pieces a file: larger
  // ones beyond that). 0 = kOptimPieceBytes; < 0 = never.
  // The bytes written do not depend on it.
  int64_t piece_bytes = 0;
  bool overwrite = false;
  // The source checkpoint folder(s) the output must stay apart from, and
  // whether a latest file in the input's root may be repointed (RunOptions).
  std::vector<std::string> inputs;
  bool update_latest = false;
  bool write_latest = true;
  ProgressFn progress;
  bool fsync = true;  // RunOptions::fsync (--fsync)
};

inline constexpr int64_t kOptimPieceBytes = int64_t{128} << 20;

// How many pieces a file of `bytes` is written in, for
// ZeroWriteOptions::piece_bytes `piece_bytes`: 1 (one unit) unless the file
// holds at least two pieces' worth; at most 4096 (a tiny piece_bytes must not
// make millions of units, each building the file's tree). It depends on the
// plan only, so one process, any thread count and any number of ranks write
// the same bytes.
int OptimPieces(int64_t bytes, int64_t piece_bytes);

// The RunOptions the write options imply.
RunOptions ZeroRunOptions(const ZeroWriteOptions& options);

// The class name of pipeline layer `layer` for type:REGEX partitioning:
// options.layer_types's, else options.layer_type_name of the layer's param
// names (local names, without the layer index), else "Layer" ("function" for a
// layer without tensors).
std::string LayerTypeName(const ZeroWriteOptions& options, int layer, const std::vector<std::string>& local_names);

// How a pipeline target's layers are cut: the option's method, else the one
// the source recorded, else DeepSpeed's default "parameters".
std::string PartitionMethod(const ZeroWriteOptions& options, const std::string& recorded);

// What a training-state target chose, for the command's report.
struct TargetSummary {
  state::Topology topo;
  int zero_stage = 1;
  std::string partition_method;  // pipeline targets
  std::vector<int> parts;        // pp + 1 layer boundaries (pipeline targets)
  // What the target assumed where the source does not say (the command prints
  // them with the source's notes).
  std::vector<std::string> notes;
};

struct UniversalWriteOptions {
  int num_threads = 0;  // 0 = all cores
  bool overwrite = false;
  // The source checkpoint folder(s) the output must stay apart from, and
  // whether a latest file in the input's root may be repointed (RunOptions).
  std::vector<std::string> inputs;
  bool update_latest = false;
  bool keep_temp_folder = false;  // keep the staging folder on failure
  bool write_latest = true;       // <root>/latest_universal
  ProgressFn progress;  // may be empty
  bool fsync = true;    // RunOptions::fsync (--fsync)
  // The digest of every file in the manifest (sha256 on request).
  DigestKind digest = DigestKind::kXxh3_128;
  // The DeepSpeed version that will load the output ("" = the source's
  // ds_version): a ZeRO-3 source is refused for versions whose stage-3
  // universal loader cannot read it (none before 0.15.0; one param group
  // before 0.18.0, whose loader also fills only the loading job's first
  // sub-group, which ucp cannot see from here).
  std::string target_ds_version;
  std::string source_folder;  // for the manifest
  MergeRules rules;           // for the manifest
  // A plain (non-pipeline) module saved at tp > 1: write one
  // mp_rank_00_model_states.pt (tp rank 0's, mp_world_size 1, no module
  // tensors) instead of copying every tp rank's (false: copies, as
  // ds_to_universal.py makes). DeepSpeed's checkpoint loader
  // (state_dict_factory.py, 0.12 to 0.19.5) merges several mp_rank files for
  // a job of smaller tp by Megatron's key names and asserts they exist, so
  // the copies load only at the source's tp or larger; the one file loads at
  // any tp. The other tp ranks' client state (rng states) is not kept.
  // A ZeRO-3 source saved at tp > 1 likewise: mp rank 0's
  // zero_pp_rank_D_mp_rank_00 file of every dp rank with mp_world_size 1 and
  // tp_degree 1, the rest as saved (DeepSpeed 0.19.5 / master load it at
  // ZeRO-3 tp 1, and AutoTP models at tp > 1, seen at 2; the copies only at the
  // source's tp).
  bool single_mp_rank_file = true;
  // --to=dcp: the entries' names. Empty: the checkpoint's own, one per param.
  // Else one entry per RenamedTensor (Hugging Face names: ops::Convert with
  // --names=hf, from rules::PlanHfNames), its model value and every
  // per-element optimizer state taken alike from its param.
  struct RenamedTensor {
    std::string name;
    int param = -1;  // index into ModelInfo::params
    // The param's full tensor viewed as `groups` equal groups of dim-0 rows:
    // rows [start, start + length) of each, concatenated (length 0: all).
    int64_t groups = 1, start = 0, length = 0;
    std::vector<int64_t> shape;
  };
  std::vector<RenamedTensor> renamed;
};

RunOptions UniversalRunOptions(const UniversalWriteOptions& options);

// One tensor of an export.
struct ExportTensor {
  std::string name;
  torch::DType dtype = torch::DType::kFloat32;  // as written
  std::vector<int64_t> shape;
  // Its value, of `shape`: exactly `dtype`, or any real dtype when `dtype` is
  // floating (converted while streaming: floats round to nearest even,
  // integers and bools as torch's .float()). Called when the unit writing the
  // tensor runs.
  std::function<absl::StatusOr<tp::TensorPlan>()> source;
  // Tied names of the same tensor, written after every other tensor of the
  // owner's shard.
  std::vector<std::string> aliases;
  std::vector<state::InputRange> inputs;  // what `source` reads

  int64_t nbytes() const;
};

struct ExportWriteOptions {
  // Bytes per shard (huggingface_hub semantics); 0 = everything in one file.
  int64_t max_shard_size = 5'000'000'000;
  // Files written beside the weights at commit (name, contents), e.g. config.json.
  std::vector<std::pair<std::string, std::string>> extra_files;
  int num_threads = 0;  // 0 = all cores
  bool overwrite = false;
  // The source checkpoint folder(s) the output must stay apart from, and
  // whether a latest file in the input's root may be repointed (RunOptions).
  std::vector<std::string> inputs;
  bool update_latest = false;
  bool keep_temp_folder = false;
  ProgressFn progress;
  bool fsync = true;  // RunOptions::fsync (--fsync)
  // The state the tensors' inputs come from, whose ExtentOf says where they
  // lie, for reading them ahead (writers/read_ahead.h); null: none. Must
  // outlive the plan's run.
  const state::CheckpointState* read_ahead = nullptr;
};

// "5GB" -> 5000000000 as huggingface_hub's parse_size_to_int reads it: an
// integer is bytes; else a number followed by KB, MB, GB or TB (decimal,
// case-insensitive), the product truncated to an integer.
absl::StatusOr<int64_t> ParseShardSize(const std::string& text);

// The RunOptions an export's write options imply (no latest file).
RunOptions WeightsRunOptions(const ExportWriteOptions& options);

}  // namespace ucp::writers

#endif  // UCP_WRITERS_TARGET_OPTIONS_H_
