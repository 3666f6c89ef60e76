// The reconstruction of a ZeRO-0 optimizer's param order: which module
// param each optimizer state belongs to, when nothing in the checkpoint
// says so.
//
// At stage 0 DeepSpeed saves the client optimizer's own state_dict: its
// states are keyed by the index of each param in the optimizer's param
// groups, i.e. the order of the client's `model_parameters`, and no name ->
// index map is saved (param_shapes is None). A client builds its groups by
// filtering the module's params in module order (DeepSpeed's default, the
// Hugging Face Trainer's decay / no-decay split, LoRA adapters), so each
// group is a subsequence of the module's params, and the module params in no
// group are frozen. This finds every assignment of module params to groups
// that fits: each optimizer slot (group g, position j) takes one module param
// whose evidence matches (`Fits`: the shape; for bf16/fp16 also the fp32
// master cast to the lp dtype equal to the module tensor), the slots of a
// group in module order, every module param in at most one slot. It counts
// the assignments up to two; unique is the answer, two are reported with the
// params whose slot differs.
//
// Example:
//   OrderProblem p{{{64, 64}, {64}}, {{{64, 64}}, {{64}}}};  // 2 module params, 2 groups
//   OrderResult r = SolveOrder(p, ShapeFit(p));  // r.count == 1, r.first = {{0}, {1}}
#ifndef UCP_FORMATS_DEEPSPEED_ZERO0_PARAM_ORDER_H_
#define UCP_FORMATS_DEEPSPEED_ZERO0_PARAM_ORDER_H_

#include <cstdint>
#include <functional>
#include <vector>

namespace ucp::deepspeed_zero0 {

struct OrderProblem {
  // Candidate module params (trainable or frozen; buffers and tied aliases
  // excluded), in module order: their shapes.
  std::vector<std::vector<int64_t>> module_shapes;
  // Per optimizer group, per position: the shape the optimizer holds.
  std::vector<std::vector<std::vector<int64_t>>> group_shapes;
};

// Whether module param `m` may fill slot (group g, position j).
using FitFn = std::function<bool(int m, int g, int j)>;

// Shapes equal.
FitFn ShapeFit(const OrderProblem& p);

struct OrderResult {
  int count = 0;  // 0, 1 or 2 (= two or more)
  // With count >= 1: per group, per position, the module param index.
  std::vector<std::vector<int>> first;
  // With count == 2: a second, different assignment.
  std::vector<std::vector<int>> second;
  // With count == 0: the deepest slot no candidate could fill, as far as
  // the search got (group, position), for the error message.
  int stuck_group = -1, stuck_position = -1;
};

// Solves `p` with `fits` (memoized over (module param, positions per group);
// stops at two assignments).
OrderResult SolveOrder(const OrderProblem& p, const FitFn& fits);

}  // namespace ucp::deepspeed_zero0

#endif  // UCP_FORMATS_DEEPSPEED_ZERO0_PARAM_ORDER_H_
