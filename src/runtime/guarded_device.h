// The device runtime's objects as the rest of the program sees them: every
// call goes through device::rethrow_as_device_error, so what Thrust, the
// CUDA runtime or cuBLAS throws from inside (a device fault, memory
// exhausted) reaches the caller as one qf::Error(Io) naming the device.
#pragma once

#include <memory>

#include "device/guard.h"
#include "runtime/device_runtime.h"

namespace qf::rt {

using device::guarded_call;

std::unique_ptr<DeviceDecoder> guard_device(device::Kind kind, std::unique_ptr<DeviceDecoder> inner);
std::unique_ptr<DeviceLayerPass> guard_device(device::Kind kind, std::unique_ptr<DeviceLayerPass> inner);
std::unique_ptr<DeviceSmoothingEval> guard_device(device::Kind kind, std::unique_ptr<DeviceSmoothingEval> inner);

}  // namespace qf::rt
