// The MoE router as the epilogue of the matvec that finishes the attention block (W_vo, or
// attn_output when factored), so the decode step has no router dispatch and no barrier before it:
//
//   h = x + W o                       the matvec's rows, ROWS_PER_WG per workgroup (y, in place)
//   part[e][wg] = sum_{r in wg} W_router[e][r] * ffn_norm[r] * h[r]     every workgroup, e < E
//   part[E][wg] = sum_{r in wg} h[r]^2
//   then the last workgroup to arrive (atomic arrival counter, as in router.comp):
//     inv_rms   = 1 / sqrt(sum_wg part[E][wg] / n + eps)
//     logits[e] = inv_rms * sum_wg part[e][wg]    (== W_router . RMSNorm(h; ffn_norm))
//     route     = routing(logits)                 (routing.glsl: gating, bias, top-K, weights)
//     h2        = h * ffn_norm * inv_rms          (the expert kernels' input, as router.comp writes)
//
// The partials are value-major (value v's n_groups partials contiguous, rows padded with zeros to
// a multiple of 4) so the last workgroup sums each row with 16-byte loads; the sum order is fixed:
// results are deterministic.
// Memory order: each workgroup's y stores and partials are made available (memoryBarrierBuffer)
// before its arrival; the last workgroup reads them after its own (y and partials are coherent).
//
// The including kernel (matvec_q8.comp) defines ROUTE_EPILOGUE 1, WG_SIZE, ROWS_PER_WG, declares
// `y[]` coherent, the push-constant block with `rargs` (RouteEpilogueArgs), and calls
// route_epilogue() from uniform control flow after every team stored its rows and wrote their
// final values to ep_h[].
// Bindings: 5 = W_router f32 [E][n], 6 = ffn_norm f32 [n], 7 = partials f32 [E + 1][4 ceil(n_groups / 4)],
// 8 = route (uint: 2K pair words, then the arrival counter, zero before the first dispatch and
// reset by the last workgroup), 9 = expert bias f32 [E], 10 = h2 f32 [n] (out).
#ifndef TESSERA_ROUTE_EPILOGUE_GLSL
#define TESSERA_ROUTE_EPILOGUE_GLSL

#include "moe_args.h"

layout(std430, binding = 5) readonly restrict buffer RouterW { float router_w[]; };
layout(std430, binding = 6) readonly restrict buffer FfnNorm { float ffn_norm[]; };
layout(std430, binding = 7) coherent buffer RoutePart { float route_part[]; };  // [E + 1][4 * G4]
layout(std430, binding = 7) coherent buffer RoutePart4 { vec4 route_part4[]; };
layout(std430, binding = 8) coherent restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 9) readonly restrict buffer BiasBuf { float route_bias[]; };
layout(std430, binding = 10) writeonly restrict buffer H2Buf { float h2[]; };

shared float ep_h[ROWS_PER_WG];                  // this workgroup's finished rows of h
shared float route_logits[TS_ROUTE_MAX_E];       // read by routing.glsl
shared float ep_sum[WG_SIZE];                    // per-thread sums of partials (several lanes per value)
shared float ep_val[TS_ROUTE_MAX_E + 1];         // summed partials: E logit numerators, then sum(h^2)
shared bool ep_last;

#include "routing.glsl"

// wg: this workgroup's index (< rargs.n_groups); rows [row0, row0 + nrows) are its rows of h,
// their values in ep_h (visible after a barrier). Returns at once in all but the last workgroup.
// Every loop below keeps its loads independent (unrolled over a constant bound): a chain of
// dependent L2 round trips in one workgroup is what makes such a tail slow.
void route_epilogue(uint wg, uint row0, uint nrows) {
  const uint tid = gl_LocalInvocationIndex, n = args.rows, E = rargs.n_expert, G = rargs.n_groups;
  const uint G4 = (G + 3u) / 4u;  // vec4 per value row of the partials (padding zero-filled)
  barrier();  // ep_h complete
  for (uint e = tid; e <= E; e += WG_SIZE) {  // value E: this workgroup's sum of h^2
    float a = 0.0;
    [[unroll]] for (uint r = 0; r < ROWS_PER_WG; ++r) {
      if (r < nrows) {
        const float hv = ep_h[r];
        a += e < E ? router_w[e * n + row0 + r] * (ffn_norm[row0 + r] * hv) : hv * hv;
      }
    }
    route_part[e * 4u * G4 + wg] = a;
    if (wg == G - 1u)
      for (uint j = G; j < 4u * G4; ++j) route_part[e * 4u * G4 + j] = 0.0;
  }
  memoryBarrierBuffer();  // y rows and partials available before the arrival
  barrier();
  const uint counter = 2u * rargs.n_used;
  if (tid == 0) ep_last = atomicAdd(route[counter], 1u) == G - 1u;
  barrier();
  if (!ep_last) return;  // uniform
  memoryBarrierBuffer();

  // Value v's partials summed by `lanes` threads (16 vec4 loads in flight each), then in order.
  const uint lanes = max(1u, uint(WG_SIZE) / (E + 1u)), lane = tid % lanes;
  for (uint v = tid / lanes; v <= E; v += uint(WG_SIZE) / lanes) {
    vec4 acc[16];
    [[unroll]] for (uint u = 0; u < 16; ++u) acc[u] = vec4(0.0);
    for (uint j = lane; j < G4; j += 16u * lanes) {
      [[unroll]] for (uint u = 0; u < 16; ++u) {
        const uint jj = j + u * lanes;
        if (jj < G4) acc[u] += route_part4[v * G4 + jj];
      }
    }
    [[unroll]] for (uint u = 1; u < 16; ++u) acc[0] += acc[u];
    const float sum = (acc[0].x + acc[0].y) + (acc[0].z + acc[0].w);
    if (lanes == 1u) ep_val[v] = sum;
    else ep_sum[tid] = sum;  // one pass: (E + 1) * lanes <= WG_SIZE
  }
  barrier();
  if (lanes > 1u && lane == 0u && tid / lanes <= E) {
    float sum = 0.0;
    for (uint l = 0; l < lanes; ++l) sum += ep_sum[tid + l];
    ep_val[tid / lanes] = sum;
  }
  barrier();
  const float inv_rms = inversesqrt(ep_val[E] / float(n) + rargs.eps);
  for (uint e = tid; e < E; e += WG_SIZE) route_logits[e] = ep_val[e] * inv_rms;
  barrier();
  route_compute(E, rargs.n_used, rargs.gating, rargs.flags, rargs.weights_scale);
  if (tid < rargs.n_used) {
    route[2u * tid] = route_expert(tid);
    route[2u * tid + 1u] = floatBitsToUint(route_weight(tid));
  }
  // h2, four independent loads per thread at a time
  for (uint k0 = tid; k0 < n; k0 += 4u * WG_SIZE) {
    float v[4];
    [[unroll]] for (uint u = 0; u < 4; ++u) {
      const uint k = k0 + u * WG_SIZE;
      v[u] = k < n ? y[k] : 0.0;
    }
    [[unroll]] for (uint u = 0; u < 4; ++u) {
      const uint k = k0 + u * WG_SIZE;
      if (k < n) h2[k] = v[u] * inv_rms * ffn_norm[k];
    }
  }
  if (tid == 0) atomicExchange(route[counter], 0u);
}

#endif  // TESSERA_ROUTE_EPILOGUE_GLSL
