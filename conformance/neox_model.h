// Built-in GPT-NeoX-shaped model specs: the shape of the DeepSpeed fixtures
// (../shared/fixtures/deepspeed-0.14.4, README.md there), the golden case's
// model and the demo's. PipelineModule layer indices as GPT-NeoX builds them:
//
//   0               EmbeddingPipe   word_embeddings.weight (vocab-parallel)
//   1               a module without params (still has a layer file)
//   2 .. 1+layers   ParallelTransformerLayerPipe
//   2+layers        a function (no layer file)
//   3+layers        NormPipe        norm.scale
//   4+layers        ParallelLinearPipe  final_linear.weight (vocab-parallel)
//
// Two optimizer groups: weights (group 0), norms and biases (group 1), each
// flattened in module order, as the fixtures show.
//
// Example:
//   NeoxShape s;            // the fixtures' model: hidden 64, 8 layers, vocab 96
//   ModelSpec spec = NeoxSpec(s);
#ifndef UCP_CONFORMANCE_NEOX_MODEL_H_
#define UCP_CONFORMANCE_NEOX_MODEL_H_

#include <cstdint>
#include <string>

#include "proto/ucp.pb.h"

namespace ucp::conformance {

struct NeoxShape {
  int64_t hidden = 64;
  int64_t attention = 64;  // columns of attention.dense (= hidden in a real model)
  int64_t ffn = 256;       // rows of mlp.dense_h_to_4h (4 * hidden in a real model)
  int layers = 8;
  int64_t vocab = 96;
  int64_t make_vocab_size_divisible_by = 8;
  std::string lp_dtype = "fp32";
  std::string rules_source = "preset";  // see spec_rules.h
};

ModelSpec NeoxSpec(const NeoxShape& shape);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_NEOX_MODEL_H_
