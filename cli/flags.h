// A small command-line flag parser for ucp's subcommands: each subcommand
// declares its flags with a help line, so `ucp <cmd> --help` explains every
// flag, and unknown flags are errors. Accepts `--name=value`, `--name value`,
// and `--name` / `--noname` / `--no_name` for booleans, as both absl-style
// tools and ds_to_universal.py's argparse users write them.
//
// Example:
//   FlagSet flags("convert", "DeepSpeed ZeRO checkpoint -> universal checkpoint");
//   std::string input;
//   flags.String("input_folder", &input, "the ZeRO checkpoint folder", /*required=*/true);
//   UCP_ASSIGN_OR_RETURN(std::vector<std::string> positional, flags.Parse(argc, argv));
#ifndef UCP_CLI_FLAGS_H_
#define UCP_CLI_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ucp::cli {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  void String(const std::string& name, std::string* value, const std::string& help, bool required = false);
  void Int(const std::string& name, int64_t* value, const std::string& help);
  void Int32(const std::string& name, int* value, const std::string& help);
  void Uint64(const std::string& name, uint64_t* value, const std::string& help);
  void Bool(const std::string& name, bool* value, const std::string& help);
  // A boolean that sets `*value = false` when given (argparse's store_false,
  // e.g. ds_to_universal.py's --no_strict); `--name=false` leaves it true.
  void NegatedBool(const std::string& name, bool* value, const std::string& help);
  // Accepted and ignored, with a note in --help (compatibility flags).
  void Ignored(const std::string& name, bool takes_value, const std::string& help);

  // Parses argv[1..] (argv[0] is the subcommand). Returns the positional
  // arguments; kInvalidArgument for unknown flags, bad values or missing
  // required flags. `help_requested()` tells whether --help was given.
  absl::StatusOr<std::vector<std::string>> Parse(int argc, char** argv);
  bool help_requested() const { return help_; }
  std::string Usage() const;
  // The flags' names, in the order they were declared.
  std::vector<std::string> Names() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string type;  // string, int, bool, negated, ignored
    bool required = false;
    bool takes_value = true;
    bool seen = false;
    std::string default_text;
    std::function<absl::Status(const std::string&)> set;
  };
  Flag* Find(const std::string& name);
  template <typename T>
  void Integer(const std::string& name, T* value, const std::string& help);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

}  // namespace ucp::cli

#endif  // UCP_CLI_FLAGS_H_
