#include "format/torch/read_coverage.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "format/torch/crc32.h"
#include "format/torch/mapped_file.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

struct Tracked {
  uint32_t crc = 0;
  bool checked = false;
  uint64_t gap_calls = 0;
};

// Tracks `bytes` in `coverage`; the verdict records the CRC it is given.
void TrackInto(ReadCoverage& coverage, absl::Span<const uint8_t> bytes, Tracked* t) {
  coverage.Track(
      bytes,
      [t](absl::Span<const uint8_t> gap, uint64_t) {
        t->gap_calls += 1;
        return Crc32(0, gap.data(), gap.size());
      },
      [t](uint32_t crc) {
        t->crc = crc;
        t->checked = true;
        return absl::OkStatus();
      });
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Pieces read in any order, from several threads, overlapping or not,
// joined with the gaps: always the CRC of the whole record; the gaps are
// exactly the bytes no piece covered once overlaps are dropped.
TEST(ReadCoverageTest, RandomPiecesJoinToTheRecordsCrc) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const size_t n = 1 + rng() % 20000;
    const std::vector<uint8_t> data = RandomBytes(n, round);
    ReadCoverage coverage;
    Tracked t;
    TrackInto(coverage, data, &t);
    std::vector<std::pair<size_t, size_t>> reads;
    const int k = rng() % 12;
    for (int i = 0; i < k; ++i) {
      size_t a = rng() % n, b = rng() % n;
      if (a > b) std::swap(a, b);
      if (b > a) reads.push_back({a, b});
    }
    if (rng() % 3 == 0) {  // a tiling, shuffled
      reads.clear();
      for (size_t at = 0; at < n;) {
        const size_t len = std::min<size_t>(n - at, 1 + rng() % 3000);
        reads.push_back({at, at + len});
        at += len;
      }
      std::shuffle(reads.begin(), reads.end(), rng);
    }
    std::vector<std::thread> threads;
    const int nt = 1 + rng() % 3;
    for (int j = 0; j < nt; ++j) {
      threads.emplace_back([&, j] {
        ReadCoverage::Scope scope(&coverage);
        for (size_t i = j; i < reads.size(); i += nt) {
          const auto [a, b] = reads[i];
          if (i % 2 == 0) {
            ReadCoverage::NoteRead(data.data() + a, b - a, Crc32(0, data.data() + a, b - a));
          } else {
            std::vector<uint8_t> copy(data.begin() + a, data.begin() + b);
            ReadCoverage::NoteCopy(data.data() + a, copy.data(), copy.size());
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_TRUE(coverage.CheckAll(1 + round % 3).ok());
    ASSERT_TRUE(t.checked);
    EXPECT_EQ(t.crc, Crc32(0, data.data(), data.size())) << "round " << round;
    EXPECT_EQ(coverage.covered_bytes() + coverage.gap_bytes(), n);
    if (reads.empty()) {
      EXPECT_EQ(coverage.gap_bytes(), n);
    }
  }
}

// A piece's CRC is of the bytes as read: a copy that differs from the
// record (the bytes changed under the reader) makes the joined CRC differ.
TEST(ReadCoverageTest, ACopyThatDiffersIsNotTheRecord) {
  const std::vector<uint8_t> data = RandomBytes(10000, 1);
  ReadCoverage coverage;
  Tracked t;
  TrackInto(coverage, data, &t);
  std::vector<uint8_t> copy(data.begin() + 100, data.begin() + 9000);
  copy[5] ^= 1;
  {
    ReadCoverage::Scope scope(&coverage);
    ReadCoverage::NoteCopy(data.data() + 100, copy.data(), copy.size());
  }
  ASSERT_TRUE(coverage.CheckAll(1).ok());
  EXPECT_NE(t.crc, Crc32(0, data.data(), data.size()));
  EXPECT_EQ(coverage.covered_bytes(), 8900u);
  EXPECT_EQ(coverage.gap_bytes(), 1100u);
}

// Reads outside a scope, of bytes of no tracked record, or straddling a
// record's end are not pieces; contiguous reads merge into one piece (one
// gap call per hole, not per read).
TEST(ReadCoverageTest, OnlyReadsWithinATrackedRecordCount) {
  const std::vector<uint8_t> data = RandomBytes(4096, 2);
  const std::vector<uint8_t> other = RandomBytes(4096, 3);
  ReadCoverage coverage;
  Tracked t;
  TrackInto(coverage, absl::MakeConstSpan(data).subspan(0, 2048), &t);
  ReadCoverage::NoteRead(data.data(), 100, Crc32(0, data.data(), 100));  // no scope
  EXPECT_FALSE(ReadCoverage::Tracks(data.data(), 100));
  {
    ReadCoverage::Scope scope(&coverage);
    EXPECT_EQ(ReadCoverage::Current(), &coverage);
    EXPECT_TRUE(ReadCoverage::Tracks(data.data() + 10, 100));
    EXPECT_FALSE(ReadCoverage::Tracks(data.data() + 2000, 100));  // past the record's end
    EXPECT_FALSE(ReadCoverage::Tracks(other.data(), 100));
    ReadCoverage::NoteRead(other.data(), 100, 0);
    ReadCoverage::NoteRead(data.data() + 2000, 100, 0);
    for (size_t at = 200; at < 1200; at += 100) {
      ReadCoverage::NoteRead(data.data() + at, 100, Crc32(0, data.data() + at, 100));
    }
  }
  EXPECT_EQ(ReadCoverage::Current(), nullptr);
  ASSERT_TRUE(coverage.CheckAll(2).ok());
  EXPECT_EQ(t.crc, Crc32(0, data.data(), 2048));
  EXPECT_EQ(coverage.covered_bytes(), 1000u);
  EXPECT_EQ(coverage.gap_bytes(), 1048u);
  EXPECT_EQ(t.gap_calls, 2u);  // [0, 200) and [1200, 2048)
}

// Ranks that split the units pool what they read of a record of a mapped
// file: each hands its ranges over (TakeReads), one joins them and reads the
// rest from the file (CheckPooledReads). A byte changed in the file where no
// rank read it, or a range whose CRC is not the file's, is a mismatch that
// names the archive and the record.
TEST(ReadCoverageTest, PooledReadsOfRanksJoinWithTheFile) {
  const std::vector<uint8_t> data = RandomBytes(300000, 5);
  const std::string path = ::testing::TempDir() + "/pooled.bin";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(data.data(), 1, data.size(), f), data.size());
    std::fclose(f);
  }
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const uint8_t* base = (*mapped)->data();
  const size_t first = 1000, size = 250000;  // the record: bytes [1000, 251000) of the file
  const uint32_t stored = Crc32(0, data.data() + first, size);
  // Rank r reads its ranges [a, b) of the record (a stray CRC for `bad`).
  auto rank_reads = [&](std::vector<std::pair<size_t, size_t>> ranges, bool bad) {
    ReadCoverage coverage;
    coverage.Track(
        absl::MakeConstSpan(base + first, size),
        [](absl::Span<const uint8_t>, uint64_t) -> uint32_t { ADD_FAILURE() << "a rank read a gap"; return 0; },
        [](uint32_t) { return absl::InternalError("a rank checked a pooled record"); }, "arch.pt", "arch/data/0",
        stored);
    {
      ReadCoverage::Scope scope(&coverage);
      for (const auto& [a, b] : ranges) {
        ReadCoverage::NoteRead(base + first + a, b - a, Crc32(0, base + first + a, b - a) ^ (bad ? 1 : 0));
      }
    }
    absl::Status checked;
    std::vector<RecordReads> reads = coverage.TakeReads(1, &checked);
    EXPECT_TRUE(checked.ok()) << checked;
    EXPECT_EQ(reads.size(), 1u);
    if (!reads.empty()) {
      EXPECT_EQ(reads[0].path, path);
      EXPECT_EQ(reads[0].file_offset, first);
      EXPECT_EQ(reads[0].size, size);
      EXPECT_EQ(reads[0].stored_crc, stored);
    }
    return reads;
  };
  auto pool = [&](bool bad) {
    std::vector<RecordReads> all = rank_reads({{0, 50000}, {120000, 200000}}, false);
    for (RecordReads& r : rank_reads({{50000, 100000}, {150000, 249000}}, bad)) all.push_back(std::move(r));
    return CheckPooledReads(all, 2);
  };
  EXPECT_TRUE(pool(false).ok());
  absl::Status s = pool(true);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("arch.pt: record 'arch/data/0': CRC-32 mismatch"), std::string::npos) << s;
  // A byte no rank read ([100000, 120000) and [249000, 250000)), changed in the file.
  for (size_t at : {first + 110000, first + 249500}) {
    SCOPED_TRACE(at);
    std::vector<RecordReads> all = rank_reads({{0, 50000}, {120000, 200000}}, false);
    for (RecordReads& r : rank_reads({{50000, 100000}, {150000, 249000}}, false)) all.push_back(std::move(r));
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(at), SEEK_SET);
    const uint8_t flipped = data[at] ^ 0x20;
    std::fwrite(&flipped, 1, 1, f);
    std::fclose(f);
    s = CheckPooledReads(all, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    f = std::fopen(path.c_str(), "r+b");
    std::fseek(f, static_cast<long>(at), SEEK_SET);
    std::fwrite(&data[at], 1, 1, f);
    std::fclose(f);
  }
  // Records that are not bytes of a mapped file are checked by the rank.
  ReadCoverage coverage;
  Tracked t;
  TrackInto(coverage, data, &t);
  absl::Status checked;
  EXPECT_TRUE(coverage.TakeReads(1, &checked).empty());
  EXPECT_TRUE(checked.ok()) << checked;
  EXPECT_TRUE(t.checked);
  EXPECT_EQ(t.crc, Crc32(0, data.data(), data.size()));
}

// The first verdict that fails is CheckAll's error.
TEST(ReadCoverageTest, AFailedVerdictIsTheError) {
  const std::vector<uint8_t> data = RandomBytes(1000, 4);
  ReadCoverage coverage;
  coverage.Track(
      data, [](absl::Span<const uint8_t> gap, uint64_t) { return Crc32(0, gap.data(), gap.size()); },
      [](uint32_t) { return absl::DataLossError("record x: CRC-32 mismatch"); });
  const absl::Status s = coverage.CheckAll(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(coverage.CheckAll(1).ok());  // forgotten once checked
}

}  // namespace
}  // namespace ucp::torch
