#include "deepspeed/model_states_files.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/strip.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/value_util.h"
#include "format/pickle/accessors.h"

namespace ucp::deepspeed {

namespace {

using internal::DictPath;
using internal::FileError;
using internal::ForEachSliceMapping;
using internal::Numel;
using internal::SequenceParallelSize;
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




// The names of each param group (OrderedDict name -> torch.Size) with shapes.
struct FileGroupShapes {
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> groups;
};

absl::StatusOr<FileGroupShapes> ReadParamShapes(const torch::TorchFile& f) {
  const Value& root = *f.root();
  UCP_ASSIGN_OR_RETURN(const Value* shapes, GetField(root, "param_shapes", "model states"),
                       _.Prepend(absl::StrCat(f.path(), ": ")));
  if (shapes->is_none()) {
    return FileError(f.path(), absl::StatusCode::kFailedPrecondition,
                     "param_shapes is None: the checkpoint was not saved by a ZeRO or bf16 optimizer");
  }
  UCP_ASSIGN_OR_RETURN(auto* list, AsSequence(*shapes, "param_shapes"), _.Prepend(absl::StrCat(f.path(), ": ")));
  FileGroupShapes out;
  for (size_t g = 0; g < list->size(); ++g) {
    const Value& d = *(*list)[g];
    if (!d.is(Kind::kDict)) {
      return FileError(f.path(), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("param_shapes[", g, "] is a ", pickle::KindName(d.kind()), ", expected a dict"));
    }
    std::vector<std::pair<std::string, std::vector<int64_t>>> group;
    int64_t group_numel = 0;
    for (const auto& [k, v] : d.dict_items()) {
      if (!k->is(Kind::kStr)) {
        return FileError(f.path(), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("param_shapes[", g, "] has a non-string key ", k->DebugString()));
      }
      UCP_ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                           AsTorchSize(*v, absl::StrCat("param_shapes[", g, "]['", k->str(), "']")),
                           _.Prepend(absl::StrCat(f.path(), ": ")));
      UCP_ASSIGN_OR_RETURN(int64_t numel,
                           internal::CheckedShapeNumel(shape, f.path(),
                                                       absl::StrCat("param_shapes[", g, "]['", k->str(), "']")));
      if (__builtin_add_overflow(group_numel, numel, &group_numel) || group_numel > internal::kMaxShapeNumel) {
        return FileError(f.path(), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("param_shapes[", g, "] adds up to more than 2^50 elements at '", k->str(), "'"));
      }
      group.emplace_back(k->str(), std::move(shape));
    }
    out.groups.push_back(std::move(group));
  }
  return out;
}

// A PipelineModule's mp_rank file saved in bf16 without ZeRO (stage 0):
// engine.py gives a bf16 PipelineEngine the BF16_Optimizer, which writes the
// bf16_zero_pp_rank_* files, while param_shapes stays None (written only when
// zero_optimization() is on). Each group's names come from the optimizer
// files' param_slice_mappings (every dp rank's, in partition order, a name
// split over two partitions once), their shapes from the layer files of tp
// rank mp_rank % layer_files_tp (names are "<layer>.<key>"; a tied module's
// "tied_modules.<key>.*" names no layer and is refused).
absl::StatusOr<FileGroupShapes> ShapesFromSliceMappings(const std::string& dir, int mp_rank, int layer_files_tp,
                                                        const ReadOptions& read, const absl::Status& none) {
  if (layer_files_tp <= 0 || !PathExists(JoinPath(dir, OptimFileName(0, mp_rank, true)))) return none;
  const int tp_rank = mp_rank % layer_files_tp;
  FileGroupShapes out;
  std::vector<std::set<std::string>> seen;
  for (int d = 0;; ++d) {
    const std::string path = JoinPath(dir, OptimFileName(d, mp_rank, true));
    if (!PathExists(path)) break;
    UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path, read.Files()));
    const Value* osd = f->root()->DictGet("optimizer_state_dict");
    const Value* maps = osd != nullptr && osd->is(Kind::kDict) ? osd->DictGet("param_slice_mappings") : nullptr;
    if (maps == nullptr || !maps->is(Kind::kList)) {
      return FileError(path, absl::StatusCode::kFailedPrecondition,
                       "param_shapes of the model states is None and this file has no param_slice_mappings list to "
                       "name the params by");
    }
    if (out.groups.size() < maps->size()) {
      out.groups.resize(maps->size());
      seen.resize(maps->size());
    }
    for (size_t g = 0; g < maps->size(); ++g) {
      UCP_RETURN_IF_ERROR(ForEachSliceMapping(path, *maps->items()[g], g, [&](const std::string& name, const Value&) -> absl::Status {
        if (seen[g].insert(name).second) out.groups[g].emplace_back(name, std::vector<int64_t>{});
        return absl::OkStatus();
      }));
    }
  }
  std::map<int, std::unique_ptr<torch::TorchFile>> layers;
  for (auto& group : out.groups) {
    for (auto& [name, shape] : group) {
      const int layer = LayerOfName(name);
      if (layer < 0) {
        return FileError(JoinPath(dir, MpRankFileName(mp_rank)), absl::StatusCode::kUnimplemented,
                         absl::StrCat("param_shapes is None (a bf16 pipeline saved without ZeRO) and param '", name,
                                      "' names no layer file (a tied module): its shape cannot be read"));
      }
      if (!layers.count(layer)) {
        UCP_ASSIGN_OR_RETURN(layers[layer], torch::TorchFile::Open(JoinPath(dir, LayerFileName(layer, tp_rank)), read.Files()));
      }
      const torch::TorchFile& lf = *layers[layer];
      const Value* t = lf.root()->DictGet(name.substr(name.find('.') + 1));
      if (t == nullptr || !torch::TorchFile::IsTensor(*t)) {
        return FileError(lf.path(), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("no tensor '", name.substr(name.find('.') + 1), "' for param '", name,
                                      "' of the optimizer's param_slice_mappings"));
      }
      UCP_ASSIGN_OR_RETURN(torch::Tensor tensor, lf.GetTensor(*t));
      shape = tensor.sizes();
    }
  }
  return out;
}

