#include "quantizers/mix_knapsack.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace qf::mixed {
namespace {

void check_items(const std::vector<Item>& items) {
  for (const Item& it : items) {
    if (it.options.empty()) throw Error(ErrorKind::InvalidInput, "size allocation: " + it.name + " has no option");
    if (it.options.size() > 65535) throw Error(ErrorKind::InvalidInput, "size allocation: " + it.name + " has too many options");
    for (const Option& o : it.options)
      if (!std::isfinite(o.cost) || o.cost < 0)
        throw Error(ErrorKind::InvalidInput, "size allocation: " + it.name + " has a cost that is negative or not finite");
  }
}

uint64_t min_bytes(const Item& it) {
  uint64_t m = it.options.front().bytes;
  for (const Option& o : it.options) m = std::min(m, o.bytes);
  return m;
}

// The smallest option, cheapest among equals: the answer when nothing fits.
int smallest_option(const Item& it) {
  int best = 0;
  for (size_t o = 1; o < it.options.size(); ++o) {
    const Option& a = it.options[o];
    const Option& b = it.options[static_cast<size_t>(best)];
    if (a.bytes < b.bytes || (a.bytes == b.bytes && a.cost < b.cost)) best = static_cast<int>(o);
  }
  return best;
}

Allocation totals(const std::vector<Item>& items, std::vector<int> choice) {
  Allocation a;
  a.choice = std::move(choice);
  for (size_t i = 0; i < items.size(); ++i) {
    const Option& o = items[i].options[static_cast<size_t>(a.choice[i])];
    a.bytes += o.bytes;
    a.cost += o.cost;
  }
  return a;
}

}  // namespace

