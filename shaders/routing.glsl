// MoE routing of one token (forward.md section 5.2 steps 2-7) from the E router logits, run by
// the last workgroup of the router dispatch (router.comp), so there is no separate top-k
// dispatch and the expert kernels only read the K (expert, weight) pairs it writes. The expert
// kernels can also run it themselves in every workgroup (TS_MOE_ROUTE_RECOMPUTE; same results,
// about the same block time on an H200: ~4 us more per expert kernel, ~4 us less in the router).
//
//   probs  = sigmoid(logits) or softmax(logits)              (gating)
//   score  = probs + bias (TS_ROUTER_EXPERT_BIAS), NaN -> -inf   (bias steers the choice only)
//   ids    = top-K by score, best first, ties -> lower expert index
//   w_k    = probs[ids_k]; / max(sum_k w_k, 6.103515625e-5) (TS_ROUTER_NORM_WEIGHTS);
//            * scale when scale is not 0 or 1
//
// With subgroup arithmetic, subgroup 0 alone computes it in registers (K rounds of an integer
// subgroup max and min over order-preserving keys of the scores, no barrier inside) and publishes the result through shared memory: the routing then
// costs one pair of global loads, a few hundred cycles and one workgroup barrier. (Ranking every
// expert against all scores in shared memory instead was 1.2 us slower on an H100, session 13.)
// Without, the whole workgroup computes it through shared memory (ranks of every expert).
//
// The including kernel defines WG_SIZE and declares the float buffers `route_logits[]` and
// `route_bias[]` (bias read only with TS_ROUTER_EXPERT_BIAS) before #include "routing.glsl", or
// defines ROUTE_LOGIT(e) to read logit e from elsewhere (the router fold: shared memory).
// route_compute() must be reached by all invocations (uniform control flow: barriers).
// ROUTE_RANKS (0; 1 for sigmoid gating, 2 for softmax; WG_SIZE >= ROUTE_E,
// subgroups of at least 8 with shuffles; the wrapper sets it, kernels_moe.cpp route_ranks()): the
// whole workgroup ranks the experts instead of subgroup 0's K rounds (below: route_ranks). Same ids
// and the same weight bits.
// ROUTE_E (a multiple of 32, <= TS_ROUTE_MAX_E; default TS_ROUTE_MAX_E): the most experts the
// kernel routes among (the wrapper's n_expert rounded up); it sizes the per-lane arrays and the
// unrolled code. ROUTE_RECOMPUTE (0/1, default 1): 0 where the including kernel never routes
// (it reads the route buffer), so that its recompute_route() is a constant false and none of this
// code is compiled in (kernels_moe.cpp route_e()).
#ifndef TESSERA_ROUTING_GLSL
#define TESSERA_ROUTING_GLSL

#include "moe_args.h"

#ifndef ROUTE_E
#define ROUTE_E TS_ROUTE_MAX_E
#endif
#ifndef ROUTE_RECOMPUTE
#define ROUTE_RECOMPUTE 1
#endif

#ifndef ROUTE_LOGIT
#define ROUTE_LOGIT(e) route_logits[e]
#endif
#ifndef ROUTE_BIAS  // the including kernel may read the bias from elsewhere (shared memory)
#define ROUTE_BIAS(e) route_bias[e]
#endif

shared uint rt_id[TS_ROUTE_MAX_K];  // chosen experts, best first
shared float rt_w[TS_ROUTE_MAX_K];  // their final weights

// Selection score of expert e with probability p (NaN -> -inf).
float route_score(uint e, float p, uint flags) {
  const float s = (flags & TS_ROUTER_EXPERT_BIAS) != 0u ? p + ROUTE_BIAS(e) : p;
  return isnan(s) ? uintBitsToFloat(0xFF800000u) : s;
}

// Sigmoid gating's probability of logit l: one expression for every path, so that the ranks and
// the rounds see the same bits.
float route_sigmoid(float l) { return 1.0 / (1.0 + exp(-l)); }

// A key whose unsigned order is the float order of s (s not NaN; -0 as +0, equal to it), > 0.
uint route_key(float s) {
  const uint u = floatBitsToUint(s == 0.0 ? 0.0 : s);
  return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
}

// Normalization and scale of the weights (same arithmetic in every path).
float route_factor(float sum, uint flags, float scale) {
  float f = (flags & TS_ROUTER_NORM_WEIGHTS) != 0u ? 1.0 / max(sum, 6.103515625e-5) : 1.0;
  if (scale != 0.0 && scale != 1.0) f *= scale;
  return f;
}

#if USE_SUBGROUP && SUBGROUP_SIZE >= 8  // RT_PER_LANE <= 32 entries per lane
#define RT_SUBGROUP_PATH 1
#define RT_PER_LANE ((ROUTE_E + SUBGROUP_SIZE - 1) / SUBGROUP_SIZE)  // entries per lane

