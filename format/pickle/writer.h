// Pickle writer: a `Value` tree in, protocol 2 bytes out, as CPython's
// `pickle.dumps(obj, protocol=2)` would write them, so `pickle.loads` and
// `torch.load` accept the result.
//
// - dict order is preserved; a Dict with ordered_dict() is written as
//   `collections.OrderedDict` REDUCE + SETITEMS (+ BUILD of its dict_state());
// - shared references (the same ValuePtr reached twice) are memoized once and
//   fetched with BINGET/LONG_BINGET, so sharing survives a round trip;
// - Bytes are written as `_codecs.encode(str, 'latin1')` (protocol 2 has no
//   bytes opcode), ByteArray as `bytearray(bytes)` (CPython 3.11's
//   save_bytearray), sets as `__builtin__.set([...])`, big ints as LONG1/LONG4;
// - Objects are written back with the opcode that built them (REDUCE, NEWOBJ,
//   NEWOBJ_EX as `copyreg.__newobj_ex__` REDUCE in protocol 2, INST as REDUCE)
//   followed by APPENDS/SETITEMS of their items and BUILD when they have state;
// - a PersistentId is written as its pid value + BINPERSID.
// Globals get their Python 2 names (fix_imports): `builtins` -> `__builtin__`,
// `copyreg` -> `copy_reg`, ...
//
// The bytes are those of CPython 3.11's C pickler at protocol 2 (memo
// numbering, BININT1/BININT2/BININT/LONG1 choice, APPENDS/SETITEMS batches of
// 1000, TUPLE1-3) whenever the tree shares values as the Python objects did:
// every str, bytes, non-empty tuple, list, dict, set, global and object is
// memoized by identity, except '' which, as in CPython, is one object. All
// fixture data.pkl files and Python's own protocol 2 pickles of the interop
// cases are reproduced byte for byte (fixtures_test, python_interop_test).
//
// Example:
//   UCP_ASSIGN_OR_RETURN(std::string bytes, ucp::pickle::Pickle(*root));
#ifndef UCP_FORMAT_PICKLE_WRITER_H_
#define UCP_FORMAT_PICKLE_WRITER_H_

#include <string>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"

namespace ucp::pickle {

struct WriteOptions {
  int protocol = 2;  // only 2 is supported
  size_t max_nesting = 512;
};

// Fails with kInvalidArgument on a value it cannot encode (a cycle, nesting
// past max_nesting, an unhashable dict key, a non-tuple Object args).
absl::StatusOr<std::string> Pickle(const Value& root, const WriteOptions& options = {});

}  // namespace ucp::pickle

#endif  // UCP_FORMAT_PICKLE_WRITER_H_
