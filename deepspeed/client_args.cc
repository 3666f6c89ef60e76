#include "deepspeed/client_args.h"

#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "deepspeed/facet.h"
#include "format/pickle/accessors.h"

namespace ucp::deepspeed {

using pickle::Kind;
using pickle::Value;

namespace {

bool IntOf(const Value* args, const char* key, int64_t* out) {
  const Value* v = args->DictGet(key);
  if (v == nullptr || !v->is(Kind::kInt) || !v->fits_int64()) return false;
  *out = v->int_value();
  return true;
}

}  // namespace

std::vector<ArgsChange> ArgsChangesFor(const Value* args, const ArgsTopology& from, const ArgsTopology& to) {
  std::vector<ArgsChange> out;
  if (args == nullptr || !args->is(Kind::kDict)) return out;
  // `key` becomes `want` when its int value differs and `when` holds for it.
  auto set = [&](const char* key, int64_t want, const std::function<bool(int64_t)>& when) {
    int64_t v = 0;
    if (want > 0 && IntOf(args, key, &v) && v != want && when(v)) out.push_back({key, v, want});
  };
  auto any = [](int64_t) { return true; };
  // The source's value, when it is known.
  auto is = [](int64_t source) { return [source](int64_t v) { return source > 0 && v == source; }; };
  set("model_parallel_size", to.tp, any);
  set("tensor_model_parallel_size", to.tp, any);
  // GPT-NeoX's 0: no PipelineModule, kept at pp 1.
  set("pipe_parallel_size", to.pp, [&](int64_t v) { return !(v == 0 && to.pp == 1); });
  set("pipeline_model_parallel_size", to.pp, any);
  set("data_parallel_size", to.dp, is(from.dp));
  set("world_size", int64_t{to.tp} * to.pp * to.dp, is(int64_t{from.tp} * from.pp * from.dp));
  set("padded_vocab_size", to.padded_vocab, is(from.padded_vocab));
  return out;
}

absl::Status ApplyArgsChanges(Value& args_copy, const std::vector<ArgsChange>& changes) {
  if (changes.empty()) return absl::OkStatus();
  Value* dict = nullptr;
  if (args_copy.is(Kind::kDict)) {
    dict = &args_copy;
  } else if (pickle::AsNamespace(args_copy, "args").ok() && args_copy.object().state != nullptr) {
    dict = args_copy.object().state.get();
  }
  if (dict == nullptr || !dict->is(Kind::kDict)) {
    return absl::InternalError("client state 'args' is neither a dict nor an argparse.Namespace with attributes");
  }
  for (const ArgsChange& c : changes) dict->DictSet(Value::Str(c.key), Value::Int(c.to));
  return absl::OkStatus();
}

std::string DescribeArgsChanges(const std::vector<ArgsChange>& changes) {
  if (changes.empty()) return "";
  std::vector<std::string> parts;
  for (const ArgsChange& c : changes) parts.push_back(absl::StrCat(c.key, " ", c.from, " -> ", c.to));
  return absl::StrCat("the client state 'args' (the training script's record of its topology, which GPT-NeoX and ",
                      "Megatron-DeepSpeed check on load) set to the target's: ", absl::StrJoin(parts, ", "));
}

int64_t SourcePaddedVocab(const state::ModelInfo& info) {
  std::set<int64_t> rows;
  for (const auto& p : info.params) {
    if (p.rule.kind() != VOCAB || p.tp_shapes.empty()) continue;
    int64_t sum = 0;  // rows over the tp slices; a tensor held whole is one slice
    for (const auto& s : p.tp_shapes) {
      sum += s.empty() ? 0 : s[0];
      if (p.tp_whole) break;
    }
    rows.insert(sum);
  }
  return rows.size() == 1 ? *rows.begin() : 0;
}

int64_t TargetPaddedVocab(const state::ModelInfo& info, const std::vector<int64_t>& padded_rows) {
  std::set<int64_t> rows;
  for (size_t i = 0; i < info.params.size() && i < padded_rows.size(); ++i) {
    if (info.params[i].rule.kind() == VOCAB) rows.insert(padded_rows[i]);
  }
  return rows.size() == 1 ? *rows.begin() : 0;
}

std::vector<ArgsChange> TargetArgsChanges(const state::ModelState& state, const state::Topology& target,
                                          const std::vector<int64_t>* target_padded_rows) {
  const state::ModelInfo& info = state.info();
  const state::Topology& from = info.source_topology;
  const bool vocab = target_padded_rows != nullptr;
  return ArgsChangesFor(ArgsOf(state), {from.tp, from.pp, from.dp, vocab ? SourcePaddedVocab(info) : 0},
                        {target.tp, target.pp, target.dp, vocab ? TargetPaddedVocab(info, *target_padded_rows) : 0});
}

}  // namespace ucp::deepspeed
