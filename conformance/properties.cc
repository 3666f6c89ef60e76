#include "conformance/properties.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "conformance/spec_rules.h"
#include "ops/convert.h"
#include "deepspeed/checkpoint_files.h"
#include "ops/training_state.h"
#include "testing/compare.h"
#include "deepspeed/tree_copy.h"
#include "formats/deepspeed_universal/universal_checkpoint.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "format/pickle/accessors.h"
#include "format/torch/torch_file.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "ops/reshard.h"
#include "ops/export.h"
#include "format/safetensors/safetensors.h"
#include "rapidcheck.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr char kTag[] = "global_step";

absl::Status Violation(Property p, const std::string& what) {
  return absl::InternalError(absl::StrCat("property (", PropertyLetter(p), ") ", PropertyName(p), ": ", what));
}

std::string Joined(const std::vector<std::string>& v, size_t max = 12) {
  std::vector<std::string> head(v.begin(), v.begin() + std::min(v.size(), max));
  std::string out = absl::StrJoin(head, "\n  ");
  if (v.size() > max) absl::StrAppend(&out, "\n  ... (", v.size() - max, " more)");
  return out;
}

// A case's scratch folders, removed when done.
class Scratch {
 public:
  explicit Scratch(std::string dir) : dir_(std::move(dir)) {
    (void)RemoveTree(dir_);
    (void)MakeDirs(dir_);
  }
  ~Scratch() { (void)RemoveTree(dir_); }
  std::string Path(const std::string& rel) const { return JoinPath(dir_, rel); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// The pieces every property needs: the model, and ucp's operations on it
// with the options a user would give for such a model.
class CaseRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CaseRunner>> Make(const GoldenCase& c, const std::string& dir) {
    std::unique_ptr<CaseRunner> r(new CaseRunner());
    r->case_ = c;
    r->dir_ = dir;
    UCP_ASSIGN_OR_RETURN(r->model_, SyntheticModelState::FromCase(c));
    UCP_ASSIGN_OR_RETURN(r->zero_options_, ZeroSourceOptionsFor(c.model(), dir));
    return r;
  }
  const SyntheticModelState& model() const { return *model_; }
  const GoldenCase& c() const { return case_; }
  std::string TagOf(const std::string& root) const { return JoinPath(root, absl::StrCat(kTag, model_->Step(0))); }

  // save(M, T) into <work>/<root>/<tag>; returns the tag folder. Each step
  // is memoized by its output name, so properties checked on the same case
  // share it (names must say what the folder holds).
  // The DeepSpeed version the source is saved as (V1) and the one the
  // target is written for (V2).
  std::string V1() const { return case_.ds_version().empty() ? "0.14.4" : case_.ds_version(); }
  std::string V2() const { return case_.target_ds_version().empty() ? V1() : case_.target_ds_version(); }

  // `target_version`: --target_ds_version ("" = none, the source's);
  // `stage`: the ZeRO stage (0 writes deepspeed_zero0), -1 = the model's.
  absl::StatusOr<std::string> Save(const std::string& root, const Topology& t, const std::string& target_version = "",
                                   int stage = -1) {
    if (auto it = done_.find(root); it != done_.end()) return it->second;
    const std::string out = TagOf(JoinPath(dir_, root));
    writers::ZeroWriteOptions o;
    o.target = state::Topology::FromProto(t);
    o.num_threads = 1;
    o.layer_type_name = ModelLayerTypeNamer(model_->info());
    o.target_ds_version = target_version;
    o.zero_stage = std::max(stage, 0);
    UCP_RETURN_IF_ERROR(ops::WriteTrainingState(*model_, out, o, stage == 0 ? "deepspeed_zero0" : "").status());
    return done_[root] = out;
  }
  // The stages a case names (-1: none, the model's own and the source's).
  int T1Stage() const { return case_.has_source_zero_stage() ? case_.source_zero_stage() : -1; }
  int T2Stage() const { return case_.has_target_zero_stage() ? case_.target_zero_stage() : -1; }
  absl::StatusOr<std::string> SaveT1() { return Save("zero_t1", case_.source(), "", T1Stage()); }
  absl::StatusOr<std::string> Convert(const std::string& zero, const std::string& root,
                                      const std::string& target_version = "") {
    if (auto it = done_.find(root); it != done_.end()) return it->second;
    ops::ConvertOptions o;
    o.input_folder = zero;
    o.output_folder = TagOf(JoinPath(dir_, root)) + "_universal";
    o.state = zero_options_;
    o.write.num_threads = 1;
    o.write.target_ds_version = target_version;
    UCP_RETURN_IF_ERROR(ops::Convert(o).status());
    return done_[root] = o.output_folder;
  }
  // `stage`: the target's ZeRO stage, kT2Stage = the case's T2 stage.
  static constexpr int kT2Stage = -2;
  absl::StatusOr<std::string> Reshard(const std::string& input, const std::string& root, const Topology& t,
                                      const std::string& target_version = "", int stage = kT2Stage) {
    if (auto it = done_.find(root); it != done_.end()) return it->second;
    if (stage == kT2Stage) stage = T2Stage();
    ops::ReshardOptions o;
    o.input_folder = input;
    o.output_folder = TagOf(JoinPath(dir_, root));
    o.write.target = state::Topology::FromProto(t);
    o.write.num_threads = 1;
    o.write.target_ds_version = target_version;
    o.write.zero_stage = std::max(stage, 0);
    if (stage == 0) o.format = "deepspeed_zero0";
    // Half the cases write their optimizer files in pieces of 4-16 KiB
    // (formats/deepspeed_zero/zero_writer.h piece_bytes), which must not change a byte.
    o.write.piece_bytes = case_.seed() % 2 == 0 ? -1 : int64_t{4096} * static_cast<int64_t>(1 + case_.seed() / 2 % 4);
    o.zero_source = zero_options_;
    UCP_RETURN_IF_ERROR(ops::Reshard(o).status());
    return done_[root] = o.output_folder;
  }
  const ops::SourceOptions& zero_options() const { return zero_options_; }
  // save(M, T2) for V2; convert(save(M, T1)) for V2.
  absl::StatusOr<std::string> SaveT2() { return Save("zero_t2", case_.target(), V2(), T2Stage()); }
  absl::StatusOr<std::string> ConvertT1() {
    UCP_ASSIGN_OR_RETURN(std::string zero1, SaveT1());
    return Convert(zero1, "universal_t1", V2());
  }

 private:
  CaseRunner() = default;
  GoldenCase case_;
  std::string dir_;
  std::unique_ptr<SyntheticModelState> model_;
  ops::SourceOptions zero_options_;
  std::map<std::string, std::string> done_;
};

// A dict without some keys (same values), for comparisons that skip them.
ValuePtr Without(const Value& dict, const std::vector<std::string>& keys) {
  ValuePtr out = Value::MakeDict(dict.ordered_dict());
  for (const auto& [k, v] : dict.dict_items()) {
    if (k->is(Kind::kStr) && std::find(keys.begin(), keys.end(), k->str()) != keys.end()) continue;
    out->DictSet(k, v);
  }
  return out;
}

// group_paddings and partition_count describe the source's dp layout, and
// ds_version the DeepSpeed that saved the source.
const std::vector<std::string> kSourceLayoutKeys = {"group_paddings", "partition_count", "ds_version"};

bool SameRule(const MergeRule& got, const MergeRule& want) {
  const MergeKind w = want.kind() == AVERAGE ? REPLICATED : want.kind();  // no metadata for either
  if (got.kind() != w) return false;
  if (w != SUB_PARAMS) return true;
  if (want.sub_param_shape().dim_size() > 0) {
    return google::protobuf::util::MessageDifferencer::Equals(got.sub_param_shape(), want.sub_param_shape());
  }
  return got.num_sub_params() == want.num_sub_params() && got.cat_dim() == want.cat_dim();
}

// The rule a checkpoint of DeepSpeed `version` holds a param in: AutoTP
// training before 0.19.5 (0.16.4 - 0.18.9) keeps the lm_head whole on every
// tp rank (replace_module.py set_lm_head returns in training mode) where
// 0.19.5 and later cut its vocabulary rows.
MergeRule RuleSavedBy(bool autotp, const std::string& name, const MergeRule& rule, const std::string& version) {
  if (!autotp || name != "lm_head.weight" || (rule.kind() != VOCAB && rule.kind() != COLUMN)) return rule;
  int a = 0, b = 0, c = 0;
  (void)sscanf(version.c_str(), "%d.%d.%d", &a, &b, &c);
  const auto v = std::make_tuple(a, b, c);
  if (v < std::make_tuple(0, 16, 4) || v >= std::make_tuple(0, 19, 5)) return rule;
  MergeRule whole = rule;
  whole.set_kind(REPLICATED);
  whole.clear_original_vocab_size();
  return whole;
}

// The universal checkpoint `dir` holds M's tensors, steps and optimizer state.
// `ds_version`: the source's, which the universal optimizer state keeps.
// `other_stage`: the source was saved at a ZeRO stage other than the
// model's own (its optimizer state's zero_stage and group `params` are the
// source's: WithoutSourceLayout).
ValuePtr WithoutSourceLayout(const Value& root, bool stages_differ);
absl::StatusOr<std::vector<std::string>> UniversalVsModel(const std::string& dir, const SyntheticModelState& m,
                                                          const std::string& ds_version, bool other_stage = false) {
  std::vector<std::string> diffs;
  UCP_ASSIGN_OR_RETURN(auto u, deepspeed_universal::UniversalCheckpoint::Open(dir));
  int trainable = 0, module = 0;
  std::map<std::string, const Manifest::Param*> recorded;
  if (u->manifest()) {
    for (const auto& p : u->manifest()->param()) recorded[p.name()] = &p;
  } else {
    diffs.push_back("no ucp manifest");
  }
  for (const state::ParamState& p : m.info().params) {
    auto rec = recorded.find(p.name);
    if (rec == recorded.end()) {
      diffs.push_back(absl::StrCat(p.name, ": not in the manifest"));
    } else if (rec->second->kind() != p.rule.kind() ||
               std::vector<int64_t>(rec->second->shape().begin(), rec->second->shape().end()) != p.full_shape) {
      diffs.push_back(absl::StrCat(p.name, ": manifest says ", tp::MergeKindName(rec->second->kind()), " ",
                                   torch::ShapeString({rec->second->shape().begin(), rec->second->shape().end()}),
                                   ", the model is ", tp::DescribeRule(p.rule), " ", torch::ShapeString(p.full_shape)));
    }
    if (!p.trainable()) {
      ++module;
      auto f = u->ReadModule(p.name);
      if (!f.ok()) {
        diffs.push_back(absl::StrCat(p.name, ": ", f.status().message()));
        continue;
      }
      UCP_ASSIGN_OR_RETURN(torch::Tensor want, m.Tensor(p.name, state::kLpState));
      if (!f->param.BitwiseEqual(want)) {
        diffs.push_back(absl::StrCat("ucp_module/", p.name, ".pt: ", std::string(torch::DTypeName(f->param.dtype())),
                                     torch::ShapeString(f->param.sizes()), " differs from the model's ",
                                     std::string(torch::DTypeName(want.dtype())), torch::ShapeString(want.sizes())));
      }
      continue;
    }
    ++trainable;
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto f = u->ReadState(p.name, state);
      if (!f.ok()) {
        diffs.push_back(absl::StrCat(p.name, "/", state, ": ", f.status().message()));
        continue;
      }
      UCP_ASSIGN_OR_RETURN(torch::Tensor want, m.Tensor(p.name, state));
      if (!f->param.BitwiseEqual(want)) {
        std::string detail;
        if (f->param.sizes() == want.sizes()) {
          auto d = torch::MaxAbsDiff(f->param, want);
          if (d.ok()) detail = absl::StrCat(", max |diff| ", *d);
        }
        diffs.push_back(absl::StrCat("zero/", p.name, "/", state, ".pt: ", torch::ShapeString(f->param.sizes()),
                                     " differs from the model's ", torch::ShapeString(want.sizes()), detail));
      }
      if (!SameRule(f->rule, p.rule)) {
        diffs.push_back(absl::StrCat("zero/", p.name, "/", state, ".pt: metadata says ", tp::DescribeRule(f->rule),
                                     ", the model is ", tp::DescribeRule(p.rule)));
      }
    }
    UCP_ASSIGN_OR_RETURN(auto step, u->ReadStep(p.name));
    if (!step) {
      diffs.push_back(absl::StrCat(p.name, ": no step.pt"));
    } else {
      auto t = step->GetTensor(*step->root());
      if (!t.ok() || t->dim() != 0 || t->dtype() != torch::DType::kFloat32 ||
          *reinterpret_cast<const float*>(t->data()) != static_cast<float>(m.Step(p.group))) {
        diffs.push_back(absl::StrCat("zero/", p.name, "/step.pt: expected the 0-dim float32 step ", m.Step(p.group),
                                     " of group ", p.group));
      }
    }
  }
  if (static_cast<int>(u->param_names().size()) != trainable || static_cast<int>(u->module_names().size()) != module) {
    diffs.push_back(absl::StrCat("universal has ", u->param_names().size(), " params and ", u->module_names().size(),
                                 " module tensors, the model ", trainable, " and ", module));
  }
  UCP_ASSIGN_OR_RETURN(state::FileValue common, m.OptimizerCommon());
  const torch::TorchFile& os = u->optimizer_state();
  const Value* version = os.root()->DictGet("ds_version");
  if (version == nullptr || !version->is(Kind::kStr) || version->str() != ds_version) {
    diffs.push_back(absl::StrCat("zero/optimizer_state.pt: ds_version is not the source's '", ds_version, "'"));
  }
  for (const auto& d : testing::CompareTrees(os, *WithoutSourceLayout(*os.root(), other_stage), *common.file,
                                               *WithoutSourceLayout(*common.value, other_stage))) {
    diffs.push_back(absl::StrCat("zero/optimizer_state.pt: ", d));
  }
  return diffs;
}

