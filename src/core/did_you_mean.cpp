#include "core/did_you_mean.h"

#include <algorithm>
#include <cctype>

namespace qf {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

size_t edit_distance(const std::string& a0, const std::string& b0) {
  const std::string a = lower(a0), b = lower(b0);
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string closest_word(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 3;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d && d < std::max<size_t>(word.size(), 2)) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

}  // namespace qf
