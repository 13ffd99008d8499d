#version 450
// RMSNorm of n_rows rows: y = w * x / sqrt(mean(x^2) + eps), f32 (RmsNormArgs, kernel_args.h).
// One workgroup per row; rows may be strided sub-vectors (e.g. the latent part of each kv row),
// y may alias x (in place). Wrapper: runtime/vulkan/kernels_basic.h (RmsNormOp).
// The same normalization fused into a following matvec is matvec.comp with NORM_INPUT.
// Q8_OUT (0/1; n a multiple of 32): y also as int8 blocks of 32 (q8_quantize.glsl; row t's block
// b at yq[3 * (t * n / 32 + b)]), quantized from the same f32 values, for a following int8 matvec
// that then stages nothing (matvec_q8.comp X_Q8: the LM head).
// F16_OUT (0/1): y as f16 (binding 2 holds f16), the input of a following matmul.comp (MatmulOp).
// NORMALIZE (0/1, default 1): 0 copies x as it is (no weight, no scale; with F16_OUT: a
// conversion to f16, e.g. the attention's output for the matmul that reads it).
// Rows whose n and offsets are multiples of 4 go as vec4, each invocation loading RMS_BATCH of them
// before it uses any (a row is otherwise one L2 round trip per WG_SIZE values: a 10240-value row
// took 13.9 us on an H100); other rows go value by value.
// SUM_IN (0/1; vec4 rows, not with Q8_OUT; session 25): first, for the live rows t <
// step[count_word], s = y_in[row(t, 0)] + ... + y_in[row(t, K-1)] (+ y_in[sum_pair_base + t] with
// TS_NORM_SUM_SHARED), row(t, k) = t * sum_stride_t + k * sum_stride_k, and x[t] += s (x[t] = s with
// TS_NORM_SUM_REPLACE), written back to x; then the norm of the new rows. Two uses: the prefill's
// FFN sum (PrefillSumOp's order, prefill_util.comp MODE_SUM: the same bits) with the next layer's
// attention norm; a split-K matmul's parts (matmul.comp REDUCE's order) with the norm of its
// output. Each invocation reads back only the vec4s it wrote (no barrier needed).
// Bindings: 0 = x, 1 = w (n floats), 2 = y, 3 = yq (Q8_OUT), 4 = y_in, 5 = step (SUM_IN).

#include "common.glsl"

layout(local_size_x = WG_SIZE) in;

#ifndef SUM_IN
#define SUM_IN 0
#endif
#if SUM_IN
layout(std430, binding = 0) buffer XBuf { float x[]; };
layout(std430, binding = 0) buffer XBuf4 { vec4 x4[]; };
layout(std430, binding = 4) readonly restrict buffer YinBuf4 { vec4 y_in4[]; };
layout(std430, binding = 5) readonly restrict buffer StepBuf { uint step_words[]; };
#else
layout(std430, binding = 0) readonly buffer XBuf { float x[]; };
layout(std430, binding = 0) readonly buffer XBuf4 { vec4 x4[]; };
#endif
layout(std430, binding = 1) readonly restrict buffer WBuf { float w[]; };
layout(std430, binding = 1) readonly restrict buffer WBuf4 { vec4 w4[]; };
#ifndef F16_OUT
#define F16_OUT 0
#endif
#ifndef NORMALIZE
#define NORMALIZE 1
#endif
#if F16_OUT
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(std430, binding = 2) writeonly restrict buffer YBuf16 { float16_t y16[]; };
layout(std430, binding = 2) writeonly restrict buffer YBuf16v { f16vec4 y16v[]; };
#else
layout(std430, binding = 2) buffer YBuf { float y[]; };
layout(std430, binding = 2) buffer YBuf4 { vec4 y4[]; };
#endif
#define RMS_BATCH 4u

layout(push_constant) uniform Push { RmsNormArgs args; };

#ifndef Q8_OUT
#define Q8_OUT 0
#endif
#if Q8_OUT
#include "q8_quantize.glsl"
layout(std430, binding = 3) writeonly restrict buffer YqBuf { uvec4 yq[]; };
#endif

