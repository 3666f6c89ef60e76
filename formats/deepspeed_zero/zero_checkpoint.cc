#include "formats/deepspeed_zero/zero_checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/fs.h"
#include "base/parallel.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "format/torch/mapped_file.h"
#include "deepspeed/value_util.h"

namespace ucp::deepspeed_zero {

using deepspeed::ZeroParam;
using deepspeed::ReadLatestTag;
namespace internal = ::ucp::deepspeed::internal;

namespace {

using internal::CheckDense;
using internal::DictPath;
using internal::FileError;
using internal::Numel;
using internal::ShapeStr;
using internal::StringList;
using internal::Truthy;

using pickle::AsFragmentAddress;
using pickle::AsInt;
using pickle::AsSequence;
using pickle::AsTorchSize;
using pickle::GetField;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// The checkpoint files of a tag folder, by kind (the names
// ParseCheckpointFileName recognizes; anything else is not the checkpoint's).
struct FolderScan {
  std::vector<std::string> names;       // every entry of the folder
  std::vector<std::string> files;       // the checkpoint's: mp_rank, optimizer and layer files
  std::set<int> mp_ranks;
  std::map<int, std::set<int>> optim_dp;  // mp rank -> dp ranks
  std::set<int> bf16_values;              // 1: bf16_zero_pp_rank_*, 0: zero_pp_rank_*
  std::set<int> layer_tp;
  std::map<std::pair<int, int>, std::string> layer_paths;  // (layer, tp) -> path
  std::vector<std::string> zero3;                          // ZeRO-3 model state files
};

// Lists the tag folder `dir` and sorts its files by kind.
absl::StatusOr<FolderScan> ScanTagFolder(const std::string& dir) {
  FolderScan scan;
  UCP_ASSIGN_OR_RETURN(scan.names, ListDirectory(dir));
  for (const auto& n : scan.names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (!parsed) continue;
    switch (parsed->type) {
      case deepspeed::CheckpointFileName::Type::kMpRank:
        scan.mp_ranks.insert(parsed->mp_rank);
        scan.files.push_back(n);
        break;
      case deepspeed::CheckpointFileName::Type::kOptim:
        scan.optim_dp[parsed->mp_rank].insert(parsed->dp_rank);
        scan.bf16_values.insert(parsed->bf16_prefix ? 1 : 0);
        scan.files.push_back(n);
        break;
      case deepspeed::CheckpointFileName::Type::kLayer:
        scan.layer_paths[{parsed->layer, parsed->tp_rank}] = JoinPath(dir, n);
        scan.layer_tp.insert(parsed->tp_rank);
        scan.files.push_back(n);
        break;
      case deepspeed::CheckpointFileName::Type::kZero3Model:
        scan.zero3.push_back(n);
        break;
    }
  }
  return scan;
}

// Refuses a folder that is not a ZeRO stage 1/2 (or bf16 optimizer)
// checkpoint: ZeRO-3 and mixture-of-experts files (other formats read
// those), no mp_rank files, mixed bf16_ and plain optimizer file names, no
// optimizer files.
absl::Status CheckIsZero12Folder(const std::string& dir, const FolderScan& scan, const deepspeed::ReadOptions& read) {
  if (!scan.zero3.empty()) {
    // formats/deepspeed_zero3/ reads these (the registry picks it).
    return absl::InvalidArgumentError(absl::StrCat(dir, ": a ZeRO stage 3 checkpoint (found ", scan.zero3.front(),
                                                   "), not a ZeRO stage 1/2 one"));
  }
  // Mixture-of-experts checkpoints keep experts in files of their own
  // (engine.py _get_expert_ckpt_name / _get_optimizer_ckpt_name with
  // expp_rank); converting the rest alone would silently drop them.
  for (const auto& n : scan.names) {
    if (absl::StrContains(n, "_expert_") || absl::StartsWith(n, "expp_rank_")) {
      std::string version = "unknown";
      if (auto f = torch::TorchFile::Open(JoinPath(dir, deepspeed::MpRankFileName(0)), read.Files()); f.ok()) {
        const Value* v = (*f)->root()->is(Kind::kDict) ? (*f)->root()->DictGet("ds_version") : nullptr;
        if (v != nullptr && v->is(Kind::kStr)) version = v->str();
      }
      // formats/deepspeed_moe/ reads these (the registry picks it).
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": DeepSpeed ", version, " native mixture-of-experts checkpoint (found ", n,
          "; experts in layer_L_expert_E files), not a ZeRO stage 1/2 one without experts"));
    }
  }
  if (scan.mp_ranks.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": unrecognized checkpoint layout: expected mp_rank_XX_model_states.pt files (DeepSpeed ZeRO 1/2), found ",
        scan.names.empty() ? "an empty folder"
                           : absl::StrCat(scan.names.size(), " other entries, e.g. '", scan.names.front(), "'")));
  }
  if (scan.bf16_values.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": mixes bf16_zero_pp_rank_* and zero_pp_rank_* files"));
  }
  if (scan.optim_dp.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, ": no *zero_pp_rank_*_optim_states.pt files: ucp reads ZeRO stage 1/2 "
                                            "and bf16 optimizer checkpoints"));
  }
  return absl::OkStatus();
}

// Checks that the optimizer files are exactly dp ranks 0..dp-1 of every mp
// rank of the topology the model states give.
absl::Status CheckOptimFilesComplete(const std::string& dir, const state::Topology& topo,
                                     std::map<int, std::set<int>> optim_dp, bool bf16_prefix) {
  const int mp = topo.mp_world_size();
  for (int r = 0; r < mp; ++r) {
    for (int d = 0; d < topo.dp; ++d) {
      if (!optim_dp[r].count(d)) {
        return absl::NotFoundError(absl::StrCat(JoinPath(dir, deepspeed::OptimFileName(d, r, bf16_prefix)),
                                                ": missing (dp_world_size ", topo.dp, " in ",
                                                deepspeed::MpRankFileName(r), ")"));
      }
    }
    for (int d : optim_dp[r]) {
      if (d >= topo.dp) {
        return absl::InvalidArgumentError(absl::StrCat(JoinPath(dir, deepspeed::OptimFileName(d, r, bf16_prefix)),
                                                       ": dp rank ", d, " but dp_world_size is ", topo.dp));
      }
    }
  }
  for (const auto& [r, dps] : optim_dp) {
    if (r >= mp) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": optimizer files for mp rank ", r, " but only ", mp,
                                                     " mp_rank_*_model_states.pt files"));
    }
  }
  return absl::OkStatus();
}

// DeepSpeed 0.19.5 under Ulysses sequence parallelism (ds_config
// sequence_parallel_size sp > 1, one mp_rank_00 file) names the optimizer file of
// ZeRO rank d (of dp x sp) zero_pp_rank_d_mp_rank_{d % sp} (its sp rank, what the
// sequence-parallel mpu answers for get_model_parallel_rank); master (b39e07a71,
// #8226) names them all mp_rank_00. Returns sp and files `optim_dp` under mp rank
// 0 when every file is named so, else 1 (and `optim_dp` unchanged).
int UlyssesOptimNaming(const deepspeed::ModelStatesFiles& ms, const state::Topology& topo,
                       std::map<int, std::set<int>>& optim_dp) {
  if (topo.mp_world_size() != 1 || optim_dp.size() < 2) return 1;
  const int sp = internal::SequenceParallelSize(*ms.file(0, 0).root());
  if (sp < 2) return 1;
  std::set<int> all;
  for (const auto& [r, dps] : optim_dp) {
    for (int d : dps) {
      if (d % sp != r) return 1;
      all.insert(d);
    }
  }
  optim_dp = {{0, all}};
  return sp;
}

