// Test helper: damaging one tensor's bytes in a checkpoint file, to check
// that a reader reports the record (CRC) when it reads it.
#ifndef UCP_TESTING_DAMAGE_H_
#define UCP_TESTING_DAMAGE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "format/pickle/value.h"

namespace ucp::testing {

// Flips bit 0x40 of the byte at fraction `at` (default: the middle byte) of
// the storage record behind the tensor `find` picks from the file's pickle
// (the file opened without CRC checks); kNotFound when `find` returns null.
absl::Status FlipByteInTensor(const std::string& path,
                              const std::function<const pickle::Value*(const pickle::Value& root)>& find,
                              double at = 0.5);

}  // namespace ucp::testing

#endif  // UCP_TESTING_DAMAGE_H_
