// Device memory of the current CUDA device, for checks made before a run.
#include <cuda_runtime.h>

#include <cstdint>

namespace qf::cuda {

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