// The names of a file's param groups, in order, flattened (all tp ranks of a
// pipeline stage hold the same names).
std::vector<std::string> ParamNames(const FileGroupShapes& shapes) {
  std::vector<std::string> n;
  for (const auto& g : shapes.groups) {
    for (const auto& [name, shape] : g) n.push_back(name);
  }
  return n;
}

// How many mp_rank_XX_model_states.pt files `dir` holds: ranks 0..mp-1, all
// present. A folder without any is refused, by name when it is DeepSpeed's
// ZeRO-3 universal layout (which ucp does not read).
absl::StatusOr<int> CountMpRankFiles(const std::string& dir, const ReadOptions& read) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  std::set<int> mp_ranks;
  for (const auto& n : names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kMpRank) mp_ranks.insert(parsed->mp_rank);
  }
  if (mp_ranks.empty()) {
    for (const auto& n : names) {
      auto parsed = deepspeed::ParseCheckpointFileName(n);
      if (!parsed || parsed->type != deepspeed::CheckpointFileName::Type::kZero3Model) continue;
      // DeepSpeed's ZeRO-3 universal layout (ds_to_universal.py copies the
      // zero_pp_rank_* model states beside zero/).
      std::string version = "(no ds_version)";
      if (auto f = torch::TorchFile::Open(JoinPath(dir, n), read.Files()); f.ok()) {
        const Value* v = (*f)->root()->is(Kind::kDict) ? (*f)->root()->DictGet("ds_version") : nullptr;
        if (v != nullptr && v->is(Kind::kStr)) version = v->str();
      }
      return absl::UnimplementedError(absl::StrCat(
          dir, ": a DeepSpeed ", version, " ZeRO stage 3 universal checkpoint (", n,
          " beside zero/): the stage-3 universal layout, read as a ZeRO-3 source (formats/deepspeed_zero3), "
          "not as a stage 1/2 universal folder"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": unrecognized checkpoint layout: expected mp_rank_XX_model_states.pt files, found ",
        names.empty() ? "an empty folder" : absl::StrCat(names.size(), " other entries, e.g. '", names.front(), "'")));
  }
  const int mp = *mp_ranks.rbegin() + 1;
  for (int r = 0; r < mp; ++r) {
    if (!mp_ranks.count(r)) {
      return absl::NotFoundError(absl::StrCat(JoinPath(dir, deepspeed::MpRankFileName(r)), ": missing (mp ranks ",
                                              absl::StrJoin(mp_ranks, ","), " are present)"));
    }
  }
  return mp;
}

