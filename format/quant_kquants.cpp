// K-quants (256-element super-blocks): Q4_K, Q5_K, Q6_K. Dequantization per gguf.md §7.7-§7.10;
// quantization follows the logic of ggml's reference quantizers (no importance matrix), §9.4:
// a weighted least-squares (scale, min) search per sub-block, 6- or 8-bit sub-block scales under
// an fp16 super-scale, then every element re-quantized against the rounded scales.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/fp16.h"
#include "format/quant_blocks.h"

namespace tessera::quant_detail {

namespace {

constexpr int kSuper = 256;
constexpr float kTinyScale = 1e-15f;  // below this a Q6_K super-block is treated as all zero

uint16_t load_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// The 12-byte scales[] of Q4_K / Q5_K: eight 6-bit scales sc[j] and eight 6-bit mins mn[j].
//
//   byte:   0..3                    4..7                    8..11
//         +-----------------------+-----------------------+-----------------------+
//         | 7..6: sc[j+4] bits 5..4 | 7..6: mn[j+4] bits 5..4 | 7..4: mn[j+4] bits 3..0 |
//         | 5..0: sc[j]   (j=0..3)  | 5..0: mn[j]   (j=0..3)  | 3..0: sc[j+4] bits 3..0 |
//         +-----------------------+-----------------------+-----------------------+
void unpack_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void pack_scale_min(uint8_t* s, const uint8_t* sc, const uint8_t* mn) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = sc[j];
      s[j + 4] = mn[j];
    } else {
      s[j + 4] = uint8_t((sc[j] & 0x0F) | ((mn[j] & 0x0F) << 4));
      s[j - 4] |= uint8_t((sc[j] >> 4) << 6);
      s[j] |= uint8_t((mn[j] >> 4) << 6);
    }
  }
}

// Fit x[0..n) ~ scale * L + min with L in 0..nmax, min <= 0, minimizing the weighted squared
// error: start from the plain (max - min)/nmax grid, then try nstep+1 rescaled grids around it
// and solve the 2x2 least-squares for (scale, min) on each, keeping the best. Returns the scale
// and writes -min to *neg_min and the levels to L.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min,
                    float rmin, float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::fill(L, L + n, uint8_t(0));
    *neg_min = -lo;
    return 0.f;
  }
  float inv = nmax / (hi - lo);
  float scale = 1 / inv;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(std::clamp(nearest_even(inv * (x[i] - lo)), 0, nmax));
    const float diff = scale * L[i] + lo - x[i];
    best += w[i] * diff * diff;
  }
  // Per-element work goes in vectorizable loops; the sums stay sequential (reference order).
  uint8_t trial[32];
  float lf[32], wl[32], terms[32];
  for (int step = 0; step <= nstep; ++step) {
    inv = (rmin + rdelta * step + nmax) / (hi - lo);
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_even(inv * (x[i] - lo)), 0, nmax);
      trial[i] = uint8_t(l);
      lf[i] = float(l);
      wl[i] = w[i] * lf[i];
    }
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      sum_l += wl[i];
      sum_l2 += wl[i] * lf[i];
      sum_xl += wl[i] * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float s = (sum_w * sum_xl - sum_x * sum_l) / det;
    float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (m > 0) {
      m = 0;
      s = sum_xl / sum_l2;
    }
    for (int i = 0; i < n; ++i) {
      const float diff = s * lf[i] + m - x[i];
      terms[i] = w[i] * diff * diff;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) err += terms[i];
    if (err < best) {
      std::copy(trial, trial + n, L);
      best = err;
      scale = s;
      lo = m;
    }
  }
  *neg_min = -lo;
  return scale;
}

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): scales/mins of the 8 sub-blocks quantized to 6
// bits under fp16 d / dmin, then the levels L[256] against the rounded scales.
void quantize_k_scales(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t* head, uint8_t* L) {
  float scales[8], mins[8], w[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float rms = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = rms + std::fabs(xs[l]);
    scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], rmin, rdelta, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = uint8_t(std::min(63, int(uint8_t(nearest_even(inv_scale * scales[j])))));
    mn[j] = uint8_t(std::min(63, int(uint8_t(nearest_even(inv_min * mins[j])))));
  }
  store_u16(head, f32_to_fp16(max_scale / 63.f));
  store_u16(head + 2, f32_to_fp16(max_min / 63.f));
  pack_scale_min(head + 4, sc, mn);

  const float d = fp16_to_f32(load_u16(head)), dmin = fp16_to_f32(load_u16(head + 2));
  for (int j = 0; j < 8; ++j) {
    int s, m;
    unpack_scale_min(head + 4, j, s, m);
    const float ds = d * s;
    if (ds == 0) continue;  // keep the levels from the fit, as the reference does
    const float dm = dmin * m;
    for (int l = 0; l < 32; ++l) L[32 * j + l] = uint8_t(std::clamp(nearest_even((x[32 * j + l] + dm) / ds), 0, nmax));
  }
}

