// Dot products of a quantized weight row with a quantized activation row, by
// type and SIMD level: each type's scalar reference and AVX2 kernel are in its
// kquant_<type>.cpp (kquant_impl.h says how the two agree bit for bit).
#include "quantizers/kquant_impl.h"  // first: its pragma turns off FMA contraction for this file
#include <string>

#include "core/error.h"
#include "core/simd.h"
#include "quantizers/kquants.h"

namespace qf::kquants {
namespace {

using namespace detail;

// ---- dispatch ----------------------------------------------------------------

using DotFn = DotKernel;
constexpr uint32_t kMaxType = 32;

// The scalar references, the AVX2 kernels and the kernels of the avx512
// level (AVX-512 where a type has one, else AVX2), per type.
struct Table {
  DotFn ref[kMaxType] = {};
  DotFn avx2[kMaxType] = {};
  DotFn avx512[kMaxType] = {};
  uint32_t block[kMaxType] = {};
};

Table make_table() {
  namespace t = ggml_type;
  Table tb;
  auto set = [&](uint32_t type, DotFn r, DotFn f) {
    tb.ref[type] = r;
    tb.avx2[type] = f;
    tb.avx512[type] = f;
    tb.block[type] = ggml_type_info(type)->block_size;
  };
  set(t::F32, dot_f32_ref, dot_f32_avx2);
  set(t::F16, dot_f16_ref, dot_f16_avx2);
  set(t::BF16, dot_bf16_ref, dot_bf16_avx2);
  set(t::Q4_0, dot_q4_0_ref, dot_q4_0_avx2);
  set(t::Q4_1, dot_q4_1_ref, dot_q4_1_avx2);
  set(t::Q5_0, dot_q5_0_ref, dot_q5_0_avx2);
  set(t::Q5_1, dot_q5_1_ref, dot_q5_1_avx2);
  set(t::Q8_0, dot_q8_0_ref, dot_q8_0_avx2);
  set(t::Q2_K, dot_q2_k_ref, dot_q2_k_avx2);
  set(t::Q3_K, dot_q3_k_ref, dot_q3_k_avx2);
  set(t::Q4_K, dot_q4_k_ref, dot_q4_k_avx2);
  set(t::Q5_K, dot_q5_k_ref, dot_q5_k_avx2);
  set(t::Q6_K, dot_q6_k_ref, dot_q6_k_avx2);
  set(t::IQ4_NL, dot_iq4_nl_ref, dot_iq4_nl_ref);  // scalar at every level
  tb.avx512[t::Q4_K] = dot_q4_k_avx512;
  tb.avx512[t::Q5_K] = dot_q5_k_avx512;
  tb.avx512[t::Q6_K] = dot_q6_k_avx512;
  return tb;
}

const Table& table() {
  static const Table tb = make_table();
  return tb;
}

DotFn lookup(const DotFn* fns, uint32_t type, int64_t n) {
  const Table& tb = table();
  if (type >= kMaxType || !fns[type]) {
    const GgmlTypeInfo* info = ggml_type_info(type);
    throw unsupported("vec_dot", std::string("no dot product for ggml type ") +
                                     (info ? info->name : std::to_string(type)));
  }
  if (n < 0 || n % tb.block[type] != 0)
    throw invalid_input("vec_dot", std::string(ggml_type_info(type)->name) + " row length " + std::to_string(n) +
                                       " is not a multiple of the block size " + std::to_string(tb.block[type]));
  return fns[type];
}

const DotFn* kernels_at(SimdLevel level) {
  const Table& tb = table();
  switch (level) {
    case SimdLevel::Amx:
    case SimdLevel::Avx512: return tb.avx512;
    case SimdLevel::Avx2: return tb.avx2;
    case SimdLevel::Scalar: break;
  }
  return tb.ref;
}

}  // namespace

// The AVX2 kernels need AVX2 and F16C, which every level above scalar has;
// the AVX-512 ones need F, BW and VL, which the avx512 level has.
DotKernel dot_kernel(uint32_t type, int64_t n) { return lookup(kernels_at(qf::simd_level()), type, n); }

float vec_dot(uint32_t type, int64_t n, const void* w, const void* a) { return dot_kernel(type, n)(n, w, a); }

float vec_dot_ref(uint32_t type, int64_t n, const void* w, const void* a) {
  return lookup(table().ref, type, n)(n, w, a);
}

}  // namespace qf::kquants