// DeepSpeed's stage-3 universal layout (what convert writes for a ZeRO-3
// source): zero/<param>/<state>.pt holds every trainable param's fp32 master
// and Adam states as flat tensors of M's bytes.
absl::StatusOr<std::vector<std::string>> Zero3UniversalVsModel(const std::string& dir, const SyntheticModelState& m) {
  std::vector<std::string> diffs;
  for (const state::ParamState& p : m.info().params) {
    if (!p.trainable()) continue;
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      const std::string rel = absl::StrCat("zero/", p.name, "/", state, ".pt");
      auto f = torch::TorchFile::Open(JoinPath(dir, rel));
      if (!f.ok()) {
        diffs.push_back(absl::StrCat(rel, ": ", f.status().message()));
        continue;
      }
      auto t = (*f)->GetTensor(*(*f)->root());
      UCP_ASSIGN_OR_RETURN(torch::Tensor want, m.Tensor(p.name, state));
      if (!t.ok() || t->sizes() != std::vector<int64_t>{want.numel()} ||
          t->ContiguousBytes() != want.ContiguousBytes()) {
        diffs.push_back(absl::StrCat(rel, ": not the model's ", state, " flattened"));
      }
    }
  }
  return diffs;
}

// Two universal checkpoints of one model converted from different
// topologies: equal but for their source-specific parts.
// A universal optimizer_state.pt's root without the source's layout fields;
// across ZeRO stages also the stage, the loss scaling and each group's
// `params` (one flat param per group at ZeRO 1/2, the param indices of the
// torch optimizer at stage 0).
ValuePtr WithoutSourceLayout(const Value& root, bool stages_differ) {
  std::vector<std::string> keys = kSourceLayoutKeys;
  if (stages_differ) {
    // ... and the loss scaling of the source's optimizer (a bf16 job at
    // stage 0 runs FP16_UnfusedOptimizer, at stage 1 BF16_Optimizer).
    for (const char* k : {"zero_stage", "loss_scaler", "dynamic_loss_scale", "overflow"}) keys.push_back(k);
  }
  ValuePtr out = Without(root, keys);
  const Value* groups = root.DictGet("param_groups");
  if (stages_differ && groups != nullptr && groups->is(Kind::kList)) {
    std::vector<ValuePtr> gs;
    for (const auto& g : groups->items()) gs.push_back(g->is(Kind::kDict) ? Without(*g, {"params"}) : g);
    out->DictSet(Value::Str("param_groups"), Value::List(gs));
  }
  return out;
}

std::tuple<int, int, int> OracleVersion(const std::string& v);

// `rules_differ`: one folder's source declares AutoTP's patterns
// (universal_checkpoint_info, 0.19.5 on) and the other's does not (0.18.9):
// the params' rules come from the checkpoint or from the preset, the same
// kinds with other patterns and origins (and the effective rule lists differ).
void ClearRuleOrigins(Manifest* m) {
  for (auto& p : *m->mutable_param()) {
    p.clear_source();
    p.clear_rule();
    MergeRule& r = *p.mutable_merge_rule();
    r.clear_pattern();
    r.clear_comment();
    r.clear_autotp_widths();
    r.clear_original_vocab_size();  // AutoTP pads none: the full rows either way
  }
  m->clear_rules();
  m->clear_original_vocab_size();  // declared by universal_checkpoint_info only
}

absl::StatusOr<std::vector<std::string>> UniversalDiffs(const std::string& a, const std::string& b,
                                                        bool stages_differ = false, bool rules_differ = false) {
  std::vector<std::string> ignore = {deepspeed::kManifestFile, "zero/optimizer_state.pt"};
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> fa, testing::ListFilesRecursive(a));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> fb, testing::ListFilesRecursive(b));
  for (const auto* files : {&fa, &fb}) {
    for (const auto& f : *files) {
      if (absl::StartsWith(f, "mp_rank_")) ignore.push_back(f);
    }
  }
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> diffs, FolderByteDiffs(a, b, ignore));
  // The optimizer state, but for the source's dp layout.
  UCP_ASSIGN_OR_RETURN(auto oa, torch::TorchFile::Open(JoinPath(a, "zero/optimizer_state.pt")));
  UCP_ASSIGN_OR_RETURN(auto ob, torch::TorchFile::Open(JoinPath(b, "zero/optimizer_state.pt")));
  for (const auto& d : testing::CompareTrees(*oa, *WithoutSourceLayout(*oa->root(), stages_differ), *ob,
                                               *WithoutSourceLayout(*ob->root(), stages_differ))) {
    diffs.push_back(absl::StrCat("zero/optimizer_state.pt: ", d));
  }
  // The manifests, but for the source folder, topology and mp_rank copies.
  Manifest ma, mb;
  for (auto [dir, m] : {std::make_pair(a, &ma), std::make_pair(b, &mb)}) {
    UCP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(JoinPath(dir, deepspeed::kManifestFile)));
    if (!google::protobuf::TextFormat::ParseFromString(text, m)) {
      return absl::DataLossError(absl::StrCat(dir, ": unreadable manifest"));
    }
    m->clear_source_folder();
    m->clear_source_topology();
    // The source tp's sub_param_shard_widths (AutoTP's fused params, format
    // 0.4): recorded as the source holds them, as DeepSpeed's converter
    // copies them.
    for (auto& p : *m->mutable_param()) p.mutable_merge_rule()->mutable_sub_param_shape()->clear_shard_widths();
    for (auto& r : *m->mutable_rules()->mutable_rule()) r.mutable_sub_param_shape()->clear_shard_widths();
    if (rules_differ) ClearRuleOrigins(m);
    if (stages_differ) {  // the source's optimizer (BF16_Optimizer at stage 1, none at stage 0)
      m->clear_zero_stage();
      m->clear_optimizer_layout();
      m->clear_bf16_file_prefix();
    }
    Manifest kept = *m;
    kept.clear_file();
    for (const FileDigest& f : m->file()) {
      if (!absl::StartsWith(f.path(), "mp_rank_") && f.path() != "zero/optimizer_state.pt") *kept.add_file() = f;
    }
    *m = kept;
  }
  std::string report;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&report);
  if (!differ.Compare(ma, mb)) diffs.push_back(absl::StrCat("ucp_manifest.textproto:\n", report));
  return diffs;
}

// --- the properties ---

absl::Status ExportIsTheModel(CaseRunner& r, const std::string& zero, const std::string& name,
                              std::vector<std::string>& diffs);

absl::Status ConvertIsTopologyFree(CaseRunner& r) {
  const Property p = Property::kConvertIsTopologyFree;
  std::string universal[2];
  const Topology topologies[2] = {r.c().source(), r.c().target()};
  // save(M, T1) as V1, converted for V2 (--target_ds_version); save(M, T2)
  // written for V2, converted as it is: the same universal checkpoint.
  // A ZeRO-3 source converts to DeepSpeed's stage-3 universal layout, any
  // other to the ZeRO-1/2 one: where only one end is ZeRO-3, save(M, T2) is
  // written at T1's stage.
  const bool t2_as_t1 = (SourceZeroStage(r.c()) == 3) != (TargetZeroStage(r.c()) == 3);
  for (int i = 0; i < 2; ++i) {
    UCP_ASSIGN_OR_RETURN(std::string zero,
                         i == 0     ? r.SaveT1()
                         : t2_as_t1 ? r.Save("zero_t2_t1_stage", topologies[1], r.V2(), r.T1Stage())
                                    : r.SaveT2(),
                         _.Prepend(absl::StrCat("save at T", i + 1, ": ")));
    UCP_ASSIGN_OR_RETURN(universal[i], i == 0 ? r.ConvertT1()
                                              : r.Convert(zero, t2_as_t1 ? "universal_t2_t1_stage" : "universal_t2"),
                         _.Prepend(absl::StrCat("convert from T", i + 1, ": ")));
    // The model-state files are byte-identical copies of the source's; for
    // a plain module (no layer files) at tp > 1, one file: tp rank 0's with
    // no module tensors and mp_world_size 1.
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(zero));
    const bool plain = std::none_of(files.begin(), files.end(),
                                    [](const std::string& f) { return absl::StartsWith(f, "layer_"); });
    const bool single = plain && topologies[i].tp() > 1;
    for (const auto& f : files) {
      if (!absl::StartsWith(f, "mp_rank_")) continue;
      if (single) {
        if (f != deepspeed::MpRankFileName(0)) {
          if (PathExists(JoinPath(universal[i], f))) return Violation(p, absl::StrCat(f, " is in the universal folder"));
          continue;
        }
        UCP_ASSIGN_OR_RETURN(std::vector<std::string> d,
                             testing::CompareSingleMpRankFile(JoinPath(universal[i], f), JoinPath(zero, f)));
        if (!d.empty()) return Violation(p, absl::StrCat(f, " is not the source's rank 0 file for any tp:\n  ", Joined(d)));
        continue;
      }
      const int stage = i == 0 || t2_as_t1 ? SourceZeroStage(r.c()) : TargetZeroStage(r.c());
      if (stage == 0) {
        // A ZeRO-0 source's file holds the optimizer: the universal folder
        // keeps it as a ZeRO job saves it (optimizer None, param_shapes and
        // shared_params filled), everything else as it is.
        UCP_ASSIGN_OR_RETURN(auto x, torch::TorchFile::Open(JoinPath(zero, f)));
        UCP_ASSIGN_OR_RETURN(auto y, torch::TorchFile::Open(JoinPath(universal[i], f)));
        const std::vector<std::string> keys = {"optimizer", "param_shapes", "shared_params"};
        std::vector<std::string> d =
            testing::CompareTrees(*x, *Without(*x->root(), keys), *y, *Without(*y->root(), keys));
        const Value* opt = y->root()->DictGet("optimizer");
        if (opt == nullptr || !opt->is(Kind::kNone)) d.push_back("optimizer is not None");
        if (!d.empty()) return Violation(p, absl::StrCat(f, " is not the ZeRO-0 source's as a ZeRO job saves it:\n  ", Joined(d)));
        continue;
      }
      UCP_ASSIGN_OR_RETURN(std::string x, ReadFileToString(JoinPath(zero, f)));
      UCP_ASSIGN_OR_RETURN(std::string y, ReadFileToString(JoinPath(universal[i], f)));
      if (x != y) return Violation(p, absl::StrCat(f, " is not a byte-identical copy of the source's"));
    }
  }
  std::vector<std::string> diffs;
  if (SourceZeroStage(r.c()) == 3) {
    // DeepSpeed's stage-3 universal layout keeps the source's dp (a model
    // states file per rank, the flat groups): each one must be M instead.
    UCP_ASSIGN_OR_RETURN(diffs, Zero3UniversalVsModel(universal[1], r.model()));
    if (!diffs.empty()) return Violation(p, absl::StrCat("convert(save(M, T2)) is not M:\n  ", Joined(diffs)));
  } else {
    const bool declared1 = OracleVersion(r.V1()) >= std::make_tuple(0, 19, 5);
    const bool declared2 = OracleVersion(r.V2()) >= std::make_tuple(0, 19, 5);
    UCP_ASSIGN_OR_RETURN(diffs, UniversalDiffs(universal[0], universal[1],
                                               !t2_as_t1 && SourceZeroStage(r.c()) != TargetZeroStage(r.c()),
                                               r.c().model().autotp() && declared1 != declared2));
  }
  if (!diffs.empty()) {
    return Violation(p, absl::StrCat("convert(save(M, T1)) and convert(save(M, T2)) differ:\n  ", Joined(diffs)));
  }
  if (SourceZeroStage(r.c()) == 3) {
    UCP_ASSIGN_OR_RETURN(diffs, Zero3UniversalVsModel(universal[0], r.model()));
  } else {
    UCP_ASSIGN_OR_RETURN(diffs, UniversalVsModel(universal[0], r.model(), r.V1(),
                                                 SourceZeroStage(r.c()) != ModelZeroStage(r.c())));
  }
  if (!diffs.empty()) return Violation(p, absl::StrCat("convert(save(M, T1)) is not M:\n  ", Joined(diffs)));
  // Hugging Face cases: export(save(M, T)) is M's weights at both ends.
  if (absl::StartsWith(r.c().model().style(), "hf-")) {
    for (int i = 0; i < 2; ++i) {
      UCP_ASSIGN_OR_RETURN(std::string zero, i == 0 ? r.SaveT1() : r.SaveT2());
      const absl::Status s = ExportIsTheModel(r, zero, absl::StrCat("t", i + 1), diffs);
      if (!s.ok()) return Violation(p, absl::StrCat("export of save(M, T", i + 1, "): ", s.ToString()));
    }
    if (!diffs.empty()) return Violation(p, absl::StrCat("export(save(M, T)) is not M's weights:\n  ", Joined(diffs)));
  }
  return absl::OkStatus();
}