using ModelStateFileList = std::vector<std::unique_ptr<torch::TorchFile>>;

// The files' mp_world_size and dp_world_size, as mp_rank_00 records them.
struct WorldSizes {
  int64_t mp_world = 0, dp_world = 0;
};

// Reads the world sizes from mp_rank_00 (a dict of model states) and checks
// that every file records the same and that mp_world_size is the number of
// files.
absl::StatusOr<WorldSizes> ReadWorldSizes(const ModelStateFileList& files) {
  const int mp = static_cast<int>(files.size());
  const torch::TorchFile& mp0 = *files[0];
  const Value& root0 = *mp0.root();
  if (!root0.is(Kind::kDict)) {
    return FileError(mp0.path(), absl::StatusCode::kInvalidArgument,
                     absl::StrCat("expected a dict of model states, found ", root0.DebugString(60)));
  }
  WorldSizes w;
  {
    UCP_ASSIGN_OR_RETURN(const Value* v, GetField(root0, "mp_world_size", "model states"),
                         _.Prepend(mp0.path() + ": "));
    UCP_ASSIGN_OR_RETURN(w.mp_world, AsInt(*v, "mp_world_size"), _.Prepend(mp0.path() + ": "));
    UCP_ASSIGN_OR_RETURN(const Value* d, GetField(root0, "dp_world_size", "model states"),
                         _.Prepend(mp0.path() + ": "));
    UCP_ASSIGN_OR_RETURN(w.dp_world, AsInt(*d, "dp_world_size"), _.Prepend(mp0.path() + ": "));
  }
  if (w.mp_world != mp) {
    return FileError(mp0.path(), absl::StatusCode::kInvalidArgument,
                     absl::StrCat("mp_world_size is ", w.mp_world, " but the folder has ", mp,
                                  " mp_rank_*_model_states.pt files"));
  }
  for (int r = 1; r < mp; ++r) {
    const Value& root = *files[r]->root();
    const Value* m = root.is(Kind::kDict) ? root.DictGet("mp_world_size") : nullptr;
    const Value* d = root.is(Kind::kDict) ? root.DictGet("dp_world_size") : nullptr;
    if (m == nullptr || !m->is(Kind::kInt) || m->int_value() != w.mp_world || d == nullptr || !d->is(Kind::kInt) ||
        d->int_value() != w.dp_world) {
      return FileError(files[r]->path(), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("expected mp_world_size ", w.mp_world, " and dp_world_size ", w.dp_world,
                                    " as in ", deepspeed::MpRankFileName(0), ", found ", m ? m->DebugString() : "none", " and ",
                                    d ? d->DebugString() : "none"));
    }
  }
  return w;
}

// Checks that the files were saved together: the step counters and the
// DeepSpeed version agree with mp_rank_00's where both record them.
absl::Status CheckSavedTogether(const ModelStateFileList& files) {
  const torch::TorchFile& mp0 = *files[0];
  const Value& root0 = *mp0.root();
  for (size_t r = 1; r < files.size(); ++r) {
    const Value& root = *files[r]->root();
    for (const char* key : {"ds_version", "global_steps", "global_samples", "iteration", "skipped_steps"}) {
      const Value* a = root0.DictGet(key);
      const Value* b = root.DictGet(key);
      if (a == nullptr || b == nullptr) continue;
      if (!pickle::DeepEqual(*a, *b)) {
        return FileError(files[r]->path(), absl::StatusCode::kInvalidArgument,
                         absl::StrCat(key, " is ", b->DebugString(60), " but ", a->DebugString(60), " in ",
                                      mp0.path(), ": files from different saves"));
      }
    }
  }
  return absl::OkStatus();
}

