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
// Defines: WG_SIZE, N_EXPERT (E, the logits row length), LISTS (0/1), LISTS_SUBGROUP (0/1: the
// lists by subgroup prefix sums, which needs full subgroups of the required size; else the
// shared-memory path).
// Bindings: 0 = logits [T][E], 1 = bias [E], 2 = step (uint), 3 = route (uint), 4 = lists (uint).

#include "common.glsl"
#include "prefill_args.h"

layout(local_size_x = WG_SIZE) in;

struct TokenLogits {
  float v[N_EXPERT];
};
layout(std430, binding = 0) readonly restrict buffer LogitBuf { TokenLogits tok_logits[]; };
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

// routing.glsl reads route_logits[e]: here the logits row of this workgroup's token.
uint g_token = 0u;
#define route_logits tok_logits[g_token].v
#include "routing.glsl"

void main() {
  const uint t = gl_WorkGroupID.x;
  if (t >= min(step_words[args.count_word], args.t_max)) return;  // uniform per workgroup
  const uint K = args.n_used;
  g_token = t;
  route_compute(args.n_expert, K, args.gating, args.route_flags, args.weights_scale);
  if (gl_LocalInvocationIndex < K) {
    route[2u * (t * K + gl_LocalInvocationIndex)] = route_expert(gl_LocalInvocationIndex);
    route[2u * (t * K + gl_LocalInvocationIndex) + 1u] = floatBitsToUint(route_weight(gl_LocalInvocationIndex));
  }
}
#endif
