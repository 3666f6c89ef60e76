#include "deepspeed/layout_math.h"

#include <algorithm>
#include <limits>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ucp::deepspeed {

const char* PaddingConventionName(PaddingConvention c) {
  return c == PaddingConvention::kPerRank ? "per-rank (DeepSpeed >= 0.16.4)" : "last-rank (DeepSpeed <= 0.16.3)";
}

absl::StatusOr<DsVersion> ParseDsVersion(const std::string& s) {
  DsVersion v;
  int* parts[3] = {&v.major, &v.minor, &v.patch};
  size_t i = 0;
  int n = 0;
  while (n < 3) {
    size_t start = i;
    int64_t x = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 6) x = x * 10 + (s[i++] - '0');
    if (i == start) break;
    *parts[n++] = static_cast<int>(x);
    if (i < s.size() && s[i] == '.' && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') {
      ++i;
    } else {
      break;
    }
  }
  if (n < 2) return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a DeepSpeed version (MAJOR.MINOR.PATCH)"));
  return v;
}

PaddingConvention PaddingConventionOf(const DsVersion& version, bool bf16_optimizer) {
  if (bf16_optimizer) return PaddingConvention::kLastRank;
  return version >= DsVersion{0, 16, 4} ? PaddingConvention::kPerRank : PaddingConvention::kLastRank;
}

int64_t ZeroGroupLayout::PaddingAs(int rank, PaddingConvention c) const {
  if (c == PaddingConvention::kLastRank) return rank == dp_ - 1 ? padded_numel_ - numel_ : 0;
  // The part of [rank * P, (rank + 1) * P) beyond the params.
  const int64_t p = partition_numel();
  const int64_t left = static_cast<int64_t>(rank) * p;
  if (numel_ <= left) return p;
  if (numel_ < left + p) return left + p - numel_;
  return 0;
}

ZeroGroupLayout ZeroGroupLayout::Make(std::vector<int64_t> numels, int dp, PaddingConvention convention) {
  ZeroGroupLayout g;
  g.dp_ = dp < 1 ? 1 : dp;
  g.convention_ = convention;
  g.numels_ = std::move(numels);
  g.starts_.reserve(g.numels_.size());
  int64_t offset = 0;
  for (int64_t n : g.numels_) {
    g.starts_.push_back(offset);
    offset += n;
  }
  g.numel_ = offset;
  // align_dense_tensors: pad to a multiple of nccl_start_alignment_factor (2) * dp.
  const int64_t alignment = 2 * static_cast<int64_t>(g.dp_);
  const int64_t remainder = g.numel_ % alignment;
  g.padded_numel_ = remainder == 0 ? g.numel_ : g.numel_ + (alignment - remainder);
  return g;
}

std::vector<ZeroFragment> ZeroGroupLayout::Fragments(int rank) const {
  const int64_t p = partition_numel();
  return FragmentsOfWindow(static_cast<int64_t>(rank) * p, p);
}

std::vector<ZeroFragment> ZeroGroupLayout::FragmentsOfWindow(int64_t part_start, int64_t size) const {
  std::vector<ZeroFragment> out;
  const int64_t part_end = part_start + size;
  for (int i = 0; i < num_params(); ++i) {
    const int64_t lp_start = starts_[i];
    const int64_t lp_end = lp_start + numels_[i];
    // _init_lp_to_hp_mapping: current_offset < partition_end and lp_end > partition_start.
    if (!(lp_start < part_end && lp_end > part_start)) continue;
    const int64_t frag_start = std::max(lp_start, part_start);
    const int64_t frag_end = std::min(lp_end, part_end);
    if (frag_start >= frag_end) continue;
    ZeroFragment f;
    f.param_index = i;
    f.param_offset = frag_start - lp_start;
    f.partition_offset = frag_start - part_start;
    f.numel = frag_end - frag_start;
    out.push_back(f);
  }
  return out;
}

std::vector<std::pair<int, ZeroFragment>> ZeroGroupLayout::FragmentsOfParam(int param_index) const {
  std::vector<std::pair<int, ZeroFragment>> out;
  const int64_t p = partition_numel();
  if (p == 0) return out;
  const int64_t lp_start = starts_[param_index];
  const int64_t lp_end = lp_start + numels_[param_index];
  if (lp_start == lp_end) return out;
  const int first = static_cast<int>(lp_start / p);
  const int last = static_cast<int>((lp_end - 1) / p);
  for (int rank = first; rank <= last && rank < dp_; ++rank) {
    const int64_t part_start = static_cast<int64_t>(rank) * p;
    const int64_t frag_start = std::max(lp_start, part_start);
    const int64_t frag_end = std::min(lp_end, part_start + p);
    ZeroFragment f;
    f.param_index = param_index;
    f.param_offset = frag_start - lp_start;
    f.partition_offset = frag_start - part_start;
    f.numel = frag_end - frag_start;
    out.emplace_back(rank, f);
  }
  return out;
}