// Under Ulysses sequence parallelism (ds_config sequence_parallel_size sp > 1,
// the mpu DeepSpeed's parallel_state_sp, which aliases model parallelism to
// sequence parallelism) DeepSpeed 0.19.5 and master record tp_degree = sp in
// checkpoint_parallel_dimensions (bwc_tensor_model_parallel_world_size asks the
// mpu's get_model_parallel_world_size) beside mp_world_size 1 and one
// mp_rank_00 file: the sp ranks are data-parallel ranks for the checkpoint (ZeRO
// partitions over dp x sp), so tp is 1.
bool IsUlyssesTpDegree(const Value& root, const Value& tpv, const Value& ppv, int mp) {
  const int sp = SequenceParallelSize(root);
  return mp == 1 && sp > 1 && tpv.int_value() == sp && ppv.int_value() == 1;
}

// The tp degree the files record in checkpoint_parallel_dimensions
// ({pp_degree, tp_degree}, DeepSpeed >= 0.19.5), checked to be the same in
// every file and to multiply with pp_degree to the number of files; 0 when
// mp_rank_00 records none.
absl::StatusOr<int> ReadRecordedTp(const ModelStateFileList& files) {
  const int mp = static_cast<int>(files.size());
  int recorded_tp = 0;
  for (int r = 0; r < mp; ++r) {
    const Value& root = *files[r]->root();
    const Value* dims = root.is(Kind::kDict) ? root.DictGet("checkpoint_parallel_dimensions") : nullptr;
    if (dims == nullptr || dims->is_none()) {
      if (r > 0 && recorded_tp > 0) {
        return FileError(files[r]->path(), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("has no checkpoint_parallel_dimensions, which ", deepspeed::MpRankFileName(0),
                                      " records"));
      }
      continue;
    }
    const Value* tpv = dims->is(Kind::kDict) ? dims->DictGet("tp_degree") : nullptr;
    const Value* ppv = dims->is(Kind::kDict) ? dims->DictGet("pp_degree") : nullptr;
    if (tpv != nullptr && ppv != nullptr && tpv->is(Kind::kInt) && ppv->is(Kind::kInt) &&
        IsUlyssesTpDegree(root, *tpv, *ppv, mp)) {
      recorded_tp = 1;
      continue;
    }
    if (tpv == nullptr || ppv == nullptr || !tpv->is(Kind::kInt) || !ppv->is(Kind::kInt) || tpv->int_value() < 1 ||
        ppv->int_value() < 1 || tpv->int_value() * ppv->int_value() != mp) {
      return FileError(files[r]->path(), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("checkpoint_parallel_dimensions is ", dims->DebugString(80),
                                    ", expected {pp_degree, tp_degree} whose product is mp_world_size ", mp));
    }
    if (r == 0) {
      recorded_tp = static_cast<int>(tpv->int_value());
    } else if (recorded_tp != tpv->int_value()) {
      return FileError(files[r]->path(), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("checkpoint_parallel_dimensions tp_degree ", tpv->int_value(), " differs from ",
                                    recorded_tp, " in ", deepspeed::MpRankFileName(0)));
    }
  }
  return recorded_tp;
}

