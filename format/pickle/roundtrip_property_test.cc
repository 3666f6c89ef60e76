// Random value trees (every kind, shared subtrees, big ints, OrderedDicts with
// non-str keys and state, objects of every how): Unpickle(Pickle(v)) must be
// DeepEqual to v and re-pickle to the same bytes (RapidCheck), and Python must
// load a batch of them as the same trees (canonical repr, test_util.h).
#include <cstring>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "format/pickle/reader.h"
#include "format/pickle/test_util.h"
#include "format/pickle/writer.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"

namespace ucp::pickle {
namespace {

// Choices drawn from RapidCheck (shrinkable) inside a property.
struct RapidCheckChoice {
  int Below(int n) { return *rc::gen::inRange(0, n); }
  uint64_t Bits() { return *rc::gen::arbitrary<uint64_t>(); }
};

// Choices from a seeded generator, for batches outside RapidCheck.
struct SeededChoice {
  explicit SeededChoice(uint64_t seed) : engine(seed) {}
  int Below(int n) { return std::uniform_int_distribution<int>(0, n - 1)(engine); }
  uint64_t Bits() { return engine(); }
  std::mt19937_64 engine;
};

// Builds random trees. Values already built may be reused (shared
// subtrees); they are complete by then, so the result is never cyclic.
template <typename Choice>
class RandomTreeBuilder {
 public:
  explicit RandomTreeBuilder(Choice& choice) : choice_(choice) {}

  // A tree whose root is a container: a list of a few random values.
  ValuePtr Tree(int depth) {
    std::vector<ValuePtr> items;
    for (int i = 2 + Below(6); i > 0; --i) items.push_back(Any(depth - 1));
    return Value::List(std::move(items));
  }

  ValuePtr Any(int depth) {
    if (!shared_.empty() && Below(10) == 0) return shared_[Below(static_cast<int>(shared_.size()))];
    // Below the leaves, containers two times out of three.
    const int kind = depth <= 0 ? Below(8) : Below(3) == 0 ? Below(8) : 8 + Below(7);
    ValuePtr v;
    switch (kind) {
      case 0: return Value::None();
      case 1: return Value::Bool(Below(2) == 1);
      case 2: return Int();
      case 3: return Float();
      case 4: v = Value::Str(Text()); break;
      case 5: v = Value::Bytes(RawBytes()); break;
      case 6: v = Value::ByteArray(RawBytes()); break;
      case 7: v = GlobalValue(); break;
      case 8: v = Value::Tuple(Items(depth)); break;
      case 9: v = Value::List(Items(depth)); break;
      case 10: v = Dict(depth); break;
      case 11: v = Set(depth); break;
      case 12:
      case 13: v = ObjectValue(depth); break;
      default: v = Value::PersistentId(Any(depth - 1)); break;
    }
    shared_.push_back(v);
    return v;
  }

 private:
  int Below(int n) { return choice_.Below(n); }

  ValuePtr Int() {
    switch (Below(4)) {
      case 0: return Value::Int(Below(300) - 50);
      case 1: return Value::Int(static_cast<int64_t>(choice_.Bits()));
      case 2: return Value::Int(static_cast<int32_t>(choice_.Bits()));
      default: {
        std::string bytes;
        const int n = 9 + Below(40);
        for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>(Below(256)));
        return Value::BigInt(bytes);
      }
    }
  }

  ValuePtr Float() {
    static const double kSpecial[] = {0.0, -0.0, 1.5, 1e308, -5e-324, INFINITY, -INFINITY, NAN};
    if (Below(3) == 0) return Value::Float(kSpecial[Below(8)]);
    const uint64_t bits = choice_.Bits();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return Value::Float(d);
  }

  // UTF-8 with ASCII, latin-1, BMP, astral characters and lone surrogates.
  std::string Text() {
    std::string s;
    const int n = Below(4) == 0 ? Below(300) : Below(6);
    for (int i = 0; i < n; ++i) {
      uint32_t c;
      switch (Below(6)) {
        case 0: c = 0x80 + Below(0x80); break;
        case 1: c = 0x100 + Below(0xd700); break;
        case 2: c = 0x10000 + Below(0x100000); break;
        case 3: c = 0xd800 + Below(0x800); break;  // Python's 'surrogatepass'
        default: c = Below(0x80); break;
      }
      AppendUtf8(c, s);
    }
    return s;
  }

