// Device faults on demand, for testing how a run ends when the device
// fails: QF_DEVICE_FAULT=SITE:N makes the N-th event of SITE (counted from
// 1 over the process) fail the way the CUDA runtime or cuBLAS reports it:
//   alloc:N - the N-th device allocation (device vectors and the
//             temporary storage of the cuda build's algorithms) runs out of
//             memory, as cudaMalloc's cudaErrorMemoryAllocation;
//   blas:N  - the N-th call of a Blas routine fails with
//             CUBLAS_STATUS_EXECUTION_FAILED.
// Both builds (host and cuda) honour it; unset, nothing is injected. A
// malformed value is a usage error naming the variable.
// Plain C++: no Thrust or CUDA type appears here.
#pragma once

#include <cstdint>
#include <string>

namespace qf::device {

enum class FaultSite { Alloc, Blas };

// True exactly once: on the event of `site` that the plan names.
bool inject_fault(FaultSite site);

// Replaces the plan read from QF_DEVICE_FAULT ("" for none) and restarts
// the counts (tests).
void set_fault_plan(const std::string& plan);

// Per-thread state of the algebra (the cuda build's cuBLAS and cuSOLVER
// handles, the factorization's workspace): how many were created in this
// process. One per device and thread that used a Blas.
uint64_t blas_contexts_created();
void count_blas_context();

}  // namespace qf::device
