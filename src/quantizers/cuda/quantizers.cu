// The nvcc build of the device quantizers (namespace qf::cuda): the very
// sources the host compiler builds into qf_quantizers (namespace qf::host),
// in one translation unit because nvcc compiles Thrust slowly.
#include "quantizers/float_quant_device.cpp"
#include "quantizers/gptq_device.cpp"
#include "quantizers/hessian_device.cpp"
#include "quantizers/rtn_device.cpp"
