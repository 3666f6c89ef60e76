#include "base/cluster.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ucp {
namespace {

// "CODE MESSAGE"
std::string Encode(const absl::Status& s) {
  return absl::StrCat(static_cast<int>(s.code()), " ", s.message());
}

absl::Status Decode(absl::string_view text) {
  const size_t space = text.find(' ');
  int code = static_cast<int>(absl::StatusCode::kInternal);
  if (space == absl::string_view::npos || !absl::SimpleAtoi(text.substr(0, space), &code)) {
    return absl::InternalError(absl::StrCat("a rank sent an unreadable status: ", text));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), text.substr(space + 1));
}

}  // namespace

absl::Status AgreeOnStatus(Cluster& cluster, const absl::Status& mine) {
  absl::StatusOr<std::vector<std::string>> all = cluster.Gather(Encode(mine), 0);
  if (!all.ok()) return all.status();
  std::string verdict;
  if (cluster.rank() == 0) {
    verdict = Encode(absl::OkStatus());
    for (size_t r = 0; r < all->size(); ++r) {
      absl::Status s = Decode((*all)[r]);
      if (s.ok()) continue;
      verdict = Encode(r == 0 ? s : absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message())));
      break;
    }
  }
  if (absl::Status b = cluster.Broadcast(&verdict, 0); !b.ok()) return b;
  return Decode(verdict);
}

}  // namespace ucp
