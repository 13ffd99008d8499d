#version 450
// MoE down projection with the routing weights, the sum over experts and the residual add
// (decode_plan.md D10), for each output row r < n_embd:
//   x[r] += sum_{k < n_used} w_k (down_{e_k} row r . h[k]) + (shared down row r . h[n_used])
// The routed terms come only with TS_MOE_ROUTED (and only for experts e_k in
// [expert_lo, expert_hi), the slots bound to this dispatch), the shared term only with
// TS_MOE_SHARED. The dense FFN is the shared-only case (n_used = 0, its down matrix at
// shared_offset). Expert e_k = route[2k] and weight w_k = route[2k+1] come from router.comp
// (or, with TS_MOE_ROUTE_RECOMPUTE, from routing.glsl run by this workgroup).
// Arguments: MoeArgs (moe_args.h). Wrappers: MoeDownOp, DenseDownOp (runtime/vulkan/kernels_moe.h).
//
// Defines: WTYPE (down type), THREADS_PER_ROW (= SUBGROUP_SIZE when USE_SUBGROUP), TEAMS (slots
// per dispatch: K + 1, K or 1), WG_SIZE = TEAMS * THREADS_PER_ROW, ROWS_PER_WG, PLAIN_VEC8
// (plain types whose row lengths are multiples of 8), UNROLL (1 or 2 units per loop iteration),
// Q8ACT (Q4_0 / Q8_0 / Q4_K / Q6_K: h read as the int8 blocks the Q8ACT gate-up wrote (binding
// 6), integer dot products; with subgroups each lane keeps the blocks it uses, lane + j * subgroup
// size for j < Q8_OWN, in registers for all rows; without, the blocks are copied to shared
// memory, Q8_BLOCKS >= (n_used + 1) * h_stride / 32).
// Work split: a workgroup owns ROWS_PER_WG rows; team s (a subgroup, or THREADS_PER_ROW
// invocations reducing through shared memory) computes slot s's weighted dot product for each
// of them; the slots are then summed in order and added to x.
// WAIT_GATE (0/1; Q8ACT with subgroups, the route from the buffer, ROWS_PER_WG * Q8_OWN <= 8;
// docs/DECODE.md "Early start"): recorded with no barrier after the gate-up (GATE_SIGNAL). Each
// workgroup waits for gate word 0 (the route written), loads its slots' weight blocks for all its
// rows and its rows of x, waits for word 1 to reach GATE_H_TARGET (every gate-up workgroup's h
// written), then reads hq. The same sums in the same order: the same bits. X_SIGNAL (with
// WAIT_GATE): after its rows of x, each workgroup arrives on gate word 2 through a group word
// (gate_signal_tree; moe_args.h TS_DOWN_X_GROUP_WORD), which the next layer's first matvecs
// (matvec_q8.comp WAIT_GATE, recorded with no barrier after this) wait on.
// Bindings: 0 = weights (regions Q and M), 1 = h, 2 = x (in/out), 3 = route (uint pairs),
// 4 = router logits, 5 = expert bias (both TS_MOE_ROUTE_RECOMPUTE only), 6 = hq (Q8ACT),
// 7 = gate words, 8 = error words (WAIT_GATE).

#include "common.glsl"
#include "moe_args.h"

#define W_Q_BINDING 0
#define W_M_BINDING 0
#include "weights.glsl"

layout(local_size_x = WG_SIZE) in;

#ifndef WAIT_GATE
#define WAIT_GATE 0
#endif
#ifndef X_SIGNAL
#define X_SIGNAL 0
#endif
#ifndef DOWN_LATE  // 0/1, with WAIT_GATE (MoeTuning::down_late); see the WAIT_GATE path
#define DOWN_LATE 0
#endif
// DOWN_FIRST (0, 1, 2 or 4; Q8ACT with subgroups, no WAIT_GATE; MoeTuning::down_first_rows): rows a
// pass whose weight blocks are all loaded before the first product; 0: passes of 4 rows, each
// block loaded where it is used.
#ifndef DOWN_FIRST
#define DOWN_FIRST 0
#endif
#define DN_PASS (DOWN_FIRST > 0 ? DOWN_FIRST : 4)

