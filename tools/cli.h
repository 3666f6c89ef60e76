// Helpers shared by the ucp subcommands (tools/cmd_*.cc): error exit,
// flag parsing, the flags that say how a source checkpoint is read.
#ifndef UCP_TOOLS_CLI_H_
#define UCP_TOOLS_CLI_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/cluster.h"
#include "ops/open.h"
#include "tools/flags.h"

namespace ucp::tools {

// The MPI job this process is a rank of (`mpirun -np N ucp ...`), or null
// when it runs alone; set by main.
Cluster* JobCluster();
void SetJobCluster(Cluster* cluster);
// Whether this process prints the command's results: it runs alone, or it is
// rank 0 of the job (every rank returns the same status).
bool PrintsResults();

// Prints "ucp: MESSAGE [CODE]" on stderr (rank 0 only in an MPI job) and
// returns 1.
int Fail(const absl::Status& s);

// Parses the flags; an exit code when the command is already done (a bad
// flag: 1, --help: 0), else nullopt.
std::optional<int> ParseOrExit(FlagSet& f, int argc, char** argv, std::vector<std::string>* positional);

// --progress=auto|always|never|json (tools/progress.h).
void RegisterProgressFlag(FlagSet& f, std::string* mode);

// --allow_unsafe_pickle (sets torch::SetAllowUnsafePickles when given).
void RegisterUnsafePickleFlag(FlagSet& f, bool* allow);
// --update_latest: repoint a `latest` in the input checkpoint's root.
void RegisterUpdateLatestFlag(FlagSet& f, bool* update);

// Flags shared by convert and reshard for reading a ZeRO checkpoint.
struct ZeroSourceFlags {
  std::string rules, preset, mismatch = "error", default_kind, tied_layers;
  int64_t original_vocab_size = 0;

  void Register(FlagSet& f) {
    f.String("rules", &rules,
             "a MergeRules textproto (rule { pattern: \"REGEX\" kind: ROW }, ...): how the tp slices of matching "
             "params merge; first match wins and these rules take precedence over every other source");
    f.String("preset", &preset,
             "built-in rules: gpt-neox, megatron-deepspeed, bloom, savanna; \"\" detects one from the param names, \"none\" "
             "disables presets (see `ucp rules`)");
    f.String("replicated_mismatch", &mismatch,
             "what to do when the tp copies of a replicated param differ: error, average (keep their mean), first "
             "(keep tp rank 0)");
    f.String("default_kind", &default_kind,
             "merge kind for params nothing else decides (replicated, column, row, ...); empty = stop with a list of "
             "them");
    f.String("tied_layers", &tied_layers,
             "pipeline layers using each tied module, as KEY:L1,L2;... (e.g. embed:0,12). Layers with files are "
             "read from the checkpoint; a tied layer without a file (a TiedLayerSpec with forward_fn, like "
             "Megatron-DeepSpeed's and GPT-NeoX's output head) is otherwise assumed to be the last layer");
    f.Int("original_vocab_size", &original_vocab_size,
          "unpadded vocabulary size, to strip vocab padding from vocabulary-parallel params (0 = from the "
          "checkpoint's universal_checkpoint_info, else the padding is kept)");
  }
  absl::StatusOr<ops::SourceOptions> Options(int threads, int64_t divisible_by) const;
};

}  // namespace ucp::tools

#endif  // UCP_TOOLS_CLI_H_
