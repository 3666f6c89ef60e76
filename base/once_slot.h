// OnceSlot<T>: a value made on first use, once, by whichever thread asks
// first; the others wait for it. An error in making it is every later
// caller's answer too (it is not retried), so that threads asking for the
// same input file at once parse it once and all report the same damage.
// Slots are made up front, one per thing that may be needed (an optimizer
// or a layer file), so that different things are made on different threads
// at once.
//
// Example:
//   OnceSlot<TorchFile> slot;  // one per file, made when the folder is scanned
//   absl::StatusOr<TorchFile*> f = slot.Get([&] { return TorchFile::Open(path); });
#ifndef UCP_BASE_ONCE_SLOT_H_
#define UCP_BASE_ONCE_SLOT_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ucp {

template <typename T>
class OnceSlot {
 public:
  OnceSlot() = default;
  OnceSlot(const OnceSlot&) = delete;
  OnceSlot& operator=(const OnceSlot&) = delete;

  // The value: `make()` (returning absl::StatusOr<std::unique_ptr<T>>, or
  // anything that converts to it) runs on the first call only; every call
  // returns what it gave.
  template <typename Make>
  absl::StatusOr<T*> Get(const Make& make) {
    std::call_once(once_, [&] {
      absl::StatusOr<std::unique_ptr<T>> made = make();
      if (made.ok()) {
        value_ = *std::move(made);
        ready_.store(true, std::memory_order_release);
      } else {
        status_ = made.status();
      }
    });
    if (!status_.ok()) return status_;
    return value_.get();
  }

  // The value when a Get that has returned made it, else null; never makes
  // it. Only for a caller ordered after every Get (no Get may run at once).
  T* made() const { return value_.get(); }
  // The value when it has been made, else null; never makes it, never
  // waits. Safe at any time, from any thread (e.g. for a hint that should
  // not open what nobody asked for yet).
  T* IfMade() const { return ready_.load(std::memory_order_acquire) ? value_.get() : nullptr; }

 private:
  std::once_flag once_;
  absl::Status status_;
  std::unique_ptr<T> value_;
  std::atomic<bool> ready_{false};
};

}  // namespace ucp

#endif  // UCP_BASE_ONCE_SLOT_H_
