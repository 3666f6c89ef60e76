// A canonical text rendering of a torch.save file's contents, identical to
// what testdata/canonical_dump.py prints from Python's `torch.load`, so that
// interop tests can compare the two readers line by line.
//
// One line per node: `<path> <type> [<details>]`, depth first, dict order
// kept. Paths start at `$`; children are `[i]` (tuple/list items),
// `[<key>]` (dict entries, key rendered as below), `{i}` (set elements,
// sorted by their key rendering), `.args`, `.kwargs`, `.state`,
// `.listitems`, `.dictitems`, `.callable` (objects) and `.__dict__` (the
// instance attributes of an OrderedDict, e.g. a state dict's `_metadata`).
// Node types:
//   none | bool True | int <decimal> | float <Python repr; NaN as nan:0x<bits>>
//   str "<escaped>" | bytes len=N "<escaped>" (N <= 64) or sha256=<hex>
//   bytearray (as bytes) | tuple len=N | list len=N | dict len=N
//   OrderedDict len=N | set len=N | frozenset len=N | global <module>.<name>
//   object <module>.<name> how=reduce|newobj|newobj_ex|inst
//   tensor|parameter dtype=<d> shape=[..] stride=[..] offset=N
//          requires_grad=True|False storage=#<k> storage_numel=N sha256=<hex
//          of the view's row-major bytes>   (#k numbers storages by first use)
//   storage dtype=<d> storage=#<k> storage_numel=N sha256=<hex>
//   torch.Size [d0, d1, ...] | ndarray dtype=<numpy str> shape=[..]
//          fortran=True|False sha256=<hex> | numpy.dtype <numpy str>
// Strings are the UTF-8 bytes with printable ASCII kept except `"` and `\`,
// everything else as \xHH. Module names are Python 3's (`builtins`).
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto file, TorchFile::Open(path));
//   UCP_ASSIGN_OR_RETURN(std::string text, CanonicalDump(*file));
#ifndef UCP_FORMAT_TORCH_DUMP_H_
#define UCP_FORMAT_TORCH_DUMP_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"

namespace ucp::torch {

// The dump of a whole file. kResourceExhausted past 50 million lines (a
// hostile DAG of shared references can expand exponentially).
absl::StatusOr<std::string> CanonicalDump(const TorchFile& file);
// The dump of a tree; tensors and storages are rendered through `file`
// (null: as the objects they are in the pickle).
absl::StatusOr<std::string> CanonicalDumpValue(const pickle::Value& root, const TorchFile* file);

// Python's repr() of a float (shortest round trip), "nan:0x<16 hex>" for NaN.
std::string PythonFloatRepr(double d);
// `"` + escaped bytes + `"` as described above.
std::string QuoteBytes(std::string_view bytes);

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_DUMP_H_