// Decides tp: how many leading mp ranks share mp_rank_00's param names (all
// of them for a plain module, which has one stage), unless the layer files
// show another tp that divides the mp ranks (names can coincide across
// stages without params), unless the files record it (`recorded_tp` > 0).
absl::StatusOr<int> DecideTp(const std::string& dir, const std::vector<FileGroupShapes>& shapes, bool pipeline,
                             int layer_files_tp, int recorded_tp) {
  const int mp = static_cast<int>(shapes.size());
  int tp = 1;
  const auto n0 = ParamNames(shapes[0]);
  while (tp < mp && ParamNames(shapes[tp]) == n0) ++tp;
  if (!pipeline) tp = mp;  // a plain module has one stage
  if (layer_files_tp > 0) {
    const int files_tp = layer_files_tp;
    if (files_tp != tp && mp % files_tp == 0) {
      // Names can coincide across stages without params; layer files decide.
      tp = files_tp;
    }
  }
  if (recorded_tp > 0) tp = recorded_tp;
  if (mp % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", mp, " mp ranks do not split into stages of tp=", tp));
  }
  return tp;
}

// Checks that the tp ranks of each pipeline stage hold the same param names.
absl::Status CheckStageNamesAgree(const ModelStateFileList& files, const std::vector<FileGroupShapes>& shapes,
                                  const state::Topology& topo) {
  const int tp = topo.tp;
  for (int s = 0; s < topo.pp; ++s) {
    for (int t = 1; t < tp; ++t) {
      if (ParamNames(shapes[s * tp + t]) != ParamNames(shapes[s * tp])) {
        return FileError(files[s * tp + t]->path(), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("param_shapes names differ from ", deepspeed::MpRankFileName(s * tp),
                                      " although both are pipeline stage ", s, " (tp=", tp, ")"));
      }
    }
  }
  return absl::OkStatus();
}

// The param names of each pipeline stage's groups ([stage][group] -> names,
// from its tp rank 0), once every file is checked to hold `num_groups` groups.
absl::StatusOr<std::vector<std::vector<std::vector<std::string>>>> ReadStageGroups(
    const ModelStateFileList& files, const std::vector<FileGroupShapes>& shapes, const state::Topology& topo,
    int num_groups) {
  const int tp = topo.tp;
  std::vector<std::vector<std::vector<std::string>>> stage_groups(topo.pp);
  for (int s = 0; s < topo.pp; ++s) {
    for (int t = 0; t < topo.tp; ++t) {
      const FileGroupShapes& gs = shapes[s * tp + t];
      if (static_cast<int>(gs.groups.size()) != num_groups) {
        return FileError(files[s * tp + t]->path(), absl::StatusCode::kInvalidArgument,
                         absl::StrCat("has ", gs.groups.size(), " param groups, ", deepspeed::MpRankFileName(0), " has ",
                                      num_groups));
      }
    }
    for (int g = 0; g < num_groups; ++g) {
      std::vector<std::string> group_names;
      for (const auto& [name, shape] : shapes[s * tp].groups[g]) group_names.push_back(name);
      stage_groups[s].push_back(std::move(group_names));
    }
  }
  return stage_groups;
}

// The params, in stage, group and flatten order, and their index by name.
struct ParamList {
  std::vector<ZeroParam> params;
  absl::flat_hash_map<std::string, size_t> index;  // by name
};

