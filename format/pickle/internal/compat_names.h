// Renames of pickled globals between Python 2 and Python 3 (`__builtin__` <->
// `builtins`, `copy_reg` <-> `copyreg`, ...), mirroring CPython's
// `Lib/_compat_pickle.py` and the `fix_imports` logic of `Modules/_pickle.c`:
// the reader applies Python2ToPython3 to globals of protocol 0-2 streams, the
// writer applies Python3ToPython2 to everything it writes at protocol 2.
//
// Example:
//   std::string module = "__builtin__", name = "set";
//   Python2ToPython3(module, name);  // builtins.set
#ifndef UCP_FORMAT_PICKLE_INTERNAL_COMPAT_NAMES_H_
#define UCP_FORMAT_PICKLE_INTERNAL_COMPAT_NAMES_H_

#include <string>

namespace ucp::pickle::internal_compat {

// Renames in place when (module, name) or module has a Python 3 name.
void Python2ToPython3(std::string& module, std::string& name);
// Renames in place when (module, name) or module has a Python 2 name.
void Python3ToPython2(std::string& module, std::string& name);

}  // namespace ucp::pickle::internal_compat

#endif  // UCP_FORMAT_PICKLE_INTERNAL_COMPAT_NAMES_H_