  static void AppendUtf8(uint32_t c, std::string& out) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }

  std::string RawBytes() {
    std::string b;
    const int n = Below(5) == 0 ? 0 : Below(20);
    for (int i = 0; i < n; ++i) b.push_back(static_cast<char>(Below(256)));
    return b;
  }

  ValuePtr GlobalValue() {
    static const char* const kGlobals[][2] = {{"ucptest", "C0"},   {"ucptest", "C1"},     {"ucptest.sub", "Fn"},
                                              {"builtins", "getattr"}, {"collections", "OrderedDict"}, {"torch", "Size"}};
    const auto& g = kGlobals[Below(6)];
    return Value::Global(g[0], g[1]);
  }

  std::vector<ValuePtr> Items(int depth) {
    std::vector<ValuePtr> items;
    if (Below(40) == 0) {  // crosses CPython's batches of 1000
      const int n = 990 + Below(30);
      for (int i = 0; i < n; ++i) items.push_back(Value::Int(i));
      return items;
    }
    const int n = Below(6);
    for (int i = 0; i < n; ++i) items.push_back(Any(depth - 1));
    return items;
  }

  // A dict key or set item.
  ValuePtr Hashable(int depth) {
    if (!hashable_.empty() && Below(8) == 0) return hashable_[Below(static_cast<int>(hashable_.size()))];
    ValuePtr v;
    switch (depth <= 0 ? Below(6) : Below(9)) {
      case 0: return Value::None();
      case 1: return Value::Bool(Below(2) == 1);
      case 2: return Int();
      case 3: v = Value::Str(Text()); break;
      case 4: v = Value::Bytes(RawBytes()); break;
      case 5: v = GlobalValue(); break;
      case 6: {
        std::vector<ValuePtr> items;
        for (int i = Below(3); i > 0; --i) items.push_back(Hashable(depth - 1));
        v = Value::Tuple(std::move(items));
        break;
      }
      case 7: {
        v = Value::MakeSet(/*frozen=*/true);
        for (int i = Below(3); i > 0; --i) v->SetAdd(Hashable(depth - 1));
        break;
      }
      default: v = ObjectValue(depth - 1); break;  // hashed by identity
    }
    hashable_.push_back(v);
    return v;
  }

  ValuePtr StrKeyDict(int depth) {
    ValuePtr d = Value::MakeDict();
    for (int i = Below(3); i > 0; --i) d->DictSet(Value::Str(Text()), Any(depth - 1));
    return d;
  }

  ValuePtr Dict(int depth) {
    const bool ordered = Below(2) == 1;
    ValuePtr d = Value::MakeDict(ordered);
    if (Below(40) == 0) {
      for (int i = 0; i < 1000 + Below(3); ++i) d->DictSet(Value::Int(i), Value::None());
    } else {
      for (int i = Below(5); i > 0; --i) d->DictSet(Hashable(depth - 1), Any(depth - 1));
    }
    if (ordered && Below(4) == 0) d->set_dict_state(StrKeyDict(depth));
    return d;
  }

  ValuePtr Set(int depth) {
    ValuePtr s = Value::MakeSet(/*frozen=*/Below(2) == 1);
    for (int i = Below(5); i > 0; --i) s->SetAdd(Hashable(depth - 1));
    return s;
  }

