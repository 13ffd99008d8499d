#version 450
// MoE router (decode_plan.md D8): h2 = RMSNorm(x; ffn_norm), logits[e] = W_router[e] . h2.
// One workgroup per router row: each invocation loads its share of x, the norm weight and the
// row at once, and the workgroup reduces sum(x^2) and the dot product together. Workgroup 0
// also writes h2, which the gate-up kernel reads after the barrier instead of normalizing again.
// Arguments: RouterArgs (moe_args.h). Wrapper: RouterOp (runtime/vulkan/kernels_moe.h).
//
// Defines: WTYPE (F32, F16 or BF16: the router is a plain matrix), WG_SIZE, VEC4 (F32 with
// n_embd % 4 == 0: 16-byte loads).
// Bindings: 0 = W_router [n_expert][n_embd], 1 = x, 2 = norm weight, 3 = logits (out), 4 = h2 (out).

#include "common.glsl"
#include "moe_args.h"

#define W_Q_BINDING 0
#define W_M_BINDING 0
#include "weights.glsl"

#if !W_PLAIN
#error "router.comp: the router weight must be F32, F16 or BF16"
#endif

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 1) readonly restrict buffer XBuf { float x[]; };
layout(std430, binding = 1) readonly restrict buffer XBuf4 { vec4 x4[]; };
layout(std430, binding = 2) readonly restrict buffer NormBuf { float nw[]; };
layout(std430, binding = 2) readonly restrict buffer NormBuf4 { vec4 nw4[]; };
layout(std430, binding = 3) writeonly restrict buffer LogitBuf { float logits[]; };
layout(std430, binding = 4) writeonly restrict buffer H2Buf { float h2[]; };

layout(push_constant) uniform Push { RouterArgs args; };

void main() {
  const uint n = args.n_embd, row = linear_workgroup_id(), tid = gl_LocalInvocationIndex;
  if (row >= args.n_expert) return;  // uniform per workgroup
  float ss = 0.0, acc = 0.0;
#if VEC4 && WTYPE == TS_TYPE_F32
  const uint base4 = row * (n >> 2);
  for (uint k = tid; k < (n >> 2); k += WG_SIZE) {
    const vec4 xv = x4[k];
    ss += dot(xv, xv);
    acc += dot(uintBitsToFloat(w_q[base4 + k]), xv * nw4[k]);
  }
#else
  for (uint k = tid; k < n; k += WG_SIZE) {
    const float xv = x[k];
    ss += xv * xv;
    acc += plain_value(row * n + k) * (xv * nw[k]);
  }
#endif
  ss = workgroup_sum(ss);
  acc = workgroup_sum(acc);
  const float inv_rms = inversesqrt(ss / float(n) + args.eps);
  if (tid == 0) logits[row] = acc * inv_rms;
  if (row == 0u)
    for (uint k = tid; k < n; k += WG_SIZE) h2[k] = x[k] * inv_rms * nw[k];
}