// Collects the params of every stage's groups, each with its tp shapes; a
// tied param (one name in several stages) is one param with several stages,
// and must have the same group and shapes in each.
absl::StatusOr<ParamList> CollectParams(const ModelStateFileList& files, const std::vector<FileGroupShapes>& shapes,
                                        const std::vector<std::vector<std::vector<std::string>>>& stage_groups,
                                        const state::Topology& topo) {
  const int tp = topo.tp;
  ParamList out;
  for (int s = 0; s < topo.pp; ++s) {
    for (int g = 0; g < static_cast<int>(stage_groups[s].size()); ++g) {
      for (size_t i = 0; i < stage_groups[s][g].size(); ++i) {
        const std::string& name = stage_groups[s][g][i];
        std::vector<std::vector<int64_t>> tp_shapes;
        for (int t = 0; t < tp; ++t) tp_shapes.push_back(shapes[s * tp + t].groups[g][i].second);
        auto it = out.index.find(name);
        if (it != out.index.end()) {
          ZeroParam& p = out.params[it->second];
          if (p.stages.back() == s) {
            return FileError(files[s * tp]->path(), absl::StatusCode::kInvalidArgument,
                             absl::StrCat("param '", name, "' appears twice in param_shapes"));
          }
          if (p.group != g || p.tp_shapes != tp_shapes) {
            return FileError(files[s * tp]->path(), absl::StatusCode::kInvalidArgument,
                             absl::StrCat("tied param '", name, "' is in group ", g, " with shape ",
                                          ShapeStr(tp_shapes[0]), " but in group ", p.group, " with shape ",
                                          ShapeStr(p.tp_shapes[0]), " in stage ", p.stages[0]));
          }
          p.stages.push_back(s);
          p.index_in_group.push_back(static_cast<int>(i));
          continue;
        }
        ZeroParam p;
        p.name = name;
        p.group = g;
        p.stages = {s};
        p.index_in_group = {static_cast<int>(i)};
        p.tp_shapes = std::move(tp_shapes);
        p.layer = LayerOfName(name);
        p.tied_key = TiedKeyOfName(name);
        out.index[name] = out.params.size();
        out.params.push_back(std::move(p));
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelStatesFiles>> ModelStatesFiles::Open(const std::string& dir, int layer_files_tp,
                                                                       const ReadOptions& read) {
  std::unique_ptr<ModelStatesFiles> m(new ModelStatesFiles());
  m->dir_ = dir;
  m->read_ = read;
  UCP_RETURN_IF_ERROR(m->Load(layer_files_tp));
  return m;
}

// Loads in phases: count the mp rank files, open them, check their world
// sizes and that they were saved together, read every file's param shapes,
// decide tp (and so pp), check the stages' names and groups, collect the
// params, then read what else mp_rank_00 says.
absl::Status ModelStatesFiles::Load(int layer_files_tp) {
  UCP_ASSIGN_OR_RETURN(const int mp, CountMpRankFiles(dir_, read_));
  // Model states. Their tensors' records (the module's weights, often the
  // largest file but one) are checked by a command that writes beside its
  // units (torch::OwedCrcChecks), else here.
  const torch::OpenOptions files = read_.ModelStates();
  for (int r = 0; r < mp; ++r) {
    UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(JoinPath(dir_, deepspeed::MpRankFileName(r)), files));
    files_.push_back(std::move(f));
  }
  UCP_ASSIGN_OR_RETURN(const WorldSizes world, ReadWorldSizes(files_));
  UCP_RETURN_IF_ERROR(CheckSavedTogether(files_));
  const torch::TorchFile& mp0 = *files_[0];
  const Value& root0 = *mp0.root();
  const Value* module0 = root0.DictGet("module");
  pipeline_ = module0 == nullptr || module0->is_none();

  // Param shapes of every mp rank, and tp from which ranks share names.
  std::vector<FileGroupShapes> shapes;
  for (int r = 0; r < mp; ++r) {
    absl::StatusOr<FileGroupShapes> s = ReadParamShapes(*files_[r]);
    if (!s.ok() && s.status().code() == absl::StatusCode::kFailedPrecondition) {
      s = ShapesFromSliceMappings(dir_, r, layer_files_tp, read_, s.status());
    }
    if (!s.ok()) return s.status();
    shapes.push_back(*std::move(s));
  }
  UCP_ASSIGN_OR_RETURN(recorded_tp_, ReadRecordedTp(files_));
  UCP_ASSIGN_OR_RETURN(const int tp, DecideTp(dir_, shapes, pipeline_, layer_files_tp, recorded_tp_));
  topo_.tp = tp;
  topo_.pp = mp / tp;
  topo_.dp = static_cast<int>(world.dp_world);
  if (topo_.dp < 1) {
    return FileError(mp0.path(), absl::StatusCode::kInvalidArgument,
                     absl::StrCat("dp_world_size is ", world.dp_world, ", expected >= 1"));
  }
  UCP_RETURN_IF_ERROR(CheckStageNamesAgree(files_, shapes, topo_));
  // Groups.
  num_groups_ = static_cast<int>(shapes[0].groups.size());
  UCP_ASSIGN_OR_RETURN(stage_groups_, ReadStageGroups(files_, shapes, topo_, num_groups_));
  shapes_.clear();
  for (const auto& fs : shapes) shapes_.push_back(fs.groups);
  // Params, with tied ones merged across stages.
  UCP_ASSIGN_OR_RETURN(ParamList params, CollectParams(files_, shapes, stage_groups_, topo_));
  params_ = std::move(params.params);
  param_index_ = std::move(params.index);

  // What else the files say.
  for (const auto& f : files_) {
    for (const auto& b : StringList(f->root()->DictGet("buffer_names"))) buffer_names_.insert(b);
  }
  empty_dict_ = Value::MakeDict();
  uc_info_ = empty_dict_.get();
  if (const Value* uc = root0.DictGet("universal_checkpoint_info"); uc != nullptr && uc->is(Kind::kDict)) {
    uc_info_ = uc;
  }
  if (const Value* a = root0.DictGet("args"); a != nullptr) {
    if (a->is(Kind::kDict)) {
      args_ = a;
    } else if (auto ns = pickle::AsNamespace(*a, "args"); ns.ok()) {
      args_ = *ns;
    }
  }
  if (const Value* a = DictPath(&root0, {"ds_config", "tensor_parallel", "autotp_size"});
      a != nullptr && a->is(Kind::kInt)) {
    autotp_size_ = a->int_value();
  }
  const Value* bf16 = DictPath(&root0, {"ds_config", "bf16", "enabled"});
  const Value* fp16 = DictPath(&root0, {"ds_config", "fp16", "enabled"});
  config_lp_dtype_ = Truthy(bf16) ? torch::DType::kBFloat16
                     : Truthy(fp16) ? torch::DType::kFloat16
                                    : torch::DType::kFloat32;
  return absl::OkStatus();
}

int64_t ModelStatesFiles::ArgInt(std::initializer_list<const char*> keys) const {
  if (args_ == nullptr || !args_->is(Kind::kDict)) return 0;
  for (const char* k : keys) {
    const Value* v = args_->DictGet(k);
    if (v != nullptr && v->is(Kind::kInt) && v->fits_int64()) return v->int_value();
  }
  return 0;
}

std::string ModelStatesFiles::ArgString(std::initializer_list<const char*> keys) const {
  if (args_ == nullptr || !args_->is(Kind::kDict)) return "";
  for (const char* k : keys) {
    const Value* v = args_->DictGet(k);
    if (v != nullptr && v->is(Kind::kStr)) return v->str();
  }
  return "";
}

bool ModelStatesFiles::ArgBool(const char* key) const { return Truthy(args_ != nullptr && args_->is(Kind::kDict) ? args_->DictGet(key) : nullptr); }

std::string ModelStatesFiles::path(int pp, int tp) const {
  return JoinPath(dir_, deepspeed::MpRankFileName(topo_.mp_rank(pp, tp)));
}

const ZeroParam* ModelStatesFiles::FindParam(const std::string& name) const {
  auto it = param_index_.find(name);
  return it == param_index_.end() ? nullptr : &params_[it->second];
}

std::vector<std::string> ModelStatesFiles::file_names() const {
  std::vector<std::string> out;
  for (int r = 0; r < topo_.mp_world_size(); ++r) out.push_back(deepspeed::MpRankFileName(r));
  return out;
}

int LayerOfName(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos || dot == 0) return -1;
  int layer = -1;
  if (!absl::SimpleAtoi(absl::string_view(name).substr(0, dot), &layer)) return -1;
  return layer;
}

std::string TiedKeyOfName(const std::string& name) {
  absl::string_view s = name;
  if (!absl::ConsumePrefix(&s, "tied_modules.")) return "";
  const size_t dot = s.find('.');
  if (dot == std::string::npos) return "";
  return std::string(s.substr(0, dot));
}

}  // namespace ucp::deepspeed
