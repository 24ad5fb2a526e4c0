// f16/bf16 -> f8_e4m3 on the GPU. The rounding is core/float_codec.h's, the
// same definition the CPU path uses; convert_test.cpp compares the two over
// every input code.
#include <cuda_runtime.h>

#include <string>

#include "core/cuda/convert.h"
#include "core/error.h"
#include "core/float_codec.h"

namespace qf::cuda {

namespace {

__device__ float f16_bits_to_f32(uint16_t h) { return codec::decode(h, codec::f16()); }

__device__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

template <bool kBf16>
__global__ void to_e4m3_kernel(const uint16_t* in, uint8_t* out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float v = kBf16 ? bf16_bits_to_f32(in[i]) : f16_bits_to_f32(in[i]);
    out[i] = static_cast<uint8_t>(codec::encode(v, codec::e4m3()));
  }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(ErrorKind::Io, std::string("CUDA ") + what + ": " + cudaGetErrorString(err));
}

// Device buffers freed on every path.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { check(cudaMalloc(&ptr, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
};

template <bool kBf16>
void run(const uint16_t* host_in, uint8_t* host_out, size_t n) {
  if (n == 0) return;
  DeviceBuffer in(n * sizeof(uint16_t)), out(n);
  check(cudaMemcpy(in.ptr, host_in, n * sizeof(uint16_t), cudaMemcpyHostToDevice), "copy to device");
  int threads = 256;
  int blocks = static_cast<int>((n + threads - 1) / threads);
  if (blocks > 4096) blocks = 4096;
  to_e4m3_kernel<kBf16><<<blocks, threads>>>(static_cast<const uint16_t*>(in.ptr), static_cast<uint8_t*>(out.ptr), n);
  check(cudaGetLastError(), "kernel launch");
  check(cudaMemcpy(host_out, out.ptr, n, cudaMemcpyDeviceToHost), "copy to host");
}

}  // namespace

bool device_available(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    return false;
  }
  if (count < 1) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
}

void f16_to_f8e4m3(const uint16_t* host_in, uint8_t* host_out, size_t n) { run<false>(host_in, host_out, n); }
void bf16_to_f8e4m3(const uint16_t* host_in, uint8_t* host_out, size_t n) { run<true>(host_in, host_out, n); }

}  // namespace qf::cuda