// Signed fit for Q6_K sub-blocks of 16: levels in -nmax..nmax-1 (stored + nmax), weights x^2;
// tries 18 rescaled grids around -nmax/max and keeps the best least-squares scale.
float fit_signed_scale(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  if (amax < kTinyScale) {
    std::fill(L, L + n, int8_t(0));
    return 0.f;
  }
  auto level = [nmax](float v) { return std::clamp(nearest_even(v), -nmax, nmax - 1); };
  float inv = -nmax / max;
  float sum_lx = 0, sum_l2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(inv * x[i]);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sum_lx += w * x[i] * l;
    sum_l2 += w * l * l;
  }
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.f;
  float best = scale * sum_lx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    inv = -(nmax + 0.1f * step) / max;
    sum_lx = sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(inv * x[i]);
      const float w = x[i] * x[i];
      sum_lx += w * x[i] * l;
      sum_l2 += w * l * l;
    }
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(level(inv * x[i]) + nmax);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Q4_K: 144 bytes, 256 elements = 4 chunks of 64 = 8 sub-blocks of 32.
//
//   0      2      4              16                                       144
//   +------+------+--------------+----------------------------------------+
//   | d    | dmin | scales[12]   | qs[128]                                |
//   +------+------+--------------+----------------------------------------+
//   chunk c (0..3) uses qs[32c .. 32c+31]:
//     qs[32c + l] = [ 7..4: q(64c + 32 + l) | 3..0: q(64c + l) ]
//   x[64c + l]      = d*sc[2c]   * q - dmin*mn[2c]       (sc/mn from scales[], see above)
//   x[64c + 32 + l] = d*sc[2c+1] * q - dmin*mn[2c+1]
void dequantize_q4_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuper; ++b, src += 144) {
    const float d = fp16_to_f32(load_u16(src)), dmin = fp16_to_f32(load_u16(src + 2));
    const uint8_t* qs = src + 16;
    for (int c = 0; c < 4; ++c, qs += 32, dst += 64) {
      int s0, m0, s1, m1;
      unpack_scale_min(src + 4, 2 * c, s0, m0);
      unpack_scale_min(src + 4, 2 * c + 1, s1, m1);
      const float d0 = d * s0, o0 = dmin * m0, d1 = d * s1, o1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        dst[l] = d0 * float(qs[l] & 0x0F) - o0;
        dst[l + 32] = d1 * float(qs[l] >> 4) - o1;
      }
    }
  }
}

void quantize_q4_k(const float* src, uint8_t* dst, int64_t n) {
  uint8_t L[kSuper];
  for (int64_t b = 0; b < n / kSuper; ++b, src += kSuper, dst += 144) {
    quantize_k_scales(src, 15, -1.f, 0.1f, 20, dst, L);
    uint8_t* qs = dst + 16;
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) qs[32 * c + l] = uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

// ---------------------------------------------------------------------------------------------
// Q5_K: 176 bytes, 256 elements; Q4_K plus a 5th bit per element in qh.
//
//   0      2      4              16              48                       176
//   +------+------+--------------+---------------+------------------------+
//   | d    | dmin | scales[12]   | qh[32]        | qs[128]                |
//   +------+------+--------------+---------------+------------------------+
//   qh[l] bit 2c   = bit 4 of q(64c + l)
//   qh[l] bit 2c+1 = bit 4 of q(64c + 32 + l)
//   x = d*sc*q - dmin*mn with q in 0..31, sub-blocks as in Q4_K
void dequantize_q5_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuper; ++b, src += 176) {
    const float d = fp16_to_f32(load_u16(src)), dmin = fp16_to_f32(load_u16(src + 2));
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int c = 0; c < 4; ++c, qs += 32, dst += 64) {
      int s0, m0, s1, m1;
      unpack_scale_min(src + 4, 2 * c, s0, m0);
      unpack_scale_min(src + 4, 2 * c + 1, s1, m1);
      const float d0 = d * s0, o0 = dmin * m0, d1 = d * s1, o1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        const int q0 = (qs[l] & 0x0F) | (((qh[l] >> (2 * c)) & 1) << 4);
        const int q1 = (qs[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
        dst[l] = d0 * float(q0) - o0;
        dst[l + 32] = d1 * float(q1) - o1;
      }
    }
  }
}

