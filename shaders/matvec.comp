#version 450
// y = W x (+ y), W a SPLIT1 block matrix or a plain F32/F16/BF16 matrix, x and y f32,
// f32 accumulation. Optional: NUM_COLS x vectors at once (batched form), and RMSNorm of x fused
// in (NORM_INPUT: each workgroup recomputes sum(x^2) and scales by norm weight).
// Arguments: MatvecArgs (kernel_args.h). Wrapper: runtime/vulkan/kernels_matvec.h.
//
// Defines: WTYPE (ggml type id), WG_SIZE, THREADS_PER_ROW (= SUBGROUP_SIZE when USE_SUBGROUP,
// else a power of two), NUM_COLS (1..8), NORM_INPUT (0/1), PLAIN_VEC8 (plain types with
// cols % 8 == 0: 16-byte weight loads), UNIT32 (block types: 1 = 32-value units (split1_unit),
// 0 = 8-value units (split1_unit8); the wrapper picks the faster one per type).
// Work split: a workgroup owns WG_SIZE / THREADS_PER_ROW consecutive rows; a row is reduced by
// one subgroup (subgroupAdd) or by THREADS_PER_ROW invocations through shared memory. Lanes walk
// a row in 8- or 32-value units (block types) or 8/1-element steps (plain types).
//
// Bindings: 0 = W region Q (plain: W rows), 1 = W region M, 2 = x, 3 = y, 4 = norm weight (NORM_INPUT).

#include "common.glsl"

#define W_Q_BINDING 0
#define W_M_BINDING 1
#include "weights.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 2) readonly restrict buffer XBuf { float x[]; };
layout(std430, binding = 2) readonly restrict buffer XBuf4 { vec4 x4[]; };
layout(std430, binding = 3) restrict buffer YBuf { float y[]; };
#if NORM_INPUT
layout(std430, binding = 4) readonly restrict buffer NormBuf { float nw[]; };
layout(std430, binding = 4) readonly restrict buffer NormBuf4 { vec4 nw4[]; };
#endif

layout(push_constant) uniform Push { MatvecArgs args; };

#define ROWS_PER_WG (WG_SIZE / THREADS_PER_ROW)

// x element k of column c, times the norm weight when NORM_INPUT (the 1/rms factor is applied
// to the finished dot product).
float xin(uint c, uint k) {
  float v = x[args.x_offset + c * args.x_stride + k];
#if NORM_INPUT
  v *= nw[k];
#endif
  return v;
}
// 4 elements k..k+3 (k % 4 == 0; x_offset and x_stride are multiples of 4 on these paths).
vec4 xin4(uint c, uint k) {
  vec4 v = x4[(args.x_offset + c * args.x_stride + k) >> 2];
#if NORM_INPUT
  v *= nw4[k >> 2];
#endif
  return v;
}

#if !W_PLAIN
// Adds unit u (8 values, split1_unit8) of the row whose first block is entry0 to acc.
void unit_dot(uint entry0, uint u, inout float acc[NUM_COLS]) {
  const uint b = u / W_UNITS8, j = u % W_UNITS8;
  vec4 lo, hi;
  uint off_lo, off_hi;
  split1_unit8(0u, 0u, entry0 + b, j, lo, hi, off_lo, off_hi);
  const uint k = b * W_BLOCK;
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[c] += dot(lo, xin4(c, k + off_lo)) + dot(hi, xin4(c, k + off_hi));
}
#endif

// Partial dot products of row `row` (counted from the bound rows) over the lane's share.
void row_dot(uint row, uint lane, uint nlanes, inout float acc[NUM_COLS]) {
#if !W_PLAIN && UNIT32
  // Lanes take consecutive 32-value units: 16-byte weight loads and one scale decode per 32
  // values (decoding K-quant scales is what limits the 8-value path), x read 128 bytes apart.
  const uint nb = args.cols / W_BLOCK;
  const uint units = nb * W_UNITS;
  const uint entry0 = row * nb;
  for (uint u = lane; u < units; u += nlanes) {
    const uint b = u / W_UNITS, j = u % W_UNITS;
    float lo[16], hi[16];
    uint off_lo, off_hi;
    split1_unit(0u, 0u, entry0 + b, j, lo, hi, off_lo, off_hi);
    const uint k_lo = b * W_BLOCK + off_lo, k_hi = b * W_BLOCK + off_hi;
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
      vec4 s = vec4(0.0);
      [[unroll]] for (uint q = 0; q < 4; ++q) {
        s += vec4(lo[4 * q], lo[4 * q + 1], lo[4 * q + 2], lo[4 * q + 3]) * xin4(c, k_lo + 4 * q);
        s += vec4(hi[4 * q], hi[4 * q + 1], hi[4 * q + 2], hi[4 * q + 3]) * xin4(c, k_hi + 4 * q);
      }
      acc[c] += (s.x + s.y) + (s.z + s.w);
    }
  }
