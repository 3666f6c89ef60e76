#include "writers/plan.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <map>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/flusher.h"
#include "base/fs.h"
#include "base/parallel.h"
#include "base/phases.h"
#include "base/status_macros.h"
#include "format/torch/mapped_file.h"
#include "format/torch/torch_file.h"
#include "format/torch/zip.h"
#include "tp/plan_io.h"
#include "writers/read_ahead.h"

namespace ucp::writers {

int64_t Plan::total_bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += u.bytes;
  return n;
}

int64_t FlushEveryBytes(int64_t bytes_to_write) {
  return std::clamp<int64_t>(bytes_to_write / 8, int64_t{32} << 20, int64_t{256} << 20);
}

absl::Status ExecuteUnits(const Plan& plan, const std::vector<size_t>& subset, const std::string& staging,
                          int threads, const ProgressFn& progress, bool writeback,
                          std::vector<UnitResult>* results, std::vector<torch::RecordReads>* pooled,
                          bool check_owed) {
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
  int64_t units_done = 0, bytes_done = 0;  // under progress_mu
  std::mutex progress_mu;
  // The CRC checks of the input records the units read run on a thread of
  // their own while the units read and write (a unit reads its bytes before
  // they are known to be right); the units' results count only once every
  // check has passed. Without this the first units would each read whole
  // input records (every record a unit touches is checked whole) before
  // writing anything: on a cold page cache, the reads and the writes would
  // follow each other instead of overlapping.
  PhaseTimes* const times = PhaseTimes::Current();  // --timings: bound on the threads that run units
  PhaseTimer wait(Phase::kUnits);
  torch::DeferredCrcChecks checks(threads);
  if (pooled != nullptr) checks.PoolReads();
  // What the source's open did not check (the model-states files' tensors):
  // queued first, so checked while the units run rather than before them.
  if (torch::OwedCrcChecks* owed = torch::OwedCrcChecks::Current(); check_owed && owed != nullptr) {
    torch::DeferredCrcChecks::Scope scope(&checks);
    UCP_RETURN_IF_ERROR(owed->CheckAll());
  }
  // With writeback (--fsync), the units' files are written back and flushed
  // to disk in steps while the units run (base/flusher.h): the commit's sync
  // then has little left to do.
  BackgroundFlusher flusher(writeback ? FlushEveryBytes(total.bytes_total) : 0);
  // The next units' input bytes are asked of the kernel while these run
  // (writers/read_ahead.h): cold, the disk reads them in large requests
  // while the units compute and write, instead of idling between their
  // reads.
  const state::CheckpointState* ahead_of = plan.read_ahead_source();
  ReadAhead read_ahead(units, order,
                       ahead_of == nullptr ? ReadAhead::ExtentFn()
                                           : [ahead_of](const InputRange& r) { return ahead_of->ExtentOf(r); },
                       kReadAheadBytes);
  absl::Status ran_all = ParallelFor(order.size(), threads, [&](size_t k) -> absl::Status {
    const size_t i = order[k];
    // On every return: what was read ahead for it no longer counts.
    absl::Cleanup ended = [&read_ahead, k] { read_ahead.Finished(k); };
    PhaseScope bound(times);
    FlusherScope flushing(&flusher);
    absl::Status ran;
    {
      torch::DeferredCrcChecks::Scope scope(&checks);
      PhaseTimer unit(Phase::kMerge);
      ran = plan.Execute(i, staging, &(*results)[i]);
    }
    // An input truncated under us reads as zeros (MappedFile's SIGBUS
    // handler) or makes a write from its mapping fail (EFAULT): that, not
    // what it caused, is the error.
    if (!ran.ok() || torch::MappedFile::AnyFault()) UCP_RETURN_IF_ERROR(torch::MappedFile::CheckAllIntact());
    UCP_RETURN_IF_ERROR(ran);
    // Start writing the unit's files back to disk now (on the flusher's
    // thread), so that the fsync before the commit (StagingDir::Commit) has
    // little left to wait for.
    for (const FileDigest& f : (*results)[i].files) flusher.Written(JoinPath(staging, f.path()), f.size());
    // Counted and reported under one lock: the events come in order, the
    // last one complete (two threads finishing together cannot report 87
    // of 87 before 86 of 87).
    std::lock_guard<std::mutex> lock(progress_mu);
    units_done += 1;
    bytes_done += units[i].bytes;
    if (progress) {
      ProgressEvent e = total;
      e.units_done = units_done;
      e.bytes_done = bytes_done;
      progress(e);
    }
    return absl::OkStatus();
  });
  // A damaged input explains whatever else went wrong: it comes first.
  UCP_RETURN_IF_ERROR(checks.Wait());
  UCP_RETURN_IF_ERROR(ran_all);
  if (pooled != nullptr) *pooled = checks.TakePooledReads();
  return flusher.Finish();
}

