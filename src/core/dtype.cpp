#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace qf {

namespace {

struct DTypeInfo {
  size_t size;
  const char* name;
  const char* st_name;
  bool is_float;
};

// Indexed by the enum value; the static_assert below keeps the two in step.
constexpr std::array<DTypeInfo, 16> kInfo = {{
    {4, "f32", "F32", true},
    {2, "f16", "F16", true},
    {2, "bf16", "BF16", true},
    {1, "f8_e4m3", "F8_E4M3", true},
    {1, "f8_e5m2", "F8_E5M2", true},
    // safetensors has no one-code-per-byte fp4 dtype; "F4" is what newer writers
    // call fp4, but those pack two codes per byte, so the name is only a label
    // here and dtype_from_safetensors("F4") deliberately answers nullopt.
    {1, "e2m1", "F4", true},
    {1, "i8", "I8", false},
    {1, "u8", "U8", false},
    {4, "i32", "I32", false},
    {8, "i64", "I64", false},
    {8, "f64", "F64", true},
    {1, "bool", "BOOL", false},
    {2, "i16", "I16", false},
    {2, "u16", "U16", false},
    {4, "u32", "U32", false},
    {8, "u64", "U64", false},
}};
static_assert(static_cast<size_t>(DType::U64) + 1 == kInfo.size());

const DTypeInfo& info(DType t) {
  const auto i = static_cast<size_t>(t);
  if (i >= kInfo.size()) throw Error(ErrorKind::Internal, "unknown DType value " + std::to_string(i));
  return kInfo[i];
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr uint32_t kF32QuietNan = 0x7fc00000u;

// x / 2^s rounded to nearest, ties to even; 1 <= s <= 31.
uint32_t shift_rne(uint32_t x, int s) {
  const uint32_t q = x >> s, rem = x & ((1u << s) - 1), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Rounds a finite f32 magnitude (bit pattern, sign clear) to a binary format with
// `man` mantissa bits and exponent bias `bias`, returning its magnitude code.
// In the normal range the f32 bit pattern is the target code shifted left, so
// rebiasing and one RNE shift do it, and a mantissa carry bumps the exponent
// exactly as it should. The result may lie past the format's largest finite
// code; callers apply their overflow rule (saturate or inf) to it.
uint32_t round_magnitude(uint32_t a, int man, int bias) {
  const int ef = static_cast<int>(a >> 23);
  if (ef >= 128 - bias) return shift_rne(a - (static_cast<uint32_t>(127 - bias) << 23), 23 - man);
  // Subnormal in the target: count steps of 2^(1 - bias - man).
  const uint32_t sig = (a & 0x7fffffu) | (ef ? 0x800000u : 0u);
  const int s = 151 - bias - man - std::max(ef, 1);
  return s > 25 ? 0u : shift_rne(sig, s);  // sig < 2^24, so s > 24 is below half a step
}

// f32 bits of a finite magnitude code. Only for formats whose subnormals are
// f32 normals (f16 and the 8/4-bit floats; not bf16).
uint32_t expand_magnitude(uint32_t mag, int man, int bias) {
  const uint32_t e = mag >> man, m = mag & ((1u << man) - 1);
  if (e != 0) return ((e + 127 - bias) << 23) | (m << (23 - man));
  if (m == 0) return 0;
  const int p = static_cast<int>(std::bit_width(m)) - 1;  // leading one becomes the implicit bit
  return (static_cast<uint32_t>(p + 128 - bias - man) << 23) | ((m ^ (1u << p)) << (23 - p));
}

// Round half to even, then saturate; NaN -> 0. Explicit rather than nearbyint()
// so a caller's fesetround() cannot change the answer.
template <typename T>
T to_int(float f) {
  if (std::isnan(f)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  const double x = f;
  if (x <= lo) return std::numeric_limits<T>::min();
  if (x >= hi) return std::numeric_limits<T>::max();
  double r = std::floor(x);
  const double frac = x - r;  // exact: x is a float
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  return static_cast<T>(r);
}

// int32 -> f32 rounding to odd: exact below 2^24; above, any dropped bits are
// folded into the lowest kept bit. Rounding that once more to a format with at
// most 22 significand bits (bf16 and narrower) then equals rounding the integer
// directly, where a plain RNE cast would round twice (e.g. 2^24 + 2^16 + 1 to bf16).
float i32_to_f32_round_odd(int32_t v) {
  const uint64_t a = v < 0 ? uint64_t{0} - static_cast<uint64_t>(static_cast<int64_t>(v)) : static_cast<uint64_t>(v);
  if (a < (uint64_t{1} << 24)) return static_cast<float>(v);
  const int drop = static_cast<int>(std::bit_width(a)) - 24;
  uint64_t kept = a >> drop;
  if (a & ((uint64_t{1} << drop) - 1)) kept |= 1;
  const float r = std::ldexp(static_cast<float>(kept), drop);
  return v < 0 ? -r : r;
}

bool convertible(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::F8_E4M3: case DType::F8_E5M2:
    case DType::E2M1: case DType::I8: case DType::U8: case DType::I32:
      return true;
    default:
      return false;
  }
}

// Element access through memcpy: tensor data from files need not be aligned.
template <typename T>
T load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void store(void* p, size_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
}

int64_t load_int(const void* src, DType t, size_t i) {
  switch (t) {
    case DType::I8: return load<int8_t>(src, i);
    case DType::U8: return load<uint8_t>(src, i);
    default: return load<int32_t>(src, i);
  }
}

void store_int(void* dst, DType t, size_t i, int64_t v) {
  switch (t) {
    case DType::I8: store(dst, i, static_cast<int8_t>(std::clamp<int64_t>(v, -128, 127))); return;
    case DType::U8: store(dst, i, static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255))); return;
    default: store(dst, i, static_cast<int32_t>(v)); return;  // every source fits in i32
  }
}

template <typename T, typename Decode>
void load_as(const void* src, size_t off, size_t len, float* out, Decode decode) {
  for (size_t k = 0; k < len; ++k) out[k] = decode(load<T>(src, off + k));
}

template <typename Encode>
void store_as(const float* in, void* dst, size_t off, size_t len, Encode encode) {
  for (size_t k = 0; k < len; ++k) store(dst, off + k, encode(in[k]));
}

float i8_to_f32(int8_t v) { return v; }
float u8_to_f32(uint8_t v) { return v; }
float i32_to_f32(int32_t v) { return static_cast<float>(v); }
float f32_identity(float v) { return v; }

// Decode elements [off, off+len) to f32. `narrow_target`: the values will be
// rounded again to a float narrower than f32, so i32 goes through round-to-odd.
void load_chunk(const void* src, DType t, size_t off, size_t len, float* out, bool narrow_target) {
  switch (t) {
    case DType::F32: return load_as<float>(src, off, len, out, f32_identity);
    case DType::F16: return load_as<uint16_t>(src, off, len, out, f16_to_f32);
    case DType::BF16: return load_as<uint16_t>(src, off, len, out, bf16_to_f32);
    case DType::F8_E4M3: return load_as<uint8_t>(src, off, len, out, f8e4m3_to_f32);
    case DType::F8_E5M2: return load_as<uint8_t>(src, off, len, out, f8e5m2_to_f32);
    case DType::E2M1: return load_as<uint8_t>(src, off, len, out, e2m1_to_f32);
    case DType::I8: return load_as<int8_t>(src, off, len, out, i8_to_f32);
    case DType::U8: return load_as<uint8_t>(src, off, len, out, u8_to_f32);
    case DType::I32:
      return load_as<int32_t>(src, off, len, out, narrow_target ? i32_to_f32_round_odd : i32_to_f32);
    default: throw Error(ErrorKind::Internal, "load_chunk: unchecked dtype");
  }
}

void store_chunk(const float* in, void* dst, DType t, size_t off, size_t len) {
  switch (t) {
    case DType::F32: return store_as(in, dst, off, len, f32_identity);
    case DType::F16: return store_as(in, dst, off, len, f32_to_f16);
    case DType::BF16: return store_as(in, dst, off, len, f32_to_bf16);
    case DType::F8_E4M3: return store_as(in, dst, off, len, f32_to_f8e4m3);
    case DType::F8_E5M2: return store_as(in, dst, off, len, f32_to_f8e5m2);
    case DType::E2M1: return store_as(in, dst, off, len, f32_to_e2m1);
    case DType::I8: return store_as(in, dst, off, len, f32_to_i8);
    case DType::U8: return store_as(in, dst, off, len, f32_to_u8);
    case DType::I32: return store_as(in, dst, off, len, f32_to_i32);
    default: throw Error(ErrorKind::Internal, "store_chunk: unchecked dtype");
  }
}

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
const char* dtype_name(DType t) { return info(t).name; }
const char* safetensors_dtype_name(DType t) { return info(t).st_name; }
bool dtype_is_float(DType t) { return info(t).is_float; }

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (size_t i = 0; i < kInfo.size(); ++i) {
    const auto t = static_cast<DType>(i);
    if (t != DType::E2M1 && s == kInfo[i].st_name) return t;
  }
  return std::nullopt;
}

