#include "format/torch/zip.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/torch/crc32.h"
#include "format/torch/test_util.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using testing::ReadFileToString;
using testing::RunPython;
using testing::TempPath;

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}
std::string Str(absl::Span<const uint8_t> s) { return std::string(reinterpret_cast<const char*>(s.data()), s.size()); }

struct Rec {
  std::string name;
  std::string data;
};

std::string WriteArchive(const std::vector<Rec>& recs, ZipWriterOptions options = {}) {
  std::string out;
  StringSink sink(&out);
  ZipWriter w(&sink, "test", options);
  for (const Rec& r : recs) {
    absl::Status s = w.AddRecord(r.name, r.data);
    EXPECT_TRUE(s.ok()) << s;
  }
  absl::Status s = w.Finish();
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<Rec> SampleRecords() {
  std::string big;
  for (int i = 0; i < 5000; ++i) big.push_back(static_cast<char>(i * 31 + 7));
  return {{"archive/data.pkl", std::string("\x80\x02}q\x00.", 6)},
          {"archive/data/0", big},
          {"archive/data/1", ""},
          {"archive/data/10", std::string(257, 'x')},
          {"archive/version", "3\n"}};
}

void Put32At(std::string& s, size_t pos, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[pos + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
void Put16At(std::string& s, size_t pos, uint16_t v) {
  s[pos] = static_cast<char>(v & 0xFF);
  s[pos + 1] = static_cast<char>(v >> 8);
}
size_t CentralHeaderPos(const std::string& zip, const std::string& name) {
  std::string needle = "PK\x01\x02";
  for (size_t p = zip.find(needle); p != std::string::npos; p = zip.find(needle, p + 1)) {
    uint16_t len = static_cast<uint8_t>(zip[p + 28]) | (static_cast<uint8_t>(zip[p + 29]) << 8);
    if (zip.compare(p + 46, len, name) == 0 && len == name.size()) return p;
  }
  ADD_FAILURE() << "no central header for " << name;
  return 0;
}

TEST(ZipTest, RoundTripAndLayout) {
  std::vector<Rec> recs = SampleRecords();
  std::string zip = WriteArchive(recs);
  auto reader = ZipReader::Open(Bytes(zip), "mem");
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(reader->records().size(), recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    const ZipRecord& r = reader->records()[i];
    EXPECT_EQ(r.name, recs[i].name);
    EXPECT_EQ(r.data_offset % 64, 0u) << r.name;  // torch's alignment
    EXPECT_EQ(r.size, recs[i].data.size());
    EXPECT_EQ(r.crc32, Crc32(0, recs[i].data.data(), recs[i].data.size()));
    EXPECT_EQ(r.flags, recs[i].data.empty() ? 0x0800 : 0x0808);
    auto data = reader->Read(recs[i].name);
    ASSERT_TRUE(data.ok());
    EXPECT_EQ(Str(*data), recs[i].data);
  }
  auto missing = reader->Read("archive/data/2");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("archive/data/2"), std::string::npos);
  EXPECT_NE(missing.status().message().find("mem"), std::string::npos);
}

// Our writer, fed the records of a file torch 1.13 wrote, reproduces it byte
// for byte (headers, padding, descriptors, central directory, zip64 end).
TEST(ZipTest, ReproducesTorchBytesForFixtures) {
  int compared = 0;
  for (const std::string& path : testing::FindTorchFiles(testing::FixturesRoot())) {
    if (compared >= 60 && path.find("zero_pp") == std::string::npos && path.find("mp_rank") == std::string::npos) {
      continue;  // all optimizer/model-state files, the first 60 others
    }
    auto original = ReadFileToString(path);
    ASSERT_TRUE(original.ok());
    auto reader = ZipReader::Open(Bytes(*original), path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::string out;
    StringSink sink(&out);
    ZipWriter w(&sink, "copy");
    for (const ZipRecord& r : reader->records()) ASSERT_TRUE(w.AddRecord(r.name, reader->Data(r)).ok());
    ASSERT_TRUE(w.Finish().ok());
    ASSERT_EQ(out.size(), original->size()) << path;
    ASSERT_TRUE(out == *original) << path;
    ++compared;
  }
  EXPECT_GT(compared, 100);
}

// The same check against a torch.save made now, with an empty storage (no
// data descriptor) and more than ten storages (lexicographic record order).
TEST(ZipTest, ReproducesFreshTorchSave) {
  std::string path = TempPath("zip_fresh/fresh.pt");
  ASSERT_TRUE(RunPython("-c", {"import torch,sys; torch.save({'e': torch.zeros(0), 'l': [torch.full((i,), float(i)) "
                               "for i in range(12)]}, sys.argv[1])",
                               path})
                  .ok());
  auto original = ReadFileToString(path);
  ASSERT_TRUE(original.ok());
  auto reader = ZipReader::Open(Bytes(*original), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->records()[2].name, "fresh/data/1");
  EXPECT_EQ(reader->records()[3].name, "fresh/data/10");
  std::string out;
  StringSink sink(&out);
  ZipWriter w(&sink, "copy");
  for (const ZipRecord& r : reader->records()) ASSERT_TRUE(w.AddRecord(r.name, reader->Data(r)).ok());
  ASSERT_TRUE(w.Finish().ok());
  EXPECT_TRUE(out == *original);
}

// zip64 paths with a low threshold: sizes and offsets >= 100 get zip64
// fields, 64-bit descriptors and saturated 32-bit fields. Python's zipfile
// reads the result and checks every CRC.
TEST(ZipTest, Zip64ThresholdKnob) {
  ZipWriterOptions options;
  options.zip64_size_threshold = 100;
  options.zip64_offset_threshold = 100;
  std::vector<Rec> recs = SampleRecords();
  std::string zip = WriteArchive(recs, options);
  auto reader = ZipReader::Open(Bytes(zip), "zip64");
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(reader->records().size(), recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(Str(reader->Data(reader->records()[i])), recs[i].data);
    EXPECT_EQ(reader->records()[i].data_offset % 64, 0u);
  }
  // Classic EOCD holds saturated offset/size; the zip64 record the truth.
  EXPECT_EQ(zip.compare(zip.size() - 22, 4, "PK\x05\x06"), 0);
  EXPECT_EQ(zip.compare(zip.size() - 10, 8, std::string(8, '\xff')), 0);

  std::string path = TempPath("zip64_knob.zip");
  ASSERT_TRUE(WriteFileAtomic(path, zip).ok());
  auto listing = RunPython("-c", {"import zipfile,sys\n"
                                  "z = zipfile.ZipFile(sys.argv[1])\n"
                                  "assert z.testzip() is None\n"
                                  "for i in z.infolist(): print(i.filename, i.file_size, i.header_offset)\n",
                                  path});
  ASSERT_TRUE(listing.ok()) << listing.status();
  std::string expected;
  for (const ZipRecord& r : reader->records()) absl::StrAppend(&expected, r.name, " ", r.size, " ", r.header_offset, "\n");
  EXPECT_EQ(*listing, expected);
}

TEST(ZipTest, WriterRejectsMisuse) {
  std::string out;
  StringSink sink(&out);
  ZipWriter w(&sink, "w");
  EXPECT_EQ(w.WriteData(Bytes("x")).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.AddRecord("a/x", "1").ok());
  EXPECT_EQ(w.AddRecord("a/x", "2").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.BeginRecord("/abs", 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.BeginRecord("", 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.BeginRecord("a/y", 3).ok());
  EXPECT_EQ(w.BeginRecord("a/z", 1).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.WriteData(Bytes("ab")).ok());
  EXPECT_EQ(w.EndRecord().code(), absl::StatusCode::kFailedPrecondition);  // 2 of 3 bytes
  // The failure is sticky.
  EXPECT_FALSE(w.Finish().ok());
}

TEST(ZipTest, StreamedRecordEqualsOneShot) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  std::string a = WriteArchive({{"s/data/0", data}});
  std::string b;
  StringSink sink(&b);
  ZipWriter w(&sink, "w");
  ASSERT_TRUE(w.BeginRecord("s/data/0", data.size()).ok());
  for (size_t pos = 0; pos < data.size(); pos += 777) {
    ASSERT_TRUE(w.WriteData(Bytes(data.substr(pos, 777))).ok());
  }
  ASSERT_TRUE(w.EndRecord().ok());
  ASSERT_TRUE(w.Finish().ok());
  EXPECT_TRUE(a == b);
  EXPECT_EQ(w.bytes_written(), b.size());
}

// ---- hostile and damaged archives ----

TEST(ZipTest, EveryTruncationIsDataLoss) {
  std::string zip = WriteArchive(SampleRecords());
  for (size_t len = 0; len < zip.size(); ++len) {
    auto r = ZipReader::Open(Bytes(zip.substr(0, len)), "cut");
    ASSERT_FALSE(r.ok()) << len;
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << len << ": " << r.status();
  }
}

TEST(ZipTest, BadCrcIsDataLossEagerlyOrOnRead) {
  std::vector<Rec> recs = SampleRecords();
  std::string zip = WriteArchive(recs);
  auto good = ZipReader::Open(Bytes(zip), "crc");
  ASSERT_TRUE(good.ok());
  const ZipRecord* r = good->Find("archive/data/0");
  ASSERT_NE(r, nullptr);
  std::string bad = zip;
  bad[r->data_offset + 100] ^= 1;
  auto eager = ZipReader::Open(Bytes(bad), "crc");
  EXPECT_EQ(eager.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(eager.status().message().find("archive/data/0"), std::string::npos) << eager.status();
  EXPECT_NE(eager.status().message().find("CRC"), std::string::npos);

  ZipReadOptions lazy;
  lazy.crc = ZipReadOptions::Crc::kLazy;
  auto reader = ZipReader::Open(Bytes(bad), "crc", lazy);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE(reader->Read("archive/data.pkl").ok());
  EXPECT_EQ(reader->Read("archive/data/0").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(reader->VerifyAllCrcs().code(), absl::StatusCode::kDataLoss);
}

// Under a DeferredCrcChecks scope the CRC of a large record is checked on
// the background thread: VerifyCrc returns at once, Wait() reports the
// mismatch with VerifyCrc's own message; small records are still checked at
// once; outside a scope nothing changes.
TEST(ZipTest, DeferredCrcChecksReportMismatchesInWait) {
  std::string big(DeferredCrcChecks::kDeferMinBytes + 4096, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 17);
  std::string zip = WriteArchive({{"archive/data.pkl", std::string("\x80\x02}q\x00.", 6)},
                                  {"archive/data/0", big},
                                  {"archive/data/1", big.substr(0, 2 * DeferredCrcChecks::kDeferMinBytes / 3)},
                                  {"archive/data/2", big},
                                  {"archive/version", "3\n"}});
  auto bytes = std::make_shared<const std::string>(zip);
  auto open = [](const std::string& archive, std::shared_ptr<const void> keep) {
    ZipReadOptions lazy;
    lazy.crc = ZipReadOptions::Crc::kLazy;
    lazy.keep_alive = std::move(keep);
    return ZipReader::Open(Bytes(archive), "deferred", lazy);
  };
  {  // intact: the scope changes nothing
    auto reader = open(*bytes, bytes);
    ASSERT_TRUE(reader.ok()) << reader.status();
    DeferredCrcChecks checks;
    {
      DeferredCrcChecks::Scope scope(&checks);
      EXPECT_TRUE(reader->VerifyAllCrcs().ok());
    }
    EXPECT_TRUE(checks.Wait().ok());
    EXPECT_TRUE(reader->VerifyAllCrcs().ok());  // remembered as checked
  }
  auto good = ZipReader::Open(Bytes(zip), "deferred");
  ASSERT_TRUE(good.ok()) << good.status();
  std::string damaged = zip;
  damaged[good->Find("archive/data/2")->data_offset + 12345] ^= 4;
  damaged[good->Find("archive/data/1")->data_offset + 99] ^= 4;
  auto bad = std::make_shared<const std::string>(damaged);
  {
    auto reader = open(*bad, bad);
    ASSERT_TRUE(reader.ok()) << reader.status();
    DeferredCrcChecks checks;
    absl::Status large, small;
    {
      DeferredCrcChecks::Scope scope(&checks);
      EXPECT_EQ(DeferredCrcChecks::Current(), &checks);
      large = reader->VerifyCrc(*reader->Find("archive/data/2"));
      small = reader->VerifyCrc(*reader->Find("archive/data/1"));
    }
    EXPECT_EQ(DeferredCrcChecks::Current(), nullptr);
    EXPECT_TRUE(large.ok()) << large;  // deferred
    EXPECT_EQ(small.code(), absl::StatusCode::kDataLoss) << small;  // below kDeferMinBytes: at once
    const absl::Status waited = checks.Wait();
    EXPECT_EQ(waited.code(), absl::StatusCode::kDataLoss) << waited;
    EXPECT_NE(waited.message().find("archive/data/2"), std::string::npos) << waited;
    EXPECT_NE(waited.message().find("CRC-32 mismatch"), std::string::npos) << waited;
    // The failure is remembered: a later check outside the scope reports it.
    EXPECT_EQ(reader->VerifyCrc(*reader->Find("archive/data/2")).code(), absl::StatusCode::kDataLoss);
  }
  {  // no keep_alive: the check cannot outlive the reader, so it runs at once
    auto reader = open(*bad, nullptr);
    ASSERT_TRUE(reader.ok()) << reader.status();
    DeferredCrcChecks checks;
    DeferredCrcChecks::Scope scope(&checks);
    EXPECT_EQ(reader->VerifyCrc(*reader->Find("archive/data/2")).code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(checks.Wait().ok());
  }
  {  // the reader may go away before the deferred check runs
    DeferredCrcChecks checks;
    {
      auto reader = open(*bad, bad);
      ASSERT_TRUE(reader.ok()) << reader.status();
      DeferredCrcChecks::Scope scope(&checks);
      EXPECT_TRUE(reader->VerifyCrc(*reader->Find("archive/data/2")).ok());
    }
    bad.reset();
    EXPECT_EQ(checks.Wait().code(), absl::StatusCode::kDataLoss);
  }
}

// A record VerifyCrc'd with `reading` under a DeferredCrcChecks scope is
// checked at Wait from the bytes read of it: the zip writer's CRCs of the
// ranges it wrote (an output record streamed from the input's bytes), plus
// the ranges nobody read. A damaged byte is found whether a unit read it or
// not; an intact record passes and is remembered as checked.
TEST(ZipTest, FusedChecksUseTheBytesRead) {
  std::string big(DeferredCrcChecks::kDeferMinBytes + 4096, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 17);
  std::string zip = WriteArchive({{"archive/data.pkl", std::string("\x80\x02}q\x00.", 6)},
                                  {"archive/data/0", big},
                                  {"archive/data/1", big},
                                  {"archive/version", "3\n"}});
  auto good = ZipReader::Open(Bytes(zip), "fused");
  ASSERT_TRUE(good.ok()) << good.status();
  const uint64_t at0 = good->Find("archive/data/0")->data_offset;
  const uint64_t at1 = good->Find("archive/data/1")->data_offset;
  // Writes [begin, end) of a record's bytes as an output record, in the
  // writer's own pieces.
  auto copy_out = [](absl::Span<const uint8_t> data, size_t begin, size_t end) {
    std::string out;
    StringSink sink(&out);
    ZipWriter w(&sink, "out");
    absl::Status s = w.AddRecord("archive/data/0", data.subspan(begin, end - begin));
    if (s.ok()) s = w.Finish();
    EXPECT_TRUE(s.ok()) << s;
  };
  struct Case {
    const char* what;
    std::vector<uint64_t> flips;  // archive offsets of damaged bytes
    size_t read_begin, read_end;  // of data/0, read by a unit
    bool ok;
    std::string names;  // the record the error names
  };
  const size_t n = big.size();
  const std::vector<Case> cases = {
      {"intact, read whole", {}, 0, n, true, ""},
      {"intact, read in part", {}, 1000, n - 5000, true, ""},
      {"intact, not read", {}, 0, 0, true, ""},
      {"damaged where read", {at0 + 2000}, 1000, n - 5000, false, "archive/data/0"},
      {"damaged where not read", {at0 + 10}, 1000, n - 5000, false, "archive/data/0"},
      {"damaged at the end, not read", {at0 + n - 1}, 0, n - 1, false, "archive/data/0"},
      {"damaged in the other record", {at1 + 77}, 0, n, false, "archive/data/1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::string bytes = zip;
    for (uint64_t f : c.flips) bytes[f] ^= 8;
    auto keep = std::make_shared<const std::string>(bytes);
    ZipReadOptions lazy;
    lazy.crc = ZipReadOptions::Crc::kLazy;
    lazy.keep_alive = keep;
    auto reader = ZipReader::Open(Bytes(*keep), "fused", lazy);
    ASSERT_TRUE(reader.ok()) << reader.status();
    const ZipRecord& r0 = *reader->Find("archive/data/0");
    const ZipRecord& r1 = *reader->Find("archive/data/1");
    DeferredCrcChecks checks(2);
    {
      DeferredCrcChecks::Scope scope(&checks);
      EXPECT_TRUE(reader->VerifyCrc(r0, /*reading=*/true).ok());
      EXPECT_TRUE(reader->VerifyCrc(r1, /*reading=*/true).ok());
      EXPECT_TRUE(reader->VerifyCrc(r0, /*reading=*/true).ok());  // tracked once
      if (c.read_end > c.read_begin) copy_out(reader->Data(r0), c.read_begin, c.read_end);
      copy_out(reader->Data(r1), 0, n);
    }
    const absl::Status waited = checks.Wait();
    // Only what no unit read was read again for the check.
    EXPECT_EQ(checks.coverage().covered_bytes(), (c.read_end - c.read_begin) + n);
    EXPECT_EQ(checks.coverage().gap_bytes(), n - (c.read_end - c.read_begin));
    if (c.ok) {
      EXPECT_TRUE(waited.ok()) << waited;
      EXPECT_TRUE(reader->VerifyAllCrcs().ok());
    } else {
      EXPECT_EQ(waited.code(), absl::StatusCode::kDataLoss) << waited;
      EXPECT_NE(waited.message().find("fused: record '" + c.names + "': CRC-32 mismatch"), std::string::npos)
          << waited;
      // Remembered: a later check (outside the scope) reports it too.
      EXPECT_EQ(reader->VerifyCrc(*reader->Find(c.names)).code(), absl::StatusCode::kDataLoss);
    }
  }
}

TEST(ZipTest, DuplicateNameIsInvalidArgument) {
  std::string zip = WriteArchive({{"a/x", "1"}, {"a/y", "2"}});
  // Rename a/y to a/x in its local and central headers.
  for (size_t p = zip.find("a/y"); p != std::string::npos; p = zip.find("a/y", p + 1)) zip[p + 2] = 'x';
  auto r = ZipReader::Open(Bytes(zip), "dup");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("duplicate"), std::string::npos);
}

TEST(ZipTest, RecordPastEndIsDataLoss) {
  std::string zip = WriteArchive({{"a/x", "1234"}, {"a/y", "5678"}});
  size_t cd = CentralHeaderPos(zip, "a/y");
  Put32At(zip, cd + 20, 1 << 20);
  Put32At(zip, cd + 24, 1 << 20);
  auto r = ZipReader::Open(Bytes(zip), "past");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("a/y"), std::string::npos) << r.status();

  std::string zip2 = WriteArchive({{"a/x", "1234"}});
  Put32At(zip2, CentralHeaderPos(zip2, "a/x") + 42, 0x7FFFFFF0);  // local header offset
  EXPECT_EQ(ZipReader::Open(Bytes(zip2), "past").status().code(), absl::StatusCode::kDataLoss);
}

TEST(ZipTest, BadSignaturesAreDataLoss) {
  std::string zip = WriteArchive({{"a/x", "1234"}});
  std::string local = zip;
  local[0] = 'Q';
  EXPECT_EQ(ZipReader::Open(Bytes(local), "sig").status().code(), absl::StatusCode::kDataLoss);
  std::string central = zip;
  central[CentralHeaderPos(zip, "a/x")] = 'Q';
  EXPECT_EQ(ZipReader::Open(Bytes(central), "sig").status().code(), absl::StatusCode::kDataLoss);
  std::string z64 = zip;
  z64[z64.find("PK\x06\x06")] = 'Q';
  EXPECT_EQ(ZipReader::Open(Bytes(z64), "sig").status().code(), absl::StatusCode::kDataLoss);
  std::string descriptor = zip;
  descriptor[descriptor.find("PK\x07\x08") + 4] ^= 1;  // descriptor CRC
  EXPECT_EQ(ZipReader::Open(Bytes(descriptor), "sig").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ZipReader::Open(Bytes(std::string("not a zip at all, really not")), "txt").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(ZipTest, CompressionAndEncryptionAreInvalidArgument) {
  std::string zip = WriteArchive({{"a/x", "1234"}});
  std::string deflated = zip;
  Put16At(deflated, CentralHeaderPos(zip, "a/x") + 10, 8);
  auto r = ZipReader::Open(Bytes(deflated), "m");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("method 8"), std::string::npos) << r.status();
  std::string encrypted = zip;
  Put16At(encrypted, CentralHeaderPos(zip, "a/x") + 8, 0x0809);
  EXPECT_EQ(ZipReader::Open(Bytes(encrypted), "e").status().code(), absl::StatusCode::kInvalidArgument);
}

// A crafted archive (no descriptors) whose first record's data contains the
// second record's local header: both headers are valid, the extents overlap.
TEST(ZipTest, OverlappingRecordsAreDataLoss) {
  auto local = [](const std::string& name, const std::string& data) {
    std::string h;
    Put32At(h.append(4, '\0'), 0, 0x04034b50);
    std::string rest(26, '\0');
    uint32_t crc = Crc32(0, data.data(), data.size());
    Put16At(rest, 2, 0x0800);
    Put32At(rest, 10, crc);
    Put32At(rest, 14, data.size());
    Put32At(rest, 18, data.size());
    Put16At(rest, 22, name.size());
    return h + rest + name + data;
  };
  auto central = [](const std::string& name, const std::string& data, uint32_t offset) {
    std::string h(46, '\0');
    Put32At(h, 0, 0x02014b50);
    Put16At(h, 8, 0x0800);
    Put32At(h, 16, Crc32(0, data.data(), data.size()));
    Put32At(h, 20, data.size());
    Put32At(h, 24, data.size());
    Put16At(h, 28, name.size());
    Put32At(h, 42, offset);
    return h + name;
  };
  std::string inner = local("n2", "");
  std::string outer = local("n1", inner);
  std::string cd = central("n1", inner, 0) + central("n2", "", 30 + 2);
  std::string eocd(22, '\0');
  Put32At(eocd, 0, 0x06054b50);
  Put16At(eocd, 8, 2);
  Put16At(eocd, 10, 2);
  Put32At(eocd, 12, cd.size());
  Put32At(eocd, 16, outer.size());
  std::string zip = outer + cd + eocd;
  auto r = ZipReader::Open(Bytes(zip), "overlap");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("overlap"), std::string::npos) << r.status();
  // Without the second central entry the same bytes are a fine archive.
  std::string cd1 = central("n1", inner, 0);
  Put16At(eocd, 8, 1);
  Put16At(eocd, 10, 1);
  Put32At(eocd, 12, cd1.size());
  EXPECT_TRUE(ZipReader::Open(Bytes(outer + cd1 + eocd), "ok").ok());
}

TEST(ZipTest, TrailingCommentAndCountMismatch) {
  std::string zip = WriteArchive({{"a/x", "1234"}});
  // A comment: the EOCD search must still find the record.
  std::string commented = zip;
  Put16At(commented, commented.size() - 2, 5);
  commented += "hello";
  EXPECT_TRUE(ZipReader::Open(Bytes(commented), "c").ok());
  // A comment length that does not reach the end exactly: no EOCD.
  std::string wrong = commented + "x";
  EXPECT_EQ(ZipReader::Open(Bytes(wrong), "c").status().code(), absl::StatusCode::kDataLoss);
  // Entry counts that disagree between the zip64 and classic records.
  std::string counts = zip;
  Put16At(counts, counts.size() - 12, 2);
  EXPECT_EQ(ZipReader::Open(Bytes(counts), "n").status().code(), absl::StatusCode::kDataLoss);
}

// Any single corrupted byte yields a status (never a crash); the test runs
// every position with a few values.
TEST(ZipTest, SingleByteCorruptionNeverCrashes) {
  std::string zip = WriteArchive(SampleRecords());
  int rejected = 0;
  for (size_t pos = 0; pos < zip.size(); ++pos) {
    for (uint8_t v : {0x00, 0xFF, 0x7F}) {
      std::string bad = zip;
      if (static_cast<uint8_t>(bad[pos]) == v) continue;
      bad[pos] = static_cast<char>(v);
      auto r = ZipReader::Open(Bytes(bad), "fuzz");
      if (!r.ok()) {
        ++rejected;
        continue;
      }
      // Accepted: then every record must lie inside the archive.
      for (const ZipRecord& rec : r->records()) {
        ASSERT_LE(rec.data_offset + rec.size, bad.size());
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace ucp::torch
