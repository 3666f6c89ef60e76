#include "conformance/commands.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "conformance/golden.h"
#include "conformance/model_gen.h"
#include "conformance/properties.h"
#include "conformance/spec_rules.h"
#include "google/protobuf/text_format.h"
#include "cli/flags.h"

namespace ucp::conformance {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "ucp: " << s.message() << " [" << absl::StatusCodeToString(s.code()) << "]\n";
  return 1;
}


absl::StatusOr<std::vector<Property>> ParseProperties(const std::string& s) {
  std::vector<Property> out;
  for (char c : s) {
    if (c == ',' || c == ' ') continue;
    auto p = ParseProperty(std::string(1, c));
    if (!p.ok()) return p.status();
    out.push_back(*p);
  }
  if (out.empty()) return absl::InvalidArgumentError("--properties: name at least one of a, b, c, d, e");
  return out;
}

// Replays one case (a GoldenCase textproto, as a failing run writes it).
int ReplayCase(const std::string& path, const std::vector<Property>& properties, const std::string& work) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return Fail(text.status());
  GoldenCase c;
  if (!google::protobuf::TextFormat::ParseFromString(*text, &c)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(path, ": not a GoldenCase textproto")));
  }
  int failed = 0;
  for (Property p : properties) {
    const absl::Status s = CheckProperty(p, c, JoinPath(work, "case"));
    std::cout << "(" << PropertyLetter(p) << ") " << PropertyName(p) << ": " << (s.ok() ? "ok" : s.ToString())
              << "\n";
    failed += !s.ok();
  }
  (void)RemoveTree(work);
  return failed == 0 ? 0 : 1;
}

// The flags of `ucp convert` / `ucp reshard` that tell a ZeRO source's
// rules as `o` does.
std::string SourceFlags(const ops::SourceOptions& o) {
  std::string flags;
  if (!o.rules.rules_file.empty()) absl::StrAppend(&flags, " --rules=", o.rules.rules_file);
  if (!o.rules.preset.empty()) absl::StrAppend(&flags, " --preset=", o.rules.preset);
  if (o.rules.original_vocab_size > 0) absl::StrAppend(&flags, " --original_vocab_size=", o.rules.original_vocab_size);
  std::vector<std::string> options;
  for (const auto& [k, v] : o.format_options) options.push_back(absl::StrCat(k, "=", v));
  if (!options.empty()) absl::StrAppend(&flags, " --source_option=", absl::StrJoin(options, ","));
  return flags;
}

// Writes `cases` generated cases for tools outside this binary (e.g. the MPI
// tests): DIR/case_K/case.textproto, the source checkpoint DIR/case_K/source
// (its tag folder named in DIR/case_K/source_dir), the flags `ucp convert`
// and `ucp reshard` from it need (DIR/case_K/source_flags) and the target
// topology as flags (DIR/case_K/target_flags).
int WriteSources(const std::string& dir, uint64_t seed, int cases, const CaseGenOptions& gen) {
  const rc::Gen<GoldenCase> g = GenCase(gen);
  for (int k = 0; k < cases; ++k) {
    GoldenCase c = g(rc::Random(seed + static_cast<uint64_t>(k)), k % 100).value();
    c.set_name(absl::StrCat("case_", k));
    const std::string case_dir = JoinPath(dir, c.name());
    std::string text;
    google::protobuf::TextFormat::PrintToString(c, &text);
    auto src = WriteGoldenSource(c, JoinPath(case_dir, "source"));
    if (!src.ok()) return Fail(src.status());
    auto zero_options = ZeroSourceOptionsFor(c.model(), case_dir);
    if (!zero_options.ok()) return Fail(zero_options.status());
    const Topology& t = c.target();
    for (const auto& [name, contents] : std::vector<std::pair<std::string, std::string>>{
             {"case.textproto", text},
             {"source_dir", *src + "\n"},
             {"source_flags", SourceFlags(*zero_options) + "\n"},
             {"target_flags", absl::StrCat("--tp=", t.tp(), " --pp=", t.pp(), " --dp=", t.dp(), "\n")}}) {
      if (absl::Status s = WriteFileAtomic(JoinPath(case_dir, name), contents); !s.ok()) return Fail(s);
    }
    std::cout << c.name() << ": " << c.source().ShortDebugString() << " -> " << t.ShortDebugString() << ", "
              << c.model().param_size() << " tensors\n";
  }
  return 0;
}

}  // namespace

