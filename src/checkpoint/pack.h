// Bit packing of small unsigned integer codes into int32 words, as the
// compressed-tensors and GPTQ checkpoint formats store them.
//
// The layout ("dense LSB-first"): along the packed dimension, element i of a
// run occupies bits [i*bits, (i+1)*bits) of the run's bit stream, and bit k
// of the stream is bit (k % 32) of word k / 32 (little-endian within each
// int32). A run of n elements takes ceil(n*bits/32) words; the unused high
// bits of the last word are zero. With 3, 5, 6 or 7 bits an element may
// straddle two words (its low bits at the top of one word, its high bits at
// the bottom of the next).
//
// Provenance (checked against the peers' code):
//  - compressed-tensors >= 0.17 `pack_to_int32` (compressors/pack_quantized/
//    helpers.py): exactly this layout, ceil(E*bits/32) words per run, for
//    packed_dim=1 (rows) and packed_dim=0 (columns). Up to 0.14 it packed
//    32/bits values per word with padding; for 2, 4 and 8 bits (bits divides
//    32) the two layouts are byte-identical, for 3/5/6/7 they differ.
//  - AutoGPTQ qlinear `pack()` (2/4/8 bits: value j of a word at bit bits*j;
//    3 bits: 32 values in 3 words, value 10 in bits 30-31 of word 0 plus bit 0
//    of word 1, value 21 in bit 31 of word 1 plus bits 0-1 of word 2) is the
//    same dense LSB-first layout: value i starts at global bit 3*i.
//
// The functions take and return unsigned codes; the format-specific offsets
// (compressed-tensors' signed q + 2^(bits-1), GPTQ's z - 1) are the callers'.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quantizers/quant_scheme.h"

namespace qf {

// Words needed for n packed values: ceil(n * bits / 32).
int64_t packed_words(int64_t n, int bits);

// values [rows, cols] row-major -> words [rows, packed_words(cols, bits)],
// packed along the last dimension. Throws qf::Error (InvalidInput) for bits
// outside 1..8 or a value >= 2^bits.
std::vector<int32_t> pack_int32_rows(const uint8_t* values, int64_t rows, int64_t cols, int bits);
// Inverse: words [rows, packed_words(cols, bits)] -> values [rows, cols].
// Padding bits beyond the last value are ignored (as the readers do).
std::vector<uint8_t> unpack_int32_rows(const int32_t* words, int64_t rows, int64_t cols, int bits);

// values [rows, cols] -> words [packed_words(rows, bits), cols], packed along
// dim 0: each column is one run (compressed-tensors' packed_dim=0, used for
// weight_zero_point; GPTQ's qweight is this applied to the [in, out] transpose).
std::vector<int32_t> pack_int32_cols(const uint8_t* values, int64_t rows, int64_t cols, int bits);
// Inverse: words [packed_words(rows, bits), cols] -> values [rows, cols].
std::vector<uint8_t> unpack_int32_cols(const int32_t* words, int64_t rows, int64_t cols, int bits);

// NVFP4 (compressed-tensors weight_packed, modelopt weight): the e2m1 codes
// of q, two per byte along each row, element 2j in the low nibble.
std::vector<uint8_t> pack_nvfp4_rows(const QuantizedTensor& q);
// NVFP4 block scales as e4m3 bytes (QuantizedTensor::validate guarantees
// they are exact non-negative e4m3 values).
std::vector<uint8_t> nvfp4_scales_e4m3(const QuantizedTensor& q);

}  // namespace qf