using StageLayouts = std::vector<std::vector<std::vector<deepspeed::ZeroGroupLayout>>>;  // [pp][tp][group]

// The partition layout of every (stage, tp rank, group), from param_shapes,
// in the default padding convention.
StageLayouts MakeLayouts(const deepspeed::ModelStatesFiles& ms, const state::Topology& topo, int num_groups) {
  StageLayouts layouts(topo.pp, std::vector<std::vector<deepspeed::ZeroGroupLayout>>(topo.tp));
  for (int s = 0; s < topo.pp; ++s) {
    for (int t = 0; t < topo.tp; ++t) {
      for (int g = 0; g < num_groups; ++g) {
        std::vector<int64_t> numels;
        for (const auto& [name, shape] : ms.Shapes(s, t, g)) numels.push_back(Numel(shape));
        layouts[s][t].push_back(deepspeed::ZeroGroupLayout::Make(std::move(numels), topo.dp));
      }
    }
  }
  return layouts;
}

// The same layouts in padding convention `convention`.
void RemakeLayouts(StageLayouts& layouts, int dp, deepspeed::PaddingConvention convention) {
  for (auto& per_tp : layouts) {
    for (auto& per_group : per_tp) {
      for (auto& layout : per_group) {
        std::vector<int64_t> numels;
        for (int i = 0; i < layout.num_params(); ++i) numels.push_back(layout.param_numel(i));
        layout = deepspeed::ZeroGroupLayout::Make(std::move(numels), dp, convention);
      }
    }
  }
}

// The optimizer's kind and ZeRO stage, as zero_pp_rank_0_mp_rank_00 tells
// them: a bf16 optimizer's state has neither zero_stage nor loss_scaler;
// the stage is the state's zero_stage, else the ds_config's, else
// `default_stage`.
struct OptimizerStage {
  state::OptimizerKind kind = state::OptimizerKind::kZero;
  int zero_stage = 1;
};

absl::StatusOr<OptimizerStage> ReadOptimizerStage(const OptimFile& first, const deepspeed::ModelStatesFiles& ms,
                                                  int default_stage) {
  OptimizerStage out;
  out.zero_stage = default_stage;
  out.kind = first.osd->DictGet("zero_stage") == nullptr &&
                     first.osd->DictGet("loss_scaler") == nullptr
                 ? state::OptimizerKind::kBf16
                 : state::OptimizerKind::kZero;
  if (const Value* zs = first.osd->DictGet("zero_stage")) {
    UCP_ASSIGN_OR_RETURN(out.zero_stage, pickle::AsZeroStage(*zs, "optimizer_state_dict.zero_stage"),
                         _.Prepend(first.path + ": "));
  } else if (const Value* st = DictPath(ms.file(0, 0).root().get(), {"ds_config", "zero_optimization", "stage"})) {
    if (st->is(Kind::kInt)) out.zero_stage = static_cast<int>(st->int_value());
  }
  if (out.zero_stage == 3) {
    return FileError(first.path, absl::StatusCode::kUnimplemented,
                     "records ZeRO stage 3 but has the stage 1/2 layout (mp_rank_XX_model_states.pt): not a layout "
                     "any DeepSpeed version writes");
  }
  return out;
}

// ds_version: the optimizer state's, the optimizer file's, or mp_rank_00's
// ("" when none records it).
std::string ReadDsVersion(const OptimFile& first, const deepspeed::ModelStatesFiles& ms) {
  for (const Value* v : {first.osd->DictGet("ds_version"), first.file->root()->DictGet("ds_version"),
                         ms.file(0, 0).root()->DictGet("ds_version")}) {
    if (v != nullptr && v->is(Kind::kStr)) return v->str();
  }
  return "";
}

// A scalar optimizer state as text, for comparing shards (a 0-dim tensor by
// its dtype and value).
std::string ScalarText(const torch::TorchFile& f, const Value& v) {
  if (torch::TorchFile::IsTensor(v)) {
    auto t = f.GetTensor(v);
    if (!t.ok() || t->numel() != 1) return v.DebugString(60);
    std::string bytes = t->ContiguousBytes();
    if (t->dtype() == torch::DType::kFloat32 && bytes.size() == 4) {
      float x;
      std::memcpy(&x, bytes.data(), 4);
      return absl::StrCat("tensor(", x, ")");
    }
    if (t->dtype() == torch::DType::kInt64 && bytes.size() == 8) {
      int64_t x;
      std::memcpy(&x, bytes.data(), 8);
      return absl::StrCat("tensor(", x, ")");
    }
    return absl::StrCat("tensor(", std::string(torch::DTypeName(t->dtype())), " ", absl::BytesToHexString(bytes), ")");
  }
  return v.DebugString(60);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZeroCheckpoint>> ZeroCheckpoint::Open(const std::string& path,
                                                                     std::vector<ModuleEntry> module_entries,
                                                                     const deepspeed::ReadOptions& read) {
  return OpenImpl(path, &module_entries, read);
}

absl::StatusOr<std::unique_ptr<ZeroCheckpoint>> ZeroCheckpoint::Open(const std::string& path,
                                                                     const deepspeed::ReadOptions& read) {
  return OpenImpl(path, nullptr, read);
}

absl::StatusOr<std::unique_ptr<ZeroCheckpoint>> ZeroCheckpoint::OpenImpl(const std::string& path_in,
                                                                         std::vector<ModuleEntry>* module_entries,
                                                                         const deepspeed::ReadOptions& read) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (!IsDirectory(path)) return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint folder"));
  std::unique_ptr<ZeroCheckpoint> c(new ZeroCheckpoint());
  c->read_ = read;
  // A root with `latest` and no checkpoint files of its own: follow the tag.
  bool has_mp = false;
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(path));
  for (const auto& n : names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kMpRank) has_mp = true;
  }
  if (!has_mp && PathExists(JoinPath(path, deepspeed::kLatestFile))) {
    UCP_ASSIGN_OR_RETURN(std::string tag, ReadLatestTag(path, deepspeed::kLatestFile));
    c->root_ = path;
    c->tag_ = tag;
    c->dir_ = JoinPath(path, tag);
    if (!IsDirectory(c->dir_)) {
      return absl::NotFoundError(absl::StrCat(JoinPath(path, deepspeed::kLatestFile), " names tag '", tag, "' but ", c->dir_,
                                              " is not a folder"));
    }
  } else {
    c->dir_ = path;
    c->tag_ = Basename(path);
    c->root_ = Dirname(path);
  }
  UCP_RETURN_IF_ERROR(c->Load(module_entries));
  return c;
}

