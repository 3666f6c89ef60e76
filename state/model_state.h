// The format-neutral pivot of ucp: a model's training state as every source
// format produces it and every target format consumes it.
//
//   source format (formats/<name>/) ──> SlicedState ──(rules/resolve)──┐
//                                  └──────────────────────────────────┼──> ModelState ──> target format
//   in-memory model (synthetic/) ─────────────────────────────────────┘    (universal, ZeRO at any
//                                                                           tp/pp/dp, export, ...)
//
// A SlicedState is a checkpoint as its tp ranks hold it: every tensor of the
// model with its shape on each source tp rank (`ParamState::tp_shapes`) and
// its tp slices as TensorPlans; how the slices merge is not decided yet. The
// rules (rules/resolve.h) decide each param's MergeRule and turn it into a
// ModelState.
//
// A ModelState lists every tensor of the model (`ParamState`: optimizer
// params, frozen params, buffers) with its full shape and tp merge rule, and
// hands out each tensor's full value for a state ("fp32", "exp_avg", ...,
// or "lp" for the module weight) as a TensorPlan, i.e. lazily: nothing is
// read until a writer copies the bytes. Implementations must be thread-safe
// for concurrent `Full` / `Slices` calls (each param is an independent unit
// of work).
//
// What only one family of formats carries (DeepSpeed's engine dicts, its
// ds_config and the training's args) is a *facet*: an optional interface a
// state offers under a key (CheckpointState::GetFacet), e.g.
// deepspeed/facet.h's DeepSpeedFacet, which DeepSpeed's writers use and fill
// with DeepSpeed's defaults for a source without one. Nothing here knows a
// file layout.
#ifndef UCP_STATE_MODEL_STATE_H_
#define UCP_STATE_MODEL_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "state/topology.h"
#include "format/pickle/value.h"
#include "format/torch/dtype.h"
#include "format/torch/torch_file.h"
#include "proto/ucp.pb.h"
#include "tp/tensor_plan.h"

namespace ucp::state {

// Which optimizer layout the source's optimizer state has, in DeepSpeed's
// terms (a ZeRO target writes the same); a source that is not DeepSpeed's
// keeps the default.
enum class OptimizerKind {
  kZero,  // DeepSpeedZeroOptimizer (stage 1/2): fp32 or fp16 lp weights
  kBf16,  // BF16_Optimizer: bf16 lp weights, 7-key state dict
};
const char* OptimizerKindName(OptimizerKind kind);

// The role of a tensor in the module state (layer files or mp_rank `module`).
// kTied: a module tensor that is another name of a trainable param (a tied
// weight of a plain module, listed in shared_params of global rank 0's
// file): in the module dict under both names, in the optimizer once, neither
// frozen nor a buffer.
enum class TensorRole { kTrainable, kFrozen, kBuffer, kTied };
const char* TensorRoleName(TensorRole role);

// The state name of the module (lp) weight of a tensor.
inline constexpr char kLpState[] = "lp";
inline constexpr char kFp32State[] = "fp32";
// ParamState::origin of a param of a source that exists at tp=1 only (ZeRO-3,
// native MoE) that no rule covers: a whole tensor with no known tp split
// (rules/resolve.h, ResolveOptions::tp1_whole_tensors).
inline constexpr char kTp1WholeOrigin[] = "tp=1 source: a whole tensor, no tp split known";

// Appended to the origin of an AutoTP lm_head read whole (ParamState::autotp_cut).
inline constexpr char kAutoTpWholeLmHeadNote[] = " (replicated: AutoTP before 0.19.5 leaves the lm_head whole)";

struct ParamState {
  std::string name;                 // optimizer / module state name
  std::vector<int64_t> full_shape;  // universal shape (vocab padding stripped)
  MergeRule rule;
  RuleSource source = RULE_SOURCE_UNSPECIFIED;
  std::string origin;               // the pattern or evidence that decided the rule
  int group = -1;                   // optimizer param group; -1 outside the optimizer
  TensorRole role = TensorRole::kTrainable;
  torch::DType lp_dtype = torch::DType::kFloat32;  // in layer / module files
  int layer = -1;                   // pipeline layer index (first one for tied params)
  std::string local_name;           // key in the layer file
  std::string tied_key;             // tied module key, "" if not tied
  std::string alias_of;             // kTied: the trainable param this name aliases
  std::vector<int> tied_layers;     // all layer indices holding a tied param
  // SlicedState only: the tensor's shape on each source tp rank, and the
  // pipeline stages holding it (several for params tied across stages).
  std::vector<std::vector<int64_t>> tp_shapes;
  std::vector<int> stages;
  // A tensor no tp rank slices, held once and whole (a native MoE expert, at
  // any source tp: DeepSpeed places experts by expert parallel rank across
  // tp): one tp_shapes entry, one slice, decided as a tp=1 source's param
  // would be (rules/resolve.h); a reshard to tp > 1 leaves it whole
  // (rules::DecideUndecided asks no rule for it).
  bool tp_whole = false;
  // An AutoTP lm_head the source holds whole on every tp rank (DeepSpeed
  // 0.16.4 - 0.18.9, whose `rule` is then REPLICATED: the copies merge as
  // one): how AutoTP of 0.19.5 on cuts it (the rule that decided it before),
  // for the writers of those versions. Kind MERGE_KIND_UNSPECIFIED when none.
  MergeRule autotp_cut;

