#include "writers/plan.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/parallel.h"
#include "base/status_macros.h"

namespace ucp::writers {

int64_t Plan::total_bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += u.bytes;
  return n;
}

absl::Status ExecuteUnits(const Plan& plan, const std::vector<size_t>& subset, const std::string& staging,
                          int threads, const ProgressFn& progress, std::vector<UnitResult>* results) {
  const std::vector<Unit>& units = plan.units();
  results->resize(units.size());
  // Largest first, so that the threads finish together rather than one of
  // them ending alone on a large unit.
  std::vector<size_t> order = subset;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return units[a].bytes > units[b].bytes; });
  ProgressEvent total;
  total.phase = "write";
  total.units_total = static_cast<int64_t>(order.size());
  for (size_t i : order) total.bytes_total += units[i].bytes;
  std::atomic<int64_t> units_done{0}, bytes_done{0};
  std::mutex progress_mu;
  return ParallelFor(order.size(), threads, [&](size_t k) -> absl::Status {
    const size_t i = order[k];
    UCP_RETURN_IF_ERROR(plan.Execute(i, staging, &(*results)[i]));
    const int64_t u = ++units_done;
    const int64_t b = (bytes_done += units[i].bytes);
    if (progress) {
      std::lock_guard<std::mutex> lock(progress_mu);
      ProgressEvent e = total;
      e.units_done = u;
      e.bytes_done = b;
      progress(e);
    }
    return absl::OkStatus();
  });
}

bool AddVerifyUnit(const deepspeed::CheckpointState& state, std::vector<Unit>* units) {
  std::set<std::string> read;
  for (const Unit& u : *units) {
    for (const InputRange& r : u.inputs) read.insert(r.path);
  }
  Unit v;
  v.name = "verify unread inputs";
  for (const std::string& f : state.InputFiles()) {
    if (read.count(f)) continue;
    v.inputs.push_back({f, "", 0, -1});
    auto size = FileSize(f);
    v.bytes += size.ok() ? *size / 8 : 0;  // reading is cheaper than writing
  }
  if (v.inputs.empty()) return false;
  units->push_back(std::move(v));
  return true;
}

absl::Status ExecuteVerifyUnit(const deepspeed::CheckpointState& state, const Unit& unit) {
  for (const InputRange& r : unit.inputs) UCP_RETURN_IF_ERROR(state.VerifyInput(r.path));
  return absl::OkStatus();
}

std::vector<std::vector<size_t>> AssignUnits(const std::vector<Unit>& units, int ranks) {
  std::vector<std::vector<size_t>> out(std::max(ranks, 1));
  std::vector<size_t> order(units.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return units[a].bytes > units[b].bytes; });
  std::vector<int64_t> load(out.size(), 0);
  for (size_t i : order) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    out[r].push_back(i);
    load[r] += units[i].bytes;
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

void AddUnitResults(const std::vector<UnitResult>& results, WriteStats* stats) {
  for (const UnitResult& r : results) {
    for (const FileDigest& f : r.files) {
      stats->files += 1;
      stats->bytes += f.size();
    }
  }
}

absl::StatusOr<StagingDir> BeginOutput(const Plan& plan, const std::string& output_folder, const RunOptions& options) {
  UCP_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::Create(output_folder, options.overwrite));
  if (options.keep_temp_folder) staging.Keep();
  UCP_RETURN_IF_ERROR(plan.Prepare(staging.path()));
  return staging;
}

absl::StatusOr<WriteStats> CommitOutput(const Plan& plan, StagingDir& staging, const std::vector<UnitResult>& results,
                                        const RunOptions& options) {
  UCP_ASSIGN_OR_RETURN(WriteStats stats, plan.Finish(results, staging.path()));
  UCP_RETURN_IF_ERROR(staging.Commit());
  if (options.write_latest && !plan.latest_file().empty()) {
    UCP_RETURN_IF_ERROR(
        WriteFileAtomic(JoinPath(Dirname(staging.target()), plan.latest_file()), Basename(staging.target())));
  }
  return stats;
}

absl::StatusOr<WriteStats> RunPlan(const Plan& plan, const std::string& output_folder, const RunOptions& options) {
  UCP_ASSIGN_OR_RETURN(StagingDir staging, BeginOutput(plan, output_folder, options));
  std::vector<size_t> all(plan.units().size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  std::vector<UnitResult> results;
  UCP_RETURN_IF_ERROR(ExecuteUnits(plan, all, staging.path(), options.num_threads, options.progress, &results));
  return CommitOutput(plan, staging, results, options);
}

}  // namespace ucp::writers
