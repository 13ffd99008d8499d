#version 450
// y = W x (+ y), W a SPLIT1 block matrix or a plain F32/F16/BF16 matrix, x and y f32,
// f32 accumulation. Optional: NUM_COLS x vectors at once (batched form), and RMSNorm of x fused
// in (NORM_INPUT: each workgroup recomputes sum(x^2) and scales by norm weight).
// Arguments: MatvecArgs (kernel_args.h). Wrapper: runtime/vulkan/kernels_matvec.h.
//
// Defines: WTYPE (ggml type id), WG_SIZE, THREADS_PER_ROW (= SUBGROUP_SIZE when USE_SUBGROUP,
// else a power of two), NUM_ROWS (rows per subgroup, 1..4; 1 without USE_SUBGROUP), NUM_COLS
// (1..8), NORM_INPUT (0/1), PLAIN_VEC8 (plain types with cols % 8 == 0: 16-byte weight loads),
// UNIT32 (block types: 1 = 32-value units (split1_unit), 0 = 8-value units (split1_unit8)).
// Work split: a subgroup (or THREADS_PER_ROW invocations) owns NUM_ROWS consecutive rows and
// walks them together (every x value it loads serves NUM_ROWS rows: pays off in the batched
// form); rows are reduced with subgroupAdd, or through shared memory.
//
// ROUTER_FOLD (0/1): the router fold's epilogue (router_partial.glsl: partial router logits and
// sum of squares of the new y rows; one column, accumulating: y is the residual stream x).
//
// Bindings: 0 = W region Q (plain: W rows), 1 = W region M, 2 = x, 3 = y, 4 = norm weight (NORM_INPUT),
// 5..7 = router weight, ffn_norm, fold accumulators (ROUTER_FOLD, router_partial.glsl).

#include "common.glsl"

#define W_Q_BINDING 0
#define W_M_BINDING 1
#include "weights.glsl"

#if !USE_SUBGROUP && NUM_ROWS != 1
#error "matvec.comp: the shared-memory path handles one row per invocation group"
#endif

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 2) readonly restrict buffer XBuf { float x[]; };
layout(std430, binding = 2) readonly restrict buffer XBuf4 { vec4 x4[]; };
layout(std430, binding = 3) restrict buffer YBuf { float y[]; };
#if NORM_INPUT
layout(std430, binding = 4) readonly restrict buffer NormBuf { float nw[]; };
layout(std430, binding = 4) readonly restrict buffer NormBuf4 { vec4 nw4[]; };
#endif

layout(push_constant) uniform Push { MatvecArgs args; };

#define GROUPS_PER_WG (WG_SIZE / THREADS_PER_ROW)
#define ROWS_PER_WG (GROUPS_PER_WG * NUM_ROWS)

#if ROUTER_FOLD
#if NUM_COLS != 1
#error "matvec.comp: the router fold takes one column"
#endif
#define RF_ROWS ROWS_PER_WG
#include "router_partial.glsl"
#endif

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
// Adds 8-value unit u (split1_unit8) of rows entry0 / nb .. + nvalid - 1 to acc.
void unit8_dot(uint entry0, uint nb, uint nvalid, uint u, inout float acc[NUM_ROWS][NUM_COLS]) {
  const uint b = u / W_UNITS8, j = u % W_UNITS8;
  vec4 lo[NUM_ROWS], hi[NUM_ROWS];
  uint off_lo, off_hi;
  [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
    if (r == 0u || r < nvalid) split1_unit8(0u, 0u, entry0 + r * nb + b, j, lo[r], hi[r], off_lo, off_hi);
  }
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
    const vec4 xl = xin4(c, b * W_BLOCK + off_lo), xh = xin4(c, b * W_BLOCK + off_hi);
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) acc[r][c] += dot(lo[r], xl) + dot(hi[r], xh);
  }
}
#endif

// Partial dot products of rows row .. row + nvalid - 1 (counted from the bound rows, nvalid <=
// NUM_ROWS) over the lane's share of the columns.
void rows_dot(uint row, uint nvalid, uint lane, uint nlanes, inout float acc[NUM_ROWS][NUM_COLS]) {
#if !W_PLAIN
  const uint nb = args.cols / W_BLOCK;
  const uint entry0 = row * nb;
#endif
#if !W_PLAIN && UNIT32
  // 32-value units: 16-byte weight loads, one scale decode per 32 values (decoding K-quant
  // scales is what limits the 8-value path); x is read 128 bytes apart across lanes.
  for (uint u = lane; u < nb * W_UNITS; u += nlanes) {
    const uint b = u / W_UNITS, j = u % W_UNITS;
    float lo[NUM_ROWS][16], hi[NUM_ROWS][16];
    uint off_lo, off_hi;
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
      if (r == 0u || r < nvalid) split1_unit(0u, 0u, entry0 + r * nb + b, j, lo[r], hi[r], off_lo, off_hi);
    }
    const uint k_lo = b * W_BLOCK + off_lo, k_hi = b * W_BLOCK + off_hi;
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
      vec4 s[NUM_ROWS];
      [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) s[r] = vec4(0.0);
      [[unroll]] for (uint q = 0; q < 4; ++q) {
        const vec4 xl = xin4(c, k_lo + 4 * q), xh = xin4(c, k_hi + 4 * q);
        [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
          s[r] += vec4(lo[r][4 * q], lo[r][4 * q + 1], lo[r][4 * q + 2], lo[r][4 * q + 3]) * xl;
          s[r] += vec4(hi[r][4 * q], hi[r][4 * q + 1], hi[r][4 * q + 2], hi[r][4 * q + 3]) * xh;
        }
      }
      [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) acc[r][c] += (s[r].x + s[r].y) + (s[r].z + s[r].w);
    }
  }