layout(std430, binding = 1) readonly restrict buffer HBuf { float h[]; };
layout(std430, binding = 1) readonly restrict buffer HBuf4 { vec4 h4[]; };
#if X_SIGNAL
layout(std430, binding = 2) coherent restrict buffer XBuf { float x[]; };  // read by the next matvecs beside this
#else
layout(std430, binding = 2) restrict buffer XBuf { float x[]; };
#endif
layout(std430, binding = 3) readonly restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 4) readonly restrict buffer LogitBuf { float route_logits[]; };
layout(std430, binding = 5) readonly restrict buffer BiasBuf { float route_bias[]; };

layout(push_constant) uniform Push { MoeArgs args; };

#if WAIT_GATE
#if !Q8ACT || !USE_SUBGROUP || ROWS_PER_WG * Q8_OWN > 8
#error "moe_down.comp: WAIT_GATE needs Q8ACT, subgroups and at most 8 weight blocks per lane"
#endif
#extension GL_KHR_memory_scope_semantics : require
layout(std430, binding = 7) coherent restrict buffer Gate { uint gate[]; };
layout(std430, binding = 8) coherent restrict buffer GateError { uint gate_error[]; };
#define GATE_WAIT 1
#include "gate.glsl"
#elif X_SIGNAL
#error "moe_down.comp: X_SIGNAL needs WAIT_GATE (the gate binding)"
#endif

#include "routing.glsl"

bool recompute_route() { return ROUTE_RECOMPUTE != 0 && (args.flags & TS_MOE_ROUTE_RECOMPUTE) != 0u; }
// Expert and weight of routed slot k: the route buffer, or this workgroup's own routing.
uint slot_expert(uint k) { return recompute_route() ? route_expert(k) : route[2u * k]; }
float slot_weight(uint k) { return recompute_route() ? route_weight(k) : uintBitsToFloat(route[2u * k + 1u]); }

#if Q8ACT
#include "q8_activations.glsl"
layout(std430, binding = 6) readonly restrict buffer HqBuf { uvec4 hq[]; };
#if USE_SUBGROUP
// The int8 blocks lane + j * nl (j < Q8_OWN, those below nb) of the hq slot starting at block b0.
void hq_load(uint b0, uint nb, uint lane, uint nl, inout uvec4 xl[Q8_OWN], inout uvec4 xh[Q8_OWN], inout vec4 xd[Q8_OWN]) {
  [[unroll]] for (uint j = 0; j < Q8_OWN; ++j) {
    const uint b = lane + j * nl;
    if (b < nb) {
      xl[j] = hq[3u * (b0 + b)];
      xh[j] = hq[3u * (b0 + b) + 1u];
      xd[j] = uintBitsToFloat(hq[3u * (b0 + b) + 2u]);
    }
  }
}
#endif
#endif

// A matrix of n_embd rows x `cols` starting at byte `base` of the weight binding, its input at
// float `hoff` of h.
struct Mat {
  uint qbase;  // SPLIT1: region Q in 16-byte units; plain: first element index
  uint mbase;  // SPLIT1: region M in 32-bit words
  uint cols;
  uint hoff;
};

Mat mat_at(uint base, uint cols, uint hoff) {
#if W_PLAIN
  return Mat(base / uint(WTYPE == TS_TYPE_F32 ? 4 : 2), 0u, cols, hoff);
#else
  const uint nb = cols / W_BLOCK;
  const uint m_off = (args.n_embd * nb * (16u * W_QVEC) + 255u) & ~255u;
  return Mat(base >> 4, (base + m_off) >> 2, cols, hoff);
#endif
}

// Unit t of row r of m dotted with its input (acc += ...).
#if Q8ACT
#elif !W_PLAIN
void row_unit(Mat m, uint r, uint nb, uint t, inout float acc) {
  const uint b = t / W_UNITS, j = t % W_UNITS;
  float lo[16], hi[16];
  uint off_lo, off_hi;
  split1_unit(m.qbase, m.mbase, r * nb + b, j, lo, hi, off_lo, off_hi);
  const uint k_lo = m.hoff + b * W_BLOCK + off_lo, k_hi = m.hoff + b * W_BLOCK + off_hi;
  vec4 s = vec4(0.0);
  [[unroll]] for (uint q = 0; q < 4; ++q) {
    s += vec4(lo[4 * q], lo[4 * q + 1], lo[4 * q + 2], lo[4 * q + 3]) * h4[(k_lo >> 2) + q];
    s += vec4(hi[4 * q], hi[4 * q + 1], hi[4 * q + 2], hi[4 * q + 3]) * h4[(k_hi >> 2) + q];
  }
  acc += (s.x + s.y) + (s.z + s.w);
}
#elif PLAIN_VEC8
void row_unit(Mat m, uint r, uint groups, uint t, inout float acc) {
  float v[8];
  plain_vec8((m.qbase >> 3) + r * groups + t, v);
  const uint k = (m.hoff >> 2) + 2u * t;
  const vec4 s = vec4(v[0], v[1], v[2], v[3]) * h4[k] + vec4(v[4], v[5], v[6], v[7]) * h4[k + 1u];
  acc += (s.x + s.y) + (s.z + s.w);
}
#endif