// One subgroup: the probabilities of experts e = lane + j * gl_SubgroupSize (lane `lane`, entry j;
// softmax: a subgroup max and sum over them all).
void route_lane_probs(uint n_expert, uint gating, out float prob[RT_PER_LANE]) {
  const uint lane = gl_SubgroupInvocationID, step = gl_SubgroupSize;
  const float ninf = uintBitsToFloat(0xFF800000u);
  [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j) {
    const uint e = lane + j * step;
    prob[j] = e < n_expert ? ROUTE_LOGIT(e) : ninf;
  }
  if (gating == TS_GATING_SOFTMAX) {
    float mx = ninf;
    [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j) mx = max(mx, prob[j]);
    mx = subgroupMax(mx);
    float sum = 0.0;
    [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j) {
      prob[j] = lane + j * step < n_expert ? exp(prob[j] - mx) : 0.0;
      sum += prob[j];
    }
    sum = subgroupAdd(sum);
    [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j) prob[j] /= sum;
  } else {
    [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j) prob[j] = route_sigmoid(prob[j]);
  }
}

// Subgroup 0: expert e = lane + j * gl_SubgroupSize lives in lane `lane`, entry j.
void route_subgroup(uint n_expert, uint n_used, uint gating, uint flags, float scale) {
  const uint lane = gl_SubgroupInvocationID, step = gl_SubgroupSize;
  float prob[RT_PER_LANE];
  route_lane_probs(n_expert, gating, prob);
  // K rounds: the best remaining (score, lower index), the score as an order-preserving integer
  // key (an integer max: one instruction on some GPUs, where a float max is a chain of shuffles),
  // then the lowest expert among the lanes that hold it (an integer min). The winning lane
  // records the expert and its probability in shared memory and drops the entry (key 0: below
  // every valid key; -inf maps above it).
  uint key[RT_PER_LANE];
  [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j) {
    const uint e = lane + j * step;
    key[j] = e < n_expert ? route_key(route_score(e, prob[j], flags)) : 0u;
  }
  for (uint k = 0; k < n_used; ++k) {
    uint bk = 0u, bi = 0xFFFFFFFFu;
    [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j)
      if (key[j] > bk) {  // equal keys: the lower j, the lower expert, stays
        bk = key[j];
        bi = lane + j * step;
      }
    const uint mk = subgroupMax(bk);
    const uint win = subgroupMin(bk == mk ? bi : 0xFFFFFFFFu);
    if (bi == win) {
      rt_id[k] = win;
      [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j)
        if (lane + j * step == win) {
          rt_w[k] = prob[j];
          key[j] = 0u;
        }
    }
  }
  subgroupMemoryBarrierShared();
  subgroupBarrier();
  if (subgroupElect()) {
    float wsum = 0.0;
    for (uint k = 0; k < n_used; ++k) wsum += rt_w[k];  // in rank order, as the host sums
    const float f = route_factor(wsum, flags, scale);
    for (uint k = 0; k < n_used; ++k) rt_w[k] *= f;
  }
}
#endif

#ifndef ROUTE_RANKS
#define ROUTE_RANKS 0
#endif
#if ROUTE_RANKS
#extension GL_KHR_shader_subgroup_shuffle : require
#if !defined(RT_SUBGROUP_PATH) || WG_SIZE < ROUTE_E
#error "routing.glsl: ROUTE_RANKS needs subgroups of at least 8 and WG_SIZE >= ROUTE_E"
#endif
// Invocations per expert: the most of 8, 4, 2, 1 that the workgroup and a subgroup hold.
#define RK_L (WG_SIZE >= 8 * ROUTE_E && SUBGROUP_SIZE >= 8 ? 8 : WG_SIZE >= 4 * ROUTE_E && SUBGROUP_SIZE >= 4 ? 4 : WG_SIZE >= 2 * ROUTE_E ? 2 : 1)
shared uint rk_key[ROUTE_E];     // selection keys (route_key; 0 past n_expert)
shared float rk_prob[ROUTE_E];   // probabilities
float rk_factor;                 // the weights' normalization and scale (every invocation)