void quantize_q5_k(const float* src, uint8_t* dst, int64_t n) {
  uint8_t L[kSuper];
  for (int64_t b = 0; b < n / kSuper; ++b, src += kSuper, dst += 176) {
    quantize_k_scales(src, 31, -0.5f, 0.1f, 15, dst, L);
    uint8_t* qh = dst + 16;
    uint8_t* qs = dst + 48;
    std::memset(qh, 0, 32);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const int q0 = L[64 * c + l], q1 = L[64 * c + 32 + l];
        qs[32 * c + l] = uint8_t((q0 & 0x0F) | ((q1 & 0x0F) << 4));
        qh[l] |= uint8_t(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Q6_K: 210 bytes, 256 elements = 2 halves of 128 = 16 sub-blocks of 16 with int8 scales.
//
//   0                      128              192              208    210
//   +----------------------+----------------+----------------+------+
//   | ql[128] (low 4 bits) | qh[64] (2 bits)| scales[16] i8  | d    |
//   +----------------------+----------------+----------------+------+
//   half h (0,1): L = ql + 64h, H = qh + 32h, base = 128h; for l = 0..31:
//     L[l]    = [ 7..4: q(base+64+l) low | 3..0: q(base+l) low    ]
//     L[l+32] = [ 7..4: q(base+96+l) low | 3..0: q(base+32+l) low ]
//     H[l]    = [ 7..6: q(base+96+l) | 5..4: q(base+64+l) | 3..2: q(base+32+l) | 1..0: q(base+l) ] (high 2 bits)
//   x[e] = d * scales[e/16] * (q(e) - 32)
void dequantize_q6_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuper; ++b, src += 210) {
    const float d = fp16_to_f32(load_u16(src + 208));
    const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
    for (int h = 0; h < 2; ++h, dst += 128) {
      const uint8_t* ql = src + 64 * h;
      const uint8_t* qh = src + 128 + 32 * h;
      const int8_t* s = sc + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int q0 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        const int is = l / 16;
        dst[l] = d * float(s[is]) * float(q0);
        dst[l + 32] = d * float(s[is + 2]) * float(q1);
        dst[l + 64] = d * float(s[is + 4]) * float(q2);
        dst[l + 96] = d * float(s[is + 6]) * float(q3);
      }
    }
  }
}

void quantize_q6_k(const float* src, uint8_t* dst, int64_t n) {
  int8_t L[kSuper];
  float scales[16];
  for (int64_t b = 0; b < n / kSuper; ++b, src += kSuper, dst += 210) {
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_signed_scale(16, 32, src + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs < kTinyScale) {
      std::memset(dst, 0, 210);
      continue;
    }
    const float inv = -128.f / max_scale;
    store_u16(dst + 208, f32_to_fp16(1 / inv));
    int8_t* sc = reinterpret_cast<int8_t*>(dst + 192);
    for (int j = 0; j < 16; ++j) sc[j] = int8_t(std::min(127, nearest_even(inv * scales[j])));
    const float d = fp16_to_f32(load_u16(dst + 208));
    for (int j = 0; j < 16; ++j) {
      const float ds = d * sc[j];
      if (ds == 0) continue;
      for (int l = 0; l < 16; ++l) L[16 * j + l] = int8_t(std::clamp(nearest_even(src[16 * j + l] / ds), -32, 31) + 32);
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = dst + 64 * h;
      uint8_t* qh = dst + 128 + 32 * h;
      const int8_t* q = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = uint8_t((q[l] & 0x0F) | ((q[l + 64] & 0x0F) << 4));
        ql[l + 32] = uint8_t((q[l + 32] & 0x0F) | ((q[l + 96] & 0x0F) << 4));
        qh[l] = uint8_t((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace tessera::quant_detail
