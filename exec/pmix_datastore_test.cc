// PreferPmixHashDatastore: sets PMIX_MCA_gds=hash only when the user did not
// choose a datastore.
#include <cstdlib>
#include <string>

#include "exec/mpi_cluster.h"
#include "gtest/gtest.h"

namespace ucp::exec {
namespace {

TEST(PreferPmixHashDatastoreTest, SetsHashWhenUnset) {
  ASSERT_EQ(::unsetenv("PMIX_MCA_gds"), 0);
  EXPECT_TRUE(PreferPmixHashDatastore());
  const char* v = std::getenv("PMIX_MCA_gds");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(std::string(v), "hash");
  // A second call leaves it (it is set now).
  EXPECT_FALSE(PreferPmixHashDatastore());
  EXPECT_EQ(std::string(std::getenv("PMIX_MCA_gds")), "hash");
}

TEST(PreferPmixHashDatastoreTest, LeavesTheUsersChoice) {
  for (const char* users : {"ds21", "^ds12", ""}) {
    ASSERT_EQ(::setenv("PMIX_MCA_gds", users, 1), 0);
    EXPECT_FALSE(PreferPmixHashDatastore()) << users;
    const char* v = std::getenv("PMIX_MCA_gds");
    ASSERT_NE(v, nullptr) << users;
    EXPECT_EQ(std::string(v), users);
  }
}

}  // namespace
}  // namespace ucp::exec