#elif !W_PLAIN
  // Lanes take consecutive 8-value units: weight words and x vectors are read coalesced. Two
  // units per iteration keep two independent loads in flight per lane.
  const uint nb = args.cols / W_BLOCK;
  const uint units = nb * W_UNITS8;
  const uint entry0 = row * nb;
  uint u = lane;
  for (; u + nlanes < units; u += 2u * nlanes) {
    unit_dot(entry0, u, acc);
    unit_dot(entry0, u + nlanes, acc);
  }
  if (u < units) unit_dot(entry0, u, acc);
#elif PLAIN_VEC8
  const uint groups = args.cols / 8u;
  const uint g0 = row * groups;
  for (uint g = lane; g < groups; g += nlanes) {
    float v[8];
    plain_vec8(g0 + g, v);
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
      const vec4 s = vec4(v[0], v[1], v[2], v[3]) * xin4(c, 8u * g) + vec4(v[4], v[5], v[6], v[7]) * xin4(c, 8u * g + 4u);
      acc[c] += (s.x + s.y) + (s.z + s.w);
    }
  }
#else
  const uint e0 = row * args.cols;
  for (uint k = lane; k < args.cols; k += nlanes) {
    const float w = plain_value(e0 + k);
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[c] += w * xin(c, k);
  }
#endif
}

void store(uint row, float acc[NUM_COLS], float scale[NUM_COLS]) {
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
    const uint i = c * args.y_stride + args.row_begin + row;
    const float v = acc[c] * scale[c];
    y[i] = (args.flags & TS_MATVEC_ACCUMULATE) != 0u ? y[i] + v : v;
  }
}

#if !USE_SUBGROUP
shared float row_partial[NUM_COLS][WG_SIZE];
#endif

void main() {
  const uint row0 = linear_workgroup_id() * ROWS_PER_WG;

  float scale[NUM_COLS];
#if NORM_INPUT
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
    float ss = 0.0;
    for (uint k = gl_LocalInvocationIndex; k < args.cols; k += WG_SIZE) {
      const float v = x[args.x_offset + c * args.x_stride + k];
      ss += v * v;
    }
    ss = workgroup_sum(ss);
    scale[c] = inversesqrt(ss / float(args.cols) + args.norm_eps);
  }
#else
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) scale[c] = 1.0;
#endif
  if (row0 >= args.rows) return;  // uniform per workgroup
  const uint row_end = min(row0 + ROWS_PER_WG, args.rows);

#if USE_SUBGROUP
  // Subgroup s of the workgroup takes rows row0 + s, row0 + s + gl_NumSubgroups, ... (robust to
  // a device whose actual subgroup size differs from SUBGROUP_SIZE).
  for (uint row = row0 + gl_SubgroupID; row < row_end; row += gl_NumSubgroups) {
    float acc[NUM_COLS];
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[c] = 0.0;
    row_dot(row, gl_SubgroupInvocationID, gl_SubgroupSize, acc);
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[c] = subgroupAdd(acc[c]);
    if (subgroupElect()) store(row, acc, scale);
  }
#else
  const uint lid = gl_LocalInvocationIndex;
  const uint lane = lid % THREADS_PER_ROW;
  const uint row = row0 + lid / THREADS_PER_ROW;
  float acc[NUM_COLS];
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[c] = 0.0;
  if (row < row_end) row_dot(row, lane, THREADS_PER_ROW, acc);
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) row_partial[c][lid] = acc[c];
  barrier();
  [[unroll]] for (uint s = THREADS_PER_ROW / 2; s > 0; s >>= 1) {
    if (lane < s) {
      [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) row_partial[c][lid] += row_partial[c][lid + s];
    }
    barrier();
  }
  if (lane == 0 && row < row_end) {
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[c] = row_partial[c][lid];
    store(row, acc, scale);
  }
#endif
}