std::vector<int> PartitionUniform(int num_items, int num_parts) {
  std::vector<int> parts(num_parts + 1, 0);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[p] = std::min(p, num_items);
    return parts;
  }
  const int chunk = num_items / num_parts;
  const int residual = num_items - chunk * num_parts;
  for (int p = 0; p <= num_parts; ++p) parts[p] = p * chunk;
  // for i in range(residual): parts[i + 1:] += 1
  for (int i = 0; i < residual; ++i) {
    for (int p = i + 1; p <= num_parts; ++p) parts[p] += 1;
  }
  return parts;
}

std::vector<int> PartitionBalanced(const std::vector<int64_t>& weights, int num_parts) {
  const int n = static_cast<int>(weights.size());
  const int m = num_parts;
  if (n <= m) return PartitionUniform(n, m);
  const double inf = std::numeric_limits<double>::infinity();
  auto idx = [m](int i, int j) { return static_cast<size_t>(i) * (m + 1) + j; };
  std::vector<double> dp_max((n + 1) * (m + 1), inf);
  std::vector<double> dp_min((n + 1) * (m + 1), inf);
  std::vector<double> dp_cost((n + 1) * (m + 1), inf);
  std::vector<int> position((n + 1) * (m + 1), 0);
  std::vector<double> prefix(n + 1, 0.0);
  // numpy.cumsum over the (integer) weights, then stored as float64.
  int64_t running = 0;
  for (int i = 0; i < n; ++i) {
    running += weights[i];
    prefix[i + 1] = static_cast<double>(running);
  }
  dp_max[idx(0, 0)] = 0;
  dp_cost[idx(0, 0)] = 0;
  for (int i = 1; i <= n; ++i) {
    for (int j = 1; j <= std::min(i, m); ++j) {
      for (int k = 0; k < i; ++k) {
        const double seg = prefix[i] - prefix[k];
        const double max_sum = std::max(dp_max[idx(k, j - 1)], seg);
        const double min_sum = std::min(dp_min[idx(k, j - 1)], seg);
        const double cost = max_sum - min_sum;
        if (dp_cost[idx(i, j)] >= cost) {
          dp_cost[idx(i, j)] = cost;
          dp_max[idx(i, j)] = max_sum;
          dp_min[idx(i, j)] = min_sum;
          position[idx(i, j)] = k;
        }
      }
    }
  }
  std::vector<int> parts = {n};
  for (int i = m; i >= 1; --i) parts.push_back(position[idx(parts.back(), i)]);
  std::reverse(parts.begin(), parts.end());
  return parts;
}

absl::StatusOr<std::vector<int>> PartitionLayers(const std::vector<PipelineLayerInfo>& layers, int pp,
                                                 const std::string& method_in) {
  if (pp < 1) return absl::InvalidArgumentError(absl::StrCat("pipeline degree must be >= 1, got ", pp));
  const std::string method = absl::AsciiStrToLower(method_in);
  const int n = static_cast<int>(layers.size());
  if (method == "uniform") return PartitionUniform(n, pp);
  if (method == "parameters") {
    std::vector<int64_t> w;
    w.reserve(n);
    for (const auto& l : layers) w.push_back(l.trainable_numel);
    return PartitionBalanced(w, pp);
  }
  if (absl::StartsWith(method, "type:")) {
    // DeepSpeed lower-cases the method and searches case-insensitively.
    const std::string pattern = method.substr(5);
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition method '", method_in, "': bad regular expression: ", e.what()));
    }
    std::vector<int64_t> w;
    w.reserve(n);
    for (const auto& l : layers) w.push_back(std::regex_search(l.type_name, re) ? 1 : 0);
    return PartitionBalanced(w, pp);
  }
  return absl::InvalidArgumentError(absl::StrCat("partition method '", method_in,
                                                 "' is not one of uniform, parameters, type:REGEX"));
}

std::vector<int> Zero3SubGroups(const std::vector<int64_t>& numels, int dp, int64_t sub_group_size) {
  if (numels.empty()) return {};
  int64_t total = 0;
  for (int64_t n : numels) total += Zero3PartitionNumel(n, dp);
  if (sub_group_size >= total) return {static_cast<int>(numels.size())};
  std::vector<int> out;
  int count = 0;
  int64_t local = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    ++count;
    local += Zero3PartitionNumel(numels[i], dp);
    if (local >= sub_group_size || i + 1 == numels.size()) {
      out.push_back(count);
      count = 0;
      local = 0;
    }
  }
  return out;
}

}  // namespace ucp::deepspeed
