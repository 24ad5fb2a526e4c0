#include "eval/gate_bounds.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "core/error.h"

namespace qf::eval {

std::string gate_bound_rule(GateBound b) {
  switch (b) {
    case GateBound::PplDelta: return "must be a finite number";
    case GateBound::PplRatio: return "must be a finite number > 0";
    case GateBound::Kld: return "must be a finite number >= 0";
  }
  return "must be a finite number";
}

bool gate_bound_valid(GateBound b, double v) {
  if (!std::isfinite(v)) return false;
  switch (b) {
    case GateBound::PplDelta: return true;
    case GateBound::PplRatio: return v > 0;
    case GateBound::Kld: return v >= 0;
  }
  return false;
}

namespace {

// The shortest text that reads back as v ("-1", "0.5", "nan", "inf").
std::string shown(double v) {
  char buf[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (!std::isfinite(v) || std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void check_one(GateBound b, const std::optional<double>& v, const std::string& name) {
  if (v && !gate_bound_valid(b, *v))
    throw Error(ErrorKind::Usage, name + ": " + gate_bound_rule(b) + ", got '" + shown(*v) + "'");
}

}  // namespace

void check_gate_bounds(const Gate& g, const GateBoundNames& names) {
  check_one(GateBound::PplDelta, g.max_ppl_delta, names.max_ppl_delta);
  check_one(GateBound::PplRatio, g.max_ppl_ratio, names.max_ppl_ratio);
  check_one(GateBound::Kld, g.max_kld, names.max_kld);
}

}  // namespace qf::eval
