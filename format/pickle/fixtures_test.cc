// Every data.pkl inside every .pt of the DeepSpeed 0.14.4 fixtures: it must
// parse, and Pickle(Unpickle(x)) must re-read to the same tree. The writer
// mirrors CPython's protocol 2 pickler, so the bytes must even be identical.
#include <string>

#include "format/pickle/reader.h"
#include "format/pickle/test_util.h"
#include "format/pickle/writer.h"
#include "gtest/gtest.h"

namespace ucp::pickle {
namespace {

TEST(FixturesTest, EveryPickleReadsAndRoundTrips) {
  absl::StatusOr<std::string> dir = testing::FixturesDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::vector<std::string> files = testing::FindFiles(*dir, ".pt");
  ASSERT_GT(files.size(), 2000u) << "expected the 2209 .pt files of the fixtures";
  size_t identical = 0;
  size_t objects_seen = 0;
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    absl::StatusOr<std::string> zip = ReadFileToString(path);
    ASSERT_TRUE(zip.ok()) << zip.status();
    absl::StatusOr<std::string> pkl = testing::ReadStoredZipMember(*zip, "/data.pkl");
    ASSERT_TRUE(pkl.ok()) << pkl.status();
    absl::StatusOr<ValuePtr> root = Unpickle(*pkl);
    ASSERT_TRUE(root.ok()) << root.status();
    absl::StatusOr<std::string> again = Pickle(**root);
    ASSERT_TRUE(again.ok()) << again.status();
    absl::StatusOr<ValuePtr> reread = Unpickle(*again);
    ASSERT_TRUE(reread.ok()) << reread.status();
    EXPECT_TRUE(DeepEqual(**root, **reread));
    EXPECT_EQ(*again, *pkl) << "the re-pickled bytes differ from what torch wrote";
    identical += *again == *pkl;
    objects_seen += (*root)->is(Kind::kDict);
  }
  EXPECT_EQ(identical, files.size());
  EXPECT_EQ(objects_seen, files.size() - testing::FindFiles(*dir, "step.pt").size())
      << "every file but the universal step.pt holds a dict";
}

}  // namespace
}  // namespace ucp::pickle
