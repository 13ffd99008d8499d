#version 450
// D3' / D7' of the decode step (docs/DECODE.md), factored MLA path: per-head matvecs
// y_h = W_h x_h for every head in one dispatch (forward.md section 2.3, 2.4):
//   D3': q_lat_h = Kb_h q_nope_h   W = attn_k_b {Dn, R, H}: H stacked R x Dn matrices
//        (+ the unroped q_pe copied beside q_lat, giving the attention query [q_lat | q_pe])
//   D7': o_h = Vb_h olat_h          W = attn_v_b {R, Dv, H}: H stacked Dv x R matrices
// Arguments: AbsorbArgs (attention_args.h). Wrapper: runtime/vulkan/kernels_attention.h.
//
// Defines: WTYPE (ggml type id), WG_SIZE, THREADS_PER_ROW (= SUBGROUP_SIZE when USE_SUBGROUP,
// else a power of two), PLAIN_VEC8 (plain types with cols % 8 == 0).
// Work split as matvec.comp: a workgroup owns WG_SIZE / THREADS_PER_ROW consecutive weight rows;
// a row is reduced by one subgroup (subgroupAdd) or by THREADS_PER_ROW invocations through shared
// memory. Row g of the bound chunk belongs to head (row_begin + g) / rows; its input vector is that
// head's x. x_stride and x_offset are multiples of 4 (16-byte input loads).
//
// Token dimension (prefill): workgroup z = token t; token t's x and y start at floats
// t*x_token_stride / t*y_token_stride (the weights are read once for all tokens of a dispatch).
//
// Bindings: 0 = W region Q (plain: W rows), 1 = W region M, 2 = x, 3 = y.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attention_args.h"

#define W_Q_BINDING 0
#define W_M_BINDING 1
#include "weights.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 2) readonly restrict buffer XBuf { float x[]; };
layout(std430, binding = 2) readonly restrict buffer XBuf4 { vec4 x4[]; };
layout(std430, binding = 3) writeonly restrict buffer YBuf { float y[]; };

layout(push_constant) uniform Push { AbsorbArgs args; };

#define ROWS_PER_WG (WG_SIZE / THREADS_PER_ROW)

// Partial dot product of bound row `row` with the input starting at x index xb, over this lane's share.
float row_dot(uint row, uint xb, uint lane, uint nlanes) {
  float acc = 0.0;
#if !W_PLAIN
  const uint nb = args.cols / W_BLOCK;
  const uint entry0 = row * nb;
  for (uint u = lane; u < nb * W_UNITS; u += nlanes) {
    const uint b = u / W_UNITS, j = u % W_UNITS;
    float lo[16], hi[16];
    uint off_lo, off_hi;
    split1_unit(0u, 0u, entry0 + b, j, lo, hi, off_lo, off_hi);
    const uint k_lo = xb + b * W_BLOCK + off_lo, k_hi = xb + b * W_BLOCK + off_hi;
    vec4 s = vec4(0.0);
    [[unroll]] for (uint q = 0; q < 4; ++q) {
      s += vec4(lo[4 * q], lo[4 * q + 1], lo[4 * q + 2], lo[4 * q + 3]) * x4[(k_lo >> 2) + q];
      s += vec4(hi[4 * q], hi[4 * q + 1], hi[4 * q + 2], hi[4 * q + 3]) * x4[(k_hi >> 2) + q];
    }
    acc += (s.x + s.y) + (s.z + s.w);
  }
#elif PLAIN_VEC8
  const uint g0 = row * (args.cols / 8u);
  for (uint g = lane; g < args.cols / 8u; g += nlanes) {
    float v[8];
    plain_vec8(g0 + g, v);
    const vec4 s = vec4(v[0], v[1], v[2], v[3]) * x4[(xb >> 2) + 2u * g] + vec4(v[4], v[5], v[6], v[7]) * x4[(xb >> 2) + 2u * g + 1u];
    acc += (s.x + s.y) + (s.z + s.w);
  }
#else
  const uint e0 = row * args.cols;
  for (uint k = lane; k < args.cols; k += nlanes) acc += plain_value(e0 + k) * x[xb + k];
#endif
  return acc;
}

// Input start and output index of bound row `row`.
uint input_base(uint row) {
  return gl_WorkGroupID.z * args.x_token_stride + (args.row_begin + row) / args.rows * args.x_stride + args.x_offset;
}
uint output_index(uint row) {
  const uint g = args.row_begin + row;
  return gl_WorkGroupID.z * args.y_token_stride + g / args.rows * args.y_stride + args.y_offset + g % args.rows;
}

#if !USE_SUBGROUP
shared float row_partial[WG_SIZE];
#endif

void main() {
  const uint wg = linear_workgroup_id();
  if (wg == 0u && args.row_begin == 0u) {
    for (uint i = gl_LocalInvocationIndex; i < args.n_head * args.copy_n; i += WG_SIZE) {
      const uint h = i / args.copy_n, k = i % args.copy_n;
      y[gl_WorkGroupID.z * args.y_token_stride + h * args.y_stride + args.copy_dst + k] =
          x[gl_WorkGroupID.z * args.x_token_stride + h * args.x_stride + args.copy_src + k];
    }
  }
  const uint row0 = wg * ROWS_PER_WG;
  if (row0 >= args.n_rows) return;  // uniform per workgroup
  const uint row_end = min(row0 + ROWS_PER_WG, args.n_rows);

#if USE_SUBGROUP
  for (uint row = row0 + gl_SubgroupID; row < row_end; row += gl_NumSubgroups) {
    const float acc = subgroupAdd(row_dot(row, input_base(row), gl_SubgroupInvocationID, gl_SubgroupSize));
    if (subgroupElect()) y[output_index(row)] = acc;
  }
#else
  const uint lid = gl_LocalInvocationIndex;
  const uint lane = lid % THREADS_PER_ROW;
  const uint row = row0 + lid / THREADS_PER_ROW;
  row_partial[lid] = row < row_end ? row_dot(row, input_base(row), lane, THREADS_PER_ROW) : 0.0;
  barrier();
  [[unroll]] for (uint s = THREADS_PER_ROW / 2; s > 0; s >>= 1) {
    if (lane < s) row_partial[lid] += row_partial[lid + s];
    barrier();
  }
  if (lane == 0 && row < row_end) y[output_index(row)] = row_partial[lid];
#endif
}
