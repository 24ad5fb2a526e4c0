// The nvcc build of the runtime's device sources (namespace qf::cuda): the
// files the host compiler builds into qf_runtime (namespace qf::host).
#include "runtime/attention_device.cpp"
#include "runtime/decoder_device.cpp"
#include "runtime/layer_pass_device.cpp"
#include "runtime/smoothing_eval_device.cpp"
