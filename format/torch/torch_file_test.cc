#include "format/torch/torch_file.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "format/pickle/writer.h"
#include "format/torch/dump.h"
#include "format/torch/mapped_file.h"
#include "format/torch/test_util.h"
#include "format/torch/torch_test_util.h"
#include "format/torch/tree_copy.h"
#include "format/torch/zip.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using pickle::Value;
using pickle::ValuePtr;
using testing::ReadFileToString;
using testing::TempPath;

Tensor FloatTensor(std::vector<float> values, std::vector<int64_t> sizes) {
  std::string bytes(values.size() * 4, '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return *Tensor::FromBytes(DType::kFloat32, std::move(sizes), std::move(bytes));
}

// ---- crafting (possibly hostile) torch files ----

ValuePtr Pid(const std::string& cls, const std::string& key, int64_t numel) {
  return Value::PersistentId(
      Value::Tuple({Value::Str("storage"), Value::Global("torch", cls), Value::Str(key), Value::Str("cpu"),
                    Value::Int(numel)}));
}

ValuePtr Ints(const std::vector<int64_t>& v) {
  std::vector<ValuePtr> items;
  for (int64_t x : v) items.push_back(Value::Int(x));
  return Value::Tuple(items);
}

ValuePtr RebuildTensor(ValuePtr pid, int64_t offset, const std::vector<int64_t>& sizes,
                       const std::vector<int64_t>& strides) {
  pickle::Object o;
  o.callable = Value::Global("torch._utils", "_rebuild_tensor_v2");
  o.args = Value::Tuple({std::move(pid), Value::Int(offset), Ints(sizes), Ints(strides), Value::Bool(false),
                         Value::MakeDict(true)});
  return Value::MakeObject(std::move(o));
}

struct Record {
  std::string name;
  std::string data;
};

std::string Zip(const std::vector<Record>& records) {
  std::string out;
  StringSink sink(&out);
  ZipWriter w(&sink, "craft");
  for (const Record& r : records) EXPECT_TRUE(w.AddRecord(r.name, r.data).ok());
  EXPECT_TRUE(w.Finish().ok());
  return out;
}

std::string Pkl(const Value& root) {
  auto p = pickle::Pickle(root);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.value_or("");
}

// archive/data.pkl holding `root`, data/0 of `data0_bytes`, version 3.
std::string CraftFile(const Value& root, size_t data0_bytes) {
  return Zip({{"archive/data.pkl", Pkl(root)}, {"archive/data/0", std::string(data0_bytes, '\x01')},
              {"archive/version", "3\n"}});
}

absl::StatusCode OpenCode(const std::string& bytes) {
  return TorchFile::FromBytes(bytes, "craft.pt").status().code();
}

TEST(TorchFileTest, ReadsCraftedFile) {
  ValuePtr root = RebuildTensor(Pid("FloatStorage", "0", 4), 1, {3}, {1});
  auto file = TorchFile::FromBytes(CraftFile(*root, 16), "craft.pt");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->stem(), "archive");
  EXPECT_TRUE(TorchFile::IsTensor(*(*file)->root()));
  auto t = (*file)->GetTensor(*(*file)->root());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(t->storage_offset(), 1);
  EXPECT_EQ(t->storage()->nbytes(), 16u);
  EXPECT_EQ((*file)->RecordNames(),
            (std::vector<std::string>{"archive/data.pkl", "archive/data/0", "archive/version"}));
  EXPECT_EQ((*file)->GetTensor(*Value::Int(3)).status().code(), absl::StatusCode::kInvalidArgument);
}

// d14: a legacy (pre-1.6, non-zip) torch.save file is named as such.
TEST(TorchFileTest, LegacyTorchSaveIsNamed) {
  // torch.save(..., _use_new_zipfile_serialization=False) starts with the
  // protocol and the magic number 0x1950a86a20f9469cfc6c as a LONG1.
  const std::string legacy("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.\x80\x02M\xe9\x03.", 22);
  auto f = TorchFile::FromBytes(legacy, "old.pt");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_EQ(f.status().message().rfind("old.pt: a legacy torch.save file", 0), 0u) << f.status();
  auto bare = TorchFile::FromBytes(std::string("\x80\x04K\x01.", 5), "bare.pt");
  EXPECT_NE(bare.status().message().find("a bare pickle stream"), std::string::npos) << bare.status();
}

// Point 6 of issue 10: a pickle naming a code-execution global is refused
// (naming the global and the file) unless unsafe pickles are allowed;
// ordinary unknown classes pass.
TEST(TorchFileTest, UnsafeGlobalsAreRefusedUnlessAllowed) {
  pickle::Object call;
  call.callable = Value::Global("posix", "system");
  call.args = Value::Tuple({Value::Str("echo pwned")});
  ValuePtr root = Value::MakeDict();
  root->DictSet(Value::Str("x"), Value::MakeObject(std::move(call)));
  pickle::Object cfg;
  cfg.callable = Value::Global("my_trainer.config", "TrainConfig");
  cfg.how = pickle::ObjectHow::kNewObj;
  cfg.args = Value::Tuple({});
  root->DictSet(Value::Str("cfg"), Value::MakeObject(std::move(cfg)));
  const std::string bytes = CraftFile(*root, 16);
  auto refused = TorchFile::FromBytes(bytes, "evil.pt");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(refused.status().message().rfind("evil.pt: UNSAFE pickle: it names posix.system", 0), 0u)
      << refused.status();
  EXPECT_NE(refused.status().message().find("--allow_unsafe_pickle"), std::string::npos);
  OpenOptions report;
  report.refuse_unsafe_globals = false;
  auto reported = TorchFile::FromBytes(bytes, "evil.pt", report);
  ASSERT_TRUE(reported.ok()) << reported.status();
  EXPECT_EQ((*reported)->unsafe_globals(), std::vector<std::string>{"posix.system"});
  // Only the trainer's own class: plain data.
  ValuePtr plain = Value::MakeDict();
  plain->DictSet(Value::Str("cfg"), root->DictGetPtr("cfg"));
  auto ok = TorchFile::FromBytes(CraftFile(*plain, 16), "plain.pt");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->unsafe_globals().empty());
  // getattr(Enum class, 'member') is how Python pickles enum members
  // (DeepSpeed's ZeroStageEnum): data. getattr(f, '__globals__') is not.
  auto getattr_of = [](ValuePtr obj, const std::string& attr) {
    pickle::Object o;
    o.callable = Value::Global("builtins", "getattr");
    o.args = Value::Tuple({std::move(obj), Value::Str(attr)});
    ValuePtr root = Value::MakeDict();
    root->DictSet(Value::Str("v"), Value::MakeObject(std::move(o)));
    return root;
  };
  auto member = TorchFile::FromBytes(
      CraftFile(*getattr_of(Value::Global("deepspeed.runtime.zero.config", "ZeroStageEnum"), "optimizer_states"), 16),
      "enum.pt");
  ASSERT_TRUE(member.ok()) << member.status();
  EXPECT_TRUE((*member)->unsafe_globals().empty());
  auto dunder = TorchFile::FromBytes(
      CraftFile(*getattr_of(Value::Global("torch._utils", "_rebuild_tensor_v2"), "__globals__"), 16), "dunder.pt");
  EXPECT_EQ(dunder.status().code(), absl::StatusCode::kFailedPrecondition) << dunder.status();
  EXPECT_NE(dunder.status().message().find("builtins.getattr"), std::string::npos) << dunder.status();
}

