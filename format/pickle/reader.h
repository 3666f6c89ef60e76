// Pickle reader: bytes in, a `Value` tree out (value.h). Never executes code.
//
// Supports every opcode of protocols 0-5 that CPython 3.8-3.13 and torch emit:
// FRAME, MEMOIZE, STACK_GLOBAL, NEWOBJ_EX, LONG1/LONG4 (arbitrary precision),
// BINPERSID/PERSID, the protocol-0 text opcodes (INT, LONG, FLOAT, STRING,
// UNICODE, GET/PUT, INST, OBJ, ...). Out-of-band buffers (NEXT_BUFFER,
// READONLY_BUFFER) and EXT1/2/4 (copyreg extension registry) are refused with
// kUnimplemented.
//
// Errors (first failure wins, message carries the byte offset):
//   kDataLoss          truncated input, a length or frame past the end
//   kInvalidArgument   unknown opcode, stack underflow, wrong operand types,
//                      bad memo index, self-referencing structure, text
//                      operands that do not parse, no STOP
//   kResourceExhausted a cap in ReadOptions exceeded
//   kUnimplemented     out-of-band buffers, extension registry
//
// Example:
//   UCP_ASSIGN_OR_RETURN(ucp::pickle::ValuePtr root, ucp::pickle::Unpickle(bytes));
#ifndef UCP_FORMAT_PICKLE_READER_H_
#define UCP_FORMAT_PICKLE_READER_H_

#include <cstddef>
#include <string_view>

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
};

absl::StatusOr<ValuePtr> Unpickle(std::string_view bytes, const ReadOptions& options = {});

}  // namespace ucp::pickle

#endif  // UCP_FORMAT_PICKLE_READER_H_
