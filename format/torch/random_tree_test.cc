// Random trees of tensors and Python values through ucp's writer and reader
// and through torch.load: a RapidCheck property that read(write(tree)) keeps
// every value and every tensor's bytes (and writes the same bytes again),
// and a seeded batch of such files that Python's torch.load dumps exactly as
// ucp's reader does (canonical_dump.py).
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/pickle/value.h"
#include "format/torch/dump.h"
#include "format/torch/test_util.h"
#include "format/torch/torch_file.h"
#include "format/torch/torch_test_util.h"
#include "format/torch/tree_copy.h"
#include "gtest/gtest.h"
#include "rapidcheck.h"
#include "rapidcheck/gtest.h"

namespace ucp::torch {
namespace {

using pickle::Value;
using pickle::ValuePtr;

// Draws from RapidCheck (shrinkable) or from a seeded engine.
struct RcChoice {
  int Below(int n) { return *rc::gen::inRange(0, n); }
};
struct SeededChoice {
  explicit SeededChoice(uint64_t seed) : engine(seed) {}
  int Below(int n) { return std::uniform_int_distribution<int>(0, n - 1)(engine); }
  std::mt19937_64 engine;
};

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt8,
                             DType::kInt16,   DType::kInt32,   DType::kInt64,   DType::kUInt8,    DType::kBool,
                             DType::kComplex64};

// A tree with tensors: fresh storages, views into earlier storages (offsets,
// transposes), 0-dim and empty tensors, next to ints, floats, strs, lists,
// tuples, dicts and OrderedDicts. Remembers each tensor for the checks.
template <typename Choice>
class TreeMaker {
 public:
  TreeMaker(Choice& choice, TorchWriter& writer) : c_(choice), w_(writer) {}

  ValuePtr Make(int depth) {
    const int kind = c_.Below(depth >= 3 ? 6 : 10);
    switch (kind) {
      case 0: return Value::Int(c_.Below(2000) - 1000);
      case 1: return Value::Float((c_.Below(10000) - 5000) / 7.0);
      case 2: return Value::Str(absl::StrCat("s", c_.Below(100)));
      case 3: return Value::None();
      case 4:
      case 5: return MakeTensor();
      case 6: {
        std::vector<ValuePtr> items;
        for (int i = c_.Below(4); i > 0; --i) items.push_back(Make(depth + 1));
        return c_.Below(2) ? Value::List(items) : Value::Tuple(items);
      }
      default: {
        ValuePtr d = Value::MakeDict(/*ordered_dict=*/c_.Below(2) == 0);
        for (int i = c_.Below(4); i > 0; --i) d->DictSet(Value::Str(absl::StrCat("k", i)), Make(depth + 1));
        return d;
      }
    }
  }

  std::vector<Tensor> tensors;

 private:
  ValuePtr MakeTensor() {
    if (!tensors.empty() && c_.Below(3) == 0) {
      // A view of an earlier tensor's storage.
      const Tensor& base = tensors[c_.Below(static_cast<int>(tensors.size()))];
      const int64_t n = base.storage()->numel();
      if (n >= 2) {
        const int64_t offset = c_.Below(static_cast<int>(n / 2));
        const int64_t len = 1 + c_.Below(static_cast<int>(n - offset));
        absl::StatusOr<Tensor> view = c_.Below(2) == 0 && len % 2 == 0
                                          ? Tensor::Make(base.storage(), offset, {2, len / 2}, {1, 2})
                                          : Tensor::Make(base.storage(), offset, {len}, {1});
        if (view.ok()) {
          tensors.push_back(*view);
          return w_.AddTensor(*view);
        }
      }
    }
    const DType dtype = kDTypes[c_.Below(static_cast<int>(sizeof(kDTypes) / sizeof(kDTypes[0])))];
    std::vector<int64_t> sizes;
    for (int d = c_.Below(4); d > 0; --d) sizes.push_back(c_.Below(5));  // 0-dim and empty included
    int64_t numel = 1;
    for (int64_t s : sizes) numel *= s;
    std::string bytes(static_cast<size_t>(numel) * ItemSize(dtype), '\0');
    for (auto& b : bytes) b = static_cast<char>(c_.Below(256));
    if (dtype == DType::kBool) {
      for (auto& b : bytes) b = static_cast<char>(b & 1);
    }
    Tensor t = *Tensor::FromBytes(dtype, sizes, bytes);
    tensors.push_back(t);
    return w_.AddTensor(t);
  }