TEST(TorchFileTest, ViewPastStorageIsOutOfRange) {
  ValuePtr root = RebuildTensor(Pid("FloatStorage", "0", 4), 2, {3}, {1});
  auto file = TorchFile::FromBytes(CraftFile(*root, 16), "craft.pt");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kOutOfRange) << file.status();
  EXPECT_NE(file.status().message().find("craft.pt"), std::string::npos);
  ValuePtr strided = RebuildTensor(Pid("FloatStorage", "0", 4), 0, {2, 2}, {3, 1});
  EXPECT_EQ(OpenCode(CraftFile(*strided, 16)), absl::StatusCode::kOutOfRange);
  ValuePtr huge = RebuildTensor(Pid("FloatStorage", "0", 4), 0, {int64_t{1} << 40, int64_t{1} << 40}, {1, 1});
  EXPECT_EQ(OpenCode(CraftFile(*huge, 16)), absl::StatusCode::kOutOfRange);
  ValuePtr negative = RebuildTensor(Pid("FloatStorage", "0", 4), 0, {2}, {-1});
  EXPECT_EQ(OpenCode(CraftFile(*negative, 16)), absl::StatusCode::kInvalidArgument);
}

TEST(TorchFileTest, PersistentIdsAreChecked) {
  // numel disagrees with the record size.
  EXPECT_EQ(OpenCode(CraftFile(*RebuildTensor(Pid("FloatStorage", "0", 5), 0, {1}, {1}), 16)),
            absl::StatusCode::kDataLoss);
  // A partial trailing element is what torch writes for untyped storages.
  EXPECT_TRUE(TorchFile::FromBytes(CraftFile(*RebuildTensor(Pid("FloatStorage", "0", 4), 0, {4}, {1}), 19), "x").ok());
  // No such record.
  EXPECT_EQ(OpenCode(CraftFile(*RebuildTensor(Pid("FloatStorage", "7", 4), 0, {1}, {1}), 16)),
            absl::StatusCode::kDataLoss);
  // Unknown storage class, non-torch global, bad tuple shapes.
  EXPECT_EQ(OpenCode(CraftFile(*RebuildTensor(Pid("EvilStorage", "0", 4), 0, {1}, {1}), 16)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenCode(CraftFile(*Value::PersistentId(Value::Tuple({Value::Str("storage")})), 16)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenCode(CraftFile(*Value::PersistentId(Value::Str("0")), 16)), absl::StatusCode::kInvalidArgument);
  // One key, two dtypes.
  ValuePtr two = Value::List({RebuildTensor(Pid("FloatStorage", "0", 4), 0, {1}, {1}),
                              RebuildTensor(Pid("IntStorage", "0", 4), 0, {1}, {1})});
  EXPECT_EQ(OpenCode(CraftFile(*two, 16)), absl::StatusCode::kInvalidArgument);
  // Tensor arguments of the wrong type.
  pickle::Object o;
  o.callable = Value::Global("torch._utils", "_rebuild_tensor_v2");
  o.args = Value::Tuple({Value::Int(0), Value::Int(0), Ints({1}), Ints({1}), Value::Bool(false), Value::None()});
  EXPECT_EQ(OpenCode(CraftFile(*Value::MakeObject(o), 16)), absl::StatusCode::kInvalidArgument);
}

TEST(TorchFileTest, ArchiveLayoutIsChecked) {
  std::string pkl = Pkl(*Value::None());
  EXPECT_TRUE(TorchFile::FromBytes(Zip({{"a/data.pkl", pkl}, {"a/version", "3\n"}}), "x").ok());
  EXPECT_EQ(OpenCode(Zip({{"a/data.pkl", pkl}})), absl::StatusCode::kDataLoss);               // no version
  EXPECT_EQ(OpenCode(Zip({{"a/version", "3\n"}})), absl::StatusCode::kDataLoss);              // no data.pkl
  EXPECT_EQ(OpenCode(Zip({{"data.pkl", pkl}, {"version", "3\n"}})), absl::StatusCode::kDataLoss);  // no folder
  EXPECT_EQ(OpenCode(Zip({{"a/data.pkl", pkl}, {"a/version", "99\n"}})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenCode(Zip({{"a/data.pkl", pkl}, {"a/version", "x"}})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenCode(Zip({{"a/data.pkl", pkl}, {"a/version", "3\n"}, {"a/byteorder", "big"}})),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(TorchFile::FromBytes(Zip({{"a/data.pkl", pkl}, {"a/.data/version", "3\n"}, {"a/byteorder", "little"}}), "x")
                  .ok());
  EXPECT_FALSE(TorchFile::FromBytes(Zip({{"a/data.pkl", "\x80\x02garbage"}, {"a/version", "3\n"}}), "x").ok());
  OpenOptions small;
  small.max_pickle_bytes = 2;
  EXPECT_EQ(TorchFile::FromBytes(Zip({{"a/data.pkl", pkl}, {"a/version", "3\n"}}), "x", small).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto missing = TorchFile::Open(TempPath("no/such/file.pt"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message().rfind(TempPath("no/such/file.pt"), 0), 0u) << missing.status();
}

TEST(TorchFileTest, LazyCrcDefersStorageVerification) {
  ValuePtr root = RebuildTensor(Pid("FloatStorage", "0", 4), 0, {4}, {1});
  std::string bytes = CraftFile(*root, 16);
  size_t pos = bytes.find(std::string(16, '\x01'));
  ASSERT_NE(pos, std::string::npos);
  bytes[pos + 3] = 9;
  EXPECT_EQ(OpenCode(bytes), absl::StatusCode::kDataLoss);
  OpenOptions lazy;
  lazy.verify_crc = false;
  auto file = TorchFile::FromBytes(bytes, "lazy.pt", lazy);
  ASSERT_TRUE(file.ok()) << file.status();
  Tensor t = *(*file)->GetTensor(*(*file)->root());
  absl::Status s = (*file)->VerifyStorageCrc(*t.storage());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("archive/data/0"), std::string::npos) << s;
  EXPECT_EQ((*file)->VerifyAllCrcs().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*file)->VerifyStorageCrc(*Storage::Zeros(DType::kFloat32, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  auto good = TorchFile::FromBytes(CraftFile(*root, 16), "good.pt", lazy);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE((*good)->VerifyStorageCrc(*(*good)->Storages()[0]).ok());
}

// A file opened with defer_crc while this thread has an OwedCrcChecks leaves
// its records' checks to it: Open takes a damaged record, CheckAll reports it
// (under a DeferredCrcChecks scope a large record is queued and Wait reports
// it). With no OwedCrcChecks, Open checks every record as before.
TEST(TorchFileTest, DeferredCrcChecksAreOwedToTheCommand) {
  const std::string path = TempPath("owed.pt");
  {
    TorchWriter w;
    auto d = Value::MakeDict();
    const int64_t n = 300000;  // 1.2 MB: more than DeferredCrcChecks::kDeferMinBytes
    d->DictSet(Value::Str("big"), w.AddTensor(FloatTensor(std::vector<float>(n, 1.5f), {n})));
    d->DictSet(Value::Str("small"), w.AddTensor(FloatTensor({1, 2, 3}, {3})));
    ASSERT_TRUE(w.WriteFile(path, *d).ok());
  }
  {
    // One byte of the big tensor's record flipped.
    OpenOptions unchecked;
    unchecked.verify_crc = false;
    auto file = TorchFile::Open(path, unchecked);
    ASSERT_TRUE(file.ok()) << file.status();
    const Tensor big = *(*file)->GetTensor(*(*file)->root()->DictGet("big"));
    const int64_t at = big.storage()->data() - (*file)->mapped_file()->data() + 1000;
    file->reset();
    absl::StatusOr<std::string> bytes = ReadFileToString(path);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    (*bytes)[at] ^= 0x40;
    ASSERT_TRUE(WriteFileAtomic(path, *bytes).ok());
  }
  OpenOptions deferred;
  deferred.defer_crc = true;
  EXPECT_EQ(OwedCrcChecks::Current(), nullptr);
  EXPECT_EQ(TorchFile::Open(path, deferred).status().code(), absl::StatusCode::kDataLoss);
  {
    OwedCrcChecks owed;
    EXPECT_EQ(OwedCrcChecks::Current(), &owed);
    EXPECT_TRUE(owed.checked());
    EXPECT_EQ(owed.files(), 0u);
    auto file = TorchFile::Open(path, deferred);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_FALSE(owed.checked());
    EXPECT_EQ(owed.files(), 1u);
    EXPECT_EQ(owed.records(), (*file)->RecordNames().size());
    EXPECT_GE(owed.records(), 4u);  // data.pkl, the two tensors, version (and what torch adds)
    {
      DeferredCrcChecks checks;
      {
        DeferredCrcChecks::Scope scope(&checks);
        EXPECT_TRUE(owed.CheckAll().ok());  // the small record checked here, the big one queued
      }
      absl::Status s = checks.Wait();
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_TRUE(absl::StartsWith(s.message(), path + ": record '")) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "CRC-32 mismatch")) << s;
    }
    EXPECT_TRUE(owed.checked());
    file->reset();  // what the checks read stays mapped
    absl::Status again = owed.CheckAll();
    EXPECT_EQ(again.code(), absl::StatusCode::kDataLoss) << again;
    EXPECT_TRUE(absl::StartsWith(again.message(), path + ": record '")) << again;
    {
      OwedCrcChecks inner;
      EXPECT_EQ(OwedCrcChecks::Current(), &inner);
    }
    EXPECT_EQ(OwedCrcChecks::Current(), &owed);
  }
  EXPECT_EQ(OwedCrcChecks::Current(), nullptr);
  // Opened without CRC checks: nothing is owed (its reader checks what it uses).
  OwedCrcChecks owed;
  OpenOptions lazy = deferred;
  lazy.verify_crc = false;
  ASSERT_TRUE(TorchFile::Open(path, lazy).ok());
  EXPECT_TRUE(owed.checked());
  EXPECT_EQ(owed.files(), 0u);
  EXPECT_EQ(owed.records(), 0u);
  EXPECT_TRUE(owed.CheckAll().ok());
}

// Every truncation and many single-byte corruptions of a real file give a
// status, never a crash.
TEST(TorchFileTest, DamagedFilesNeverCrash) {
  TorchWriter w;
  Tensor a = FloatTensor({1, 2, 3, 4, 5, 6}, {2, 3});
  ValuePtr root = Value::MakeDict(true);
  root->DictSet(Value::Str("a"), w.AddTensor(a));
  root->DictSet(Value::Str("b"), w.AddTensor(*a.Narrow(1, 1, 2)));
  root->DictSet(Value::Str("n"), Value::List({Value::Int(1), Value::Float(2.5), Value::Str("x")}));
  auto bytes = w.WriteToString("damaged", *root);
  ASSERT_TRUE(bytes.ok());
  for (size_t len = 0; len < bytes->size(); ++len) {
    EXPECT_FALSE(TorchFile::FromBytes(bytes->substr(0, len), "cut.pt").ok()) << len;
  }
  int accepted = 0;
  for (size_t pos = 0; pos < bytes->size(); ++pos) {
    for (char v : {'\x00', '\xff', '\x05'}) {
      std::string bad = *bytes;
      if (bad[pos] == v) continue;
      bad[pos] = v;
      auto file = TorchFile::FromBytes(bad, "bad.pt");
      if (!file.ok()) continue;
      ++accepted;  // e.g. a changed padding byte; whatever was accepted is dumpable
      EXPECT_TRUE(CanonicalDump(**file).ok());
    }
  }
  EXPECT_GT(accepted, 0);
}

TEST(TorchWriterTest, WritesSharedStoragesAndStreams) {
  TorchWriteOptions options;
  options.chunk_bytes = 4096;  // several chunks per streamed storage
  TorchWriter w(options);
  Tensor base = FloatTensor({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4});
  ValuePtr root = Value::MakeDict();
  root->DictSet(Value::Str("view"), w.AddTensor(*base.Narrow(1, 1, 2)));  // whole storage is written
  root->DictSet(Value::Str("base"), w.AddTensor(base));
  const int64_t n = 10000;
  std::vector<std::pair<uint64_t, size_t>> calls;
  root->DictSet(Value::Str("streamed"),
                w.AddStreamedTensor(DType::kInt32, {50, 100}, n + 7, 7, [&](uint64_t offset, absl::Span<uint8_t> dst) {
                  calls.push_back({offset, dst.size()});
                  for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>((offset + i) / 4);
                  return absl::OkStatus();
                }));
  auto bytes = w.WriteToString("arch", *root);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // Adjacent, increasing chunks covering the storage.
  uint64_t next = 0;
  for (const auto& [offset, size] : calls) {
    EXPECT_EQ(offset, next);
    EXPECT_LE(size, 4096u);
    next += size;
  }
  EXPECT_EQ(next, uint64_t(n + 7) * 4);
  auto file = TorchFile::FromBytes(*bytes, "arch.pt");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->RecordNames(),
            (std::vector<std::string>{"arch/data.pkl", "arch/data/0", "arch/data/1", "arch/version"}));
  const Value& r = *(*file)->root();
  Tensor view = *(*file)->GetTensor(*r.DictGet("view"));
  Tensor b = *(*file)->GetTensor(*r.DictGet("base"));
  Tensor s = *(*file)->GetTensor(*r.DictGet("streamed"));
  EXPECT_EQ(view.storage(), b.storage());  // one Storage for one record
  EXPECT_TRUE(b.BitwiseEqual(base));
  EXPECT_TRUE(view.BitwiseEqual(*base.Narrow(1, 1, 2)));
  EXPECT_EQ(s.storage_offset(), 7);
  EXPECT_EQ(s.sizes(), (std::vector<int64_t>{50, 100}));
  int32_t first;
  std::memcpy(&first, s.data(), 4);
  EXPECT_EQ(first, 0x07070707);
}

// A DCP `.distcp` file: archives back to back, each the bytes torch.save
// writes to a stream (WriteToString with the same stem), read back at its
// offset (TorchFile::OpenRange, as the DCP reader does).
TEST(TorchWriterTest, WritesArchivesBackToBack) {
  const std::string path = TempPath("back_to_back.distcp");
  std::vector<Tensor> tensors = {FloatTensor({1, 2, 3, 4, 5, 6}, {2, 3}), FloatTensor({7}, {}),
                                 FloatTensor(std::vector<float>(3000, 0.5f), {3000})};
  std::vector<std::unique_ptr<TorchWriter>> owned;
  std::vector<TorchWriter*> writers;
  std::vector<ValuePtr> roots;
  std::vector<const Value*> root_ptrs;
  for (const Tensor& t : tensors) {
    owned.push_back(std::make_unique<TorchWriter>());
    writers.push_back(owned.back().get());
    roots.push_back(owned.back()->AddTensor(t));
    root_ptrs.push_back(roots.back().get());
  }
  std::vector<uint64_t> lengths;
  ASSERT_TRUE(TorchWriter::WriteBackToBack(writers, path, "archive", root_ptrs, &lengths).ok());
  ASSERT_EQ(lengths.size(), tensors.size());
  auto read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status();
  const std::string& bytes = *read;
  uint64_t offset = 0;
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    TorchWriter alone;
    auto expected = alone.WriteToString("archive", *alone.AddTensor(tensors[i]));
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(lengths[i], expected->size()) << i;
    EXPECT_EQ(bytes.substr(offset, lengths[i]), *expected) << "archive " << i;
    auto item = TorchFile::OpenRange(*mapped, offset, lengths[i], absl::StrCat(path, " item ", i));
    ASSERT_TRUE(item.ok()) << item.status();
    auto t = (*item)->GetTensor(*(*item)->root());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->BitwiseEqual(tensors[i])) << i;
    offset += lengths[i];
  }
  EXPECT_EQ(offset, bytes.size());
  std::filesystem::remove(path);
}

TEST(TorchWriterTest, KeysFollowPickleOrderNotAddOrder) {
  TorchWriter w;
  ValuePtr first_added = w.AddTensor(FloatTensor({1}, {1}));
  ValuePtr second_added = w.AddTensor(FloatTensor({2}, {1}));
  ValuePtr root = Value::List({second_added, first_added});
  auto bytes = w.WriteToString("k", *root);
  ASSERT_TRUE(bytes.ok());
  auto file = TorchFile::FromBytes(*bytes, "k.pt");
  ASSERT_TRUE(file.ok());
  const auto& pid = (*file)->root()->items()[0]->object().args->items()[0]->pid();
  EXPECT_EQ(pid->items()[2]->str(), "0");
  float v;
  std::memcpy(&v, (*file)->GetTensor(*(*file)->root()->items()[0])->data(), 4);
  EXPECT_EQ(v, 2.0f);
}

TEST(TorchWriterTest, Failures) {
  TorchWriter w;
  // A persistent id from elsewhere.
  EXPECT_EQ(w.WriteToString("x", *Pid("FloatStorage", "0", 1)).status().code(), absl::StatusCode::kInvalidArgument);
  // A streamed view that does not fit its storage.
  TorchWriter bad;
  ValuePtr t = bad.AddStreamedTensor(DType::kFloat32, {10}, 5, 0, [](uint64_t, absl::Span<uint8_t>) {
    return absl::OkStatus();
  });
  EXPECT_EQ(bad.WriteToString("x", *t).status().code(), absl::StatusCode::kInvalidArgument);
  // An undefined tensor.
  TorchWriter undefined;
  EXPECT_EQ(undefined.WriteToString("x", *undefined.AddTensor(Tensor())).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A failing producer: error returned, partial file removed.
  TorchWriter failing;
  ValuePtr f = failing.AddStreamedTensor(DType::kFloat32, {10}, 10, 0, [](uint64_t, absl::Span<uint8_t>) {
    return absl::UnavailableError("disk on fire");
  });
  const std::string path = TempPath("writer/failing.pt");
  absl::Status s = failing.WriteFile(path, *f);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(std::filesystem::exists(path));
  // An unwritable path.
  TorchWriter empty;
  EXPECT_EQ(empty.WriteFile(TempPath("writer") + "/no/such/dir/x.pt", *Value::None()).code(),
            absl::StatusCode::kNotFound);
}

// Writing over the file the tensors are read from must not truncate it.
TEST(TorchWriterTest, RefusesToOverwriteAMappedSource) {
  const std::string path = TempPath("writer/source.pt");
  {
    TorchWriter w;
    ASSERT_TRUE(w.WriteFile(path, *w.AddTensor(FloatTensor({1, 2, 3}, {3}))).ok());
  }
  const std::string before = *ReadFileToString(path);
  auto file = TorchFile::Open(path);
  ASSERT_TRUE(file.ok());
  TorchWriter w;
  ValuePtr copy = w.AddTensor(*(*file)->GetTensor(*(*file)->root()));
  EXPECT_EQ(w.WriteFile(path, *copy).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ReadFileToString(path), before);
  // The writer's storages keep the mapping alive after the TorchFile is gone.
  file->reset();
  EXPECT_EQ(w.WriteFile(path, *copy).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ReadFileToString(path), before);
}

// ---- against Python ----

// Files written by torch.save (testdata/make_cases.py): every dtype, views,
// shared storages, 0-dim/empty tensors, parameters, nested containers,
// objects, an odd-sized storage. Each must dump like Python, and survive a
// C++ read -> write round trip byte for byte and as Python sees it.
TEST(TorchFilePythonTest, GeneratedCasesReadLikePythonAndRoundTrip) {
  const std::string in_dir = TempPath("cases/in");
  const std::string out_dir = TempPath("cases/out");
  std::filesystem::create_directories(out_dir);
  auto made = testing::RunPython(testing::PackageDataPath("testdata/make_cases.py"), {in_dir});
  ASSERT_TRUE(made.ok()) << made.status();
  std::vector<std::string> inputs = testing::FindTorchFiles(in_dir);
  ASSERT_GE(inputs.size(), 13u);
  std::vector<std::string> outputs;
  std::vector<std::string> cpp_dumps;
  for (const std::string& path : inputs) {
    auto file = TorchFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    auto dump = CanonicalDump(**file);
    ASSERT_TRUE(dump.ok()) << dump.status();
    cpp_dumps.push_back(*dump);
    TorchWriteOptions options;
    options.chunk_bytes = 100000;  // "big" spans several chunks
    TorchWriter writer(options);
    auto copy = CopyTreeForWrite(file->get(), (*file)->root(), writer);
    ASSERT_TRUE(copy.ok()) << copy.status();
    const std::string out = out_dir + "/" + std::filesystem::path(path).filename().string();
    ASSERT_TRUE(writer.WriteFile(out, **copy).ok());
    outputs.push_back(out);
  }
  std::vector<std::string> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  auto python = testing::PythonDumps(all);
  ASSERT_TRUE(python.ok()) << python.status();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& expected = (*python)[inputs[i]];
    EXPECT_EQ(testing::DiffExcerpt(expected, cpp_dumps[i]), "") << inputs[i] << " (C++ dump vs Python)";
    EXPECT_EQ(testing::DiffExcerpt(expected, (*python)[outputs[i]]), "") << outputs[i] << " (Python, rewritten)";
    auto original = ReadFileToString(inputs[i]);
    auto rewritten = ReadFileToString(outputs[i]);
    EXPECT_TRUE(*original == *rewritten) << inputs[i] << ": rewritten file differs in bytes";
    auto reread = TorchFile::Open(outputs[i]);
    ASSERT_TRUE(reread.ok()) << reread.status();
    EXPECT_EQ(testing::DiffExcerpt(cpp_dumps[i], *CanonicalDump(**reread)), "") << outputs[i];
  }
}

// Records with zip64 sizes (low size threshold) are read by torch.load.
TEST(TorchFilePythonTest, Zip64FilesLoadInTorch) {
  TorchWriteOptions options;
  options.zip64_size_threshold = 200;
  TorchWriter w(options);
  ValuePtr root = Value::MakeDict();
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  root->DictSet(Value::Str("big"), w.AddTensor(FloatTensor(values, {10, 100})));
  root->DictSet(Value::Str("small"), w.AddTensor(FloatTensor({1, 2}, {2})));
  const std::string path = TempPath("zip64/zip64.pt");
  ASSERT_TRUE(w.WriteFile(path, *root).ok());
  auto file = TorchFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto python = testing::PythonDumps({path});
  ASSERT_TRUE(python.ok()) << python.status();
  EXPECT_EQ(testing::DiffExcerpt((*python)[path], *CanonicalDump(**file)), "");
}

// Opening (and CRC-checking) a file must not leave its pages in this
// process's RSS: a converter opens every file of a checkpoint at once.
TEST(TorchFileRssTest, OpenWithCrcChecksGivesPagesBack) {
  const std::string path = TempPath("rss_open.pt");
  {
    TorchWriter w;
    const int64_t n = int64_t{96} << 20 >> 2;  // 96 MiB of float32
    ValuePtr t = w.AddStreamedTensor(DType::kFloat32, {n}, n, 0, [](uint64_t offset, absl::Span<uint8_t> dst) {
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>((offset + i) * 7);
      return absl::OkStatus();
    });
    ASSERT_TRUE(w.WriteFile(path, *t).ok());
  }
  const int64_t before = testing::RssKiB();
  auto file = TorchFile::Open(path);  // verifies every CRC
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_LT(testing::RssKiB() - before, 32 * 1024) << "before " << before << " KiB";
}

// Records filled in parallel at their final offsets give the same bytes as
// the sequential writer (also through the zip64 path).
TEST(TorchWriterParallelTest, SameBytesAsSequential) {
  for (uint64_t zip64_threshold : {uint64_t{0xFFFFFFFF}, uint64_t{1} << 20}) {
    std::string files[2];
    for (int threads : {1, 3}) {
      TorchWriteOptions o;
      o.record_threads = threads;
      o.zip64_size_threshold = zip64_threshold;
      o.zip64_offset_threshold = zip64_threshold;
      TorchWriter w(o);
      auto root = Value::MakeDict();
      for (int k = 0; k < 5; ++k) {
        const int64_t n = (int64_t{1} << 18) * (k + 1) + 7 * k;
        root->DictSet(Value::Str(absl::StrCat("t", k)),
                      w.AddStreamedTensor(DType::kFloat32, {n}, n, 0, [k](uint64_t offset, absl::Span<uint8_t> dst) {
                        for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>((offset + i) * (k + 3));
                        return absl::OkStatus();
                      }));
      }
      root->DictSet(Value::Str("small"), w.AddTensor(*Tensor::FromBytes(DType::kInt64, {2}, std::string(16, 'x'))));
      // The same file name (it names the archive's records), another folder.
      const std::string dir = TempPath(absl::StrCat("parallel_", threads));
      std::filesystem::create_directories(dir);
      const std::string path = dir + "/parallel.pt";
      absl::Status written = w.WriteFile(path, *root);
      ASSERT_TRUE(written.ok()) << written << " (threads " << threads << ")";
      files[threads == 1 ? 0 : 1] = *ReadFileToString(path);
      auto back = TorchFile::Open(path);
      ASSERT_TRUE(back.ok()) << back.status();
    }
    EXPECT_EQ(files[0].size(), files[1].size());
    EXPECT_TRUE(files[0] == files[1]) << "zip64 threshold " << zip64_threshold;
  }
}

// A writer for WriteFiles tests: file `k` of a batch, with streamed storages
// (producer and viewer), an in-memory one and an empty one of k-dependent
// sizes, so the files' pieces and headers never line up.
std::unique_ptr<TorchWriter> BatchWriter(int k, bool hash, ValuePtr* root, const std::string* viewed,
                                         bool fail = false) {
  TorchWriteOptions o;
  o.digest = hash ? DigestKind::kSha256 : DigestKind::kNone;
  o.chunk_bytes = size_t{1} << 20;
  auto w = std::make_unique<TorchWriter>(o);
  *root = Value::MakeDict();
  const int64_t n = (int64_t{1} << 18) * (k % 3 + 1) + 13 * k;
  (*root)->DictSet(Value::Str(absl::StrCat("produced_", std::string(k, 'x'))),
                   w->AddStreamedTensor(DType::kFloat32, {n}, n, 0, [k, fail](uint64_t offset, absl::Span<uint8_t> dst) {
                     if (fail && offset > 0) return absl::DataLossError("source went away");
                     for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>((offset + i) * (k + 5) >> 3);
                     return absl::OkStatus();
                   }));
  const int64_t m = static_cast<int64_t>(viewed->size()) / 2 - k;
  (*root)->DictSet(Value::Str("viewed"),
                   w->AddStreamedTensor(DType::kInt16, {m}, m, 0,
                                        [viewed, k](uint64_t offset, size_t len, uint8_t*) -> absl::StatusOr<absl::Span<const uint8_t>> {
                                          return absl::MakeConstSpan(
                                              reinterpret_cast<const uint8_t*>(viewed->data()) + 2 * k + offset, len);
                                        }));
  (*root)->DictSet(Value::Str("small"), w->AddTensor(FloatTensor({1.0f * k, 2, 3}, {3})));
  (*root)->DictSet(Value::Str("empty"), w->AddTensor(*Tensor::FromBytes(DType::kFloat32, {0}, "")));
  return w;
}

// WriteFiles writes each file exactly as WriteFile does, and when the files
// are hashed in pairs each digest is the sha256 of its file; a failure in one
// file leaves none of the batch behind.
TEST(TorchWriterBatchTest, SameFilesAndDigestsAsOneByOne) {
  std::string viewed(size_t{5} << 20, '\0');
  for (size_t i = 0; i < viewed.size(); ++i) viewed[i] = static_cast<char>(i * 31 + (i >> 11));
  for (bool hash : {true, false}) {
    for (int count : {1, 2, 3, 5}) {
      const std::string one_dir = TempPath(absl::StrCat("batch/one_", hash, "_", count));
      const std::string all_dir = TempPath(absl::StrCat("batch/all_", hash, "_", count));
      std::filesystem::create_directories(one_dir);
      std::filesystem::create_directories(all_dir);
      std::vector<std::unique_ptr<TorchWriter>> writers;
      std::vector<ValuePtr> roots(count);
      std::vector<std::string> paths;
      std::vector<std::string> one_digests;
      for (int k = 0; k < count; ++k) {
        const std::string name = absl::StrCat("f", k, ".pt");
        ValuePtr root;
        auto single = BatchWriter(k, hash, &root, &viewed);
        ASSERT_TRUE(single->WriteFile(one_dir + "/" + name, *root).ok());
        one_digests.push_back(single->digest_hex());
        writers.push_back(BatchWriter(k, hash, &roots[k], &viewed));
        paths.push_back(all_dir + "/" + name);
      }
      std::vector<TorchWriter*> w;
      std::vector<const Value*> r;
      for (int k = 0; k < count; ++k) {
        w.push_back(writers[k].get());
        r.push_back(roots[k].get());
      }
      absl::Status s = TorchWriter::WriteFiles(w, paths, r);
      ASSERT_TRUE(s.ok()) << s;
      for (int k = 0; k < count; ++k) {
        const std::string bytes = *ReadFileToString(paths[k]);
        EXPECT_TRUE(bytes == *ReadFileToString(one_dir + absl::StrCat("/f", k, ".pt"))) << k;
        EXPECT_EQ(writers[k]->bytes_written(), bytes.size());
        EXPECT_EQ(writers[k]->digest_hex(), one_digests[k]);
        EXPECT_EQ(writers[k]->digest_hex(), hash ? Sha256Hex(bytes) : "") << "hash " << hash << " file " << k;
        EXPECT_TRUE(TorchFile::Open(paths[k]).ok());
      }
    }
    // File 1 of 3 fails half way: no file of the batch is left.
    const std::string dir = TempPath(absl::StrCat("batch/failing_", hash));
    std::filesystem::create_directories(dir);
    std::vector<std::unique_ptr<TorchWriter>> writers;
    std::vector<ValuePtr> roots(3);
    std::vector<TorchWriter*> w;
    std::vector<const Value*> r;
    std::vector<std::string> paths;
    for (int k = 0; k < 3; ++k) {
      writers.push_back(BatchWriter(k, hash, &roots[k], &viewed, /*fail=*/k == 1));
      w.push_back(writers.back().get());
      r.push_back(roots[k].get());
      paths.push_back(dir + absl::StrCat("/f", k, ".pt"));
    }
    EXPECT_EQ(TorchWriter::WriteFiles(w, paths, r).code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "hash " << hash;
  }
  // Misuse.
  TorchWriter one;
  ValuePtr none = Value::None();
  std::vector<TorchWriter*> twice = {&one, &one};
  std::vector<std::string> two_paths = {TempPath("batch/a.pt"), TempPath("batch/b.pt")};
  std::vector<const Value*> two_roots = {none.get(), none.get()};
  EXPECT_EQ(TorchWriter::WriteFiles(twice, two_paths, two_roots).code(), absl::StatusCode::kInvalidArgument);
}



// A tree whose storage records have sizes that are no multiple of the piece
// alignment, of dtypes of 1, 2, 4 and 8 bytes, produced, viewed, in memory
// and empty, so that piece boundaries fall inside records of each kind.
ValuePtr PieceTree(TorchWriter& w, const std::string* viewed) {
  auto root = Value::MakeDict();
  for (int k = 0; k < 4; ++k) {
    const int64_t n = (int64_t{1} << 17) * (k + 1) + 5 * k + 3;
    root->DictSet(Value::Str(absl::StrCat("f", k)),
                  w.AddStreamedTensor(DType::kFloat32, {n}, n, 0, [k](uint64_t offset, absl::Span<uint8_t> dst) {
                    for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>((offset + i) * (k + 3) + (offset + i) / 4093);
                    return absl::OkStatus();
                  }));
  }
  const int64_t nb = 300001;  // bf16: 600002 bytes
  root->DictSet(Value::Str("bf16"), w.AddStreamedTensor(DType::kBFloat16, {nb}, nb, 0,
                                                        [](uint64_t offset, absl::Span<uint8_t> dst) {
                                                          for (size_t i = 0; i < dst.size(); ++i) {
                                                            dst[i] = static_cast<uint8_t>((offset + i) * 7 + 1);
                                                          }
                                                          return absl::OkStatus();
                                                        }));
  const int64_t nv = static_cast<int64_t>(viewed->size() / 8);
  root->DictSet(Value::Str("viewed"),
                w.AddStreamedTensor(DType::kInt64, {nv}, nv, 0,
                                    [viewed](uint64_t offset, size_t len, uint8_t*) -> absl::StatusOr<absl::Span<const uint8_t>> {
                                      return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(viewed->data()) + offset, len);
                                    }));
  root->DictSet(Value::Str("bytes"), w.AddStreamedTensor(DType::kUInt8, {12345}, 12345, 0,
                                                         [](uint64_t offset, absl::Span<uint8_t> dst) {
                                                           for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>(offset + i);
                                                           return absl::OkStatus();
                                                         }));
  root->DictSet(Value::Str("empty"), w.AddTensor(*Tensor::FromBytes(DType::kFloat32, {0}, std::string())));
  root->DictSet(Value::Str("small"), w.AddTensor(*Tensor::FromBytes(DType::kInt64, {2}, std::string(16, 'x'))));
  return root;
}

std::string Viewed() {
  std::string v(8 * 70001, '\0');
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>(i * 13 + i / 977);
  return v;
}

// Writes `path` in `pieces` pieces (each with a writer of its own, in
// reverse order, as other processes would) and finishes it; the pieces'
// CRCs go to `crcs`.
absl::StatusOr<uint64_t> WriteInPieces(const std::string& path, int pieces, const TorchWriteOptions& o,
                                       std::vector<std::vector<RecordPieceCrc>>* crcs, int skip = -1) {
  const std::string viewed = Viewed();
  crcs->assign(pieces, {});
  std::vector<RecordPieceCrc> all;
  for (int k = pieces - 1; k >= 0; --k) {
    if (k == skip) continue;
    TorchWriter w(o);
    ValuePtr root = PieceTree(w, &viewed);
    absl::Status s = w.WritePiece(path, *root, k, pieces, &(*crcs)[k]);
    if (!s.ok()) return s;
    all.insert(all.end(), (*crcs)[k].begin(), (*crcs)[k].end());
  }
  TorchWriter w(o);
  ValuePtr root = PieceTree(w, &viewed);
  return w.FinishPieces(path, *root, all);
}

TEST(TorchWriterPiecesTest, SameBytesAsWriteFileForAnyPieceCount) {
  const std::string viewed = Viewed();
  for (uint64_t zip64_threshold : {uint64_t{0xFFFFFFFF}, uint64_t{1} << 20}) {
    TorchWriteOptions o;
    o.zip64_size_threshold = zip64_threshold;
    o.zip64_offset_threshold = zip64_threshold;
    o.chunk_bytes = 100000;  // chunks that never line up with the pieces
    const std::string whole_dir = TempPath(absl::StrCat("pieces_whole_", zip64_threshold));
    std::filesystem::create_directories(whole_dir);
    TorchWriter w(o);
    ValuePtr root = PieceTree(w, &viewed);
    ASSERT_TRUE(w.WriteFile(whole_dir + "/optim.pt", *root).ok());
    const std::string expected = *ReadFileToString(whole_dir + "/optim.pt");
    for (int pieces : {1, 2, 3, 7, 40, 1000}) {
      const std::string dir = TempPath(absl::StrCat("pieces_", zip64_threshold, "_", pieces));
      std::filesystem::create_directories(dir);
      std::vector<std::vector<RecordPieceCrc>> crcs;
      absl::StatusOr<uint64_t> size = WriteInPieces(dir + "/optim.pt", pieces, o, &crcs);
      ASSERT_TRUE(size.ok()) << size.status() << " pieces " << pieces;
      EXPECT_EQ(*size, expected.size());
      const std::string got = *ReadFileToString(dir + "/optim.pt");
      EXPECT_EQ(got.size(), expected.size()) << pieces;
      EXPECT_TRUE(got == expected) << "pieces " << pieces << " zip64 threshold " << zip64_threshold;
      auto back = TorchFile::Open(dir + "/optim.pt");
      EXPECT_TRUE(back.ok()) << back.status();
    }
  }
}

TEST(TorchWriterPiecesTest, PiecePartsAreWhatWritePieceWrites) {
  const std::string viewed = Viewed();
  TorchWriteOptions o;
  // Storage bytes in creation order (PieceTree's f0..f3, bf16, viewed, bytes, empty, small).
  std::vector<uint64_t> storage_bytes;
  for (int k = 0; k < 4; ++k) storage_bytes.push_back(4 * ((uint64_t{1} << 17) * (k + 1) + 5 * k + 3));
  storage_bytes.insert(storage_bytes.end(), {600002, viewed.size(), 12345, 0, 16});
  for (int pieces : {1, 3, 40}) {
    const std::string dir = TempPath(absl::StrCat("pieces_parts_", pieces));
    std::filesystem::create_directories(dir);
    std::vector<uint64_t> covered(storage_bytes.size(), 0);
    TorchWriter planner(o);
    ValuePtr root = PieceTree(planner, &viewed);
    EXPECT_EQ(planner.num_storages(), storage_bytes.size());
    auto all_parts = planner.PieceParts(dir + "/optim.pt", *root, pieces);
    ASSERT_TRUE(all_parts.ok()) << all_parts.status();
    ASSERT_EQ(all_parts->size(), static_cast<size_t>(pieces));
    for (int k = 0; k < pieces; ++k) {
      const auto* parts = &(*all_parts)[k];
      TorchWriter w(o);
      ValuePtr root2 = PieceTree(w, &viewed);
      std::vector<RecordPieceCrc> crcs;
      ASSERT_TRUE(w.WritePiece(dir + "/optim.pt", *root2, k, pieces, &crcs).ok());
      ASSERT_EQ(parts->size(), crcs.size()) << "piece " << k << " of " << pieces;
      for (size_t i = 0; i < crcs.size(); ++i) {
        EXPECT_EQ((*parts)[i].offset, crcs[i].offset);
        EXPECT_EQ((*parts)[i].length, crcs[i].length);
        ASSERT_LT((*parts)[i].storage, storage_bytes.size());
        EXPECT_LE((*parts)[i].offset + (*parts)[i].length, storage_bytes[(*parts)[i].storage]);
        covered[(*parts)[i].storage] += (*parts)[i].length;
      }
    }
    EXPECT_EQ(covered, storage_bytes) << pieces;  // every storage, once, by its own index
  }
  TorchWriter w(o);
  ValuePtr root = PieceTree(w, &viewed);
  EXPECT_EQ(w.PieceParts("x.pt", *root, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TorchWriterPiecesTest, BoundsAreEvenAlignedAndCoverEverything) {
  const std::vector<uint64_t> sizes = {10000, 0, 123457, 5, 4096 * 3, 999999};
  const uint64_t total = 10000 + 123457 + 5 + 4096 * 3 + 999999;
  for (int pieces : {1, 2, 5, 64, 5000}) {
    const std::vector<uint64_t> b = StoragePieceBounds(sizes, pieces);
    ASSERT_EQ(b.size(), static_cast<size_t>(pieces) + 1);
    EXPECT_EQ(b.front(), 0u);
    EXPECT_EQ(b.back(), total);
    for (int k = 1; k < pieces; ++k) {
      EXPECT_LE(b[k - 1], b[k]);
      // Aligned within its record, and within one alignment of an even share.
      uint64_t start = 0;
      for (uint64_t n : sizes) {
        if (b[k] < start + n) break;
        start += n;
      }
      EXPECT_EQ((b[k] - start) % kPieceAlignment, 0u) << k;
      const uint64_t share = total * k / pieces;
      EXPECT_LE(b[k], share);
      EXPECT_LT(share - b[k], kPieceAlignment);
    }
  }
}

TEST(TorchWriterPiecesTest, FinishRefusesAMissingPiece) {
  TorchWriteOptions o;
  const std::string dir = TempPath("pieces_missing");
  std::filesystem::create_directories(dir);
  std::vector<std::vector<RecordPieceCrc>> crcs;
  absl::StatusOr<uint64_t> size = WriteInPieces(dir + "/optim.pt", 4, o, &crcs, /*skip=*/2);
  ASSERT_FALSE(size.ok());
  EXPECT_EQ(size.status().code(), absl::StatusCode::kFailedPrecondition) << size.status();
  EXPECT_NE(size.status().message().find("the pieces written cover"), std::string::npos) << size.status();
}

TEST(TorchWriterPiecesTest, WritePieceRefusesADigest) {
  TorchWriteOptions o;
  o.digest = DigestKind::kXxh3_128;
  const std::string viewed = Viewed();
  TorchWriter w(o);
  ValuePtr root = PieceTree(w, &viewed);
  std::vector<RecordPieceCrc> crcs;
  EXPECT_EQ(w.WritePiece(TempPath("pieces_digest.pt"), *root, 0, 2, &crcs).code(), absl::StatusCode::kInvalidArgument);
}

// The combined CRCs guard every piece: a byte flipped anywhere in any piece
// of the finished file fails the record's CRC check.
TEST(TorchWriterPiecesTest, AFlippedByteInAnyPieceFailsTheCrcCheck) {
  TorchWriteOptions o;
  const std::string dir = TempPath("pieces_flip");
  std::filesystem::create_directories(dir);
  std::vector<std::vector<RecordPieceCrc>> crcs;
  const int pieces = 5;
  ASSERT_TRUE(WriteInPieces(dir + "/optim.pt", pieces, o, &crcs).ok());
  const std::string good = *ReadFileToString(dir + "/optim.pt");
  ASSERT_TRUE(TorchFile::FromBytes(good, "good").ok());
  ZipReadOptions lazy;
  lazy.crc = ZipReadOptions::Crc::kLazy;
  auto zip = ZipReader::Open(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(good.data()), good.size()), "good", lazy);
  ASSERT_TRUE(zip.ok()) << zip.status();
  std::vector<const ZipRecord*> data_records;
  for (const ZipRecord& r : zip->records()) {
    if (r.name.find("/data/") != std::string::npos) data_records.push_back(&r);
  }
  int flipped = 0;
  for (int k = 0; k < pieces; ++k) {
    ASSERT_FALSE(crcs[k].empty()) << "piece " << k << " is empty";
    for (const RecordPieceCrc& part : crcs[k]) {
      ASSERT_LT(part.record, data_records.size());
      for (uint64_t at : {part.offset, part.offset + part.length / 2, part.offset + part.length - 1}) {
        std::string bad = good;
        bad[data_records[part.record]->data_offset + at] ^= 0x01;
        auto file = TorchFile::FromBytes(bad, "bad");
        ASSERT_FALSE(file.ok()) << "piece " << k << " record " << part.record << " byte " << at;
        EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << file.status();
        ++flipped;
      }
    }
  }
  EXPECT_GE(flipped, 3 * pieces);
}

}  // namespace
}  // namespace ucp::torch
