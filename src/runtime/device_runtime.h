// The runtime's device code (…_device.cpp in this folder), compiled as the
// host build (qf::host) and, with nvcc, as the cuda build (qf::cuda, when
// QF_HAVE_CUDA): so far the causal attention of the device decoder layer.
// Plain C++: no Thrust or CUDA type appears here.
#pragma once

#include <cstdint>
#include <vector>

namespace qf::host {
#include "runtime/device_runtime.inc"
}  // namespace qf::host

#if QF_HAVE_CUDA
namespace qf::cuda {
#include "runtime/device_runtime.inc"
}  // namespace qf::cuda
#endif
