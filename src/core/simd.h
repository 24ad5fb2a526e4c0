// The one SIMD switch of the library. Every CPU kernel that has SIMD versions
// (the runtime's float and int8 kernels in runtime/cpu/, the GGUF block dot
// products in quantizers/kquants) asks simd_level() at each call, so
// set_simd_level() takes effect everywhere at once.
//
// The level starts as the best the CPU supports, or as QF_SIMD in the
// environment says:
//   QF_SIMD unset or empty    the best level of this CPU
//   QF_SIMD=scalar|avx2|avx512|amx that level; a level above what the CPU supports
//                             is clamped to the best one, with one note on stderr
//   anything else             qf::Error (Usage): simd_level() throws, naming
//                             the allowed values
// The CLI reads the level before running a command, so a bad value ends every
// command with exit code 2. Reports (eval --json, bench) print the level in use,
// which is the clamped one.
#pragma once

#include <string>
#include <string_view>

namespace qf {

// Amx is Avx512 plus AMX tiles (bf16 dot products) for the GEMMs that have
// a tile kernel (runtime/cpu/amx_gemm.h); every other kernel runs its
// AVX-512 version there. Compare levels with >= Avx512 for "AVX-512 kernels".
enum class SimdLevel { Scalar = 0, Avx2 = 1, Avx512 = 2, Amx = 3 };

// The level in use. The first call reads QF_SIMD (see above); throws
// qf::Error (Usage) for a value that names no level.
SimdLevel simd_level();

// The best level this CPU supports: Avx512 needs AVX-512 F, BW and VL on top of
// everything Avx2 needs (AVX2, FMA, F16C); Amx needs Avx512, AVX512-BF16,
// AMX-TILE and AMX-BF16, the OS saving the tile state, and Linux granting the
// process the tile data (the first call asks for it).
SimdLevel best_simd_level();

// Whether the CPU has AVX512-BF16 (VDPBF16PS: pairs of bf16 products summed
// into f32) on top of the Avx512 level; the bf16 calibration kernels use it
// at the Avx512 and Amx levels.
bool cpu_has_avx512_bf16();

// Forces a level, clamped to best_simd_level() (a kernel the CPU cannot run is
// never chosen). Affects every kernel, in every thread, from the next call.
void set_simd_level(SimdLevel level);

// "scalar", "avx2", "avx512", "amx".
const char* simd_level_name(SimdLevel level);

// The level a QF_SIMD value names: exactly "scalar", "avx2", "avx512" or "amx".
// Anything else throws qf::Error (Usage) "QF_SIMD: unknown SIMD level '...'
// (allowed: scalar|avx2|avx512|amx)". Does not clamp.
SimdLevel parse_simd_level(std::string_view text);

// The level simd_level() starts at for a QF_SIMD value (nullptr: unset) on a
// CPU whose best level is `best`; *clamped tells whether the value asked for
// more than `best`. Throws as parse_simd_level does.
SimdLevel initial_simd_level(const char* qf_simd, SimdLevel best, bool* clamped = nullptr);

}  // namespace qf