// Partial dot product of row r of m with its input over this lane's share of the row (UNROLL = 2:
// two units per iteration, twice the loads in flight).
float row_dot(Mat m, uint r, uint lane, uint nlanes) {
  float acc = 0.0;
#if Q8ACT
  const uint nb = m.cols / 32u, b0 = m.hoff / 32u;
  for (uint b = lane; b < nb; b += nlanes) acc += q8_block_dot(m.qbase, m.mbase, r * nb + b, b0 + b);
#elif !W_PLAIN || PLAIN_VEC8
#if !W_PLAIN
  const uint per_row = m.cols / W_BLOCK, units = per_row * W_UNITS;
#else
  const uint per_row = m.cols / 8u, units = per_row;
#endif
  uint t = lane;
#if UNROLL >= 2
  for (; t + nlanes < units; t += 2u * nlanes) {
    row_unit(m, r, per_row, t, acc);
    row_unit(m, r, per_row, t + nlanes, acc);
  }
#endif
  for (; t < units; t += nlanes) row_unit(m, r, per_row, t, acc);
#else
  const uint e0 = m.qbase + r * m.cols;
  for (uint k = lane; k < m.cols; k += nlanes) acc += plain_value(e0 + k) * h[m.hoff + k];
#endif
  return acc;
}

// Slot s of this dispatch: routed slot s < n_routed (its expert's down matrix, unless bound
// elsewhere), else the shared slot. Returns false when the slot has nothing to add here.
bool slot_matrix(uint s, uint n_routed, out Mat m, out float weight) {
  weight = 1.0;
  if (s < n_routed) {
    const uint e = slot_expert(s);
    if (e < args.expert_lo || e >= args.expert_hi) return false;
    weight = slot_weight(s);
    m = mat_at((e - args.expert_lo) * args.slot_stride + args.routed_offset, args.w_routed, s * args.h_stride);
  } else {
    m = mat_at(args.shared_offset, args.w_shared, args.n_used * args.h_stride);
  }
  return true;
}

// part[r][s]: slot s's weighted dot product for row r of the workgroup.
shared float part[ROWS_PER_WG][TEAMS];
#if WAIT_GATE
shared float gate_x[ROWS_PER_WG];  // x of the workgroup's rows, read before the gate
#if DOWN_LATE
shared bool dn_late;  // the gate-up's h was complete when the route was seen
#endif
#endif
#if !USE_SUBGROUP
shared float row_partial[WG_SIZE];
#endif

