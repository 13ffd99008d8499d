#version 450
// RMSNorm of n_rows rows: y = w * x / sqrt(mean(x^2) + eps), f32 (RmsNormArgs, kernel_args.h).
// One workgroup per row; rows may be strided sub-vectors (e.g. the latent part of each kv row),
// y may alias x (in place). Wrapper: runtime/vulkan/kernels_basic.h (RmsNormOp).
// The same normalization fused into a following matvec is matvec.comp with NORM_INPUT.
// Bindings: 0 = x, 1 = w (n floats), 2 = y.

#include "common.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 0) readonly buffer XBuf { float x[]; };
layout(std430, binding = 1) readonly restrict buffer WBuf { float w[]; };
layout(std430, binding = 2) buffer YBuf { float y[]; };

layout(push_constant) uniform Push { RmsNormArgs args; };

void main() {
  const uint t = linear_workgroup_id();
  if (t >= args.n_rows) return;  // uniform per workgroup
  const uint xb = args.x_offset + t * args.x_stride;
  const uint yb = args.y_offset + t * args.y_stride;
  float ss = 0.0;
  for (uint i = gl_LocalInvocationIndex; i < args.n; i += WG_SIZE) {
    const float v = x[xb + i];
    ss += v * v;
  }
  ss = workgroup_sum(ss);
  const float scale = inversesqrt(ss / float(args.n) + args.eps);
  for (uint i = gl_LocalInvocationIndex; i < args.n; i += WG_SIZE) y[yb + i] = (x[xb + i] * scale) * w[i];
}