// Expert e's rank = the experts ahead of it in (key descending, index ascending): a total order,
// so ranks 0..n_used-1 are each taken once and rank k is the round-k winner of route_subgroup.
// The keys first: sigmoid, invocation e < ROUTE_E for expert e; softmax, subgroup 0 (its max and
// sum, route_lane_probs). Then invocation v (numbered through its subgroup, so that a team of RK_L
// shares one) compares expert v / RK_L's key with every RK_L-th key, and the team adds its counts
// by shuffles. Two barriers, no serial rounds.
void route_ranks(uint n_expert, uint n_used, uint flags, float scale) {
  const uint tid = gl_LocalInvocationIndex;
#if ROUTE_RANKS == 2  // softmax
  if (gl_SubgroupID == 0u) {
    float prob[RT_PER_LANE];
    route_lane_probs(n_expert, TS_GATING_SOFTMAX, prob);
    [[unroll]] for (uint j = 0; j < RT_PER_LANE; ++j) {
      const uint e = gl_SubgroupInvocationID + j * gl_SubgroupSize;
      if (e < ROUTE_E) {
        rk_key[e] = e < n_expert ? route_key(route_score(e, prob[j], flags)) : 0u;
        rk_prob[e] = prob[j];
      }
    }
  }
#else
  if (tid < ROUTE_E) {
    float p = 0.0;
    uint key = 0u;
    if (tid < n_expert) {
      p = route_sigmoid(ROUTE_LOGIT(tid));
      key = route_key(route_score(tid, p, flags));
    }
    rk_key[tid] = key;
    rk_prob[tid] = p;
  }
#endif
  barrier();
  const uint v = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
  const uint e = min(v / RK_L, ROUTE_E - 1u), part = v % RK_L;
  const uint ke = rk_key[e];
  uint rank = 0u;
  [[unroll]] for (uint i = 0; i < ROUTE_E / RK_L; ++i) {
    const uint f = part + i * RK_L;
    const uint kf = rk_key[f];
    rank += (kf > ke || (kf == ke && f < e)) ? 1u : 0u;
  }
  [[unroll]] for (uint s = 1; s < RK_L; s <<= 1) rank += subgroupShuffleXor(rank, s);
  if (part == 0u && v / RK_L < n_expert && rank < n_used) {
    rt_id[rank] = e;
    rt_w[rank] = rk_prob[e];
  }
  barrier();
  float wsum = 0.0;
  for (uint k = 0; k < n_used; ++k) wsum += rt_w[k];  // in rank order, as the host sums
  rk_factor = route_factor(wsum, flags, scale);
}
#endif

#ifndef RT_SUBGROUP_PATH
shared float rt_prob[ROUTE_E];   // probabilities
shared float rt_score[ROUTE_E];  // softmax exponentials, then selection scores

// Whole workgroup: expert e's rank = experts ahead of it in (score descending, index ascending),
// a total order, so ranks 0..n_used-1 are each written exactly once.
void route_workgroup(uint n_expert, uint n_used, uint gating, uint flags, float scale) {
  const uint tid = gl_LocalInvocationIndex;
  for (uint e = tid; e < n_expert; e += WG_SIZE) rt_prob[e] = ROUTE_LOGIT(e);
  barrier();
  if (gating == TS_GATING_SOFTMAX) {
    // Every invocation scans all E values in the same order: identical max and sum everywhere.
    float mx = rt_prob[0];
    for (uint e = 1; e < n_expert; ++e) mx = max(mx, rt_prob[e]);
    for (uint e = tid; e < n_expert; e += WG_SIZE) rt_score[e] = exp(rt_prob[e] - mx);
    barrier();
    float sum = 0.0;
    for (uint e = 0; e < n_expert; ++e) sum += rt_score[e];
    for (uint e = tid; e < n_expert; e += WG_SIZE) rt_prob[e] = rt_score[e] / sum;
  } else {
    for (uint e = tid; e < n_expert; e += WG_SIZE) rt_prob[e] = route_sigmoid(rt_prob[e]);
  }
  barrier();
  for (uint e = tid; e < n_expert; e += WG_SIZE) rt_score[e] = route_score(e, rt_prob[e], flags);
  barrier();
  for (uint e = tid; e < n_expert; e += WG_SIZE) {
    const float s = rt_score[e];
    uint rank = 0;
    for (uint f = 0; f < n_expert; ++f) {
      const float t = rt_score[f];
      rank += (t > s || (t == s && f < e)) ? 1u : 0u;
    }
    if (rank < n_used) {
      rt_id[rank] = e;
      rt_w[rank] = rt_prob[e];
    }
  }
  barrier();
  float sum = 0.0;
  for (uint k = 0; k < n_used; ++k) sum += rt_w[k];
  const float f = route_factor(sum, flags, scale);
  barrier();
  if (tid < n_used) rt_w[tid] *= f;
}
#endif

// Computes the routing into rt_id / rt_w (a workgroup barrier after their last write). n_expert
// <= ROUTE_E, 1 <= n_used <= min(n_expert, TS_ROUTE_MAX_K) (the wrappers check).
void route_compute(uint n_expert, uint n_used, uint gating, uint flags, float scale) {
#if ROUTE_RANKS  // the gating the define names (the wrapper's condition)
  route_ranks(n_expert, n_used, flags, scale);
#elif defined(RT_SUBGROUP_PATH)
  if (gl_SubgroupID == 0u) route_subgroup(n_expert, n_used, gating, flags, scale);
  barrier();
#else
  route_workgroup(n_expert, n_used, gating, flags, scale);
  barrier();
#endif
}

// Expert and final weight of routed slot k (after route_compute).
uint route_expert(uint k) { return rt_id[k]; }
#if ROUTE_RANKS
float route_weight(uint k) { return rt_w[k] * rk_factor; }
#else
float route_weight(uint k) { return rt_w[k]; }
#endif

#endif  // TESSERA_ROUTING_GLSL