// The config.json a Hugging Face Trainer saves beside its checkpoint of a
// model of `style` (what `ucp export --names=hf` writes as is).
std::string HfConfigJson(const ModelSpec& spec, bool tied) {
  std::string arch = "LlamaForCausalLM", type = "llama";
  if (spec.style() == "hf-gpt-neox") arch = "GPTNeoXForCausalLM", type = "gpt_neox";
  if (spec.style() == "hf-gpt2") arch = "GPT2LMHeadModel", type = "gpt2";
  return absl::StrCat("{\n  \"architectures\": [\"", arch, "\"],\n  \"model_type\": \"", type,
                      "\",\n  \"hidden_size\": ", spec.hidden_size(), ",\n  \"vocab_size\": ",
                      spec.original_vocab_size(), ",\n  \"tie_word_embeddings\": ", tied ? "true" : "false", "\n}\n");
}

// The tensors of one safetensors export folder (model.safetensors), and its
// __metadata__ (alias -> owner for tied aliases).
struct Exported {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;
  std::shared_ptr<safetensors::SafetensorsFile> file;
};
absl::StatusOr<Exported> ReadExport(const std::string& dir) {
  Exported e;
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<safetensors::SafetensorsFile> f,
                       safetensors::SafetensorsFile::Open(JoinPath(dir, "model.safetensors")));
  e.file = std::move(f);
  for (const std::string& name : e.file->header_order()) {
    if (name == "__metadata__") continue;
    UCP_ASSIGN_OR_RETURN(e.tensors[name], e.file->GetTensor(name));
  }
  for (const auto& [k, v] : e.file->metadata()) e.metadata[k] = v;
  return e;
}

// export(save(M, T)) is M's weights as zero_to_fp32.py gives them
// (ops/export.h): fp32 masters of trainable params, frozen params as stored,
// buffers as float32, a tied alias as its owner's tensor (or named in the
// metadata); for a Hugging Face model also `--names=hf` (the Trainer's
// config.json beside it) as the identity: the same tensors under the same
// names (the preset may drop buffers) and that config.json, or for peft
// names a refusal that says so. Appends what differs.
absl::Status ExportIsTheModel(CaseRunner& r, const std::string& zero, const std::string& name,
                              std::vector<std::string>& diffs) {
  const SyntheticModelState& m = r.model();
  const ModelSpec& spec = r.c().model();
  const std::string out = JoinPath(JoinPath(Dirname(Dirname(zero)), "export_" + name), "checkpoint");
  ops::ExportOptions o;
  o.input_folder = zero;
  o.output_folder = out;
  o.state = r.zero_options();
  o.write.num_threads = 1;
  UCP_RETURN_IF_ERROR(ops::Export(o).status());
  UCP_ASSIGN_OR_RETURN(Exported e, ReadExport(out));
  std::set<std::string> seen;
  for (const ModelParam& p : spec.param()) {
    torch::Tensor want;
    if (p.role() == "tied") {
      bool frozen_owner = false;
      for (const ModelParam& q : spec.param()) frozen_owner |= q.name() == p.tied_key() && q.role() == "frozen";
      UCP_ASSIGN_OR_RETURN(want, m.Tensor(p.tied_key(), frozen_owner ? "lp" : "fp32"));
      if (!e.tensors.count(p.name())) {
        auto it = e.metadata.find(p.name());
        if (it == e.metadata.end() || it->second != p.tied_key()) {
          diffs.push_back(absl::StrCat("export of ", name, ": tied alias '", p.name(), "' is neither a tensor nor '",
                                       p.tied_key(), "' in the metadata"));
        }
        seen.insert(p.name());
        continue;
      }
    } else if (p.role() == "buffer") {
      UCP_ASSIGN_OR_RETURN(torch::Tensor lp, m.Tensor(p.name(), "lp"));
      UCP_ASSIGN_OR_RETURN(want, torch::Cast(lp, torch::DType::kFloat32));
    } else if (p.role() == "frozen") {
      UCP_ASSIGN_OR_RETURN(want, m.Tensor(p.name(), "lp"));
    } else {
      UCP_ASSIGN_OR_RETURN(want, m.Tensor(p.name(), "fp32"));
    }
    seen.insert(p.name());
    auto it = e.tensors.find(p.name());
    if (it == e.tensors.end()) {
      diffs.push_back(absl::StrCat("export of ", name, ": no tensor '", p.name(), "'"));
    } else if (!it->second.BitwiseEqual(want)) {
      diffs.push_back(absl::StrCat("export of ", name, ": '", p.name(), "' is ", std::string(torch::DTypeName(it->second.dtype())),
                                   torch::ShapeString(it->second.sizes()), ", not the model's ",
                                   std::string(torch::DTypeName(want.dtype())), torch::ShapeString(want.sizes())));
    }
  }
  for (const auto& [n, t] : e.tensors) {
    if (!seen.count(n)) diffs.push_back(absl::StrCat("export of ", name, ": a tensor '", n, "' the model has not"));
  }
  if (!absl::StartsWith(spec.style(), "hf-")) return absl::OkStatus();

  // --names=hf with the Trainer's config.json.
  bool tied = false, peft = false;
  for (const ModelParam& p : spec.param()) {
    tied |= p.role() == "tied";
    peft |= absl::StartsWith(p.name(), "base_model.model.");
  }
  ops::ExportOptions h = o;
  h.output_folder = JoinPath(JoinPath(Dirname(Dirname(zero)), "export_hf_" + name), "hf");
  h.names = "hf";
  h.hf.checkpoint_config_json = HfConfigJson(spec, tied);
  h.hf.checkpoint_model_type = spec.style() == "hf-llama" ? "llama" : spec.style() == "hf-gpt2" ? "gpt2" : "gpt_neox";
  h.hf.checkpoint_architecture = spec.style() == "hf-llama"  ? "LlamaForCausalLM"
                                 : spec.style() == "hf-gpt2" ? "GPT2LMHeadModel"
                                                             : "GPTNeoXForCausalLM";
  const absl::Status hs = ops::Export(h).status();
  if (peft) {
    if (hs.ok() || !absl::StrContains(hs.message(), "peft")) {
      diffs.push_back(absl::StrCat("export --names=hf of ", name, " (peft names): expected a refusal naming peft, got ",
                                   hs.ToString()));
    }
    if (PathExists(h.output_folder)) diffs.push_back(absl::StrCat("a refused export left ", h.output_folder));
    return absl::OkStatus();
  }
  if (!hs.ok()) {
    diffs.push_back(absl::StrCat("export --names=hf of ", name, ": ", hs.ToString()));
    return absl::OkStatus();
  }
  UCP_ASSIGN_OR_RETURN(Exported x, ReadExport(h.output_folder));
  for (const auto& [n, t] : x.tensors) {
    auto it = e.tensors.find(n);
    if (it == e.tensors.end() || !it->second.BitwiseEqual(t)) {
      diffs.push_back(absl::StrCat("export --names=hf of ", name, ": '", n, "' is not the --names=checkpoint tensor"));
    }
  }
  for (const ModelParam& p : spec.param()) {
    // Buffers the preset drops, and a tied lm_head (tie_word_embeddings:
    // transformers' save_pretrained writes it once, as the embedding).
    if (p.role() == "buffer" || p.role() == "tied" || x.tensors.count(p.name())) continue;
    diffs.push_back(absl::StrCat("export --names=hf of ", name, ": '", p.name(), "' is missing"));
  }
  UCP_ASSIGN_OR_RETURN(std::string config, ReadFileToString(JoinPath(h.output_folder, "config.json")));
  if (config != h.hf.checkpoint_config_json) {
    diffs.push_back(absl::StrCat("export --names=hf of ", name, ": config.json is not the checkpoint's:\n", config));
  }
  return absl::OkStatus();
}

absl::Status ReshardMatchesSave(CaseRunner& r) {
  const Property p = Property::kReshardMatchesSave;
  // (A ZeRO-3 source converts to DeepSpeed's stage-3 universal layout,
  // which ucp reads back.)
  UCP_ASSIGN_OR_RETURN(std::string universal, r.ConvertT1(), _.Prepend("convert from T1: "));
  UCP_ASSIGN_OR_RETURN(std::string resharded, r.Reshard(universal, "universal_t1_to_t2", r.c().target(), r.V2()),
                       _.Prepend("reshard to T2: "));
  UCP_ASSIGN_OR_RETURN(std::string zero2, r.SaveT2(), _.Prepend("save at T2: "));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> diffs, FolderByteDiffs(resharded, zero2));
  if (!diffs.empty()) {
    return Violation(p, absl::StrCat("reshard(convert(save(M, T1)), T2) differs from save(M, T2):\n  ", Joined(diffs)));
  }
  UCP_ASSIGN_OR_RETURN(std::string l1, ReadFileToString(JoinPath(Dirname(resharded), deepspeed::kLatestFile)));
  UCP_ASSIGN_OR_RETURN(std::string l2, ReadFileToString(JoinPath(Dirname(zero2), deepspeed::kLatestFile)));
  if (l1 != l2) return Violation(p, absl::StrCat("latest is '", l1, "', save wrote '", l2, "'"));
  return absl::OkStatus();
}

absl::Status DirectReshardMatchesTwoStep(CaseRunner& r) {
  const Property p = Property::kDirectReshardMatchesTwoStep;
  UCP_ASSIGN_OR_RETURN(std::string zero1, r.SaveT1(), _.Prepend("save at T1: "));
  UCP_ASSIGN_OR_RETURN(std::string direct, r.Reshard(zero1, "zero_t1_to_t2", r.c().target(), r.V2()),
                       _.Prepend("reshard the ZeRO folder to T2: "));
  UCP_ASSIGN_OR_RETURN(std::string universal, r.ConvertT1(), _.Prepend("convert from T1: "));
  UCP_ASSIGN_OR_RETURN(std::string two_step, r.Reshard(universal, "universal_t1_to_t2", r.c().target(), r.V2()),
                       _.Prepend("reshard the universal folder to T2: "));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> diffs, FolderByteDiffs(direct, two_step));
  if (!diffs.empty()) {
    return Violation(p, absl::StrCat("ZeRO -> ZeRO reshard differs from ZeRO -> universal -> ZeRO:\n  ", Joined(diffs)));
  }
  return absl::OkStatus();
}

