// f16/bf16 -> f8_e4m3fn on the GPU, with the very functions the CPU uses
// (core/f16.h, bf16.h, f8_e4m3.h, marked QF_HD), not cuda_fp8.h: its software
// path, used below sm_89, writes every NaN as +NaN, while ours keeps the sign.
// Compiling this file is also what proves those headers build as device
// code; convert_test.cpp compares the kernel with the CPU over every input
// code. Kept to C++17: CMake compiles CUDA sources so.
#include <cuda_runtime.h>

#include <string>

#include "core/bf16.h"
#include "core/cuda/convert.h"
#include "core/error.h"
#include "core/f16.h"
#include "core/f8_e4m3.h"

namespace qf::cuda {

namespace {

template <bool kBf16>
__global__ void to_e4m3_kernel(const uint16_t* in, uint8_t* out, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint16_t v = in[i];
    out[i] = hd::f32_to_f8e4m3(kBf16 ? hd::bf16_to_f32(v) : hd::f16_to_f32(v));
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
