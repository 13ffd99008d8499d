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
// Bindings: 0 = x, 1 = w (n floats), 2 = y, 3 = yq (Q8_OUT).

#include "common.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 0) readonly buffer XBuf { float x[]; };
layout(std430, binding = 1) readonly restrict buffer WBuf { float w[]; };
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
#else
layout(std430, binding = 2) buffer YBuf { float y[]; };
#endif

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
  const uint xb = args.x_offset + t * args.x_stride;
  const uint yb = args.y_offset + t * args.y_stride;
#if NORMALIZE
  float ss = 0.0;
  for (uint i = gl_LocalInvocationIndex; i < args.n; i += WG_SIZE) {
    const float v = x[xb + i];
    ss += v * v;
  }
  ss = workgroup_sum(ss);
  const float scale = inversesqrt(ss / float(args.n) + args.eps);
#define NORMED(i) ((x[xb + (i)] * scale) * w[i])
#else
#define NORMED(i) x[xb + (i)]
#endif
#if F16_OUT
  for (uint i = gl_LocalInvocationIndex; i < args.n; i += WG_SIZE) y16[yb + i] = float16_t(NORMED(i));
#else
  for (uint i = gl_LocalInvocationIndex; i < args.n; i += WG_SIZE) y[yb + i] = NORMED(i);
#endif
#if Q8_OUT
#if !NORMALIZE || F16_OUT
#error "rmsnorm.comp: Q8_OUT goes with the normalized f32 output"
#endif
  // The same values (same expression), a block of 32 per invocation.
  for (uint b = gl_LocalInvocationIndex; b < args.n / 32u; b += WG_SIZE) {
    vec4 v[8];
    [[unroll]] for (uint k = 0; k < 8; ++k) {
      const uint i = 32u * b + 4u * k;
      v[k] = vec4((x[xb + i] * scale) * w[i], (x[xb + i + 1u] * scale) * w[i + 1u], (x[xb + i + 2u] * scale) * w[i + 2u],
                  (x[xb + i + 3u] * scale) * w[i + 3u]);
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