  bool trainable() const { return role == TensorRole::kTrainable; }
  bool has_autotp_cut() const { return autotp_cut.kind() != MERGE_KIND_UNSPECIFIED; }
};

struct ModelInfo {
  // Trainable params in the global flatten order of each group (groups in
  // order, pipeline stages in order within a group), then frozen params and
  // buffers in module order.
  std::vector<ParamState> params;
  int num_groups = 0;
  // Per-element optimizer states besides fp32 (exp_avg, exp_avg_sq, ...).
  std::vector<std::string> state_keys;
  // Per-group scalar optimizer states (step, ...).
  std::vector<std::string> scalar_keys;
  bool pipeline = true;
  // Pipeline layer specs: how many, and which ones are modules with a file
  // (may hold no tensors), ascending.
  int num_layers = 0;
  std::vector<int> module_layers;
  // Module state keys in file order: per layer file (pipeline; tied params
  // once per layer holding them) or of the `module` dict. Empty when unknown
  // (a universal checkpoint written by DeepSpeed).
  struct ModuleKey {
    int layer = -1;
    std::string name;
  };
  std::vector<ModuleKey> module_order;
  torch::DType lp_dtype = torch::DType::kFloat32;
  OptimizerKind optimizer_kind = OptimizerKind::kZero;
  int zero_stage = 1;
  bool bf16_file_prefix = false;            // optimizer files named bf16_zero_pp_rank_*
  int64_t original_vocab_size = 0;          // 0 when unknown
  int64_t make_vocab_size_divisible_by = 0; // 0 when unknown
  // Saved by DeepSpeed's AutoTP training (ds_config tensor_parallel.autotp_size,
  // any value: the writers rewrite it to the tp they write, 1 included; or
  // AutoTP's universal_checkpoint_info): its vocabulary is not padded.
  bool autotp = false;
  std::string partition_method;             // recorded pipe partition method, "" if none
  // Native mixture of experts (formats/deepspeed_moe/moe_state.h): the source's expert
  // parallel degree (0: not a MoE model), each MoE layer's module prefix and
  // expert count, and which optimizer groups hold experts. Expert params are
  // named with global expert ids ("<prefix>.deepspeed_moe.experts.deepspeed_experts.<id>.<suffix>").
  struct MoeLayer {
    std::string prefix;
    int num_experts = 0;
  };
  int expert_parallel = 0;
  std::vector<MoeLayer> moe_layers;
  std::vector<bool> expert_groups;
  // Counts a tensor-parallel degree must divide (attention heads, kv heads)
  // that the source knows without DeepSpeed args (a Hugging Face folder's
  // config.json), each named as its source names it, and where from.
  struct TpDivisor {
    std::string name;  // e.g. "num_key_value_heads"
    int64_t count = 0;
    std::string from;  // e.g. "/models/llama/config.json"
  };
  std::vector<TpDivisor> tp_divisors;
  // Assumptions the reader made that the user should see (printed by the CLI).
  std::vector<std::string> notes;
  Topology source_topology;

  const ParamState* Find(const std::string& name) const;
  int IndexOf(const std::string& name) const;
  // Indices of `params` in module order (module_order's names, each once),
  // then the params module_order does not list, in `params` order: the
  // order of a module state dict a writer builds.
  std::vector<int> ModuleOrderIndices() const;
  // Rebuilds the name index; call after changing `params`.
  void Reindex();

