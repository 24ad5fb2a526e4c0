// Calls into device code from the rest of the program: what Thrust, the
// CUDA runtime or a library throws inside becomes the one qf::Error a failed
// device gives (device::rethrow_as_device_error). Plain C++.
#pragma once

#include "device/device.h"

namespace qf::device {

template <class F>
auto guarded_call(Kind k, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    rethrow_as_device_error(k);
  }
}

}  // namespace qf::device
