#version 450
// MoE router (decode_plan.md D8): h2 = RMSNorm(x; ffn_norm), logits[e] = W_router[e] . h2.
// Every workgroup recomputes sum(x^2) (n_embd values); workgroup 0 also writes h2, which the
// gate-up kernel reads after the barrier instead of normalizing again.
// Arguments: RouterArgs (moe_args.h). Wrapper: RouterOp (runtime/vulkan/kernels_moe.h).
//
// Defines: WTYPE (F32, F16 or BF16: the router is a plain matrix), WG_SIZE, THREADS_PER_ROW
// (= SUBGROUP_SIZE when USE_SUBGROUP, else a power of two dividing WG_SIZE).
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
layout(std430, binding = 2) readonly restrict buffer NormBuf { float nw[]; };
layout(std430, binding = 3) writeonly restrict buffer LogitBuf { float logits[]; };
layout(std430, binding = 4) writeonly restrict buffer H2Buf { float h2[]; };

layout(push_constant) uniform Push { RouterArgs args; };

#define ROWS_PER_WG (WG_SIZE / THREADS_PER_ROW)

#if !USE_SUBGROUP
shared float row_partial[WG_SIZE];
#endif

void main() {
  const uint n = args.n_embd;
  float ss = 0.0;
  for (uint k = gl_LocalInvocationIndex; k < n; k += WG_SIZE) ss += x[k] * x[k];
  const float inv_rms = inversesqrt(workgroup_sum(ss) / float(n) + args.eps);

  const uint row0 = linear_workgroup_id() * ROWS_PER_WG;
  if (row0 == 0u) {
    for (uint k = gl_LocalInvocationIndex; k < n; k += WG_SIZE) h2[k] = x[k] * inv_rms * nw[k];
  }
  if (row0 >= args.n_expert) return;  // uniform per workgroup
  const uint row_end = min(row0 + ROWS_PER_WG, args.n_expert);

#if USE_SUBGROUP
  for (uint row = row0 + gl_SubgroupID; row < row_end; row += gl_NumSubgroups) {
    float acc = 0.0;
    for (uint k = gl_SubgroupInvocationID; k < n; k += gl_SubgroupSize) acc += plain_value(row * n + k) * (x[k] * nw[k]);
    acc = subgroupAdd(acc);
    if (subgroupElect()) logits[row] = acc * inv_rms;
  }
#else
  const uint lid = gl_LocalInvocationIndex;
  const uint lane = lid % THREADS_PER_ROW;
  const uint row = row0 + lid / THREADS_PER_ROW;
  float acc = 0.0;
  if (row < row_end)
    for (uint k = lane; k < n; k += THREADS_PER_ROW) acc += plain_value(row * n + k) * (x[k] * nw[k]);
  row_partial[lid] = acc;
  barrier();
  [[unroll]] for (uint s = THREADS_PER_ROW / 2; s > 0; s >>= 1) {
    if (lane < s) row_partial[lid] += row_partial[lid + s];
    barrier();
  }
  if (lane == 0 && row < row_end) logits[row] = row_partial[lid] * inv_rms;
#endif
}
