// One block of 32 f32 values -> int8 (lo, hi, ds), the activation format of q8_activations.glsl:
//   lo = int8 q of elements 0..15 (4 per word), hi = elements 16..31,
//   ds = (d, d * sum(q[0..15]), d * sum(q[16..31]), 0), d = max|x| / 127, q = roundEven(x / d).
// In a buffer a block is 3 uvec4: lo, hi, floatBitsToUint(ds) (moe_gateup's hq, attention_merge's
// olat_q8). Shared by the kernels that quantize (q8_activations.glsl, attention_merge.comp).
// Halves (a producer of 16 rows per workgroup, matvec_q8.comp OUT_HALVES): each half of a block
// quantized on its own, d_lo and d_hi, and the block's ds = (d_lo, d_lo * sum(q lo), d_hi *
// sum(q hi), d_hi); read only by kernels built with X_HALVES (q8_activations.glsl).
#ifndef TESSERA_Q8_QUANTIZE_GLSL
#define TESSERA_Q8_QUANTIZE_GLSL

// Four int8 values (round(v / d), |v / d| <= 127) in one word, and their sum.
uint q8_pack(vec4 v, float inv_d, inout int sum) {
  const ivec4 q = ivec4(roundEven(v * inv_d));
  sum += q.x + q.y + q.z + q.w;
  return uint(q.x & 0xFF) | (uint(q.y & 0xFF) << 8) | (uint(q.z & 0xFF) << 16) | (uint(q.w & 0xFF) << 24);
}

// One block of 32 values -> (lo, hi, ds) as laid out above.
void q8_quantize32(vec4 v[8], out uvec4 lo, out uvec4 hi, out vec4 ds) {
  float amax = 0.0;
  [[unroll]] for (uint i = 0; i < 8; ++i) {
    const vec4 a = abs(v[i]);
    amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
  }
  const float d = amax / 127.0;
  const float inv_d = amax > 0.0 ? 127.0 / amax : 0.0;
  int s_lo = 0, s_hi = 0;
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    lo[i] = q8_pack(v[i], inv_d, s_lo);
    hi[i] = q8_pack(v[i + 4], inv_d, s_hi);
  }
  ds = vec4(d, d * float(s_lo), d * float(s_hi), 0.0);
}

// One half block of 16 values -> its four words of int8, d = max|x| / 127 and d * sum(q).
void q8_quantize16(vec4 v[4], out uvec4 q, out float d, out float dsum) {
  float amax = 0.0;
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const vec4 a = abs(v[i]);
    amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
  }
  d = amax / 127.0;
  const float inv_d = amax > 0.0 ? 127.0 / amax : 0.0;
  int s = 0;
  [[unroll]] for (uint i = 0; i < 4; ++i) q[i] = q8_pack(v[i], inv_d, s);
  dsum = d * float(s);
}

#endif  // TESSERA_Q8_QUANTIZE_GLSL
