#include "base/status_macros.h"

#include "gtest/gtest.h"

namespace ucp {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  UCP_ASSIGN_OR_RETURN(int h, Half(x));
  UCP_ASSIGN_OR_RETURN(int q, Half(h), _.Prepend("second half: "));
  return q;
}

absl::Status Check(int x) {
  UCP_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, PropagatesAndAnnotates) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(3).status().message(), "odd");
  EXPECT_EQ(Quarter(6).status().message(), "second half: odd");
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Check(2).ok());
  EXPECT_FALSE(Check(1).ok());
}

}  // namespace
}  // namespace ucp
