// Large optimizer files written in pieces (writers/zero_writer.h
// ZeroWriteOptions::piece_bytes, torch::TorchWriter::WritePiece): the same
// bytes as one unit writing the file, integrity kept by the combined record
// CRCs, and nothing committed when a piece fails.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/torch/torch_file.h"
#include "format/torch/zip.h"
#include "gtest/gtest.h"
#include "absl/strings/str_join.h"
#include "ops/convert.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "readers/verify.h"
#include "testing/fixtures.h"
#include "writers/zero_writer.h"

namespace ucp::ops {
namespace {

namespace fs = std::filesystem;

constexpr char kFixture[] = "neox-tp2-pp1-dp2/global_step4";
constexpr char kOptim[] = "zero_pp_rank_0_mp_rank_00_optim_states.pt";

ReshardOptions ToTp1(const std::string& in, const std::string& out, int64_t piece_bytes, int threads) {
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.target = deepspeed::Topology{1, 1, 1};
  o.write.piece_bytes = piece_bytes;
  o.write.num_threads = threads;
  o.zero_source.num_threads = threads;
  return o;
}

// Every file of two folders, byte for byte.
void ExpectSameTree(const std::string& a, const std::string& b) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(a)) names.push_back(e.path().filename().string());
  size_t count_b = 0;
  for (const auto& e : fs::directory_iterator(b)) (void)e, ++count_b;
  EXPECT_EQ(names.size(), count_b) << a << " vs " << b;
  for (const std::string& n : names) {
    auto x = ReadFileToString(JoinPath(a, n));
    auto y = ReadFileToString(JoinPath(b, n));
    ASSERT_TRUE(x.ok() && y.ok()) << n;
    EXPECT_TRUE(*x == *y) << n << " differs between " << a << " and " << b;
  }
}

// How many pieces the plan cuts the optimizer file into (from --dry_run).
int PiecesOf(const std::string& in, int64_t piece_bytes) {
  ReshardOptions o = ToTp1(in, "/nonexistent/x", piece_bytes, 1);
  o.dry_run_ranks = 1;
  o.dry_run_units = true;
  auto r = Reshard(o);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return 0;
  const std::string marker = absl::StrCat(kOptim, " piece 1 of ");
  const size_t at = r->plan.find(marker);
  if (at == std::string::npos) return 1;
  return std::atoi(r->plan.c_str() + at + marker.size());
}

TEST(SplitWriteTest, PiecesWriteTheSameBytesAsOneUnit) {
  const std::string root = testing::FreshTempDir("split_same");
  const std::string zero = testing::FixturePath(kFixture);
  // Both sources: the ZeRO folder and its universal checkpoint.
  const std::string universal = JoinPath(root, "u");
  {
    ConvertOptions c;
    c.input_folder = zero;
    c.output_folder = universal;
    ASSERT_TRUE(Convert(c).ok());
  }
  for (const std::string& kind : {"z", "u"}) {
    const std::string in = kind == "z" ? zero : universal;
    const std::string ref = JoinPath(root, absl::StrCat(kind, "_ref/global_step4"));
    auto whole = Reshard(ToTp1(in, ref, /*piece_bytes=*/-1, 2));
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(PiecesOf(in, -1), 1);
    EXPECT_EQ(PiecesOf(in, 1), 4096);  // capped: not one unit per byte
    for (int64_t piece_bytes : {int64_t{4096}, int64_t{65536}, int64_t{1} << 20}) {
      ASSERT_GT(PiecesOf(in, piece_bytes), 1) << piece_bytes;
      for (int threads : {1, 3}) {
        const std::string out = JoinPath(root, absl::StrCat(fs::path(ref).parent_path().filename().string(), "_",
                                                            piece_bytes, "_", threads, "/global_step4"));
        auto split = Reshard(ToTp1(in, out, piece_bytes, threads));
        ASSERT_TRUE(split.ok()) << split.status();
        EXPECT_EQ(split->write.files, whole->write.files);
        EXPECT_EQ(split->write.bytes, whole->write.bytes);
        ExpectSameTree(ref, out);
      }
    }
  }
}

