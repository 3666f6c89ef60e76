// Plan / execute / commit: how every ucp writer works, so that one output can
// be written by threads of one process or by the ranks of an MPI job.
//
//   plan      A writer turns a ModelState into a Plan: named units of work,
//             each listing the input files (and the byte ranges of the tensors
//             in them) it reads, the output files it writes and how many bytes
//             it writes. A unit reads only its own inputs and writes only its
//             own files.
//   execute   Any subset of units runs into the staging folder (ExecuteUnits:
//             threads; RunPlanOnCluster: the units of one rank of a
//             Cluster, e.g. exec/mpi_cluster.h's MPI job), each returning the
//             size and digest of every file it wrote.
//   commit    Once, after every unit succeeded: the plan finishes the staging
//             folder (e.g. the manifest, from every unit's digests), which is
//             then renamed into place, and the `latest` file is written last.
//
// RunPlan does all three in one process.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto plan, PlanUniversal(state, options));
//   UCP_ASSIGN_OR_RETURN(WriteStats stats, RunPlan(*plan, "/ckpt/global_step4_universal", run_options));
#ifndef UCP_WRITERS_PLAN_H_
#define UCP_WRITERS_PLAN_H_

#include <cstdint>
#include <string>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/cluster.h"
#include "base/fs.h"
#include "base/progress.h"
#include "format/torch/read_coverage.h"
#include "state/model_state.h"
#include "proto/ucp.pb.h"

namespace ucp::torch {
class TorchWriter;
}  // namespace ucp::torch
namespace ucp::pickle {
class Value;
}  // namespace ucp::pickle

namespace ucp::writers {

using state::InputRange;

struct Unit {
  std::string name;                  // e.g. "param 2.attention.dense.weight"
  std::vector<std::string> outputs;  // paths relative to the output folder
  std::vector<InputRange> inputs;
  int64_t bytes = 0;                 // bytes it writes (an estimate for balancing)
};

// What one unit wrote.
struct UnitResult {
  std::vector<FileDigest> files;  // path relative to the output folder, size, digest
  // A unit that writes one piece of a file several units share (see
  // WriteUnitPiece) lists no file: it reports the CRC-32s of the record
  // parts it wrote, and the plan's Finish completes the file from every
  // piece's parts and counts it.
  std::vector<RecordPiece> pieces;
  // A unit that writes several items back to back into one file (see
  // WriteUnitItems) lists the file and each item's place in it, in order.
  std::vector<FileItem> items;
};

struct WriteStats {
  int64_t files = 0;
  int64_t bytes = 0;
  int64_t params = 0;
  // What the user should know about the commit (a `latest` left alone,
  // stale staging folders removed), one line each.
  std::vector<std::string> notes;
};

class Plan {
 public:
  virtual ~Plan() = default;
  const std::vector<Unit>& units() const { return units_; }
  int64_t total_bytes() const;

  // Creates the folders the units write into (once, before any unit runs).
  virtual absl::Status Prepare(const std::string& staging) const = 0;
  // Runs unit `i`, writing its files under `staging`.
  virtual absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const = 0;
  // After every unit succeeded: completes the staging folder (results are
  // indexed like units()) and says what it added.
  virtual absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results,
                                            const std::string& staging) const = 0;
  // The file beside the output that names it once committed ("latest",
  // "latest_universal"), or "" for none.
  virtual std::string latest_file() const = 0;
  // The state the units read (for SetCheckedInputs), or null.
  virtual const state::CheckpointState* source() const { return nullptr; }
  // The state whose ExtentOf says where the units' inputs lie, for reading
  // them ahead (writers/read_ahead.h), or null: source() by default.
  virtual const state::CheckpointState* read_ahead_source() const { return source(); }

 protected:
  std::vector<Unit> units_;
};

