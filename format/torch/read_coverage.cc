#include "format/torch/read_coverage.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/parallel.h"
#include "base/phases.h"
#include "base/status_macros.h"
#include "format/torch/crc32.h"
#include "format/torch/mapped_file.h"

namespace ucp::torch {

namespace {

thread_local ReadCoverage* current_coverage = nullptr;

using Piece = ReadPiece;

// The CRC-32 of `size` bytes from their pieces (sorted here) and the gaps
// between them (gap(offset, length) returns a gap's CRC-32).
uint32_t JoinCrc(std::vector<Piece>& pieces, uint64_t size, const std::function<uint32_t(uint64_t, uint64_t)>& gap_crc,
                 uint64_t* covered, uint64_t* gaps) {
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.length > b.length;
  });
  uint32_t crc = 0;
  uint64_t at = 0;
  auto gap = [&](uint64_t end) {
    if (end <= at) return;
    crc = Crc32Combine(crc, gap_crc(at, end - at), end - at);
    *gaps += end - at;
    at = end;
  };
  for (const Piece& p : pieces) {
    if (p.offset < at || p.offset + p.length > size) continue;  // overlaps what is joined: its rest is a gap
    gap(p.offset);
    crc = Crc32Combine(crc, p.crc, p.length);
    *covered += p.length;
    at += p.length;
  }
  gap(size);
  return crc;
}

// Every item's status computed (after a failure too); the first error.
absl::Status ForEachKeepFirstError(size_t n, int threads, const std::function<absl::Status(size_t)>& fn) {
  std::mutex mu;
  absl::Status first;  // guarded by mu
  PhaseTimes* const times = PhaseTimes::Current();  // the caller's (--timings): gaps read show as "input re-read (CRC)"
  absl::Status ran = ParallelFor(n, std::max(threads, 0), [&](size_t i) -> absl::Status {
    PhaseScope timing(times);
    absl::Status s = fn(i);
    std::lock_guard<std::mutex> lock(mu);
    if (!s.ok() && first.ok()) first = s;
    return absl::OkStatus();
  });
  return first.ok() ? ran : first;
}

}  // namespace

struct ReadCoverage::Record {
  absl::Span<const uint8_t> bytes;
  GapCrc gap_crc;
  Verdict verdict;
  std::mutex mu;
  std::vector<Piece> pieces;  // guarded by mu

  void Add(uint64_t offset, uint64_t length, uint32_t crc) {
    std::lock_guard<std::mutex> lock(mu);
    // A unit reads a range in steps, one after the other: one piece.
    if (!pieces.empty() && pieces.back().offset + pieces.back().length == offset) {
      Piece& last = pieces.back();
      last.crc = Crc32Combine(last.crc, crc, length);
      last.length += length;
      return;
    }
    pieces.push_back({offset, length, crc});
  }

  // The record's CRC-32 from its pieces, reading what no piece covers.
  uint32_t Crc(uint64_t* covered, uint64_t* gaps) {
    return JoinCrc(
        pieces, bytes.size(),
        [&](uint64_t offset, uint64_t length) { return gap_crc(bytes.subspan(offset, length), offset); }, covered,
        gaps);
  }

  std::string archive, record;
  uint32_t stored_crc = 0;
};

ReadCoverage::ReadCoverage() = default;
ReadCoverage::~ReadCoverage() = default;

void ReadCoverage::Track(absl::Span<const uint8_t> bytes, GapCrc gap_crc, Verdict verdict, std::string archive,
                         std::string record, uint32_t stored_crc) {
  auto r = std::make_unique<Record>();
  r->archive = std::move(archive);
  r->record = std::move(record);
  r->stored_crc = stored_crc;
  r->bytes = bytes;
  r->gap_crc = std::move(gap_crc);
  r->verdict = std::move(verdict);
  std::unique_lock<std::shared_mutex> lock(mu_);
  records_[bytes.data()] = std::move(r);
}

ReadCoverage::Record* ReadCoverage::Find(const uint8_t* p, size_t n) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = records_.upper_bound(p);
  if (it == records_.begin()) return nullptr;
  --it;
  Record* r = it->second.get();
  const uint8_t* begin = r->bytes.data();
  if (p < begin || p + n > begin + r->bytes.size()) return nullptr;
  return r;
}

absl::Status ReadCoverage::CheckAll(int threads) {
  std::vector<std::unique_ptr<Record>> records;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    for (auto& [p, r] : records_) records.push_back(std::move(r));
    records_.clear();
  }
  // Every record gets its verdict, after a failure too (a record whose
  // verdict never came would stay "being checked" for its reader).
  std::atomic<uint64_t> covered{0}, gaps{0};
  absl::Status s = ForEachKeepFirstError(records.size(), threads, [&](size_t i) {
    uint64_t c = 0, g = 0;
    const uint32_t crc = records[i]->Crc(&c, &g);
    covered += c;
    gaps += g;
    return records[i]->verdict(crc);
  });
  covered_ += covered.load();
  gaps_ += gaps.load();
  return s;
}

