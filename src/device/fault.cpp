#include "device/fault.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace qf::device {

namespace {

struct Plan {
  std::mutex mu;
  bool read = false;
  bool armed = false;
  FaultSite site = FaultSite::Alloc;
  uint64_t nth = 0;
  uint64_t seen[2] = {0, 0};
};

Plan& plan() {
  static Plan p;
  return p;
}

// "alloc:N" or "blas:N" with N >= 1; "" disarms.
void parse(Plan& p, const std::string& v) {
  p.armed = false, p.seen[0] = p.seen[1] = 0, p.read = true;
  if (v.empty()) return;
  const size_t colon = v.find(':');
  const std::string site = v.substr(0, colon), n = colon == std::string::npos ? "" : v.substr(colon + 1);
  char* end = nullptr;
  const unsigned long long k = n.empty() ? 0 : std::strtoull(n.c_str(), &end, 10);
  if ((site != "alloc" && site != "blas") || n.empty() || *end != '\0' || k == 0 || n[0] == '-')
    throw Error(ErrorKind::Usage, "QF_DEVICE_FAULT: '" + printable_text(v) + "' is not alloc:N or blas:N (N >= 1)");
  p.site = site == "alloc" ? FaultSite::Alloc : FaultSite::Blas;
  p.nth = k;
  p.armed = true;
}

std::atomic<uint64_t> g_contexts{0};

}  // namespace

bool inject_fault(FaultSite site) {
  Plan& p = plan();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.read) {
    const char* v = std::getenv("QF_DEVICE_FAULT");
    parse(p, v ? v : "");
  }
  if (!p.armed || p.site != site) return false;
  return ++p.seen[static_cast<int>(site)] == p.nth;
}

void set_fault_plan(const std::string& v) {
  Plan& p = plan();
  std::lock_guard<std::mutex> lock(p.mu);
  parse(p, v);
}

uint64_t blas_contexts_created() { return g_contexts.load(); }
void count_blas_context() { g_contexts.fetch_add(1); }

}  // namespace qf::device
