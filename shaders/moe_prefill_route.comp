#version 450
// Prefill MoE routing (docs/PREFILL.md): the routing of every token of a chunk, then the
// per-expert pair lists the expert kernels (moe_prefill.comp, moe_matmul.comp) loop over. Two
// dispatches with a barrier between them (PrefillRouteOp):
//   LISTS 0, workgroup t < n (n = step[count_word]): routing.glsl (the decode step's code) on the
//     logits of token t -> route[2(t*K + k)] = expert, route[2(t*K + k) + 1] = weight bits, k < K;
//     workgroups t >= n exit.
//   LISTS 1, workgroup e < E: lists[e] = expert e's pair count, lists[E + e*T + j] = its pairs
//     p = t*K + k in ascending order (deterministic: no atomics decide the order), WG_SIZE pairs
//     at a time: a hit's place is the hits before it (subgroup prefix sums, then the subgroups'
//     totals through shared memory; without subgroups invocation 0 places them).
// (Until session 22 the last workgroup of the routing, found by an arrival counter, built every
// list: 132 us of a 512-token chunk on an H100, its 512 arrivals on one word and its one
// workgroup's scan.) Arguments: PrefillRouteArgs (prefill_args.h).
// Wrapper: PrefillRouteOp (runtime/vulkan/kernels_prefill.h).
//
//   FROM_X 1 (LISTS 0; short chunks, session 25): the workgroup of token t first computes the
//     logits itself, logits[t][e] = router[e] . RMSNorm(x[t]; norm) in f32 (written to binding 0
//     too), instead of a router matmul, its split-K sum and two barriers before this dispatch.
//     x[t] * norm is staged in shared memory; team e of LANES invocations takes router row e
//     (lane l: vec4s l, l + LANES, ...; WG_SIZE / LANES rows at once), each sum times 1/rms.
//
// Defines: WG_SIZE, N_EXPERT (E, the logits row length), LISTS (0/1), LISTS_SUBGROUP (0/1: the
// lists by subgroup prefix sums, which needs full subgroups of the required size; else the
// shared-memory path); FROM_X (0/1), with it N_EMBD (x's and the router's row length, a multiple
// of 4), LANES (invocations per router row; WG_SIZE a power of two, at least 64), BATCH (a
// lane's router loads issued together), W_F16 (0/1: the router as f16, else f32).
// Bindings: 0 = logits [T][E], 1 = bias [E], 2 = step (uint), 3 = route (uint), 4 = lists (uint);
// FROM_X: 5 = x [T][N_EMBD] f32, 6 = norm weight [N_EMBD] f32, 7 = router [E][N_EMBD].

#include "common.glsl"
#include "prefill_args.h"

layout(local_size_x = WG_SIZE) in;

struct TokenLogits {
  float v[N_EXPERT];
};
#ifndef FROM_X
#define FROM_X 0
#endif
#if FROM_X && LISTS
#error "moe_prefill_route.comp: FROM_X is a mode of the routing dispatch (LISTS 0)"
#endif
#if FROM_X
layout(std430, binding = 0) writeonly restrict buffer LogitBuf { float logits_out[]; };
#else
layout(std430, binding = 0) readonly restrict buffer LogitBuf { TokenLogits tok_logits[]; };
#endif
layout(std430, binding = 1) readonly restrict buffer BiasBuf { float route_bias[]; };
layout(std430, binding = 2) readonly restrict buffer StepBuf { uint step_words[]; };
#if LISTS
layout(std430, binding = 3) readonly restrict buffer RouteBuf { uint route[]; };
#else
layout(std430, binding = 3) writeonly restrict buffer RouteBuf { uint route[]; };
#endif
layout(std430, binding = 4) writeonly restrict buffer ListBuf { uint lists[]; };

layout(push_constant) uniform Push { PrefillRouteArgs args; };

#if LISTS
#if !defined(LISTS_SUBGROUP) || !USE_SUBGROUP
#undef LISTS_SUBGROUP
#define LISTS_SUBGROUP 0
#endif
#if LISTS_SUBGROUP
shared uint sh_total[WG_SIZE];  // each subgroup's hits (indexed by gl_SubgroupID)
#else
shared uint sh_hit[WG_SIZE];
shared uint sh_count;
#endif

void main() {
  const uint e = gl_WorkGroupID.x;
  const uint n_pairs = min(step_words[args.count_word], args.t_max) * args.n_used;
  const uint at = args.n_expert + e * args.t_max;  // the list's first entry
  uint c = 0u;                                     // pairs listed so far (uniform)
  for (uint base = 0u; base < n_pairs; base += uint(WG_SIZE)) {  // uniform
#if LISTS_SUBGROUP
    // Pairs in (subgroup, lane) order: full subgroups cover base .. base + WG_SIZE - 1.
    const uint p = base + gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    const uint hit = p < n_pairs && route[2u * p] == e ? 1u : 0u;
    const uint before = subgroupExclusiveAdd(hit), total = subgroupAdd(hit);
    if (subgroupElect()) sh_total[gl_SubgroupID] = total;
    barrier();
    uint earlier = 0u, all = 0u;
    for (uint s = 0u; s < gl_NumSubgroups; ++s) {
      earlier += s < gl_SubgroupID ? sh_total[s] : 0u;
      all += sh_total[s];
    }
    if (hit != 0u) lists[at + c + earlier + before] = p;
    c += all;
    barrier();  // sh_total is rewritten by the next round
#else
    const uint p = base + gl_LocalInvocationIndex;
    sh_hit[gl_LocalInvocationIndex] = p < n_pairs && route[2u * p] == e ? 1u : 0u;
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
      uint k = c;
      for (uint i = 0u; i < uint(WG_SIZE); ++i)
        if (sh_hit[i] != 0u) lists[at + k++] = base + i;
      sh_count = k;
    }
    barrier();
    c = sh_count;
    barrier();  // sh_hit and sh_count are rewritten by the next round
#endif
  }
  if (gl_LocalInvocationIndex == 0u) lists[e] = c;
}

