#include "ops/trainer_folder.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "format/torch/torch_file.h"
#include "formats/builtin/builtin.h"
#include "formats/format.h"

namespace ucp::ops {
namespace {

constexpr char kRngPrefix[] = "rng_state_";
constexpr char kRngSuffix[] = ".pth";
constexpr char kRngSingle[] = "rng_state.pth";

// The process index of `rng_state_<i>.pth`, or -1.
int RngIndex(const std::string& name) {
  absl::string_view s = name;
  if (!absl::ConsumePrefix(&s, kRngPrefix) || !absl::ConsumeSuffix(&s, kRngSuffix)) return -1;
  int i = -1;
  if (!absl::SimpleAtoi(s, &i) || i < 0) return -1;
  return i;
}

// A torch.save file (zip) of the folder: opened without running anything,
// refused if its pickle names a code-execution global. Files that are not
// torch zip archives (an old-format pickle) are copied as they are.
absl::Status CheckPickle(const std::string& path, bool allow_unsafe) {
  torch::OpenOptions o;
  o.refuse_unsafe_globals = !allow_unsafe;
  absl::StatusOr<std::unique_ptr<torch::TorchFile>> f = torch::TorchFile::Open(path, o);
  if (f.ok()) return absl::OkStatus();
  if (f.status().code() == absl::StatusCode::kFailedPrecondition) return f.status();
  return absl::OkStatus();  // not parsed (another pickle format): copied byte for byte all the same
}

bool IsPickleFile(const std::string& name) {
  return absl::EndsWith(name, ".pth") || absl::EndsWith(name, ".pt") || absl::EndsWith(name, ".bin");
}

}  // namespace

absl::StatusOr<std::string> TrainerFolderInput(const std::string& input, const std::string& source_dir) {
  absl::StatusOr<formats::HfFolder> found = formats::HfFolderOf(source_dir);
  if (!found.ok() && PathExists(JoinPath(Dirname(source_dir), "trainer_state.json"))) return found.status();
  if (!found.ok() || !found->trainer) return std::string();
  const formats::HfFolder& hf = *found;
  UCP_ASSIGN_OR_RETURN(formats::CheckpointFolder folder, formats::ResolveFolder(formats::builtin::Formats(), input));
  if (folder.latest_file.empty() || ResolvePath(folder.root) != ResolvePath(hf.dir)) return std::string();
  return hf.dir;
}

absl::StatusOr<writers::WriteStats> WriteTrainerFolder(const writers::Plan& plan, const writers::RunOptions& run,
                                                       const std::string& output_folder, const std::string& inner_name,
                                                       const std::string& trainer_dir,
                                                       const std::vector<std::string>& skip, int world_size,
                                                       bool allow_unsafe_pickles, std::vector<std::string>* summary) {
  UCP_RETURN_IF_ERROR(CheckOutputApartFromInputs(output_folder, {trainer_dir}));
  UCP_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::Create(output_folder, run.overwrite, run.fsync));
  writers::RunOptions inner = run;
  inner.overwrite = false;
  inner.inputs.push_back(trainer_dir);
  UCP_ASSIGN_OR_RETURN(writers::WriteStats stats, writers::RunPlan(plan, JoinPath(staging.path(), inner_name), inner));
  UCP_RETURN_IF_ERROR(
      WriteTrainerFiles(trainer_dir, skip, world_size, allow_unsafe_pickles, staging.path(), summary));
  UCP_RETURN_IF_ERROR(staging.Commit());
  for (const auto& n : staging.notes()) stats.notes.push_back(n);
  return stats;
}