// Expects `s` to be an error with `code` whose message contains every one of `parts`.
absl::Status ExpectError(Property p, const std::string& what, const absl::Status& s, absl::StatusCode code,
                         const std::vector<std::string>& parts) {
  if (s.ok()) return Violation(p, absl::StrCat(what, ": ucp succeeded"));
  bool all = s.code() == code;
  for (const auto& part : parts) all &= absl::StrContains(s.message(), part);
  if (!all) {
    return Violation(p, absl::StrCat(what, ": expected ", absl::StatusCodeToString(code), " mentioning '",
                                     absl::StrJoin(parts, "', '"), "', got ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectNoOutput(Property p, const std::string& what, const std::string& output) {
  if (PathExists(output)) return Violation(p, absl::StrCat(what, ": a failed run left ", output, " behind"));
  const std::string root = Dirname(output);
  if (IsDirectory(root)) {
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(root));
    if (!names.empty()) return Violation(p, absl::StrCat(what, ": a failed run left ", JoinPath(root, names[0])));
  }
  return absl::OkStatus();
}

// Rewrites one optimizer file with element `offset` of a state of group
// `group` (fp32 partition or a base optimizer state) changed by `delta`.
absl::Status NudgeOptimizerElement(const std::string& path, int group, const std::string& state, int64_t offset,
                                   float delta) {
  const std::string tmp = path + ".nudged";
  {
    UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path));
    torch::TorchWriter w;
    UCP_ASSIGN_OR_RETURN(ValuePtr root, deepspeed::CopyTreeForWrite(state::FileValue{f->root(), state::Unowned(f.get())}, w));
    const Value* osd_in = f->root()->DictGet("optimizer_state_dict");
    if (osd_in == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": no optimizer_state_dict"));
    const Value* tensor_in = nullptr;
    if (state == "fp32") {
      tensor_in = osd_in->DictGet("single_partition_of_fp32_groups")->items()[group].get();
    } else {
      tensor_in = osd_in->DictGet("base_optimizer_state")->DictGet("state")->DictGet(Value::Int(group))->DictGet(state);
    }
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(*tensor_in));
    std::string bytes = t.ContiguousBytes();
    if (t.dtype() != torch::DType::kFloat32 || offset < 0 || (offset + 1) * 4 > static_cast<int64_t>(bytes.size())) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": cannot nudge element ", offset, " of ", state));
    }
    float x;
    std::memcpy(&x, &bytes[offset * 4], 4);
    x += delta;
    std::memcpy(&bytes[offset * 4], &x, 4);
    UCP_ASSIGN_OR_RETURN(torch::Tensor nudged, torch::Tensor::FromBytes(t.dtype(), t.sizes(), std::move(bytes)));
    ValuePtr value = w.AddTensor(nudged);
    ValuePtr osd = root->DictGetPtr("optimizer_state_dict");
    if (state == "fp32") {
      osd->DictGetPtr("single_partition_of_fp32_groups")->mutable_items()[group] = value;
    } else {
      osd->DictGetPtr("base_optimizer_state")->DictGetPtr("state")->DictGetPtr(Value::Int(group))->DictSet(
          Value::Str(state), value);
    }
    UCP_RETURN_IF_ERROR(w.WriteFile(tmp, *root));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError(absl::StrCat("rename ", tmp));
  return absl::OkStatus();
}

absl::Status CorruptionsAreCaught(CaseRunner& r, const std::string& scratch) {
  const Property p = Property::kCorruptionsAreCaught;
  const uint64_t seed = r.c().seed();
  UCP_ASSIGN_OR_RETURN(std::string zero, r.SaveT1(), _.Prepend("save at T1: "));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(zero));
  // The checkpoint's files (not ucp's output marker, which no reader needs).
  files.erase(std::remove(files.begin(), files.end(), std::string(kUcpOutputMarker)), files.end());
  std::vector<std::string> optim;
  for (const auto& f : files) {
    auto parsed = deepspeed::ParseCheckpointFileName(f);
    if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kOptim) optim.push_back(f);
  }
  auto damaged_copy = [&](const std::string& name) -> absl::StatusOr<std::string> {
    const std::string dir = JoinPath(JoinPath(scratch, name), Basename(zero));
    UCP_RETURN_IF_ERROR(CopyTree(zero, dir));
    return dir;
  };
  const ops::SourceOptions zero_options = r.zero_options();
  auto convert_to = [&](const std::string& src, const std::string& name) {
    ops::ConvertOptions o;
    o.input_folder = src;
    o.output_folder = JoinPath(JoinPath(scratch, name + "_out"), "universal");
    o.state = zero_options;
    o.write.num_threads = 1;
    return std::make_pair(ops::Convert(o).status(), o.output_folder);
  };

  // A missing optimizer shard (ZeRO-0: the model-states file, which holds
  // the optimizer).
  if (optim.empty()) {
    UCP_ASSIGN_OR_RETURN(std::string dir, damaged_copy("missing"));
    const std::string victim = JoinPath(dir, deepspeed::MpRankFileName(0));
    if (unlink(victim.c_str()) != 0) return absl::InternalError(absl::StrCat("unlink ", victim));
    auto [s, out] = convert_to(dir, "missing");
    // Nothing left says what the folder was.
    UCP_RETURN_IF_ERROR(ExpectError(p, "missing model states", s, absl::StatusCode::kInvalidArgument,
                                    {dir, "unrecognized checkpoint layout"}));
    UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "missing model states", out));
  } else {
    UCP_ASSIGN_OR_RETURN(std::string dir, damaged_copy("missing"));
    const std::string victim = JoinPath(dir, optim[seed % optim.size()]);
    if (unlink(victim.c_str()) != 0) return absl::InternalError(absl::StrCat("unlink ", victim));
    auto [s, out] = convert_to(dir, "missing");
    // The only optimizer file gone: nothing says which layout it had.
    // (ZeRO-3's model states name the dp size: the file is named.)
    const std::vector<std::string> parts =
        optim.size() == 1 && SourceZeroStage(r.c()) != 3
            ? std::vector<std::string>{dir, "no *zero_pp_rank_*_optim_states.pt files"}
            : std::vector<std::string>{victim, "missing"};
    UCP_RETURN_IF_ERROR(ExpectError(p, "missing shard", s, absl::StatusCode::kNotFound, parts));
    UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "missing shard", out));
  }
  // A truncated file (any file of the checkpoint).
  {
    UCP_ASSIGN_OR_RETURN(std::string dir, damaged_copy("truncated"));
    const std::string victim = JoinPath(dir, files[(seed / 7) % files.size()]);
    UCP_ASSIGN_OR_RETURN(int64_t size, FileSize(victim));
    const int64_t keep = static_cast<int64_t>((seed / 13) % static_cast<uint64_t>(size));
    if (truncate(victim.c_str(), keep) != 0) return absl::InternalError(absl::StrCat("truncate ", victim));
    auto [s, out] = convert_to(dir, "truncated");
    UCP_RETURN_IF_ERROR(ExpectError(p, absl::StrCat("file truncated to ", keep, " of ", size, " bytes"), s,
                                    absl::StatusCode::kDataLoss, {victim}));
    UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "truncated file", out));
  }
  // A flipped byte in a universal file, caught by the manifest's checksums.
  {
    // Its own conversion: the bytes it flips must not reach the other properties.
    UCP_ASSIGN_OR_RETURN(std::string universal, r.Convert(zero, "universal_t1_to_damage"),
                         _.Prepend("convert from T1: "));
    UCP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(JoinPath(universal, deepspeed::kManifestFile)));
    Manifest m;
    if (!google::protobuf::TextFormat::ParseFromString(text, &m) || m.file_size() == 0) {
      return Violation(p, "the universal checkpoint has no manifest listing its files");
    }
    const FileDigest& d = m.file(static_cast<int>((seed / 3) % m.file_size()));
    const std::string victim = JoinPath(universal, d.path());
    UCP_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(victim));
    const size_t at = static_cast<size_t>((seed / 5) % bytes.size());
    bytes[at] = static_cast<char>(bytes[at] ^ (1 << (seed % 8)));
    UCP_RETURN_IF_ERROR(WriteFileAtomic(victim, bytes));
    const std::string out = JoinPath(JoinPath(scratch, "flipped_out"), "global_step1");
    ops::ReshardOptions o;
    o.input_folder = universal;
    o.output_folder = out;
    o.write.target = state::Topology::FromProto(r.c().target());
    o.write.num_threads = 1;
    o.verify_checksums = true;
    absl::Status s = ops::Reshard(o).status();
    UCP_RETURN_IF_ERROR(ExpectError(p, absl::StrCat("byte ", at, " of ", d.path(), " flipped"), s,
                                    absl::StatusCode::kDataLoss, {victim, "differs from the manifest's"}));
    UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "flipped byte", out));
  }
  // tp copies of a replicated param that disagree.
  if (r.c().source().tp() >= 2) {
    const state::ParamState* victim = nullptr;
    for (const auto& ps : r.model().info().params) {
      if (ps.trainable() && ps.rule.kind() == REPLICATED && ps.tied_layers.empty()) {
        victim = &ps;
        if ((seed / 11) % 2 == 0) break;
      }
    }
    if (victim != nullptr) {
      UCP_ASSIGN_OR_RETURN(std::string dir, damaged_copy("replicated"));
      UCP_ASSIGN_OR_RETURN(auto ckpt, deepspeed_zero::ZeroCheckpoint::Open(dir));
      const deepspeed::ZeroParam* zp = ckpt->FindParam(victim->name);
      if (zp == nullptr) return Violation(p, absl::StrCat(victim->name, " is not in the saved checkpoint"));
      const int stage = zp->stages[0];
      const auto frags = ckpt->Layout(stage, 1, zp->group).FragmentsOfParam(zp->index_in_group[0]);
      if (frags.empty()) return Violation(p, absl::StrCat(victim->name, " has no fragments"));
      const std::string state = std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}[seed % 3];
      const std::string path = ckpt->OptimPath(stage, 1, frags[0].first);
      ckpt.reset();
      UCP_RETURN_IF_ERROR(NudgeOptimizerElement(path, zp->group, state, frags[0].second.partition_offset, 0.5f));
      auto [s, out] = convert_to(dir, "replicated");
      if (state == "fp32") {
        // The nudged element is the first of its fragment, which the check of
        // every optimizer file against its own rank's lp weights samples
        // (formats/deepspeed_zero/zero_checkpoint.h): the file disagrees with itself first.
        UCP_RETURN_IF_ERROR(ExpectError(p, absl::StrCat("tp rank 1's fp32 of ", victim->name, " changed"), s,
                                        absl::StatusCode::kInvalidArgument,
                                        {path, "do not match the lp weights", absl::StrCat("'", victim->name, "'")}));
      } else {
        UCP_RETURN_IF_ERROR(ExpectError(p, absl::StrCat("tp rank 1's ", state, " of ", victim->name, " changed"), s,
                                        absl::StatusCode::kFailedPrecondition,
                                        {"replicated param(s) differ between tp ranks",
                                         absl::StrCat(victim->name, " ("), absl::StrCat("tp copies differ in ", state)}));
      }
      UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "replicated copies", out));
    }
  }
  return absl::OkStatus();
}

// --- (e): save(M, T) against DeepSpeed's formulas (0.12 to 0.19.5), computed here
// independently of layout_math.cc, tp/merge.cc and the writer ---

// Megatron's padded vocabulary (mpu.vocab_size_with_padding).
int64_t OraclePaddedVocab(int64_t vocab, int64_t divisible_by, int tp) {
  const int64_t multiple = std::max<int64_t>(divisible_by, 1) * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

// DeepSpeed AutoTP's cut of n rows over tp (module_inject/tp_shard.py
// get_shard_size with tp_grain_size 1, master): the first offset of rank
// `rank` and its width (n // tp, plus one on the first n % tp ranks). With
// `chunk`, as DeepSpeed before 0.19.6 trains (layers.py _tp_partition:
// torch.chunk, pieces of ceil(n / tp) and what is left on the last).
std::pair<int64_t, int64_t> OracleAutoTpRange(int64_t n, int tp, int rank, bool chunk = false) {
  if (chunk) {
    const int64_t c = (n + tp - 1) / tp;
    const int64_t start = std::min<int64_t>(n, rank * c);
    return {start, std::min<int64_t>(c, n - start)};
  }
  int64_t start = 0;
  for (int r = 0; r < rank; ++r) start += n / tp + (r < n % tp ? 1 : 0);
  return {start, n / tp + (rank < n % tp ? 1 : 0)};
}

// The tp slice `rank` of a full tensor as Megatron lays it out and
// universal_checkpoint.py:load_hp_checkpoint_state cuts it; for an AutoTP
// model (`autotp`) as AutoTP cuts it: column, row and vocabulary params
// (unpadded) and each fused sub-param in AutoTP's widths.
absl::StatusOr<torch::Tensor> OracleSlice(const ModelParam& p, const torch::Tensor& full, int tp, int rank,
                                          int64_t divisible_by, bool autotp = false, bool chunk = false) {
  const MergeRule& r = p.rule();
  auto narrow_even = [&](const torch::Tensor& t, int64_t dim) -> absl::StatusOr<torch::Tensor> {
    if (autotp) {
      const auto [start, width] = OracleAutoTpRange(t.sizes()[dim], tp, rank, chunk);
      return t.Narrow(dim, start, width);
    }
    const int64_t n = t.sizes()[dim] / tp;
    return t.Narrow(dim, rank * n, n);
  };
  if (autotp && r.kind() == VOCAB) return narrow_even(full, 0);
  switch (r.kind()) {
    case REPLICATED:
    case AVERAGE:
      return full;
    case COLUMN:
      return narrow_even(full, 0);
    case ROW:
      return narrow_even(full, 1);
    case VOCAB: {
      const int64_t rows = OraclePaddedVocab(full.sizes()[0], divisible_by, tp);
      torch::Tensor padded = full;
      if (rows > full.sizes()[0]) {
        std::vector<int64_t> pad_shape = full.sizes();
        pad_shape[0] = rows - full.sizes()[0];
        UCP_ASSIGN_OR_RETURN(padded, torch::Cat({full, torch::Tensor::Zeros(full.dtype(), pad_shape)}, 0));
      }
      return narrow_even(padded, 0);
    }
    case SUB_PARAMS: {
      std::vector<torch::Tensor> pieces;
      if (r.sub_param_shape().dim_size() > 0) {
        const int64_t dim = r.sub_param_shape().partition_dim();
        int64_t offset = 0;
        for (int64_t sub : r.sub_param_shape().dim(static_cast<int>(dim)).size()) {
          const int64_t part = sub / tp;
          const auto [start, width] =
              autotp ? OracleAutoTpRange(sub, tp, rank) : std::make_pair(rank * part, part);
          UCP_ASSIGN_OR_RETURN(torch::Tensor piece, full.Narrow(dim, offset + start, width));
          pieces.push_back(piece);
          offset += sub;
        }
        return torch::Cat(pieces, dim);
      }
      const int64_t dim = r.cat_dim();
      const int64_t sub = full.sizes()[dim] / r.num_sub_params();
      for (int c = 0; c < r.num_sub_params(); ++c) {
        UCP_ASSIGN_OR_RETURN(torch::Tensor piece, full.Narrow(dim, c * sub + rank * (sub / tp), sub / tp));
        pieces.push_back(piece);
      }
      return torch::Cat(pieces, dim);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(p.name(), ": no merge kind"));
  }
}

absl::StatusOr<torch::Tensor> TensorAt(const torch::TorchFile& f, const Value* v, const std::string& what) {
  if (v == nullptr || !torch::TorchFile::IsTensor(*v)) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", what, " is not a tensor"));
  }
  return f.GetTensor(*v);
}

