// Leftovers: what a command built and is done with once its output is
// committed (the opened checkpoint: its parsed pickles, its maps of params
// and files, its mapped inputs; the write plan), freed when the command
// returns, or, in a program that exits right after (the ucp command), left
// for the process's exit to take back.
//
// Freeing a checkpoint's structures is work no one waits for in a library
// and pure cost at the end of a command-line run: on a real checkpoint with
// 643 params in 142 files (neox-deep-tp2), tearing them down is about a tenth
// of an export's time. The kernel takes the memory back at exit in one go,
// as compilers do with the memory of a translation unit (clang's
// -disable-free). What is left stays reachable (from a list that is never
// destroyed), so a leak checker does not report it.
//
// Example:
//   Leftovers left;  // in the command's entry point
//   ...
//   left.Keep(std::move(state));  // after the last use; the plan after the state it reads
//   left.Keep(std::move(plan));
//
// Keep only on the way out of a command that succeeded: a failed command's
// inputs must be freed before its error is made, since a mapped input
// (torch::MappedFile) records a read cut short by truncation when it is
// destroyed, and that record (MappedFile::CheckAllIntact) is the error
// returned (ops::RunCheckingInputs).
#ifndef UCP_BASE_LEFTOVERS_H_
#define UCP_BASE_LEFTOVERS_H_

#include <memory>
#include <vector>

namespace ucp {

// Called once by a program before its commands run: from then on, the
// Leftovers of every command are left to the process's exit.
void LeaveLeftoversToExit();
bool LeftoversLeftToExit();

class Leftovers {
 public:
  Leftovers() = default;
  Leftovers(const Leftovers&) = delete;
  Leftovers& operator=(const Leftovers&) = delete;
  // Frees what was kept, the last kept first (a plan before the state it
  // reads), unless LeaveLeftoversToExit was called.
  ~Leftovers();

  template <typename T>
  void Keep(std::unique_ptr<T> p) {
    if (p != nullptr) kept_.push_back(std::shared_ptr<void>(std::move(p)));
  }
  template <typename T>
  void Keep(std::shared_ptr<T> p) {
    if (p != nullptr) kept_.push_back(std::move(p));
  }
  size_t size() const { return kept_.size(); }

 private:
  std::vector<std::shared_ptr<void>> kept_;
};

}  // namespace ucp

#endif  // UCP_BASE_LEFTOVERS_H_
