// MoeState: a DeepSpeed native mixture-of-experts ZeRO 1/2 checkpoint
// (deepspeed.moe.layer.MoE, expert parallelism) as a SlicedState; at tp=1:
//
//   mp_rank_00_model_states.pt                 dp rank 0's: `module` without the experts,
//        param_shapes of its optimizer groups (expert groups under LOCAL expert ids),
//        num_experts per MoE layer
//   layer_L_expert_E_mp_rank_00_model_states.pt   MoE layer L's expert E (global id):
//        its lp weights under global names (engine.py _save_moe_checkpoint)
//   zero_pp_rank_D_mp_rank_00_optim_states.pt  every dp rank's ZeRO partitions: the
//        non-expert groups over all dp ranks, the expert groups (param_groups with
//        'moe': True, named 'ep_size_<ep>') over the expert data parallel ranks, each
//        holding its ep rank's local experts under local names
//   expp_rank_R_mp_rank_00_optim_states.pt    up to 0.19.4: {'optimizer': None} per ep rank
//
// Two layouts of the model states, told apart by the keys present and the
// optimizer files' ds_version (engine.py _save_moe_checkpoint at each tag):
//   0.19.3 and later: the common checkpoint state (param_shapes, buffer_names,
//        frozen_param_*, shared_params, ds_config, ds_version) + num_experts,
//        ds_autoep_layers;
//   0.12 to 0.19.2: module, lr_scheduler, data_sampler, random_ltd,
//        sparse_tensor_module_names, skipped_steps, global_steps/samples,
//        dp/mp_world_size, num_experts (0.19.2: + ds_autoep_layers), no
//        param_shapes. Each group's members and their flatten order are then
//        every rank's param_slice_mappings in partition order (a param split
//        between ranks ends one list and starts the next; every ep rank must
//        list the same local experts), the shapes the module's tensors
//        (non-expert params) and ep rank 0's expert files (experts), each
//        checked against the elements the mappings hold. Module tensors in no
//        group are kept as they are (role kBuffer): these files do not say
//        whether they are buffers or frozen params, so a writer that must
//        record it (0.19.3+ buffer_names) refuses them.
//
// DeepSpeed's E + D rank order (groups.py _create_expert_and_data_parallel,
// the default): dp rank d is ep rank d % ep and expert-data-parallel rank
// d / ep, and ep rank e holds global experts e * n_local .. (e + 1) * n_local - 1
// (n_local = num_experts / ep). ep is dp / the expert groups' partition_count.
// Params are listed under GLOBAL names (".deepspeed_experts.<global id>."),
// so every expert has one name whatever the expert parallelism.
//
// At tp > 1 (realds/README.md, "Native MoE at tp > 1", measured on DeepSpeed
// 0.19.5; the layout with param_shapes, 0.19.3 and later, only): global rank
// r = dp rank x tp + tp rank writes zero_pp_rank_{r / tp}_mp_rank_{r % tp}.
// DeepSpeed builds the expert groups over global ranks, across tp: r is ep
// rank r % ep and expert data parallel rank r / ep, so an expert group of ep
// rank e is the partitions of the global ranks e, e + ep, ... in that order;
// expert files are written by the ranks r < ep under mp_rank_{r % tp}, model
// states by the ranks r < min(ep, tp). The dense groups are ordinary ZeRO
// partitions of each tp rank over its dp group, each mp_rank_T's module its tp
// slices: those params are listed with one shape per tp rank (the rules merge
// them), the experts whole (ParamState::tp_whole). A save at ep < tp lacks the
// model states of tp ranks >= ep (their dense slices are in no model-states
// file; DeepSpeed's own load refuses it) and is refused
// (RefuseIncompleteModelParallel).
//
// At pp > 1 (tp 1 or more; realds/README.md "Native MoE at pp > 1", measured on
// DeepSpeed 0.14.4, 0.18.9 and 0.19.5): a PipelineModule's MoE save. Each
// pipeline stage s writes the files above under mp_rank_{s} (the pipe grid's
// model parallel rank is the stage): its own module (the stage's layers,
// under their global layer indices, through DeepSpeedEngine.module_state_dict:
// no layer_XX files), its own optimizer groups over its dp ranks, and expert
// files whose layer ids restart at 0 in every stage. Each stage is read as a
// tp 1 save of its own (stages_), and the model info is theirs joined:
// trainable params by group then stage, MoE layers in stage order (the ids a
// pp 1 save gives them). The stages are told apart from tp ranks by
// checkpoint_parallel_dimensions (0.19.3+), else by their modules: the tp
// ranks of a stage hold the same names, stages disjoint ones. At tp > 1 the
// mp rank is stage x tp + tp rank, and each stage is laid out as a pp 1 save
// at tp > 1 over its own ranks (measured on 0.19.5, tp 2 pp 2 dp 1 ep 2).
//
// Experts are whole at any source tp (ParamState::tp_whole, tp 1 too): no tp
// rank splits them, so a reshard to tp > 1 asks no rule for them.
//
// ds_to_universal.py (0.19.5) cannot convert these (it merges every ep
// rank's local experts as if they were dp shards); ucp reshards them to any
// tp (ep >= tp), dp and ep (formats/deepspeed_moe/moe_writer.h).
#ifndef UCP_FORMATS_DEEPSPEED_MOE_MOE_STATE_H_
#define UCP_FORMATS_DEEPSPEED_MOE_MOE_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/layout_math.h"
#include "deepspeed/read_options.h"
#include "deepspeed/facet.h"
#include "deepspeed/flat_optim_file.h"
#include "state/model_state.h"
#include "format/torch/torch_file.h"

