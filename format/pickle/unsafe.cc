#include "format/pickle/unsafe.h"

#include <string_view>

#include "format/pickle/value.h"

namespace ucp::pickle {
namespace {

// Modules every callable of which is (or reaches) a code-execution or
// system-changing vector; `module` or `module.anything` matches.
constexpr std::string_view kUnsafeModules[] = {
    "os",          "posix",      "nt",        "subprocess", "_posixsubprocess", "_winapi", "runpy",
    "importlib",   "imp",        "marshal",   "_pickle",    "cPickle",          "shutil",  "socket",
    "pty",         "code",       "codeop",    "ctypes",     "_ctypes",          "commands", "webbrowser",
    "multiprocessing", "pdb",    "bdb",       "timeit",     "cProfile",         "profile", "trace",
    "sys",         "signal",     "asyncio",   "threading",  "_thread",          "ssl",     "http",
    "urllib",      "ftplib",     "smtplib",   "telnetlib",  "tempfile",         "glob",    "zipimport",
    "pkgutil",     "site",       "distutils", "setuptools", "pip",
};

// (module, name) pairs in otherwise harmless modules.
struct Pair {
  std::string_view module, name;
};
constexpr Pair kUnsafePairs[] = {
    {"builtins", "eval"},        {"builtins", "exec"},       {"builtins", "execfile"},
    {"builtins", "compile"},     {"builtins", "__import__"}, {"builtins", "getattr"},
    {"builtins", "setattr"},     {"builtins", "delattr"},    {"builtins", "open"},
    {"builtins", "input"},       {"builtins", "breakpoint"}, {"builtins", "globals"},
    {"builtins", "locals"},      {"builtins", "vars"},       {"builtins", "exit"},
    {"builtins", "quit"},        {"builtins", "help"},       {"builtins", "apply"},
    {"builtins", "reload"},      {"builtins", "file"},       {"builtins", "memoryview"},
    {"__builtin__", "eval"},     {"__builtin__", "exec"},    {"__builtin__", "execfile"},
    {"__builtin__", "compile"},  {"__builtin__", "__import__"}, {"__builtin__", "getattr"},
    {"__builtin__", "open"},     {"__builtin__", "apply"},   {"__builtin__", "file"},
    {"pickle", "loads"},         {"pickle", "load"},         {"pickle", "_loads"},
    {"pickle", "_load"},         {"pickle", "Unpickler"},    {"pickle", "_Unpickler"},
    {"dill", "loads"},           {"dill", "load"},           {"cloudpickle", "loads"},
    {"torch", "load"},           {"torch.serialization", "load"}, {"torch.serialization", "_load"},
    {"torch.hub", "load"},       {"torch.hub", "load_state_dict_from_url"}, {"torch.hub", "download_url_to_file"},
    {"torch.jit", "load"},       {"torch._C", "_jit_pass_inline"}, {"torch.utils.cpp_extension", "load"},
    {"torch.utils.cpp_extension", "load_inline"},
    {"numpy", "load"},           {"numpy.lib.npyio", "load"}, {"numpy", "loadtxt"},
    {"numpy.testing._private.utils", "runstring"}, {"numpy.f2py", "compile"},
    {"operator", "attrgetter"},  {"operator", "methodcaller"}, {"_operator", "attrgetter"},
    {"_operator", "methodcaller"},
    {"types", "CodeType"},       {"types", "FunctionType"},  {"types", "LambdaType"},
    {"types", "MethodType"},     {"types", "ModuleType"},
    {"io", "open"},              {"io", "FileIO"},           {"_io", "open"},
    {"_io", "FileIO"},           {"codecs", "open"},
    {"yaml", "load"},            {"yaml", "unsafe_load"},
};

bool MatchesModule(std::string_view module, std::string_view unsafe) {
  return module == unsafe || (module.size() > unsafe.size() && module.substr(0, unsafe.size()) == unsafe &&
                              module[unsafe.size()] == '.');
}

}  // namespace

bool IsUnsafeGlobal(std::string_view module, std::string_view name) {
  for (std::string_view m : kUnsafeModules) {
    if (MatchesModule(module, m)) return true;
  }
  for (const Pair& p : kUnsafePairs) {
    if (module == p.module && name == p.name) return true;
  }
  return false;
}

bool IsUnsafeValue(const Value& v) {
  auto is_getattr = [](std::string_view m, std::string_view n) { return m == "builtins" && n == "getattr"; };
  if (v.is(Kind::kGlobal)) return !is_getattr(v.module(), v.name()) && IsUnsafeGlobal(v.module(), v.name());
  if (!v.is(Kind::kObject)) return false;
  const std::string_view m = v.object_module(), n = v.object_name();
  if (is_getattr(m, n)) {
    const Object& o = v.object();
    const auto& a = o.args ? o.args->items() : std::vector<ValuePtr>();
    const bool member = a.size() == 2 && a[0]->is(Kind::kGlobal) && a[1]->is(Kind::kStr) && !a[1]->str().empty() &&
                        a[1]->str()[0] != '_' && o.kwargs == nullptr;
    return !member;
  }
  return IsUnsafeGlobal(m, n);
}

}  // namespace ucp::pickle
