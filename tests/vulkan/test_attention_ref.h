// CPU references for the attention kernels (kv_write, attention_partial + merge, absorb): the
// math of forward.md §2-4 in plain loops, double accumulation, with the f16 cache rounding of
// llama.cpp. RoPE comes from the CPU oracle (runtime/cpu/ops.h, cpu::Rope).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "format/fp16.h"
#include "runtime/cpu/ops.h"

namespace tessera::test {

// One cache row as kv_write must produce it: f16([ RMSNorm(kv[0:R]; norm_w, eps) | rope(kv[R:], pos) ]).
inline std::vector<uint16_t> ref_kv_row(const std::vector<float>& kv, const std::vector<float>& norm_w, float eps,
                                        const cpu::Rope& rope, uint32_t pos) {
  const size_t r_lat = norm_w.size();
  double sq = 0;
  for (size_t i = 0; i < r_lat; ++i) sq += double(kv[i]) * kv[i];
  const double inv_rms = 1.0 / std::sqrt(sq / double(r_lat) + eps);
  std::vector<uint16_t> row(kv.size());
  for (size_t i = 0; i < r_lat; ++i) row[i] = f32_to_fp16(float(double(kv[i]) * norm_w[i] * inv_rms));
  std::vector<float> pe(kv.begin() + long(r_lat), kv.end());
  rope.apply(pe, pos);
  for (size_t i = 0; i < pe.size(); ++i) row[r_lat + i] = f32_to_fp16(pe[i]);
  return row;
}

// Absorbed attention of one query at position pos over cache rows [0, kv_len) (forward.md §2.4):
// q is n_head x (R + Dr) with the q_pe part unroped (roped here at pos); cache rows are R + Dr
// f16 values [latent | roped k_pe]. Returns olat, n_head x R.
inline std::vector<float> ref_attention(const std::vector<float>& q, const std::vector<uint16_t>& cache, uint32_t n_head,
                                        uint32_t kv_lora, uint32_t n_rot, uint32_t kv_len, uint32_t pos, float kq_scale,
                                        const cpu::Rope& rope, bool f16_query = false) {
  const uint32_t row = kv_lora + n_rot;
  std::vector<double> key(size_t(kv_len) * row);
  for (size_t i = 0; i < key.size(); ++i) key[i] = fp16_to_f32(cache[i]);
  std::vector<float> olat(size_t(n_head) * kv_lora);
  std::vector<double> score(kv_len);
  for (uint32_t h = 0; h < n_head; ++h) {
    std::vector<float> qh(q.begin() + long(h) * row, q.begin() + long(h + 1) * row);
    std::vector<float> pe(qh.begin() + kv_lora, qh.end());
    rope.apply(pe, pos);
    std::copy(pe.begin(), pe.end(), qh.begin() + kv_lora);
    // f16_query: the scaled, roped query rounded to f16 as the tensor-core kernel stages it.
    if (f16_query)
      for (float& v : qh) v = fp16_to_f32(f32_to_fp16(v * kq_scale));
    double mx = -INFINITY;
    for (uint32_t j = 0; j < kv_len; ++j) {
      double s = 0;
      for (uint32_t d = 0; d < row; ++d) s += double(qh[d]) * key[size_t(j) * row + d];
      score[j] = f16_query ? s : s * kq_scale;
      mx = std::max(mx, score[j]);
    }
    double sum = 0;
    for (uint32_t j = 0; j < kv_len; ++j) sum += score[j] = std::exp(score[j] - mx);
    for (uint32_t r = 0; r < kv_lora; ++r) {
      double o = 0;
      for (uint32_t j = 0; j < kv_len; ++j) o += score[j] * key[size_t(j) * row + r];
      olat[size_t(h) * kv_lora + r] = float(o / sum);
    }
  }
  return olat;
}

// y[h*y_stride + y_offset + r] = W_h[r] . x[h*x_stride + x_offset ...], W row-major
// (n_head*rows) x cols of dequantized values.
inline void ref_absorb(const std::vector<float>& w, const std::vector<float>& x, std::vector<float>& y, uint32_t n_head,
                       uint32_t rows, uint32_t cols, uint32_t x_stride, uint32_t x_offset, uint32_t y_stride,
                       uint32_t y_offset) {
  for (uint32_t h = 0; h < n_head; ++h)
    for (uint32_t r = 0; r < rows; ++r) {
      double s = 0;
      const float* wr = &w[(size_t(h) * rows + r) * cols];
      const float* xh = &x[size_t(h) * x_stride + x_offset];
      for (uint32_t k = 0; k < cols; ++k) s += double(wr[k]) * xh[k];
      y[size_t(h) * y_stride + y_offset + r] = float(s);
    }
}

// n values uniform in [-scale, scale).
inline std::vector<float> random_values(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& e : v) e = dist(rng);
  return v;
}

}  // namespace tessera::test
