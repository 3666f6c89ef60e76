// The conformance properties, as functions of one case (model_gen.h), each
// OK or an error describing the first violation (kInternal for a property
// that does not hold, with what differs):
//
// A case saves M as DeepSpeed version V1 (GoldenCase.ds_version) at T1 and
// writes T2 for V2 (target_ds_version, passed as --target_ds_version):
// save(M, T2) below is the writer's output at T2 for V2.
//
//   (a) ConvertIsTopologyFree: convert(save(M, T1), --target_ds_version=V2)
//       and convert(save(M, T2)) are the same universal checkpoint (every
//       per-param file byte for byte; the manifest and
//       zero/optimizer_state.pt up to their source-specific fields:
//       group_paddings, partition_count, ds_version), and equal M's full
//       tensors, steps and optimizer state.
//   (b) ReshardMatchesSave: reshard(convert(save(M, T1)), T2, V2) ==
//       save(M, T2), every file byte for byte.
//   (c) DirectReshardMatchesTwoStep: ops::Reshard from the ZeRO folder
//       save(M, T1) to T2 (V2) == the same from convert(save(M, T1)).
//   (d) CorruptionsAreCaught: a missing optimizer shard (kNotFound naming it),
//       a truncated file (kDataLoss naming it), a flipped byte in a universal
//       file with verify_checksums (kDataLoss: sha256 differs from the
//       manifest's), tp copies of a replicated param that disagree
//       (kFailedPrecondition naming the param and the state); never a
//       success, and no output folder left behind.
//   (e) SaveMatchesDeepSpeedLayout: save(M, T1) and save(M, T2) are laid out
//       as DeepSpeed V1 and V2 lay them out (ds_version everywhere,
//       group_paddings last-rank or per-rank from 0.16.4, BF16_Optimizer
//       last-rank always, checkpoint_parallel_dimensions from 0.19.5, the
//       source's numpy names), by formulas computed here
//       independently of the writer's (stage_1_and_2.py flatten + align to
//       2*dp + equal partitions, group_paddings, partition sizes,
//       _init_lp_to_hp_mapping fragments, Megatron's tp slicing and vocab
//       padding): every fragment, lp weight and module tensor holds M's tp
//       slice. The round trips (a)-(c) cannot see a change made consistently
//       to the writer and the readers; this can.
//
// Hugging Face cases (model_gen.h GenHfCase: tp = 1, saved at ZeRO stage
// S1 = source_zero_stage, T2 at S2 = target_zero_stage, 0-3, the reshards
// to T2 written at S2, converted with no rule flags):
//   (a) compares the two universal folders but for what records the
//       source's optimizer (stage, loss scaling, each group's `params`,
//       optimizer_layout); where one end is ZeRO-3, save(M, T2) is made at
//       S1 (a ZeRO-3 source converts to DeepSpeed's stage-3 universal
//       layout, which keeps the source's dp: each is checked against M
//       instead); a ZeRO-0 source's model states reach the universal folder
//       as a ZeRO job saves them (optimizer None). And export(save(M, T1))
//       and export(save(M, T2)) are M's weights (zero_to_fp32's choice: fp32
//       masters, frozen params as stored, buffers as float32, a tied alias
//       as its owner or named in the metadata), `--names=hf` with the
//       Trainer's config.json the same tensors under the same names (buffers
//       the preset drops and a tied lm_head aside) and that config.json, a
//       peft-named model refused saying so.
//   (b), (c) from a ZeRO-3 source go through DeepSpeed's stage-3 universal
//       layout, which convert writes and reshard reads back.
//   (d) a ZeRO-0 source has no optimizer files: its model-states file is
//       removed instead (an unrecognized folder, named).
//   (e) ZeRO-3 and ZeRO-0 saves against formulas of their own
//       (CheckLayoutZero3: per-rank ceil(numel / dp) partitions of every
//       state and frozen param; CheckLayoutZero0: the module, the torch
//       optimizer's state by param index, FP16_UnfusedOptimizer's
//       fp32_groups).
//
// RunFuzz drives them with RapidCheck (seeded, shrinking to a minimal case)
// for `ucp_conformance fuzz` and the tests.
//
// Example:
//   UCP_RETURN_IF_ERROR(CheckProperty(Property::kReshardMatchesSave, c, "/tmp/work"));
#ifndef UCP_CONFORMANCE_PROPERTIES_H_
#define UCP_CONFORMANCE_PROPERTIES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "conformance/model_gen.h"
#include "conformance/synthetic_state.h"
#include "proto/ucp.pb.h"

