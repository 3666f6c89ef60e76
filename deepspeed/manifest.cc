#include "deepspeed/manifest.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace ucp::deepspeed {

using state::ModelInfo;
using state::OptimizerKind;
using state::OptimizerKindName;
using state::ParamState;
using state::TensorRole;
using state::TensorRoleName;
using state::Topology;
namespace {

TensorRole RoleFromName(const std::string& role, bool frozen) {
  if (role == "buffer") return TensorRole::kBuffer;
  if (role == "tied") return TensorRole::kTied;
  if (role == "trainable") return TensorRole::kTrainable;
  if (role.empty() && !frozen) return TensorRole::kTrainable;
  return TensorRole::kFrozen;
}

}  // namespace

// ---- encode ----

void EncodeParam(const ParamState& p, Manifest::Param* mp) {
  mp->set_name(p.name);
  for (int64_t d : p.full_shape) mp->add_shape(d);
  mp->set_kind(p.rule.kind());
  mp->set_source(p.source);
  mp->set_rule(p.origin);
  mp->set_group(p.group);
  mp->set_frozen(p.role == TensorRole::kFrozen);
  mp->set_tied(!p.tied_key.empty() || !p.tied_layers.empty());
  mp->set_layer(p.layer);
  mp->set_local_name(p.local_name);
  for (int l : p.tied_layers) mp->add_tied_layer(l);
  mp->set_role(TensorRoleName(p.role));
  mp->set_lp_dtype(std::string(torch::DTypeName(p.lp_dtype)));
  mp->set_tied_key(p.tied_key);
  *mp->mutable_merge_rule() = p.rule;
  if (p.has_autotp_cut()) *mp->mutable_autotp_cut() = p.autotp_cut;
}

void EncodeLayout(const ModelInfo& info, Manifest* m) {
  *m->mutable_source_topology() = info.source_topology.ToProto();
  m->set_zero_stage(info.zero_stage);
  m->set_optimizer_layout(OptimizerKindName(info.optimizer_kind));
  m->set_pipeline(info.pipeline);
  m->set_num_layers(info.num_layers);
  for (int l : info.module_layers) m->add_module_layer(l);
  for (const auto& k : info.module_order) {
    Manifest::ModuleKey* mk = m->add_module_key();
    mk->set_layer(k.layer);
    mk->set_name(k.name);
  }
  m->set_lp_dtype(std::string(torch::DTypeName(info.lp_dtype)));
  m->set_original_vocab_size(info.original_vocab_size);
  m->set_make_vocab_size_divisible_by(info.make_vocab_size_divisible_by);
  m->set_partition_method(info.partition_method);
  for (const auto& k : info.state_keys) m->add_state_key(k);
  for (const auto& k : info.scalar_keys) m->add_scalar_key(k);
  m->set_num_groups(info.num_groups);
  m->set_bf16_file_prefix(info.bf16_file_prefix);
}

Manifest ToManifest(const ModelInfo& info, const ManifestHeader& header) {
  Manifest m;
  m.set_ucp_version(kUcpVersion);
  m.set_source_folder(header.source_folder);
  m.set_source_kind(header.source_kind);
  EncodeLayout(info, &m);
  for (const ParamState& p : info.params) EncodeParam(p, m.add_param());
  return m;
}

// ---- decode ----

absl::StatusOr<ParamState> DecodeParam(const Manifest::Param& m) {
  ParamState p;
  p.name = m.name();
  p.full_shape.assign(m.shape().begin(), m.shape().end());
  {
    int64_t n = 1;
    for (int64_t d : p.full_shape) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 50)) {
        return absl::InvalidArgumentError(absl::StrCat("manifest param '", m.name(), "': shape [",
                                                       absl::StrJoin(p.full_shape, ", "),
                                                       "] is negative or has more than 2^50 elements"));
      }
    }
  }
  if (m.has_merge_rule()) {
    p.rule = m.merge_rule();
  } else {
    p.rule.set_pattern(m.name());
  }
  p.rule.set_kind(m.kind());
  if (m.has_autotp_cut()) p.autotp_cut = m.autotp_cut();
  p.source = m.source();
  p.origin = m.rule();
  p.group = m.group();
  p.role = RoleFromName(m.role(), m.frozen());
  p.layer = m.layer();
  p.local_name = m.local_name();
  p.tied_key = m.tied_key();
  p.tied_layers.assign(m.tied_layer().begin(), m.tied_layer().end());
  if (!m.lp_dtype().empty()) {
    UCP_ASSIGN_OR_RETURN(p.lp_dtype, torch::ParseDType(m.lp_dtype()),
                         _.Prepend(absl::StrCat("manifest param '", m.name(), "': ")));
  }
  return p;
}

absl::Status DecodeLayout(const Manifest& m, ModelInfo* info) {
  info->source_topology = Topology::FromProto(m.source_topology());
  info->zero_stage = m.zero_stage();
  info->optimizer_kind = m.optimizer_layout() == OptimizerKindName(OptimizerKind::kBf16) ? OptimizerKind::kBf16
                                                                                        : OptimizerKind::kZero;
  info->pipeline = m.pipeline();
  info->num_layers = m.num_layers();
  info->module_layers.assign(m.module_layer().begin(), m.module_layer().end());
  info->module_order.clear();
  for (const auto& k : m.module_key()) info->module_order.push_back({k.layer(), k.name()});
  if (!m.lp_dtype().empty()) {
    UCP_ASSIGN_OR_RETURN(info->lp_dtype, torch::ParseDType(m.lp_dtype()), _.Prepend("manifest lp_dtype: "));
  }
  info->original_vocab_size = m.original_vocab_size();
  info->make_vocab_size_divisible_by = m.make_vocab_size_divisible_by();
  info->partition_method = m.partition_method();
  info->state_keys.assign(m.state_key().begin(), m.state_key().end());
  info->scalar_keys.assign(m.scalar_key().begin(), m.scalar_key().end());
  info->num_groups = m.num_groups();
  info->bf16_file_prefix = m.bf16_file_prefix();
  return absl::OkStatus();
}

absl::StatusOr<ModelInfo> FromManifest(const Manifest& m) {
  ModelInfo info;
  UCP_RETURN_IF_ERROR(DecodeLayout(m, &info));
  for (const auto& mp : m.param()) {
    UCP_ASSIGN_OR_RETURN(ParamState p, DecodeParam(mp));
    info.params.push_back(std::move(p));
  }
  info.Reindex();
  return info;
}

}  // namespace ucp::deepspeed
