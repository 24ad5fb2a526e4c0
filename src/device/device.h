// Where a quantization method runs: the CPU reference code, or the device
// code (src/*/…_device.cpp, written once against Thrust and the algebra of
// blas.h) in one of its two builds:
//   host - compiled by the host compiler with Thrust's OpenMP system and the
//          Eigen algebra (blas_host.cpp); always present, and what the tests run;
//   cuda - compiled by nvcc with Thrust's CUDA system, cuBLAS and cuSOLVER;
//          present when the library was built with nvcc (QF_HAVE_CUDA).
// Plain C++: no Thrust or CUDA type appears here.
#pragma once

#include <cstdint>
#include <string>

namespace qf::device {

enum class Kind { Cpu, Host, Cuda };

const char* kind_name(Kind k);  // "cpu", "host", "cuda"

// "cpu", "host", "cuda" or "auto" (cuda when a CUDA device is usable, else
// cpu). Throws qf::Error: Usage for another word (naming `where`),
// Unsupported (exit 4) for "cuda" when no CUDA device can be used, with the
// CUDA runtime's reason or "built without CUDA".
Kind resolve(const std::string& word, const std::string& where);

// True when the library was built with nvcc and a CUDA device is visible;
// otherwise `why` (if not null) says which of the two is missing.
bool cuda_usable(std::string* why);

// Whether the cuda build's cuBLAS and cuSOLVER load and have every entry
// point it calls (they are loaded on first use, not linked); false with the
// reason when not, or when built without CUDA. Needs no GPU.
bool cuda_libraries_load(std::string* why);

// Free and total memory of the CUDA device in bytes; false when there is no
// usable device (or no CUDA build).
bool cuda_memory(uint64_t* free_bytes, uint64_t* total_bytes);

// Throws qf::Error(Io) "<what> needs N MiB of GPU memory; M MiB of T MiB are
// free" when `bytes` exceeds the CUDA device's free memory. For other kinds
// (cpu, host: host memory) it checks nothing.
void require_device_memory(Kind k, uint64_t bytes, const std::string& what);

// Inside a catch block: rethrows the exception being handled as the error a
// failed device gives. A qf::Error passes unchanged; std::bad_alloc and
// whatever else Thrust, the CUDA runtime or a library throws become
// qf::Error(Io) "<kind> device: ..." (exit 5), so a device fault ends a run
// with one line and its temporaries removed, like every other failure.
[[noreturn]] void rethrow_as_device_error(Kind k);

// Threads the host build's OpenMP work uses (the CLI's --threads); <= 0 keeps
// OpenMP's default (all cores).
void set_host_threads(int n);

}  // namespace qf::device
