// How the DeepSpeed readers (formats/deepspeed_*) open a checkpoint's files:
// passed from the command's options (formats::SourceOptions) to every file a
// reader opens, instead of a process-wide switch.
//
// Example:
//   ReadOptions r;
//   r.allow_unsafe_pickles = options.allow_unsafe_pickles;
//   UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path, r.Files()));
#ifndef UCP_DEEPSPEED_READ_OPTIONS_H_
#define UCP_DEEPSPEED_READ_OPTIONS_H_

#include "format/torch/torch_file.h"

namespace ucp::deepspeed {

struct ReadOptions {
  // Read files whose pickles name code-execution globals (format/pickle/
  // unsafe.h); they are refused by default. ucp never executes them.
  bool allow_unsafe_pickles = false;

  // The options of one file: every CRC checked at open, or (`verify_crc`
  // false) only data.pkl's and version's, the storages later.
  torch::OpenOptions Files(bool verify_crc = true) const {
    torch::OpenOptions o;
    o.verify_crc = verify_crc;
    o.refuse_unsafe_globals = !allow_unsafe_pickles;
    return o;
  }
  // A file whose tensors are most of a checkpoint's bytes read before any
  // unit (the model states: the module's weights, or with ZeRO-0 the
  // optimizer too): every CRC checked, at open, or beside the units when the
  // command owes them (torch::OwedCrcChecks, OpenOptions::defer_crc).
  torch::OpenOptions ModelStates() const {
    torch::OpenOptions o = Files();
    o.defer_crc = true;
    return o;
  }
};

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_READ_OPTIONS_H_