std::vector<std::string> DictKeys(const Value& d) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : d.dict_items()) keys.push_back(k->is(Kind::kStr) ? k->str() : k->DebugString());
  return keys;
}

// Checks one saved checkpoint; appends what differs from DeepSpeed's layout.
// The (major, minor, patch) of a version string, compared here without
// layout_math's DsVersion.
std::tuple<int, int, int> OracleVersion(const std::string& v) {
  int a = 0, b = 0, c = 0;
  (void)sscanf(v.c_str(), "%d.%d.%d", &a, &b, &c);
  return {a, b, c};
}

// An AutoTP model's metadata in a model-states file at `t` (and, for any
// model, no AutoTP metadata where the model has none):
// ds_config.tensor_parallel.autotp_size is t.tp (the job that loads it),
// universal_checkpoint_info is AutoTP's (spec_rules.h AutoTpCheckpointInfo)
// for the source's DeepSpeed (V1: ucp carries the source's declaration, so a
// save for another V2 holds V1's) with sub_param_shard_widths for t.tp, last
// of the engine's keys. At tp 1 DeepSpeed's tp plan route writes none (a
// partition_config job writes it at tp 1 too): none is accepted there.
absl::Status CheckAutoTpMetadata(const CaseRunner& r, const torch::TorchFile& f, const Topology& t,
                                 const std::string& version, const std::string& name,
                                 std::vector<std::string>& diffs) {
  const ModelSpec& spec = r.c().model();
  const Value& root = *f.root();
  auto diff = [&](const std::string& what) {
    if (diffs.size() < 20) diffs.push_back(absl::StrCat(name, ": ", what));
  };
  const Value* config = root.DictGet("ds_config");
  const Value* tpc = config != nullptr && config->is(Kind::kDict) ? config->DictGet("tensor_parallel") : nullptr;
  const Value* size = tpc != nullptr && tpc->is(Kind::kDict) ? tpc->DictGet("autotp_size") : nullptr;
  const Value* uc = root.DictGet("universal_checkpoint_info");
  if (!spec.autotp()) {
    if (tpc != nullptr) diff("ds_config has tensor_parallel, the model is not AutoTP's");
    return absl::OkStatus();
  }
  if (size == nullptr || !size->is(Kind::kInt) || size->int_value() != t.tp()) {
    diff(absl::StrCat("ds_config.tensor_parallel.autotp_size is ", size ? size->DebugString(20) : "missing",
                      ", the job's tp is ", t.tp()));
  }
  UCP_ASSIGN_OR_RETURN(ValuePtr want, AutoTpCheckpointInfo(spec, r.V1(), t.tp()));
  // A save for 0.16.4 - 0.18.9 at tp > 1 holds the lm_head whole and, as those
  // versions' AutoTP, no universal_checkpoint_info, whatever V1 declared.
  const auto v = OracleVersion(version);
  if (t.tp() > 1 && v >= std::make_tuple(0, 16, 4) && v < std::make_tuple(0, 19, 5)) want = nullptr;
  if (want == nullptr || (uc == nullptr && t.tp() == 1)) {
    if (uc != nullptr) diff(absl::StrCat("has a universal_checkpoint_info, DeepSpeed ", version, " writes none"));
    return absl::OkStatus();
  }
  if (uc == nullptr) {
    diff(absl::StrCat("no universal_checkpoint_info (AutoTP of DeepSpeed ", r.V1(), " writes one)"));
    return absl::OkStatus();
  }
  const std::vector<std::string> keys = DictKeys(root);
  if (keys.back() != "universal_checkpoint_info") diff("universal_checkpoint_info is not after the engine's keys");
  if (const std::string got = PyRepr(*uc), expected = PyRepr(*want); got != expected) {
    diff(absl::StrCat("universal_checkpoint_info is ", got, ", DeepSpeed's is ", expected));
  }
  return absl::OkStatus();
}

