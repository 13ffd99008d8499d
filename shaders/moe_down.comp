#version 450
// MoE down projection with the routing weights, the sum over experts and the residual add
// (decode_plan.md D10), for each output row r < n_embd:
//   x[r] += sum_{k < n_used} w_k (down_{e_k} row r . h[k]) + (shared down row r . h[n_used])
// The routed terms come only with TS_MOE_ROUTED (and only for experts e_k in
// [expert_lo, expert_hi), the slots bound to this dispatch), the shared term only with
// TS_MOE_SHARED. The dense FFN is the shared-only case (n_used = 0, its down matrix at
// shared_offset). Routing is recomputed per workgroup (routing.glsl, same code as the gate-up).
// Arguments: MoeArgs (moe_args.h). Wrapper: MoeFfnOp / DenseFfnOp (runtime/vulkan/kernels_moe.h).
//
// Defines: WTYPE (down type), WG_SIZE, THREADS_PER_ROW (= SUBGROUP_SIZE when USE_SUBGROUP),
// ROWS_PER_WG, PLAIN_VEC8 (plain types whose row lengths are multiples of 8).
// Bindings: 0 = weights (regions Q and M), 1 = h, 2 = x (in/out), 3 = router logits, 4 = expert bias.

#include "common.glsl"
#include "moe_args.h"

#define W_Q_BINDING 0
#define W_M_BINDING 0
#include "weights.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 1) readonly restrict buffer HBuf { float h[]; };
layout(std430, binding = 1) readonly restrict buffer HBuf4 { vec4 h4[]; };
layout(std430, binding = 2) restrict buffer XBuf { float x[]; };
layout(std430, binding = 3) readonly restrict buffer LogitBuf { float route_logits[]; };
layout(std430, binding = 4) readonly restrict buffer BiasBuf { float route_bias[]; };

layout(push_constant) uniform Push { MoeArgs args; };

#include "routing.glsl"

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

// Partial dot product of row r of m with its input over this lane's share of the row.
float row_dot(Mat m, uint r, uint lane, uint nlanes) {
  float acc = 0.0;
#if !W_PLAIN
  const uint nb = m.cols / W_BLOCK;
  const uint units = nb * W_UNITS;
  for (uint t = lane; t < units; t += nlanes) {
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
  const uint groups = m.cols / 8u;
  const uint g0 = (m.qbase >> 3) + r * groups;
  for (uint t = lane; t < groups; t += nlanes) {
    float v[8];
    plain_vec8(g0 + t, v);
    const uint k = (m.hoff >> 2) + 2u * t;
    const vec4 s = vec4(v[0], v[1], v[2], v[3]) * h4[k] + vec4(v[4], v[5], v[6], v[7]) * h4[k + 1u];
    acc += (s.x + s.y) + (s.z + s.w);
  }
#else
  const uint e0 = m.qbase + r * m.cols;
  for (uint k = lane; k < m.cols; k += nlanes) acc += plain_value(e0 + k) * h[m.hoff + k];
#endif
  return acc;
}

// This lane's share of the whole sum for output row r.
float row_sum(uint r, uint lane, uint nlanes) {
  float acc = 0.0;
  if ((args.flags & TS_MOE_ROUTED) != 0u) {
    for (uint k = 0; k < args.n_used; ++k) {
      const uint e = route_expert(k);
      if (e < args.expert_lo || e >= args.expert_hi) continue;
      const Mat m = mat_at((e - args.expert_lo) * args.slot_stride + args.routed_offset, args.w_routed, k * args.h_stride);
      acc += route_weight(k) * row_dot(m, r, lane, nlanes);
    }
  }
  if ((args.flags & TS_MOE_SHARED) != 0u)
    acc += row_dot(mat_at(args.shared_offset, args.w_shared, args.n_used * args.h_stride), r, lane, nlanes);
  return acc;
}

#if !USE_SUBGROUP
shared float row_partial[WG_SIZE];
#endif

void main() {
  if ((args.flags & TS_MOE_ROUTED) != 0u)
    route_compute(args.n_expert, args.n_used, args.gating, args.flags, args.weights_scale);

  const uint row0 = linear_workgroup_id() * ROWS_PER_WG;
  if (row0 >= args.n_embd) return;  // uniform per workgroup
  const uint row_end = min(row0 + ROWS_PER_WG, args.n_embd);

#if USE_SUBGROUP
  for (uint r = row0 + gl_SubgroupID; r < row_end; r += gl_NumSubgroups) {
    const float acc = subgroupAdd(row_sum(r, gl_SubgroupInvocationID, gl_SubgroupSize));
    if (subgroupElect()) x[r] += acc;
  }
#else
  const uint lid = gl_LocalInvocationIndex;
  const uint lane = lid % THREADS_PER_ROW;
  for (uint rb = row0; rb < row_end; rb += WG_SIZE / THREADS_PER_ROW) {
    const uint r = rb + lid / THREADS_PER_ROW;
    row_partial[lid] = r < row_end ? row_sum(r, lane, THREADS_PER_ROW) : 0.0;
    barrier();
    [[unroll]] for (uint s = THREADS_PER_ROW / 2; s > 0; s >>= 1) {
      if (lane < s) row_partial[lid] += row_partial[lid + s];
      barrier();
    }
    if (lane == 0 && r < row_end) x[r] += row_partial[lid];
    barrier();
  }
#endif
}