// `ucp verify` (readers::VerifyFolder) finds a byte flipped in any piece of
// a file written in pieces: the record CRCs combined from the pieces' parts
// cover every byte.
TEST(SplitWriteTest, VerifyFindsAFlippedByteInEveryPiece) {
  const std::string root = testing::FreshTempDir("split_verify");
  const std::string zero = testing::FixturePath(kFixture);
  const int64_t piece_bytes = int64_t{1} << 20;
  const int pieces = PiecesOf(zero, piece_bytes);
  ASSERT_GE(pieces, 3);
  const std::string good = JoinPath(root, "good/global_step4");
  ASSERT_TRUE(Reshard(ToTp1(zero, good, piece_bytes, 2)).ok());
  EXPECT_TRUE(readers::VerifyFolder(good).problems.empty());
  auto bytes = ReadFileToString(JoinPath(good, kOptim));
  ASSERT_TRUE(bytes.ok());
  // The pieces' ranges, as the writer cuts them.
  torch::ZipReadOptions lazy;
  lazy.crc = torch::ZipReadOptions::Crc::kLazy;
  auto zip = torch::ZipReader::Open(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
                                    kOptim, lazy);
  ASSERT_TRUE(zip.ok()) << zip.status();
  std::vector<const torch::ZipRecord*> records;
  std::vector<uint64_t> sizes;
  for (const auto& r : zip->records()) {
    if (absl::StrContains(r.name, "/data/")) {
      records.push_back(&r);
      sizes.push_back(r.size);
    }
  }
  const std::vector<uint64_t> bounds = torch::StoragePieceBounds(sizes, pieces);
  for (int k = 0; k < pieces; ++k) {
    ASSERT_LT(bounds[k], bounds[k + 1]) << "piece " << k << " is empty";
    // The middle of the piece, as a file offset.
    const uint64_t at = (bounds[k] + bounds[k + 1]) / 2;
    uint64_t start = 0, file_offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (at < start + sizes[i]) {
        file_offset = records[i]->data_offset + (at - start);
        break;
      }
      start += sizes[i];
    }
    const std::string bad = JoinPath(root, absl::StrCat("bad", k, "/global_step4"));
    fs::create_directories(bad);
    fs::copy(good, bad, fs::copy_options::overwrite_existing);
    std::string flipped = *bytes;
    flipped[file_offset] ^= 0x20;
    ASSERT_TRUE(WriteFileAtomic(JoinPath(bad, kOptim), flipped).ok());
    const readers::VerifyResult r = readers::VerifyFolder(bad);
    ASSERT_FALSE(r.problems.empty()) << "piece " << k << " (file offset " << file_offset << ")";
    EXPECT_TRUE(absl::StrContains(absl::StrJoin(r.problems, "\n"), kOptim)) << absl::StrJoin(r.problems, "\n");
  }
}

// Wraps a plan: piece `fail` fails (after the units before it have written
// their pieces into the staging file), or `lose`'s result goes missing.
class BrokenPlan : public writers::Plan {
 public:
  BrokenPlan(const writers::Plan& inner, size_t fail, size_t lose) : inner_(inner), fail_(fail), lose_(lose) {
    units_ = inner.units();
  }
  absl::Status Prepare(const std::string& staging) const override { return inner_.Prepare(staging); }
  absl::Status Execute(size_t i, const std::string& staging, writers::UnitResult* result) const override {
    if (i == fail_) return absl::UnavailableError("injected failure of a piece");
    absl::Status s = inner_.Execute(i, staging, result);
    if (i == lose_) result->pieces.clear();
    return s;
  }
  absl::StatusOr<writers::WriteStats> Finish(const std::vector<writers::UnitResult>& results,
                                             const std::string& staging) const override {
    return inner_.Finish(results, staging);
  }
  std::string latest_file() const override { return inner_.latest_file(); }
  const deepspeed::CheckpointState* source() const override { return inner_.source(); }

 private:
  const writers::Plan& inner_;
  size_t fail_, lose_;
};

TEST(SplitWriteTest, AFailedOrLostPieceCommitsNothing) {
  SourceOptions source;
  source.tp1_whole_tensors = true;
  auto state = OpenZeroState(testing::FixturePath(kFixture), source);
  ASSERT_TRUE(state.ok()) << state.status();
  writers::ZeroWriteOptions o;
  o.target = deepspeed::Topology{1, 1, 1};
  o.piece_bytes = 65536;
  auto plan = writers::PlanZero(**state, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<size_t> pieces;
  for (size_t i = 0; i < (*plan)->units().size(); ++i) {
    if (absl::StrContains((*plan)->units()[i].name, " piece ")) pieces.push_back(i);
  }
  ASSERT_GE(pieces.size(), 3u);
  const std::string root = testing::FreshTempDir("split_fail");
  struct Case {
    size_t fail, lose;
    absl::StatusCode code;
  };
  const size_t none = SIZE_MAX;
  for (const Case& c : {Case{pieces.back(), none, absl::StatusCode::kUnavailable},
                        Case{pieces[pieces.size() / 2], none, absl::StatusCode::kUnavailable},
                        Case{none, pieces[1], absl::StatusCode::kFailedPrecondition}}) {
    BrokenPlan broken(**plan, c.fail, c.lose);
    writers::RunOptions run;
    run.num_threads = 1;  // every piece before the failing one has written
    const std::string out = JoinPath(root, "out/global_step4");
    auto stats = writers::RunPlan(broken, out, run);
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), c.code) << stats.status();
    // No output, no staging folder, no latest.
    EXPECT_FALSE(fs::exists(out));
    if (fs::exists(JoinPath(root, "out"))) {
      for (const auto& e : fs::directory_iterator(JoinPath(root, "out"))) ADD_FAILURE() << "left behind: " << e.path();
    }
  }
  // The same plan, unbroken, commits.
  BrokenPlan intact(**plan, none, none);
  writers::RunOptions run;
  run.num_threads = 2;
  auto stats = writers::RunPlan(intact, JoinPath(root, "out/global_step4"), run);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(readers::VerifyFolder(JoinPath(root, "out/global_step4")).problems.empty());
}

}  // namespace
}  // namespace ucp::ops
