// The MoE router as the epilogue of the matvec that finishes the attention block (W_vo, or
// attn_output when factored), so the decode step has no router dispatch and no barrier before it:
//
//   h = x + W o                       the matvec's rows, ROWS_PER_WG per workgroup (y, in place)
//   part[e][wg] = sum_{r in wg} W_router[e][r] * ffn_norm[r] * h[r]     every workgroup, e < E
//   then the last workgroup to arrive (atomic arrival counter, as in router.comp):
//     inv_rms   = 1 / sqrt(mean(h^2) + eps)
//     logits[e] = inv_rms * sum_wg part[e][wg]    (== W_router . RMSNorm(h; ffn_norm))
//     route     = routing(logits)                 (routing.glsl: gating, bias, top-K, weights)
//     h2        = h * ffn_norm * inv_rms          (the expert kernels' input, as router.comp writes)
//
// The partials are value-major (expert e's n_groups partials contiguous) so the last workgroup
// sums each expert's row with one subgroup; the sum order is fixed: results are deterministic.
// Memory order: each workgroup's y stores and partials are made available (memoryBarrierBuffer)
// before its arrival; the last workgroup reads them after its own (y and partials are coherent).
//
// The including kernel (matvec_q8.comp) defines ROUTE_EPILOGUE 1, WG_SIZE, ROWS_PER_WG, declares
// `y[]` coherent, the push-constant block with `rargs` (RouteEpilogueArgs), and calls
// route_epilogue() from uniform control flow after every team stored its rows and wrote their
// final values to ep_h[].
// Bindings: 5 = W_router f32 [E][n], 6 = ffn_norm f32 [n], 7 = partials f32 [E][n_groups],
// 8 = route (uint: 2K pair words, then the arrival counter, zero before the first dispatch and
// reset by the last workgroup), 9 = expert bias f32 [E], 10 = h2 f32 [n] (out).
#ifndef TESSERA_ROUTE_EPILOGUE_GLSL
#define TESSERA_ROUTE_EPILOGUE_GLSL

#include "moe_args.h"

layout(std430, binding = 5) readonly restrict buffer RouterW { float router_w[]; };
layout(std430, binding = 6) readonly restrict buffer FfnNorm { float ffn_norm[]; };
layout(std430, binding = 7) coherent restrict buffer RoutePart { float route_part[]; };
layout(std430, binding = 8) coherent restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 9) readonly restrict buffer BiasBuf { float route_bias[]; };
layout(std430, binding = 10) writeonly restrict buffer H2Buf { float h2[]; };

shared float ep_h[ROWS_PER_WG];                  // this workgroup's finished rows of h
shared float route_logits[TS_ROUTE_MAX_E];       // read by routing.glsl
shared bool ep_last;

#include "routing.glsl"

// wg: this workgroup's index (< rargs.n_groups); rows [row0, row0 + nrows) are its rows of h,
// their values in ep_h (visible after a barrier). Returns at once in all but the last workgroup.
void route_epilogue(uint wg, uint row0, uint nrows) {
  const uint tid = gl_LocalInvocationIndex, n = args.rows, E = rargs.n_expert, G = rargs.n_groups;
  barrier();  // ep_h complete
  for (uint e = tid; e < E; e += WG_SIZE) {
    float a = 0.0;
    for (uint r = 0; r < nrows; ++r) a += router_w[e * n + row0 + r] * (ffn_norm[row0 + r] * ep_h[r]);
    route_part[e * G + wg] = a;
  }
  memoryBarrierBuffer();  // y rows and partials available before the arrival
  barrier();
  const uint counter = 2u * rargs.n_used;
  if (tid == 0) ep_last = atomicAdd(route[counter], 1u) == G - 1u;
  barrier();
  if (!ep_last) return;  // uniform
  memoryBarrierBuffer();

  float ss = 0.0;
  for (uint k = tid; k < n; k += WG_SIZE) {
    const float v = y[k];
    ss += v * v;
  }
  const float inv_rms = inversesqrt(workgroup_sum(ss) / float(n) + rargs.eps);
#if USE_SUBGROUP
  // Subgroup s sums experts s, s + S, ...; four experts per round keep more loads in flight.
  const uint S = WG_SIZE / SUBGROUP_SIZE, lane = gl_SubgroupInvocationID;
  for (uint e0 = gl_SubgroupID; e0 < E; e0 += 4u * S) {
    float a[4];
    [[unroll]] for (uint u = 0; u < 4; ++u) {
      a[u] = 0.0;
      const uint e = e0 + u * S;
      if (e < E)
        for (uint j = lane; j < G; j += SUBGROUP_SIZE) a[u] += route_part[e * G + j];
    }
    [[unroll]] for (uint u = 0; u < 4; ++u) {
      const float s = subgroupAdd(a[u]);
      const uint e = e0 + u * S;
      if (e < E && subgroupElect()) route_logits[e] = s * inv_rms;
    }
  }
#else
  for (uint e = tid; e < E; e += WG_SIZE) {
    float s = 0.0;
    for (uint j = 0; j < G; ++j) s += route_part[e * G + j];
    route_logits[e] = s * inv_rms;
  }
#endif
  barrier();
  route_compute(E, rargs.n_used, rargs.gating, rargs.flags, rargs.weights_scale);
  if (tid < rargs.n_used) {
    route[2u * tid] = route_expert(tid);
    route[2u * tid + 1u] = floatBitsToUint(route_weight(tid));
  }
  for (uint k = tid; k < n; k += WG_SIZE) h2[k] = y[k] * inv_rms * ffn_norm[k];
  if (tid == 0) atomicExchange(route[counter], 0u);
}

#endif  // TESSERA_ROUTE_EPILOGUE_GLSL