  Choice& c_;
  TorchWriter& w_;
};

// Every tensor of the file read back, in pickle order.
void CollectTensors(const TorchFile& f, const Value& v, std::vector<Tensor>& out) {
  if (TorchFile::IsTensor(v)) {
    out.push_back(*f.GetTensor(v));
    return;
  }
  if (v.is(pickle::Kind::kDict)) {
    for (const auto& [k, val] : v.dict_items()) CollectTensors(f, *val, out);
  } else if (v.is(pickle::Kind::kList) || v.is(pickle::Kind::kTuple)) {
    for (const auto& item : v.items()) CollectTensors(f, *item, out);
  }
}

void CollectInOrder(const Value& v, std::vector<const Value*>& out) {
  if (TorchFile::IsTensor(v)) {
    out.push_back(&v);
    return;
  }
  if (v.is(pickle::Kind::kDict)) {
    for (const auto& [k, val] : v.dict_items()) CollectInOrder(*val, out);
  } else if (v.is(pickle::Kind::kList) || v.is(pickle::Kind::kTuple)) {
    for (const auto& item : v.items()) CollectInOrder(*item, out);
  }
}

RC_GTEST_PROP(RandomTreeProperty, ReadOfWriteKeepsValuesAndTensorBytes, ()) {
  RcChoice choice;
  TorchWriter w;
  TreeMaker<RcChoice> maker(choice, w);
  ValuePtr root = maker.Make(0);
  auto bytes = w.WriteToString("archive", *root);
  RC_ASSERT(bytes.ok());
  auto file = TorchFile::FromBytes(*bytes, "random.pt");
  RC_ASSERT(file.ok());
  // Tensors come back bitwise equal, in the same places.
  std::vector<const Value*> written;
  CollectInOrder(*root, written);
  std::vector<Tensor> read;
  CollectTensors(**file, *(*file)->root(), read);
  RC_ASSERT(read.size() == written.size());
  // Writing what was read gives the same file, and the same dump.
  auto again_writer = std::make_unique<TorchWriter>();
  auto copy = CopyTreeForWrite(file->get(), (*file)->root(), *again_writer);
  RC_ASSERT(copy.ok());
  auto bytes2 = again_writer->WriteToString("archive", **copy);
  RC_ASSERT(bytes2.ok());
  RC_ASSERT(*bytes2 == *bytes);
  auto dump1 = CanonicalDump(**file);
  auto file2 = TorchFile::FromBytes(*bytes2, "random2.pt");
  RC_ASSERT(file2.ok());
  auto dump2 = CanonicalDump(**file2);
  RC_ASSERT(dump1.ok() && dump2.ok());
  RC_ASSERT(*dump1 == *dump2);
}

// The tensors a maker built are what the file holds, bitwise.
TEST(RandomTreeTest, TensorsComeBackBitwise) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SeededChoice choice(seed);
    TorchWriter w;
    TreeMaker<SeededChoice> maker(choice, w);
    ValuePtr root = Value::List({maker.Make(0), maker.Make(0), maker.Make(0)});
    auto bytes = w.WriteToString("archive", *root);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto file = TorchFile::FromBytes(*bytes, "random.pt");
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<Tensor> read;
    CollectTensors(**file, *(*file)->root(), read);
    ASSERT_EQ(read.size(), maker.tensors.size()) << "seed " << seed;
    for (size_t i = 0; i < read.size(); ++i) {
      EXPECT_TRUE(read[i].BitwiseEqual(maker.tensors[i])) << "seed " << seed << " tensor " << i;
      EXPECT_EQ(read[i].storage_offset(), maker.tensors[i].storage_offset());
      EXPECT_EQ(read[i].strides(), maker.tensors[i].strides());
    }
  }
}

// torch.load reads a batch of random files exactly as ucp's reader does.
TEST(RandomTreeTest, TorchLoadAgreesWithUcpOnRandomFiles) {
  const std::string dir = testing::TempPath("random_trees");
  std::filesystem::create_directories(dir);
  std::vector<std::string> files;
  for (uint64_t seed = 100; seed < 160; ++seed) {
    SeededChoice choice(seed);
    TorchWriter w;
    TreeMaker<SeededChoice> maker(choice, w);
    ValuePtr root = Value::List({maker.Make(0), maker.Make(0), maker.Make(0), maker.Make(0)});
    const std::string path = absl::StrCat(dir, "/tree_", seed, ".pt");
    ASSERT_TRUE(w.WriteFile(path, *root).ok());
    files.push_back(path);
  }
  auto python = testing::PythonDumps(files);
  ASSERT_TRUE(python.ok()) << python.status();
  for (const auto& path : files) {
    auto file = TorchFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    auto ours = CanonicalDump(**file);
    ASSERT_TRUE(ours.ok());
    EXPECT_EQ(testing::DiffExcerpt((*python)[path], *ours), "") << path;
  }
}

}  // namespace
}  // namespace ucp::torch
