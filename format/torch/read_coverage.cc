#include "format/torch/read_coverage.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "base/parallel.h"
#include "base/phases.h"
#include "format/torch/crc32.h"

namespace ucp::torch {

namespace {

thread_local ReadCoverage* current_coverage = nullptr;

struct Piece {
  uint64_t offset;
  uint64_t length;
  uint32_t crc;
};

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
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.length > b.length;
    });
    uint32_t crc = 0;
    uint64_t at = 0;
    auto gap = [&](uint64_t end) {
      if (end <= at) return;
      crc = Crc32Combine(crc, gap_crc(bytes.subspan(at, end - at), at), end - at);
      *gaps += end - at;
      at = end;
    };
    for (const Piece& p : pieces) {
      if (p.offset < at) continue;  // overlaps what is joined already: its rest is read as a gap
      gap(p.offset);
      crc = Crc32Combine(crc, p.crc, p.length);
      *covered += p.length;
      at += p.length;
    }
    gap(bytes.size());
    return crc;
  }
};

ReadCoverage::ReadCoverage() = default;
ReadCoverage::~ReadCoverage() = default;

void ReadCoverage::Track(absl::Span<const uint8_t> bytes, GapCrc gap_crc, Verdict verdict) {
  auto r = std::make_unique<Record>();
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
  std::mutex mu;
  absl::Status first;  // guarded by mu
  absl::Status ran = ParallelFor(records.size(), std::max(threads, 1), [&](size_t i) -> absl::Status {
    uint64_t c = 0, g = 0;
    const uint32_t crc = records[i]->Crc(&c, &g);
    covered += c;
    gaps += g;
    absl::Status s = records[i]->verdict(crc);
    std::lock_guard<std::mutex> lock(mu);
    if (!s.ok() && first.ok()) first = s;
    return absl::OkStatus();
  });
  covered_ += covered.load();
  gaps_ += gaps.load();
  return first.ok() ? ran : first;
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