// Loads in phases: sort the folder's files by kind and refuse other formats,
// open the model states (topology, params), check the optimizer files are
// complete, lay out the partitions, parse zero_pp_rank_0_mp_rank_00 for what
// every optimizer file shares (kind, stage, ds_version, padding convention,
// state keys), then read the module layout and check it against the files.
absl::Status ZeroCheckpoint::Load(const std::vector<ModuleEntry>* module_entries) {
  UCP_ASSIGN_OR_RETURN(FolderScan scan, ScanTagFolder(dir_));
  files_ = std::move(scan.files);
  layer_paths_ = std::move(scan.layer_paths);
  for (const auto& [key, path] : layer_paths_) layer_slots_[key] = std::make_unique<OnceSlot<torch::TorchFile>>();
  UCP_RETURN_IF_ERROR(CheckIsZero12Folder(dir_, scan, read_));
  bf16_prefix_ = scan.bf16_values.count(1) > 0;

  // Model states.
  const std::set<int>& layer_tp = scan.layer_tp;
  UCP_ASSIGN_OR_RETURN(ms_, deepspeed::ModelStatesFiles::Open(dir_, layer_tp.empty() ? 0 : *layer_tp.rbegin() + 1, read_));
  topo_ = ms_->topology();
  pipeline_ = ms_->pipeline();
  if (pipeline_) {
    std::set<int> layers;
    for (const auto& [key, path] : layer_paths_) layers.insert(key.first);
    layer_files_.assign(layers.begin(), layers.end());
  }
  num_groups_ = ms_->num_groups();
  if (!layer_tp.empty() && static_cast<int>(layer_tp.size()) != *layer_tp.rbegin() + 1) {
    return absl::NotFoundError(absl::StrCat(dir_, ": layer files exist for tp ranks ", absl::StrJoin(layer_tp, ","),
                                            " only"));
  }
  ulysses_sp_ = UlyssesOptimNaming(*ms_, topo_, scan.optim_dp);
  UCP_RETURN_IF_ERROR(CheckOptimFilesComplete(dir_, topo_, scan.optim_dp, bf16_prefix_));

  // Partition layouts.
  layouts_ = MakeLayouts(*ms_, topo_, num_groups_);
  // Optimizer files open on first use (a unit of work reads only the files
  // it needs); each is checked against the partition math and against
  // zero_pp_rank_0_mp_rank_00, which is read now for what every file shares.
  for (int s = 0; s < topo_.pp; ++s) {
    for (int t = 0; t < topo_.tp; ++t) {
      for (int d = 0; d < topo_.dp; ++d) optim_slots_[{s, t, d}] = std::make_unique<OnceSlot<OptimFile>>();
    }
  }
  // Its slot is filled now, without Optim()'s checks: it is the file the
  // others are checked against, and its masters are checked against the lp
  // weights at the end of Load.
  UCP_ASSIGN_OR_RETURN(const OptimFile* first_file,
                       optim_slots_.at({0, 0, 0})->Get([&] { return ParseOptim(0, 0, 0); }));
  // Zero stage from the files or the config.
  const OptimFile& first = *first_file;
  UCP_ASSIGN_OR_RETURN(const OptimizerStage stage, ReadOptimizerStage(first, *ms_, zero_stage_));
  kind_ = stage.kind;
  zero_stage_ = stage.zero_stage;
  ds_version_ = ReadDsVersion(first, *ms_);
  {
    auto version = deepspeed::ParseDsVersion(ds_version_);
    convention_ = deepspeed::PaddingConventionOf(version.ok() ? *version : deepspeed::DsVersion{0, 14, 4},
                                                 kind_ == state::OptimizerKind::kBf16);
    if (first.convention_decided) convention_ = first.convention;
    RemakeLayouts(layouts_, topo_.dp, convention_);
  }
  // The per-element state keys, the same in every file (CheckLikeFirst).
  state_keys_ = first.StateNames(0);
  lp_dtype_ = ms_->config_lp_dtype();
  if (module_entries != nullptr) {
    UCP_RETURN_IF_ERROR(SetModuleLayout(*module_entries));
  } else {
    UCP_RETURN_IF_ERROR(LoadModuleLayout());
  }
  for (size_t i = 0; i < module_entries_.size(); ++i) {
    if (module_entries_[i].role == state::TensorRole::kTrainable) lp_entry_.emplace(module_entries_[i].name, i);
  }
  UCP_RETURN_IF_ERROR(CheckLayerFilesPresent());
  return CheckMastersMatchLp(first, 0, 0, 0);
}

absl::Status ZeroCheckpoint::CheckLayerFilesPresent() const {
  if (!pipeline_) return absl::OkStatus();
  // DeepSpeed's PipelineModule.load_state_dir reads one file per layer
  // module and tp rank: every layer that holds a param must have them.
  std::set<int> needed;
  for (const auto& p : ms_->params()) {
    if (p.layer >= 0) needed.insert(p.layer);
  }
  std::vector<std::string> missing;
  for (int layer : needed) {
    for (int t = 0; t < topo_.tp; ++t) {
      if (!layer_paths_.count({layer, t})) missing.push_back(deepspeed::LayerFileName(layer, t));
    }
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      dir_, ": missing layer file", missing.size() > 1 ? "s " : " ",
      absl::StrJoin(missing.begin(), missing.begin() + std::min<size_t>(missing.size(), 6), ", "),
      missing.size() > 6 ? absl::StrCat(" and ", missing.size() - 6, " more") : "",
      " (param_shapes of ", deepspeed::MpRankFileName(0),
      " has params of those layers; DeepSpeed's PipelineModule.load_state_dir reads them)"));
}

absl::StatusOr<torch::Tensor> ZeroCheckpoint::ModuleTensorUnchecked(const ModuleEntry& entry, int tp) const {
  if (entry.layer >= 0) {
    UCP_ASSIGN_OR_RETURN(const torch::TorchFile* f, LayerFile(entry.layer, tp));
    const Value* v = f->root()->is(Kind::kDict) ? f->root()->DictGet(entry.local_name) : nullptr;
    if (v == nullptr) return absl::NotFoundError(absl::StrCat(f->path(), ": no '", entry.local_name, "'"));
    return f->GetTensor(*v);
  }
  const torch::TorchFile& f = MpRankFile(0, tp);
  const Value* m = f.root()->DictGet("module");
  const Value* v = m != nullptr && m->is(Kind::kDict) ? m->DictGet(entry.name) : nullptr;
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(f.path(), ": module has no '", entry.name, "'"));
  return f.GetTensor(*v);
}

namespace {

// One element of a sample: where its bytes are in a file (for a prefetch and
// a pread), or, for a tensor that is not a contiguous view of a mapped file,
// only the tensor.
struct SampleRef {
  const torch::Tensor* tensor = nullptr;
  int64_t index = 0;
  std::shared_ptr<const torch::MappedFile> file;  // null: read through the tensor
  uint64_t offset = 0;
};

SampleRef LocateSample(const torch::Tensor& t, int64_t index, const torch::TorchFile* file) {
  SampleRef r;
  r.tensor = &t;
  r.index = index;
  const std::shared_ptr<const torch::MappedFile>* mapped = file != nullptr ? &file->mapped_file() : nullptr;
  if (mapped == nullptr || *mapped == nullptr || !t.is_contiguous()) return r;
  const uint8_t* p = t.data() + static_cast<size_t>(index) * torch::ItemSize(t.dtype());
  const uint8_t* base = (*mapped)->data();
  if (base == nullptr || p < base || p + torch::ItemSize(t.dtype()) > base + (*mapped)->size()) return r;
  r.file = *mapped;
  r.offset = static_cast<uint64_t>(p - base);
  return r;
}

// Reads a sampled element with pread: touching it through the mapping would
// make the kernel read megabytes around it (mmap read-around), and the
// sampled lp weights are otherwise never read by a conversion.
absl::Status ReadSample(const SampleRef& r, uint8_t* out) {
  const size_t n = torch::ItemSize(r.tensor->dtype());
  if (r.file != nullptr) return r.file->ReadAt(r.offset, absl::MakeSpan(out, n));
  return r.tensor->CopyFlatRange(r.index, 1, out);
}

}  // namespace

