#include "device/device.h"

#include <omp.h>

#include <exception>
#include <new>

#include "core/error.h"
#if QF_HAVE_CUDA
#include "core/cuda/convert.h"

namespace qf::cuda {
void load_blas_libraries();                                   // device/cuda/blas.cu
bool memory_info(uint64_t* free_bytes, uint64_t* total_bytes);  // device/cuda/memory.cu
}
#endif

namespace qf::device {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Cpu: return "cpu";
    case Kind::Host: return "host";
    case Kind::Cuda: return "cuda";
  }
  return "?";
}

bool cuda_usable(std::string* why) {
#if QF_HAVE_CUDA
  return qf::cuda::device_available(why);
#else
  if (why) *why = "this quantforge was built without CUDA (no nvcc was found when it was configured)";
  return false;
#endif
}

Kind resolve(const std::string& word, const std::string& where) {
  if (word == "cpu") return Kind::Cpu;
  if (word == "host") return Kind::Host;
  std::string why;
  if (word == "auto") return cuda_usable(nullptr) ? Kind::Cuda : Kind::Cpu;
  if (word == "cuda") {
    if (!cuda_usable(&why)) throw unsupported(where, "no usable CUDA device: " + why);
    return Kind::Cuda;
  }
  throw Error(ErrorKind::Usage, where + ": unknown device '" + word + "' (cpu, host, cuda or auto)");
}

bool cuda_libraries_load(std::string* why) {
#if QF_HAVE_CUDA
  try {
    qf::cuda::load_blas_libraries();
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
#else
  if (why) *why = "this quantforge was built without CUDA";
  return false;
#endif
}

bool cuda_memory(uint64_t* free_bytes, uint64_t* total_bytes) {
#if QF_HAVE_CUDA
  return cuda_usable(nullptr) && qf::cuda::memory_info(free_bytes, total_bytes);
#else
  (void)free_bytes;
  (void)total_bytes;
  return false;
#endif
}

void require_device_memory(Kind k, uint64_t bytes, const std::string& what) {
  if (k != Kind::Cuda) return;
  uint64_t free_bytes = 0, total = 0;
  if (!cuda_memory(&free_bytes, &total)) throw Error(ErrorKind::Io, what + ": cannot read the GPU's free memory");
  if (bytes <= free_bytes) return;
  auto mib = [](uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20); };
  throw Error(ErrorKind::Io, what + " needs " + mib(bytes) + " MiB of GPU memory; " + mib(free_bytes) + " MiB of " +
                                 mib(total) + " MiB are free");
}

void rethrow_as_device_error(Kind k) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc& e) {
    throw Error(ErrorKind::Io, std::string(kind_name(k)) + " device: out of memory (" + e.what() + ")");
  } catch (const std::exception& e) {
    throw Error(ErrorKind::Io, std::string(kind_name(k)) + " device: " + e.what());
  }
}

void set_host_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

}  // namespace qf::device
