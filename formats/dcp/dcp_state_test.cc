// DcpState on DCP folders real torch 2.14 saved (testdata/dcp, FSDP2 at
// world 2 and 3, torch's nested and torchtitan's flattened layouts, tied and
// frozen params, two param groups): every tensor and hyper-parameter equal to
// the saving job's full state (`<case>.ref.pt`, torch's own
// get_*_state_dict(full_state_dict=True)); damaged copies are refused naming
// the entry. (ops:dcp_convert_test: the universal checkpoint written from it.)
#include "formats/dcp/dcp_state.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "deepspeed/facet.h"
#include "format/pickle/reader.h"
#include "format/pickle/writer.h"
#include "format/torch/torch_file.h"
#include "formats/format.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"
#include "writers/plan.h"

namespace ucp::dcp {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using tp::TensorPlan;

std::string Case(const std::string& name) { return testing::RunfilePath(absl::StrCat("testdata/dcp/", name)); }

std::unique_ptr<torch::TorchFile> Ref(const std::string& name) {
  auto f = torch::TorchFile::Open(Case(name + ".ref.pt"));
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *std::move(f) : nullptr;
}

bool Equal(const TensorPlan& a, const torch::Tensor& b) {
  absl::StatusOr<bool> same = TensorPlan::BitwiseEqual(a, TensorPlan::FromTensor(b));
  return same.ok() && *same;
}

struct Layout {
  std::string model, optim;
  bool nested;
};

// Every tensor of the reference is what the reader gives for it: model
// tensors, per-element states, per-group scalars; every hyper-parameter in
// the DeepSpeed facet's param groups. `*compared` counts them.
void CompareWithRef(const DcpState& s, const torch::TorchFile& ref, const Layout& l, int* compared_out) {
  int& compared = *compared_out;
  compared = 0;
  const state::ModelInfo& info = s.info();
  for (const auto& [k, v] : ref.root()->dict_items()) {
    const std::string key = k->str();
    SCOPED_TRACE(key);
    if (torch::TorchFile::IsTensor(*v)) {
      absl::StatusOr<torch::Tensor> t = ref.GetTensor(*v);
      ASSERT_TRUE(t.ok());
      const std::string sp = l.optim + "state.";
      if (absl::StartsWith(key, sp)) {
        const std::string rest = key.substr(sp.size());
        const std::string fqn = rest.substr(0, rest.rfind('.')), st = rest.substr(rest.rfind('.') + 1);
        const state::ParamState* p = info.Find(fqn);
        ASSERT_NE(p, nullptr);
        if (t->dim() == 0 && st == "step") {
          absl::StatusOr<state::FileValue> g = s.GroupScalar(p->group, st);
          ASSERT_TRUE(g.ok()) << g.status();
          absl::StatusOr<torch::Tensor> gt = g->file->GetTensor(*g->value);
          ASSERT_TRUE(gt.ok());
          EXPECT_TRUE(gt->BitwiseEqual(*t));
        } else {
          auto slices = s.Slices(*p, 0, st);
          ASSERT_TRUE(slices.ok()) << slices.status();
          ASSERT_EQ(slices->size(), 1u);
          EXPECT_TRUE(Equal((*slices)[0], *t));
        }
        ++compared;
      } else if (absl::StartsWith(key, l.model)) {
        const state::ParamState* p = info.Find(key.substr(l.model.size()));
        if (p == nullptr) continue;  // torchtitan's other states at the top level are not tensors here
        auto lp = s.Slices(*p, 0, state::kLpState);
        ASSERT_TRUE(lp.ok()) << lp.status();
        EXPECT_TRUE(Equal((*lp)[0], *t));
        if (p->trainable()) {
          auto fp32 = s.Slices(*p, 0, state::kFp32State);
          ASSERT_TRUE(fp32.ok());
          EXPECT_TRUE(Equal((*fp32)[0], *t));
        }
        ++compared;
      }
      continue;
    }
    // A hyper-parameter: in the facet's param group of its param(s).
    const std::string gp = l.optim + "param_groups.";
    if (!absl::StartsWith(key, gp) || absl::EndsWith(key, ".params")) continue;
    const std::string rest = key.substr(gp.size());
    const std::string owner = rest.substr(0, rest.rfind('.')), hp = rest.substr(rest.rfind('.') + 1);
    int group = -1;
    if (l.nested) {
      // The group's first member names the facet's group.
      const Value* names = ref.root()->DictGet(absl::StrCat(gp, owner, ".params"));
      ASSERT_NE(names, nullptr);
      for (const ValuePtr& n : names->items()) {
        const state::ParamState* p = info.Find(n->str());
        if (p != nullptr && p->trainable()) group = p->group;
      }
    } else {
      group = info.Find(owner)->group;
    }
    ASSERT_GE(group, 0);
    absl::StatusOr<state::FileValue> common = deepspeed::FacetOf(s)->OptimizerCommon();
    ASSERT_TRUE(common.ok());
    const Value* groups = common->value->DictGet("param_groups");
    ASSERT_NE(groups, nullptr);
    const Value* got = groups->items()[group]->DictGet(hp);
    ASSERT_NE(got, nullptr) << hp;
    EXPECT_EQ(*pickle::Pickle(*got), *pickle::Pickle(*v)) << got->DebugString() << " vs " << v->DebugString();
    ++compared;
  }
}

TEST(DcpStateTest, Fsdp2AtWorld3NestedGroupsUnevenAndEmptyShards) {
  auto s = DcpState::Open(Case("mlp_w3"), {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->info().source_topology.dp, 3);
  EXPECT_EQ((*s)->info().num_groups, 1);
  EXPECT_EQ((*s)->info().state_keys, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ((*s)->info().scalar_keys, (std::vector<std::string>{"step"}));
  // The (2, 5) param: rank 2 saved an empty chunk.
  const DcpEntry* scale = (*s)->metadata().Find("model.scale");
  ASSERT_NE(scale, nullptr);
  ASSERT_EQ(scale->chunks.size(), 3u);
  EXPECT_EQ(scale->chunks[2].sizes[0], 0);
  auto ref = Ref("mlp_w3");
  ASSERT_NE(ref, nullptr);
  // 7 model tensors, 7 x 3 states, 11 hyper-parameters of the group.
  int n = 0;
  CompareWithRef(**s, *ref, {"model.", "optim.", true}, &n);
  EXPECT_EQ(n, 7 + 21 + 11);
}

TEST(DcpStateTest, TorchtitanLayoutFlattenedGroupsNoModelPrefix) {
  auto s = DcpState::Open(Case("titan_w2"), {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->info().num_groups, 1);
  EXPECT_EQ((*s)->info().params.size(), 7u);  // lr_scheduler / train_state entries are no params
  auto ref = Ref("titan_w2");
  ASSERT_NE(ref, nullptr);
  // 7 model tensors, 21 states, 11 hyper-parameters per param.
  int n = 0;
  CompareWithRef(**s, *ref, {"", "optimizer.", false}, &n);
  EXPECT_EQ(n, 7 + 21 + 7 * 11);
}

TEST(DcpStateTest, TiedFrozenAndTwoGroups) {
  auto s = DcpState::Open(Case("tied_w2"), {});
  ASSERT_TRUE(s.ok()) << s.status();
  const state::ModelInfo& info = (*s)->info();
  EXPECT_EQ(info.num_groups, 2);
  ASSERT_NE(info.Find("head.weight"), nullptr);
  EXPECT_EQ(info.Find("head.weight")->role, state::TensorRole::kTied);
  EXPECT_EQ(info.Find("head.weight")->alias_of, "embed.weight");
  EXPECT_EQ(info.Find("frozen.weight")->role, state::TensorRole::kFrozen);
  EXPECT_EQ(info.Find("proj.bias")->group, 1);
  auto ref = Ref("tied_w2");
  ASSERT_NE(ref, nullptr);
  // 6 model tensors, 3 trainable x 3 states, 2 groups x 11 hyper-parameters.
  int n = 0;
  CompareWithRef(**s, *ref, {"model.", "optim.", true}, &n);
  EXPECT_EQ(n, 6 + 9 + 22);
}

// A weights-only DCP (no optimizer state): every model tensor of the
// reference is a trainable param of one group, its weights as saved, its
// fp32 master the weights cast to float32, exp_avg and exp_avg_sq zeros read
// from no file, step 0 (a 0-d float32 tensor), DeepSpeed's default group.
void CheckWeightsOnly(const std::string& name, const std::string& prefix, torch::DType dtype) {
  auto s = DcpState::Open(Case(name), {});
  ASSERT_TRUE(s.ok()) << s.status();
  const state::ModelInfo& info = (*s)->info();
  EXPECT_EQ(info.num_groups, 1);
  EXPECT_EQ(info.lp_dtype, dtype);
  EXPECT_EQ(info.state_keys, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(info.scalar_keys, (std::vector<std::string>{"step"}));
  EXPECT_TRUE(absl::StrContains((*s)->layout(), "weights only")) << (*s)->layout();
  auto ref = Ref(name);
  ASSERT_NE(ref, nullptr);
  int compared = 0;
  for (const auto& [k, v] : ref->root()->dict_items()) {
    SCOPED_TRACE(k->str());
    ASSERT_TRUE(absl::StartsWith(k->str(), prefix));
    const state::ParamState* p = info.Find(k->str().substr(prefix.size()));
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(p->trainable());
    EXPECT_EQ(p->group, 0);
    absl::StatusOr<torch::Tensor> t = ref->GetTensor(*v);
    ASSERT_TRUE(t.ok());
    ASSERT_EQ(t->dtype(), dtype);
    auto lp = (*s)->Slices(*p, 0, state::kLpState);
    ASSERT_TRUE(lp.ok()) << lp.status();
    EXPECT_TRUE(Equal((*lp)[0], *t));
    absl::StatusOr<torch::Tensor> t32 = torch::Cast(*t, torch::DType::kFloat32);
    ASSERT_TRUE(t32.ok());
    auto fp32 = (*s)->Slices(*p, 0, state::kFp32State);
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    EXPECT_EQ((*fp32)[0].dtype(), torch::DType::kFloat32);
    EXPECT_TRUE(Equal((*fp32)[0], *t32));
    for (const std::string st : {"exp_avg", "exp_avg_sq"}) {
      auto z = (*s)->Slices(*p, 0, st);
      ASSERT_TRUE(z.ok()) << z.status();
      EXPECT_TRUE(Equal((*z)[0], torch::Tensor::Zeros(torch::DType::kFloat32, t->sizes()))) << st;
      EXPECT_TRUE((*s)->StateInputs(*p, st).empty()) << st;
    }
    EXPECT_FALSE((*s)->Inputs(*p).empty());
    ++compared;
  }
  EXPECT_EQ(compared, 7);
  EXPECT_EQ(info.params.size(), 7u);
  absl::StatusOr<state::FileValue> step = (*s)->GroupScalar(0, "step");
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_NE(step->value, nullptr);
  absl::StatusOr<torch::Tensor> st = step->file->GetTensor(*step->value);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->BitwiseEqual(torch::Tensor::Zeros(torch::DType::kFloat32, {})));
  absl::StatusOr<state::FileValue> common = deepspeed::FacetOf(**s)->OptimizerCommon();
  ASSERT_TRUE(common.ok());
  const Value* groups = common->value->DictGet("param_groups");
  ASSERT_NE(groups, nullptr);
  ASSERT_EQ(groups->items().size(), 1u);
  EXPECT_NE(groups->items()[0]->DictGet("lr"), nullptr);
  bool noted = false;
  for (const std::string& n : info.notes) noted = noted || absl::StrContains(n, "load_module_only=True");
  EXPECT_TRUE(noted);
}

TEST(DcpStateTest, WeightsOnlyAtTheTopFloat32) { CheckWeightsOnly("weights_w2", "", torch::DType::kFloat32); }

TEST(DcpStateTest, WeightsOnlyUnderModelBfloat16AtWorld3) {
  CheckWeightsOnly("weights_bf16_w3", "model.", torch::DType::kBFloat16);
}

// ---- damaged copies ----

// A copy of a case whose .metadata `edit` changed (on the unpickled tree).
std::string EditedCopy(const std::string& name, const std::function<void(Value& root)>& edit) {
  const std::string dir = JoinPath(testing::FreshTempDir("dcp_edit"), name);
  EXPECT_TRUE(CopyTree(Case(name), dir).ok());
  auto bytes = ReadFileToString(JoinPath(dir, ".metadata"));
  EXPECT_TRUE(bytes.ok());
  auto root = pickle::Unpickle(*bytes);
  EXPECT_TRUE(root.ok());
  edit(**root);
  auto out = pickle::Pickle(**root);
  EXPECT_TRUE(out.ok());
  EXPECT_TRUE(RemoveTree(JoinPath(dir, ".metadata")).ok());
  EXPECT_TRUE(WriteFileAtomic(JoinPath(dir, ".metadata"), *out).ok());
  return dir;
}

// The BUILD state dict of the TensorStorageMetadata of `key`.
Value& EntryState(Value& root, const std::string& key) {
  const Value* sdm = root.object().state->DictGet("state_dict_metadata");
  return *sdm->DictGetPtr(key)->object().state;
}

void ExpectRefused(const std::string& dir, absl::StatusCode code, const std::vector<std::string>& words) {
  auto s = DcpState::Open(dir, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), code) << s.status();
  for (const std::string& w : words) EXPECT_TRUE(absl::StrContains(s.status().message(), w)) << s.status() << " lacks " << w;
}

TEST(DcpStateDamageTest, MissingChunkIsAHole) {
  const std::string dir = EditedCopy("mlp_w3", [](Value& root) {
    Value& st = EntryState(root, "model.fc1.weight");
    ValuePtr chunks = st.DictGetPtr("chunks");
    st.DictSet(Value::Str("chunks"), Value::List({chunks->items()[0], chunks->items()[1]}));
  });
  ExpectRefused(dir, absl::StatusCode::kInvalidArgument, {".metadata", "model.fc1.weight", "a chunk is missing"});
}

TEST(DcpStateDamageTest, OverlappingChunks) {
  const std::string dir = EditedCopy("mlp_w3", [](Value& root) {
    Value& st = EntryState(root, "model.fc1.weight");
    ValuePtr chunks = st.DictGetPtr("chunks");
    // chunk 1 moved onto chunk 0's rows, its own rows added as a third copy of
    // chunk 2 would be; the element count stays right.
    ValuePtr c1 = chunks->items()[1]->object().state;
    c1->DictSet(Value::Str("offsets"), Value::Tuple({Value::Int(5), Value::Int(0)}));
  });
  ExpectRefused(dir, absl::StatusCode::kInvalidArgument, {"model.fc1.weight", "overlap"});
}

TEST(DcpStateDamageTest, DtypeThatTheItemDoesNotHave) {
  const std::string dir = EditedCopy("mlp_w3", [](Value& root) {
    Value& st = EntryState(root, "optim.state.fc2.weight.exp_avg");
    ValuePtr props = st.DictGetPtr("properties");
    std::vector<ValuePtr> items = props->object().state->items();
    items[0] = Value::Global("torch", "bfloat16");
    // TensorProperties' state is a tuple: rebuild the object with the new one.
    pickle::Object o = props->object();
    o.state = Value::Tuple(items);
    st.DictSet(Value::Str("properties"), Value::MakeObject(std::move(o)));
  });
  auto s = DcpState::Open(dir, {});
  ASSERT_TRUE(s.ok()) << s.status();  // the metadata alone is consistent
  const state::ParamState* p = (*s)->info().Find("fc2.weight");
  auto slices = (*s)->Slices(*p, 0, "exp_avg");
  ASSERT_FALSE(slices.ok());
  EXPECT_TRUE(absl::StrContains(slices.status().message(), "optim.state.fc2.weight.exp_avg")) << slices.status();
  EXPECT_TRUE(absl::StrContains(slices.status().message(), "bfloat16")) << slices.status();
}

// A weights-only DCP whose weights are of two dtypes, or not floating point.
void RetypeWeight(const std::string& dtype, const std::vector<std::string>& words) {
  const std::string dir = EditedCopy("weights_w2", [&](Value& root) {
    Value& st = EntryState(root, "fc2.weight");
    ValuePtr props = st.DictGetPtr("properties");
    std::vector<ValuePtr> items = props->object().state->items();
    items[0] = Value::Global("torch", dtype);
    pickle::Object o = props->object();
    o.state = Value::Tuple(items);
    st.DictSet(Value::Str("properties"), Value::MakeObject(std::move(o)));
  });
  ExpectRefused(dir, absl::StatusCode::kUnimplemented, words);
}

TEST(DcpStateDamageTest, WeightsOnlyOfTwoDtypes) {
  RetypeWeight("bfloat16", {"weights of two dtypes", "fc2.weight", "bfloat16", "float32"});
}

TEST(DcpStateDamageTest, WeightsOnlyNotFloatingPoint) {
  RetypeWeight("int64", {"'fc2.weight' is int64", "floating point"});
}

TEST(DcpStateDamageTest, StorageOutsideTheFolderOrTheFile) {
  const std::string up = EditedCopy("mlp_w3", [](Value& root) {
    const Value* storage = root.object().state->DictGet("storage_data");
    ValuePtr info = storage->dict_items()[0].second->object().state;
    info->DictSet(Value::Str("relative_path"), Value::Str("../__0_0.distcp"));
  });
  ExpectRefused(up, absl::StatusCode::kInvalidArgument, {"leaves the folder"});
  const std::string past = EditedCopy("mlp_w3", [](Value& root) {
    const Value* storage = root.object().state->DictGet("storage_data");
    for (const auto& [k, v] : storage->dict_items()) {
      if (k->object().state->DictGet("fqn")->str() == "model.fc2.weight") {
        v->object().state->DictSet(Value::Str("offset"), Value::Int(int64_t{1} << 40));
      }
    }
  });
  auto s = DcpState::Open(past, {});
  ASSERT_TRUE(s.ok()) << s.status();
  auto slices = (*s)->Slices(*(*s)->info().Find("fc2.weight"), 0, state::kLpState);
  ASSERT_FALSE(slices.ok());
  EXPECT_EQ(slices.status().code(), absl::StatusCode::kOutOfRange) << slices.status();
  EXPECT_TRUE(absl::StrContains(slices.status().message(), "model.fc2.weight")) << slices.status();
}

TEST(DcpStateDamageTest, CorruptItemBytesFailTheirCrc) {
  const std::string dir = JoinPath(testing::FreshTempDir("dcp_crc"), "mlp_w3");
  ASSERT_TRUE(CopyTree(Case("mlp_w3"), dir).ok());
  auto s0 = DcpState::Open(dir, {});
  ASSERT_TRUE(s0.ok());
  const DcpChunk& c = (*s0)->metadata().Find("optim.state.fc1.weight.exp_avg_sq")->chunks[0];
  auto bytes = ReadFileToString(JoinPath(dir, c.storage.file));
  ASSERT_TRUE(bytes.ok());
  std::string b = *bytes;
  auto item = torch::TorchFile::FromBytes(b.substr(c.storage.offset, c.storage.length), "item");
  ASSERT_TRUE(item.ok());
  auto t = (*item)->GetTensor(*(*item)->root());
  ASSERT_TRUE(t.ok());
  // Find the tensor's bytes in the file and flip the first of them.
  const std::string data(reinterpret_cast<const char*>(t->data()), t->nbytes());
  const size_t pos = b.find(data, c.storage.offset);
  ASSERT_NE(pos, std::string::npos);
  b[pos] ^= 0x40;
  ASSERT_TRUE(RemoveTree(JoinPath(dir, c.storage.file)).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir, c.storage.file), b).ok());
  auto s = DcpState::Open(dir, {});
  ASSERT_TRUE(s.ok()) << s.status();
  auto slices = (*s)->Slices(*(*s)->info().Find("fc1.weight"), 0, "exp_avg_sq");
  ASSERT_FALSE(slices.ok());
  EXPECT_EQ(slices.status().code(), absl::StatusCode::kDataLoss) << slices.status();
  EXPECT_TRUE(absl::StrContains(slices.status().message(), "optim.state.fc1.weight.exp_avg_sq")) << slices.status();
}

TEST(DcpStateDamageTest, StatesOfAParamInNoGroup) {
  // Without the group's `params` list, no group names the params.
  const std::string dir = EditedCopy("mlp_w3", [](Value& root) {
    const Value* sdm = root.object().state->DictGet("state_dict_metadata");
    ValuePtr kept = Value::MakeDict();
    for (const auto& [k, v] : sdm->dict_items()) {
      if (k->str() != "optim.param_groups.0.params") kept->DictSet(k, v);
    }
    root.object().state->DictSet(Value::Str("state_dict_metadata"), kept);
  });
  ExpectRefused(dir, absl::StatusCode::kInvalidArgument, {"has optimizer state but is in no param group"});
}

TEST(DcpStateDamageTest, UnsafeGlobalInTheMetadata) {
  const std::string dir = EditedCopy("mlp_w3", [](Value& root) {
    ValuePtr st = root.object().state;
    pickle::Object o;
    o.callable = Value::Global("os", "system");
    o.args = Value::Tuple({Value::Str("true")});
    st->DictSet(Value::Str("planner_data"), Value::MakeObject(std::move(o)));
  });
  ExpectRefused(dir, absl::StatusCode::kFailedPrecondition, {"UNSAFE", "os.system"});
}

}  // namespace
// A tensor of 6000 rows in 6000 one-row chunks: a tiling. Then the chunk
// of row 2999 moved onto row 0 (an overlap far past the first thousands of chunks, its
// hole keeping the element count right) is refused, as is a chunk outside.
TEST(DcpTilingTest, ManyChunksEveryPairChecked) {
  DcpEntry e;
  e.key = "w";
  e.tensor = true;
  e.size = {6000, 3};
  for (int64_t r = 0; r < 6000; ++r) e.chunks.push_back({{r, 0}, {1, 3}, {}});
  std::reverse(e.chunks.begin(), e.chunks.end());  // any order
  EXPECT_TRUE(CheckTiling(e, "x/.metadata").ok()) << CheckTiling(e, "x/.metadata");
  DcpEntry overlap = e;
  overlap.chunks[3000].offsets = {0, 0};  // row 2999's chunk onto row 0
  absl::Status s = CheckTiling(overlap, "x/.metadata");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "chunks at (0, 0) and (0, 0) overlap")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "x/.metadata")) << s;
  // Columns split too: two column halves of one row overlap only when their
  // column ranges do.
  DcpEntry cols;
  cols.key = "c";
  cols.tensor = true;
  cols.size = {5000, 4};
  for (int64_t r = 0; r < 5000; ++r) {
    cols.chunks.push_back({{r, 0}, {1, 2}, {}});
    cols.chunks.push_back({{r, 2}, {1, 2}, {}});
  }
  EXPECT_TRUE(CheckTiling(cols, "y").ok()) << CheckTiling(cols, "y");
  cols.chunks[9999].offsets = {4999, 1};  // overlaps (4999, 0) by a column; column 3 left empty
  cols.chunks[9998].sizes = {1, 1};       // ... and (4999, 0) narrowed: the count short by one, not the cause
  s = CheckTiling(cols, "y");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "missing") || absl::StrContains(s.message(), "overlap")) << s;
  cols.chunks[9998].sizes = {1, 2};
  s = CheckTiling(cols, "y");
  EXPECT_TRUE(absl::StrContains(s.message(), "overlap")) << s;
  // Chunks of no elements overlap nothing.
  DcpEntry empty = e;
  empty.chunks.push_back({{3, 0}, {0, 3}, {}});
  EXPECT_TRUE(CheckTiling(empty, "z").ok()) << CheckTiling(empty, "z");
}

}  // namespace ucp::dcp
