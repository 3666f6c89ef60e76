// Large optimizer files written in pieces (formats/deepspeed_zero/zero_writer.h
// ZeroWriteOptions::piece_bytes, torch::TorchWriter::WritePiece): the same
// bytes as one unit writing the file, integrity kept by the combined record
// CRCs, and nothing committed when a piece fails.
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "format/torch/torch_file.h"
#include "format/torch/zip.h"
#include "gtest/gtest.h"
#include "absl/strings/str_join.h"
#include "ops/convert.h"
#include "ops/open.h"
#include "ops/reshard.h"
#include "ops/inspect.h"
#include "testing/fixtures.h"
#include "format/torch/tensor.h"
#include "writers/plan.h"
#include "formats/deepspeed_zero/zero_writer.h"
#include "formats/deepspeed_zero3/zero3_writer.h"

namespace ucp::ops {
namespace {

namespace fs = std::filesystem;

constexpr char kFixture[] = "neox-tp2-pp1-dp2/global_step4";
constexpr char kOptim[] = "zero_pp_rank_0_mp_rank_00_optim_states.pt";

ReshardOptions ToTp1(const std::string& in, const std::string& out, int64_t piece_bytes, int threads,
                     int zero_stage = 0, int tp = 1) {
  ReshardOptions o;
  o.input_folder = in;
  o.output_folder = out;
  o.write.target = state::Topology{tp, 1, 1};
  o.write.zero_stage = zero_stage;  // 0: the source's
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

// Reshards with `split` (its optimizer files in pieces) and expects what the
// one-unit run `whole` wrote into `ref`: as many files and bytes, every file
// byte for byte, and `ucp verify` clean (each record's CRC combined from its
// pieces holds).
void ExpectSplitLikeWhole(const ReshardOptions& split, const ReshardResult& whole, const std::string& ref) {
  auto r = Reshard(split);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->write.files, whole.write.files);
  EXPECT_EQ(r->write.bytes, whole.write.bytes);
  ExpectSameTree(ref, split.output_folder);
  const formats::VerifyResult v = ops::Verify(split.output_folder);
  EXPECT_TRUE(v.problems.empty()) << absl::StrJoin(v.problems, "\n");
}

// `in` converted into the universal checkpoint `out`.
absl::StatusOr<std::string> ConvertFolder(const std::string& in, const std::string& out) {
  ConvertOptions c;
  c.input_folder = in;
  c.output_folder = out;
  UCP_RETURN_IF_ERROR(Convert(c).status());
  return out;
}

// The fixture's universal checkpoint, converted into ROOT/u.
absl::StatusOr<std::string> ConvertFixture(const std::string& root, const std::string& fixture = kFixture) {
  ConvertOptions c;
  c.input_folder = testing::FixturePath(fixture);
  c.output_folder = JoinPath(root, "u");
  UCP_RETURN_IF_ERROR(Convert(c).status());
  return c.output_folder;
}

// How many pieces the plan cuts the optimizer file into (from --dry_run).
int PiecesOf(const std::string& in, int64_t piece_bytes, int zero_stage = 0, int tp = 1) {
  ReshardOptions o = ToTp1(in, "/nonexistent/x", piece_bytes, 1, zero_stage, tp);
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
  const absl::StatusOr<std::string> converted = ConvertFixture(root);
  ASSERT_TRUE(converted.ok()) << converted.status();
  const std::string universal = *converted;
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

// The ZeRO-3 target's optimizer files (formats/deepspeed_zero3) are cut the
// same way: the same bytes for any piece size and thread count, from a
// ZeRO-3 source with several sub-groups (tp 1) and its stage-3 universal
// folder, and from a ZeRO-2 tp-2 source and its universal checkpoint (tp 1
// and 2: the pieces' tp slices), and the record CRCs combined from the
// pieces hold (`ucp verify`).
TEST(SplitWriteTest, Zero3PiecesWriteTheSameBytesAsOneUnit) {
  const std::string root = testing::FreshTempDir("split_zero3");
  struct Source {
    std::string in;
    int tp;
  };
  const std::string zero3 = testing::VersionFixturePath("0.19.5", "gpt-zero3-subgroups-dp2/global_step4");
  const absl::StatusOr<std::string> zero3_universal = ConvertFolder(zero3, JoinPath(root, "u3"));
  ASSERT_TRUE(zero3_universal.ok()) << zero3_universal.status();
  std::vector<Source> sources = {{zero3, 1}, {*zero3_universal, 1}};
  const std::string nopipe = "gpt-zero2-nopipe-tp2-dp2/global_step4";
  const absl::StatusOr<std::string> converted = ConvertFixture(root, nopipe);
  ASSERT_TRUE(converted.ok()) << converted.status();
  for (int tp : {1, 2}) {
    sources.push_back({testing::FixturePath(nopipe), tp});
    sources.push_back({*converted, tp});
  }
  int n = 0;
  for (const Source& src : sources) {
    SCOPED_TRACE(absl::StrCat(src.in, " to ZeRO-3 tp ", src.tp));
    const std::string ref = JoinPath(root, absl::StrCat(n, "_ref/global_step4"));
    auto whole = Reshard(ToTp1(src.in, ref, /*piece_bytes=*/-1, 2, /*zero_stage=*/3, src.tp));
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(whole->write.files, 2 * src.tp);  // model and optimizer file per tp rank
    EXPECT_EQ(PiecesOf(src.in, -1, 3, src.tp), 1);
    for (int64_t piece_bytes : {int64_t{4096}, int64_t{65536}}) {
      ASSERT_GT(PiecesOf(src.in, piece_bytes, 3, src.tp), 4) << piece_bytes;
      for (int threads : {1, 3}) {
        const std::string out = JoinPath(root, absl::StrCat(n, "_", piece_bytes, "_", threads, "/global_step4"));
        ExpectSplitLikeWhole(ToTp1(src.in, out, piece_bytes, threads, 3, src.tp), *whole, ref);
      }
    }
    ++n;
  }
}

// The native MoE target (formats/deepspeed_moe) cuts its optimizer files the
// same way: a 0.19.5 MoE checkpoint (ep 2, ZeRO-2, dp 2) to dp 1 and to dp 2,
// the same bytes for any piece size and thread count as one unit, and the
// record CRCs combined from the pieces hold (`ucp verify`).
TEST(SplitWriteTest, MoePiecesWriteTheSameBytesAsOneUnit) {
  const std::string root = testing::FreshTempDir("split_moe");
  const std::string moe = testing::VersionFixturePath("0.19.5", "gpt-moe-ep2-zero2-dp2/global_step4");
  for (int dp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("MoE to dp ", dp));
    auto to = [&](const std::string& out, int64_t piece_bytes, int threads) {
      ReshardOptions o = ToTp1(moe, out, piece_bytes, threads);
      o.write.target = state::Topology{1, 1, dp};
      return o;
    };
    const std::string ref = JoinPath(root, absl::StrCat(dp, "_ref/global_step4"));
    auto whole = Reshard(to(ref, /*piece_bytes=*/-1, 2));
    ASSERT_TRUE(whole.ok()) << whole.status();
    for (int64_t piece_bytes : {int64_t{4096}, int64_t{65536}}) {
      ReshardOptions dry = to("/nonexistent/x", piece_bytes, 1);
      dry.dry_run_ranks = 1;
      dry.dry_run_units = true;
      auto planned = Reshard(dry);
      ASSERT_TRUE(planned.ok()) << planned.status();
      // Every optimizer file of the target is cut.
      for (int d = 0; d < dp; ++d) {
        EXPECT_TRUE(absl::StrContains(planned->plan, absl::StrFormat("zero_pp_rank_%d_mp_rank_00_optim_states.pt piece 2 of ", d)))
            << piece_bytes;
      }
      for (int threads : {1, 3}) {
        const std::string out = JoinPath(root, absl::StrCat(dp, "_", piece_bytes, "_", threads, "/global_step4"));
        ExpectSplitLikeWhole(to(out, piece_bytes, threads), *whole, ref);
      }
    }
  }
}

// The ZeRO-3 plan of `universal` to dp 1 in pieces of 64 KiB: each piece
// lists only the state files of its own bytes, each with the bytes it reads
// of it, and every state file is listed by some piece.
void ExpectPiecesListOnlyTheirInputs(const std::string& universal) {
  SourceOptions so;
  so.tp1_whole_tensors = true;
  auto src = OpenSource(universal, so, nullptr);
  ASSERT_TRUE(src.ok()) << src.status();
  writers::ZeroWriteOptions w = ToTp1(universal, "/unused", /*piece_bytes=*/65536, 1, 3).write;
  auto plan = deepspeed_zero3::PlanZero3(*src->state, w, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::set<std::string> all_files;
  size_t pieces = 0, listed = 0;
  for (const writers::Unit& u : (*plan)->units()) {
    if (!absl::StrContains(u.name, " piece ")) continue;
    ++pieces;
    for (const auto& in : u.inputs) {
      EXPECT_GT(in.length, 0) << u.name << " " << in.path;
      all_files.insert(in.path);
    }
    listed += u.inputs.size();
  }
  ASSERT_GE(pieces, 10u);
  // Every trainable param's fp32.pt and state files, each listed by the
  // pieces its bytes fall in: not every file by every piece.
  size_t trainable = 0;
  for (const auto& p : src->state->info().params) trainable += p.trainable() ? 1 : 0;
  EXPECT_GE(all_files.size(), trainable * (1 + src->state->info().state_keys.size()));
  EXPECT_LE(listed, 2 * all_files.size() + 2 * pieces);
}

// From a universal source, a piece of a ZeRO-3 optimizer file lists only
// the inputs of its bytes: a universal folder of a ZeRO-2 checkpoint, and
// DeepSpeed's stage-3 universal layout (read through the rules'
// ResolvedState, which defers a param's state when its source holds it whole
// in one file).
TEST(SplitWriteTest, AZero3PieceListsOnlyTheInputsOfItsBytes) {
  const std::string root = testing::FreshTempDir("split_zero3_inputs");
  int n = 0;
  for (const std::string& fixture : {testing::FixturePath("gpt-zero2-nopipe-tp2-dp2/global_step4"),
                                     testing::VersionFixturePath("0.19.5", "gpt-zero3-subgroups-dp2/global_step4")}) {
    SCOPED_TRACE(fixture);
    const absl::StatusOr<std::string> converted = ConvertFolder(fixture, JoinPath(root, absl::StrCat("u", n++)));
    ASSERT_TRUE(converted.ok()) << converted.status();
    ExpectPiecesListOnlyTheirInputs(*converted);
  }
}

// `ucp verify` (formats::VerifyFolder) finds a byte flipped in any piece of
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
  EXPECT_TRUE(ops::Verify(good).problems.empty());
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
    const formats::VerifyResult r = ops::Verify(bad);
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
  const state::CheckpointState* source() const override { return inner_.source(); }

 private:
  const writers::Plan& inner_;
  size_t fail_, lose_;
};

TEST(SplitWriteTest, AFailedOrLostPieceCommitsNothing) {
  SourceOptions source;
  source.tp1_whole_tensors = true;
  auto state = OpenResolvedState(testing::FixturePath(kFixture), source);
  ASSERT_TRUE(state.ok()) << state.status();
  writers::ZeroWriteOptions o;
  o.target = state::Topology{1, 1, 1};
  o.piece_bytes = 65536;
  auto plan = deepspeed_zero::PlanZero(**state, o);
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
  EXPECT_TRUE(ops::Verify(JoinPath(root, "out/global_step4")).problems.empty());
}

// From a universal source, each piece of a split file lists, and opens,
// only the inputs of its own bytes: a piece runs though a state file that
// only another piece reads is damaged, and the piece that reads it names it.
// (Before, every piece built the file's tree by opening all of its inputs.)
TEST(SplitWriteTest, APieceOpensOnlyTheInputsOfItsBytes) {
  const std::string root = testing::FreshTempDir("split_inputs");
  const absl::StatusOr<std::string> converted = ConvertFixture(root);
  ASSERT_TRUE(converted.ok()) << converted.status();
  const std::string universal = *converted;
  auto plan_of = [&](std::unique_ptr<writers::Plan>* plan) -> std::unique_ptr<state::ModelState> {
    SourceOptions so;
    so.tp1_whole_tensors = true;
    auto src = OpenSource(universal, so, nullptr);
    EXPECT_TRUE(src.ok()) << src.status();
    if (!src.ok()) return nullptr;
    writers::ZeroWriteOptions w = ToTp1(universal, "/unused", /*piece_bytes=*/65536, 1).write;
    w.inputs = {universal};
    auto p = deepspeed_zero::PlanZero(*src->state, w, nullptr);
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) *plan = *std::move(p);
    return std::move(src->state);
  };
  std::unique_ptr<writers::Plan> plan;
  std::unique_ptr<state::ModelState> state = plan_of(&plan);
  ASSERT_TRUE(state && plan);
  // The pieces, and the state files each lists.
  std::vector<size_t> pieces;
  std::map<std::string, std::set<size_t>> readers_of;  // state file -> pieces listing it
  for (size_t i = 0; i < plan->units().size(); ++i) {
    const writers::Unit& u = plan->units()[i];
    if (!absl::StrContains(u.name, " piece ")) continue;
    pieces.push_back(i);
    for (const auto& in : u.inputs) readers_of[in.path].insert(i);
  }
  ASSERT_GE(pieces.size(), 10u);
  std::set<std::string> all_files;
  for (const auto& [path, units] : readers_of) all_files.insert(path);
  size_t listed = 0;
  for (size_t i : pieces) {
    // A piece lists some of the files, each with the bytes it reads of it.
    EXPECT_LT(plan->units()[i].inputs.size(), all_files.size()) << plan->units()[i].name;
    for (const auto& in : plan->units()[i].inputs) EXPECT_GT(in.length, 0) << in.path;
    listed += plan->units()[i].inputs.size();
  }
  // Each state file by the pieces its bytes fall in (one more at each cut),
  // a step.pt by those of its param's states: not every file by every piece.
  EXPECT_LE(listed, 2 * all_files.size() + 2 * pieces.size());
  // Every state file of the optimizer file is read by some piece.
  size_t trainable = 0;
  for (const auto& p : state->info().params) trainable += p.trainable() ? 1 : 0;
  EXPECT_EQ(all_files.size(), trainable * (2 + state->info().state_keys.size()))  // fp32, states, step
      << "every param's fp32.pt, state files and step.pt";
  // The layer files list what they read: a trainable param's fp32.pt (their
  // lp weights are made from it) and step.pt (checked where a param is read).
  int layer_units = 0;
  for (const writers::Unit& u : plan->units()) {
    if (u.outputs.empty() || !absl::StartsWith(u.outputs[0], "layer_")) continue;
    ++layer_units;
    for (const auto& in : u.inputs) {
      EXPECT_TRUE(absl::EndsWith(in.path, "/fp32.pt") || absl::EndsWith(in.path, "/step.pt") ||
                  absl::StrContains(in.path, "/ucp_module/"))
          << u.name << " lists " << in.path;
    }
  }
  EXPECT_GT(layer_units, 5);
  // A piece and a state file only other pieces read.
  size_t piece = pieces[pieces.size() / 2];
  std::string other;
  for (const auto& [path, units] : readers_of) {
    if (!units.count(piece) && !absl::EndsWith(path, "/step.pt") && !absl::EndsWith(path, "/fp32.pt")) {
      other = path;
      break;
    }
  }
  ASSERT_FALSE(other.empty());
  const size_t reader = *readers_of[other].begin();
  state.reset();
  plan.reset();
  // Damage it (as a half-copied file would be), then plan again.
  ASSERT_TRUE(WriteFileAtomic(other, "not a torch file").ok());
  state = plan_of(&plan);
  ASSERT_TRUE(state && plan);
  const std::string staging = JoinPath(root, "staging");
  fs::create_directories(staging);
  std::vector<writers::UnitResult> results;
  absl::Status ran = writers::ExecuteUnits(*plan, {piece}, staging, 1, {}, /*writeback=*/true, &results);
  EXPECT_TRUE(ran.ok()) << ran;
  ran = writers::ExecuteUnits(*plan, {reader}, staging, 1, {}, /*writeback=*/true, &results);
  EXPECT_FALSE(ran.ok());
  EXPECT_TRUE(absl::StrContains(ran.message(), other)) << ran;
}

// A universal folder whose params' step.pt disagree mixes saves: the
// reshard that reads them is refused, naming the odd file (each param's
// step is checked where its states are read; no rank opens every step.pt).
TEST(SplitWriteTest, AStepFromAnotherSaveIsRefusedNamingTheFile) {
  const std::string root = testing::FreshTempDir("split_step");
  const absl::StatusOr<std::string> converted = ConvertFixture(root);
  ASSERT_TRUE(converted.ok()) << converted.status();
  const std::string universal = *converted;
  const std::string odd = JoinPath(universal, "zero/2.mlp.dense_h_to_4h.weight/step.pt");
  ASSERT_TRUE(fs::exists(odd));
  {
    torch::TorchWriter w;
    const float five = 5.0f;
    auto t = torch::Tensor::FromBytes(torch::DType::kFloat32, {}, std::string(reinterpret_cast<const char*>(&five), 4));
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(w.WriteFile(odd + ".new", *w.AddTensor(*t)).ok());
    fs::rename(odd + ".new", odd);
  }
  for (int64_t piece_bytes : {int64_t{-1}, int64_t{65536}}) {
    for (int threads : {1, 2}) {
      const std::string out = JoinPath(root, absl::StrCat("out_", piece_bytes, "_", threads, "/global_step4"));
      auto r = Reshard(ToTp1(universal, out, piece_bytes, threads));
      ASSERT_FALSE(r.ok()) << piece_bytes;
      EXPECT_TRUE(absl::StrContains(r.status().message(), odd + ": step differs from that of")) << r.status();
      EXPECT_FALSE(fs::exists(out));
    }
  }
}

}  // namespace
}  // namespace ucp::ops
