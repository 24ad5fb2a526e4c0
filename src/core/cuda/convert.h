// GPU twins of core conversions. Plain C++ header: no CUDA types leak out, so
// callers and tests compile without nvcc. The definitions exist only when the
// CUDA library is built (QF_HAVE_CUDA); guard calls with that macro.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qf::cuda {

// True when at least one CUDA device is visible; otherwise `why` (if not null)
// gets the CUDA runtime's reason.
bool device_available(std::string* why);

// f16 / bf16 codes -> f8_e4m3fn codes with saturation, bit-identical to
// qf::f32_to_f8e4m3(qf::f16_to_f32(x)) (resp. bf16_to_f32) on the CPU. Host
// buffers in and out; throws qf::Error (Unsupported when there is no usable
// device, Io for other CUDA failures) with the CUDA message.
void f16_to_f8e4m3(const uint16_t* host_in, uint8_t* host_out, size_t n);
void bf16_to_f8e4m3(const uint16_t* host_in, uint8_t* host_out, size_t n);

}  // namespace qf::cuda
