#version 450
// Next-token choice on the GPU (decode_plan.md, "Final"): argmax, or top-k / top-p / min-p /
// temperature sampling with a counter-based RNG, in ONE dispatch (no barrier):
//   phase 1, every workgroup g: the top_k best (logit, id) of its logits [g*per_group, ...), best
//     first (order: larger logit, then lower id; NaN counts as -inf), written to the scratch
//     buffer; then an atomic arrival count;
//   phase 2, the last workgroup to arrive: merges the n_groups sorted lists into the global top_k,
//     applies top-p and min-p (probabilities at temperature 1, as runtime/text/sampler.h does),
//     draws from softmax(logit / temperature) with u = hash(seed, position) (greedy when
//     temperature <= 0 or top_k == 1), writes the token to step[token_word] (the next step's
//     input) and to tokens_out[position % out_ring], the statistics to the scratch buffer,
//     advances step[pos_word] (TS_SAMPLE_ADVANCE_POS), writes the next step's attention group
//     counts (TS_SAMPLE_ADVANCE_COUNTS: attention_args.h's rule, read from the step buffer) and
//     resets the arrival counter. With TS_SAMPLE_INPUT_RING and step[input_word] set, the next
//     step's input is the host's forced token from the ring after that word instead. Together:
//     a step leaves the step buffer ready for the next, which the host may queue before this one
//     ends (GpuModel::decode_steps). Every word it reads comes from step_in (binding 4: the decode
//     step's device copy of the step buffer, so no read crosses the bus), every word it writes
//     goes to step.
// Deterministic: same logits, seed and position -> same token.
// Arguments: SampleArgs (moe_args.h; scratch layout there). Wrapper: SampleOp (kernels_sample.h).
//
// Defines: WG_SIZE (power of two, >= n_groups), ELEMS (logits per invocation in phase 1:
// per_group <= ELEMS * WG_SIZE). n_groups * top_k <= TS_SAMPLE_MAX_CAND (the merge's shared lists).
// Bindings: 0 = logits, 1 = scratch (zeroed once before first use), 2 = step (uint words),
// 3 = tokens_out (uint ring), 4 = step_in (the words read: the step buffer or a copy of it).

#include "common.glsl"
#include "moe_args.h"
#include "attention_args.h"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 0) readonly restrict buffer LogitBuf { float logits[]; };
layout(std430, binding = 1) coherent restrict buffer ScratchBuf { uint scratch[]; };
layout(std430, binding = 2) buffer StepBuf { uint step[]; };
// The words read (position, rule, forced inputs): the step buffer, or a device copy of it made at
// the step's start (the decode step's step_local: no reads across the bus). May alias binding 2.
layout(std430, binding = 4) readonly buffer StepInBuf { uint step_in[]; };
layout(std430, binding = 3) writeonly restrict buffer OutBuf { uint tokens_out[]; };

layout(push_constant) uniform Push { SampleArgs args; };

const uint kNone = 0xFFFFFFFFu;  // "no candidate" id; always paired with a -inf logit

float neg_inf() { return uintBitsToFloat(0xFF800000u); }

// (v, i) comes before (w, j): larger logit first, lower id on ties (kNone sorts last).
bool ahead(float v, uint i, float w, uint j) { return v > w || (v == w && i < j); }

// Reduction scratch: one entry per subgroup (USE_SUBGROUP) or per invocation.
shared float red_v[WG_SIZE];
shared uint red_i[WG_SIZE];

// The best (v, i) over the workgroup, returned to every invocation (uniform control flow).
void workgroup_best(inout float v, inout uint i) {
#if USE_SUBGROUP
  const float m = subgroupMax(v);
  const uint mi = subgroupMin(v == m ? i : kNone);
  if (subgroupElect()) {
    red_v[gl_SubgroupID] = m;
    red_i[gl_SubgroupID] = mi;
  }
  barrier();
  v = red_v[0];
  i = red_i[0];
  for (uint s = 1; s < gl_NumSubgroups; ++s)
    if (ahead(red_v[s], red_i[s], v, i)) {
      v = red_v[s];
      i = red_i[s];
    }
  barrier();
#else
  const uint lid = gl_LocalInvocationIndex;
  red_v[lid] = v;
  red_i[lid] = i;
  barrier();
  [[unroll]] for (uint s = WG_SIZE / 2; s > 0; s >>= 1) {
    if (lid < s && ahead(red_v[lid + s], red_i[lid + s], red_v[lid], red_i[lid])) {
      red_v[lid] = red_v[lid + s];
      red_i[lid] = red_i[lid + s];
    }
    barrier();
  }
  v = red_v[0];
  i = red_i[0];
  barrier();
#endif
}

// PCG-style 32-bit hash (counter-based RNG: no state carried between steps).
uint pcg_hash(uint v) {
  const uint state = v * 747796405u + 2891336453u;
  const uint word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}
// Uniform in [0, 1) from the seed and the position.
float uniform01(uint pos) {
  const uint hsh = pcg_hash(args.seed_lo ^ pcg_hash(args.seed_hi ^ pcg_hash(pos)));
  return float(hsh >> 8) * (1.0 / 16777216.0);
}

uint partial_word(uint g, uint r) { return TS_SAMPLE_PARTIALS + 2u * (g * TS_SAMPLE_MAX_K + r); }