std::vector<Allocation> solve_exact_curve(const std::vector<Item>& items, const std::vector<uint64_t>& budgets,
                                          uint64_t max_cells) {
  check_items(items);
  uint64_t base = 0, range = 0, g = 0;
  for (const Item& it : items) {
    const uint64_t m = min_bytes(it);
    base += m;
    uint64_t top = 0;
    for (const Option& o : it.options) {
      g = std::gcd(g, o.bytes - m);
      top = std::max(top, o.bytes - m);
    }
    range += top;
  }
  const uint64_t max_budget = budgets.empty() ? 0 : *std::max_element(budgets.begin(), budgets.end());
  std::vector<Allocation> out(budgets.size());
  std::vector<int> smallest(items.size());
  for (size_t i = 0; i < items.size(); ++i) smallest[i] = smallest_option(items[i]);
  if (max_budget < base || g == 0) {
    // Nothing fits anywhere, or every item's options have one size.
    std::vector<int> cheapest(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      int best = 0;
      for (size_t o = 1; o < items[i].options.size(); ++o)
        if (items[i].options[o].cost < items[i].options[static_cast<size_t>(best)].cost) best = static_cast<int>(o);
      cheapest[i] = best;
    }
    for (size_t b = 0; b < budgets.size(); ++b) {
      out[b] = totals(items, g == 0 ? cheapest : smallest);
      out[b].feasible = budgets[b] >= base;
    }
    return out;
  }
  // Columns: extra bytes above every item's smallest option, in units.
  uint64_t unit = g;
  const uint64_t extra = std::min(max_budget - base, range);
  const uint64_t n = std::max<uint64_t>(1, items.size());
  bool exact = true;
  if ((extra / unit + 1) * n > max_cells) {
    const uint64_t cols = std::max<uint64_t>(2, max_cells / n);
    unit = std::max(unit, (extra + cols - 2) / (cols - 1));
    exact = false;
  }
  const uint64_t cap = extra / unit;
  const size_t width = static_cast<size_t>(cap + 1);
  std::vector<std::vector<uint32_t>> w(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t m = min_bytes(items[i]);
    for (const Option& o : items[i].options) {
      const uint64_t d = o.bytes - m;
      const uint64_t units = exact ? d / unit : (d + unit - 1) / unit;
      w[i].push_back(static_cast<uint32_t>(std::min<uint64_t>(units, cap + 1)));
    }
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> prev(width, 0.0), cur(width);
  std::vector<uint16_t> pick(items.size() * width);
  for (size_t i = 0; i < items.size(); ++i) {
    uint16_t* p = pick.data() + i * width;
    for (size_t c = 0; c < width; ++c) {
      double best = kInf;
      uint16_t bo = 0;
      for (size_t o = 0; o < items[i].options.size(); ++o) {
        if (w[i][o] > c) continue;
        const double v = prev[c - w[i][o]] + items[i].options[o].cost;
        // Ties: the smaller option.
        if (v < best || (v == best && items[i].options[o].bytes < items[i].options[bo].bytes)) best = v, bo = static_cast<uint16_t>(o);
      }
      cur[c] = best;
      p[c] = bo;
    }
    std::swap(prev, cur);
  }
  for (size_t b = 0; b < budgets.size(); ++b) {
    if (budgets[b] < base) {
      out[b] = totals(items, smallest);
      out[b].feasible = false;
      continue;
    }
    size_t c = static_cast<size_t>(std::min<uint64_t>((budgets[b] - base) / unit, cap));
    std::vector<int> choice(items.size());
    for (size_t i = items.size(); i-- > 0;) {
      const uint16_t o = pick[i * width + c];
      choice[i] = o;
      c -= w[i][o];
    }
    out[b] = totals(items, std::move(choice));
    out[b].feasible = true;
    out[b].exact = exact;
    out[b].unit = unit;
  }
  return out;
}

Allocation solve_exact(const std::vector<Item>& items, uint64_t budget, uint64_t max_cells) {
  return solve_exact_curve(items, {budget}, max_cells).front();
}

Allocation solve_lagrangian(const std::vector<Item>& items, uint64_t budget) {
  check_items(items);
  const auto choose = [&](double lambda) {
    std::vector<int> choice(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& opts = items[i].options;
      size_t best = 0;
      for (size_t o = 1; o < opts.size(); ++o) {
        const double a = opts[o].cost + lambda * static_cast<double>(opts[o].bytes);
        const double b = opts[best].cost + lambda * static_cast<double>(opts[best].bytes);
        if (a < b || (a == b && opts[o].bytes < opts[best].bytes)) best = o;
      }
      choice[i] = static_cast<int>(best);
    }
    return totals(items, std::move(choice));
  };
  Allocation a = choose(0.0);
  if (a.bytes <= budget) {
    a.feasible = true;
    return a;
  }
  // Bisect lambda on a log scale: the chosen bytes do not increase with it.
  double lo = 1e-300, hi = 1.0;
  while (choose(hi).bytes > budget && hi < 1e300) hi *= 1e6;
  Allocation best = choose(hi);
  if (best.bytes > budget) {
    std::vector<int> smallest(items.size());
    for (size_t i = 0; i < items.size(); ++i) smallest[i] = smallest_option(items[i]);
    Allocation s = totals(items, std::move(smallest));
    s.feasible = s.bytes <= budget;
    return s;
  }
  best.lambda = hi;
  for (int it = 0; it < 200; ++it) {
    const double mid = std::sqrt(lo * hi);
    if (!(mid > lo && mid < hi)) break;
    Allocation m = choose(mid);
    if (m.bytes <= budget) {
      hi = mid;
      best = std::move(m);
      best.lambda = mid;
    } else {
      lo = mid;
    }
  }
  best.feasible = true;
  return best;
}

double rank_correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = a.size();
  if (n != b.size() || n < 2) return std::nan("");
  const auto ranks = [n](const std::vector<double>& v) {
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return v[x] < v[y]; });
    std::vector<double> r(n);
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j + 1 < n && v[idx[j + 1]] == v[idx[i]]) ++j;
      const double avg = 0.5 * static_cast<double>(i + j) + 1.0;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = avg;
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  double ma = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) ma += ra[i], mb += rb[i];
  ma /= static_cast<double>(n), mb /= static_cast<double>(n);
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  if (saa == 0 || sbb == 0) return std::nan("");
  return sab / std::sqrt(saa * sbb);
}

}  // namespace qf::mixed
