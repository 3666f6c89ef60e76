// RapidCheck generators of synthetic models and the topologies they are
// saved at, for the conformance properties (properties.h).
//
// A generated case (a GoldenCase: model, source topology T1, target T2,
// seed, ZeRO stage, optimizer layout) has:
//   - a PipelineModule (GPT-NeoX layer layout: embedding, optional param-less
//     module, transformer layers, optional function layer, final norm,
//     output layer or the embedding tied between the first and last stage)
//     or a plain nn.Module (ZeRO 1 or 2);
//   - names in GPT-NeoX, Megatron-DeepSpeed, Llama (HF) or savanna
//     (StripedHyena 2 / Evo 2) style; savanna blocks cycle through its
//     operators (hyena_se, hyena_mr, hyena, flash) with their filters, so
//     models hold 3-D and 4-D params split on dim 0 or dim 1 and names that
//     clash but for their rank (implicit_modal vs implicit_real_modal
//     filter.p / filter.R);
//   - params of every merge kind: replicated (norms, row-parallel biases,
//     buffers), averaged (BLOOM-style norms), column, row, vocab (padded by
//     make_vocab_size_divisible_by * tp), 2-chunk fused sub-params (swiglu),
//     uneven GQA q/k/v sub-params (SubparamShape);
//   - frozen params and buffers; partitioned params whose tp slices happen to
//     be equal (ModelParam.equal_slices), so that rules and not evidence must
//     decide them;
//   - the rules given to the converter as a --rules file, as DeepSpeed's
//     universal_checkpoint_info patterns, or by a preset the names follow
//     (named with --preset, or for savanna also detected: no rule flags);
//   - lp dtype fp32 / fp16 (ZeRO optimizer) or bf16 (BF16_Optimizer);
//   - the DeepSpeed version the source is saved as, 0.12 to 0.19.5 (its
//     layout: synthetic_state.h, SyntheticVersion), the version the target
//     is written for (--target_ds_version), numpy 1 or 2 names;
//   - a num_attention_heads every tp of the case divides;
//   - tp <= 8, pp <= 4 (<= the layers), dp <= 8, every partitioned dim
//     divisible by lcm(T1.tp, T2.tp) (and sub-params by it per sub-param);
//   - one case in CaseGenOptions::hf_one_in: a Hugging Face case
//     (GenHfCase below: tp = 1, transformers / peft names, frozen params,
//     tied embeddings, ZeRO stages 0-3 at both ends), of which one in
//     autotp_one_in is an AutoTP case (GenAutoTpCase below: hf-llama names
//     at tp 1-4, AutoTP's uneven widths, fused sub-params with
//     sub_param_shard_widths, DeepSpeed 0.18.9 / 0.19.5 / master).
// Everything is drawn with shrinkable generators, so a failing case shrinks
// towards fewer layers, fewer kinds, tp = pp = dp = 1 and small sizes.
//
// Example:
//   RC_GTEST_PROP(MyTest, Prop, ()) {
//     const GoldenCase c = *GenCase(CaseGenOptions());
//     ...
//   }
#ifndef UCP_CONFORMANCE_MODEL_GEN_H_
#define UCP_CONFORMANCE_MODEL_GEN_H_

#include <ostream>
#include <string>
#include <vector>

#include "proto/ucp.pb.h"
#include "rapidcheck.h"

