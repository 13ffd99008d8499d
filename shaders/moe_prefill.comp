#version 450
// Prefill FFN, expert-major (docs/PREFILL.md): each workgroup owns ROWS output rows of one slot
// (a routed expert, or the shared expert / dense FFN over all tokens) and loops over that slot's
// pairs TB at a time, so an expert's weights are read from memory once per chunk however many
// of the chunk's tokens chose it (repeated passes over the same rows hit the caches).
//   gate-up (default):  h[p][i] = silu(gate_i . in_p) * (up_i . in_p)
//   down (TS_PF_DOWN):  y[p][r] = w_p * (down_r . h[p])
// Pairs, lists and buffer layouts: prefill_args.h. Arguments: PrefillFfnArgs.
// Wrapper: MoePrefillOp / DensePrefillOp (runtime/vulkan/kernels_prefill.h).
//
// Defines: WTYPE, WG_SIZE, ROWS (rows per workgroup), Q8ACT (the int8 path).
//   f32 path: THREADS_PER_ROW (= SUBGROUP_SIZE when USE_SUBGROUP), TEAMS (rows computed at once,
//   one team of THREADS_PER_ROW invocations each; WG_SIZE = TEAMS * THREADS_PER_ROW). Lane l takes
//   the weight units l, l + THREADS_PER_ROW, ... of the row (SPLIT1: 32-value units of
//   split1_unit; plain: single elements), and for each unit the TB current pairs' inputs: one
//   weight decode feeds TB dot products.
//   int8 path: TB (pairs per pass), IN_BLOCKS (input blocks of 32 per row), Q8_BLOCKS = TB *
//   IN_BLOCKS, Q8_TPR (lanes per row: 8, 16 or 32), Q8_SHUFFLE (team sums by subgroup shuffles;
//   needs full subgroups of SUBGROUP_SIZE, a multiple of Q8_TPR), Q8_UNROLL (the block loops
//   unrolled), Q8_OUTS (output rows a team computes at once: 1 or 2), PF_DOWN (1: the down, 0:
//   the gate-up; the arguments' flag TS_PF_DOWN must agree), IN_Q8 (binding 1 holds the input
//   rows as int8 blocks: RmsNormOp's y_q8 of h2). Teams below.
// Bindings: 0 = weights (regions Q and M), 1 = in, 2 = out, 3 = lists, 4 = route, 5 = step.

#include "common.glsl"
#if Q8ACT && Q8_SHUFFLE
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "prefill_args.h"

#define W_Q_BINDING 0
#define W_M_BINDING 0
#include "weights.glsl"

#if !Q8ACT
#define TB 4  // pairs per pass (vec4 accumulators)
#endif
#define TB4 ((TB + 3) / 4)  // vec4 accumulators per row

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 1) readonly restrict buffer InBuf { float in_v[]; };
layout(std430, binding = 1) readonly restrict buffer InBuf4 { vec4 in4[]; };
layout(std430, binding = 1) readonly restrict buffer InQ8Buf { uvec4 in_q8[]; };  // IN_Q8
layout(std430, binding = 2) writeonly restrict buffer OutBuf { float out_v[]; };
layout(std430, binding = 3) readonly restrict buffer ListBuf { uint lists[]; };
layout(std430, binding = 4) readonly restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 5) readonly restrict buffer StepBuf { uint step_words[]; };

layout(push_constant) uniform Push { PrefillFfnArgs args; };

#if Q8ACT
#include "q8_activations.glsl"
#endif

#if Q8ACT  // the int8 path's pipelines are built per part (PF_DOWN = the flag TS_PF_DOWN)
bool is_down() { return PF_DOWN != 0; }
#else
bool is_down() { return (args.flags & TS_PF_DOWN) != 0u; }
#endif
bool all_tokens() { return (args.flags & TS_PF_ALL_TOKENS) != 0u; }

