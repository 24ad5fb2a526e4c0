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
