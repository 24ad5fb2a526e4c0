// Element types and bit-exact scalar conversions.
//
// Rounding is round-to-nearest-even everywhere. The 8-bit floats follow the
// OCP 8-bit float spec as PyTorch implements it:
//   f8_e4m3fn: bias 7, no infinities, 0x7f/0xff are NaN, max finite 448;
//              out-of-range finite values saturate to +-448, +-inf too
//              (saturating conversion, as NVIDIA's cvt.satfinite and every
//              quantizer in the field use), NaN stays NaN (0x7f, sign kept).
//   f8_e5m2:   bias 15, IEEE-like with inf (0x7c) and NaN; non-saturating:
//              values that round past 57344 become inf, like a narrowing IEEE cast.
//   e2m1 (FP4): 1 sign, 2 exponent, 1 mantissa bits; values 0, 0.5, 1, 1.5, 2, 3, 4, 6;
//              no inf/NaN; saturates to +-6; NaN maps to +6 | sign (as NVFP4 packers do).
// Codes are stored in the low bits of a uint8_t (e2m1: low nibble).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/bf16.h"
#include "core/e2m1.h"
#include "core/f16.h"
#include "core/f8_e4m3.h"
#include "core/f8_e5m2.h"

namespace qf {

enum class DType : uint8_t {
  F32, F16, BF16, F8_E4M3, F8_E5M2, E2M1, I8, U8, I32, I64, F64, BOOL, I16, U16, U32, U64,
};

// Size in bytes of one element; E2M1 reports 1 here (two codes pack into a byte
// only inside packed formats, which carry their own byte counts).
size_t dtype_size(DType t);
// Canonical short name: "f32", "f16", "bf16", "f8_e4m3", "f8_e5m2", "e2m1", "i8", ...
const char* dtype_name(DType t);
// safetensors dtype string ("F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I8", "U8", "I32", ...).
const char* safetensors_dtype_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view s);
bool dtype_is_float(DType t);

// ---- scalar conversions (bit-exact) ---------------------------------------
// The floats are the shared host/device functions of f16.h, bf16.h,
// f8_e4m3.h, f8_e5m2.h and e2m1.h (core/hd.h), named here in qf as well.
using hd::f16_to_f32;     // float f16_to_f32(uint16_t)
using hd::f32_to_f16;     // uint16_t f32_to_f16(float)
using hd::bf16_to_f32;
using hd::f32_to_bf16;
using hd::f8e4m3_to_f32;
using hd::f32_to_f8e4m3;  // saturating, RNE
using hd::f8e5m2_to_f32;
using hd::f32_to_f8e5m2;  // RNE, overflow to inf
using hd::e2m1_to_f32;    // low nibble
using hd::f32_to_e2m1;    // saturating, RNE
// Integers: round half to even, then saturate to the type's range; NaN -> 0.
int8_t f32_to_i8(float f);
uint8_t f32_to_u8(float f);
int32_t f32_to_i32(float f);

// Convert `n` elements between any two of F32/F16/BF16/F8_E4M3/F8_E5M2/E2M1/I8/U8/I32
// (E2M1 one code per byte). Throws qf::Error for unsupported pairs.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace qf
