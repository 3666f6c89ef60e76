#include "base/leftovers.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ucp {
namespace {

// Records its destruction in `log`.
struct Noted {
  Noted(std::vector<std::string>* log, std::string name) : log(log), name(std::move(name)) {}
  ~Noted() { log->push_back(name); }
  std::vector<std::string>* log;
  std::string name;
};

// One test: LeaveLeftoversToExit cannot be undone in a process, so the
// library behaviour is checked before it is called.
TEST(LeftoversTest, FreedLastFirstUntilLeftToExitThenKept) {
  std::vector<std::string> log;
  {
    Leftovers left;
    left.Keep(std::make_unique<Noted>(&log, "state"));
    left.Keep(std::shared_ptr<Noted>(new Noted(&log, "plan")));
    left.Keep(std::unique_ptr<Noted>());  // nothing to keep
    EXPECT_EQ(left.size(), 2u);
    EXPECT_TRUE(log.empty());
  }
  EXPECT_EQ(log, (std::vector<std::string>{"plan", "state"}));

  EXPECT_FALSE(LeftoversLeftToExit());
  LeaveLeftoversToExit();
  EXPECT_TRUE(LeftoversLeftToExit());
  log.clear();
  std::weak_ptr<Noted> watch;
  {
    Leftovers left;
    auto shared = std::make_shared<Noted>(&log, "kept");
    watch = shared;
    left.Keep(std::move(shared));
  }
  EXPECT_TRUE(log.empty());       // not destroyed
  EXPECT_FALSE(watch.expired());  // and still owned (reachable, not leaked)
  // It is never destroyed: point it at a log that outlives this test.
  static std::vector<std::string>* never_read = new std::vector<std::string>();
  watch.lock()->log = never_read;
}

}  // namespace
}  // namespace ucp
