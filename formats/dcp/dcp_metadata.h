// The index of a PyTorch Distributed Checkpoint (DCP) folder: its `.metadata`
// file, as torch.distributed.checkpoint.FileSystemWriter writes it (torch 2.x:
// a pickle of the dataclass `Metadata`, read here as data by ucp's own pickle
// reader: nothing in it is executed).
//
//   Metadata.state_dict_metadata  {key: TensorStorageMetadata(properties (dtype,
//                                 layout, ...), size, chunks [ChunkStorageMetadata
//                                 (offsets, sizes)]) | BytesStorageMetadata()}
//   Metadata.storage_data         {MetadataIndex(fqn, offset): _StorageInfo(
//                                 relative_path, offset, length)}
//
// Every key of the flattened state dict ("model.fc1.weight",
// "optim.state.fc1.weight.exp_avg", "optim.param_groups.0.lr") is an Entry:
// a tensor with its global size and the chunks the saving ranks held (each a
// torch.save archive at a byte range of a `__R_n.distcp` file), or a bytes
// entry (one torch.save'd Python object). ParseMetadata checks what a reader
// relies on: every chunk inside the tensor and the chunks tiling it exactly
// (no hole, no overlap), every item's storage named, in a file of the folder
// (no path leaving it), and no transform (compression) it cannot undo.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(DcpMetadata md, ReadMetadata("/ckpt/step-100"));
//   for (const DcpEntry& e : md.entries) if (e.tensor) ...e.chunks[0].storage.file...
#ifndef UCP_FORMATS_DCP_DCP_METADATA_H_
#define UCP_FORMATS_DCP_DCP_METADATA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "format/torch/dtype.h"

namespace ucp::dcp {

// Where one item's bytes are: a torch.save archive at [offset, offset + length)
// of `file` (relative to the folder).
struct DcpStorage {
  std::string file;
  int64_t offset = 0;
  int64_t length = 0;
};

struct DcpChunk {
  std::vector<int64_t> offsets;  // global element offsets, per dim
  std::vector<int64_t> sizes;
  DcpStorage storage;
};

struct DcpEntry {
  std::string key;
  bool tensor = false;
  torch::DType dtype = torch::DType::kFloat32;  // tensors
  std::vector<int64_t> size;                    // tensors: the global size
  std::vector<DcpChunk> chunks;                 // tensors: tiling `size`
  DcpStorage bytes;                             // bytes entries
};

struct DcpMetadata {
  std::string path;              // the .metadata file
  std::vector<DcpEntry> entries; // in state_dict_metadata order
  std::map<std::string, int> index;

  const DcpEntry* Find(const std::string& key) const;
  // The files the entries name, sorted.
  std::vector<std::string> Files() const;
};

// Parses the unpickled `.metadata` of folder `dir` (`path` for messages).
// The chunks of tensor entry `e` tile its size: each inside it, no two
// overlapping (checked for every pair, however many chunks), their element
// counts adding up to the tensor's. `path` names the file in errors.
absl::Status CheckTiling(const DcpEntry& e, const std::string& path);

absl::StatusOr<DcpMetadata> ParseMetadata(const pickle::Value& root, const std::string& path);
// Reads and parses `<dir>/.metadata`.
absl::StatusOr<DcpMetadata> ReadMetadata(const std::string& dir);

}  // namespace ucp::dcp

#endif  // UCP_FORMATS_DCP_DCP_METADATA_H_
