// What the ZeRO-1/2, native MoE and ZeRO-3 readers (formats/deepspeed_zero,
// formats/deepspeed_moe, formats/deepspeed_zero3) parse out of DeepSpeed's
// [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt files alike: per flat
// group (a ZeRO-1/2 param group's dp partition, stage_1_and_2.py
// single_partition_of_fp32_groups; a ZeRO-3 sub-group's, stage3.py
// fp32_flat_groups) the fp32 master partition, the torch optimizer's
// per-element states over the same elements (exp_avg, exp_avg_sq) and its
// scalars (step); the files parsed lazily, once per dp rank (ZeRO-1/2: once
// per (pp, tp, dp) file, in its own slots).
//
// Example:
//   deepspeed::LazyOptimFiles files;
//   files.Reset(dp);
//   UCP_ASSIGN_OR_RETURN(const deepspeed::FlatOptimFile* f, files.Get(d, [&](int d) { return Parse(d); }));
//   const torch::Tensor* exp_avg = f->Flat(group, "exp_avg");
#ifndef UCP_DEEPSPEED_FLAT_OPTIM_FILE_H_
#define UCP_DEEPSPEED_FLAT_OPTIM_FILE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/once_slot.h"
#include "deepspeed/value_util.h"
#include "format/pickle/value.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"
#include "state/model_state.h"

namespace ucp::deepspeed {

class CheckedInputs;

// One optimizer file's flat groups, in the file's group order.
struct FlatOptimFile {
  std::string path;  // the file, as errors name it
  std::unique_ptr<torch::TorchFile> file;
  const pickle::Value* osd = nullptr;  // root['optimizer_state_dict']
  std::vector<torch::Tensor> fp32;     // per flat group
  // Per flat group: (state key, tensor) of the per-element states in file
  // order, and the scalar states.
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> states;
  std::vector<std::vector<std::pair<std::string, pickle::ValuePtr>>> scalars;

  // Flat group `g`'s tensor of `state` (state::kFp32State or a per-element
  // state's key); null when the group has no such state.
  const torch::Tensor* Flat(int g, const std::string& state) const;
  // Flat group `g`'s scalar `key` as a value of this file; {nullptr, nullptr}
  // when it has none (or the file has no group `g`).
  state::FileValue Scalar(int g, const std::string& key) const;
  // The keys of flat group `g`'s per-element states / scalars, in file order
  // (none for a group the file does not have).
  std::vector<std::string> StateNames(int g) const;
  std::vector<std::string> ScalarNames(int g) const;
  // CRC-checks the storage of a flat tensor of the file, once per record
  // (for a file opened without CRC checks, which checks its flat partitions
  // when first used: a command reads only the bytes it needs).
  absl::Status VerifyPartition(const torch::Tensor& flat, bool reading = false) const {
    return file->VerifyStorageCrc(*flat.storage(), reading);
  }
  // VerifyPartition when `checked` says this process checks the record
  // `tensor` of this file (state::InputKey(path, tensor)), else nothing.
  // The caller goes on to read a slice of it: when this process checks
  // every input (one process runs every unit, so the units read about all
  // of each partition), the check is made from the bytes the units read
  // (torch::DeferredCrcChecks); with the inputs split over ranks, each rank
  // reads part of a record it checks, and checks it whole.
  absl::Status VerifyPartitionIfChecked(const torch::Tensor& flat, const CheckedInputs& checked,
                                        const std::string& tensor) const;
  // Every flat partition (fp32 and per-element states) CRC-checked: the
  // whole file, as a rank checking it reads it.
  absl::Status VerifyPartitions() const;
  // Every storage but the flat partitions CRC-checked (what a parse of a
  // file opened without CRC checks checks at once; the partitions are
  // checked when used).
  absl::Status VerifyStoragesButPartitions() const;
};

// Which input records this process CRC-checks when it reads them
// (state::CheckpointState::SetCheckedInputs): null keys, the default, all.
// Thread-safe.
class CheckedInputs {
 public:
  void Set(std::shared_ptr<const std::set<std::string>> keys);
  // Whether the record of `key` (state::InputKey) is checked here.
  bool Checks(const std::string& key) const;
  // Whether every record is checked here (no Set, or Set(nullptr)).
  bool ChecksAll() const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const std::set<std::string>> keys_;  // guarded by mu_
};

// How one flat group's state dict is split (SplitFlatStates): a 0-dim
// tensor is a scalar (Adam's `step`); every other tensor is a per-element
// state and must be 1-dim of `numel` (or `lean_numel`: DeepSpeed saves
// ZeRO-1/2 partitions without their padding) elements.
struct FlatStatesSpec {
  // Which tensors are refused as overlapping views (internal::CheckDense),
  // and how the message names them.
  enum class Dense {
    kNo,
    kPerElement,  // per-element states, "state[<index>].<key>" (ZeRO-3, MoE)
    kEvery,       // every tensor, scalars too, "optimizer state '<key>' of <unit> <index>" (ZeRO-1/2)
  };
  const char* unit = "group";     // how messages name the flat group: "group", "sub-group"
  int64_t numel = 0;              // the flat group's elements (shown as expected)
  int64_t lean_numel = -1;        // also accepted when >= 0
  Dense dense = Dense::kNo;
  // A 1-element tensor is a scalar too, unless the flat group (or its lean
  // part) has 1 element (ZeRO-1/2: a 1-element `step`).
  bool one_element_scalars = false;
  // Appended to the shape error's "expected [numel]", e.g. " (the dp partition)".
  const char* expected_note = "";
};

// Flat group `index`'s optimizer state dict `states` of `file` (at `path`)
// split into per-element states and scalars as `spec` says; an error naming
// the file, the group and the state otherwise.
absl::StatusOr<internal::GroupStates> SplitFlatStates(const torch::TorchFile& file, const std::string& path,
                                                      const pickle::Value& states, size_t index,
                                                      const FlatStatesSpec& spec);

// A checkpoint's optimizer files, one per dp rank, each parsed on first use,
// once, by whichever thread asks first (a command parses only the files it
// reads); a parse error is every later call's answer too.
class LazyOptimFiles {
 public:
  // `ranks` files, none parsed.
  void Reset(int ranks);
  bool Has(int dp) const { return dp >= 0 && dp < static_cast<int>(slots_.size()); }
  // Rank `dp`'s file (Has(dp) must hold), parsed by `parse(dp)` (returning
  // absl::StatusOr<std::unique_ptr<FlatOptimFile>>) on the first call.
  template <typename Parse>
  absl::StatusOr<const FlatOptimFile*> Get(int dp, const Parse& parse) const {
    return slots_[dp]->Get([&] { return parse(dp); });
  }
  // Rank `dp`'s file when an earlier Get parsed it, else null (never parses).
  const FlatOptimFile* Parsed(int dp) const { return Has(dp) ? slots_[dp]->made() : nullptr; }

 private:
  std::vector<std::unique_ptr<OnceSlot<FlatOptimFile>>> slots_;
};

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_FLAT_OPTIM_FILE_H_
