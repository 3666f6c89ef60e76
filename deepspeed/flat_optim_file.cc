#include "deepspeed/flat_optim_file.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "format/torch/zip.h"

namespace ucp::deepspeed {

const torch::Tensor* FlatOptimFile::Flat(int g, const std::string& state) const {
  if (state == state::kFp32State) return &fp32[g];
  const torch::Tensor* flat = nullptr;
  for (const auto& [k, t] : states[g]) {
    if (k == state) flat = &t;
  }
  return flat;
}

state::FileValue FlatOptimFile::Scalar(int g, const std::string& key) const {
  if (g < 0 || g >= static_cast<int>(scalars.size())) return state::FileValue{nullptr, nullptr};
  for (const auto& [k, v] : scalars[g]) {
    if (k == key) return state::FileValue{v, state::Unowned(file.get())};
  }
  return state::FileValue{nullptr, nullptr};
}

std::vector<std::string> FlatOptimFile::StateNames(int g) const {
  std::vector<std::string> out;
  if (g < 0 || g >= static_cast<int>(states.size())) return out;
  for (const auto& e : states[g]) out.push_back(e.first);
  return out;
}

std::vector<std::string> FlatOptimFile::ScalarNames(int g) const {
  std::vector<std::string> out;
  if (g < 0 || g >= static_cast<int>(scalars.size())) return out;
  for (const auto& e : scalars[g]) out.push_back(e.first);
  return out;
}

absl::Status FlatOptimFile::VerifyPartitionIfChecked(const torch::Tensor& flat, const CheckedInputs& checked,
                                                    const std::string& tensor) const {
  // Ranks pooling what they read: each tracks every partition it reads, and
  // one joins them (torch::DeferredCrcChecks::PoolReads).
  if (torch::DeferredCrcChecks::PoolsReads()) return VerifyPartition(flat, /*reading=*/true);
  if (!checked.Checks(state::InputKey(path, tensor))) return absl::OkStatus();
  return VerifyPartition(flat, /*reading=*/checked.ChecksAll());
}

absl::Status FlatOptimFile::VerifyPartitions() const {
  for (const auto& t : fp32) UCP_RETURN_IF_ERROR(VerifyPartition(t));
  for (const auto& group : states) {
    for (const auto& [key, t] : group) UCP_RETURN_IF_ERROR(VerifyPartition(t));
  }
  return absl::OkStatus();
}

absl::Status FlatOptimFile::VerifyStoragesButPartitions() const {
  std::set<const torch::Storage*> partitions;
  for (const auto& t : fp32) partitions.insert(t.storage().get());
  for (const auto& group : states) {
    for (const auto& [k, t] : group) partitions.insert(t.storage().get());
  }
  for (const auto& storage : file->Storages()) {
    if (!partitions.count(storage.get())) UCP_RETURN_IF_ERROR(file->VerifyStorageCrc(*storage));
  }
  return absl::OkStatus();
}

void CheckedInputs::Set(std::shared_ptr<const std::set<std::string>> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  keys_ = std::move(keys);
}

bool CheckedInputs::Checks(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_ == nullptr || keys_->count(key) > 0;
}

bool CheckedInputs::ChecksAll() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_ == nullptr;
}

absl::StatusOr<internal::GroupStates> SplitFlatStates(const torch::TorchFile& file, const std::string& path,
                                                      const pickle::Value& states, size_t index,
                                                      const FlatStatesSpec& spec) {
  return internal::SplitGroupStates(
      file, states, [&](const std::string& key, const torch::Tensor& t) -> absl::StatusOr<bool> {
        using Dense = FlatStatesSpec::Dense;
        if (spec.dense == Dense::kEvery) {
          UCP_RETURN_IF_ERROR(internal::CheckDense(
              t, path, absl::StrCat("optimizer state '", key, "' of ", spec.unit, " ", index)));
        }
        if (t.dim() == 0) return false;
        if (spec.one_element_scalars && t.numel() == 1 && spec.numel != 1 && spec.lean_numel != 1) return false;
        if (spec.dense == Dense::kPerElement) {
          UCP_RETURN_IF_ERROR(internal::CheckDense(t, path, absl::StrCat("state[", index, "].", key)));
        }
        if (t.dim() != 1 || (t.numel() != spec.numel && (spec.lean_numel < 0 || t.numel() != spec.lean_numel))) {
          return internal::FileError(path, absl::StatusCode::kInvalidArgument,
                                     absl::StrCat("optimizer state '", key, "' of ", spec.unit, " ", index,
                                                  " has shape ", internal::ShapeStr(t.sizes()), ", expected [",
                                                  spec.numel, "]", spec.expected_note));
        }
        return true;
      });
}

void LazyOptimFiles::Reset(int ranks) {
  slots_.clear();
  for (int d = 0; d < ranks; ++d) slots_.push_back(std::make_unique<OnceSlot<FlatOptimFile>>());
}

}  // namespace ucp::deepspeed