// Runs the units `subset` (indices into plan.units()) on up to `threads`
// threads (0 = all cores), largest first; results[i] is filled for each i in
// the subset. The first failure wins; units not started by then are skipped.
// `writeback`: start writing each unit's files back to disk as it ends
// (RunOptions::fsync).
// `pooled`: the units are some of a job's (a rank's share): what they read of
// each large input record is handed over here (torch::RecordReads), for
// CheckPooledReads with the other ranks' before the commit, rather than
// checked here. Null: checked here, before ExecuteUnits returns.
// `check_owed`: the checks the source's open left to this thread's
// torch::OwedCrcChecks are made beside the units (one rank of a job makes
// them: the others opened the same files).
absl::Status ExecuteUnits(const Plan& plan, const std::vector<size_t>& subset, const std::string& staging,
                          int threads, const ProgressFn& progress, bool writeback,
                          std::vector<UnitResult>* results, std::vector<torch::RecordReads>* pooled = nullptr,
                          bool check_owed = true);

// How many bytes of written output ExecuteUnits lets pass between two
// background flushes (base/flusher.h) when it writes `bytes_to_write`: an
// eighth of them, within [32 MiB, 256 MiB]. The commit's sync waits for what
// was written after the last flush, and each rank of a job counts only its
// own bytes: with a fixed 256 MiB, the two ranks of a job writing 437 MB in
// all never flushed, and the commit's sync found all of it left (0.32 s of a
// 0.72 s run here, against 0.05 s at 32 MiB). Small enough that the last
// eighth is what a small job leaves, large enough that a large one flushes
// no more often than before (each flush commits the journal and flushes the
// disk's cache).
int64_t FlushEveryBytes(int64_t bytes_to_write);

// How far ExecuteUnits reads the units' inputs ahead of the units started
// (writers/read_ahead.h): bytes the page cache holds before a unit asks
// for them. On neox-tp2-z1 (bench/real_checkpoints.py), cold, one rank,
// bench/ab.sh against no read-ahead: 256 MiB took 96% of the time, 1 GiB
// 99% (6 runs each): a few units' worth is enough.
inline constexpr int64_t kReadAheadBytes = int64_t{256} << 20;

// Appends to `units` one unit that checks the source's input files no unit
// reads (CheckpointState::InputFiles / VerifyInput); Plan::Execute of a
// writer runs it through ExecuteVerifyUnit. Returns false when there are none.
bool AddVerifyUnit(const state::CheckpointState& state, std::vector<Unit>* units);
absl::Status ExecuteVerifyUnit(const state::CheckpointState& state, const Unit& unit);

// For units split over ranks as `assignment` says: the input records
// (state::InputKey) each rank CRC-checks. Each record any unit reads is
// checked by one rank, so that no record is read whole by every rank that
// needs a piece of it: records largest first (by the bytes all ranks read of
// them), each to the rank with the fewest bytes to check so far among those
// that read at least half as much of it as the rank reading most (ties: the
// one reading more of it, then the lowest rank). So the checks are spread
// over the ranks that read a record, not all given to one of them.
std::vector<std::set<std::string>> AssignCheckers(const std::vector<Unit>& units,
                                                  const std::vector<std::vector<size_t>>& assignment);

// Splits the units over `ranks` by bytes, largest first, each to the rank
// with the fewest bytes so far (ties: the lowest rank). Deterministic.
std::vector<std::vector<size_t>> AssignUnits(const std::vector<Unit>& units, int ranks);

// The plan as text: per rank (units split as AssignUnits splits them over
// `ranks`), the units it runs, the bytes it writes, the input files it
// opens and the input records it CRC-checks (AssignCheckers; rank 0 also
// those the source's open owes to this thread's torch::OwedCrcChecks, the
// model-states files'); with `units`, every unit with its outputs and
// inputs. What `--dry_run` prints.
std::string DescribePlan(const Plan& plan, int ranks, bool units);

struct RunOptions {
  int num_threads = 0;
  bool overwrite = false;
  bool keep_temp_folder = false;  // keep the staging folder on failure
  bool write_latest = true;
  // The source checkpoint folder(s): the output may not be one of them, lie
  // inside one or contain one (CheckOutputApartFromInputs), --overwrite
  // included; the folders of the plan's source()->InputFiles() are added.
  std::vector<std::string> inputs;
  // Without it, a latest file that already exists in the root of inputs[0]
  // (the folder holding the input checkpoint) is left alone, and a note says
  // so: repointing it would change what that root's checkpoint is.
  bool update_latest = false;
  ProgressFn progress;
  // fsync the output before it is renamed into place (StagingDir's `sync`)
  // and start each unit's files' writeback as the unit ends; the CLI's
  // --fsync (false: as durable as cp -r).
  bool fsync = true;
};