absl::Status ZeroCheckpoint::CheckMastersMatchLp(const OptimFile& file, int pp, int tp, int dp) const {
  // The lp weights of trainable params are their fp32 masters rounded to the
  // lp dtype (DeepSpeed copies the masters into them after every step). A
  // few elements of every fragment are compared with the lp weight the
  // (pp, tp) rank's own layer or module file holds: an optimizer file of
  // another rank (swapped, mislabelled) differs. The samples are read where
  // they are, a few bytes each (pread, after one prefetch of them all so
  // that the disk reads them together), without reading (or CRC-checking)
  // whole tensors.
  struct Sample {
    std::string name;
    const ModuleEntry* entry;
    int64_t lp_index;
    SampleRef master, weight;
  };
  std::vector<torch::Tensor> lp_tensors;  // kept alive for the samples
  lp_tensors.reserve(module_entries_.size());
  for (int g = 0; g < num_groups_ && g < static_cast<int>(file.fp32.size()); ++g) {
    const deepspeed::ZeroGroupLayout& layout = layouts_[pp][tp][g];
    const auto& names = ms_->StageGroup(pp, g);
    const torch::Tensor& fp32 = file.fp32[g];
    if (fp32.dtype() != torch::DType::kFloat32) continue;
    std::vector<Sample> samples;
    lp_tensors.clear();
    lp_tensors.reserve(layout.Fragments(dp).size());
    for (const deepspeed::ZeroFragment& frag : layout.Fragments(dp)) {
      if (frag.param_index < 0 || static_cast<size_t>(frag.param_index) >= names.size() || frag.numel <= 0) continue;
      const std::string& name = names[frag.param_index];
      auto it = lp_entry_.find(name);
      if (it == lp_entry_.end()) continue;
      const ModuleEntry& e = module_entries_[it->second];
      absl::StatusOr<torch::Tensor> lp = ModuleTensorUnchecked(e, tp);
      if (!lp.ok()) continue;  // reported where the tensor is read
      if (lp->numel() < frag.param_offset + frag.numel) continue;
      const torch::DType lp_dtype = lp->dtype();
      if (lp_dtype != torch::DType::kFloat32 && lp_dtype != torch::DType::kBFloat16 &&
          lp_dtype != torch::DType::kFloat16) {
        continue;
      }
      const torch::TorchFile* lp_file = nullptr;
      if (e.layer >= 0) {
        auto f = LayerFile(e.layer, tp);
        if (f.ok()) lp_file = *f;
      } else {
        lp_file = &MpRankFile(0, tp);
      }
      lp_tensors.push_back(*std::move(lp));
      const torch::Tensor& lp_tensor = lp_tensors.back();
      for (int64_t k : {int64_t{0}, frag.numel / 2, frag.numel - 1}) {
        const int64_t at = frag.partition_offset + k;
        if (at >= fp32.numel()) continue;
        samples.push_back({name, &e, frag.param_offset + k, LocateSample(fp32, at, file.file.get()),
                           LocateSample(lp_tensor, frag.param_offset + k, lp_file)});
      }
    }
    // Asked for per file, only where not cached already (a warm checkpoint:
    // no system call per sample but its read).
    std::map<const torch::MappedFile*, std::pair<std::vector<uint64_t>, uint64_t>> wanted;
    for (const Sample& s : samples) {
      for (const SampleRef* r : {&s.master, &s.weight}) {
        if (r->file == nullptr) continue;
        auto& [offsets, len] = wanted[r->file.get()];
        offsets.push_back(r->offset);
        len = std::max<uint64_t>(len, torch::ItemSize(r->tensor->dtype()));
      }
    }
    for (const auto& [file, want] : wanted) (void)file->PrefetchMissing(want.first, want.second);
    int64_t compared = 0, differing = 0;
    std::string example;
    for (const Sample& s : samples) {
      const torch::DType lp_dtype = s.weight.tensor->dtype();
      std::string master(4, '\0'), weight(torch::ItemSize(lp_dtype), '\0');
      if (!ReadSample(s.master, reinterpret_cast<uint8_t*>(master.data())).ok()) continue;
      if (!ReadSample(s.weight, reinterpret_cast<uint8_t*>(weight.data())).ok()) continue;
      float m = 0;
      std::memcpy(&m, master.data(), 4);
      if (std::isnan(m)) continue;
      std::string rounded = master;
      if (lp_dtype != torch::DType::kFloat32) {
        auto t = torch::Tensor::FromBytes(torch::DType::kFloat32, {1}, master);
        if (!t.ok()) continue;
        auto c = torch::Cast(*t, lp_dtype);
        if (!c.ok()) continue;
        rounded = c->ContiguousBytes();
      }
      ++compared;
      if (rounded != weight) {
        if (++differing == 1) {
          example = absl::StrCat("param '", s.name, "' element ", s.lp_index, ": fp32 master ", m,
                                 " but lp weight bytes ", absl::BytesToHexString(weight), " in ",
                                 s.entry->layer >= 0 ? LayerPath(s.entry->layer, tp) : MpRankPath(0, tp));
        }
      }
    }
    if (differing > 0) {
      return FileError(file.path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("the fp32 masters of group ", g, " do not match the lp weights of pipeline stage ",
                                    pp, ", tp rank ", tp, " (", differing, " of ", compared,
                                    " sampled elements differ, e.g. ", example,
                                    "): this optimizer file belongs to another rank (swapped or mislabelled "
                                    "shards?) or one of the files is damaged"));
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroCheckpoint::SetModuleLayout(std::vector<ModuleEntry> entries) {
  for (const ModuleEntry& e : entries) {
    if (static_cast<int>(e.tp_shapes.size()) != topo_.tp) {
      return absl::InvalidArgumentError(absl::StrCat(dir_, ": module tensor '", e.name, "' given with ",
                                                     e.tp_shapes.size(), " tp shapes for tp=", topo_.tp));
    }
  }
  module_entries_ = std::move(entries);
  for (const auto& e : module_entries_) {
    if (e.role == state::TensorRole::kTrainable) {
      lp_dtype_ = e.dtype;
      break;
    }
  }
  return absl::OkStatus();
}

namespace {

// Tied aliases: engine._get_shared_params (global rank 0's file, `root0`,
// only) maps each alias to the param that holds the data, a trainable param
// or (a plain module's, `module0`) frozen one, e.g. a tied embedding a LoRA
// run freezes. An owner is never an alias itself.
std::map<std::string, std::string> SharedAliases(const pickle::Value& root0, const pickle::Value* module0,
                                                 const std::set<std::string>& buffer_names,
                                                 const std::function<bool(const std::string&)>& is_param) {
  std::map<std::string, std::string> aliases;
  auto frozen_owner = [&](const std::string& owner) {
    return module0 != nullptr && module0->is(pickle::Kind::kDict) && module0->DictGet(owner) != nullptr &&
           !buffer_names.count(owner);
  };
  if (const pickle::Value* sp = root0.DictGet("shared_params"); sp != nullptr && sp->is(pickle::Kind::kDict)) {
    for (const auto& [k, v] : sp->dict_items()) {
      if (!k->is(pickle::Kind::kStr) || !v->is(pickle::Kind::kStr) || k->str() == v->str()) continue;
      if (is_param(v->str()) || frozen_owner(v->str())) aliases[k->str()] = v->str();
    }
  }
  for (auto it = aliases.begin(); it != aliases.end();) {
    it = aliases.count(it->second) ? aliases.erase(it) : std::next(it);
  }
  return aliases;
}

}  // namespace

void ZeroCheckpoint::ParseLayerFiles() const {
  std::vector<std::pair<int, int>> keys;
  for (const auto& [key, slot] : layer_slots_) keys.push_back(key);
  (void)ParallelFor(keys.size(), /*num_threads=*/0, [&](size_t i) {
    (void)LayerFile(keys[i].first, keys[i].second);  // an error stays in its slot
    return absl::OkStatus();
  });
}

absl::Status ZeroCheckpoint::LoadModuleLayout() {
  const std::set<std::string>& buffer_names = ms_->buffer_names();
  std::set<std::string> tied_keys;
  for (const auto& p : ms_->params()) {
    if (!p.tied_key.empty()) tied_keys.insert(p.tied_key);
  }
  const Value* module0 = pipeline_ ? nullptr : ms_->file(0, 0).root()->DictGet("module");
  const std::map<std::string, std::string> aliases =
      SharedAliases(*ms_->file(0, 0).root(), module0, buffer_names,
                    [&](const std::string& name) { return ms_->FindParam(name) != nullptr; });
  auto role_of = [&](const std::string& name) {
    if (ms_->FindParam(name)) return state::TensorRole::kTrainable;
    if (buffer_names.count(name)) return state::TensorRole::kBuffer;
    if (aliases.count(name)) return state::TensorRole::kTied;
    return state::TensorRole::kFrozen;
  };
  auto add_entry = [&](ModuleEntry e, const std::vector<torch::Tensor>& per_tp) {
    e.dtype = per_tp[0].dtype();
    for (const auto& t : per_tp) e.tp_shapes.push_back(t.sizes());
    module_entries_.push_back(std::move(e));
  };
  if (pipeline_) {
    ParseLayerFiles();
    for (int layer : layer_files_) {
      for (int t = 0; t < topo_.tp; ++t) {
        if (!layer_paths_.count({layer, t})) {
          return absl::NotFoundError(absl::StrCat(JoinPath(dir_, deepspeed::LayerFileName(layer, t)), ": missing (layer ", layer,
                                                  " has a file for another tp rank)"));
        }
      }
      std::vector<const torch::TorchFile*> files;
      for (int t = 0; t < topo_.tp; ++t) {
        UCP_ASSIGN_OR_RETURN(const torch::TorchFile* f, LayerFile(layer, t));
        files.push_back(f);
      }
      const Value& sd0 = *files[0]->root();
      if (!sd0.is(Kind::kDict)) {
        return FileError(files[0]->path(), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("expected a state dict, found ", sd0.DebugString(60)));
      }
      for (const auto& [k, v] : sd0.dict_items()) {
        if (!k->is(Kind::kStr) || !torch::TorchFile::IsTensor(*v)) continue;
        ModuleEntry e;
        e.local_name = k->str();
        e.layer = layer;
        e.name = absl::StrCat(layer, ".", e.local_name);
        if (!ms_->FindParam(e.name) && !buffer_names.count(e.name)) {
          for (const auto& key : tied_keys) {
            const std::string tied = absl::StrCat("tied_modules.", key, ".", e.local_name);
            if (ms_->FindParam(tied) || buffer_names.count(tied)) {
              e.name = tied;
              e.tied_key = key;
              break;
            }
          }
        }
        e.role = role_of(e.name);
        if (e.role == state::TensorRole::kTied) e.alias_of = aliases.at(e.name);
        std::vector<torch::Tensor> per_tp;
        for (int t = 0; t < topo_.tp; ++t) {
          const Value* tv = files[t]->root()->is(Kind::kDict) ? files[t]->root()->DictGet(e.local_name) : nullptr;
          if (tv == nullptr) {
            return FileError(files[t]->path(), absl::StatusCode::kInvalidArgument,
                             absl::StrCat("missing '", e.local_name, "' which ", Basename(files[0]->path()), " has"));
          }
          UCP_ASSIGN_OR_RETURN(torch::Tensor tensor, files[t]->GetTensor(*tv));
          UCP_RETURN_IF_ERROR(CheckDense(tensor, files[t]->path(), e.local_name));
          per_tp.push_back(std::move(tensor));
        }
        add_entry(std::move(e), per_tp);
      }
    }
  } else {
    for (int t = 0; t < topo_.tp; ++t) {
      const Value* m = ms_->file(0, t).root()->DictGet("module");
      if (m == nullptr || !m->is(Kind::kDict)) {
        return FileError(ms_->file(0, t).path(), absl::StatusCode::kInvalidArgument,
                         "expected a module state dict, found none (mixed pipeline and plain module files?)");
      }
    }
    const Value& m0 = *ms_->file(0, 0).root()->DictGet("module");
    for (const auto& [k, v] : m0.dict_items()) {
      if (!k->is(Kind::kStr) || !torch::TorchFile::IsTensor(*v)) continue;
      ModuleEntry e;
      e.name = k->str();
      e.local_name = e.name;
      e.role = role_of(e.name);
      if (e.role == state::TensorRole::kTied) e.alias_of = aliases.at(e.name);
      std::vector<torch::Tensor> per_tp;
      for (int t = 0; t < topo_.tp; ++t) {
        const Value* tv = ms_->file(0, t).root()->DictGet("module")->DictGet(e.name);
        if (tv == nullptr) {
          return FileError(ms_->file(0, t).path(), absl::StatusCode::kInvalidArgument,
                           absl::StrCat("module has no '", e.name, "' which ", deepspeed::MpRankFileName(0), " has"));
        }
        UCP_ASSIGN_OR_RETURN(torch::Tensor tensor, ms_->file(0, t).GetTensor(*tv));
        UCP_RETURN_IF_ERROR(CheckDense(tensor, ms_->file(0, t).path(), e.name));
        per_tp.push_back(std::move(tensor));
      }
      add_entry(std::move(e), per_tp);
    }
  }
  // lp dtype from the weights themselves when there are any.
  for (const auto& e : module_entries_) {
    if (e.role == state::TensorRole::kTrainable) {
      lp_dtype_ = e.dtype;
      break;
    }
  }
  return absl::OkStatus();
}

namespace {

// An optimizer file's refusal: kInvalidArgument, the file named.
absl::Status OptimError(const std::string& path, absl::string_view what) {
  return FileError(path, absl::StatusCode::kInvalidArgument, what);
}

// Checks optimizer_state_dict.partition_count (one int, or one per group):
// every group is partitioned over dp_world_size ranks.
absl::Status CheckPartitionCount(const Value& osd, const std::string& path, int num_groups, int dp_world) {
  UCP_ASSIGN_OR_RETURN(const Value* pc, GetField(osd, "partition_count", "optimizer_state_dict"),
                       _.Prepend(path + ": "));
  std::vector<int64_t> counts;
  if (pc->is(Kind::kInt)) {
    counts.assign(num_groups, pc->int_value());
  } else {
    UCP_ASSIGN_OR_RETURN(auto* seq, AsSequence(*pc, "partition_count"), _.Prepend(path + ": "));
    for (const auto& c : *seq) {
      UCP_ASSIGN_OR_RETURN(int64_t n, AsInt(*c, "partition_count"), _.Prepend(path + ": "));
      counts.push_back(n);
    }
  }
  for (int64_t c : counts) {
    if (c != dp_world) {
      return OptimError(path, absl::StrCat("partition_count is [", absl::StrJoin(counts, ", "), "], expected ",
                                           dp_world, " (dp_world_size) for every group"));
    }
  }
  return absl::OkStatus();
}

// The per-group entries of optimizer_state_dict: group_paddings, the fp32
// partitions and param_slice_mappings (one each per group), and the base
// optimizer state.
struct OptimGroupLists {
  std::vector<int64_t> paddings;
  const std::vector<ValuePtr>* fp32s = nullptr;
  const Value* base = nullptr;
  const std::vector<ValuePtr>* mappings = nullptr;
};

// Reads the per-group entries and checks that each lists `num_groups` groups,
// as param_shapes of mp rank `mp_rank` does.
absl::StatusOr<OptimGroupLists> ReadGroupLists(const Value& osd, const std::string& path, int num_groups,
                                               int mp_rank) {
  OptimGroupLists l;
  UCP_ASSIGN_OR_RETURN(const Value* gp, GetField(osd, "group_paddings", "optimizer_state_dict"),
                       _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(auto* gps, AsSequence(*gp, "group_paddings"), _.Prepend(path + ": "));
  for (const auto& v : *gps) {
    UCP_ASSIGN_OR_RETURN(int64_t n, AsInt(*v, "group_paddings"), _.Prepend(path + ": "));
    l.paddings.push_back(n);
  }
  UCP_ASSIGN_OR_RETURN(const Value* fp32v, GetField(osd, "single_partition_of_fp32_groups", "optimizer_state_dict"),
                       _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(l.fp32s, AsSequence(*fp32v, "single_partition_of_fp32_groups"), _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(l.base, GetField(osd, "base_optimizer_state", "optimizer_state_dict"),
                       _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(const Value* mappings_v, GetField(osd, "param_slice_mappings", "optimizer_state_dict"),
                       _.Prepend(path + ": "));
  UCP_ASSIGN_OR_RETURN(l.mappings, AsSequence(*mappings_v, "param_slice_mappings"), _.Prepend(path + ": "));
  if (static_cast<int>(l.paddings.size()) != num_groups || static_cast<int>(l.fp32s->size()) != num_groups ||
      static_cast<int>(l.mappings->size()) != num_groups) {
    return OptimError(path, absl::StrCat("expected ", num_groups, " param groups (param_shapes of ",
                                         deepspeed::MpRankFileName(mp_rank), "), found ", l.paddings.size(),
                                         " group_paddings, ", l.fp32s->size(), " fp32 partitions and ",
                                         l.mappings->size(), " param_slice_mappings"));
  }
  return l;
}

// The optimizer state dict of each group in the base optimizer state:
// {'state': {g: {...}}, 'param_groups': [...]}, or the elastic form: a list
// of per-group dicts. Null for a group the dict form lacks.
absl::StatusOr<std::vector<const Value*>> BaseGroupStates(const Value& base, const std::string& path,
                                                          int num_groups) {
  std::vector<const Value*> group_states(num_groups, nullptr);
  if (base.is(Kind::kDict)) {
    UCP_ASSIGN_OR_RETURN(const Value* st, GetField(base, "state", "base_optimizer_state"), _.Prepend(path + ": "));
    if (!st->is(Kind::kDict)) return OptimError(path, "base_optimizer_state.state is not a dict");
    for (int g = 0; g < num_groups; ++g) group_states[g] = st->DictGet(Value::Int(g));
  } else if (base.is(Kind::kList)) {
    if (static_cast<int>(base.items().size()) != num_groups) {
      return OptimError(path, absl::StrCat("base_optimizer_state has ", base.items().size(), " groups, expected ",
                                           num_groups));
    }
    for (int g = 0; g < num_groups; ++g) group_states[g] = base.items()[g].get();
  } else {
    return OptimError(path, absl::StrCat("base_optimizer_state is a ", pickle::KindName(base.kind()),
                                         ", expected a dict or list"));
  }
  return group_states;
}

// Checks group g's padding on dp rank `dp` against the partition math, and
// records in `out` the padding convention it follows when it tells the two
// apart. DeepSpeed saves group[:p - padding]; which ranks record padding
// changed in 0.16.4 (layout_math.h, PaddingConvention): the file says which
// it follows, whatever its ds_version.
absl::Status CheckGroupPadding(const deepspeed::ZeroGroupLayout& layout, int64_t padding, int g, int dp,
                               int dp_world, const std::string& path, OptimFile* out) {
  const int64_t last_rank = layout.PaddingAs(dp, deepspeed::PaddingConvention::kLastRank);
  const int64_t per_rank = layout.PaddingAs(dp, deepspeed::PaddingConvention::kPerRank);
  if (padding != last_rank && padding != per_rank) {
    return OptimError(
        path, absl::StrCat("group_paddings[", g, "] is ", padding, ", expected ",
                           last_rank == per_rank
                               ? absl::StrCat(per_rank)
                               : absl::StrCat(last_rank, " (last-rank padding, DeepSpeed <= 0.16.3) or ", per_rank,
                                              " (per-rank padding, DeepSpeed >= 0.16.4)"),
                           " for dp rank ", dp, " (", layout.numel(), " elements padded to ", layout.padded_numel(),
                           " over dp=", dp_world, ")"));
  }
  if (last_rank != per_rank) {
    out->convention = padding == per_rank ? deepspeed::PaddingConvention::kPerRank
                                          : deepspeed::PaddingConvention::kLastRank;
    out->convention_decided = true;
  }
  return absl::OkStatus();
}

// Reads group g's fp32 partition and its optimizer states (per-element ones
// and scalars, split by the shared SplitFlatStates) into `out`, each
// per-element tensor holding the partition (p elements) or its lean part (p
// minus the group's `padding`).
absl::Status ReadGroupTensors(const Value& fp32_value, const Value* group_state,
                              const deepspeed::ZeroGroupLayout& layout, int64_t padding, int g, OptimFile* out) {
  const std::string& path = out->path;
  const torch::TorchFile& file = *out->file;
  const int64_t p = layout.partition_numel();
  const int64_t lean = layout.LeanNumel(padding);
  if (!torch::TorchFile::IsTensor(fp32_value)) {
    return OptimError(path, absl::StrCat("single_partition_of_fp32_groups[", g, "] is not a tensor"));
  }
  UCP_ASSIGN_OR_RETURN(torch::Tensor fp32, file.GetTensor(fp32_value));
  UCP_RETURN_IF_ERROR(CheckDense(fp32, path, absl::StrCat("single_partition_of_fp32_groups[", g, "]")));
  if (fp32.dim() != 1 || (fp32.numel() != lean && fp32.numel() != p)) {
    return OptimError(path, absl::StrCat("single_partition_of_fp32_groups[", g, "] has shape ",
                                         ShapeStr(fp32.sizes()), ", expected [", lean, "] (partition of ", p,
                                         " minus padding ", padding, ")"));
  }
  if (group_state == nullptr || !group_state->is(Kind::kDict)) {
    return OptimError(path, absl::StrCat("base_optimizer_state has no state for group ", g));
  }
  deepspeed::FlatStatesSpec spec;
  spec.numel = p;
  spec.lean_numel = lean;
  spec.dense = deepspeed::FlatStatesSpec::Dense::kEvery;
  spec.one_element_scalars = true;
  spec.expected_note = " (the dp partition)";
  UCP_ASSIGN_OR_RETURN(internal::GroupStates split, deepspeed::SplitFlatStates(file, path, *group_state, g, spec));
  out->paddings.push_back(padding);
  out->fp32.push_back(std::move(fp32));
  out->states.push_back(std::move(split.per_element));
  out->scalars.push_back(std::move(split.scalars));
  return absl::OkStatus();
}

// Checks param_slice_mappings[g] (`m`) against the partition math: the
// fragments of dp rank `dp`, in order, named as param_shapes names them
// (`names`), at the offsets and sizes the layout gives.
absl::Status CheckSliceMappings(const Value& m, const deepspeed::ZeroGroupLayout& layout,
                                const std::vector<std::string>& names, int g, int dp, int dp_world,
                                const std::string& path) {
  if (!m.is(Kind::kDict)) return OptimError(path, absl::StrCat("param_slice_mappings[", g, "] is not a dict"));
  const std::vector<deepspeed::ZeroFragment> expected = layout.Fragments(dp);
  if (m.dict_items().size() != expected.size()) {
    return OptimError(path, absl::StrCat("param_slice_mappings[", g, "] lists ", m.dict_items().size(),
                                         " params, expected ", expected.size(), " for dp rank ", dp, " of ",
                                         dp_world));
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [k, v] = m.dict_items()[i];
    const std::string& want = names[expected[i].param_index];
    if (!k->is(Kind::kStr) || k->str() != want) {
      return OptimError(path, absl::StrCat("param_slice_mappings[", g, "] entry ", i, " is ", k->DebugString(),
                                           ", expected '", want, "'"));
    }
    UCP_ASSIGN_OR_RETURN(pickle::FragmentAddress a, AsFragmentAddress(*v, want), _.Prepend(path + ": "));
    if (a.numel != expected[i].numel || a.start != expected[i].partition_offset) {
      return OptimError(path, absl::StrCat("param '", want, "' has fragment_address(numel=", a.numel,
                                           ", start=", a.start, "), expected (numel=", expected[i].numel,
                                           ", start=", expected[i].partition_offset, ") from param_shapes"));
    }
  }
  return absl::OkStatus();
}

// Checks that all groups hold the same optimizer state keys as group 0.
absl::Status CheckSameStateKeys(const OptimFile& out, int num_groups) {
  for (int g = 1; g < num_groups; ++g) {
    const std::vector<std::string> a = out.StateNames(0), b = out.StateNames(g);
    if (!internal::SameStateNames(a, b)) {
      return OptimError(out.path, absl::StrCat("group ", g, " has optimizer states [", absl::StrJoin(b, ", "),
                                               "], group 0 has [", absl::StrJoin(a, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Parses in phases: open the file and find optimizer_state_dict, check
// partition_count, read the per-group lists and the base optimizer state,
// then per group check the padding, read the fp32 partition and states and
// check param_slice_mappings; last, CRC-check what is not a partition and
// check that the groups hold the same state keys.
absl::StatusOr<std::unique_ptr<OptimFile>> ZeroCheckpoint::ParseOptim(int pp, int tp, int dp) const {
  const std::string path = OptimPath(pp, tp, dp);
  auto out = std::make_unique<OptimFile>();
  out->path = path;
  const torch::OpenOptions lazy = read_.Files(/*verify_crc=*/false);  // the partitions when used (VerifyPartition), the rest below
  UCP_ASSIGN_OR_RETURN(out->file, torch::TorchFile::Open(path, lazy));
  const Value& root = *out->file->root();
  if (!root.is(Kind::kDict)) return OptimError(path, absl::StrCat("expected a dict, found ", root.DebugString(60)));
  UCP_ASSIGN_OR_RETURN(const Value* osd, GetField(root, "optimizer_state_dict", "optimizer states"),
                       _.Prepend(path + ": "));
  if (!osd->is(Kind::kDict)) return OptimError(path, "optimizer_state_dict is not a dict");
  out->osd = osd;
  UCP_RETURN_IF_ERROR(CheckPartitionCount(*osd, path, num_groups_, topo_.dp));
  UCP_ASSIGN_OR_RETURN(const OptimGroupLists lists, ReadGroupLists(*osd, path, num_groups_, topo_.mp_rank(pp, tp)));
  UCP_ASSIGN_OR_RETURN(const std::vector<const Value*> group_states, BaseGroupStates(*lists.base, path, num_groups_));
  for (int g = 0; g < num_groups_; ++g) {
    const deepspeed::ZeroGroupLayout& layout = layouts_[pp][tp][g];
    UCP_RETURN_IF_ERROR(CheckGroupPadding(layout, lists.paddings[g], g, dp, topo_.dp, path, out.get()));
    UCP_RETURN_IF_ERROR(ReadGroupTensors(*(*lists.fp32s)[g], group_states[g], layout, lists.paddings[g], g, out.get()));
    UCP_RETURN_IF_ERROR(
        CheckSliceMappings(*(*lists.mappings)[g], layout, ms_->StageGroup(pp, g), g, dp, topo_.dp, path));
  }
  UCP_RETURN_IF_ERROR(out->VerifyStoragesButPartitions());
  UCP_RETURN_IF_ERROR(CheckSameStateKeys(*out, num_groups_));
  return out;
}

const deepspeed::ZeroGroupLayout& ZeroCheckpoint::Layout(int pp, int tp, int group) const { return layouts_[pp][tp][group]; }

std::string ZeroCheckpoint::MpRankPath(int pp, int tp) const { return ms_->path(pp, tp); }
std::string ZeroCheckpoint::OptimPath(int pp, int tp, int dp) const {
  const int mp_rank = ulysses_sp_ > 1 ? dp % ulysses_sp_ : topo_.mp_rank(pp, tp);
  return JoinPath(dir_, deepspeed::OptimFileName(dp, mp_rank, bf16_prefix_));
}
std::string ZeroCheckpoint::LayerPath(int layer, int tp) const {
  auto it = layer_paths_.find({layer, tp});
  return it != layer_paths_.end() ? it->second : JoinPath(dir_, deepspeed::LayerFileName(layer, tp));
}

absl::StatusOr<const OptimFile*> ZeroCheckpoint::Optim(int pp, int tp, int dp) const {
  auto it = optim_slots_.find({pp, tp, dp});
  if (it == optim_slots_.end()) {
    return absl::NotFoundError(absl::StrCat(OptimPath(pp, tp, dp), ": not part of this checkpoint"));
  }
  return it->second->Get([&]() -> absl::StatusOr<std::unique_ptr<OptimFile>> {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<OptimFile> parsed, ParseOptim(pp, tp, dp));
    UCP_RETURN_IF_ERROR(CheckLikeFirst(*parsed));
    UCP_RETURN_IF_ERROR(CheckMastersMatchLp(*parsed, pp, tp, dp));
    return parsed;
  });
}

absl::Status ZeroCheckpoint::CheckLikeFirst(const OptimFile& file) const {
  const OptimFile& first = *optim_slots_.at({0, 0, 0})->made();
  const bool has_stage = file.osd->DictGet("zero_stage") != nullptr;
  if (has_stage != (kind_ == state::OptimizerKind::kZero)) {
    return FileError(file.path, absl::StatusCode::kInvalidArgument,
                     absl::StrCat("optimizer state layout differs from ", first.path));
  }
  if (!file.fp32.empty()) {
    const std::vector<std::string> have = file.StateNames(0);
    if (!internal::SameStateNames(have, state_keys_)) {
      return FileError(file.path, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("optimizer states [", absl::StrJoin(have, ", "), "] differ from [",
                                    absl::StrJoin(state_keys_, ", "), "] in ", first.path));
    }
  }
  // Every shard was saved at the same step: the optimizer's step count of
  // each group and the DeepSpeed version agree with zero_pp_rank_0_mp_rank_00.
  if (&file != &first) {
    for (size_t g = 0; g < file.scalars.size() && g < first.scalars.size(); ++g) {
      for (const auto& [key, v] : file.scalars[g]) {
        for (const auto& [key0, v0] : first.scalars[g]) {
          if (key != key0) continue;
          const std::string a = ScalarText(*file.file, *v), b = ScalarText(*first.file, *v0);
          if (a != b) {
            return FileError(file.path, absl::StatusCode::kInvalidArgument,
                             absl::StrCat("optimizer state '", key, "' of group ", g, " is ", a, " but ", b, " in ",
                                          first.path, ": the shards were saved at different steps"));
          }
        }
      }
    }
  }
  const Value* ver = file.file->root()->DictGet("ds_version");
  const Value* ver0 = ms_->file(0, 0).root()->DictGet("ds_version");
  if (ver != nullptr && ver0 != nullptr && ver->is(Kind::kStr) && ver0->is(Kind::kStr) && ver->str() != ver0->str()) {
    return FileError(file.path, absl::StatusCode::kInvalidArgument,
                     absl::StrCat("ds_version is '", ver->str(), "' but '", ver0->str(), "' in ",
                                  ms_->path(0, 0), ": files from different saves"));
  }
  return absl::OkStatus();
}

std::optional<std::tuple<int, int, int>> ZeroCheckpoint::OptimKeyOf(const std::string& path) const {
  auto parsed = deepspeed::ParseCheckpointFileName(Basename(path));
  if (!parsed || parsed->type != deepspeed::CheckpointFileName::Type::kOptim || Dirname(path) != dir_) {
    return std::nullopt;
  }
  const int mp_rank = ulysses_sp_ > 1 ? 0 : parsed->mp_rank;  // 0.19.5 Ulysses: mp_rank_{d % sp}, one stage
  return std::make_tuple(mp_rank / topo_.tp, mp_rank % topo_.tp, parsed->dp_rank);
}

absl::Status ZeroCheckpoint::VerifyFile(const std::string& path) const {
  auto parsed = deepspeed::ParseCheckpointFileName(Basename(path));
  if (!parsed || Dirname(path) != dir_) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a file of the checkpoint ", dir_));
  }
  switch (parsed->type) {
    case deepspeed::CheckpointFileName::Type::kOptim: {
      const auto [pp, tp, dp] = *OptimKeyOf(path);
      UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(pp, tp, dp));
      return f->VerifyPartitions();
    }
    case deepspeed::CheckpointFileName::Type::kLayer:
      // Its structure (opened at Open); the lp weights of trainable params
      // are the fp32 masters cast, and are not read for them.
      return LayerFile(parsed->layer, parsed->tp_rank).status();
    default:
      return absl::OkStatus();
  }
}

absl::StatusOr<const torch::TorchFile*> ZeroCheckpoint::LayerFile(int layer, int tp) const {
  auto it = layer_slots_.find({layer, tp});
  if (it == layer_slots_.end()) {
    return absl::NotFoundError(absl::StrCat(JoinPath(dir_, deepspeed::LayerFileName(layer, tp)), ": missing"));
  }
  // Layer files hold the lp weights, which the fp32 masters in the
  // optimizer files determine: their records are verified only when a
  // tensor is used (ModuleTensor), so that a conversion never reads the
  // bytes it ignores.
  return it->second->Get(
      [&] { return torch::TorchFile::Open(layer_paths_.at({layer, tp}), read_.Files(/*verify_crc=*/false)); });
}

absl::StatusOr<std::vector<torch::Tensor>> ZeroCheckpoint::SlicePieces(const ZeroParam& param, int pp, int tp,
                                                                       const std::string& state) const {
  auto sit = std::find(param.stages.begin(), param.stages.end(), pp);
  if (sit == param.stages.end()) {
    return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "' is not in pipeline stage ", pp));
  }
  const int index = param.index_in_group[sit - param.stages.begin()];
  const deepspeed::ZeroGroupLayout& layout = layouts_[pp][tp][param.group];
  std::vector<torch::Tensor> pieces;
  for (const auto& [rank, frag] : layout.FragmentsOfParam(index)) {
    UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(pp, tp, rank));
    const torch::Tensor* flat = f->Flat(param.group, state);  // "fp32": the partition
    const std::string tensor_name = FlatTensorName(param.group, state);
    if (flat == nullptr) {
      return absl::NotFoundError(absl::StrCat(f->path, ": group ", param.group, " has no optimizer state '", state,
                                              "'"));
    }
    UCP_RETURN_IF_ERROR(f->VerifyPartitionIfChecked(*flat, checked_inputs_, tensor_name));
    UCP_ASSIGN_OR_RETURN(torch::Tensor piece, flat->Narrow(0, frag.partition_offset, frag.numel),
                         _.Prepend(absl::StrCat(f->path, ": param '", param.name, "' ", state, ": ")));
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

absl::StatusOr<pickle::ValuePtr> ZeroCheckpoint::GroupScalar(int pp, int tp, int dp, int group,
                                                             const std::string& key) const {
  UCP_ASSIGN_OR_RETURN(const OptimFile* f, Optim(pp, tp, dp));
  for (const auto& [k, v] : f->scalars[group]) {
    if (k == key) return v;
  }
  return pickle::ValuePtr();
}

absl::StatusOr<torch::Tensor> ZeroCheckpoint::ModuleTensor(const ModuleEntry& entry, int tp) const {
  if (entry.layer >= 0) {
    UCP_ASSIGN_OR_RETURN(const torch::TorchFile* f, LayerFile(entry.layer, tp));
    const Value* v = f->root()->DictGet(entry.local_name);
    if (v == nullptr) return absl::NotFoundError(absl::StrCat(f->path(), ": no '", entry.local_name, "'"));
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(*v));
    UCP_RETURN_IF_ERROR(f->VerifyStorageCrc(*t.storage()));
    return t;
  }
  const torch::TorchFile& f = MpRankFile(0, tp);
  const Value* m = f.root()->DictGet("module");
  const Value* v = m != nullptr && m->is(Kind::kDict) ? m->DictGet(entry.name) : nullptr;
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(f.path(), ": module has no '", entry.name, "'"));
  return f.GetTensor(*v);
}

std::string FlatTensorName(int group, const std::string& state) {
  return state == "fp32" ? absl::StrCat("single_partition_of_fp32_groups[", group, "]")
                         : absl::StrCat("base_optimizer_state.state[", group, "].", state);
}

std::optional<state::FileExtent> ZeroCheckpoint::OpenedExtent(const state::InputRange& range) const {
  // Whole files (the units that verify unread inputs list them) are not
  // read whole by VerifyFile (a layer file's records are read only when a
  // tensor is): nothing to say about them.
  if (range.tensor.empty()) return std::nullopt;
  const std::optional<std::tuple<int, int, int>> key = OptimKeyOf(range.path);
  if (!key) return std::nullopt;
  auto slot = optim_slots_.find(*key);
  if (slot == optim_slots_.end()) return std::nullopt;
  const OptimFile* f = slot->second->IfMade();
  if (f == nullptr) return std::nullopt;
  for (int g = 0; g < num_groups_; ++g) {
    const torch::Tensor* flat = nullptr;
    if (range.tensor == FlatTensorName(g, "fp32")) flat = f->Flat(g, "fp32");
    for (const std::string& state : state_keys_) {
      if (range.tensor == FlatTensorName(g, state)) flat = f->Flat(g, state);
    }
    if (flat == nullptr) continue;
    std::string path;
    uint64_t at = 0;
    const int64_t length = range.length < 0 ? static_cast<int64_t>(flat->nbytes()) - range.offset : range.length;
    if (!flat->is_contiguous() || range.offset < 0 || length < 0 ||
        static_cast<uint64_t>(range.offset + length) > flat->nbytes() ||
        !torch::MappedFile::Locate(flat->data(), flat->nbytes(), &path, &at)) {
      return std::nullopt;
    }
    return state::FileExtent{path, static_cast<int64_t>(at) + range.offset, length};
  }
  return std::nullopt;
}

}  // namespace ucp::deepspeed_zero
