#include "device/device.h"

#include <omp.h>

#include "core/error.h"
#if QF_HAVE_CUDA
#include "core/cuda/convert.h"

namespace qf::cuda {
void load_blas_libraries();  // device/cuda/blas.cu
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

void set_host_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

}  // namespace qf::device
