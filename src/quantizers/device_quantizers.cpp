#include "quantizers/device_quantizers.h"

#include "core/error.h"
#include "device/guard.h"

namespace qf {

namespace {

// The cuda build, or one clear Unsupported error saying why it cannot run.
void require_cuda() {
  std::string why;
  if (!device::cuda_usable(&why)) throw unsupported("--device cuda", "no usable CUDA device: " + why);
}

}  // namespace

uint64_t gptq_device_bytes(int64_t rows, int64_t cols, int64_t block_size) {
  const uint64_t r = static_cast<uint64_t>(rows), c = static_cast<uint64_t>(cols);
  const uint64_t b = static_cast<uint64_t>(block_size < cols ? block_size : cols);
  return r * c * (4 + 8 + 1)  // weight f32, working weight f64, codes
         + 3 * c * c * 8      // Hessian, factor, inverse
         + r * b * 8          // one block of errors
         + r * c * 8          // scales and zeros at most one per weight (group size 1)
         + r * 16 + c * 32;   // per-row parameters and loss, per-column order, flags, diagonal
}

QuantizedTensor quantize_rtn_on(device::Kind k, const float* w, int64_t rows, int64_t cols, const QuantScheme& s,
                                RangeObserver obs, const MseOptions& mse) {
  switch (k) {
    case device::Kind::Cpu: return quantize_rtn(w, rows, cols, s, obs, mse);
    case device::Kind::Host: return device::guarded_call(k, [&] { return host::quantize_rtn(w, rows, cols, s, obs, mse); });
    case device::Kind::Cuda:
      require_cuda();
#if QF_HAVE_CUDA
      return device::guarded_call(k, [&] { return cuda::quantize_rtn(w, rows, cols, s, obs, mse); });
#endif
      break;
  }
  throw Error(ErrorKind::Internal, "quantize_rtn_on: unknown device kind");
}

QuantizedTensor quantize_fp8_on(device::Kind k, const float* w, int64_t rows, int64_t cols, const QuantScheme& s) {
  switch (k) {
    case device::Kind::Cpu: return quantize_fp8(w, rows, cols, s);
    case device::Kind::Host: return device::guarded_call(k, [&] { return host::quantize_fp8(w, rows, cols, s); });
    case device::Kind::Cuda:
      require_cuda();
#if QF_HAVE_CUDA
      return device::guarded_call(k, [&] { return cuda::quantize_fp8(w, rows, cols, s); });
#endif
      break;
  }
  throw Error(ErrorKind::Internal, "quantize_fp8_on: unknown device kind");
}

QuantizedTensor quantize_nvfp4_on(device::Kind k, const float* w, int64_t rows, int64_t cols, const QuantScheme& s,
                                  float global_amax) {
  switch (k) {
    case device::Kind::Cpu: return quantize_nvfp4(w, rows, cols, s, global_amax);
    case device::Kind::Host: return device::guarded_call(k, [&] { return host::quantize_nvfp4(w, rows, cols, s, global_amax); });
    case device::Kind::Cuda:
      require_cuda();
#if QF_HAVE_CUDA
      return device::guarded_call(k, [&] { return cuda::quantize_nvfp4(w, rows, cols, s, global_amax); });
#endif
      break;
  }
  throw Error(ErrorKind::Internal, "quantize_nvfp4_on: unknown device kind");
}

GptqResult gptq_quantize_on(device::Kind k, const float* w, int64_t rows, int64_t cols,
                            const std::vector<double>& hessian, const QuantScheme& s, const GptqOptions& opts,
                            const std::string& name) {
  switch (k) {
    case device::Kind::Cpu: return gptq_quantize(w, rows, cols, hessian, s, opts, name);
    case device::Kind::Host: return device::guarded_call(k, [&] { return host::gptq_quantize(w, rows, cols, hessian, s, opts, name); });
    case device::Kind::Cuda:
      require_cuda();
      device::require_device_memory(k, gptq_device_bytes(rows, cols, opts.block_size), name + ": GPTQ");
#if QF_HAVE_CUDA
      return device::guarded_call(k, [&] { return cuda::gptq_quantize(w, rows, cols, hessian, s, opts, name); });
#endif
      break;
  }
  throw Error(ErrorKind::Internal, "gptq_quantize_on: unknown device kind");
}

}  // namespace qf
