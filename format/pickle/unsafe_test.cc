#include "format/pickle/unsafe.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ucp::pickle {
namespace {

TEST(UnsafeTest, KnownCodeExecutionGlobals) {
  for (const auto& [m, n] : std::vector<std::pair<const char*, const char*>>{
           {"os", "system"},           {"posix", "system"},      {"nt", "system"},
           {"subprocess", "Popen"},    {"subprocess", "check_output"}, {"builtins", "eval"},
           {"builtins", "exec"},       {"builtins", "__import__"}, {"builtins", "getattr"},
           {"builtins", "compile"},    {"builtins", "open"},      {"runpy", "run_path"},
           {"importlib", "import_module"}, {"importlib.util", "spec_from_file_location"},
           {"pickle", "loads"},        {"_pickle", "loads"},      {"marshal", "loads"},
           {"torch", "load"},          {"os.path", "join"},       {"ctypes", "CDLL"}}) {
    EXPECT_TRUE(IsUnsafeGlobal(m, n)) << m << "." << n;
  }
}

TEST(UnsafeTest, OrdinaryClassesPass) {
  for (const auto& [m, n] : std::vector<std::pair<const char*, const char*>>{
           {"torch._utils", "_rebuild_tensor_v2"}, {"torch", "FloatStorage"}, {"collections", "OrderedDict"},
           {"argparse", "Namespace"},  {"deepspeed.runtime.zero.config", "ZeroStageEnum"},
           {"my_trainer.config", "TrainConfig"}, {"numpy.core.multiarray", "_reconstruct"},
           {"numpy", "dtype"},         {"builtins", "set"},       {"pathlib", "PosixPath"},
           {"osx_helpers", "thing"},   {"torch", "Size"},         {"builtins", "slice"}}) {
    EXPECT_FALSE(IsUnsafeGlobal(m, n)) << m << "." << n;
  }
}

}  // namespace
}  // namespace ucp::pickle
