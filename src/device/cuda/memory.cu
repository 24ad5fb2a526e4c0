// Device memory of the current CUDA device: the allocation behind device
// vectors and algorithm temporaries (device/exec.h), and the free-memory
// query made before a run.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "device/fault.h"

namespace qf::cuda {

void* device_malloc(size_t bytes) {
  if (device::inject_fault(device::FaultSite::Alloc))
    throw Error(ErrorKind::Io, "device: out of memory: cudaMalloc of " + std::to_string(bytes) +
                                   " bytes failed (injected by QF_DEVICE_FAULT)");
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clears the error unless it is sticky
    throw Error(ErrorKind::Io, "device: cudaMalloc of " + std::to_string(bytes) + " bytes failed: " +
                                   cudaGetErrorString(err));
  }
  return p;
}

// After a sticky error cudaFree fails too; the memory goes with the context.
void device_free(void* p) noexcept {
  if (p && cudaFree(p) != cudaSuccess) cudaGetLastError();
}

bool memory_info(uint64_t* free_bytes, uint64_t* total_bytes) {
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *free_bytes = f;
  *total_bytes = t;
  return true;
}

}  // namespace qf::cuda
