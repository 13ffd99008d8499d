#version 450
// Prefill MoE routing (docs/PREFILL.md): the routing of every token of a chunk, then the
// per-expert token lists the expert kernels (moe_prefill.comp) loop over.
//   workgroup t < n (n = step[count_word]): routing.glsl (the decode step's code) on the logits
//     of token t -> route[2(t*K + k)] = expert, route[2(t*K + k) + 1] = weight bits, k < K;
//   the last workgroup to arrive (counter route[2*T*K], reset by it): for each expert e,
//     lists[e] = its pair count, lists[E + e*T + j] = its pairs p = t*K + k in ascending order
//     (deterministic: no atomics decide the order). With subgroups each subgroup lists its
//     experts a subgroup's width of pairs at a time (prefix sums of the hits); without, each
//     invocation scans every pair for its experts.
// Workgroups t >= n only arrive. Arguments: PrefillRouteArgs (prefill_args.h).
// Wrapper: PrefillRouteOp (runtime/vulkan/kernels_prefill.h).
//
// Defines: WG_SIZE, N_EXPERT (E, the logits row length).
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
layout(std430, binding = 3) coherent restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 4) writeonly restrict buffer ListBuf { uint lists[]; };

layout(push_constant) uniform Push { PrefillRouteArgs args; };

// routing.glsl reads route_logits[e]: here the logits row of this workgroup's token.
uint g_token = 0u;
#define route_logits tok_logits[g_token].v
#include "routing.glsl"

shared bool is_last;
#define PF_TILE 1024u
shared uint sh_expert[PF_TILE];        // experts of pairs base .. base + PF_TILE - 1
shared uint sh_count[TS_ROUTE_MAX_E];  // pairs listed so far per expert

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint t = gl_WorkGroupID.x;
  const uint n = min(step_words[args.count_word], args.t_max);
  const uint K = args.n_used;
  if (t < n) {  // uniform per workgroup
    g_token = t;
    route_compute(args.n_expert, K, args.gating, args.route_flags, args.weights_scale);
    if (tid < K) {
      route[2u * (t * K + tid)] = route_expert(tid);
      route[2u * (t * K + tid) + 1u] = floatBitsToUint(route_weight(tid));
    }
  }

  // Arrival: the last workgroup sees every token's choice.
  const uint counter = 2u * args.t_max * K;
  memoryBarrierBuffer();
  barrier();
  if (tid == 0) is_last = atomicAdd(route[counter], 1u) == args.t_max - 1u;
  barrier();
  if (!is_last) return;
  memoryBarrierBuffer();

  // The chosen experts are staged PF_TILE pairs at a time in shared memory (one coalesced load
  // each), then every invocation scans the tile for its experts.
  for (uint e = tid; e < args.n_expert; e += WG_SIZE) sh_count[e] = 0u;
  const uint n_pairs = n * K;
  for (uint base = 0u; base < n_pairs; base += PF_TILE) {
    const uint len = min(uint(PF_TILE), n_pairs - base);
    barrier();
    for (uint i = tid; i < len; i += WG_SIZE) sh_expert[i] = route[2u * (base + i)];
    barrier();
#if USE_SUBGROUP
    // Each subgroup takes experts gl_SubgroupID + k gl_NumSubgroups and walks the tile a subgroup's
    // width at a time: a lane's pair lands after the earlier lanes' hits (exclusive prefix sum).
    for (uint e = gl_SubgroupID; e < args.n_expert; e += gl_NumSubgroups) {
      uint c = sh_count[e];
      for (uint i0 = 0u; i0 < len; i0 += gl_SubgroupSize) {
        const uint i = i0 + gl_SubgroupInvocationID;
        const uint hit = i < len && sh_expert[i] == e ? 1u : 0u;
        const uint before = subgroupExclusiveAdd(hit);
        if (hit != 0u) lists[args.n_expert + e * args.t_max + c + before] = base + i;
        c += subgroupAdd(hit);
      }
      subgroupBarrier();  // every lane has read sh_count[e]
      if (subgroupElect()) sh_count[e] = c;
    }
#else
    for (uint e = tid; e < args.n_expert; e += WG_SIZE) {
      uint c = sh_count[e];
      for (uint i = 0u; i < len; ++i) {
        if (sh_expert[i] == e) {
          lists[args.n_expert + e * args.t_max + c] = base + i;
          ++c;
        }
      }
      sh_count[e] = c;
    }
#endif
  }
  barrier();
  for (uint e = tid; e < args.n_expert; e += WG_SIZE) lists[e] = sh_count[e];
  if (tid == 0) atomicExchange(route[counter], 0u);
}
