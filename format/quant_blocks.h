// Internal to the format library: per-block (de)quantizers of the K-quant family, implemented in
// quant_kquants.cpp and dispatched from quant.cpp. n is a multiple of 256 in every function.
#pragma once
#include <cstdint>
#include <cstring>

namespace tessera::quant_detail {

// Round to nearest, ties to even, for |x| < 2^22: ggml's nearest_int (adding 1.5 * 2^23 leaves
// the rounded integer in the low mantissa bits). Differs from roundf on exact halves.
inline int nearest_even(float x) {
  float biased = x + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

void dequantize_q4_k(const uint8_t* src, float* dst, int64_t n);
void dequantize_q5_k(const uint8_t* src, float* dst, int64_t n);
void dequantize_q6_k(const uint8_t* src, float* dst, int64_t n);
void quantize_q4_k(const float* src, uint8_t* dst, int64_t n);
void quantize_q5_k(const float* src, uint8_t* dst, int64_t n);
void quantize_q6_k(const float* src, uint8_t* dst, int64_t n);

}  // namespace tessera::quant_detail
