#include "tools/cli.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "format/torch/torch_file.h"
#include "tp/merge.h"

namespace ucp::tools {
namespace {

absl::Status ParseMismatch(const std::string& s, rules::ReplicatedMismatch* out) {
  if (s == "error") *out = rules::ReplicatedMismatch::kError;
  else if (s == "average") *out = rules::ReplicatedMismatch::kAverage;
  else if (s == "first") *out = rules::ReplicatedMismatch::kFirst;
  else return absl::InvalidArgumentError(absl::StrCat("--replicated_mismatch=", s, ": expected error, average or first"));
  return absl::OkStatus();
}

}  // namespace

void RegisterProgressFlag(FlagSet& f, std::string* mode) {
  f.String("progress", mode,
           "auto (a live line on a terminal, else one line per phase), always, never, or json (JSON lines for CI "
           "logs)");
}

void RegisterUnsafePickleFlag(FlagSet& f, bool* allow) {
  f.Bool("allow_unsafe_pickle", allow,
         "read and copy a checkpoint whose pickles name code-execution globals (os.system, builtins.eval, ...; "
         "`ucp inspect` marks them UNSAFE). ucp never runs them, but torch.load of the output would");
}

void RegisterUpdateLatestFlag(FlagSet& f, bool* update) {
  f.Bool("update_latest", update,
         "when the output is written beside the input (same root folder), repoint that root's existing latest file "
         "to the output; by default it is left alone, so the root still loads the input checkpoint");
}

namespace {
Cluster* job_cluster = nullptr;
}  // namespace

Cluster* JobCluster() { return job_cluster; }
void SetJobCluster(Cluster* cluster) { job_cluster = cluster; }
bool PrintsResults() { return job_cluster == nullptr || job_cluster->rank() == 0; }

int Fail(const absl::Status& s) {
  if (!PrintsResults()) return 1;
  std::cerr << "ucp: " << s.message() << " [" << absl::StatusCodeToString(s.code()) << "]\n";
  return 1;
}

// Parses the flags; an exit code when the command is already done (a bad
// flag: 1, --help: 0), else nullopt.
std::optional<int> ParseOrExit(FlagSet& f, int argc, char** argv, std::vector<std::string>* positional) {
  auto pos = f.Parse(argc, argv);
  if (!pos.ok()) return Fail(pos.status());
  if (f.help_requested()) {
    std::cout << f.Usage();
    return 0;
  }
  *positional = *std::move(pos);
  return std::nullopt;
}

absl::StatusOr<ops::SourceOptions> ZeroSourceFlags::Options(int threads, int64_t divisible_by) const {

  ops::SourceOptions o;
  o.rules.rules_file = rules;
  o.rules.preset = preset;
  o.rules.original_vocab_size = original_vocab_size;
  if (!default_kind.empty()) {
    auto k = tp::ParseMergeKind(default_kind);
    if (!k.ok()) return k.status();
    o.rules.default_kind = *k;
  }
  absl::Status s = ParseMismatch(mismatch, &o.replicated_mismatch);
  if (!s.ok()) return s;
  for (absl::string_view item : absl::StrSplit(tied_layers, ';', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, ':');
    std::vector<int> layers;
    for (absl::string_view l : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
      int v = 0;
      if (!absl::SimpleAtoi(l, &v)) {
        return absl::InvalidArgumentError(absl::StrCat("--tied_layers: expected KEY:L1,L2, got '", item, "'"));
      }
      layers.push_back(v);
    }
    if (kv.first.empty() || layers.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--tied_layers: expected KEY:L1,L2, got '", item, "'"));
    }
    o.tied_layers[kv.first] = layers;
  }
  o.num_threads = threads;
  o.make_vocab_size_divisible_by = divisible_by;
  return o;
}

}  // namespace ucp::tools
