#version 450
// Small prefill kernels (docs/PREFILL.md), by MODE:
//   MODE_SUM (1):    the FFN sum into the residual, per token t < n and row r (fixed order, so the
//                    result does not depend on scheduling):
//                    x[t][r] += y[t*K][r] + ... + y[t*K + K-1][r] (+ y[pair_base + t][r])
//                    workgroup (x = block of WG_SIZE rows, y = token)
//   MODE_GATHER (2): out[i] = x[(n-1)*n_embd + i]: the last live token's row, for the LM head
// n = step[count_word]. Arguments: PrefillUtilArgs (prefill_args.h). Wrapper: PrefillSumOp,
// PrefillGatherOp (runtime/vulkan/kernels_prefill.h).
// Defines: MODE, WG_SIZE. Bindings: 0 = x, 1 = y (SUM) / out (GATHER), 2 = step.

#include "common.glsl"
#include "prefill_args.h"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 0) restrict buffer XBuf { float x[]; };
layout(std430, binding = 1) restrict buffer YBuf { float y[]; };
layout(std430, binding = 2) readonly restrict buffer StepBuf { uint step_words[]; };

layout(push_constant) uniform Push { PrefillUtilArgs args; };

void main() {
  const uint n = step_words[args.count_word];
  const uint r = gl_WorkGroupID.x * WG_SIZE + gl_LocalInvocationIndex;
  if (r >= args.n_embd) return;
#if MODE == 1
  const uint t = gl_WorkGroupID.y;
  if (t >= n) return;
  float acc = 0.0;
  for (uint k = 0; k < args.n_used; ++k) acc += y[(t * args.n_used + k) * args.n_embd + r];
  if (args.has_shared != 0u) acc += y[(args.pair_base + t) * args.n_embd + r];
  x[t * args.n_embd + r] += acc;
#else
  if (n == 0u) return;
  y[r] = x[(n - 1u) * args.n_embd + r];
#endif
}