bool AddVerifyUnit(const state::CheckpointState& state, std::vector<Unit>* units) {
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

absl::Status ExecuteVerifyUnit(const state::CheckpointState& state, const Unit& unit) {
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

std::string DescribePlan(const Plan& plan, int ranks, bool units) {
  const std::vector<std::vector<size_t>> assignment = AssignUnits(plan.units(), ranks);
  const std::vector<std::set<std::string>> checkers = AssignCheckers(plan.units(), assignment);
  const torch::OwedCrcChecks* owed = torch::OwedCrcChecks::Current();
  std::string out = absl::StrCat("plan: ", plan.units().size(), " units, ", plan.total_bytes(), " bytes to write, over ",
                                 assignment.size(), " rank(s)\n");
  for (size_t r = 0; r < assignment.size(); ++r) {
    int64_t bytes = 0;
    std::set<std::string> files;
    for (size_t i : assignment[r]) {
      bytes += plan.units()[i].bytes;
      for (const InputRange& in : plan.units()[i].inputs) files.insert(in.path);
    }
    absl::StrAppend(&out, "rank ", r, ": ", assignment[r].size(), " units, ", bytes, " bytes to write, opens ",
                    files.size(), " input files, CRC-checks ", checkers[r].size(), " input records");
    // What the source's open left unchecked (torch::OwedCrcChecks: the
    // model-states files' records), checked beside its units by the rank
    // OwedCrcChecks::MadeByRank names.
    if (torch::OwedCrcChecks::MadeByRank(static_cast<int>(r)) && owed != nullptr && owed->files() > 0) {
      absl::StrAppend(&out, " + the ", owed->records(), " records of ", owed->files(),
                      owed->files() == 1 ? " model-states file" : " model-states files", " beside the units");
    }
    absl::StrAppend(&out, "\n");
    if (!units) continue;
    for (size_t i : assignment[r]) {
      const Unit& u = plan.units()[i];
      absl::StrAppend(&out, "  unit ", i, " ", u.name, ": ", u.bytes, " bytes\n");
      for (const std::string& o : u.outputs) absl::StrAppend(&out, "    writes ", o, "\n");
      for (const InputRange& in : u.inputs) {
        absl::StrAppend(&out, "    reads ", in.path);
        if (!in.tensor.empty()) absl::StrAppend(&out, " ", in.tensor, " bytes [", in.offset, ", ", in.offset + in.length, ")");
        absl::StrAppend(&out, "\n");
      }
    }
  }
  return out;
}

std::vector<std::set<std::string>> AssignCheckers(const std::vector<Unit>& units,
                                                  const std::vector<std::vector<size_t>>& assignment) {
  // key -> bytes read by each rank
  std::map<std::string, std::vector<int64_t>> read;
  for (size_t r = 0; r < assignment.size(); ++r) {
    for (size_t i : assignment[r]) {
      for (const InputRange& in : units[i].inputs) {
        std::vector<int64_t>& by_rank = read[state::InputKey(in.path, in.tensor)];
        by_rank.resize(assignment.size(), 0);
        by_rank[r] += std::max<int64_t>(in.length, 1);
      }
    }
  }
  // Largest first (the bytes all ranks read of it stand for its size), each
  // to the least loaded of the ranks that read at least half as much of it
  // as the rank reading most: with only the top reader, one rank could get
  // every record of a file that all ranks read evenly (a flat optimizer
  // partition read by every param's unit) and check them alone while the
  // others wait.
  std::vector<std::pair<int64_t, const std::string*>> order;
  for (const auto& [key, by_rank] : read) {
    int64_t total = 0;
    for (int64_t b : by_rank) total += b;
    order.push_back({total, &key});
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::set<std::string>> out(assignment.size());
  std::vector<int64_t> load(assignment.size(), 0);
  for (const auto& [total, key] : order) {
    const std::vector<int64_t>& by_rank = read[*key];
    const int64_t most = *std::max_element(by_rank.begin(), by_rank.end());
    size_t best = assignment.size();
    for (size_t r = 0; r < by_rank.size(); ++r) {
      if (2 * by_rank[r] < most) continue;
      if (best == assignment.size() || load[r] < load[best] || (load[r] == load[best] && by_rank[r] > by_rank[best])) {
        best = r;
      }
    }
    out[best].insert(*key);
    load[best] += total;
  }
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
  if (output_folder.empty()) return absl::InvalidArgumentError("--output_folder is empty");
  std::vector<std::string> inputs = options.inputs;
  if (plan.source() != nullptr) {
    std::set<std::string> dirs;
    for (const std::string& f : plan.source()->InputFiles()) dirs.insert(Dirname(f));
    inputs.insert(inputs.end(), dirs.begin(), dirs.end());
  }
  UCP_RETURN_IF_ERROR(CheckOutputApartFromInputs(output_folder, inputs));
  UCP_ASSIGN_OR_RETURN(StagingDir staging, StagingDir::Create(output_folder, options.overwrite, options.fsync));
  if (options.keep_temp_folder) staging.Keep();
  UCP_RETURN_IF_ERROR(plan.Prepare(staging.path()));
  return staging;
}

absl::StatusOr<WriteStats> CommitOutput(const Plan& plan, StagingDir& staging, const std::vector<UnitResult>& results,
                                        const RunOptions& options) {
  // Every input read whole and unchanged (MappedFile: no file shrank).
  UCP_RETURN_IF_ERROR(torch::MappedFile::CheckAllIntact());
  absl::StatusOr<WriteStats> finished;
  {
    // The manifest and the other files Finish writes (each fsynced: its
    // fsync can wait for much of the output still on its way to disk) are
    // part of the commit in --timings, not of the opening.
    PhaseTimer timer(Phase::kCommit);
    finished = plan.Finish(results, staging.path());
  }
  UCP_ASSIGN_OR_RETURN(WriteStats stats, std::move(finished));
  UCP_RETURN_IF_ERROR(staging.Commit());
  for (const auto& n : staging.notes()) stats.notes.push_back(n);
  if (options.write_latest && !plan.latest_file().empty()) {
    const std::string latest = JoinPath(Dirname(staging.target()), plan.latest_file());
    const bool input_root = !options.inputs.empty() && !options.inputs[0].empty() &&
                            ResolvePath(Dirname(staging.target())) == ResolvePath(Dirname(options.inputs[0]));
    if (input_root && PathExists(latest) && !options.update_latest) {
      auto old = ReadFileToString(latest, 4096);
      stats.notes.push_back(absl::StrCat(latest, " left alone (still '", old.ok() ? std::string(absl::StripAsciiWhitespace(*old)) : "?",
                                         "'): it is the input checkpoint's root; pass --update_latest to point it to ",
                                         Basename(staging.target())));
      return stats;
    }
    absl::Status s = WriteFileAtomic(latest, Basename(staging.target()));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("the checkpoint itself is complete and committed at ", staging.target(),
                                                  ", but writing ", latest, " failed: ", s.message(),
                                                  ". Write it yourself (echo ", Basename(staging.target()), " > ",
                                                  latest, ") or load the tag explicitly"));
    }
  }
  return stats;
}

absl::StatusOr<WriteStats> RunPlan(const Plan& plan, const std::string& output_folder, const RunOptions& options) {
  UCP_ASSIGN_OR_RETURN(StagingDir staging, BeginOutput(plan, output_folder, options));
  std::vector<size_t> all(plan.units().size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  std::vector<UnitResult> results;
  UCP_RETURN_IF_ERROR(ExecuteUnits(plan, all, staging.path(), options.num_threads, options.progress, options.fsync, &results));
  return CommitOutput(plan, staging, results, options);
}

namespace {

JobMessage StatusMessage(const absl::Status& s) {
  JobMessage m;
  m.set_code(static_cast<int>(s.code()));
  m.set_message(std::string(s.message()));
  return m;
}

absl::Status StatusOf(const JobMessage& m) {
  return absl::Status(static_cast<absl::StatusCode>(m.code()), m.message());
}

// Broadcasts rank 0's message; every rank gets it back (parsed).
absl::StatusOr<JobMessage> Share(Cluster& cluster, const JobMessage& mine) {
  std::string bytes = cluster.rank() == 0 ? mine.SerializeAsString() : std::string();
  UCP_RETURN_IF_ERROR(cluster.Broadcast(&bytes, 0));
  JobMessage m;
  if (!m.ParseFromString(bytes)) return absl::InternalError("a rank sent a message that does not parse");
  return m;
}

void ReadsToProto(const torch::RecordReads& r, InputRecordReads* m) {
  m->set_archive(r.archive);
  m->set_record(r.record);
  m->set_path(r.path);
  m->set_file_offset(r.file_offset);
  m->set_size(r.size);
  m->set_stored_crc32(r.stored_crc);
  for (const torch::ReadPiece& p : r.pieces) {
    m->add_offset(p.offset);
    m->add_length(p.length);
    m->add_crc32(p.crc);
  }
}

absl::Status ReadsFromProto(const InputRecordReads& m, int rank, std::vector<torch::RecordReads>* out) {
  if (m.offset_size() != m.length_size() || m.offset_size() != m.crc32_size()) {
    return absl::InternalError(absl::StrCat("rank ", rank, " reported ranges of ", m.path(), " that do not pair up"));
  }
  torch::RecordReads x;
  x.archive = m.archive();
  x.record = m.record();
  x.path = m.path();
  x.file_offset = m.file_offset();
  x.size = m.size();
  x.stored_crc = m.stored_crc32();
  for (int k = 0; k < m.offset_size(); ++k) x.pieces.push_back({m.offset(k), m.length(k), m.crc32(k)});
  out->push_back(std::move(x));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WriteStats> RunPlanOnCluster(const Plan& plan, const std::string& output_folder,
                                            const RunOptions& options, Cluster& cluster) {
  const int rank = cluster.rank();
  // 1. Rank 0 makes the staging folder.
  std::optional<StagingDir> staging;
  JobMessage start;
  if (rank == 0) {
    absl::StatusOr<StagingDir> s = BeginOutput(plan, output_folder, options);
    if (s.ok()) {
      start.set_staging(s->path());
      staging.emplace(*std::move(s));
    } else {
      start = StatusMessage(s.status());
    }
  }
  UCP_ASSIGN_OR_RETURN(JobMessage started, Share(cluster, start));
  UCP_RETURN_IF_ERROR(StatusOf(started));
  // 2. Every rank runs its units, CRC-checking the input records it was
  //    given (one rank per record).
  const std::vector<std::vector<size_t>> assignment = AssignUnits(plan.units(), cluster.size());
  // (One rank checks every input, as one process does: from what it reads.)
  if (plan.source() != nullptr && cluster.size() > 1) {
    plan.source()->SetCheckedInputs(
        std::make_shared<const std::set<std::string>>(AssignCheckers(plan.units(), assignment)[rank]));
  }
  std::vector<UnitResult> results;
  // Each rank reads part of most large input records (a flat optimizer
  // partition that every param's unit slices): the ranks pool the CRC-32s
  // of what they read, and rank 0 joins them and reads only what no rank
  // read, instead of one rank reading each record whole once more.
  std::vector<torch::RecordReads> pooled;
  const bool pool = cluster.size() > 1;
  absl::Status ran = ExecuteUnits(plan, assignment[rank], started.staging(), options.num_threads,
                                  rank == 0 ? options.progress : ProgressFn(), options.fsync, &results,
                                  pool ? &pooled : nullptr, /*check_owed=*/torch::OwedCrcChecks::MadeByRank(rank));
  // Every input this rank read is still whole (no file shrank under it).
  if (ran.ok()) ran = torch::MappedFile::CheckAllIntact();
  RankReport report;
  report.set_code(static_cast<int>(ran.code()));
  report.set_message(std::string(ran.message()));
  if (ran.ok()) {
    for (const torch::RecordReads& r : pooled) ReadsToProto(r, report.add_input_read());
    for (size_t i : assignment[rank]) {
      RankReport::UnitFiles* u = report.add_unit();
      u->set_unit(static_cast<int>(i));
      for (const FileDigest& f : results[i].files) *u->add_file() = f;
      for (const RecordPiece& p : results[i].pieces) *u->add_piece() = p;
      for (const FileItem& item : results[i].items) *u->add_item() = item;
    }
  }
  // 3. Rank 0 collects, commits or not, and says how it went.
  std::vector<std::string> rank0_notes;
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> reports, cluster.Gather(report.SerializeAsString(), 0));
  JobMessage verdict;
  if (rank == 0) {
    std::vector<UnitResult> all(plan.units().size());
    std::vector<torch::RecordReads> reads;
    absl::Status failed;
    for (size_t r = 0; r < reports.size() && failed.ok(); ++r) {
      RankReport rr;
      if (!rr.ParseFromString(reports[r])) {
        failed = absl::InternalError(absl::StrCat("rank ", r, " sent a report that does not parse"));
        break;
      }
      if (rr.code() != 0) {
        failed = absl::Status(static_cast<absl::StatusCode>(rr.code()), absl::StrCat("rank ", r, ": ", rr.message()));
        break;
      }
      for (const auto& u : rr.unit()) {
        if (u.unit() < 0 || static_cast<size_t>(u.unit()) >= all.size()) {
          failed = absl::InternalError(absl::StrCat("rank ", r, " reported unit ", u.unit()));
          break;
        }
        all[u.unit()].files.assign(u.file().begin(), u.file().end());
        all[u.unit()].pieces.assign(u.piece().begin(), u.piece().end());
        all[u.unit()].items.assign(u.item().begin(), u.item().end());
      }
      for (const InputRecordReads& m : rr.input_read()) {
        if (!failed.ok()) break;
        failed = ReadsFromProto(m, static_cast<int>(r), &reads);
      }
    }
    // Every input record the ranks read in part, whole and unchanged.
    if (failed.ok()) failed = torch::CheckPooledReads(reads, options.num_threads);
    if (failed.ok()) {
      absl::StatusOr<WriteStats> stats = CommitOutput(plan, *staging, all, options);
      if (stats.ok()) {
        verdict.set_files(stats->files);
        verdict.set_bytes(stats->bytes);
        verdict.set_params(stats->params);
        rank0_notes = stats->notes;
      } else {
        verdict = StatusMessage(stats.status());
      }
    } else {
      verdict = StatusMessage(failed);
    }
    staging.reset();  // removes the staging folder unless committed
  }
  UCP_ASSIGN_OR_RETURN(JobMessage done, Share(cluster, verdict));
  UCP_RETURN_IF_ERROR(StatusOf(done));
  WriteStats stats;
  stats.files = done.files();
  stats.bytes = done.bytes();
  stats.params = done.params();
  stats.notes = rank0_notes;
  return stats;
}

absl::Status WriteUnitFile(torch::TorchWriter& w, const std::string& staging, const std::string& rel,
                           const pickle::Value& root, UnitResult* result) {
  UCP_ASSIGN_OR_RETURN(tp::WrittenFile f, tp::WriteTorchFile(w, JoinPath(staging, rel), root));
  FileDigest digest;
  digest.set_path(rel);
  digest.set_size(f.size);
  result->files.push_back(std::move(digest));
  return absl::OkStatus();
}

absl::Status WriteUnitItems(absl::Span<torch::TorchWriter* const> writers, const std::string& staging,
                            const std::string& rel, const std::string& stem,
                            absl::Span<const pickle::Value* const> roots, UnitResult* result) {
  std::vector<uint64_t> lengths;
  UCP_RETURN_IF_ERROR(torch::TorchWriter::WriteBackToBack(writers, JoinPath(staging, rel), stem, roots, &lengths));
  uint64_t offset = 0;
  for (uint64_t length : lengths) {
    FileItem item;
    item.set_path(rel);
    item.set_offset(offset);
    item.set_length(length);
    result->items.push_back(std::move(item));
    offset += length;
  }
  FileDigest digest;
  digest.set_path(rel);
  digest.set_size(static_cast<int64_t>(offset));
  result->files.push_back(std::move(digest));
  return absl::OkStatus();
}

absl::Status WriteUnitPiece(torch::TorchWriter& w, const std::string& staging, const std::string& rel,
                            const pickle::Value& root, int piece, int pieces, UnitResult* result) {
  std::vector<torch::RecordPieceCrc> crcs;
  UCP_RETURN_IF_ERROR(w.WritePiece(JoinPath(staging, rel), root, piece, pieces, &crcs));
  for (const torch::RecordPieceCrc& c : crcs) {
    RecordPiece p;
    p.set_path(rel);
    p.set_record(c.record);
    p.set_offset(c.offset);
    p.set_length(c.length);
    p.set_crc32(c.crc32);
    result->pieces.push_back(std::move(p));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FinishUnitPieces(torch::TorchWriter& w, const std::string& staging, const std::string& rel,
                                         const pickle::Value& root, const std::vector<UnitResult>& results) {
  std::vector<torch::RecordPieceCrc> crcs;
  for (const UnitResult& r : results) {
    for (const RecordPiece& p : r.pieces) {
      if (p.path() == rel) crcs.push_back({p.record(), p.offset(), p.length(), p.crc32()});
    }
  }
  UCP_ASSIGN_OR_RETURN(uint64_t size, w.FinishPieces(JoinPath(staging, rel), root, crcs));
  return static_cast<int64_t>(size);
}

}  // namespace ucp::writers
