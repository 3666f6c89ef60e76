// Writes a large GPT-NeoX-shaped DeepSpeed ZeRO-1 checkpoint (fp32 weights,
// fp32 master + Adam states) for the benchmark, with the conformance suite's
// synthetic model and the same ZeRO writer `ucp reshard` uses.
//
//   make_checkpoint --gb=3 --tp=2 --dp=2 --output_folder=/tmp/bench/src/global_step1
//
// Size: a fp32 ZeRO checkpoint holds 16 bytes per param (4 in the layer
// files, 12 in the optimizer files); hidden 1024 and a 8192-token vocabulary,
// with as many transformer layers as reach the requested size.
#include <cmath>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "conformance/neox_model.h"
#include "conformance/synthetic_state.h"
#include "cli/flags.h"

int main(int argc, char** argv) {
  using ucp::cli::FlagSet;
  FlagSet f("make_checkpoint", "a large GPT-NeoX-shaped ZeRO-1 checkpoint for bench/run_bench.sh");
  std::string output;
  std::string gb = "3";
  int tp = 2, pp = 1, dp = 2, threads = 0, hidden = 1024, vocab = 8192;
  f.String("output_folder", &output, "ROOT/TAG to write", true);
  f.String("gb", &gb, "approximate checkpoint size in GB (10^9 bytes)");
  f.Int32("tp", &tp, "tensor parallel degree");
  f.Int32("pp", &pp, "pipeline parallel degree");
  f.Int32("dp", &dp, "data parallel degree");
  f.Int32("num_threads", &threads, "writer threads (0 = all cores)");
  f.Int32("hidden", &hidden, "hidden size (attention the same, the MLP 4 times it; smaller for tests)");
  f.Int32("vocab", &vocab, "vocabulary size");
  auto pos = f.Parse(argc, argv);
  if (!pos.ok() || f.help_requested()) {
    std::cerr << (pos.ok() ? f.Usage() : std::string(pos.status().message())) << "\n";
    return pos.ok() ? 0 : 2;
  }
  ucp::conformance::NeoxShape shape;
  if (hidden < 8 || vocab < 8) {
    std::cerr << "make_checkpoint: --hidden and --vocab must be at least 8\n";
    return 2;
  }
  shape.hidden = hidden;
  shape.attention = hidden;
  shape.ffn = 4 * hidden;
  shape.vocab = vocab;
  shape.make_vocab_size_divisible_by = 128;
  const double params_wanted = std::stod(gb) * 1e9 / 16.0;
  const double per_layer = 12.0 * hidden * hidden + 13.0 * hidden;
  const double fixed = 2.0 * vocab * hidden;
  shape.layers = std::max(1, static_cast<int>(std::lround((params_wanted - fixed) / per_layer)));
  ucp::ModelSpec spec = ucp::conformance::NeoxSpec(shape);
  auto state = ucp::conformance::SyntheticModelState::Make(spec, /*seed=*/1, /*zero_stage=*/1,
                                                            ucp::state::OptimizerKind::kZero);
  if (!state.ok()) {
    std::cerr << "make_checkpoint: " << state.status() << "\n";
    return 1;
  }
  auto written = ucp::conformance::SaveZero(**state, output, ucp::state::Topology{tp, pp, dp}, threads);
  if (!written.ok()) {
    std::cerr << "make_checkpoint: " << written.status() << "\n";
    return 1;
  }
  std::cout << "wrote " << output << ": " << shape.layers << " transformer layers, hidden " << shape.hidden << ", "
            << written->files << " files, " << written->bytes << " bytes\n";
  return 0;
}
