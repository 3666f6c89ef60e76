// Pickle reader: bytes in, a `Value` tree out (value.h). Never executes code.
//
// Supports every opcode of protocols 0-5 that CPython 3.8-3.13 and torch emit:
// FRAME, MEMOIZE, STACK_GLOBAL, NEWOBJ_EX, LONG1/LONG4 (arbitrary precision),
// BINPERSID/PERSID, the protocol-0 text opcodes (INT, LONG, FLOAT, STRING,
// UNICODE, GET/PUT, INST, OBJ, ...). Out-of-band buffers (NEXT_BUFFER,
// READONLY_BUFFER) and EXT1/2/4 (copyreg extension registry) are refused with
// kUnimplemented.
//
// What the tree holds (see value.h for the decoded data constructors):
// - globals carry Python 3 names: in protocol 0-2 streams, Python 2 names are
//   renamed as CPython's fix_imports does (`__builtin__.set` -> `builtins.set`,
//   `copy_reg` -> `copyreg`, ...); the writer renames them back;
// - BINSTRING/SHORT_BINSTRING/STRING (Python 2 str) become kStr holding the raw
//   bytes; BINUNICODE and friends must be UTF-8 (lone surrogates allowed, as
//   Python's 'surrogatepass' reads them);
// - APPEND(S)/SETITEM(S) onto an Object go to its list_items/dict_items; BUILD
//   sets an Object's state, or an OrderedDict's dict_state() (torch state dicts
//   carry `_metadata` that way); a second BUILD on the same value is an error;
// - `copyreg.__newobj_ex__(cls, args, kwargs)` (how writer.h writes NEWOBJ_EX
//   at protocol 2) is read back as a kNewObjEx object;
// - int, float, None and bool values may be shared between trees (small ints
//   and singletons are cached; others live in blocks, see ScalarPool); they
//   are immutable, so this is never visible except through use_count().
// The stream must end with STOP holding exactly one value and no MARK, with
// nothing after it.
//
// Errors (first failure wins, message carries the byte offset):
//   kDataLoss          truncated input, a length or frame past the end
//   kInvalidArgument   unknown opcode, stack underflow, wrong operand types,
//                      bad memo index, self-referencing structure, text
//                      operands that do not parse, no STOP
//   kResourceExhausted a cap in ReadOptions exceeded
//   kUnimplemented     out-of-band buffers, extension registry, PROTO > 5
//
// Example:
//   UCP_ASSIGN_OR_RETURN(ucp::pickle::ValuePtr root, ucp::pickle::Unpickle(bytes));
#ifndef UCP_FORMAT_PICKLE_READER_H_
#define UCP_FORMAT_PICKLE_READER_H_

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"

namespace ucp::pickle {

// ReadOptions: caps that bound memory and recursion on hostile input.
struct ReadOptions {
  // Largest memo index / number of memo entries.
  size_t max_memo_entries = size_t{1} << 24;
  // Most values on the VM stack (including marks) at once.
  size_t max_stack_depth = size_t{1} << 24;
  // Deepest container nesting of the produced tree.
  size_t max_nesting = 512;
  // Longest str/bytes operand; never beyond the bytes that are left anyway.
  size_t max_string_length = size_t{1} << 31;
  // Total values created (guards quadratic blow-ups from DUP/GET).
  size_t max_values = size_t{1} << 28;
  // Most decimal digits in a protocol 0 INT/LONG literal (Python 3.11's
  // default int_max_str_digits); conversion cost is quadratic in it.
  size_t max_int_digits = 4300;
  // Most values the self-reference checks may visit in one stream. They run
  // only when a container obtained through DUP or GET is appended to, which
  // ordinary pickles never do; this bounds hostile ones.
  size_t max_self_reference_visits = size_t{1} << 26;
  // When set, receives every global the stream names (GLOBAL, STACK_GLOBAL,
  // INST), as (module, name) with Python 3 names, whether or not the tree
  // keeps it (unsafe.h classifies them).
  std::set<std::pair<std::string, std::string>>* globals = nullptr;
};

absl::StatusOr<ValuePtr> Unpickle(std::string_view bytes, const ReadOptions& options = {});

}  // namespace ucp::pickle

#endif  // UCP_FORMAT_PICKLE_READER_H_