absl::Status WriteTrainerFiles(const std::string& source_dir, const std::vector<std::string>& skip, int world_size,
                               bool allow_unsafe_pickles, const std::string& out_dir,
                               std::vector<std::string>* summary) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(source_dir));
  const std::set<std::string> skipped(skip.begin(), skip.end());
  std::map<int, std::string> rng;  // process index -> file
  bool rng_single = false;
  std::vector<std::string> left_out;
  for (const std::string& name : names) {
    if (skipped.count(name)) continue;
    const std::string path = JoinPath(source_dir, name);
    if (IsDirectory(path)) {
      left_out.push_back(name + "/");
      continue;
    }
    if (name == "latest_universal") {
      left_out.push_back(name);
      continue;
    }
    if (RngIndex(name) >= 0) {
      rng[RngIndex(name)] = name;
      continue;
    }
    if (name == kRngSingle) {
      rng_single = true;
      continue;
    }
    if (IsPickleFile(name)) UCP_RETURN_IF_ERROR(CheckPickle(path, allow_unsafe_pickles));
    UCP_RETURN_IF_ERROR(CopyFile(path, JoinPath(out_dir, name)));
    std::string why = "copied (does not depend on the number of processes)";
    if (name == "trainer_state.json") {
      why = "copied: global_step, max_steps and total_flos do not depend on dp; epoch (and log_history[].epoch) is "
            "the old job's global_step / steps per epoch, which the Trainer recomputes from global_step and the new "
            "dataloader on resume (keep dp x per_device_train_batch_size x gradient_accumulation_steps to replay the "
            "same samples)";
    } else if (name == "training_args.bin") {
      why = "copied as is, never unpickled: a pickled TrainingArguments whose distributed_state records the old "
            "process count; the Trainer does not read it back on resume";
    } else if (name == "scheduler.pt") {
      why = "copied: the LR scheduler state (one entry per optimizer param group) does not depend on dp";
    }
    summary->push_back(absl::StrCat(name, ": ", why));
  }
  // RNG states: one file per process of the new job.
  auto source_rng = [&](int i) -> std::string {
    if (rng.count(i)) return rng[i];
    if (i == 0 && rng_single) return kRngSingle;
    return "";
  };
  if (world_size == 0) {
    // Any number of processes: every file as it is, and the one a job of one
    // process reads (rng_state.pth) or process 0 of several reads
    // (rng_state_0.pth) from process 0's when the source has only the other.
    std::vector<std::pair<std::string, std::string>> copies;  // (to, from)
    for (const auto& [i, name] : rng) copies.emplace_back(name, name);
    if (rng_single) copies.emplace_back(kRngSingle, kRngSingle);
    if (!rng_single && rng.count(0)) copies.emplace_back(kRngSingle, rng[0]);
    if (rng_single && !rng.count(0)) copies.emplace_back(absl::StrCat(kRngPrefix, 0, kRngSuffix), kRngSingle);
    for (const auto& [to, from] : copies) {
      UCP_RETURN_IF_ERROR(CheckPickle(JoinPath(source_dir, from), allow_unsafe_pickles));
      UCP_RETURN_IF_ERROR(CopyFile(JoinPath(source_dir, from), JoinPath(out_dir, to)));
      summary->push_back(
          to == from ? absl::StrCat(to, ": the source's ", from, " (as it is: the process of that index reads it)")
                     : absl::StrCat(to, ": the source's ", from, " (process 0's RNG states, for a job of ",
                                    to == kRngSingle ? "one process" : "several processes", ")"));
    }
    if (!copies.empty()) {
      summary->push_back(
          "rng_state*.pth: a job of any number of processes reads those of its process indices that exist (the "
          "Trainer logs a missing one and goes on with fresh RNG states)");
    }
    rng.clear();
    rng_single = false;
  } else if (world_size == 1) {
    std::string from = rng_single ? std::string(kRngSingle) : source_rng(0);
    if (!from.empty()) {
      UCP_RETURN_IF_ERROR(CheckPickle(JoinPath(source_dir, from), allow_unsafe_pickles));
      UCP_RETURN_IF_ERROR(CopyFile(JoinPath(source_dir, from), JoinPath(out_dir, kRngSingle)));
      summary->push_back(absl::StrCat(kRngSingle, ": the source's ", from,
                                      " (a job of one process reads rng_state.pth; process 0's RNG states)"));
    }
  } else {
    std::vector<int> missing;
    for (int i = 0; i < world_size; ++i) {
      const std::string from = source_rng(i);
      const std::string to = absl::StrCat(kRngPrefix, i, kRngSuffix);
      if (from.empty()) {
        missing.push_back(i);
        continue;
      }
      UCP_RETURN_IF_ERROR(CheckPickle(JoinPath(source_dir, from), allow_unsafe_pickles));
      UCP_RETURN_IF_ERROR(CopyFile(JoinPath(source_dir, from), JoinPath(out_dir, to)));
      summary->push_back(absl::StrCat(to, ": the source's ", from, " (process ", i, ")"));
    }
    if (!missing.empty() && (!rng.empty() || rng_single)) {
      std::vector<std::string> m;
      for (int i : missing) m.push_back(absl::StrCat(kRngPrefix, i, kRngSuffix));
      summary->push_back(absl::StrCat(absl::StrJoin(m, ", "),
                                      ": not written, the source job had no such process (the Trainer logs \"Didn't "
                                      "find an RNG file for process\" and goes on with fresh RNG states)"));
    }
  }
  std::vector<std::string> dropped_rng;
  for (const auto& [i, name] : rng) {
    if (world_size == 1 || i >= world_size) dropped_rng.push_back(name);
  }
  if (rng_single && world_size > 1) {
    // Used for process 0 above unless the source also had rng_state_0.pth.
    if (rng.count(0)) dropped_rng.push_back(kRngSingle);
  }
  if (!dropped_rng.empty()) {
    summary->push_back(absl::StrCat(absl::StrJoin(dropped_rng, ", "), ": left out, the new job has ", world_size,
                                    world_size == 1 ? " process" : " processes"));
  }
  if (!left_out.empty()) {
    summary->push_back(absl::StrCat(absl::StrJoin(left_out, ", "),
                                    ": left out (another checkpoint or folder; not part of this one)"));
  }
  return absl::OkStatus();
}

}  // namespace ucp::ops
