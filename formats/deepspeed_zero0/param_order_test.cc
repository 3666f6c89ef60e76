// Tests of the ZeRO-0 param order reconstruction (param_order.h): unique,
// ambiguous and impossible assignments, and a stronger fit settling a tie.
#include "formats/deepspeed_zero0/param_order.h"

#include "gtest/gtest.h"

namespace ucp::deepspeed_zero0 {
namespace {

using Shapes = std::vector<std::vector<int64_t>>;
const std::vector<int64_t> W = {8, 4}, V = {4, 8}, B = {8};

TEST(ParamOrderTest, InterleavedGroupsAreUniqueByShape) {
  // Module: w0 b0 w1 b1 n; groups: decay [w0 w1], no-decay [b0 b1 n].
  OrderProblem p{{W, B, W, B, B}, {{W, W}, {B, B, B}}};
  OrderResult r = SolveOrder(p, ShapeFit(p));
  ASSERT_EQ(r.count, 1);
  EXPECT_EQ(r.first, (std::vector<std::vector<int>>{{0, 2}, {1, 3, 4}}));
}

TEST(ParamOrderTest, FrozenParamsAreThoseOfNoGroup) {
  // A frozen embedding (V) first, then two trained weights.
  OrderProblem p{{V, W, W}, {{W, W}}};
  OrderResult r = SolveOrder(p, ShapeFit(p));
  ASSERT_EQ(r.count, 1);
  EXPECT_EQ(r.first, (std::vector<std::vector<int>>{{1, 2}}));
}

TEST(ParamOrderTest, SameShapesWithAFrozenOneAreAmbiguous) {
  OrderProblem p{{W, W}, {{W}}};
  OrderResult r = SolveOrder(p, ShapeFit(p));
  ASSERT_EQ(r.count, 2);
  EXPECT_NE(r.first, r.second);
}

TEST(ParamOrderTest, SameShapesInTwoGroupsAreAmbiguous) {
  OrderProblem p{{B, B}, {{B}, {B}}};
  OrderResult r = SolveOrder(p, ShapeFit(p));
  EXPECT_EQ(r.count, 2);
}

TEST(ParamOrderTest, AStrongerFitSettlesATie) {
  OrderProblem p{{W, W}, {{W}}};
  // Evidence says module param 1 is the trained one.
  OrderResult r = SolveOrder(p, [&](int m, int g, int j) { return p.module_shapes[m] == p.group_shapes[g][j] && m == 1; });
  ASSERT_EQ(r.count, 1);
  EXPECT_EQ(r.first, (std::vector<std::vector<int>>{{1}}));
}

TEST(ParamOrderTest, AStateOfNoModuleShapeFitsNothing) {
  OrderProblem p{{W, B}, {{W, V}}};
  OrderResult r = SolveOrder(p, ShapeFit(p));
  EXPECT_EQ(r.count, 0);
  EXPECT_EQ(r.stuck_group, 0);
  EXPECT_EQ(r.stuck_position, 1);
}

TEST(ParamOrderTest, MoreStatesThanModuleParamsFitNothing) {
  OrderProblem p{{W}, {{W, W}}};
  EXPECT_EQ(SolveOrder(p, ShapeFit(p)).count, 0);
}

TEST(ParamOrderTest, OrderOutsideModuleOrderFitsNothing) {
  // The group lists B before W, the module W before B.
  OrderProblem p{{W, B}, {{B, W}}};
  EXPECT_EQ(SolveOrder(p, ShapeFit(p)).count, 0);
}

TEST(ParamOrderTest, ManyParamsSolveQuickly) {
  // 400 module params, alternating shapes, two groups: memoized search.
  OrderProblem p;
  p.group_shapes.resize(2);
  for (int i = 0; i < 200; ++i) {
    p.module_shapes.push_back(W);
    p.module_shapes.push_back(B);
    p.group_shapes[0].push_back(W);
    p.group_shapes[1].push_back(B);
  }
  OrderResult r = SolveOrder(p, ShapeFit(p));
  EXPECT_EQ(r.count, 1);
}

}  // namespace
}  // namespace ucp::deepspeed_zero0