// ---- f16 ----------------------------------------------------------------------

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, mag = h & 0x7fffu;
  if (mag >= 0x7c00u) {  // NaNs come back quiet, payload kept
    return float_of(sign | (mag == 0x7c00u ? kF32Inf : kF32QuietNan | ((mag & 0x3ffu) << 13)));
  }
  return float_of(sign | expand_magnitude(mag, 10, 15));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (a > kF32Inf) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  return static_cast<uint16_t>(sign | std::min(round_magnitude(a, 10, 15), 0x7c00u));
}

// ---- bf16 ---------------------------------------------------------------------

float bf16_to_f32(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  // Set the quiet bit rather than rounding: a payload only in the low 16 bits
  // would otherwise truncate to inf, and a carry could flip the sign.
  if (a > kF32Inf) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>(((u >> 16) & 0x8000u) | std::min(round_magnitude(a, 7, 127), 0x7f80u));
}

// ---- 8-bit floats --------------------------------------------------------------

// Sign, NaN and overflow handling shared by the narrow float encoders: the
// rounded magnitude is clamped to `max_code` (the largest finite code for the
// saturating formats, the infinity code for e5m2) and NaN becomes `nan_code`,
// each with the sign moved to bit `sign_bit`.
uint8_t encode_narrow(float f, int man, int bias, int sign_bit, uint32_t nan_code, uint32_t max_code) {
  const uint32_t u = bits_of(f), a = u & 0x7fffffffu;
  const auto sign = static_cast<uint8_t>((u >> 31) << sign_bit);
  if (a > kF32Inf) return static_cast<uint8_t>(sign | nan_code);
  return static_cast<uint8_t>(sign | std::min(round_magnitude(a, man, bias), max_code));
}