  ValuePtr ObjectValue(int depth) {
    Object o;
    o.callable = Value::Global("ucptest", Below(2) ? "C0" : "C1");
    static const ObjectHow kHows[] = {ObjectHow::kReduce, ObjectHow::kNewObj, ObjectHow::kNewObjEx};
    o.how = kHows[Below(3)];
    o.args = Value::Tuple(depth > 0 ? Items(depth) : std::vector<ValuePtr>{});
    if (o.how == ObjectHow::kNewObjEx) o.kwargs = StrKeyDict(depth);  // kwargs are str-keyed
    if (depth > 0 && Below(2) == 0) o.state = Any(depth - 1);
    if (depth > 0 && Below(4) == 0) o.list_items = Items(depth);
    if (depth > 0 && Below(4) == 0) {
      for (int i = Below(3); i > 0; --i) o.dict_items.emplace_back(Hashable(depth - 1), Any(depth - 1));
    }
    return Value::MakeObject(std::move(o));
  }

  Choice& choice_;
  std::vector<ValuePtr> shared_;
  std::vector<ValuePtr> hashable_;
};

RC_GTEST_PROP(PickleRoundTripProperty, UnpickleOfPickleIsDeepEqualAndRepicklesIdentically, ()) {
  RapidCheckChoice choice;
  RandomTreeBuilder<RapidCheckChoice> builder(choice);
  const ValuePtr tree = builder.Tree(4);
  const absl::StatusOr<std::string> bytes = Pickle(*tree);
  RC_ASSERT(bytes.ok());
  RC_TAG(bytes->size() < 100 ? "pickle < 100 B" : bytes->size() < 1000 ? "pickle < 1 kB" : "pickle >= 1 kB");
  const absl::StatusOr<ValuePtr> back = Unpickle(*bytes);
  RC_ASSERT(back.ok());
  if (!DeepEqual(**back, *tree)) {
    RC_FAIL(absl::StrCat("read back:\n", testing::CanonicalRepr(**back), "\nwritten:\n", testing::CanonicalRepr(*tree)));
  }
  const absl::StatusOr<std::string> again = Pickle(**back);
  RC_ASSERT(again.ok());
  RC_ASSERT(*again == *bytes);
}

// RapidCheck favours small trees; these seeded ones are larger (about 1.6 kB
// of pickle on average, up to ~10 kB).
TEST(PickleRoundTripSeededTest, LargerTreesRoundTrip) {
  for (int i = 0; i < 2000; ++i) {
    SeededChoice choice(0xc0ffee00 + i);
    RandomTreeBuilder<SeededChoice> builder(choice);
    const ValuePtr tree = builder.Tree(5);
    absl::StatusOr<std::string> bytes = Pickle(*tree);
    ASSERT_TRUE(bytes.ok()) << i << ": " << bytes.status();
    absl::StatusOr<ValuePtr> back = Unpickle(*bytes);
    ASSERT_TRUE(back.ok()) << i << ": " << back.status();
    ASSERT_TRUE(DeepEqual(**back, *tree)) << i << "\n" << testing::CanonicalRepr(**back) << "\n"
                                          << testing::CanonicalRepr(*tree);
    ASSERT_EQ(Pickle(**back).value(), *bytes) << i;
  }
}

TEST(PickleRoundTripPythonTest, PythonLoadsRandomTreesAsWritten) {
  const std::string dir = testing::MakeTempDir("pickle_random");
  std::map<std::string, std::string> expected;
  for (int i = 0; i < 300; ++i) {
    SeededChoice choice(0x5eed0000 + i);
    RandomTreeBuilder<SeededChoice> builder(choice);
    const ValuePtr tree = builder.Tree(4);
    absl::StatusOr<std::string> bytes = Pickle(*tree);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    char name[32];
    std::snprintf(name, sizeof name, "tree%03d.pkl", i);
    ASSERT_TRUE(WriteFileAtomic(dir + "/" + name, *bytes).ok());
    expected[name] = testing::CanonicalRepr(*tree);
  }
  absl::StatusOr<std::string> python = testing::RunPython({testing::InteropScript(), "canon", dir});
  ASSERT_TRUE(python.ok()) << python.status();
  const std::map<std::string, std::string> loaded = testing::ParseTabbedLines(*python);
  ASSERT_EQ(loaded.size(), expected.size());
  for (const auto& [name, canonical] : expected) {
    EXPECT_EQ(loaded.at(name), canonical) << name;
  }
}

}  // namespace
}  // namespace ucp::pickle
