#include "cli/flags.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace ucp::cli {

void FlagSet::String(const std::string& name, std::string* value, const std::string& help, bool required) {
  Flag f;
  f.name = name;
  f.help = help;
  f.type = "string";
  f.required = required;
  f.default_text = value->empty() ? "" : absl::StrCat("\"", *value, "\"");
  f.set = [value](const std::string& v) {
    *value = v;
    return absl::OkStatus();
  };
  flags_.push_back(std::move(f));
}

template <typename T>
void FlagSet::Integer(const std::string& name, T* value, const std::string& help) {
  Flag f;
  f.name = name;
  f.help = help;
  f.type = "int";
  f.default_text = absl::StrCat(*value);
  f.set = [value, name](const std::string& v) {
    if (!absl::SimpleAtoi(v, value)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected an integer, got '", v, "'"));
    }
    return absl::OkStatus();
  };
  flags_.push_back(std::move(f));
}

void FlagSet::Int(const std::string& name, int64_t* value, const std::string& help) { Integer(name, value, help); }
void FlagSet::Int32(const std::string& name, int* value, const std::string& help) { Integer(name, value, help); }
void FlagSet::Uint64(const std::string& name, uint64_t* value, const std::string& help) {
  Integer(name, value, help);
}

void FlagSet::Bool(const std::string& name, bool* value, const std::string& help) {
  Flag f;
  f.name = name;
  f.help = help;
  f.type = "bool";
  f.takes_value = false;
  f.default_text = *value ? "true" : "false";
  f.set = [value, name](const std::string& v) {
    const std::string l = absl::AsciiStrToLower(v);
    if (l == "" || l == "true" || l == "1" || l == "yes") {
      *value = true;
    } else if (l == "false" || l == "0" || l == "no") {
      *value = false;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected true or false, got '", v, "'"));
    }
    return absl::OkStatus();
  };
  flags_.push_back(std::move(f));
}

void FlagSet::NegatedBool(const std::string& name, bool* value, const std::string& help) {
  Flag f;
  f.name = name;
  f.help = help;
  f.type = "bool";
  f.takes_value = false;
  f.set = [value, name](const std::string& v) {
    const std::string l = absl::AsciiStrToLower(v);
    if (l == "" || l == "true" || l == "1" || l == "yes") {
      *value = false;
    } else if (l == "false" || l == "0" || l == "no") {
      *value = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected true or false, got '", v, "'"));
    }
    return absl::OkStatus();
  };
  flags_.push_back(std::move(f));
}

void FlagSet::Ignored(const std::string& name, bool takes_value, const std::string& help) {
  Flag f;
  f.name = name;
  f.help = help;
  f.type = takes_value ? "any" : "bool";
  f.takes_value = takes_value;
  f.set = [](const std::string&) { return absl::OkStatus(); };
  flags_.push_back(std::move(f));
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (auto& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(int argc, char** argv) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      for (int j = i + 1; j < argc; ++j) positional.push_back(argv[j]);
      break;
    }
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      positional.push_back(arg);
      continue;
    }
    std::string body = arg.substr(arg.rfind('-', 1) == 1 ? 2 : 1);
    if (body == "help" || body == "h") {
      help_ = true;
      continue;
    }
    std::string name = body, value;
    bool has_value = false;
    if (const size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    Flag* f = Find(name);
    if (f == nullptr && !has_value) {
      // --noflag / --no_flag for booleans.
      std::string base;
      if (absl::StartsWith(name, "no_")) base = name.substr(3);
      else if (absl::StartsWith(name, "no")) base = name.substr(2);
      Flag* b = base.empty() ? nullptr : Find(base);
      if (b != nullptr && b->type == "bool") {
        absl::Status s = b->set("false");
        if (!s.ok()) return s;
        b->seen = true;
        continue;
      }
    }
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("ucp ", command_, ": unknown flag --", name, " (see ucp ",
                                                     command_, " --help)"));
    }
    if (!has_value && f->takes_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    absl::Status s = f->set(value);
    if (!s.ok()) return s;
    f->seen = true;
  }
  if (!help_) {
    for (const auto& f : flags_) {
      if (f.required && !f.seen) {
        return absl::InvalidArgumentError(absl::StrCat("ucp ", command_, ": --", f.name, " is required (see ucp ",
                                                       command_, " --help)"));
      }
    }
  }
  return positional;
}

std::vector<std::string> FlagSet::Names() const {
  std::vector<std::string> names;
  for (const auto& f : flags_) names.push_back(f.name);
  return names;
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("ucp ", command_, ": ", summary_, "\n\nFlags:\n");
  for (const auto& f : flags_) {
    std::string head = absl::StrCat("  --", f.name);
    if (f.takes_value) absl::StrAppend(&head, "=", f.type == "int" ? "N" : "VALUE");
    absl::StrAppend(&out, head, "\n");
    std::string help = f.help;
    if (f.required) absl::StrAppend(&help, " (required)");
    if (!f.default_text.empty() && f.type != "bool") absl::StrAppend(&help, " [default ", f.default_text, "]");
    // Wrap at ~76 columns, indented.
    std::string line = "      ";
    for (const auto& word : absl::StrSplit(help, ' ')) {
      if (line.size() + word.size() > 80 && line.size() > 6) {
        absl::StrAppend(&out, line, "\n");
        line = "      ";
      }
      absl::StrAppend(&line, word, " ");
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace ucp::cli