absl::Status CheckLayout(const CaseRunner& r, const std::string& dir, const Topology& t, const std::string& version,
                         std::vector<std::string>& diffs) {
  const SyntheticModelState& m = r.model();
  const ModelSpec& spec = r.c().model();
  const state::ModelInfo& info = m.info();
  const bool bf16 = info.optimizer_kind == state::OptimizerKind::kBf16;
  // stage_1_and_2.py records every rank's own padding from 0.16.4 on
  // (bf16_optimizer.py: the last rank's in every version); engine.py writes
  // checkpoint_parallel_dimensions from 0.19.5 on.
  const bool per_rank = !bf16 && OracleVersion(version) >= std::make_tuple(0, 16, 4);
  const bool parallel_dims = OracleVersion(version) >= std::make_tuple(0, 19, 5);
  const int64_t divisible_by = spec.make_vocab_size_divisible_by();
  std::map<std::string, const ModelParam*> by_name;
  for (const ModelParam& p : spec.param()) by_name[p.name()] = &p;
  std::map<std::string, int> flatten_index;
  for (size_t i = 0; i < info.params.size(); ++i) flatten_index[info.params[i].name] = static_cast<int>(i);
  auto slice_of = [&](const ModelParam& p, const std::string& state, int rank) -> absl::StatusOr<torch::Tensor> {
    UCP_ASSIGN_OR_RETURN(torch::Tensor full, m.Tensor(p.name(), state));
    ModelParam saved = p;
    *saved.mutable_rule() = RuleSavedBy(spec.autotp(), p.name(), p.rule(), version);
    return OracleSlice(saved, full, t.tp(), rank, divisible_by, spec.autotp(),
                       /*chunk=*/OracleVersion(version) < std::make_tuple(0, 19, 6));
  };
  auto diff = [&](const std::string& file, const std::string& what) {
    if (diffs.size() < 20) diffs.push_back(absl::StrCat(file, ": ", what));
  };
  std::set<std::string> trainable_seen;
  for (int s = 0; s < t.pp(); ++s) {
    std::vector<std::vector<std::string>> group_names(info.num_groups);
    for (int rank = 0; rank < t.tp(); ++rank) {
      const std::string mp_name = deepspeed::MpRankFileName(s * t.tp() + rank);
      UCP_ASSIGN_OR_RETURN(auto mp, torch::TorchFile::Open(JoinPath(dir, mp_name)));
      const Value& root = *mp->root();
      const Value* dp_world = root.DictGet("dp_world_size");
      const Value* mp_world = root.DictGet("mp_world_size");
      if (dp_world == nullptr || dp_world->int_value() != t.dp() || mp_world == nullptr ||
          mp_world->int_value() != t.tp() * t.pp()) {
        diff(mp_name, "dp_world_size / mp_world_size are not dp / tp * pp");
      }
      const Value* ds_version = root.DictGet("ds_version");
      if (ds_version == nullptr || !ds_version->is(Kind::kStr) || ds_version->str() != version) {
        diff(mp_name, absl::StrCat("ds_version is not '", version, "'"));
      }
      UCP_RETURN_IF_ERROR(CheckAutoTpMetadata(r, *mp, t, version, mp_name, diffs));
      {
        const std::vector<std::string> keys = DictKeys(root);
        auto at = std::find(keys.begin(), keys.end(), "checkpoint_parallel_dimensions");
        const Value* dims = root.DictGet("checkpoint_parallel_dimensions");
        if (!parallel_dims && dims != nullptr) diff(mp_name, "has checkpoint_parallel_dimensions (0.19.5 and later only)");
        if (parallel_dims) {
          if (dims == nullptr || at == keys.begin() || *(at - 1) != "mp_world_size" ||
              DictKeys(*dims) != std::vector<std::string>{"pp_degree", "tp_degree"} ||
              dims->DictGet("pp_degree")->int_value() != t.pp() || dims->DictGet("tp_degree")->int_value() != t.tp()) {
            diff(mp_name, absl::StrCat("checkpoint_parallel_dimensions is not {'pp_degree': ", t.pp(),
                                       ", 'tp_degree': ", t.tp(), "} after mp_world_size"));
          }
        }
      }
      // The RNG state's ndarray as the source's numpy pickled it.
      if (const Value* np = root.DictGet("np_rng_state"); np != nullptr && np->is(Kind::kTuple) && np->items().size() > 1) {
        const Value& arr = *np->items()[1];
        const std::string want = r.c().numpy2() ? "numpy._core.multiarray" : "numpy.core.multiarray";
        if (!arr.is(Kind::kObject) || arr.object_module() != want) {
          diff(mp_name, absl::StrCat("np_rng_state's ndarray is not pickled from ", want));
        }
      } else if (!absl::StartsWith(spec.style(), "hf-")) {  // a Trainer's job saves no client state
        diff(mp_name, "no np_rng_state tuple");
      }
      const Value* shapes = root.DictGet("param_shapes");
      if (shapes == nullptr || !shapes->is(Kind::kList) || static_cast<int>(shapes->items().size()) != info.num_groups) {
        diff(mp_name, absl::StrCat("param_shapes is not a list of ", info.num_groups, " groups"));
        continue;
      }
      for (int g = 0; g < info.num_groups; ++g) {
        const Value& d = *shapes->items()[g];
        std::vector<std::string> names;
        int last = -1;
        for (const auto& [k, v] : d.dict_items()) {
          const std::string name = k->str();
          names.push_back(name);
          auto it = by_name.find(name);
          if (it == by_name.end() || it->second->group() != g) {
            diff(mp_name, absl::StrCat("param_shapes[", g, "] lists '", name, "', not a param of group ", g));
            continue;
          }
          if (flatten_index[name] <= last) diff(mp_name, absl::StrCat("param_shapes[", g, "]: '", name, "' out of order"));
          last = flatten_index[name];
          auto got = pickle::AsTorchSize(*v);
          UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(*it->second, "fp32", rank));
          if (!got.ok() || *got != slice.sizes()) {
            diff(mp_name, absl::StrCat("param_shapes[", g, "]['", name, "'] is ", v->DebugString(60), ", expected ",
                                       torch::ShapeString(slice.sizes())));
          }
          trainable_seen.insert(name);
        }
        if (rank == 0) {
          group_names[g] = names;
        } else if (names != group_names[g]) {
          diff(mp_name, absl::StrCat("param_shapes[", g, "] names differ from tp rank 0's"));
        }
      }
      // A plain module's state dict: every tensor, module order, tp slices.
      if (!spec.pipeline()) {
        const Value* module = root.DictGet("module");
        if (module == nullptr || !module->is(Kind::kDict)) {
          diff(mp_name, "no module state dict");
        } else {
          std::vector<std::string> want;
          for (const ModelParam& p : spec.param()) want.push_back(p.name());
          if (DictKeys(*module) != want) diff(mp_name, "module keys are not the model's, in module order");
          for (const ModelParam& p : spec.param()) {
            UCP_ASSIGN_OR_RETURN(torch::Tensor got, TensorAt(*mp, module->DictGet(p.name()), p.name()));
            const bool trainable = p.role().empty() || p.role() == "trainable";
            UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(p, trainable ? "fp32" : "lp", rank));
            UCP_ASSIGN_OR_RETURN(torch::Tensor want_t, trainable ? torch::Cast(slice, info.lp_dtype) : slice);
            if (!got.BitwiseEqual(want_t)) diff(mp_name, absl::StrCat("module['", p.name(), "'] is not its tp slice"));
          }
        }
      }
    }
    // The optimizer files: stage_1_and_2.py / bf16_optimizer.py partitioning.
    for (int rank = 0; rank < t.tp(); ++rank) {
      for (int d = 0; d < t.dp(); ++d) {
        const std::string name = deepspeed::OptimFileName(d, s * t.tp() + rank, info.bf16_file_prefix);
        UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(JoinPath(dir, name)));
        const Value& root = *f->root();
        if (DictKeys(root) != std::vector<std::string>{"optimizer_state_dict", "ds_config", "ds_version"}) {
          diff(name, "top-level keys are not optimizer_state_dict, ds_config, ds_version");
        }
        if (spec.autotp()) {
          const Value* size = root.DictGet("ds_config");
          for (const char* key : {"tensor_parallel", "autotp_size"}) {
            size = size != nullptr && size->is(Kind::kDict) ? size->DictGet(key) : nullptr;
          }
          if (size == nullptr || !size->is(Kind::kInt) || size->int_value() != t.tp()) {
            diff(name, absl::StrCat("ds_config.tensor_parallel.autotp_size is not the job's tp ", t.tp()));
          }
        }
        for (const Value* holder : {&root, root.DictGet("optimizer_state_dict")}) {
          const Value* v = holder != nullptr ? holder->DictGet("ds_version") : nullptr;
          if (v == nullptr || !v->is(Kind::kStr) || v->str() != version) {
            diff(name, absl::StrCat("ds_version is not '", version, "'"));
          }
        }
        const Value* osd = root.DictGet("optimizer_state_dict");
        if (osd == nullptr) continue;
        const std::vector<std::string> keys =
            bf16 ? std::vector<std::string>{"clip_grad", "base_optimizer_state", "single_partition_of_fp32_groups",
                                            "group_paddings", "partition_count", "ds_version", "param_slice_mappings"}
                 : std::vector<std::string>{"loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad",
                                            "base_optimizer_state", "single_partition_of_fp32_groups", "zero_stage",
                                            "group_paddings", "partition_count", "ds_version",
                                            "param_slice_mappings"};
        if (DictKeys(*osd) != keys) diff(name, "optimizer_state_dict keys are not DeepSpeed's");
        const Value* paddings = osd->DictGet("group_paddings");
        const Value* counts = osd->DictGet("partition_count");
        const Value* fp32s = osd->DictGet("single_partition_of_fp32_groups");
        const Value* mappings = osd->DictGet("param_slice_mappings");
        const Value* state = osd->DictGet("base_optimizer_state");
        state = state != nullptr ? state->DictGet("state") : nullptr;
        if (paddings == nullptr || counts == nullptr || fp32s == nullptr || mappings == nullptr || state == nullptr) {
          diff(name, "missing partition fields");
          continue;
        }
        for (int g = 0; g < info.num_groups; ++g) {
          // Flatten the group, align to 2 * dp (nccl_start_alignment_factor), cut
          // dp equal partitions; the padding is the last rank's, or (0.16.4+)
          // each rank's own: what of [d * part, (d + 1) * part) lies past numel.
          int64_t numel = 0;
          std::vector<std::pair<const ModelParam*, int64_t>> offsets;
          for (const std::string& pn : group_names[g]) {
            const ModelParam& p = *by_name[pn];
            UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(p, "fp32", rank));
            offsets.emplace_back(&p, numel);
            numel += slice.numel();
          }
          const int64_t align = 2 * static_cast<int64_t>(t.dp());
          const int64_t padded = (numel + align - 1) / align * align;
          const int64_t part = padded / t.dp();
          const int64_t padding = !per_rank   ? (d == t.dp() - 1 ? padded - numel : 0)
                                  : numel <= d * part ? part
                                  : std::max<int64_t>(0, (d + 1) * part - numel);
          if (paddings->items()[g]->int_value() != padding) {
            diff(name, absl::StrCat("group_paddings[", g, "] is ", paddings->items()[g]->int_value(), ", DeepSpeed's is ",
                                    padding, " (", numel, " elements aligned to ", align, ")"));
          }
          if (counts->items()[g]->int_value() != t.dp()) diff(name, absl::StrCat("partition_count[", g, "] != dp"));
          // ZeRO saves group[:part - padding] (Python slicing), bf16 the whole partition.
          int64_t lean = part - padding;
          if (lean < 0) lean = std::max<int64_t>(0, part + lean);
          UCP_ASSIGN_OR_RETURN(torch::Tensor fp32, TensorAt(*f, fp32s->items()[g].get(), "fp32 partition"));
          if (fp32.numel() != (bf16 ? part : lean)) {
            diff(name, absl::StrCat("fp32 partition of group ", g, " has ", fp32.numel(), " elements, expected ",
                                    bf16 ? part : lean));
          }
          const Value* gs = state->DictGet(Value::Int(g));
          if (gs == nullptr || DictKeys(*gs) != std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"}) {
            diff(name, absl::StrCat("base_optimizer_state.state[", g, "] keys are not step, exp_avg, exp_avg_sq"));
            continue;
          }
          UCP_ASSIGN_OR_RETURN(torch::Tensor step, TensorAt(*f, gs->DictGet("step"), "step"));
          if (step.dim() != 0 || *reinterpret_cast<const float*>(step.data()) != static_cast<float>(m.Step(g))) {
            diff(name, absl::StrCat("step of group ", g, " is not the model's"));
          }
          std::map<std::string, torch::Tensor> flats = {{"fp32", fp32}};
          for (const std::string key : {"exp_avg", "exp_avg_sq"}) {
            UCP_ASSIGN_OR_RETURN(flats[key], TensorAt(*f, gs->DictGet(key), key));
            if (flats[key].numel() != part) {
              diff(name, absl::StrCat(key, " of group ", g, " has ", flats[key].numel(), " elements, expected ", part));
            }
          }
          // deepspeed/utils/mixed_precision_linkage.py:_init_lp_to_hp_mapping.
          const int64_t lo = d * part, hi = lo + part;
          std::vector<std::string> want_names, got_names = DictKeys(*mappings->items()[g]);
          for (const auto& [p, offset] : offsets) {
            UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(*p, "fp32", rank));
            const int64_t start = std::max(offset, lo), end = std::min(offset + slice.numel(), hi);
            if (!(offset < hi && offset + slice.numel() > lo) || start >= end) continue;
            want_names.push_back(p->name());
            const Value* a = mappings->items()[g]->DictGet(p->name());
            auto addr = a != nullptr ? pickle::AsFragmentAddress(*a) : absl::StatusOr<pickle::FragmentAddress>(
                                                                           absl::NotFoundError("none"));
            if (!addr.ok() || addr->numel != end - start || addr->start != start - lo) {
              diff(name, absl::StrCat("param_slice_mappings[", g, "]['", p->name(), "'] is ",
                                      addr.ok() ? absl::StrCat("fragment_address(numel=", addr->numel, ", start=",
                                                               addr->start, ")")
                                                : "missing",
                                      ", DeepSpeed's is fragment_address(numel=", end - start, ", start=", start - lo,
                                      ")"));
              continue;
            }
            // The fragment's values are the param's tp slice's.
            for (const std::string state_name : {"fp32", "exp_avg", "exp_avg_sq"}) {
              UCP_ASSIGN_OR_RETURN(torch::Tensor sl, slice_of(*p, state_name, rank));
              const std::string want = sl.ContiguousBytes().substr((start - offset) * 4, (end - start) * 4);
              const torch::Tensor& flat = flats[state_name];
              if (flat.numel() < start - lo + (end - start)) continue;  // reported above
              std::string got((end - start) * 4, '\0');
              UCP_RETURN_IF_ERROR(
                  flat.CopyFlatRange(start - lo, end - start, reinterpret_cast<uint8_t*>(&got[0])));
              if (got != want) {
                diff(name, absl::StrCat(state_name, " partition of group ", g, " does not hold '", p->name(),
                                        "' tp slice ", rank, " at [", start - lo, ", ", end - lo, ")"));
              }
            }
          }
          if (got_names != want_names) {
            diff(name, absl::StrCat("param_slice_mappings[", g, "] lists [", absl::StrJoin(got_names, ", "),
                                    "], DeepSpeed's [", absl::StrJoin(want_names, ", "), "]"));
          }
        }
      }
    }
  }
  for (const auto& p : info.params) {
    if (p.trainable() && !trainable_seen.count(p.name)) diff("param_shapes", absl::StrCat("'", p.name, "' is in no stage"));
  }
  // PipelineModule layer files: every module layer, every tp rank, each
  // holding its params' tp slices (lp weights are the fp32 masters cast).
  if (spec.pipeline()) {
    for (int l : spec.module_layers()) {
      std::vector<const ModelParam*> here;
      for (const ModelParam& p : spec.param()) {
        const bool in = p.tied_layer().empty()
                            ? p.layer() == l
                            : std::find(p.tied_layer().begin(), p.tied_layer().end(), l) != p.tied_layer().end();
        if (in) here.push_back(&p);
      }
      for (int rank = 0; rank < t.tp(); ++rank) {
        const std::string name = deepspeed::LayerFileName(l, rank);
        UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(JoinPath(dir, name)));
        std::vector<std::string> want;
        for (const ModelParam* p : here) want.push_back(p->local_name());
        if (DictKeys(*f->root()) != want) diff(name, absl::StrCat("keys are not [", absl::StrJoin(want, ", "), "]"));
        for (const ModelParam* p : here) {
          auto got = TensorAt(*f, f->root()->DictGet(p->local_name()), p->local_name());
          if (!got.ok()) continue;
          const bool trainable = p->role().empty() || p->role() == "trainable";
          UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(*p, trainable ? "fp32" : "lp", rank));
          UCP_ASSIGN_OR_RETURN(torch::Tensor want_t, trainable ? torch::Cast(slice, info.lp_dtype) : slice);
          if (!got->BitwiseEqual(want_t)) {
            diff(name, absl::StrCat("'", p->local_name(), "' is not tp slice ", rank, " of '", p->name(), "'"));
          }
        }
      }
    }
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(dir));
    int layer_files = 0;
    for (const auto& f : files) layer_files += absl::StartsWith(f, "layer_");
    if (layer_files != spec.module_layers_size() * t.tp()) {
      diff(dir, absl::StrCat(layer_files, " layer files, expected one per module layer and tp rank (",
                             spec.module_layers_size() * t.tp(), ")"));
    }
  }
  return absl::OkStatus();
}

// The bytes of elements [lo, lo + n) of `t` flattened, zero past its end
// (DeepSpeed's zero-padded partitions).
std::string PaddedRange(const torch::Tensor& t, int64_t lo, int64_t n) {
  const std::string all = t.ContiguousBytes();
  const size_t item = t.numel() > 0 ? all.size() / static_cast<size_t>(t.numel()) : 4;
  std::string out(static_cast<size_t>(n) * item, '\0');
  for (int64_t i = 0; i < n && lo + i < t.numel(); ++i) {
    std::memcpy(&out[i * item], &all[(lo + i) * item], item);
  }
  return out;
}

std::string Concat(const torch::TorchFile& f, const std::vector<const Value*>& values) {
  std::string out;
  for (const Value* v : values) {
    auto t = v != nullptr ? f.GetTensor(*v) : absl::StatusOr<torch::Tensor>(absl::NotFoundError(""));
    if (t.ok()) out += t->ContiguousBytes();
  }
  return out;
}

