// QF_HD marks a function that compiles both as host C++ and as CUDA device
// code, so that the per-element math of every number format (the headers
// f16.h, bf16.h, f8_e4m3.h, f8_e5m2.h, e2m1.h here; int_quant.h, nvfp4.h and
// kquant_blocks.h in quantizers/) is written once and shared by the CPU code,
// the CUDA kernels and the tests.
//
// Rules for a QF_HD function: no exceptions, no allocation, no std:: call that
// has no device version (std::min, std::bit_width, std::bit_cast ... are not
// usable: nvcc compiles CUDA sources as C++17 without relaxed constexpr). The
// few operations that differ between host and device live here, with one
// definition per side, chosen by __CUDA_ARCH__ (defined only in nvcc's
// device pass).
#pragma once

#include <cstdint>
#include <cstring>
#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#if defined(__CUDACC__)
#define QF_HD __host__ __device__
#else
#define QF_HD
#endif

namespace qf::hd {

// The bits of an f32 and back, without undefined behaviour on either side.
QF_HD inline uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

QF_HD inline float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Index of the highest set bit of m (m != 0): std::bit_width(m) - 1.
QF_HD inline int top_bit(uint32_t m) {
#if defined(__CUDA_ARCH__)
  return 31 - __clz(m);
#else
  return 31 - __builtin_clz(m);
#endif
}

// |x| (the sign bit cleared) and whether x is finite, from the bits.
QF_HD inline float abs_f32(float x) { return float_of(bits_of(x) & 0x7fffffffu); }
QF_HD inline bool is_finite(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }

QF_HD inline uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }
QF_HD inline int max_int(int a, int b) { return a > b ? a : b; }

// x rounded to an integer, ties to even. On the host this is std::nearbyint,
// as the quantizers have always used (it follows the current rounding mode,
// which nothing in quantforge changes); the device's rintf always rounds to
// nearest even, the same answer under that default.
QF_HD inline float round_half_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

// a * b + c and a * b - c rounded twice, never fused into one FMA. The block
// decoders use them to give the floats ggml's C code gives (it is compiled
// without contraction): nvcc fuses a*b+c by default, and an FMA rounds once.
// On the host they are plain expressions: the library is built for baseline
// x86-64 (no FMA instructions outside the SIMD kernels' target attributes),
// and kquants.cpp also turns contraction off.
QF_HD inline float mul_add_unfused(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

QF_HD inline float mul_sub_unfused(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__fmul_rn(a, b), c);
#else
  return a * b - c;
#endif
}

// e^x in f32: std::exp on the host, the CUDA math library's expf (within
// 2 ulp of it) on the device.
QF_HD inline float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

// The square root in double (correctly rounded on both sides).
QF_HD inline double sqrt_f64(double x) {
#if defined(__CUDA_ARCH__)
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// pow(a, b) in double: std::pow on the host, the CUDA math library's pow
// (within 2 ulp of it) on the device.
QF_HD inline double pow_f64(double a, double b) {
#if defined(__CUDA_ARCH__)
  return pow(a, b);
#else
  return std::pow(a, b);
#endif
}

// a * b + c in double, rounded twice (never one FMA): GPTQ's row updates,
// so that the CPU and the device form the same values.
QF_HD inline double mul_add_unfused(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(__dmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

}  // namespace qf::hd