void main() {
  const bool routed = (args.flags & TS_MOE_ROUTED) != 0u;
  if (routed && recompute_route())
    route_compute(args.n_expert, args.n_used, args.gating, args.route_flags, args.weights_scale);
  const uint n_routed = routed ? args.n_used : 0u;
  const uint n_slots = n_routed + ((args.flags & TS_MOE_SHARED) != 0u ? 1u : 0u);  // <= TEAMS
#if Q8ACT && !USE_SUBGROUP
  // h's int8 blocks (every slot) into shared memory.
  const uint n_hq = (args.n_used + 1u) * (args.h_stride / 32u);
  for (uint b = gl_LocalInvocationIndex; b < n_hq; b += WG_SIZE) {
    q8_lo[b] = hq[3u * b];
    q8_hi[b] = hq[3u * b + 1u];
    q8_ds[b] = uintBitsToFloat(hq[3u * b + 2u]);
  }
  barrier();
#endif

  const uint row0 = linear_workgroup_id() * ROWS_PER_WG;
  if (row0 >= args.n_embd) return;  // uniform per workgroup
  const uint rows = min(ROWS_PER_WG, args.n_embd - row0);

  // Team s computes slot s of every row of the workgroup.
#if WAIT_GATE
  // The route, then every slot's weight blocks for every row and x's rows, while the gate-up
  // still runs; then its h.
#if DOWN_LATE
  // Word 1 read beside every poll of word 0: a workgroup that starts after the gate-up's last
  // workgroup (on an H100 ~700 of 1024 start as the gate-up's leave) finds both open at once and
  // loads hq beside its weights, without a second wait (+2.4 % once all fit at once, session 13).
  if (gl_LocalInvocationIndex == 0u) {
    uint w0 = 0u, w1 = 0u;
    for (uint spins = 0u; w0 < 1u && spins < kGateSpins; ++spins) {
      w0 = gate_load(0u);
      w1 = gate_load(1u);
    }
    if (w0 < 1u) {
      gate_error[1] = w0;
      gate_error[0] = 1u;
    }
    dn_late = w1 >= uint(GATE_H_TARGET);
  }
#else
  if (gl_LocalInvocationIndex == 0u) gate_poll(0u, 1u, 0u);
#endif
  barrier();
  memoryBarrierBuffer();
  TS_MARK_EARLY();  // bench --timeline: the route seen
#if DOWN_LATE
  const bool late = dn_late;  // uniform
#else
  const bool late = false;
#endif
  const uint s = gl_SubgroupID;
  const uint lane = gl_SubgroupInvocationID, nl = gl_SubgroupSize;
  // hq's blocks of slot s, which the lane uses (where they sit does not depend on the route).
  uvec4 xl[Q8_OWN], xh[Q8_OWN];
  vec4 xd[Q8_OWN];
  const uint hq_nb = (s < n_routed ? args.w_routed : args.w_shared) / 32u;
  const uint hq_b0 = (s < n_routed ? s : args.n_used) * (args.h_stride / 32u);
  [[unroll]] for (uint j = 0; j < Q8_OWN; ++j) {
    xl[j] = uvec4(0u);
    xh[j] = uvec4(0u);
    xd[j] = vec4(0.0);
  }
  if (late && s < n_slots) hq_load(hq_b0, hq_nb, lane, nl, xl, xh, xd);
  Mat m;
  float weight = 0.0;
  const bool has_slot = s < n_slots && slot_matrix(s, n_routed, m, weight);
  const uint nb = has_slot ? m.cols / 32u : 0u;
  Q8WRaw w[ROWS_PER_WG][Q8_OWN];  // held across the wait as loaded
  uint dep = 0u;
  [[unroll]] for (uint r = 0; r < ROWS_PER_WG; ++r) {
    const uint rr = row0 + min(r, rows - 1u);
    [[unroll]] for (uint j = 0; j < Q8_OWN; ++j) {
      if (nb > 0u) {
        w[r][j] = q8_load_raw(m.qbase, m.mbase, rr * nb + min(lane + j * nl, nb - 1u));
        dep |= q8_raw_dep(w[r][j]);
      }
    }
  }
  if (gl_LocalInvocationIndex < rows) gate_x[gl_LocalInvocationIndex] = x[row0 + gl_LocalInvocationIndex];
  if (late) {
    barrier();  // gate_x
    TS_MARK_GATE();  // bench --timeline: no wait (h was written before the route was seen)
  } else {
    gate_wait(1u, uint(GATE_H_TARGET), dep, args.flags & 0xFFFF0000u);  // the high half of flags is zero
    if (s < n_slots) hq_load(hq_b0, hq_nb, lane, nl, xl, xh, xd);
  }
  if (s < n_slots) {
    [[unroll]] for (uint r = 0; r < ROWS_PER_WG; ++r) {
      float d = 0.0;
      [[unroll]] for (uint j = 0; j < Q8_OWN; ++j)
        if (lane + j * nl < nb) d += q8_dot_loaded(q8_unpack(w[r][j]), xl[j], xh[j], xd[j]);
      d = subgroupAdd(d);
      if (subgroupElect() && r < rows) part[r][s] = weight * d;
    }
  }
#elif USE_SUBGROUP && Q8ACT
  // The slot's input blocks this lane uses, in registers; then DN_PASS rows per iteration (the
  // last ones clamped, stored only when valid): up to DN_PASS * Q8_OWN weight loads in flight.
  const uint s = gl_SubgroupID;
  if (s < n_slots) {
    Mat m;
    float weight;
    const bool has_slot = slot_matrix(s, n_routed, m, weight);
    const uint lane = gl_SubgroupInvocationID, nl = gl_SubgroupSize;
    const uint nb = has_slot ? m.cols / 32u : 0u, b0 = has_slot ? m.hoff / 32u : 0u;
    uvec4 xl[Q8_OWN], xh[Q8_OWN];
    vec4 xd[Q8_OWN];
    [[unroll]] for (uint j = 0; j < Q8_OWN; ++j) {
      xl[j] = uvec4(0u);
      xh[j] = uvec4(0u);
      xd[j] = vec4(0.0);
    }
    hq_load(b0, nb, lane, nl, xl, xh, xd);
    for (uint r = 0; r < rows; r += DN_PASS) {
      float d[DN_PASS];
#if DOWN_FIRST
      // Every weight block of the pass's rows loaded first (indices clamped, no branch around a
      // load), then the products of those the lane uses.
      Q8WRaw w[DN_PASS][Q8_OWN];
      if (nb > 0u) {
        [[unroll]] for (uint k = 0; k < DN_PASS; ++k) {
          const uint rr = row0 + min(r + k, rows - 1u);
          [[unroll]] for (uint j = 0; j < Q8_OWN; ++j) w[k][j] = q8_load_raw(m.qbase, m.mbase, rr * nb + min(lane + j * nl, nb - 1u));
        }
      }
      [[unroll]] for (uint k = 0; k < DN_PASS; ++k) {
        d[k] = 0.0;
        [[unroll]] for (uint j = 0; j < Q8_OWN; ++j)
          if (lane + j * nl < nb) d[k] += q8_dot_loaded(q8_unpack(w[k][j]), xl[j], xh[j], xd[j]);
      }
#else
      [[unroll]] for (uint k = 0; k < DN_PASS; ++k) {
        const uint rr = row0 + min(r + k, rows - 1u);
        d[k] = 0.0;
        [[unroll]] for (uint j = 0; j < Q8_OWN; ++j) {
          const uint b = lane + j * nl;
          if (b < nb) d[k] += q8_block_dot_x(m.qbase, m.mbase, rr * nb + b, xl[j], xh[j], xd[j]);
        }
      }
#endif
      [[unroll]] for (uint k = 0; k < DN_PASS; ++k) d[k] = subgroupAdd(d[k]);
      if (subgroupElect()) {
        [[unroll]] for (uint k = 0; k < DN_PASS; ++k)
          if (r + k < rows) part[r + k][s] = weight * d[k];
      }
    }
  }
#elif USE_SUBGROUP
  const uint s = gl_SubgroupID;
  if (s < n_slots) {
    Mat m;
    float weight;
    const bool has_slot = slot_matrix(s, n_routed, m, weight);
    for (uint r = 0; r < rows; ++r) {
      const float d = has_slot ? subgroupAdd(row_dot(m, row0 + r, gl_SubgroupInvocationID, gl_SubgroupSize)) : 0.0;
      if (subgroupElect()) part[r][s] = weight * d;
    }
  }
#else
  const uint lid = gl_LocalInvocationIndex;
  const uint s = lid / THREADS_PER_ROW, lane = lid % THREADS_PER_ROW;
  Mat m;
  float weight = 0.0;
  const bool has_slot = s < n_slots && slot_matrix(s, n_routed, m, weight);
  for (uint r = 0; r < rows; ++r) {
    row_partial[lid] = has_slot ? row_dot(m, row0 + r, lane, THREADS_PER_ROW) : 0.0;
    barrier();
    [[unroll]] for (uint k = THREADS_PER_ROW / 2; k > 0; k >>= 1) {
      if (lane < k) row_partial[lid] += row_partial[lid + k];
      barrier();
    }
    if (lane == 0 && s < n_slots) part[r][s] = weight * row_partial[lid];
    barrier();
  }
#endif
  barrier();
  // Slots summed in order: the result does not depend on which team finished first.
  if (gl_LocalInvocationIndex < rows) {
    const uint r = gl_LocalInvocationIndex;
    float acc = 0.0;
    for (uint k = 0; k < n_slots; ++k) acc += part[r][k];
#if WAIT_GATE
    x[row0 + r] = gate_x[r] + acc;
#else
    x[row0 + r] += acc;
#endif
  }
#if X_SIGNAL
  // This workgroup's rows of x written: counted in groups (TS_DOWN_X_GROUP_WORD) into word 2.
  gate_signal_tree(2u, TS_DOWN_X_GROUP_WORD, linear_workgroup_id(), (args.n_embd + ROWS_PER_WG - 1u) / ROWS_PER_WG);
#endif
}