// (e) at ZeRO-3 (stage3.py _rigid_state_dict, engine.py _save_zero_checkpoint
// and _save_checkpoint): per dp rank d, each param partitioned into
// ceil(numel / dp) elements, rank d holding [d * part, (d + 1) * part) zero
// padded; the rank's fp32 flat groups (and each Adam state) are its
// partitions of the trainable params in flatten order, whatever the
// sub-groups; frozen params' partitions in frozen_param_fragments, their
// shapes in frozen_param_shapes (module order); module entries empty but
// buffers; shared_params on rank 0.
absl::Status CheckLayoutZero3(const CaseRunner& r, const std::string& dir, const Topology& t,
                              const std::string& version, std::vector<std::string>& diffs) {
  const SyntheticModelState& m = r.model();
  const ModelSpec& spec = r.c().model();
  const int dp = t.dp();
  auto diff = [&](const std::string& file, const std::string& what) {
    if (diffs.size() < 20) diffs.push_back(absl::StrCat(file, ": ", what));
  };
  auto part = [&](int64_t numel) { return (numel + dp - 1) / dp; };
  for (int d = 0; d < dp; ++d) {
    const std::string mname = absl::StrCat("zero_pp_rank_", d, "_mp_rank_00_model_states.pt");
    UCP_ASSIGN_OR_RETURN(auto mf, torch::TorchFile::Open(JoinPath(dir, mname)));
    const Value& root = *mf->root();
    const Value* v = root.DictGet("ds_version");
    if (v == nullptr || !v->is(Kind::kStr) || v->str() != version) diff(mname, absl::StrCat("ds_version is not ", version));
    const Value* w = root.DictGet("dp_world_size");
    if (w == nullptr || !w->is(Kind::kInt) || w->int_value() != dp) diff(mname, absl::StrCat("dp_world_size is not ", dp));
    const Value* fshapes = root.DictGet("frozen_param_shapes");
    const Value* frags = root.DictGet("frozen_param_fragments");
    std::vector<std::string> frozen;
    for (const ModelParam& p : spec.param()) {
      if (p.role() == "frozen") frozen.push_back(p.name());
    }
    if (fshapes == nullptr || !fshapes->is(Kind::kDict) || DictKeys(*fshapes) != frozen) {
      diff(mname, absl::StrCat("frozen_param_shapes does not list [", absl::StrJoin(frozen, ", "), "]"));
    }
    for (const ModelParam& p : spec.param()) {
      if (p.role() != "frozen" || frags == nullptr || !frags->is(Kind::kDict)) continue;
      UCP_ASSIGN_OR_RETURN(torch::Tensor lp, m.Tensor(p.name(), "lp"));
      const int64_t n = part(lp.numel());
      const Value* fv = frags->DictGet(p.name());
      auto got = fv != nullptr ? mf->GetTensor(*fv) : absl::StatusOr<torch::Tensor>(absl::NotFoundError(""));
      if (!got.ok() || got->sizes() != std::vector<int64_t>{n} || got->dtype() != lp.dtype() ||
          got->ContiguousBytes() != PaddedRange(lp, d * n, n)) {
        diff(mname, absl::StrCat("frozen_param_fragments['", p.name(), "'] is not rank ", d, "'s ", n,
                                 " elements of it, zero padded"));
      }
    }
    const Value* module = root.DictGet("module");
    std::vector<std::string> names;
    for (const ModelParam& p : spec.param()) names.push_back(p.name());
    if (module == nullptr || !module->is(Kind::kDict) || DictKeys(*module) != names) {
      diff(mname, "module does not list the model's tensors in module order");
    } else {
      for (const ModelParam& p : spec.param()) {
        auto got = TensorAt(*mf, module->DictGet(p.name()), p.name());
        if (!got.ok()) continue;
        if (p.role() == "buffer") {
          UCP_ASSIGN_OR_RETURN(torch::Tensor lp, m.Tensor(p.name(), "lp"));
          if (!got->BitwiseEqual(lp)) diff(mname, absl::StrCat("module['", p.name(), "'] is not the buffer"));
        } else if (got->numel() != 0) {
          diff(mname, absl::StrCat("module['", p.name(), "'] is not empty (a ZeRO-3 param is partitioned)"));
        }
      }
    }
    const Value* shared = root.DictGet("shared_params");
    size_t tied = 0;
    for (const ModelParam& p : spec.param()) {
      if (p.role() != "tied") continue;
      ++tied;
      const Value* o = shared != nullptr && shared->is(Kind::kDict) ? shared->DictGet(p.name()) : nullptr;
      if (d == 0 && (o == nullptr || !o->is(Kind::kStr) || o->str() != p.tied_key())) {
        diff(mname, absl::StrCat("shared_params does not map '", p.name(), "' to '", p.tied_key(), "'"));
      }
    }
    if (shared == nullptr || !shared->is(Kind::kDict) || shared->dict_items().size() != (d == 0 ? tied : 0)) {
      diff(mname, d == 0 ? "shared_params is not the tied aliases" : "shared_params is not {} (rank 0 only)");
    }

    // engine.py _get_zero_ckpt_prefix: bf16_ for every bf16 job, whatever the stage.
    const std::string oname =
        absl::StrCat(spec.lp_dtype() == "bf16" ? "bf16_" : "", "zero_pp_rank_", d, "_mp_rank_00_optim_states.pt");
    UCP_ASSIGN_OR_RETURN(auto of, torch::TorchFile::Open(JoinPath(dir, oname)));
    const Value* osd = of->root()->DictGet("optimizer_state_dict");
    const Value* flat = osd != nullptr ? osd->DictGet("fp32_flat_groups") : nullptr;
    const Value* inner = osd != nullptr ? osd->DictGet("optimizer_state_dict") : nullptr;
    const Value* states = inner != nullptr ? inner->DictGet("state") : nullptr;
    if (flat == nullptr || !flat->is(Kind::kList) || states == nullptr || !states->is(Kind::kDict)) {
      diff(oname, "no optimizer_state_dict.fp32_flat_groups list and optimizer_state_dict.state dict");
      continue;
    }
    std::map<std::string, std::string> want;
    for (const state::ParamState& ps : m.info().params) {
      if (!ps.trainable()) continue;
      for (const std::string s : {"fp32", "exp_avg", "exp_avg_sq"}) {
        UCP_ASSIGN_OR_RETURN(torch::Tensor full, m.Tensor(ps.name, s));
        const int64_t n = part(full.numel());
        want[s] += PaddedRange(full, d * n, n);
      }
    }
    std::vector<const Value*> fp32s, avg, avg_sq;
    for (const auto& g : flat->items()) fp32s.push_back(g.get());
    for (size_t i = 0; i < flat->items().size(); ++i) {
      const Value* st = states->DictGet(Value::Int(static_cast<int64_t>(i)));
      avg.push_back(st != nullptr ? st->DictGet("exp_avg") : nullptr);
      avg_sq.push_back(st != nullptr ? st->DictGet("exp_avg_sq") : nullptr);
    }
    if (Concat(*of, fp32s) != want["fp32"]) diff(oname, "fp32_flat_groups are not the rank's fp32 partitions in order");
    if (Concat(*of, avg) != want["exp_avg"]) diff(oname, "exp_avg of the sub-groups is not the rank's partitions");
    if (Concat(*of, avg_sq) != want["exp_avg_sq"]) diff(oname, "exp_avg_sq of the sub-groups is not the rank's partitions");
  }
  return absl::OkStatus();
}

// (e) at ZeRO-0 (engine.py _save_checkpoint without ZeRO): one
// mp_rank_00_model_states.pt with the module's state dict (trainable weights
// as their masters cast to lp, frozen params and buffers as they are, a tied
// alias the owner's tensor), param_shapes None, and the client optimizer's
// state_dict: state {i: Adam states} with i numbering the trainable params
// group by group in module order, param_groups' params those indices; for
// bf16 / fp16 FP16_UnfusedOptimizer's wrapper with fp32_groups (the masters).
absl::Status CheckLayoutZero0(const CaseRunner& r, const std::string& dir, const Topology& t,
                              const std::string& version, std::vector<std::string>& diffs) {
  const SyntheticModelState& m = r.model();
  const ModelSpec& spec = r.c().model();
  const std::string name = deepspeed::MpRankFileName(0);
  auto diff = [&](const std::string& what) {
    if (diffs.size() < 20) diffs.push_back(absl::StrCat(name, ": ", what));
  };
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(dir));
  for (const std::string& f : files) {
    if (f != name && f != kUcpOutputMarker) diff(absl::StrCat("a file ", f, " beside it"));
  }
  UCP_ASSIGN_OR_RETURN(auto mf, torch::TorchFile::Open(JoinPath(dir, name)));
  const Value& root = *mf->root();
  const Value* v = root.DictGet("ds_version");
  if (v == nullptr || !v->is(Kind::kStr) || v->str() != version) diff(absl::StrCat("ds_version is not ", version));
  const Value* w = root.DictGet("dp_world_size");
  if (w == nullptr || !w->is(Kind::kInt) || w->int_value() != t.dp()) diff(absl::StrCat("dp_world_size is not ", t.dp()));
  const Value* shapes = root.DictGet("param_shapes");
  if (shapes == nullptr || !shapes->is(Kind::kNone)) diff("param_shapes is not None");
  const Value* module = root.DictGet("module");
  std::vector<std::string> names;
  for (const ModelParam& p : spec.param()) names.push_back(p.name());
  if (module == nullptr || !module->is(Kind::kDict) || DictKeys(*module) != names) {
    diff("module does not list the model's tensors in module order");
  } else {
    for (const ModelParam& p : spec.param()) {
      auto got = TensorAt(*mf, module->DictGet(p.name()), p.name());
      if (!got.ok()) continue;
      torch::Tensor want;
      if (p.role() == "trainable" || p.role().empty()) {
        UCP_ASSIGN_OR_RETURN(torch::Tensor fp32, m.Tensor(p.name(), "fp32"));
        UCP_ASSIGN_OR_RETURN(want, torch::Cast(fp32, m.info().lp_dtype));
      } else {
        UCP_ASSIGN_OR_RETURN(want, m.Tensor(p.name(), "lp"));
      }
      if (!got->BitwiseEqual(want)) diff(absl::StrCat("module['", p.name(), "'] is not the model's lp weight"));
    }
  }
  const Value* opt = root.DictGet("optimizer");
  if (opt == nullptr || !opt->is(Kind::kDict)) {
    diff("no optimizer state dict");
    return absl::OkStatus();
  }
  const bool mixed = m.info().lp_dtype != torch::DType::kFloat32;
  const Value* osd = mixed ? opt->DictGet("optimizer_state_dict") : opt;
  const Value* states = osd != nullptr ? osd->DictGet("state") : nullptr;
  const Value* groups = osd != nullptr ? osd->DictGet("param_groups") : nullptr;
  const Value* fp32_groups = mixed ? opt->DictGet("fp32_groups") : nullptr;
  if (states == nullptr || !states->is(Kind::kDict) || groups == nullptr || !groups->is(Kind::kList) ||
      static_cast<int>(groups->items().size()) != m.info().num_groups || (mixed && fp32_groups == nullptr)) {
    diff(mixed ? "optimizer is not FP16_UnfusedOptimizer's (optimizer_state_dict, fp32_groups)"
               : "optimizer is not a torch optimizer's state_dict (state, param_groups per group)");
    return absl::OkStatus();
  }
  int64_t index = 0;
  for (int g = 0; g < m.info().num_groups; ++g) {
    std::vector<int64_t> want_params;
    int j = 0;
    for (const ModelParam& p : spec.param()) {
      if (p.group() != g || !(p.role() == "trainable" || p.role().empty())) continue;
      want_params.push_back(index);
      const Value* st = states->DictGet(Value::Int(index));
      for (const std::string s : {"exp_avg", "exp_avg_sq"}) {
        UCP_ASSIGN_OR_RETURN(torch::Tensor full, m.Tensor(p.name(), s));
        auto got = st != nullptr ? TensorAt(*mf, st->DictGet(s), s) : absl::StatusOr<torch::Tensor>(absl::NotFoundError(""));
        if (!got.ok() || !got->BitwiseEqual(full)) diff(absl::StrCat("optimizer state ", index, ".", s, " is not '", p.name(), "'s"));
      }
      if (mixed) {
        UCP_ASSIGN_OR_RETURN(torch::Tensor fp32, m.Tensor(p.name(), "fp32"));
        const Value* list = fp32_groups->is(Kind::kList) && g < static_cast<int>(fp32_groups->items().size())
                                ? fp32_groups->items()[g].get()
                                : nullptr;
        const Value* item = list != nullptr && list->is(Kind::kList) && j < static_cast<int>(list->items().size())
                                ? list->items()[j].get()
                                : nullptr;
        auto got = TensorAt(*mf, item, "fp32_groups");
        if (!got.ok() || !got->BitwiseEqual(fp32)) diff(absl::StrCat("fp32_groups[", g, "][", j, "] is not '", p.name(), "'s master"));
      }
      ++index;
      ++j;
    }
    const Value* params = groups->items()[g]->DictGet("params");
    std::vector<int64_t> got_params;
    if (params != nullptr && params->is(Kind::kList)) {
      for (const auto& x : params->items()) got_params.push_back(x->is(Kind::kInt) ? x->int_value() : -1);
    }
    if (got_params != want_params) diff(absl::StrCat("param_groups[", g, "].params is not [", absl::StrJoin(want_params, ", "), "]"));
  }
  return absl::OkStatus();
}

