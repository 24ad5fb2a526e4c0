#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/float_codec.h"

namespace qf {

namespace {

struct DTypeInfo {
  DType type;
  size_t size;
  const char* name;
  const char* st_name;
  bool is_float;
};

// E2M1 has no plain safetensors dtype; "F4" is what newer writers call packed fp4.
constexpr std::array<DTypeInfo, 16> kInfo = {{
    {DType::F32, 4, "f32", "F32", true},
    {DType::F16, 2, "f16", "F16", true},
    {DType::BF16, 2, "bf16", "BF16", true},
    {DType::F8_E4M3, 1, "f8_e4m3", "F8_E4M3", true},
    {DType::F8_E5M2, 1, "f8_e5m2", "F8_E5M2", true},
    {DType::E2M1, 1, "e2m1", "F4", true},
    {DType::I8, 1, "i8", "I8", false},
    {DType::U8, 1, "u8", "U8", false},
    {DType::I32, 4, "i32", "I32", false},
    {DType::I64, 8, "i64", "I64", false},
    {DType::F64, 8, "f64", "F64", true},
    {DType::BOOL, 1, "bool", "BOOL", false},
    {DType::I16, 2, "i16", "I16", false},
    {DType::U16, 2, "u16", "U16", false},
    {DType::U32, 4, "u32", "U32", false},
    {DType::U64, 8, "u64", "U64", false},
}};

const DTypeInfo& info(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i;
  throw Error(ErrorKind::Internal, "unknown DType value " + std::to_string(static_cast<int>(t)));
}

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round half to even, then clamp; NaN -> 0.
template <typename T>
T to_int(float f) {
  if (std::isnan(f)) return 0;
  double r = std::nearbyint(static_cast<double>(f));
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  return static_cast<T>(r < lo ? lo : (r > hi ? hi : r));
}

const std::array<float, 65536>& f16_table() {
  static const std::array<float, 65536> table = [] {
    std::array<float, 65536> t{};
    for (uint32_t i = 0; i < 65536; ++i) t[i] = codec::decode(i, codec::f16());
    return t;
  }();
  return table;
}

float load_f32(const void* src, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(src)[i];
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::F8_E4M3: return f8e4m3_to_f32(static_cast<const uint8_t*>(src)[i]);
    case DType::F8_E5M2: return f8e5m2_to_f32(static_cast<const uint8_t*>(src)[i]);
    case DType::E2M1: return e2m1_to_f32(static_cast<const uint8_t*>(src)[i]);
    case DType::I8: return static_cast<float>(static_cast<const int8_t*>(src)[i]);
    case DType::U8: return static_cast<float>(static_cast<const uint8_t*>(src)[i]);
    case DType::I32: return static_cast<float>(static_cast<const int32_t*>(src)[i]);
    default: break;
  }
  throw Error(ErrorKind::Unsupported, std::string("conversion from ") + dtype_name(t) + " is not supported");
}

void store_f32(float v, void* dst, DType t, size_t i) {
  switch (t) {
    case DType::F32: static_cast<float*>(dst)[i] = v; return;
    case DType::F16: static_cast<uint16_t*>(dst)[i] = f32_to_f16(v); return;
    case DType::BF16: static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v); return;
    case DType::F8_E4M3: static_cast<uint8_t*>(dst)[i] = f32_to_f8e4m3(v); return;
    case DType::F8_E5M2: static_cast<uint8_t*>(dst)[i] = f32_to_f8e5m2(v); return;
    case DType::E2M1: static_cast<uint8_t*>(dst)[i] = f32_to_e2m1(v); return;
    case DType::I8: static_cast<int8_t*>(dst)[i] = f32_to_i8(v); return;
    case DType::U8: static_cast<uint8_t*>(dst)[i] = f32_to_u8(v); return;
    case DType::I32: static_cast<int32_t*>(dst)[i] = f32_to_i32(v); return;
    default: break;
  }
  throw Error(ErrorKind::Unsupported, std::string("conversion to ") + dtype_name(t) + " is not supported");
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

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
const char* dtype_name(DType t) { return info(t).name; }
const char* safetensors_dtype_name(DType t) { return info(t).st_name; }
bool dtype_is_float(DType t) { return info(t).is_float; }

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (const auto& i : kInfo)
    if (i.type != DType::E2M1 && s == i.st_name) return i.type;
  return std::nullopt;  // includes "F4": packed fp4 needs a packing-aware reader
}

float f16_to_f32(uint16_t h) { return f16_table()[h]; }
uint16_t f32_to_f16(float f) { return static_cast<uint16_t>(codec::encode(f, codec::f16())); }

float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040);  // keep sign and payload top, force quiet
  // Round half to even on the 16 dropped bits; overflow carries into inf as IEEE requires.
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float f8e4m3_to_f32(uint8_t v) { return codec::decode(v, codec::e4m3()); }
uint8_t f32_to_f8e4m3(float f) { return static_cast<uint8_t>(codec::encode(f, codec::e4m3())); }
float f8e5m2_to_f32(uint8_t v) { return codec::decode(v, codec::e5m2()); }
uint8_t f32_to_f8e5m2(float f) { return static_cast<uint8_t>(codec::encode(f, codec::e5m2())); }
float e2m1_to_f32(uint8_t v) { return codec::decode(v & 0x0f, codec::e2m1()); }
uint8_t f32_to_e2m1(float f) { return static_cast<uint8_t>(codec::encode(f, codec::e2m1())); }

int8_t f32_to_i8(float f) { return to_int<int8_t>(f); }
uint8_t f32_to_u8(float f) { return to_int<uint8_t>(f); }
int32_t f32_to_i32(float f) { return to_int<int32_t>(f); }

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (!convertible(src_type) || !convertible(dst_type))
    throw Error(ErrorKind::Unsupported, std::string("conversion from ") + dtype_name(src_type) + " to " +
                                            dtype_name(dst_type) + " is not supported");
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  if (src_type == DType::I32 && dst_type != DType::F32 && !dtype_is_float(dst_type)) {
    // integer -> integer: saturate without the detour through float (exact for all int32)
    const int32_t* s = static_cast<const int32_t*>(src);
    for (size_t i = 0; i < n; ++i) {
      int64_t v = s[i];
      if (dst_type == DType::I8) static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(std::clamp<int64_t>(v, -128, 127));
      else static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255));
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) store_f32(load_f32(src, src_type, i), dst, dst_type, i);
}

}  // namespace qf