namespace ucp::conformance {

enum class Property {
  kConvertIsTopologyFree,
  kReshardMatchesSave,
  kDirectReshardMatchesTwoStep,
  kCorruptionsAreCaught,
  kSaveMatchesDeepSpeedLayout,
};
// "a".."e" and a readable name.
const char* PropertyLetter(Property p);
const char* PropertyName(Property p);
absl::StatusOr<Property> ParseProperty(const std::string& letter_or_name);
std::vector<Property> AllProperties();

// Checks one property on one case; `work` is a scratch folder (created,
// and emptied afterwards).
absl::Status CheckProperty(Property p, const GoldenCase& c, const std::string& work);
// Several properties on one case, sharing the checkpoints they have in common.
absl::Status CheckProperties(const std::vector<Property>& properties, const GoldenCase& c, const std::string& work);

// (f) AutoTpMatchesMegatron, for an AutoTP case whose sizes both tps divide
// (model_gen.h GenAutoTpCase with autotp_even): "the same model" is the
// AutoTP model A of the case and its Megatron-style twin B
// (model_gen.h MegatronTwin): the same param names, shapes, values, Adam
// states, steps, groups, frozen params, optimizer, ZeRO stage and DeepSpeed
// versions; A saved as DeepSpeed's AutoTP saves it (ds_config
// tensor_parallel.autotp_size, AutoTP's universal_checkpoint_info, AutoTP's
// widths), B as a Megatron-style job (none of that metadata, Megatron's even
// splits given as a --rules file). Then reshard(save(A, T1), T2) equals
// save(B, T2), and reshard(save(B, T1), T2) equals save(A, T2): the same
// files, every tensor bitwise and every other value equal, but for the
// AutoTP metadata (universal_checkpoint_info, ds_config.tensor_parallel).
// kInternal naming the files that differ.
absl::Status CheckAutoTpMatchesMegatron(const GoldenCase& c, const std::string& work);

// Differences between two folders, every file byte for byte// Differences between two folders, every file byte for byte (with a
// structural diff of .pt files that differ); `ignore` lists relative paths.
absl::StatusOr<std::vector<std::string>> FolderByteDiffs(const std::string& a, const std::string& b,
                                                        const std::vector<std::string>& ignore = {});

// How often each value was drawn, for coverage.
struct FuzzDistribution {
  int cases = 0;
  std::map<std::string, std::map<std::string, int>> counts;  // dimension -> value -> cases
  void Add(const GoldenCase& c);
  std::string ToString() const;
};

struct FuzzOptions {
  uint64_t seed = 1;
  int cases = 200;
  std::vector<Property> properties = AllProperties();
  CaseGenOptions gen;
  std::string workdir;  // scratch; "" = DefaultScratchDir("fuzz")
  int max_size = 100;   // RapidCheck's size bound
  // An extra check of each case after the properties (tests of the runner).
  std::function<absl::Status(const GoldenCase&)> case_check;
};

struct FuzzReport {
  bool passed = false;
  int cases_passed = 0;
  FuzzDistribution distribution;
  // On failure: the property's error for the shrunk case, the case as
  // textproto, and how to replay it.
  std::string failure;
  std::string shrunk_case;
  std::string replay;
};

// Runs every property in `options.properties` on each generated case.
FuzzReport RunFuzz(const FuzzOptions& options);

// A fresh scratch folder name for `name`: under /dev/shm when writable (the
// properties write thousands of small files), else $TEST_TMPDIR, $TMPDIR or /tmp.
std::string DefaultScratchDir(const std::string& name);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_PROPERTIES_H_
