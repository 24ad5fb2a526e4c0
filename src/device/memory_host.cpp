// The host build's device memory (device/exec.h): aligned host memory, with
// the out-of-memory error the cuda build gives and QF_DEVICE_FAULT's
// injected allocation failures.
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "device/fault.h"

namespace qf::host {

void* device_malloc(size_t bytes) {
  if (device::inject_fault(device::FaultSite::Alloc))
    throw Error(ErrorKind::Io, "device: out of memory: an allocation of " + std::to_string(bytes) +
                                   " bytes failed (injected by QF_DEVICE_FAULT)");
  const size_t rounded = ((bytes ? bytes : 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(ErrorKind::Io, "device: out of memory: an allocation of " + std::to_string(bytes) + " bytes failed");
  return p;
}

void device_free(void* p) noexcept { std::free(p); }

}  // namespace qf::host
