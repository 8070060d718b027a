#pragma once
// The largest |a - b| of each tensor (as values) relative to that tensor's largest |b|, over all.
#include <algorithm>
#include <cmath>
#include <vector>

namespace mt::test {

inline double max_rel_diff(const std::vector<std::vector<double>>& a,
                           const std::vector<std::vector<double>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return INFINITY;
    double scale = 1e-300, err = 0;
    for (size_t j = 0; j < b[i].size(); ++j) {
      scale = std::max(scale, std::abs(b[i][j]));
      err = std::max(err, std::abs(a[i][j] - b[i][j]));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

}  // namespace mt::test