// Plan, execute and commit in this process: a staging folder beside
// `output_folder` (BeginOutput), every unit, then CommitOutput.
absl::StatusOr<WriteStats> RunPlan(const Plan& plan, const std::string& output_folder, const RunOptions& options);

// RunPlan over the ranks of a cluster (an MPI job): rank 0 begins the
// output and tells the others where the staging folder is; every rank runs
// its units (AssignUnits: by bytes, largest first); rank 0 collects every
// rank's results and commits only if all succeeded, then tells everyone.
// Every rank returns the same status: a failing rank's error (prefixed with
// its rank) or the stats. Progress is reported for the rank's own units.
absl::StatusOr<WriteStats> RunPlanOnCluster(const Plan& plan, const std::string& output_folder,
                                            const RunOptions& options, Cluster& cluster);

// The two ends of every run, shared by RunPlan and the MPI executor (only
// its rank 0 calls them): the staging folder, with the plan's folders made;
// and, once every unit succeeded, Finish, rename into place, latest file.
absl::StatusOr<StagingDir> BeginOutput(const Plan& plan, const std::string& output_folder, const RunOptions& options);
absl::StatusOr<WriteStats> CommitOutput(const Plan& plan, StagingDir& staging, const std::vector<UnitResult>& results,
                                        const RunOptions& options);

// Sums what the units wrote into `stats` (files, bytes).
void AddUnitResults(const std::vector<UnitResult>& results, WriteStats* stats);

// Writes `root` with `w` to `staging`/`rel` and records the file (path and
// size) in `result`: the last step of a unit that writes one torch file.
absl::Status WriteUnitFile(torch::TorchWriter& w, const std::string& staging, const std::string& rel,
                           const pickle::Value& root, UnitResult* result);

// Writes the archive of writers[i] (root roots[i]) for every i back to back
// into `staging`/`rel`, each as torch.save writes one to a stream (records
// named `stem`/...; torch::TorchWriter::WriteBackToBack), and records the
// file and each archive's offset and length in `result`.
absl::Status WriteUnitItems(absl::Span<torch::TorchWriter* const> writers, const std::string& staging,
                            const std::string& rel, const std::string& stem,
                            absl::Span<const pickle::Value* const> roots, UnitResult* result);

// A large output file written by several units, each a piece of it (so that
// threads and ranks share one large file; torch::TorchWriter::WritePiece):
// every such unit builds the file's whole tree in `w` and writes piece
// `piece` of `pieces` of its storage bytes into `staging`/`rel` at their
// final offsets, reporting the CRC-32 of each record part it wrote in
// result->pieces (no file: the file is not complete). Once every unit
// succeeded, the plan's Finish calls FinishUnitPieces with the same tree,
// which writes the rest of the file (data.pkl, headers and descriptors with
// each record's CRC combined from every piece's parts, the directory) and
// returns the file's size: the file then holds the bytes WriteUnitFile
// would have written. Finish runs before the commit's fsync of the staging
// folder (on rank 0 of an MPI job, which writes into the file the other
// ranks wrote pieces of: the ranks share the file system), so crash safety
// is that of any other file; a failed piece fails ExecuteUnits and the
// staging folder, pieces and all, is removed uncommitted. Files written in
// pieces carry no digest (the bytes are not written in order): only
// outputs without a manifest digest (ZeRO checkpoints) are split, and their
// integrity is the zip CRC-32 of every record, which `ucp verify` checks.
absl::Status WriteUnitPiece(torch::TorchWriter& w, const std::string& staging, const std::string& rel,
                            const pickle::Value& root, int piece, int pieces, UnitResult* result);
absl::StatusOr<int64_t> FinishUnitPieces(torch::TorchWriter& w, const std::string& staging, const std::string& rel,
                                         const pickle::Value& root, const std::vector<UnitResult>& results);

}  // namespace ucp::writers

#endif  // UCP_WRITERS_PLAN_H_
