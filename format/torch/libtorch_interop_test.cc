// Interop with libtorch 1.13's own C++ serialization (the one translation
// unit of the project that includes torch headers): files ucp's TorchWriter
// writes are read by `torch::pickle_load` (libtorch's torch.load) and by
// `caffe2::serialize::PyTorchStreamReader`, and files libtorch writes with
// `torch::pickle_save` are read by ucp's TorchFile, tensors bitwise equal.
// (libtorch cannot read DeepSpeed checkpoints themselves: its unpickler turns
// every collections.OrderedDict into None; that is why ucp has its own.)
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using pickle::Value;

at::Tensor AtFrom(const Tensor& t) {
  const std::string bytes = t.ContiguousBytes();
  at::ScalarType type = at::kFloat;
  switch (t.dtype()) {
    case DType::kFloat32: type = at::kFloat; break;
    case DType::kBFloat16: type = at::kBFloat16; break;
    case DType::kFloat16: type = at::kHalf; break;
    case DType::kInt64: type = at::kLong; break;
    case DType::kUInt8: type = at::kByte; break;
    default: ADD_FAILURE() << "dtype not covered by this test"; break;
  }
  at::Tensor out = at::empty(t.sizes(), at::TensorOptions().dtype(type));
  std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
  return out;
}

Tensor MakeTensor(DType dtype, std::vector<int64_t> sizes, int seed) {
  int64_t n = 1;
  for (int64_t d : sizes) n *= d;
  std::string bytes(static_cast<size_t>(n) * ItemSize(dtype), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 31 + seed * 7) % 251);
  return *Tensor::FromBytes(dtype, sizes, bytes);
}

TEST(LibtorchInteropTest, LibtorchReadsWhatUcpWrites) {
  std::vector<Tensor> tensors = {MakeTensor(DType::kFloat32, {3, 4}, 1), MakeTensor(DType::kBFloat16, {5}, 2),
                                 MakeTensor(DType::kInt64, {2, 2}, 3), MakeTensor(DType::kUInt8, {7}, 4)};
  TorchWriter w;
  // A plain dict and a list (libtorch reads these; it cannot read OrderedDicts).
  auto root = Value::MakeDict();
  root->DictSet(Value::Str("weights"), Value::List({w.AddTensor(tensors[0]), w.AddTensor(tensors[1])}));
  root->DictSet(Value::Str("ids"), w.AddTensor(tensors[2]));
  root->DictSet(Value::Str("bytes"), w.AddTensor(tensors[3]));
  root->DictSet(Value::Str("step"), Value::Int(4));
  auto archive = w.WriteToString("archive", *root);
  ASSERT_TRUE(archive.ok()) << archive.status();

  // libtorch's zip reader sees torch's layout.
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_unique<caffe2::serialize::IStreamAdapter>(new std::istringstream(*archive)));
  EXPECT_TRUE(reader.hasRecord("data.pkl"));
  EXPECT_TRUE(reader.hasRecord("version"));
  EXPECT_EQ(reader.getAllRecords().size(), 2u + tensors.size());

  // torch::pickle_load is libtorch's torch.load.
  const std::vector<char> data(archive->begin(), archive->end());
  c10::IValue loaded = ::torch::pickle_load(data);
  ASSERT_TRUE(loaded.isGenericDict());
  auto dict = loaded.toGenericDict();
  auto weights = dict.at("weights").toList();
  ASSERT_EQ(weights.size(), 2u);
  EXPECT_TRUE(::torch::equal(weights.get(0).toTensor(), AtFrom(tensors[0])));
  EXPECT_TRUE(::torch::equal(weights.get(1).toTensor().view(at::kShort), AtFrom(tensors[1]).view(at::kShort)));
  EXPECT_TRUE(::torch::equal(dict.at("ids").toTensor(), AtFrom(tensors[2])));
  EXPECT_TRUE(::torch::equal(dict.at("bytes").toTensor(), AtFrom(tensors[3])));
  EXPECT_EQ(dict.at("step").toInt(), 4);
}

TEST(LibtorchInteropTest, UcpReadsWhatLibtorchWrites) {
  at::Tensor a = at::arange(24, at::kFloat).reshape({4, 6});
  at::Tensor view = a.slice(1, 2, 5);  // non-contiguous view into a's storage
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("a", a);
  d.insert("view", view);
  d.insert("half", at::ones({3}, at::kHalf));
  d.insert("n", 7);
  const std::vector<char> bytes = ::torch::pickle_save(c10::IValue(d));
  auto file = TorchFile::FromBytes(std::string(bytes.begin(), bytes.end()), "libtorch.pt");
  ASSERT_TRUE(file.ok()) << file.status();
  // libtorch tags typed containers: torch.jit._pickle.restore_type_tag(dict,
  // 'Dict[str, Any]'), which ucp reads as data like any other global.
  const Value& tagged = *(*file)->root();
  ASSERT_TRUE(tagged.IsObjectOf("torch.jit._pickle", "restore_type_tag")) << tagged.DebugString(200);
  const Value& root = *tagged.object().args->items()[0];
  ASSERT_TRUE(root.is(pickle::Kind::kDict)) << root.DebugString(300);
  EXPECT_EQ(tagged.object().args->items()[1]->str(), "Dict[str, Any]");
  auto ta = (*file)->GetTensor(*root.DictGet("a"));
  auto tv = (*file)->GetTensor(*root.DictGet("view"));
  auto th = (*file)->GetTensor(*root.DictGet("half"));
  ASSERT_TRUE(ta.ok() && tv.ok() && th.ok());
  EXPECT_TRUE(ta->BitwiseEqual(*Tensor::FromBytes(DType::kFloat32, {4, 6},
                                                  std::string(static_cast<const char*>(a.data_ptr()), 24 * 4))));
  // The view shares a's storage, with its offset and strides.
  EXPECT_EQ(tv->storage(), ta->storage());
  EXPECT_EQ(tv->storage_offset(), 2);
  EXPECT_EQ(tv->sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(tv->strides(), (std::vector<int64_t>{6, 1}));
  const at::Tensor vc = view.contiguous();
  EXPECT_EQ(tv->ContiguousBytes(), std::string(static_cast<const char*>(vc.data_ptr()), 12 * 4));
  EXPECT_EQ(th->dtype(), DType::kFloat16);
  EXPECT_EQ(root.DictGet("n")->int_value(), 7);
}

}  // namespace
}  // namespace ucp::torch
