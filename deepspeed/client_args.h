// The topology a training script records in its own client state, and checks
// when it loads a checkpoint: 'args' of GPT-NeoX and savanna (a dict:
// model_parallel_size, pipe_parallel_size, padded_vocab_size; their
// check_checkpoint_args asserts every key equals the job's value) and of
// Megatron-DeepSpeed (an argparse.Namespace: tensor_model_parallel_size and
// pipeline_model_parallel_size asserted, padded_vocab_size when the job has a
// vocab file; data_parallel_size and world_size recorded). A checkpoint
// resharded to another topology must say the target's, as the client itself
// would have saved it there: otherwise the client refuses to load it.
//
// Only keys that evidently record the source's topology change:
//   model_parallel_size, tensor_model_parallel_size      -> target tp
//   pipe_parallel_size, pipeline_model_parallel_size     -> target pp (a
//       GPT-NeoX pipe_parallel_size of 0, no PipelineModule, stays 0 at pp 1)
//   data_parallel_size (when it is the source's dp)      -> target dp
//   world_size (when it is the source's tp x pp x dp)    -> target's
//   padded_vocab_size (when it is the source's padded vocabulary rows)
//                                                        -> the target's
// Every other key, and a value that is not an int, is kept.
#ifndef UCP_DEEPSPEED_CLIENT_ARGS_H_
#define UCP_DEEPSPEED_CLIENT_ARGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "format/pickle/value.h"
#include "state/model_state.h"

namespace ucp::deepspeed {

struct ArgsTopology {
  int tp = 0, pp = 0, dp = 0;  // 0: unknown
  int64_t padded_vocab = 0;    // rows of the padded vocabulary tensors; 0: none or unknown
};

struct ArgsChange {
  std::string key;
  int64_t from = 0, to = 0;
};

// The changes `args` (the attribute dict: a dict, or a Namespace's state as
// DeepSpeedFacet::args gives it; may be null) needs for a job at `to`.
std::vector<ArgsChange> ArgsChangesFor(const pickle::Value* args, const ArgsTopology& from, const ArgsTopology& to);

// Applies `changes` to the output's own copy of 'args' (a dict or an
// argparse.Namespace object, as the source holds it).
absl::Status ApplyArgsChanges(pickle::Value& args_copy, const std::vector<ArgsChange>& changes);

// "client state args: model_parallel_size 2 -> 1, ..." ("" when none).
std::string DescribeArgsChanges(const std::vector<ArgsChange>& changes);

// The source's padded vocabulary rows: the rows its tp slices of the
// vocabulary params (rule VOCAB) add up to, when they all agree; else 0.
int64_t SourcePaddedVocab(const state::ModelInfo& info);

// The target's padded vocabulary rows (`padded_rows`: per param, a writer's
// plan), when the vocabulary params all agree; else 0.
int64_t TargetPaddedVocab(const state::ModelInfo& info, const std::vector<int64_t>& padded_rows);

// ArgsChangesFor the 'args' of `state` (ArgsOf), from its source topology to
// `target`; the padded vocabulary rows are compared when the writer plans
// them (`target_padded_rows`: per param, as TargetPaddedVocab takes them;
// null: the vocabulary is not compared).
std::vector<ArgsChange> TargetArgsChanges(const state::ModelState& state, const state::Topology& target,
                                          const std::vector<int64_t>* target_padded_rows);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_CLIENT_ARGS_H_
