#include "formats/deepspeed_zero0/param_order.h"

#include <utility>

#include "absl/container/flat_hash_set.h"

namespace ucp::deepspeed_zero0 {
namespace {

class Solver {
 public:
  Solver(const OrderProblem& p, const FitFn& fits) : p_(p), fits_(fits) {
    const int g = static_cast<int>(p.group_shapes.size());
    pos_.assign(g, 0);
    cur_.resize(g);
    for (int i = 0; i < g; ++i) {
      cur_[i].assign(p.group_shapes[i].size(), -1);
      total_slots_ += static_cast<int>(p.group_shapes[i].size());
    }
  }

  OrderResult Run() {
    Dfs(0, 0);
    result_.count = static_cast<int>(solutions_.size());
    if (!solutions_.empty()) result_.first = solutions_[0];
    if (solutions_.size() > 1) result_.second = solutions_[1];
    return std::move(result_);
  }

 private:
  // Solutions found below (m, pos_), capped by the global stop at two.
  int Dfs(int m, int filled) {
    const int num_module = static_cast<int>(p_.module_shapes.size());
    if (filled > best_filled_) {
      best_filled_ = filled;
      NoteStuck();
    }
    if (filled == total_slots_) {
      // Every remaining module param is frozen.
      solutions_.push_back(cur_);
      return 1;
    }
    if (total_slots_ - filled > num_module - m) return 0;
    std::vector<int> key = pos_;
    key.push_back(m);
    if (dead_.contains(key)) return 0;
    int found = 0;
    for (size_t g = 0; g < pos_.size() && solutions_.size() < 2; ++g) {
      const int j = pos_[g];
      if (j >= static_cast<int>(p_.group_shapes[g].size())) continue;
      if (!fits_(m, static_cast<int>(g), j)) continue;
      cur_[g][j] = m;
      ++pos_[g];
      found += Dfs(m + 1, filled + 1);
      --pos_[g];
      cur_[g][j] = -1;
    }
    if (solutions_.size() < 2) found += Dfs(m + 1, filled);  // m frozen
    if (found == 0) dead_.insert(std::move(key));
    return found;
  }

  void NoteStuck() {
    for (size_t g = 0; g < pos_.size(); ++g) {
      if (pos_[g] < static_cast<int>(p_.group_shapes[g].size())) {
        result_.stuck_group = static_cast<int>(g);
        result_.stuck_position = pos_[g];
        return;
      }
    }
  }

  const OrderProblem& p_;
  const FitFn& fits_;
  std::vector<int> pos_;
  std::vector<std::vector<int>> cur_;
  int total_slots_ = 0;
  int best_filled_ = -1;
  absl::flat_hash_set<std::vector<int>> dead_;
  std::vector<std::vector<std::vector<int>>> solutions_;
  OrderResult result_;
};

}  // namespace

FitFn ShapeFit(const OrderProblem& p) {
  return [&p](int m, int g, int j) { return p.module_shapes[m] == p.group_shapes[g][j]; };
}

OrderResult SolveOrder(const OrderProblem& p, const FitFn& fits) { return Solver(p, fits).Run(); }

}  // namespace ucp::deepspeed_zero0
