// f16/bf16 -> f8_e4m3fn on the GPU, by the same bit manipulation as
// core/dtype.cpp (not cuda_fp8.h: its software path, used below sm_89, writes
// every NaN as +NaN, while ours keeps the sign). convert_test.cpp compares the
// two over every input code. Kept to C++17: CMake compiles CUDA sources so.
#include <cuda_runtime.h>

#include <string>

#include "core/cuda/convert.h"
#include "core/error.h"

namespace qf::cuda {

namespace {

// x / 2^s rounded to nearest, ties to even; 1 <= s <= 31.
__host__ __device__ inline uint32_t shift_rne(uint32_t x, int s) {
  const uint32_t q = x >> s, rem = x & ((1u << s) - 1), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// A finite f32 magnitude (bits, sign clear) rounded to e4m3 (3 mantissa bits,
// bias 7) as a magnitude code, possibly past 0x7e; see round_magnitude in dtype.cpp.
__host__ __device__ inline uint32_t e4m3_round_magnitude(uint32_t a) {
  constexpr int kMan = 3, kBias = 7;
  const int ef = static_cast<int>(a >> 23);
  if (ef >= 128 - kBias) return shift_rne(a - (static_cast<uint32_t>(127 - kBias) << 23), 23 - kMan);
  const uint32_t sig = (a & 0x7fffffu) | (ef ? 0x800000u : 0u);
  const int s = 151 - kBias - kMan - (ef > 1 ? ef : 1);
  return s > 25 ? 0u : shift_rne(sig, s);
}

// Saturating: anything rounding to 0x7f (480) or beyond, inf included, gives 448.
__host__ __device__ inline uint8_t f32_bits_to_e4m3(uint32_t u) {
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  const uint32_t mag = e4m3_round_magnitude(a);
  return static_cast<uint8_t>(sign | (mag < 0x7eu ? mag : 0x7eu));
}

__host__ __device__ inline int leading_bit(uint32_t m) {  // m != 0
#if defined(__CUDA_ARCH__)
  return 31 - __clz(m);
#else
  int p = 0;
  while (m >>= 1) ++p;
  return p;
#endif
}

__host__ __device__ inline uint32_t f16_bits_to_f32_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, mag = h & 0x7fffu;
  if (mag >= 0x7c00u) return sign | (mag == 0x7c00u ? 0x7f800000u : 0x7fc00000u | ((mag & 0x3ffu) << 13));
  const uint32_t e = mag >> 10, m = mag & 0x3ffu;
  if (e != 0) return sign | ((e + 112u) << 23) | (m << 13);  // rebias 15 -> 127
  if (m == 0) return sign;
  const int p = leading_bit(m);  // normalise the subnormal: 2^-24 is an f32 normal
  return sign | (static_cast<uint32_t>(p + 103) << 23) | ((m ^ (1u << p)) << (23 - p));
}

template <bool kBf16>
__global__ void to_e4m3_kernel(const uint16_t* in, uint8_t* out, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint16_t v = in[i];
    out[i] = f32_bits_to_e4m3(kBf16 ? static_cast<uint32_t>(v) << 16 : f16_bits_to_f32_bits(v));
  }
}

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clear it so the next call does not report it again
  const bool no_device = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
                         err == cudaErrorNoKernelImageForDevice;
  throw Error(no_device ? ErrorKind::Unsupported : ErrorKind::Io,
              std::string("CUDA ") + what + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

// Frees on every path, including when a later allocation or copy throws.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { check(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

template <bool kBf16>
void run(const uint16_t* host_in, uint8_t* host_out, size_t n) {
  if (n == 0) return;
  DeviceBuffer in(n * sizeof(uint16_t)), out(n);
  check(cudaMemcpy(in.ptr, host_in, n * sizeof(uint16_t), cudaMemcpyHostToDevice), "copy to device");
  constexpr int kThreads = 256;
  constexpr size_t kMaxBlocks = 4096;  // the grid-stride loop covers the rest
  const size_t blocks = (n + kThreads - 1) / kThreads;
  to_e4m3_kernel<kBf16><<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads>>>(
      static_cast<const uint16_t*>(in.ptr), static_cast<uint8_t*>(out.ptr), n);
  check(cudaGetLastError(), "kernel launch");
  check(cudaDeviceSynchronize(), "kernel");
  check(cudaMemcpy(host_out, out.ptr, n, cudaMemcpyDeviceToHost), "copy to host");
}

}  // namespace

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) + ")";
    return false;
  }
  if (count < 1) {
    if (why) *why = "cudaGetDeviceCount found no devices";
    return false;
  }
  return true;
}

void f16_to_f8e4m3(const uint16_t* host_in, uint8_t* host_out, size_t n) { run<false>(host_in, host_out, n); }
void bf16_to_f8e4m3(const uint16_t* host_in, uint8_t* host_out, size_t n) { run<true>(host_in, host_out, n); }

}  // namespace qf::cuda
