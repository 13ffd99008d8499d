#version 450
// MoE router and routing in one dispatch (decode_plan.md D8; no separate top-k dispatch):
//   TS_ROUTER_LOGITS: one workgroup per router row: h2 = RMSNorm(x; ffn_norm), logits[e] =
//     W_router[e] . h2 (each invocation loads its share of x, the norm weight and the row at once;
//     the workgroup reduces sum(x^2) and the dot product together). The workgroups also write h2
//     (a share each), which the gate-up kernel reads after the barrier instead of normalizing again.
//   Then the last workgroup to finish (atomic arrival counter) computes the routing from all the
//     logits (routing.glsl) and writes the K (expert, weight) pairs the expert kernels read.
//   Without TS_ROUTER_LOGITS: one workgroup, the routing of given logits only.
// Arguments: RouterArgs (moe_args.h). Wrapper: RouterOp / RouteOp (runtime/vulkan/kernels_moe.h).
// The decode step uses it only where the router fold is off (router_partial.glsl, moe_gateup.comp
// ROUTER_FOLD); the batched prefill always.
//
// Defines: WTYPE (F32, F16 or BF16: the router is a plain matrix), WG_SIZE, VEC4 (F32 with
// n_embd % 4 == 0: 16-byte loads).
// Bindings: 0 = W_router [n_expert][n_embd], 1 = x, 2 = norm weight, 3 = logits (out, or in),
// 4 = h2 (out), 5 = expert bias, 6 = route (uint: 2*n_used pair words, then the arrival counter,
// zero before the first dispatch and reset by the last workgroup).

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
layout(std430, binding = 3) coherent restrict buffer LogitBuf { float route_logits[]; };
layout(std430, binding = 4) writeonly restrict buffer H2Buf { float h2[]; };
layout(std430, binding = 5) readonly restrict buffer BiasBuf { float route_bias[]; };
layout(std430, binding = 6) coherent restrict buffer RouteBuf { uint route[]; };

layout(push_constant) uniform Push { RouterArgs args; };

#include "routing.glsl"

shared bool is_last;

// logits[row] = W[row] . RMSNorm(x; nw); workgroup 0 writes h2.
void router_row(uint row) {
  const uint n = args.n_embd, tid = gl_LocalInvocationIndex;
  float ss = 0.0, acc = 0.0;
#if VEC4 && WTYPE == TS_TYPE_F32
  // Four vec4 of each input per thread and round, loaded before they are used (GLM: n = 2048 is
  // one round of 128 threads): the loads of a round are in flight together.
  const uint base4 = row * (n >> 2), n4 = n >> 2;
  for (uint k0 = tid; k0 < n4; k0 += 4u * WG_SIZE) {
    vec4 xv[4], wv[4], gv[4];
    [[unroll]] for (uint u = 0; u < 4; ++u) {
      const uint k = min(k0 + u * WG_SIZE, n4 - 1u);
      xv[u] = x4[k];
      wv[u] = uintBitsToFloat(w_q[base4 + k]);
      gv[u] = nw4[k];
    }
    [[unroll]] for (uint u = 0; u < 4; ++u) {
      if (k0 + u * WG_SIZE < n4) {
        ss += dot(xv[u], xv[u]);
        acc += dot(wv[u], xv[u] * gv[u]);
      }
    }
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
  if (tid == 0) route_logits[row] = acc * inv_rms;
  // h2: each workgroup writes its share (one element per invocation for GLM sizes), so no
  // workgroup has a long tail.
  const uint share = (n + args.n_expert - 1) / args.n_expert;
  for (uint k = row * share + tid; k < min(n, (row + 1u) * share); k += WG_SIZE) h2[k] = x[k] * inv_rms * nw[k];
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const bool with_logits = (args.flags & TS_ROUTER_LOGITS) != 0u;
  if (with_logits) router_row(linear_workgroup_id());
  if ((args.flags & TS_ROUTER_ROUTE) == 0u) return;

  // Arrival: the last workgroup sees every logit.
  const uint counter = 2u * args.n_used;
  memoryBarrierBuffer();
  barrier();
  if (tid == 0) is_last = atomicAdd(route[counter], 1u) == (with_logits ? args.n_expert : 1u) - 1u;
  barrier();
  if (!is_last) return;
  memoryBarrierBuffer();

  route_compute(args.n_expert, args.n_used, args.gating, args.flags, args.weights_scale);
  if (tid < args.n_used) {
    route[2u * tid] = route_expert(tid);
    route[2u * tid + 1u] = floatBitsToUint(route_weight(tid));
  }
  if (tid == 0) atomicExchange(route[counter], 0u);
}
