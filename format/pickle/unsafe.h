// Pickle globals that are known code-execution vectors: a pickle that calls
// one of them runs code (a shell command, arbitrary Python, a file write) when
// Python's pickle / torch.load (without weights_only) reads it. ucp never
// calls anything, but the checkpoints it writes are torch.load-ed by training
// jobs later, so ucp names such globals (`ucp inspect`: UNSAFE) and its
// writers refuse a checkpoint containing one unless told otherwise.
//
// Ordinary classes (a trainer's config objects, argparse.Namespace, torch and
// numpy rebuild functions, DeepSpeed enums) are not listed: they construct
// data and stay plain data in ucp.
//
// Example:
//   if (IsUnsafeGlobal("posix", "system")) ...   // true
#ifndef UCP_FORMAT_PICKLE_UNSAFE_H_
#define UCP_FORMAT_PICKLE_UNSAFE_H_

#include <string_view>

namespace ucp::pickle {

// True for a global that executes code or touches the system when called:
// os/posix/nt.*, subprocess.*, builtins eval/exec/compile/__import__/getattr/
// open/..., runpy, importlib, pickle/marshal loads, ctypes, socket, shutil, ...
bool IsUnsafeGlobal(std::string_view module, std::string_view name);

class Value;
// One node of a value tree as `ucp inspect` marks it: a global or an object
// built by calling one for which IsUnsafeGlobal holds, except getattr(a
// global class, 'public_name') (how Python pickles enum members, e.g.
// DeepSpeed's ZeroStageEnum) and a bare reference to getattr (the reader
// records getattr as unsafe only when it is called otherwise).
bool IsUnsafeValue(const Value& v);

}  // namespace ucp::pickle

#endif  // UCP_FORMAT_PICKLE_UNSAFE_H_
