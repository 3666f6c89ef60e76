// Hugging Face folders for tests, written with the safetensors format as
// transformers' save_pretrained lays them out: config.json + model.safetensors,
// or shards of 10 tensors + model.safetensors.index.json. NeoX(): the tensors
// of a 2-layer GPTNeoXForCausalLM (hidden 8, vocab 12), each with distinct values.
#ifndef UCP_FORMATS_HF_HF_TEST_FOLDER_H_
#define UCP_FORMATS_HF_HF_TEST_FOLDER_H_

#include <string>
#include <utility>
#include <vector>

#include "format/torch/tensor.h"

namespace ucp::hf::testfolder {

extern const char kConfig[];
// LlamaForCausalLM: 2 layers, hidden 8, 4 query heads and 2 kv heads of 2
// (GQA), intermediate 6, vocab 12, untied output.
extern const char kLlamaConfig[];
using Tensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Elements distinct per tensor (salt) and position; float32 or int64.
torch::Tensor Filled(const std::vector<int64_t>& shape, int salt, torch::DType dtype = torch::DType::kFloat32);
Tensors NeoX(torch::DType dtype = torch::DType::kFloat32);
Tensors Llama();
void WriteSafetensors(const std::string& path, const Tensors& tensors);
// A fresh folder `name` (testing::FreshTempDir) with `config` and the tensors.
std::string Folder(const std::string& name, const Tensors& tensors, const std::string& config = kConfig);
std::string Sharded(const std::string& name, const Tensors& tensors);

}  // namespace ucp::hf::testfolder

#endif  // UCP_FORMATS_HF_HF_TEST_FOLDER_H_
