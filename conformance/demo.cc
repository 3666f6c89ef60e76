#include "conformance/demo.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "conformance/neox_model.h"
#include "conformance/synthetic_state.h"
#include "ops/convert.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "ops/reshard.h"
#include "tp/merge.h"
#include "tp/tensor_plan.h"

namespace ucp::conformance {
namespace {

std::string Bytes(int64_t n) {
  if (n >= 1 << 20) return absl::StrFormat("%.1f MB", n / 1048576.0);
  if (n >= 1 << 10) return absl::StrFormat("%.1f kB", n / 1024.0);
  return absl::StrCat(n, " bytes");
}

// The expected tensor at tp=1: the model's full tensor, vocabulary rows
// padded with zeros as the tp=1 model pads them.
absl::StatusOr<tp::TensorPlan> ExpectedAtTp1(const torch::Tensor& full, const state::ParamState& p,
                                            const state::ModelInfo& info) {
  tp::TensorPlan plan = tp::TensorPlan::FromTensor(full);
  if (p.rule.kind() == VOCAB) {
    return plan.PadDim0(tp::PaddedVocabSize(p.full_shape[0], info.make_vocab_size_divisible_by, 1));
  }
  return plan;
}

}  // namespace

absl::StatusOr<DemoReport> RunDemo(const DemoOptions& options) {
  std::string work = options.workdir;
  bool remove = false;
  if (work.empty()) {
    char tmpl[] = "/tmp/ucp_demo_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return absl::InternalError("cannot create a folder under /tmp");
    work = tmpl;
    remove = !options.keep;
  }
  DemoReport report;
  const NeoxShape shape;  // the DeepSpeed fixtures' model
  const ModelSpec spec = NeoxSpec(shape);
  UCP_ASSIGN_OR_RETURN(auto model, SyntheticModelState::Make(spec, /*seed=*/4, /*zero_stage=*/1,
                                                             state::OptimizerKind::kZero));
  const state::ModelInfo& info = model->info();
  const std::string tag = absl::StrCat("global_step", model->Step(0));
  std::string out = absl::StrFormat(
      "ucp demo: a GPT-NeoX-style model (hidden %d, %d transformer layers, vocab %d; %d params in %d optimizer "
      "groups)\n",
      shape.hidden, shape.layers, shape.vocab, info.params.size(), info.num_groups);

  // 1. The tp=2 ZeRO-1 checkpoint, as DeepSpeed 0.14.4 saves it.
  const state::Topology source{2, 1, 1};
  report.source = JoinPath(JoinPath(work, "neox-tp2"), tag);
  UCP_ASSIGN_OR_RETURN(ops::WrittenCheckpoint saved, SaveZero(*model, report.source, source, options.num_threads),
                       _.Prepend("saving the generated model: "));
  absl::StrAppendFormat(&out,
                        "1. saved it as DeepSpeed 0.14.4 saves a %s ZeRO-1 PipelineModule checkpoint (no "
                        "universal_checkpoint_info patterns, as GPT-NeoX): %d files, %s\n   %s\n",
                        source.ToString(), saved.files, Bytes(saved.bytes), report.source);

  // 2. Universal checkpoint, no extra options.
  ops::ConvertOptions co;
  co.input_folder = report.source;
  co.output_folder = report.source + "_universal";
  co.state.num_threads = options.num_threads;
  co.write.num_threads = options.num_threads;
  UCP_ASSIGN_OR_RETURN(ops::ConvertResult converted, ops::Convert(co), _.Prepend("converting: "));
  report.universal = co.output_folder;
  absl::StrAppendFormat(&out, "2. converted it to a universal checkpoint: %d params, %d files, %s\n   %s\n",
                        converted.stats.params, converted.stats.files, Bytes(converted.stats.bytes), report.universal);
  for (absl::string_view line : absl::StrSplit(converted.summary, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, "     ", line, "\n");
  }

  // 3. tp=1.
  ops::ReshardOptions ro;
  ro.input_folder = report.universal;
  ro.output_folder = JoinPath(JoinPath(work, "neox-tp1"), tag);
  ro.write.target = state::Topology{1, 1, 1};
  ro.write.num_threads = options.num_threads;
  ro.verify_checksums = true;
  UCP_ASSIGN_OR_RETURN(ops::ReshardResult resharded, ops::Reshard(ro), _.Prepend("resharding: "));
  report.target = ro.output_folder;
  absl::StrAppendFormat(&out, "3. resharded the universal checkpoint to %s: %d files, %s\n   %s\n",
                        ro.write.target.ToString(), resharded.write.files, Bytes(resharded.write.bytes),
                        report.target);

  // 4. Every tensor of the tp=1 checkpoint against the generated model.
  UCP_ASSIGN_OR_RETURN(auto target, deepspeed_zero::ZeroCheckpoint::Open(report.target));
  int64_t counts[4] = {0, 0, 0, 0};  // weights, fp32, exp_avg, exp_avg_sq
  const std::string states[3] = {"fp32", "exp_avg", "exp_avg_sq"};
  for (const state::ParamState& p : info.params) {
    const deepspeed::ZeroParam* zp = target->FindParam(p.name);
    if (p.trainable() && zp == nullptr) {
      report.mismatches.push_back(absl::StrCat(p.name, ": not in the tp=1 checkpoint"));
      continue;
    }
    for (int s = 0; s < 3 && p.trainable(); ++s) {
      UCP_ASSIGN_OR_RETURN(torch::Tensor full, model->Tensor(p.name, states[s]));
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan want, ExpectedAtTp1(full, p, info));
      UCP_ASSIGN_OR_RETURN(std::vector<torch::Tensor> pieces, target->SlicePieces(*zp, zp->stages[0], 0, states[s]));
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan got, tp::TensorPlan::FromPieces(torch::DType::kFloat32, zp->tp_shapes[0], pieces));
      UCP_ASSIGN_OR_RETURN(bool eq, tp::TensorPlan::BitwiseEqual(got, want));
      if (eq) {
        ++counts[s + 1];
      } else {
        report.mismatches.push_back(absl::StrCat(p.name, " ", states[s], " differs"));
      }
    }
    // The module weight (a cast of the fp32 master for trainable params).
    for (const deepspeed_zero::ModuleEntry& e : target->module_entries()) {
      if (e.name != p.name) continue;
      torch::Tensor full;
      if (p.trainable()) {
        UCP_ASSIGN_OR_RETURN(torch::Tensor fp32, model->Tensor(p.name, "fp32"));
        UCP_ASSIGN_OR_RETURN(full, torch::Cast(fp32, p.lp_dtype));
      } else {
        UCP_ASSIGN_OR_RETURN(full, model->Tensor(p.name, "lp"));
      }
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan want, ExpectedAtTp1(full, p, info));
      UCP_ASSIGN_OR_RETURN(torch::Tensor got, target->ModuleTensor(e, 0));
      UCP_ASSIGN_OR_RETURN(bool eq, tp::TensorPlan::BitwiseEqual(tp::TensorPlan::FromTensor(got), want));
      if (eq) {
        ++counts[0];
      } else {
        report.mismatches.push_back(absl::StrCat(e.name, " weight in layer ", e.layer, " differs"));
      }
    }
  }
  report.verified_tensors = counts[0] + counts[1] + counts[2] + counts[3];
  absl::StrAppendFormat(&out,
                        "4. verified the tp=1 checkpoint against the generated model: %d weights, %d fp32 masters, "
                        "%d exp_avg, %d exp_avg_sq: %s\n",
                        counts[0], counts[1], counts[2], counts[3],
                        report.mismatches.empty() ? "all bitwise equal"
                                                  : absl::StrCat(report.mismatches.size(), " DIFFER"));
  for (const auto& m : report.mismatches) absl::StrAppend(&out, "   ", m, "\n");
  if (remove) {
    (void)RemoveTree(work);
    absl::StrAppend(&out, "(the checkpoints were written under ", work, " and removed; --workdir keeps them)\n");
  }
  report.summary = out;
  return report;
}

}  // namespace ucp::conformance