#elif !W_PLAIN
  // 8-value units: consecutive lanes read consecutive weight words and consecutive x vectors.
  // Two units per iteration keep two independent weight loads in flight per lane.
  const uint units = nb * W_UNITS8;
  uint u = lane;
  for (; u + nlanes < units; u += 2u * nlanes) {
    unit8_dot(entry0, nb, nvalid, u, acc);
    unit8_dot(entry0, nb, nvalid, u + nlanes, acc);
  }
  if (u < units) unit8_dot(entry0, nb, nvalid, u, acc);
#elif PLAIN_VEC8
  const uint groups = args.cols / 8u;
  for (uint g = lane; g < groups; g += nlanes) {
    float v[NUM_ROWS][8];
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
      if (r == 0u || r < nvalid) plain_vec8((row + r) * groups + g, v[r]);
    }
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
      const vec4 xl = xin4(c, 8u * g), xh = xin4(c, 8u * g + 4u);
      [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
        const vec4 s = vec4(v[r][0], v[r][1], v[r][2], v[r][3]) * xl + vec4(v[r][4], v[r][5], v[r][6], v[r][7]) * xh;
        acc[r][c] += (s.x + s.y) + (s.z + s.w);
      }
    }
  }
#else
  for (uint k = lane; k < args.cols; k += nlanes) {
    float w[NUM_ROWS];
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) w[r] = (r == 0u || r < nvalid) ? plain_value((row + r) * args.cols + k) : 0.0;
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
      const float xv = xin(c, k);
      [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) acc[r][c] += w[r] * xv;
    }
  }
#endif
}

// y row `row` (of the bound rows) of column c; row0: the workgroup's first row (the fold's copy).
void store(uint row, uint c, float v, uint row0) {
  const uint i = c * args.y_stride + args.row_begin + row;
  const float r = (args.flags & TS_MATVEC_ACCUMULATE) != 0u ? y[i] + v : v;
  y[i] = r;
#if ROUTER_FOLD
  rf_x[row - row0] = r;
#endif
}

#if !USE_SUBGROUP
shared float row_partial[NUM_COLS][WG_SIZE];
#endif

void main() {
  const uint row0 = linear_workgroup_id() * ROWS_PER_WG;

  float scale[NUM_COLS];
#if NORM_INPUT
  // The sums of squares of all columns in one reduction.
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
    float ss = 0.0;
    for (uint k = gl_LocalInvocationIndex; k < args.cols; k += WG_SIZE) {
      const float v = x[args.x_offset + c * args.x_stride + k];
      ss += v * v;
    }
    scale[c] = ss;
  }
  workgroup_sum_cols(scale);
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) scale[c] = inversesqrt(scale[c] / float(args.cols) + args.norm_eps);
#else
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) scale[c] = 1.0;
#endif
  if (row0 >= args.rows) return;  // uniform per workgroup
  const uint row_end = min(row0 + ROWS_PER_WG, args.rows);

  float acc[NUM_ROWS][NUM_COLS];
  [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[r][c] = 0.0;
  }
#if USE_SUBGROUP
  // Subgroup s takes row groups s, s + gl_NumSubgroups, ... of the workgroup (robust to a device
  // whose actual subgroup size differs from SUBGROUP_SIZE).
  for (uint g = gl_SubgroupID; g < GROUPS_PER_WG; g += gl_NumSubgroups) {
    const uint row = row0 + g * NUM_ROWS;
    if (row >= row_end) break;
    const uint nvalid = min(NUM_ROWS, row_end - row);
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
      [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[r][c] = 0.0;
    }
    rows_dot(row, nvalid, gl_SubgroupInvocationID, gl_SubgroupSize, acc);
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
      [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[r][c] = subgroupAdd(acc[r][c]);
    }
    if (subgroupElect()) {
      [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
        if (r < nvalid) {
          [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) store(row + r, c, acc[r][c] * scale[c], row0);
        }
      }
    }
  }
#else
  const uint lid = gl_LocalInvocationIndex;
  const uint lane = lid % THREADS_PER_ROW;
  const uint row = row0 + lid / THREADS_PER_ROW;
  if (row < row_end) rows_dot(row, 1u, lane, THREADS_PER_ROW, acc);
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) row_partial[c][lid] = acc[0][c];
  barrier();
  [[unroll]] for (uint s = THREADS_PER_ROW / 2; s > 0; s >>= 1) {
    if (lane < s) {
      [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) row_partial[c][lid] += row_partial[c][lid + s];
    }
    barrier();
  }
  if (lane == 0 && row < row_end) {
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) store(row, c, row_partial[c][lid] * scale[c], row0);
  }
#endif
#if ROUTER_FOLD
  router_partial(args.row_begin + row0, row_end - row0);
#endif
}