shared bool is_last;
shared float cand_v[TS_SAMPLE_MAX_CAND];  // phase 2: list g entry r at g * k + r
shared uint cand_i[TS_SAMPLE_MAX_CAND];
shared float top_v[TS_SAMPLE_MAX_K];
shared uint top_i[TS_SAMPLE_MAX_K];

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint k = args.top_k;

  // Phase 1: this workgroup's k best, one per round, each strictly behind the previous one. The
  // invocation's logits (begin + tid + j*WG_SIZE) stay in registers across the rounds.
  const uint g = linear_workgroup_id();
  const uint begin = g * args.per_group, end = min(begin + args.per_group, args.n_vocab);
  float lv[ELEMS];
  [[unroll]] for (uint j = 0; j < ELEMS; ++j) {
    const uint idx = begin + tid + j * WG_SIZE;
    const float v = idx < end ? logits[idx] : neg_inf();
    lv[j] = isnan(v) ? neg_inf() : v;
  }
  float pv = 0.0;
  uint pi = kNone;
  for (uint r = 0; r < k; ++r) {
    float bv = neg_inf();
    uint bi = kNone;
    [[unroll]] for (uint j = 0; j < ELEMS; ++j) {
      const uint idx = begin + tid + j * WG_SIZE;
      if (idx < end && (r == 0u || ahead(pv, pi, lv[j], idx)) && ahead(lv[j], idx, bv, bi)) {
        bv = lv[j];
        bi = idx;
      }
    }
    workgroup_best(bv, bi);
    if (tid == 0) {
      scratch[partial_word(g, r)] = floatBitsToUint(bv);
      scratch[partial_word(g, r) + 1u] = bi;
    }
    pv = bv;
    pi = bi;
  }

  // Arrival: the last workgroup sees every other workgroup's partial lists.
  memoryBarrierBuffer();
  barrier();
  if (tid == 0) is_last = atomicAdd(scratch[0], 1u) == args.n_groups - 1u;
  barrier();
  if (!is_last) return;
  memoryBarrierBuffer();

  // Phase 2: the lists into shared memory (all loads at once), then a k-way merge in which
  // invocation t < n_groups walks list t.
  for (uint c = tid; c < args.n_groups * k; c += WG_SIZE) {
    const uint w = partial_word(c / k, c % k);
    cand_v[c] = uintBitsToFloat(scratch[w]);
    cand_i[c] = scratch[w + 1u];
  }
  barrier();
  uint head = 0;
  for (uint r = 0; r < k; ++r) {
    float v = neg_inf();
    uint i = kNone;
    if (tid < args.n_groups && head < k) {
      v = cand_v[tid * k + head];
      i = cand_i[tid * k + head];
    }
    workgroup_best(v, i);
    if (i != kNone && tid == i / args.per_group) ++head;
    if (tid == 0) {
      top_v[r] = v;
      top_i[r] = i;
    }
  }
  barrier();
  if (tid != 0) return;

  // Filters and draw (one invocation; at most TS_SAMPLE_MAX_K candidates), as
  // runtime/text/sampler.cpp does them.
  uint n_cand = 0;
  while (n_cand < k && top_i[n_cand] != kNone) ++n_cand;
  const float l0 = top_v[0];
  uint keep = max(n_cand, 1u);
  if (l0 == neg_inf()) {
    keep = 1;  // nothing is possible: the lowest id
  } else {
    if (args.top_p < 1.0) {
      float sum = 0.0;
      for (uint r = 0; r < keep; ++r) sum += exp(top_v[r] - l0);
      float cumulative = 0.0;
      for (uint r = 0; r < keep; ++r) {
        cumulative += exp(top_v[r] - l0) / sum;
        if (cumulative >= args.top_p) {
          keep = r + 1u;
          break;
        }
      }
    }
    if (args.min_p > 0.0) {
      const float min_logit = l0 + log(args.min_p);
      uint kept = 1;
      while (kept < keep && top_v[kept] >= min_logit) ++kept;
      keep = kept;
    }
  }
  const uint pos = step_in[args.pos_word];
  uint token = top_i[0];
  if (args.temperature > 0.0 && keep > 1u) {
    float sum = 0.0;
    for (uint r = 0; r < keep; ++r) sum += exp((top_v[r] - l0) / args.temperature);
    const float u = uniform01(pos) * sum;
    float cumulative = 0.0;
    token = top_i[keep - 1u];  // rounding: u landed on the total
    for (uint r = 0; r < keep; ++r) {
      cumulative += exp((top_v[r] - l0) / args.temperature);
      if (u < cumulative) {
        token = top_i[r];
        break;
      }
    }
  }

  scratch[TS_SAMPLE_STATS] = token;
  scratch[TS_SAMPLE_STATS + 1u] = n_cand;
  scratch[TS_SAMPLE_STATS + 2u] = keep;
  for (uint r = 0; r < keep; ++r) scratch[TS_SAMPLE_KEPT + r] = top_i[r];
  uint next = token;  // the next step's input
  if ((args.flags & TS_SAMPLE_INPUT_RING) != 0u && step_in[args.input_word] != 0u)
    next = step_in[args.input_word + 1u + (pos + 1u) % args.out_ring];
  step[args.token_word] = next;
  if ((args.flags & TS_SAMPLE_ADVANCE_POS) != 0u) step[args.pos_word] = pos + 1u;
  if ((args.flags & TS_SAMPLE_WRITE_OUT) != 0u) tokens_out[pos % args.out_ring] = token;
  if ((args.flags & TS_SAMPLE_ADVANCE_COUNTS) != 0u) {
    const uint w = args.rule_word;  // the next step runs at pos + 1: kv_len = pos + 2
    const AttnDecodeRule r = AttnDecodeRule(step_in[w], step_in[w + 1u], step_in[w + 2u], step_in[w + 3u], step_in[w + 4u],
                                            step_in[w + 5u], step_in[w + 6u], step_in[w + 7u], step_in[w + 8u],
                                            step_in[w + 9u], 0u, 0u);
    for (uint i = 0; i < 6u; ++i) step[args.counts_word + i] = ts_attn_decode_count(r, pos + 2u, i);
  }
  atomicExchange(scratch[0], 0u);
}