absl::Status SaveMatchesDeepSpeedLayout(CaseRunner& r) {
  const Property p = Property::kSaveMatchesDeepSpeedLayout;
  const Topology topologies[2] = {r.c().source(), r.c().target()};
  for (int i = 0; i < 2; ++i) {
    UCP_ASSIGN_OR_RETURN(std::string zero, i == 0 ? r.SaveT1() : r.SaveT2(),
                         _.Prepend(absl::StrCat("save at T", i + 1, ": ")));
    const std::string version = i == 0 ? r.V1() : r.V2();
    std::vector<std::string> diffs;
    const int stage = i == 0 ? SourceZeroStage(r.c()) : TargetZeroStage(r.c());
    if (stage == 3) {
      UCP_RETURN_IF_ERROR(CheckLayoutZero3(r, zero, topologies[i], version, diffs));
    } else if (stage == 0) {
      UCP_RETURN_IF_ERROR(CheckLayoutZero0(r, zero, topologies[i], version, diffs));
    } else {
      UCP_RETURN_IF_ERROR(CheckLayout(r, zero, topologies[i], version, diffs));
    }
    if (!diffs.empty()) {
      return Violation(p, absl::StrCat("save(M, T", i + 1, ") is not laid out as DeepSpeed ", version,
                                       " lays it out:\n  ", Joined(diffs)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* PropertyLetter(Property p) {
  switch (p) {
    case Property::kConvertIsTopologyFree: return "a";
    case Property::kReshardMatchesSave: return "b";
    case Property::kDirectReshardMatchesTwoStep: return "c";
    case Property::kCorruptionsAreCaught: return "d";
    case Property::kSaveMatchesDeepSpeedLayout: return "e";
  }
  return "?";
}

const char* PropertyName(Property p) {
  switch (p) {
    case Property::kConvertIsTopologyFree: return "convert(save(M, T)) is the same for every T and equals M";
    case Property::kReshardMatchesSave: return "reshard(convert(save(M, T1)), T2) == save(M, T2)";
    case Property::kDirectReshardMatchesTwoStep: return "ZeRO -> ZeRO reshard == the two-step path";
    case Property::kCorruptionsAreCaught: return "corruptions give the right error";
    case Property::kSaveMatchesDeepSpeedLayout: return "save(M, T) is laid out as its DeepSpeed version lays it out";
  }
  return "?";
}

std::vector<Property> AllProperties() {
  return {Property::kConvertIsTopologyFree, Property::kReshardMatchesSave, Property::kDirectReshardMatchesTwoStep,
          Property::kCorruptionsAreCaught, Property::kSaveMatchesDeepSpeedLayout};
}

absl::StatusOr<Property> ParseProperty(const std::string& s) {
  for (Property p : AllProperties()) {
    if (s == PropertyLetter(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown property '", s, "' (a, b, c, d, e)"));
}

absl::Status CheckProperty(Property p, const GoldenCase& c, const std::string& work) {
  return CheckProperties({p}, c, work);
}

absl::Status CheckProperties(const std::vector<Property>& properties, const GoldenCase& c, const std::string& work) {
  Scratch scratch(work);
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<CaseRunner> r, CaseRunner::Make(c, scratch.dir()),
                       _.Prepend("building the synthetic model: "));
  for (Property p : properties) {
    absl::Status s;
    switch (p) {
      case Property::kConvertIsTopologyFree: s = ConvertIsTopologyFree(*r); break;
      case Property::kReshardMatchesSave: s = ReshardMatchesSave(*r); break;
      case Property::kDirectReshardMatchesTwoStep: s = DirectReshardMatchesTwoStep(*r); break;
      case Property::kCorruptionsAreCaught: s = CorruptionsAreCaught(*r, scratch.Path("damaged")); break;
      case Property::kSaveMatchesDeepSpeedLayout: s = SaveMatchesDeepSpeedLayout(*r); break;
    }
    // ucp failing on a valid model is a violation too: say which property hit it.
    if (!s.ok() && !absl::StartsWith(s.message(), "property (")) {
      s = Violation(p, absl::StrCat("ucp failed on a valid checkpoint: ", s.ToString()));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// Two checkpoint folders of the same model saved with and without AutoTP:
// the same files, every .pt tree equal (tensors bitwise, keys in order) but
// for the AutoTP metadata (universal_checkpoint_info, ds_config's
// tensor_parallel); other files byte for byte.
absl::StatusOr<std::vector<std::string>> DiffsButAutoTpMetadata(const std::string& a, const std::string& b) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> fa, testing::ListFilesRecursive(a));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> fb, testing::ListFilesRecursive(b));
  if (fa != fb) {
    return std::vector<std::string>{absl::StrCat("files differ: [", Joined(fa), "] vs [", Joined(fb), "]")};
  }
  auto strip = [](const Value& root) {
    ValuePtr out = Without(root, {"universal_checkpoint_info"});
    if (const Value* c = root.DictGet("ds_config"); c != nullptr && c->is(Kind::kDict)) {
      out->DictSet(Value::Str("ds_config"), Without(*c, {"tensor_parallel"}));
    }
    return out;
  };
  std::vector<std::string> diffs;
  for (const std::string& rel : fa) {
    if (!absl::EndsWith(rel, ".pt")) {
      UCP_ASSIGN_OR_RETURN(std::string x, ReadFileToString(JoinPath(a, rel)));
      UCP_ASSIGN_OR_RETURN(std::string y, ReadFileToString(JoinPath(b, rel)));
      if (x != y) diffs.push_back(absl::StrCat(rel, ": bytes differ"));
      continue;
    }
    UCP_ASSIGN_OR_RETURN(auto x, torch::TorchFile::Open(JoinPath(a, rel)));
    UCP_ASSIGN_OR_RETURN(auto y, torch::TorchFile::Open(JoinPath(b, rel)));
    for (const std::string& d : testing::CompareTrees(*x, *strip(*x->root()), *y, *strip(*y->root()))) {
      diffs.push_back(absl::StrCat(rel, ": ", d));
    }
  }
  return diffs;
}

}  // namespace

absl::Status CheckAutoTpMatchesMegatron(const GoldenCase& c, const std::string& work) {
  if (!c.model().autotp()) return absl::InvalidArgumentError("not an AutoTP case (model_gen.h GenAutoTpCase)");
  Scratch scratch(work);
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<CaseRunner> a, CaseRunner::Make(c, scratch.Path("autotp")),
                       _.Prepend("building the AutoTP model: "));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<CaseRunner> m, CaseRunner::Make(MegatronTwin(c), scratch.Path("megatron")),
                       _.Prepend("building its Megatron-style twin: "));
  const char* kWhat = "property (f) AutoTpMatchesMegatron violated: ";
  for (auto [from, to, from_name, to_name] : {std::make_tuple(a.get(), m.get(), "AutoTP", "Megatron-style"),
                                              std::make_tuple(m.get(), a.get(), "Megatron-style", "AutoTP")}) {
    UCP_ASSIGN_OR_RETURN(std::string t1, from->SaveT1(), _.Prepend(absl::StrCat(from_name, " save at T1: ")));
    UCP_ASSIGN_OR_RETURN(std::string resharded, from->Reshard(t1, "direct_t1_to_t2", c.target(), from->V2()),
                         _.Prepend(absl::StrCat("reshard of the ", from_name, " save to T2: ")));
    UCP_ASSIGN_OR_RETURN(std::string t2, to->SaveT2(), _.Prepend(absl::StrCat(to_name, " save at T2: ")));
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> diffs, DiffsButAutoTpMetadata(resharded, t2));
    if (!diffs.empty()) {
      return absl::InternalError(absl::StrCat(kWhat, "reshard(save(", from_name, " M, T1), T2) differs from save(",
                                              to_name, " M, T2) but for the AutoTP metadata:\n  ", Joined(diffs)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FolderByteDiffs(const std::string& a, const std::string& b,
                                                        const std::vector<std::string>& ignore) {
  testing::CompareOptions o;
  o.byte_identical = true;
  o.max_differences = 1000;
  return testing::CompareFolders(a, b, ignore, o);
}

// --- fuzzing ---

std::string DefaultScratchDir(const std::string& name) {
  // Thousands of small checkpoints: memory is several times faster than disk.
  std::string base = "/dev/shm";
  if (!IsDirectory(base) || access(base.c_str(), W_OK) != 0) {
    const char* t = std::getenv("TEST_TMPDIR");
    if (t == nullptr || *t == '\0') t = std::getenv("TMPDIR");
    base = t != nullptr && *t != '\0' ? t : "/tmp";
  }
  return JoinPath(base, absl::StrCat("ucp_", name, "_", getpid()));
}

void FuzzDistribution::Add(const GoldenCase& c) {
  ++cases;
  for (const Topology& t : {c.source(), c.target()}) {
    ++counts["tp"][absl::StrCat(t.tp())];
    ++counts["pp"][absl::StrCat(t.pp())];
    ++counts["dp"][absl::StrCat(t.dp())];
  }
  const ModelSpec& m = c.model();
  ++counts["style"][m.style()];
  ++counts["rules source"][m.rules_source() == kCheckpointInfoSource && m.preset() == "none"
                                ? "checkpoint_info(--preset=none)"
                                : m.rules_source()];
  ++counts["module"][m.pipeline() ? "pipeline" : "plain"];
  {
    const std::string v1 = c.ds_version().empty() ? "0.14.4" : c.ds_version();
    const std::string v2 = c.target_ds_version().empty() ? v1 : c.target_ds_version();
    ++counts["ds_version (T1)"][v1];
    ++counts["ds_version (T2)"][v2];
    auto convention = [&](const std::string& v) {
      if (c.optimizer_layout() == "bf16") return "last(bf16)";
      return OracleVersion(v) >= std::make_tuple(0, 16, 4) ? "per-rank" : "last";
    };
    ++counts["paddings T1->T2"][absl::StrCat(convention(v1), "->", convention(v2))];
    ++counts["numpy"][c.numpy2() ? "2 (numpy._core)" : "1"];
  }
  {
    const int s1 = SourceZeroStage(c), s2 = TargetZeroStage(c);
    ++counts["optimizer"][absl::StrCat(c.optimizer_layout(), "/", m.lp_dtype(), "/zero", s1,
                                       s1 != s2 ? absl::StrCat("->zero", s2) : "")];
  }
  for (const auto& f : CaseFeatures(c)) ++counts["features (cases)"][f];
  for (const ModelParam& p : m.param()) {
    std::string kind = tp::MergeKindName(p.rule().kind());
    if (p.rule().kind() == SUB_PARAMS) kind = p.rule().sub_param_shape().dim_size() > 0 ? "sub_params_gqa" : "sub_params_2";
    ++counts["param kinds (params)"][kind];
  }
  if (m.pipeline()) ++counts["partition method"][m.partition_method().empty() ? "(default)" : m.partition_method()];
  // Property (d) nudges a replicated param's tp copy when T1 has tp copies.
  bool replicated = false;
  for (const ModelParam& p : m.param()) {
    replicated |= p.rule().kind() == REPLICATED && (p.role().empty() || p.role() == "trainable") && p.tied_key().empty();
  }
  ++counts["(d) replicated check"][replicated && c.source().tp() >= 2 ? "applies" : "n/a (tp=1 or none)"];
}

std::string FuzzDistribution::ToString() const {
  std::string out = absl::StrCat("distribution over ", cases, " cases (tp, pp, dp count both topologies of a case):\n");
  for (const auto& [dim, values] : counts) {
    std::vector<std::pair<std::string, int>> v(values.begin(), values.end());
    // Numbers in numeric order.
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      if (a.first.size() != b.first.size() && std::isdigit(a.first[0]) && std::isdigit(b.first[0])) {
        return a.first.size() < b.first.size();
      }
      return a.first < b.first;
    });
    std::vector<std::string> parts;
    for (const auto& [k, n] : v) parts.push_back(absl::StrCat(k, ":", n));
    absl::StrAppendFormat(&out, "  %-20s %s\n", dim, absl::StrJoin(parts, "  "));
  }
  return out;
}

FuzzReport RunFuzz(const FuzzOptions& options) {
  FuzzReport report;
  const std::string work = options.workdir.empty() ? DefaultScratchDir("fuzz") : options.workdir;
  bool failing = false;  // after the first failure RapidCheck only shrinks
  std::string last_failure;
  GoldenCase last_failed_case;
  auto property = [&]() {
    const GoldenCase c = *GenCase(options.gen);
    if (!failing) report.distribution.Add(c);
    absl::Status s = CheckProperties(options.properties, c, JoinPath(work, "case"));
    if (s.ok() && options.case_check) s = options.case_check(c);
    if (!s.ok()) {
      failing = true;
      last_failure = std::string(s.message());
      last_failed_case = c;
      RC_FAIL(std::string(s.message()));
    }
  };
  rc::detail::TestParams params;
  params.seed = options.seed;
  params.maxSuccess = options.cases;
  params.maxSize = options.max_size;
  rc::detail::TestMetadata metadata;
  metadata.id = "ucp_fuzz";
  metadata.description = "ucp conformance properties";
  const rc::detail::TestResult result = rc::detail::checkTestable(property, metadata, params);
  (void)RemoveTree(work);
  if (result.template is<rc::detail::SuccessResult>()) {
    report.passed = true;
    report.cases_passed = result.template get<rc::detail::SuccessResult>().numSuccess;
    return report;
  }
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  if (result.template is<rc::detail::FailureResult>()) {
    const auto& f = result.template get<rc::detail::FailureResult>();
    report.cases_passed = f.numSuccess;
    // The last failing run RapidCheck made is the shrunk case.
    report.failure = last_failure;
    std::string text;
    google::protobuf::TextFormat::PrintToString(last_failed_case, &text);
    report.shrunk_case = text;
  } else {
    report.failure = os.str();
  }
  report.replay = absl::StrCat("ucp_conformance fuzz --seed=", options.seed, " --cases=", options.cases,
                               " (or RC_PARAMS=\"seed=", options.seed, "\" for the tests)");
  return report;
}

}  // namespace ucp::conformance