#else  // LISTS == 0

#if FROM_X
layout(std430, binding = 5) readonly restrict buffer XBuf { vec4 x4[]; };
layout(std430, binding = 6) readonly restrict buffer NormBuf { vec4 nw4[]; };
#if W_F16
layout(std430, binding = 7) readonly restrict buffer RouterBuf { uvec2 w16[]; };  // 4 halves each
vec4 router4(uint i) { const uvec2 u = w16[i]; return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)); }
#else
layout(std430, binding = 7) readonly restrict buffer RouterBuf { vec4 w4[]; };
vec4 router4(uint i) { return w4[i]; }
#endif

#define N4 (N_EMBD / 4)
#define TEAMS (WG_SIZE / LANES)              // router rows at once
#define ITERS ((N4 + LANES - 1) / LANES)     // a lane's vec4s of a row
#ifndef BATCH
#define BATCH 8                              // loads issued before their products
#endif
shared vec4 sh_x[N4];         // x[t] * norm weight
shared float sh_part[WG_SIZE];  // the rows' partial dot products
shared float sh_logit[N_EXPERT];
#define ROUTE_LOGIT(e) sh_logit[e]
#include "routing.glsl"

// Batch j0 / BATCH of this lane's vec4s of router row e (zeros past the row or the experts).
void router_batch(uint e, uint lane, uint j0, out vec4 w[BATCH]) {
  [[unroll]] for (uint j = 0u; j < BATCH; ++j) {
    const uint i = lane + (j0 + j) * LANES;
    w[j] = i < N4 && e < args.n_expert ? router4(e * N4 + i) : vec4(0.0);
  }
}

// sh_logit = the logits of token t; written to binding 0 too. Uniform control flow. The first
// batch of router words is loaded before x is staged (it does not depend on x).
void logits_from_x(uint t) {
  const uint tid = gl_LocalInvocationIndex;
  const uint lane = tid % LANES, team = tid / LANES;
  vec4 w[BATCH];
  router_batch(team, lane, 0u, w);
  float ss = 0.0;
  for (uint i = tid; i < N4; i += WG_SIZE) {
    const vec4 v = x4[t * N4 + i];
    ss += dot(v, v);
    sh_x[i] = v * nw4[i];
  }
  // 1/rms of the row (workgroup_sum's barriers also publish sh_x).
  const float inv_rms = inversesqrt(workgroup_sum(ss) / float(N_EMBD) + args.norm_eps);
  for (uint e0 = 0u; e0 < args.n_expert; e0 += TEAMS) {  // uniform
    const uint e = e0 + team;
    float acc = 0.0;
    for (uint j0 = 0u; j0 < ITERS; j0 += BATCH) {
      if (e0 != 0u || j0 != 0u) router_batch(e, lane, j0, w);
      [[unroll]] for (uint j = 0u; j < BATCH; ++j) {
        const uint i = lane + (j0 + j) * LANES;
        if (i < N4) acc += dot(w[j], sh_x[i]);
      }
    }
    sh_part[tid] = acc;
    barrier();
    if (tid < TEAMS && e0 + tid < args.n_expert) {
      float s = 0.0;
      for (uint l = 0u; l < LANES; ++l) s += sh_part[tid * LANES + l];
      sh_logit[e0 + tid] = s * inv_rms;
      logits_out[t * args.n_expert + e0 + tid] = s * inv_rms;
    }
    barrier();
  }
}
#else
// routing.glsl reads route_logits[e]: here the logits row of this workgroup's token.
uint g_token = 0u;
#define route_logits tok_logits[g_token].v
#include "routing.glsl"
#endif

void main() {
  const uint t = gl_WorkGroupID.x;
  if (t >= min(step_words[args.count_word], args.t_max)) return;  // uniform per workgroup
  const uint K = args.n_used;
#if FROM_X
  logits_from_x(t);
#else
  g_token = t;
#endif
  route_compute(args.n_expert, K, args.gating, args.route_flags, args.weights_scale);
  if (gl_LocalInvocationIndex < K) {
    route[2u * (t * K + gl_LocalInvocationIndex)] = route_expert(gl_LocalInvocationIndex);
    route[2u * (t * K + gl_LocalInvocationIndex) + 1u] = floatBitsToUint(route_weight(gl_LocalInvocationIndex));
  }
}
#endif