// Teams: TEAM_LANES invocations compute one row together (the f32 path: THREADS_PER_ROW; the int8
// path: Q8_TPR, lane l taking the row's blocks l, l + Q8_TPR, ..., so a team's loads of a row are
// Q8_TPR consecutive 16-byte words and the lanes of one index in a subgroup's teams read the same
// staged block: one shared-memory broadcast serves SUBGROUP_SIZE / Q8_TPR rows). team_sum: every
// lane gets its team's sum; reached by the whole workgroup.
#if Q8ACT
#define TEAM_LANES Q8_TPR
#else
#define TEAM_LANES THREADS_PER_ROW
#endif
#if Q8ACT && Q8_SHUFFLE
// Team = TEAM_LANES consecutive lanes of a subgroup (subgroup invocation ids, whatever their
// mapping to the workgroup); sums by butterfly shuffles.
uint team_id() { return gl_SubgroupID * (SUBGROUP_SIZE / TEAM_LANES) + gl_SubgroupInvocationID / TEAM_LANES; }
uint team_lane() { return gl_SubgroupInvocationID % TEAM_LANES; }
vec4 team_sum(vec4 v) {
  [[unroll]] for (uint s = TEAM_LANES / 2; s > 0; s >>= 1) v += subgroupShuffleXor(v, s);
  return v;
}
#elif !Q8ACT && USE_SUBGROUP  // a team is a subgroup
vec4 team_sum(vec4 v) { return subgroupAdd(v); }
bool team_leader() { return subgroupElect(); }
uint team_id() { return gl_SubgroupID; }
uint team_lane() { return gl_SubgroupInvocationID; }
#else  // a tree in shared memory
shared vec4 team_partial[WG_SIZE];
vec4 team_sum(vec4 v) {
  const uint lid = gl_LocalInvocationIndex, lane = lid % TEAM_LANES;
  team_partial[lid] = v;
  barrier();
  [[unroll]] for (uint s = TEAM_LANES / 2; s > 0; s >>= 1) {
    if (lane < s) team_partial[lid] += team_partial[lid + s];
    barrier();
  }
  const vec4 r = team_partial[lid - lane];
  barrier();
  return r;
}
bool team_leader() { return gl_LocalInvocationIndex % TEAM_LANES == 0u; }
uint team_id() { return gl_LocalInvocationIndex / TEAM_LANES; }
uint team_lane() { return gl_LocalInvocationIndex % TEAM_LANES; }
#endif

#if !Q8ACT
// Row r of m (cols long) dotted with the TB inputs starting at floats in_base[b] (component b of
// the result; inputs of pairs past the list are computed on a valid row and ignored). This
// lane's share of the row only.
vec4 row_dot4(WMat m, uint r, uint cols, uvec4 in_base, uint lane) {
  vec4 acc = vec4(0.0);
#if !W_PLAIN
  const uint nb = cols / W_BLOCK, units = nb * W_UNITS;
  for (uint t = lane; t < units; t += THREADS_PER_ROW) {
    const uint b = t / W_UNITS, j = t % W_UNITS;
    float lo[16], hi[16];
    uint off_lo, off_hi;
    split1_unit(m.qbase, m.mbase, r * nb + b, j, lo, hi, off_lo, off_hi);
    const uint k_lo = b * W_BLOCK + off_lo, k_hi = b * W_BLOCK + off_hi;
    [[unroll]] for (uint c = 0; c < TB; ++c) {
      vec4 s = vec4(0.0);
      [[unroll]] for (uint q = 0; q < 4; ++q) {
        s += vec4(lo[4 * q], lo[4 * q + 1], lo[4 * q + 2], lo[4 * q + 3]) * in4[((in_base[c] + k_lo) >> 2) + q];
        s += vec4(hi[4 * q], hi[4 * q + 1], hi[4 * q + 2], hi[4 * q + 3]) * in4[((in_base[c] + k_hi) >> 2) + q];
      }
      acc[c] += (s.x + s.y) + (s.z + s.w);
    }
  }
#else
  const uint e0 = m.qbase + r * cols;
  for (uint k = lane; k < cols; k += THREADS_PER_ROW) {
    const float w = plain_value(e0 + k);
    acc += w * vec4(in_v[in_base.x + k], in_v[in_base.y + k], in_v[in_base.z + k], in_v[in_base.w + k]);
  }
#endif
  return acc;
}

#endif

#if Q8ACT
// The inputs of the pass's nc pairs (rows starting at floats in_base[c]) as int8 blocks in shared
// memory: block b of pair c at c * IN_BLOCKS + b. The whole workgroup; then a barrier.
// IN_Q8: the input rows are int8 blocks already (3 uvec4 each: lo, hi, ds; a row of IN_BLOCKS
// blocks per in_stride = 32 IN_BLOCKS values), copied.
void stage_inputs_q8(uint in_base[TB], uint nc) {
  for (uint i = gl_LocalInvocationIndex; i < nc * IN_BLOCKS; i += WG_SIZE) {
    const uint c = i / IN_BLOCKS, b = i % IN_BLOCKS;
#if IN_Q8
    const uint o = 3u * ((in_base[c] >> 5) + b);
    q8_lo[i] = in_q8[o];
    q8_hi[i] = in_q8[o + 1u];
    q8_ds[i] = uintBitsToFloat(in_q8[o + 2u]);
#else
    vec4 v[8];
    [[unroll]] for (uint k = 0; k < 8; ++k) v[k] = in4[((in_base[c] + 32u * b) >> 2) + k];
    q8_stage_block(i, v);
#endif
  }
  barrier();
}