std::vector<RecordReads> ReadCoverage::TakeReads(int threads, absl::Status* checked) {
  std::vector<RecordReads> out;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    for (auto it = records_.begin(); it != records_.end();) {
      Record& r = *it->second;
      RecordReads reads;
      if (!MappedFile::Locate(r.bytes.data(), r.bytes.size(), &reads.path, &reads.file_offset)) {
        ++it;
        continue;
      }
      reads.archive = r.archive;
      reads.record = r.record;
      reads.size = r.bytes.size();
      reads.stored_crc = r.stored_crc;
      reads.pieces = std::move(r.pieces);
      for (const Piece& p : reads.pieces) covered_ += p.length;
      out.push_back(std::move(reads));
      it = records_.erase(it);
    }
  }
  *checked = CheckAll(threads);
  return out;
}

absl::Status CheckPooledReads(const std::vector<RecordReads>& reads, int threads) {
  // One entry per record, with every process's pieces.
  std::map<std::pair<std::string, uint64_t>, RecordReads> joined;
  for (const RecordReads& r : reads) {
    auto [it, added] = joined.try_emplace({r.path, r.file_offset}, r);
    if (added) continue;
    RecordReads& j = it->second;
    if (j.size != r.size || j.stored_crc != r.stored_crc || j.record != r.record) {
      return absl::InternalError(absl::StrCat(r.path, ": the ranks disagree on the record at offset ", r.file_offset,
                                              ": '", j.record, "' of ", j.size, " bytes with CRC ", j.stored_crc,
                                              ", and '", r.record, "' of ", r.size, " bytes with CRC ", r.stored_crc));
    }
    j.pieces.insert(j.pieces.end(), r.pieces.begin(), r.pieces.end());
  }
  std::vector<RecordReads*> all;
  for (auto& [key, r] : joined) all.push_back(&r);
  return ForEachKeepFirstError(all.size(), threads, [&](size_t i) -> absl::Status {
    RecordReads& r = *all[i];
    UCP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(r.path));
    absl::Status read_error;
    std::vector<uint8_t> buf;
    uint64_t covered = 0, gaps = 0;
    const uint32_t crc = JoinCrc(
        r.pieces, r.size,
        [&](uint64_t offset, uint64_t length) -> uint32_t {
          PhaseTimer timer(Phase::kInputReread, static_cast<int64_t>(length));
          constexpr uint64_t kStep = uint64_t{1} << 20;
          buf.resize(static_cast<size_t>(std::min(length, kStep)));
          uint32_t c = 0;
          for (uint64_t done = 0; done < length && read_error.ok(); done += kStep) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(kStep, length - done));
            read_error = file->ReadAt(r.file_offset + offset + done, absl::MakeSpan(buf.data(), n));
            if (read_error.ok()) c = Crc32(c, buf.data(), n);
          }
          return c;
        },
        &covered, &gaps);
    if (!read_error.ok()) return read_error;
    if (crc != r.stored_crc) {
      return absl::DataLossError(absl::StrFormat("%s: record '%s': CRC-32 mismatch (stored %08x, computed %08x)",
                                                 r.archive, r.record, r.stored_crc, crc));
    }
    return absl::OkStatus();
  });
}

void ReadCoverage::NoteRead(const uint8_t* p, size_t n, uint32_t crc) {
  ReadCoverage* c = current_coverage;
  if (c == nullptr || n == 0) return;
  Record* r = c->Find(p, n);
  if (r != nullptr) r->Add(static_cast<uint64_t>(p - r->bytes.data()), n, crc);
}

void ReadCoverage::NoteCopy(const uint8_t* src, const uint8_t* copy, size_t n) {
  ReadCoverage* c = current_coverage;
  if (c == nullptr || n == 0) return;
  Record* r = c->Find(src, n);
  if (r == nullptr) return;
  uint32_t crc;
  {
    PhaseTimer timer(Phase::kInputCrc, static_cast<int64_t>(n));
    crc = Crc32(0, copy, n);
  }
  r->Add(static_cast<uint64_t>(src - r->bytes.data()), n, crc);
}

bool ReadCoverage::Tracks(const uint8_t* p, size_t n) {
  ReadCoverage* c = current_coverage;
  return c != nullptr && n > 0 && c->Find(p, n) != nullptr;
}

ReadCoverage* ReadCoverage::Current() { return current_coverage; }

ReadCoverage::Scope::Scope(ReadCoverage* coverage) : previous_(current_coverage) { current_coverage = coverage; }
ReadCoverage::Scope::~Scope() { current_coverage = previous_; }

}  // namespace ucp::torch