float f8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24, mag = v & 0x7fu;
  return float_of(sign | (mag == 0x7fu ? kF32QuietNan : expand_magnitude(mag, 3, 7)));
}

uint8_t f32_to_f8e4m3(float f) {
  // 0x7f would be 480 (it is NaN), so anything rounding there or beyond, inf
  // included, saturates to 448 (0x7e).
  return encode_narrow(f, 3, 7, 7, 0x7fu, 0x7eu);
}

float f8e5m2_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24, mag = v & 0x7fu;
  if (mag >= 0x7cu) return float_of(sign | (mag == 0x7cu ? kF32Inf : kF32QuietNan));
  return float_of(sign | expand_magnitude(mag, 2, 15));
}

uint8_t f32_to_f8e5m2(float f) { return encode_narrow(f, 2, 15, 7, 0x7fu, 0x7cu); }  // overflow -> inf (0x7c)

// ---- fp4 ------------------------------------------------------------------------

float e2m1_to_f32(uint8_t v) {
  return float_of((static_cast<uint32_t>(v & 0x8u) << 28) | expand_magnitude(v & 0x7u, 1, 1));
}

uint8_t f32_to_e2m1(float f) { return encode_narrow(f, 1, 1, 3, 0x7u, 0x7u); }  // saturates to 6, NaN -> 6

// ---- integers ---------------------------------------------------------------------

int8_t f32_to_i8(float f) { return to_int<int8_t>(f); }
uint8_t f32_to_u8(float f) { return to_int<uint8_t>(f); }
int32_t f32_to_i32(float f) { return to_int<int32_t>(f); }

// ---- bulk -------------------------------------------------------------------------

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (!convertible(src_type) || !convertible(dst_type))
    throw Error(ErrorKind::Unsupported, std::string("conversion from ") + dtype_name(src_type) + " to " +
                                            dtype_name(dst_type) + " is not supported");
  if (n == 0) return;
  if (src_type == dst_type) {
    std::memmove(dst, src, n * dtype_size(src_type));
    return;
  }
  if (!dtype_is_float(src_type) && !dtype_is_float(dst_type)) {
    // Integer to integer: exact clamp, no detour through f32 (which would lose
    // low bits of large i32 values).
    for (size_t i = 0; i < n; ++i) store_int(dst, dst_type, i, load_int(src, src_type, i));
    return;
  }
  const bool narrow_target = dtype_is_float(dst_type) && dst_type != DType::F32;
  // Through f32 in chunks, so each type switch runs once per chunk, not per element.
  constexpr size_t kChunk = 512;
  float buf[kChunk];
  for (size_t off = 0; off < n; off += kChunk) {
    const size_t len = std::min(kChunk, n - off);
    load_chunk(src, src_type, off, len, buf, narrow_target);
    store_chunk(buf, dst, dst_type, off, len);
  }
}

}  // namespace qf