#define Q8_TEAMS (WG_SIZE / TEAM_LANES)
#define Q8_ITERS ((IN_BLOCKS + Q8_TPR - 1) / Q8_TPR)  // a lane's blocks of a row, at most
#if PF_DOWN  // weight rows a team takes at once
#define Q8_NRM Q8_OUTS
#else
#define Q8_NRM (2 * Q8_OUTS)  // gate and up rows
#endif
#if Q8_UNROLL  // the block loops unrolled (their loads issued together)
#define Q8_LOOP [[unroll]]
#else
#define Q8_LOOP
#endif

// Weight rows rr[k] (of ma for even k, of mb for odd k: a gate-up's gate and up rows)
// dotted with the pass's first nc staged inputs (acc[k][c / 4][c % 4] for pair c), this lane's
// blocks: each weight block is loaded once for the nc pairs, each staged input read once for the
// Q8_NRM rows.
void rows_dot_q8(WMat ma, WMat mb, uint rr[Q8_NRM], uint nc, inout vec4 acc[Q8_NRM][TB4]) {
  Q8_LOOP for (uint it = 0; it < Q8_ITERS; ++it) {
    const uint b = team_lane() + it * Q8_TPR;
    if (IN_BLOCKS % Q8_TPR != 0 && b >= IN_BLOCKS) break;
    Q8W w[Q8_NRM];
    [[unroll]] for (uint k = 0; k < Q8_NRM; ++k) {
      const WMat mk = k % 2u == 0u ? ma : mb;
      w[k] = q8_load_block(mk.qbase, mk.mbase, rr[k] * IN_BLOCKS + b);
    }
    [[unroll]] for (uint c = 0; c < TB; ++c) {
      if (c < nc) {
        const uint i = c * IN_BLOCKS + b;
        const uvec4 xl = q8_lo[i], xh = q8_hi[i];
        const vec4 ds = q8_ds[i];
        [[unroll]] for (uint k = 0; k < Q8_NRM; ++k) acc[k][c / 4][c % 4] += q8_dot_loaded(w[k], xl, xh, ds);
      }
    }
  }
}
#endif


float silu(float z) { return z / (1.0 + exp(-z)); }

