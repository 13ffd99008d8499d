// MoE routing of one token (forward.md section 5.2 steps 2-7), computed by a whole workgroup from the
// E router logits. moe_gateup.comp and moe_down.comp run this same code in every workgroup
// that needs it (E is small), so there is no separate top-k dispatch and both kernels agree.
//
//   probs  = sigmoid(logits) or softmax(logits)              (gating)
//   score  = probs + bias (TS_MOE_EXPERT_BIAS), NaN -> -inf   (bias steers the choice only)
//   ids    = top-K by score, best first, ties -> lower expert index
//   w_k    = probs[ids_k]; / max(sum_k w_k, 6.103515625e-5) (TS_MOE_NORM_WEIGHTS);
//            * scale when scale is not 0 or 1
//
// The including kernel defines WG_SIZE and declares the float buffers `route_logits[]` and
// `route_bias[]` (bias read only with TS_MOE_EXPERT_BIAS) before #include "routing.glsl".
// Every function here must be reached by all invocations (uniform control flow: barriers).
#ifndef TESSERA_ROUTING_GLSL
#define TESSERA_ROUTING_GLSL

#include "moe_args.h"

shared float rt_prob[TS_ROUTE_MAX_E];   // probabilities, then (step 3 on) kept as the weights' source
shared float rt_score[TS_ROUTE_MAX_E];  // softmax exponentials, then selection scores
shared uint rt_id[TS_ROUTE_MAX_K];      // chosen experts, best first
shared float rt_w[TS_ROUTE_MAX_K];      // their unnormalized weights (probs)
float rt_factor;                        // per invocation: normalization * scale of the weights

// Computes the routing into rt_id / rt_w / rt_factor. n_expert <= TS_ROUTE_MAX_E,
// 1 <= n_used <= min(n_expert, TS_ROUTE_MAX_K) (the wrappers check).
void route_compute(uint n_expert, uint n_used, uint gating, uint flags, float scale) {
  const uint tid = gl_LocalInvocationIndex;
  for (uint e = tid; e < n_expert; e += WG_SIZE) rt_prob[e] = route_logits[e];
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
    for (uint e = tid; e < n_expert; e += WG_SIZE) rt_prob[e] = 1.0 / (1.0 + exp(-rt_prob[e]));
  }
  barrier();
  for (uint e = tid; e < n_expert; e += WG_SIZE) {
    float s = rt_prob[e];
    if ((flags & TS_MOE_EXPERT_BIAS) != 0u) s += route_bias[e];
    rt_score[e] = isnan(s) ? uintBitsToFloat(0xFF800000u) : s;
  }
  barrier();
  // Rank of expert e = experts ahead of it in (score descending, index ascending) order; a total
  // order, so ranks 0..n_used-1 are each written exactly once.
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
  float factor = 1.0;
  if ((flags & TS_MOE_NORM_WEIGHTS) != 0u) {
    float sum = 0.0;
    for (uint k = 0; k < n_used; ++k) sum += rt_w[k];
    factor = 1.0 / max(sum, 6.103515625e-5);
  }
  if (scale != 0.0 && scale != 1.0) factor *= scale;
  rt_factor = factor;
}

// Expert and weight of routed slot k (after route_compute).
uint route_expert(uint k) { return rt_id[k]; }
float route_weight(uint k) { return rt_w[k] * rt_factor; }

#endif  // TESSERA_ROUTING_GLSL
