// CUDA twins of core conversions. Plain C++ header: no CUDA types leak out.
// Only declared when the CUDA sources are built (QF_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qf::cuda {

// True when at least one CUDA device is visible; otherwise `why` gets the reason.
bool device_available(std::string* why);

// f16 / bf16 codes -> f8_e4m3fn codes with saturation, exactly as
// qf::f32_to_f8e4m3(qf::f16_to_f32(x)) on the CPU. Host buffers in and out;
// throws qf::Error on a CUDA failure.
void f16_to_f8e4m3(const uint16_t* host_in, uint8_t* host_out, size_t n);
void bf16_to_f8e4m3(const uint16_t* host_in, uint8_t* host_out, size_t n);

}  // namespace qf::cuda