void main() {
  const uint n_tok = min(step_words[args.count_word], args.t_max);
  const uint slot = gl_WorkGroupID.y;
  const uint e = args.expert_lo + slot;
  const uint n_pairs = all_tokens() ? n_tok : lists[e];
  const uint out_rows = is_down() ? args.n_embd : args.width;
  const uint r0 = gl_WorkGroupID.x * ROWS;
  if (n_pairs == 0u || r0 >= out_rows) return;  // uniform per workgroup
  const uint r_end = min(r0 + ROWS, out_rows);
  const uint K = args.n_used;

  const uint base = all_tokens() ? 0u : slot * args.slot_stride;
  WMat m, mu;
  if (is_down()) {
    m = w_mat_at(base + args.mat_offset, args.n_embd, args.width);
    mu = m;
  } else if ((args.flags & TS_PF_SEPARATE_GATE_UP) != 0u) {
    m = w_mat_at(args.mat_offset, args.width, args.n_embd);
    mu = w_mat_at(args.up_offset, args.width, args.n_embd);
  } else {
    m = w_mat_at(base + args.mat_offset, 2u * args.width, args.n_embd);
    mu = m;
  }
  const bool separate = (args.flags & TS_PF_SEPARATE_GATE_UP) != 0u;

#if Q8ACT
  // Passes j0 = z * TB, (z + Z) * TB, ... (Z = the dispatch's z size): the pairs of one slot spread
  // over Z workgroups per row tile (the shared expert's 64 tokens: 8 workgroups, one pass each).
  // A pass computes only its nc live pairs (an expert of a short chunk has ~1-4).
  for (uint j0 = gl_WorkGroupID.z * TB; j0 < n_pairs; j0 += TB * gl_NumWorkGroups.z) {
    const uint nc = min(TB, n_pairs - j0);
    uint pair[TB], in_base[TB];
    [[unroll]] for (uint c = 0; c < TB; ++c) {
      const uint j = min(j0 + c, n_pairs - 1u);
      pair[c] = all_tokens() ? args.pair_base + j : lists[args.n_expert + e * args.t_max + j];
      const uint row_in = is_down() ? pair[c] : (all_tokens() ? j : pair[c] / K);
      in_base[c] = row_in * args.in_stride;
    }
    barrier();  // the previous pass is done with the staged inputs
    stage_inputs_q8(in_base, nc);
    // Each team takes Q8_OUTS output rows at once (rb + team, + Q8_TEAMS, ...): the down's rows,
    // or the gate-up's gate and up rows of each.
    const uint lane = team_lane();
    for (uint rb = r0; rb < r_end; rb += Q8_TEAMS * Q8_OUTS) {  // uniform trip count
      uint rr[Q8_NRM];
      [[unroll]] for (uint o = 0; o < Q8_OUTS; ++o) {
        const uint r = min(rb + o * Q8_TEAMS + team_id(), r_end - 1u);  // past the end: computed, not stored
#if PF_DOWN
        rr[o] = r;
#else
        rr[2 * o] = separate ? r : 2u * r;
        rr[2 * o + 1] = separate ? r : 2u * r + 1u;
#endif
      }
      vec4 acc[Q8_NRM][TB4];
      [[unroll]] for (uint k = 0; k < Q8_NRM; ++k)
        [[unroll]] for (uint q = 0; q < TB4; ++q) acc[k][q] = vec4(0.0);
      rows_dot_q8(m, mu, rr, nc, acc);
      [[unroll]] for (uint k = 0; k < Q8_NRM; ++k)
        [[unroll]] for (uint q = 0; q < TB4; ++q)
          if (4u * q < nc) acc[k][q] = team_sum(acc[k][q]);
      // Lane c % Q8_TPR stores pair c.
      [[unroll]] for (uint o = 0; o < Q8_OUTS; ++o) {
        const uint r = rb + o * Q8_TEAMS + team_id();
        [[unroll]] for (uint c = 0; c < TB; ++c) {
          if (r < r_end && c < nc && lane == c % Q8_TPR) {
#if PF_DOWN
            const float v = acc[o][c / 4][c % 4];
#else
            const float v = silu(acc[2 * o][c / 4][c % 4]) * acc[2 * o + 1][c / 4][c % 4];
#endif
            const float w = is_down() && !all_tokens() ? uintBitsToFloat(route[2u * pair[c] + 1u]) : 1.0;
            out_v[pair[c] * args.out_stride + r] = w * v;
          }
        }
      }
    }
  }
#else
  for (uint j0 = 0u; j0 < n_pairs; j0 += TB) {
    // The TB pairs of this pass (past the end: repeats of the last one, results dropped).
    uvec4 pair, in_base;
    [[unroll]] for (uint c = 0; c < TB; ++c) {
      const uint j = min(j0 + c, n_pairs - 1u);
      pair[c] = all_tokens() ? args.pair_base + j : lists[args.n_expert + e * args.t_max + j];
      const uint row_in = is_down() ? pair[c] : (all_tokens() ? j : pair[c] / K);
      in_base[c] = row_in * args.in_stride;
    }
    for (uint rb = r0; rb < r_end; rb += TEAMS) {  // uniform trip count
      const uint r = rb + team_id();
      const bool valid = r < r_end;
      if (is_down()) {
        vec4 d = valid ? row_dot4(m, r, args.width, in_base, team_lane()) : vec4(0.0);
        d = team_sum(d);
        if (valid && team_leader()) {
          [[unroll]] for (uint c = 0; c < TB; ++c) {
            if (j0 + c < n_pairs) {
              const float w = all_tokens() ? 1.0 : uintBitsToFloat(route[2u * pair[c] + 1u]);
              out_v[pair[c] * args.out_stride + r] = w * d[c];
            }
          }
        }
      } else {
        const uint gr = separate ? r : 2u * r, ur = separate ? r : 2u * r + 1u;
        vec4 g = valid ? row_dot4(m, gr, args.n_embd, in_base, team_lane()) : vec4(0.0);
        vec4 u = valid ? row_dot4(mu, ur, args.n_embd, in_base, team_lane()) : vec4(0.0);
        g = team_sum(g);
        u = team_sum(u);
        if (valid && team_leader()) {
          [[unroll]] for (uint c = 0; c < TB; ++c)
            if (j0 + c < n_pairs) out_v[pair[c] * args.out_stride + r] = silu(g[c]) * u[c];
        }
      }
    }
  }
#endif
}
