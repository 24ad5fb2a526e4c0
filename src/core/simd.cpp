#include "core/simd.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace qf {

// F16C from CPUID: clang before 16 does not accept "f16c" in __builtin_cpu_supports.
static bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}

// AMX tiles with bf16 dot products, AVX512-BF16 conversions, and the
// kernel's permission to use the tile state: CPUID.(7,0):EDX bits 22
// (AMX-BF16) and 24 (AMX-TILE), CPUID.(7,1):EAX bit 5 (AVX512-BF16), the OS
// saving the tile state (XCR0 bits 17 and 18), and Linux granting this
// process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; the
// grant holds for every thread of the process).
static bool has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx & (1u << 22)) || !(edx & (1u << 24))) return false;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  if (!__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) || !(a1 & (1u << 5))) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

bool cpu_has_avx512_bf16() {
  static const bool has = [] {
    if (best_simd_level() < SimdLevel::Avx512) return false;
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    return __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
  }();
  return has;
}

SimdLevel best_simd_level() {
  static const SimdLevel best = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    // The AVX-512 level also runs AVX2 kernels (those with no AVX-512 version),
    // and the AMX level runs the AVX-512 kernels but for the GEMMs it has.
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
      return has_amx_bf16() ? SimdLevel::Amx : SimdLevel::Avx512;
    return avx2 ? SimdLevel::Avx2 : SimdLevel::Scalar;
  }();
  return best;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Scalar: return "scalar";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
    case SimdLevel::Amx: return "amx";
  }
  return "?";
}

SimdLevel parse_simd_level(std::string_view text) {
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Amx})
    if (text == simd_level_name(l)) return l;
  throw Error(ErrorKind::Usage, "QF_SIMD: unknown SIMD level '" + printable_text(text) + "' (allowed: scalar|avx2|avx512|amx)");
}

SimdLevel initial_simd_level(const char* qf_simd, SimdLevel best, bool* clamped) {
  if (clamped) *clamped = false;
  if (!qf_simd || !*qf_simd) return best;
  const SimdLevel want = parse_simd_level(qf_simd);
  if (want <= best) return want;
  if (clamped) *clamped = true;
  return best;
}

namespace {

// -1 until the first simd_level() (or set_simd_level()) call.
std::atomic<int> g_level{-1};

SimdLevel level_from_env() {
  const char* env = std::getenv("QF_SIMD");
  const SimdLevel best = best_simd_level();
  bool clamped = false;
  const SimdLevel level = initial_simd_level(env, best, &clamped);  // throws for an unknown value
  if (clamped) {
    static std::once_flag noted;
    std::call_once(noted, [&] {
      std::fprintf(stderr, "quantforge: note: QF_SIMD=%s but this CPU supports at most %s; using %s\n", env,
                   simd_level_name(best), simd_level_name(best));
    });
  }
  return level;
}

}  // namespace

SimdLevel simd_level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l < 0) {
    // Racing first calls all compute the same value; a bad QF_SIMD throws
    // here on every call until set_simd_level() overrides it.
    const int want = static_cast<int>(level_from_env());
    int expected = -1;
    g_level.compare_exchange_strong(expected, want, std::memory_order_relaxed);
    l = g_level.load(std::memory_order_relaxed);
  }
  return static_cast<SimdLevel>(l);
}

void set_simd_level(SimdLevel level) {
  g_level.store(static_cast<int>(std::min(level, best_simd_level())), std::memory_order_relaxed);
}

}  // namespace qf