void main() {
  const uint t = linear_workgroup_id();
  if (t >= args.n_rows) return;  // uniform per workgroup
  const uint lid = gl_LocalInvocationIndex;
  const uint xb = args.x_offset + t * args.x_stride;
  const uint yb = args.y_offset + t * args.y_stride;
  const bool by4 = (args.n | xb | yb) % 4u == 0u;  // uniform
  const uint n4 = args.n / 4u, xb4 = xb / 4u, yb4 = yb / 4u;
#if SUM_IN
#if Q8_OUT
#error "rmsnorm.comp: SUM_IN does not go with Q8_OUT"
#endif
  if (t < step_words[args.count_word]) {  // uniform per workgroup; by4 (the host checks)
    for (uint i = lid; i < n4; i += WG_SIZE) {
      vec4 acc = vec4(0.0);
      for (uint k = 0u; k < args.sum_k; ++k) acc += y_in4[(t * args.sum_stride_t + k * args.sum_stride_k) * n4 + i];
      if ((args.sum_flags & TS_NORM_SUM_SHARED) != 0u) acc += y_in4[(args.sum_pair_base + t) * n4 + i];
      x4[xb4 + i] = (args.sum_flags & TS_NORM_SUM_REPLACE) != 0u ? acc : x4[xb4 + i] + acc;
    }
  }
#endif
#if NORMALIZE
  float ss = 0.0;
  if (by4) {
    for (uint i0 = lid; i0 < n4; i0 += RMS_BATCH * WG_SIZE) {
      vec4 v[RMS_BATCH];
      [[unroll]] for (uint u = 0; u < RMS_BATCH; ++u) v[u] = i0 + u * WG_SIZE < n4 ? x4[xb4 + i0 + u * WG_SIZE] : vec4(0.0);
      [[unroll]] for (uint u = 0; u < RMS_BATCH; ++u) ss += dot(v[u], v[u]);
    }
  } else {
    for (uint i = lid; i < args.n; i += WG_SIZE) {
      const float v = x[xb + i];
      ss += v * v;
    }
  }
  ss = workgroup_sum(ss);
  const float scale = inversesqrt(ss / float(args.n) + args.eps);
#define NORMED(i) ((x[xb + (i)] * scale) * w[i])
#define NORMED4(i) ((x4[xb4 + (i)] * scale) * w4[i])
#else
#define NORMED(i) x[xb + (i)]
#define NORMED4(i) x4[xb4 + (i)]
#endif
  if (by4) {
    for (uint i0 = lid; i0 < n4; i0 += RMS_BATCH * WG_SIZE) {
      vec4 v[RMS_BATCH];
      [[unroll]] for (uint u = 0; u < RMS_BATCH; ++u) v[u] = i0 + u * WG_SIZE < n4 ? NORMED4(i0 + u * WG_SIZE) : vec4(0.0);
      [[unroll]] for (uint u = 0; u < RMS_BATCH; ++u) {
        if (i0 + u * WG_SIZE >= n4) break;
#if F16_OUT
        y16v[yb4 + i0 + u * WG_SIZE] = f16vec4(v[u]);
#else
        y4[yb4 + i0 + u * WG_SIZE] = v[u];
#endif
      }
    }
  } else {
#if F16_OUT
    for (uint i = lid; i < args.n; i += WG_SIZE) y16[yb + i] = float16_t(NORMED(i));
#else
    for (uint i = lid; i < args.n; i += WG_SIZE) y[yb + i] = NORMED(i);
#endif
  }
#if Q8_OUT
#if !NORMALIZE || F16_OUT
#error "rmsnorm.comp: Q8_OUT goes with the normalized f32 output"
#endif
  // The same values (same expression), a block of 32 per invocation (n a multiple of 32; xb of 4
  // where by4, as it is wherever the host asks for blocks).
  for (uint b = lid; b < args.n / 32u; b += WG_SIZE) {
    vec4 v[8];
    if (by4) {
      [[unroll]] for (uint k = 0; k < 8; ++k) v[k] = NORMED4(8u * b + k);
    } else {
      [[unroll]] for (uint k = 0; k < 8; ++k) {
        const uint i = 32u * b + 4u * k;
        v[k] = vec4(NORMED(i), NORMED(i + 1u), NORMED(i + 2u), NORMED(i + 3u));
      }
    }
    uvec4 lo, hi;
    vec4 ds;
    q8_quantize32(v, lo, hi, ds);
    const uint o = 3u * (t * (args.n / 32u) + b);
    yq[o] = lo;
    yq[o + 1u] = hi;
    yq[o + 2u] = floatBitsToUint(ds);
  }
#endif
}