 private:
  absl::flat_hash_map<std::string, int> index_;
};

// A pickle value tree whose tensors are views into `file` (null when the
// tree was built in memory and holds no file-backed tensors).
struct FileValue {
  pickle::ValuePtr value;
  std::shared_ptr<const torch::TorchFile> file;
};

// A non-owning handle for files whose owner outlives every use.
inline std::shared_ptr<const torch::TorchFile> Unowned(const torch::TorchFile* f) {
  return std::shared_ptr<const torch::TorchFile>(std::shared_ptr<const torch::TorchFile>(), f);
}

// A byte range of a tensor in an input file (offset and length within the
// tensor's bytes), or a whole file (tensor "", length -1).
struct InputRange {
  std::string path;
  std::string tensor;  // e.g. "single_partition_of_fp32_groups[0]"
  int64_t offset = 0;
  int64_t length = -1;
};

// Where bytes of an input lie in its file: [offset, offset + length), or to
// the end of the file when length is -1.
struct FileExtent {
  std::string path;
  int64_t offset = 0;
  int64_t length = -1;
};

// The key of an input record in CheckpointState::SetCheckedInputs.
inline std::string InputKey(const std::string& path, const std::string& tensor) { return path + "|" + tensor; }

// An optional interface a state offers besides the neutral one (the data
// one family of formats carries through, e.g. deepspeed::DeepSpeedFacet),
// found by its key: FacetOf<F>(state).
class Facet {
 public:
  virtual ~Facet() = default;
};
// A facet type's identity: the address of a static of its own (F::Key()).
using FacetKey = const void*;

// What every checkpoint state offers besides its tensors.
class CheckpointState {
 public:
  virtual ~CheckpointState() = default;
  virtual const ModelInfo& info() const = 0;
  // The input files (and tensor byte ranges in them) that reading every
  // state of `param` touches; empty for a state held in memory.
  virtual std::vector<InputRange> Inputs(const ParamState& param) const { return {}; }
  // What reading `param`'s `state` alone touches (a subset of
  // Inputs(param); by default all of it). Units list what they read: the
  // rank that CRC-checks an input (writers::AssignCheckers) must be one
  // that opens it.
  virtual std::vector<InputRange> StateInputs(const ParamState& param, const std::string& state) const {
    return Inputs(param);
  }
  // Every file of the source, and a check of one of them as thorough as
  // reading it for a unit would be (CRCs, structure, consistency with the
  // others): writers check the files no unit reads, so that no damaged
  // input goes unnoticed.
  virtual std::vector<std::string> InputFiles() const { return {}; }
  virtual absl::Status VerifyInput(const std::string& path) const { return absl::OkStatus(); }
  // Where the bytes of `range` (one of Inputs()) lie in its file, when this
  // state knows it without opening, parsing or reading anything (a file it
  // has not opened yet: nullopt); nullopt too when the state does not say
  // (the default). For read-ahead hints (writers/read_ahead.h): a wrong
  // answer costs time, never correctness. Safe to call from any thread
  // while units run.
  virtual std::optional<FileExtent> ExtentOf(const InputRange& range) const { return std::nullopt; }
  // Which input records this process CRC-checks when it reads them, as
  // InputKey(path, tensor) of Inputs(); null (the default): every record it
  // reads. A job of several ranks has each record checked by one rank only
  // (writers::AssignCheckers: the rank that reads most of it) and the others
  // read their ranges of it unchecked; the job commits only if every check
  // passed, so no rank needs to read a whole record it uses a piece of.
  // Call before any unit runs.
  virtual void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const {}
  // A per-group scalar optimizer state (e.g. "step"); value null when absent.
  virtual absl::StatusOr<FileValue> GroupScalar(int group, const std::string& key) const = 0;
  // The facet of type `key` this state offers, or null (the default: none).
  // A state that wraps another forwards the call.
  virtual const Facet* GetFacet(FacetKey key) const { return nullptr; }
};

class ModelState : public CheckpointState {
 public:
  // The full tensor of `param` for `state` ("fp32", a state key, or "lp").
  virtual absl::StatusOr<tp::TensorPlan> Full(const ParamState& param, const std::string& state) const = 0;
  // Full() as a source opened on its first read (tp::TensorPlan::Deferred),
  // when this state knows the tensor's dtype and shape without opening a
  // file; nullopt otherwise (then call Full). For writers that lay out a
  // whole file but write only a piece of it: the piece opens only the
  // inputs of its bytes. The source's `files` are the inputs that opening
  // and reading it touches (a subset of Inputs(param)).
  virtual std::optional<tp::TensorPlan> FullDeferred(const ParamState& param, const std::string& state) const {
    return std::nullopt;
  }
};

// A checkpoint as its tp ranks hold it. `info()` lists every tensor with
// `tp_shapes` and `stages`; `rule`, `source`, `origin` and `full_shape` are
// not set, nor `original_vocab_size`.
class SlicedState : public CheckpointState {
 public:
  // The tp slices (in tp rank order) of `param` for `state` as pipeline stage
  // `stage` holds them.
  virtual absl::StatusOr<std::vector<tp::TensorPlan>> Slices(const ParamState& param, int stage,
                                                             const std::string& state) const = 0;
  // When this state holds `param`'s `state` whole (one slice) in one file it
  // knows the dtype and shape of without opening it: that file's path and
  // the dtype; nullopt otherwise (the default). A state that merges the
  // slices can then defer the tensor (ModelState::FullDeferred), so that a
  // piece of a file opens only the inputs of its bytes.
  struct WholeFile {
    std::string path;
    torch::DType dtype = torch::DType::kFloat32;
  };
  virtual std::optional<WholeFile> WholeStateFile(const ParamState& param, const std::string& state) const {
    return std::nullopt;
  }
  // The checkpoint folder, for messages.
  virtual const std::string& dir() const = 0;
};

// The facet F (a Facet subclass with a static `FacetKey Key()`) that `state`
// offers, or null.
template <typename F>
const F* FacetOf(const CheckpointState& state) {
  return static_cast<const F*>(state.GetFacet(F::Key()));
}

}  // namespace ucp::state

#endif  // UCP_STATE_MODEL_STATE_H_