namespace ucp::deepspeed_moe {

// True when `path` (a tag folder or a root with `latest`) holds
// layer_L_expert_E_mp_rank_XX_model_states.pt files.
bool IsMoeFolder(const std::string& path);
// Whether `name` is an expert file's (layer_L_expert_E_mp_rank_XX_model_states.pt).
bool IsExpertFileName(const std::string& name);

inline constexpr char kExpertInfix[] = ".deepspeed_moe.experts.deepspeed_experts.";

// "<prefix>.deepspeed_moe.experts.deepspeed_experts.<id>.<suffix>" split;
// false for other names.
bool SplitExpertName(const std::string& name, std::string* prefix, int* id, std::string* suffix);
// A PipelineModule's tied module weight ('tied_modules.<key>.<name>'): every
// pipeline stage holding a layer of that key saves a copy.
inline bool IsTiedName(const std::string& name) { return name.rfind("tied_modules.", 0) == 0; }
std::string ExpertName(const std::string& prefix, int id, const std::string& suffix);

class MoeState : public state::SlicedState, public deepspeed::DeepSpeedFacet {
 public:
  static absl::StatusOr<std::unique_ptr<MoeState>> Open(const std::string& path,
                                                        const deepspeed::ReadOptions& read = {});

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<std::vector<tp::TensorPlan>> Slices(const state::ParamState& param, int stage,
                                                     const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  std::vector<state::InputRange> Inputs(const state::ParamState& param) const override;
  std::vector<std::string> InputFiles() const override;
  absl::Status VerifyInput(const std::string& path) const override;
  void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const override;
  const state::Facet* GetFacet(state::FacetKey key) const override { return deepspeed::OfferFacet(this, key); }
  // DeepSpeedFacet.
  absl::StatusOr<state::FileValue> OptimizerCommon() const override;
  state::FileValue ModelStatesRoot(int pp, int tp) const override;
  // The model states' ds_config, else (before 0.19.3) optimizer file 0's.
  state::FileValue SavedDsConfig() const override;
  std::string ModelStatesPath(int pp, int tp) const override;
  const pickle::Value& checkpoint_info() const override;
  const pickle::Value* args() const override;
  const std::string& dir() const override { return dir_; }

  // The expert file of MoE layer `layer`, global expert `expert`.
  std::string ExpertPath(int layer, int expert) const;

 private:
  struct Group {
    bool expert = false;
    std::vector<std::string> names;  // local names (param_shapes order)
    std::vector<std::vector<int64_t>> shapes;  // tp rank 0's
    deepspeed::ZeroGroupLayout layout;  // tp rank 0's: over dp (experts: over dp x tp / ep)
    // Per tp rank (index 0 = shapes, layout): a dense group's tp slices; an
    // expert group's are all alike (experts are whole).
    std::vector<std::vector<std::vector<int64_t>>> tp_shapes;
    std::vector<deepspeed::ZeroGroupLayout> tp_layouts;
  };
  struct Where {  // a trainable param in the optimizer files
    int group = -1;
    int index = -1;    // in the group's local names
    int ep_rank = -1;  // expert params: whose
  };

  using OptimFile = deepspeed::FlatOptimFile;  // flat groups: the param groups
  // Rank 0's optimizer file, read for its groups (ReadRank0Groups).
  struct Rank0Groups {
    std::unique_ptr<torch::TorchFile> file;
    const pickle::Value* param_groups = nullptr;     // base_optimizer_state.param_groups
    const pickle::Value* partition_count = nullptr;  // one count per group
    size_t num_groups = 0;
  };
  // Trainable param name -> its shape (BuildInfo).
  using TrainableShapes = std::map<std::string, std::vector<int64_t>>;
  // Per dp rank, per group: each param_slice_mappings entry's (local name,
  // fragment numel), in the file's order.
  using RankMappings = std::vector<std::vector<std::vector<std::pair<std::string, int64_t>>>>;
  // (MoE layer prefix, expert param suffix) -> its expert group.
  using ExpertGroupOf = std::map<std::pair<std::string, std::string>, int>;
  // Each MoE layer's expert params as its global expert 0 holds them
  // (ReadExpertTemplate).
  struct ExpertTemplate {
    std::vector<std::string> prefixes;               // per MoE layer
    std::vector<std::vector<std::string>> suffixes;  // per MoE layer, module order
    std::map<std::pair<std::string, std::string>, int64_t> numel_of;
    std::vector<std::pair<std::string, std::string>> unknown;  // in no rank's window
  };

  MoeState() = default;
  // The pipeline stages of the save in `dir` and the tp ranks of each (pp 1
  // when its mp ranks are all tp ranks, or it has one).
  struct StageShape {
    int pp = 1, tp = 1;
  };
  static absl::StatusOr<StageShape> PipelineStages(const std::string& dir, const deepspeed::ReadOptions& read);
  // pp > 1: the model info of the stages joined (stages_ read).
  absl::Status JoinStages();
  // pp > 1: the stage reading `param`.
  const MoeState& StageOf(const state::ParamState& param) const;
  // Open's phases, in order; each checks what it reads and names the file.
  absl::Status Load();
  absl::Status FindOptimPrefix(const std::vector<std::string>& names);
  std::string VersionForMessages() const;
  absl::Status RefuseIncompleteModelParallel(const std::vector<std::string>& names, const std::string& what) const;
  // Every zero_pp_rank_D_mp_rank_T for D < dp, T < tp (dp_ and tp_ known).
  absl::Status CheckOptimFiles() const;
  absl::Status OpenTpModelStates(const std::string& version);
  absl::Status ReadParamShapes(const torch::TorchFile& f, std::vector<Group>* out) const;
  absl::Status ReadTpParamShapes();
  absl::Status CheckExpertFilePlaces() const;
  absl::StatusOr<std::set<int>> ListFiles(const std::vector<std::string>& names, const std::string& what);
  absl::Status CheckExpertOptimizerFiles(const std::vector<std::string>& names, const std::set<int>& optim_dp,
                                         const std::string& what) const;
  absl::Status OpenModelStates(const std::set<int>& optim_dp, const std::string& version);
  absl::StatusOr<Rank0Groups> ReadRank0Groups(const std::string& what) const;
  absl::Status ReadGroupMembers(const Rank0Groups& rank0);
  absl::Status FindExpertGroups(const Rank0Groups& rank0);
  absl::Status FindMoeLayers();
  absl::Status MakeLayouts();
  absl::Status BuildInfo(const OptimFile& first);
  absl::Status AddTrainableParams(torch::DType lp, TrainableShapes* trainable);
  absl::Status AddModuleBuffers(const TrainableShapes& trainable);
  absl::Status AddExpertModuleOrder(const TrainableShapes& trainable);
  void AddNotes();
  // The layout before DeepSpeed 0.19.3 (no param_shapes): each group's
  // local names in flatten order from every rank's param_slice_mappings,
  // then their shapes from the module and the expert files.
  absl::Status GroupNamesFromMappings();
  absl::StatusOr<RankMappings> ReadRankMappings();
  absl::Status MergeMappings(const RankMappings& ranks, size_t g, const std::vector<int>& dp_ranks,
                             std::vector<std::string>* names, std::vector<int64_t>* numels) const;
  absl::Status GroupShapesFromTensors();
  // Before 0.14.5 at ep > 1 the expert groups' mappings cover a window only
  // (deepspeed::ExpertMappingsSizedByWorld): the groups are then each MoE
  // layer's expert params (expert files, module order) in the group the
  // mappings show them in, every local expert alike; params no window lists
  // go to the only assignment to the expert groups that reproduces every
  // rank's window and fp32 partition size (refused if none or several);
  // ParseOptim checks each rank's window again. At tp > 1 every global
  // rank's window is read: 0.14.4's _link_all_hp_params sizes it by the
  // data parallel degree (padded numel / dp) and places it at the rank's
  // expert data parallel index (realds case moe_tp2_dp2_ep4_0144).
  absl::Status ExpertGroupsFromExpertFiles(const RankMappings& ranks);
  absl::StatusOr<ExpertGroupOf> ExpertGroupsInWindows(const RankMappings& ranks) const;
  absl::StatusOr<ExpertTemplate> ReadExpertTemplate(const ExpertGroupOf& group_of) const;
  void ExpertGroupMembers(const ExpertTemplate& tmpl, const ExpertGroupOf& of,
                          std::vector<std::vector<std::string>>* names, std::vector<std::vector<int64_t>>* numels) const;
  bool WindowsFit(const RankMappings& ranks, const std::vector<int>& expert_groups,
                  const std::vector<std::vector<std::string>>& names,
                  const std::vector<std::vector<int64_t>>& numels) const;
  absl::Status AssignUnlistedExpertParams(const RankMappings& ranks, const ExpertTemplate& tmpl,
                                          const ExpertGroupOf& group_of, const std::vector<int>& expert_groups,
                                          std::vector<std::vector<std::string>>* names,
                                          std::vector<std::vector<int64_t>>* numels) const;
  absl::StatusOr<std::unique_ptr<OptimFile>> ParseOptim(int dp) const;
  absl::StatusOr<tp::TensorPlan> OptimSlice(const state::ParamState& param, const Where& w, int t,
                                            const std::string& state) const;
  // By global rank (dp rank x tp + tp rank; at tp 1 the dp rank).
  absl::StatusOr<const OptimFile*> Optim(int rank) const;
  std::string OptimPath(int rank) const;
  // Model states of tp rank `t`.
  const torch::TorchFile& Mp(int t) const { return t == 0 ? *mp_ : *mp_more_[t - 1]; }
  int world() const { return dp_ * tp_; }
  // A stage of a pp > 1 save: whether mp rank `mp`'s files are another stage's.
  bool InOtherStage(int mp) const { return pp_ > 1 && (mp < mp_base_ || mp >= mp_base_ + stage_tp_); }
  // The index of the MoE layer of module prefix `prefix` in moe_prefixes_.
  int LayerIndex(const std::string& prefix) const;
  // The global rank holding expert data parallel rank `k` of ep rank `e`.
  int DpRank(int e, int k) const { return e + k * ep_; }

  std::string dir_;
  deepspeed::ReadOptions read_;
  // pp > 1: this object joins stages_ (each a tp 1 save of the files of
  // mp_rank_{s}); a stage reads the files of mp rank mp_base_ (its stage).
  int pp_ = 1;
  int mp_base_ = 0;   // stage x its tp ranks
  int stage_tp_ = 1;  // pp > 1: the tp ranks of a stage (mp ranks mp_base_ .. mp_base_ + stage_tp_ - 1)
  std::vector<std::unique_ptr<MoeState>> stages_;
  std::map<std::string, int> stage_of_;  // joined: param name -> stage
  bool legacy_ = false;         // model states without param_shapes (DeepSpeed < 0.19.3)
  std::string legacy_version_;  // the optimizer files' ds_version then
  deepspeed::DsVersion legacy_parsed_;
  bool window_mappings_ = false;  // expert mappings of a window (before 0.14.5, ep > 1)
  // legacy: [group][tp rank][param] each param's numel in that tp rank's
  // mappings (-1: not listed); an expert group has one entry, for every tp rank
  std::vector<std::vector<std::vector<int64_t>>> legacy_numels_;
  std::vector<std::vector<int64_t>> fp32_numels_;  // legacy: [global rank][group] saved fp32 partition numel
  std::vector<std::string> untold_;  // legacy: module tensors in no group (buffer or frozen: not said)
  int dp_ = 1, ep_ = 1, tp_ = 1;
  bool bf16_prefix_ = false;  // optimizer files named bf16_zero_pp_rank_* (bf16 lp weights)
  std::unique_ptr<torch::TorchFile> mp_;  // mp_rank_00's model states
  std::vector<std::unique_ptr<torch::TorchFile>> mp_more_;  // tp ranks 1 .. tp - 1
  std::vector<Group> groups_;
  std::vector<std::string> moe_prefixes_;  // MoE layer id -> module prefix
  std::vector<int> num_experts_;           // per MoE layer
  std::map<std::pair<int, int>, std::string> expert_files_;
  std::map<std::pair<int, int>, int> expert_file_mp_;  // (layer, expert) -> its file's mp rank
  std::set<std::pair<int, int>> optim_tp_files_;      // (dp, mp) of every optimizer file
  mutable std::mutex mu_;
  mutable deepspeed::CheckedInputs checked_inputs_;  // SetCheckedInputs
  mutable std::map<std::pair<int, int>, std::unique_ptr<torch::TorchFile>> expert_cache_;
  deepspeed::LazyOptimFiles optim_files_;  // per global rank
  std::vector<Where> where_;  // per info param
  state::ModelInfo info_;
  pickle::ValuePtr empty_dict_;
};

}  // namespace ucp::deepspeed_moe

#endif  // UCP_FORMATS_DEEPSPEED_MOE_MOE_STATE_H_