int RunFuzzCommand(int argc, char** argv) {
  cli::FlagSet f("fuzz",
                   "runs the conformance properties on random models x topologies: (a) convert(save(M, T)) is the "
                   "same universal checkpoint for every T and equals M; (b) reshard(convert(save(M, T1)), T2) == "
                   "save(M, T2) bitwise; (c) ZeRO -> ZeRO reshard == the two-step path; (d) a missing shard, a "
                   "truncated file, a flipped byte, disagreeing replicated copies give the right error; (e) save(M, T) is "
                   "laid out as DeepSpeed 0.14.4 lays it out (formulas checked independently). Prints the "
                   "distribution of what was generated; a failure shrinks to a minimal model and prints the seed "
                   "and the case");
  uint64_t seed = 1;
  int64_t cases = 200;
  std::string properties = "abcde", workdir, case_file;
  CaseGenOptions gen;
  f.Uint64("seed", &seed, "RapidCheck seed: the same seed and --cases replay the same run");
  f.Int("cases", &cases, "cases per run; each case is checked against every selected property");
  f.String("properties", &properties, "which properties to check: any of a, b, c, d, e");
  f.String("workdir", &workdir, "scratch folder for the checkpoints (default: under /dev/shm, else $TMPDIR or /tmp; removed)");
  f.String("case", &case_file, "replay one case (a GoldenCase textproto, as a failure writes it) instead of fuzzing");
  std::string write_sources;
  f.String("write_sources", &write_sources,
           "instead of checking properties, write --cases generated source checkpoints into this folder (case_K/: "
           "case.textproto, source/, source_dir, source_flags, target_flags), for tests of tools outside ucp");
  f.Int32("max_tp", &gen.max_tp, "largest tensor-parallel degree drawn");
  f.Int32("max_pp", &gen.max_pp, "largest pipeline-parallel degree drawn");
  f.Int32("max_dp", &gen.max_dp, "largest data-parallel degree drawn");
  f.Int32("max_world", &gen.max_world, "largest tp * pp * dp of a drawn topology");
  auto pos = f.Parse(argc, argv);
  if (!pos.ok()) return Fail(pos.status());
  if (f.help_requested()) {
    std::cout << f.Usage();
    return 0;
  }
  if (!pos->empty()) return Fail(absl::InvalidArgumentError("ucp_conformance fuzz takes no positional arguments"));
  auto props = ParseProperties(properties);
  if (!props.ok()) return Fail(props.status());
  if (workdir.empty()) workdir = DefaultScratchDir("fuzz");
  if (!case_file.empty()) return ReplayCase(case_file, *props, workdir);
  if (cases < 1) return Fail(absl::InvalidArgumentError("--cases must be >= 1"));
  if (!write_sources.empty()) return WriteSources(write_sources, seed, static_cast<int>(cases), gen);

  // RapidCheck prints its global configuration when first used: make it
  // show the seed this run uses.
  setenv("RC_PARAMS", absl::StrCat("seed=", static_cast<uint64_t>(seed)).c_str(), /*overwrite=*/0);
  FuzzOptions o;
  o.seed = static_cast<uint64_t>(seed);
  o.cases = static_cast<int>(cases);
  o.properties = *props;
  o.gen = gen;
  o.workdir = workdir;
  std::vector<std::string> names;
  for (Property p : o.properties) names.push_back(absl::StrCat("(", PropertyLetter(p), ") ", PropertyName(p)));
  std::cout << "ucp_conformance fuzz: seed " << seed << ", " << cases << " cases, properties:\n  " << absl::StrJoin(names, "\n  ")
            << "\n";
  std::cout.flush();
  const auto start = std::chrono::steady_clock::now();
  const FuzzReport r = RunFuzz(o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << r.distribution.ToString();
  if (r.passed) {
    std::cout << "passed: " << r.cases_passed << " cases, every property held (" << static_cast<int>(seconds)
              << " s)\n";
    return 0;
  }
  std::cout << "FAILED after " << r.cases_passed << " passing cases (seed " << seed << ", " << static_cast<int>(seconds)
            << " s)\n"
            << r.failure << "\n";
  if (!r.shrunk_case.empty()) {
    const std::string path = absl::StrCat("ucp_fuzz_failure_seed", seed, ".textproto");
    const absl::Status s = WriteFileAtomic(path, absl::StrCat("# proto-message: ucp.GoldenCase\n", r.shrunk_case));
    std::cout << "shrunk case:\n" << r.shrunk_case;
    if (s.ok()) std::cout << "written to " << path << "; replay it alone: ucp_conformance fuzz --case=" << path << "\n";
  }
  std::cout << "replay the run: " << r.replay << "\n";
  return 1;
}

int RunGoldenCommand(int argc, char** argv) {
  const std::string usage =
      "usage: ucp_conformance golden check --golden=DIR --universal=DIR   compare a universal folder with a golden\n"
      "       ucp_conformance golden update --golden=DIR                    regenerate DIR/golden.textproto (on purpose only)\n"
      "       ucp_conformance golden source --golden=DIR --output=ROOT      write the case's source ZeRO checkpoint\n";
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << usage;
    return argc < 2 ? 1 : 0;
  }
  const std::string mode = argv[1];
  cli::FlagSet f(absl::StrCat("golden ", mode),
                   mode == "check" ? "compares a universal checkpoint folder (ucp's, or one written by a patched "
                                     "DeepSpeed ds_to_universal.py from `ucp_conformance golden source`) with a golden and "
                                     "reports every param whose files differ"
                   : mode == "update"
                       ? "regenerates DIR/golden.textproto from DIR/case.textproto; run only when ucp's output is "
                         "meant to change, never in CI"
                       : "writes the golden case's source ZeRO checkpoint (ROOT/<tag>, ROOT/latest), the input to "
                         "give another converter");
  std::string golden, universal, output, workdir;
  f.String("golden", &golden, "the golden folder (case.textproto, golden.textproto)", true);
  if (mode == "check") f.String("universal", &universal, "the universal checkpoint folder to check", true);
  if (mode == "source") f.String("output", &output, "the checkpoint root to write", true);
  if (mode == "update") f.String("workdir", &workdir, "scratch folder (default: under /dev/shm, else $TMPDIR or /tmp; removed)");
  if (mode != "check" && mode != "update" && mode != "source") {
    std::cerr << "ucp_conformance golden: unknown mode '" << mode << "'\n" << usage;
    return 1;
  }
  auto pos = f.Parse(argc - 1, argv + 1);
  if (!pos.ok()) return Fail(pos.status());
  if (f.help_requested()) {
    std::cout << f.Usage();
    return 0;
  }
  if (mode == "update") {
    if (workdir.empty()) workdir = DefaultScratchDir("golden");
    const absl::Status s = UpdateGolden(golden, workdir);
    if (!s.ok()) return Fail(s);
    auto g = ReadGolden(golden);
    if (!g.ok()) return Fail(g.status());
    std::cout << "wrote " << JoinPath(golden, kGoldenFile) << ": " << g->file_size() << " files described\n";
    return 0;
  }
  auto c = ReadGoldenCase(golden);
  if (!c.ok()) return Fail(c.status());
  if (mode == "source") {
    auto dir = WriteGoldenSource(*c, output);
    if (!dir.ok()) return Fail(dir.status());
    std::cout << "wrote the source checkpoint of " << c->name() << " (" << c->source().ShortDebugString()
              << ") to " << *dir << "\n";
    // What the golden's own conversion was told about the model.
    auto zero_options = ZeroSourceOptionsFor(c->model(), output);
    if (!zero_options.ok()) return Fail(zero_options.status());
    const std::string flags = SourceFlags(*zero_options);
    std::cout << "the golden's universal/ part is what `ucp convert --input_folder=" << *dir
              << " --output_folder=DIR" << flags << "` writes; check another converter's output with `ucp_conformance golden check`\n";
    return 0;
  }
  auto g = ReadGolden(golden);
  if (!g.ok()) return Fail(g.status());
  auto report = CheckUniversal(*g, universal);
  if (!report.ok()) return Fail(report.status());
  int files = 0;
  for (const auto& file : g->file()) files += file.path().rfind("universal/", 0) == 0;
  if (report->empty()) {
    std::cout << universal << " matches the golden " << c->name() << " (" << files << " files)\n";
    return 0;
  }
  int params = 0;
  for (const auto& [param, diffs] : *report) {
    if (!param.empty()) ++params;
    std::cout << (param.empty() ? "(not a param)" : absl::StrCat("param ", param)) << ":\n";
    for (const auto& d : diffs) std::cout << "  " << d << "\n";
  }
  std::cout << params << " param(s) differ from the golden " << c->name()
            << (report->count("") ? ", and files that belong to no param" : "") << "\n";
  return 1;
}

}  // namespace ucp::conformance
