#include "cli/progress.h"

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace ucp::cli {
namespace {

// Everything a printer wrote to a temporary stream.
class Captured {
 public:
  Captured() : f_(std::tmpfile()) {}
  ~Captured() { std::fclose(f_); }
  FILE* file() { return f_; }
  std::string Text() {
    std::fflush(f_);
    std::rewind(f_);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f_)) > 0) out.append(buf, n);
    return out;
  }

 private:
  FILE* f_;
};

ProgressEvent Event(const std::string& phase, int64_t done, int64_t total, int64_t units_done, int64_t units_total) {
  ProgressEvent e;
  e.phase = phase;
  e.bytes_done = done;
  e.bytes_total = total;
  e.units_done = units_done;
  e.units_total = units_total;
  return e;
}

TEST(ProgressTest, ParsesModes) {
  EXPECT_EQ(*ParseProgressMode("auto"), ProgressMode::kAuto);
  EXPECT_EQ(*ParseProgressMode("json"), ProgressMode::kJson);
  EXPECT_EQ(*ParseProgressMode("never"), ProgressMode::kNever);
  EXPECT_EQ(*ParseProgressMode("always"), ProgressMode::kAlways);
  auto bad = ParseProgressMode("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--progress=loud"), std::string::npos);
}

TEST(ProgressTest, FormatShowsBytesRateAndEta) {
  // 1 GB of 4 GB in 2 s: 500 MB/s, 6 s left.
  const std::string line = FormatProgress(Event("write", 1000000000, 4000000000, 3, 12), 2.0);
  EXPECT_NE(line.find("write"), std::string::npos) << line;
  EXPECT_NE(line.find("1.00 GB / 4.00 GB"), std::string::npos) << line;
  EXPECT_NE(line.find("25%"), std::string::npos) << line;
  EXPECT_NE(line.find("500 MB/s"), std::string::npos) << line;
  EXPECT_NE(line.find("3/12 units"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 6s"), std::string::npos) << line;
}

TEST(ProgressTest, JsonLineHasEveryField) {
  const std::string j = ProgressJson("convert", Event("write", 50, 100, 1, 2), 1.0);
  for (const char* key : {"\"command\": \"convert\"", "\"phase\": \"write\"", "\"bytes_done\": 50",
                          "\"bytes_total\": 100", "\"units_done\": 1", "\"units_total\": 2", "\"elapsed_s\": ",
                          "\"mb_per_s\": ", "\"eta_s\": "}) {
    EXPECT_NE(j.find(key), std::string::npos) << key << " in " << j;
  }
}

TEST(ProgressTest, NotATerminalPrintsOneLinePerPhase) {
  Captured out;
  {
    ProgressPrinter p("reshard", ProgressMode::kAuto, out.file(), /*is_tty=*/0);
    auto cb = p.Callback();
    ASSERT_TRUE(cb);
    for (int i = 1; i <= 5; ++i) cb(Event("write", i * 10, 50, i, 5));
    cb(Event("commit", 1, 1, 1, 1));
  }
  const std::string text = out.Text();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_NE(text.find("[reshard] write"), std::string::npos) << text;
  EXPECT_NE(text.find("[reshard] commit"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
}

TEST(ProgressTest, TerminalRefreshesOneLine) {
  Captured out;
  {
    ProgressPrinter p("convert", ProgressMode::kAuto, out.file(), /*is_tty=*/1);
    auto cb = p.Callback();
    cb(Event("write", 10, 20, 1, 2));
    cb(Event("write", 20, 20, 2, 2));
  }
  const std::string text = out.Text();
  EXPECT_NE(text.find("\r[convert] write"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
}

TEST(ProgressTest, JsonEndsEachPhaseWithItsLastEvent) {
  Captured out;
  {
    ProgressPrinter p("convert", ProgressMode::kJson, out.file(), 0);
    auto cb = p.Callback();
    cb(Event("write", 1, 3, 1, 3));
    cb(Event("write", 2, 3, 2, 3));  // within 0.5 s of the first: not printed
    cb(Event("write", 3, 3, 3, 3));
  }
  const std::string text = out.Text();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_NE(text.find("\"units_done\": 3"), std::string::npos) << text;
}

TEST(ProgressTest, NeverHasNoCallback) {
  ProgressPrinter p("convert", ProgressMode::kNever, stderr, 1);
  EXPECT_FALSE(p.Callback());
}

}  // namespace
}  // namespace ucp::cli