namespace ucp::conformance {

struct CaseGenOptions {
  int max_tp = 8;
  int max_pp = 4;
  int max_dp = 8;
  // Largest tp * pp * dp of a drawn topology (keeps file counts small).
  int max_world = 64;
  // Draw T1 with tp >= 2 (cases that need tp copies to compare).
  bool source_tp_at_least_2 = false;
  // Hugging Face cases (GenHfCase): one in `hf_one_in` of the cases GenCase
  // draws (0 = none); hf_only: every case.
  int hf_one_in = 5;
  bool hf_only = false;
  // AutoTP cases (GenAutoTpCase): one in `autotp_one_in` of the Hugging Face
  // cases (0 = none); autotp_only: every case GenCase draws; autotp_even:
  // sizes both tps divide (MegatronTwin's comparison).
  int autotp_one_in = 3;
  bool autotp_only = false;
  bool autotp_even = false;
};

rc::Gen<GoldenCase> GenCase(const CaseGenOptions& options);

// A Hugging Face Trainer / Accelerate style case: a plain module at tp = pp =
// 1 named as transformers names it (Llama, GPT-NeoX, GPT-2: the styles
// hf-llama, hf-gpt-neox, hf-gpt2), optionally wrapped as peft names it
// (base_model.model. prefix, <proj>.base_layer, <proj>.lora_A.default /
// lora_B.default); each param's true tp split is what the preset of that
// name (rules/presets/<style>.textproto, its own rules read here, first match
// wins) gives it, replicated where no rule of the preset matches (peft
// adapters of modules AutoTP does not split: undecided, kept whole). Frozen
// params as users freeze them: none, LoRA (base frozen, adapters trained),
// frozen embeddings, or any param one time in five; lm_head tied to the
// embedding (a tied alias, role "tied") or not; groups as DeepSpeed's
// default (one) or the Trainer's decay / no-decay split; LayerScale params
// (a 1-D weight the Trainer decays beside the 1-D norms it does not: at ZeRO
// stage 0 in fp32 only the Trainer's rule settles the param order), with
// --source_option=zero0_order=hf_trainer passed as such a user passes it
// (ModelSpec.source_options; also drawn where it is not needed, where it
// must change nothing); the source and the
// target at ZeRO stage 0, 1, 2 or 3 (source_zero_stage, target_zero_stage)
// at dp <= max_dp, lp fp32 / fp16 (any stage) or bf16 (BF16_Optimizer at
// stage 1, and stage 0: 1 -> 1, 1 -> 0, 0 -> 0; ucp writes no ZeRO-3 from
// a BF16_Optimizer state), DeepSpeed 0.18.9 to 0.19.5,
// converted with no flags at all (rules_source "no_flags").
rc::Gen<GoldenCase> GenHfCase(const CaseGenOptions& options);

// A model trained with DeepSpeed's AutoTP (`tensor_parallel.autotp_size`,
// spec.autotp): a plain transformers module with Hugging Face names (the
// hf-llama preset, whose tp_split_by_autotp is set) saved at tp 1-4 and
// resharded to tp 1-4 (dp 1-4, pp 1), converted with no flags:
//   - arch "llama" (LlamaForCausalLM under AutoTP's tp plan): q/k/v (and
//     optional Qwen2-style biases) and gate/up cut by rows, o/down by
//     columns, the lm_head by vocabulary rows (its rule in every version:
//     0.18.9's saves hold it whole on every rank, as a real 0.18.9 run
//     does, and the oracle expects that layout of them), embeddings
//     and norms whole; params in transformers' module order (a layer's
//     self_attn and mlp before its norms);
//     arch "phi3" (a partition_config as realds family autotp --arch phi3):
//     the fused mlp.gate_up_proj per sub-param (each rank its AutoTP widths
//     of the gate and of the up rows), down_proj by columns, all else whole;
//   - uneven widths: the intermediate size and the vocabulary are any size
//     (>= the tps), cut as AutoTP cuts them (master: rank r of n holds
//     n // tp, the first n % tp ranks one more; 0.18.9 and 0.19.5 by
//     torch.chunk, pieces of ceil(n / tp), an intermediate size that leaves
//     a rank nothing there making that end master's); attention heads are multiples of both
//     tps (AutoTP cuts them in whole key-value heads, which ucp refuses to
//     cut unevenly);
//   - the DeepSpeed version at each end: 0.18.9 (no universal_checkpoint_info),
//     0.19.5 (format 0.3), master 0.19.6 (0.4: autotp_unsupported_parameter_patterns,
//     sub_param_shard_widths); a fused param or a cut vocabulary tp does not
//     divide makes both ends master's (0.19.5 cuts such an lm_head by columns
//     and trains it wrong; fused sub-param metadata is master's), else a
//     vocabulary tp does not divide no 0.19.5 at either end; a change of
//     version between any two (across 0.19.5 the lm_head is read whole and
//     written cut, or the reverse), none across 0.19.5 with autotp_even (the
//     Megatron-style twin of (f) holds one lm_head layout);
//   - the job's metadata as DeepSpeed writes it (synthetic_state.h, spec_rules.h
//     AutoTpCheckpointInfo): ds_config.tensor_parallel.autotp_size, the
//     version's universal_checkpoint_info after the engine's keys;
//   - ZeRO stage 1 or 2, lp fp32 / fp16 / bf16 (BF16_Optimizer at stage 1 or
//     the ZeRO optimizer at stage 2), frozen params (one in four, half the
//     models), the Trainer's decay / no-decay groups or one.
// Not drawn: ZeRO-3 (ucp converts a ZeRO-3 checkpoint at tp > 1 to no
// universal layout), ZeRO-0, tied embeddings, LoRA, attention heads a tp
// does not divide (ucp refuses them), ranks holding no row (DeepSpeed does
// not train them).
rc::Gen<GoldenCase> GenAutoTpCase(const CaseGenOptions& options);

// The same model as the AutoTP case `c` (same names, shapes, values, groups,
// frozen params, optimizer, ZeRO stage, topologies, versions), trained the
// Megatron way: no AutoTP metadata (no tensor_parallel in its ds_config, no
// universal_checkpoint_info), its splits given as a --rules file of
// Megatron's even splits (column, row, replicated; the fused gate_up as
// Megatron's 2 chunks; the lm_head a column split, unpadded). Where both
// tps divide every dim (GenAutoTpCase with autotp_even) AutoTP's widths and
// Megatron's coincide, so both save the same tensors.
GoldenCase MegatronTwin(const GoldenCase& c);

// The DeepSpeed versions GenCase draws (ds_version, target_ds_version), the
// first the one a shrunk case falls back to.
const std::vector<std::string>& DsVersionsDrawn();

// The merge kinds a case exercises, by name: replicated, average, column,
// row, vocab (padded when padding is needed at T1 or T2), sub_params_2,
// sub_params_gqa; and its other features: frozen, buffer, tied, layer_scale,
// zero0_order_hf_trainer[_stage0],
// equal_slices, rank3, rank4, split_dim1_rank3+, rank_conditioned. For the distribution `ucp_conformance fuzz` prints.
std::vector<std::string> CaseFeatures(const GoldenCase& c);

}  // namespace ucp::conformance

namespace ucp {
// How RapidCheck prints a case (its counterexamples): the textproto.
void showValue(const GoldenCase& c, std::ostream& os);
}  // namespace ucp

#endif  // UCP_CONFORMANCE_MODEL_GEN_H_
