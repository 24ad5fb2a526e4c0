// The device versions of the weight quantizers: RTN (rtn_device.cpp), FP8
// and NVFP4 (float_quant_device.cpp), GPTQ (gptq_device.cpp) and its
// Hessian (hessian_device.cpp), written once
// against device/exec.h and device/blas.h and compiled twice (device/device.h):
// qf::host::… (host build, always present) and qf::cuda::… (nvcc, when
// QF_HAVE_CUDA). The CPU functions (qf::quantize_rtn, …) are the reference;
// the *_on() functions run either by device::Kind.
//
// Agreement with the reference (quantizers/device_quantizers_test.cpp):
//   - RTN, FP8, NVFP4: the same codes and scales bit for bit (the same
//     QF_HD element math; ranges are exact whatever the reduction order);
//   - GPTQ: the same algorithm in double, one thread per weight row within
//     a block and the lazy updates as one GEMM; the GEMM's summation order
//     differs from the CPU's Eigen GEMM (per 16-row chunk) in the cuda build
//     and may in the host build, so a few codes may differ; the loss is the
//     same sum in another order.
//   - the mse observer: the same search steps (mse_search.h), bit-identical
//     in the host build; the device's pow may pick another of two near-tied
//     candidates in the cuda build. Over a whole tensor (tensor strategy,
//     one search over every weight) it is Unsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "quantizers/float_quant.h"
#include "quantizers/gptq.h"
#include "quantizers/rtn.h"

namespace qf::host {
#include "quantizers/device_quantizers.inc"
}  // namespace qf::host

#if QF_HAVE_CUDA
namespace qf::cuda {
#include "quantizers/device_quantizers.inc"
}  // namespace qf::cuda
#endif

namespace qf {

// Device memory gptq_quantize on the device allocates for one [rows, cols]
// Linear (the weight in f32 and double, the Hessian and two factor buffers
// of cols^2 doubles, the codes, a block of errors, the parameters).
uint64_t gptq_device_bytes(int64_t rows, int64_t cols, int64_t block_size);

QuantizedTensor quantize_rtn_on(device::Kind where_to, const float* w, int64_t rows, int64_t cols,
                                const QuantScheme& scheme, RangeObserver obs = RangeObserver::MinMax,
                                const MseOptions& mse = {});
QuantizedTensor quantize_fp8_on(device::Kind where_to, const float* w, int64_t rows, int64_t cols,
                                const QuantScheme& s);
QuantizedTensor quantize_nvfp4_on(device::Kind where_to, const float* w, int64_t rows, int64_t cols,
                                  const QuantScheme& s, float global_amax = -1);
GptqResult gptq_quantize_on(device::Kind where_to, const float* w, int64_t rows, int64_t cols,
                            const std::vector<double>& hessian, const QuantScheme& scheme, const GptqOptions& opts,
                            const std::string& name);

}  // namespace qf
