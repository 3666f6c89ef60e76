#include "deepspeed/client_args.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  auto set = [&](const char* key, bool when, int64_t want) {
    int64_t v = 0;
    if (want > 0 && IntOf(args, key, &v) && v != want && when) out.push_back({key, v, want});
  };
  int64_t v = 0;
  for (const char* key : {"model_parallel_size", "tensor_model_parallel_size"}) set(key, true, to.tp);
  for (const char* key : {"pipe_parallel_size", "pipeline_model_parallel_size"}) {
    const bool no_pipeline = std::string(key) == "pipe_parallel_size" && IntOf(args, key, &v) && v == 0 && to.pp == 1;
    set(key, !no_pipeline, to.pp);
  }
  set("data_parallel_size", from.dp > 0 && IntOf(args, "data_parallel_size", &v) && v == from.dp, to.dp);
  const int64_t world_from = int64_t{from.tp} * from.pp * from.dp;
  set("world_size", world_from > 0 && IntOf(args, "world_size", &v) && v == world_from,
      int64_t{to.tp} * to.pp * to.dp);
  set("padded_vocab_size",
      from.padded_vocab > 0 && IntOf(args, "padded_vocab_size", &v) && v == from.padded_vocab, to.padded_vocab);
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
    int64_t sum = 0;
    for (const auto& s : p.tp_shapes) sum += s.empty() ? 0 : s[0];
    rows.insert(p.tp_whole || p.tp_shapes.size() == 1 ? (p.tp_shapes[0].empty() ? 0 : p.tp_shapes[0][0]) : sum);
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

}  // namespace ucp::deepspeed
