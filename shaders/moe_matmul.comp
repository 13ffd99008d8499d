#version 450
// Prefill FFN, expert-major, on tensor cores (the matmul form of moe_prefill.comp: same
// arguments, bindings, pairs and outputs; docs/PREFILL.md). Each workgroup multiplies BM staged
// rows of one slot's matrix by up to 16 PG of the slot's pairs (PG = TG / RSPLIT), steps of KT columns, as
// matmul.comp does (VK_NV_cooperative_matrix 16 x 16 x 16 f16 products, f32 sums; COOP 0: the
// same with plain FMAs, the tests' path where no tensor cores are):
//   gate-up: staged tile 2q (rows 32q .. 32q + 15) = the gate rows of outputs i0 + 16q .. + 16,
//            tile 2q + 1 their up rows (MR = 2, 4 or 8); h[p][i] = silu(gate_i . in_p) * (up_i . in_p)
//   down:    staged rows = output rows r0 .. r0 + 16 MR; y[p][r] = w_p * (down_r . h[p])
// The pairs' input rows (f32: h2 rows of their tokens, or h rows of the pairs; IN_F16: f16) are
// gathered and converted to f16 into shared memory per step; each invocation looks up its rows'
// addresses (the pair list) once, before the K loop. The down's h is staged times 2^-8 (its products
// times 2^8): f16 holds h up to 1.7e7 instead of 65504 (SiLU * up is not normalized), at no cost
// in precision above 2^-6. Workgroup (x = row tile, y = slot, z = pair tile
// of 16 PG pairs; empty tiles exit at once).
// Pairs, lists and layouts: prefill_args.h; arguments: PrefillFfnArgs; wrapper: MoePrefillOp
// (runtime/vulkan/kernels_prefill.h, `matmul`).
// Defines: WTYPE, MR (2, 4 or 8; the down also takes 1), TG (1, 2 or 4), RSPLIT (1 or 2: the
// groups split the row tiles, matmul_tile.glsl; the gate-up's MR / RSPLIT even), KT (as
// matmul.comp), COOP,
// STEP_PREFETCH (bits: 1 = the next step's W words (SPLIT1 types), 2 = its input values, loaded
// into registers before this step's products; 0 = each step loads its own after the barrier),
// IN_F16 (0/1; the gate-up: its input rows are f16 (the router matmul's normed rows), in_stride
// in f16 values, a multiple of 8: copied as they are, half the bytes and registers),
// ACC_DONT_UNROLL (matmul_tile.glsl).
// Bindings: 0 = weights (regions Q and M), 1 = in, 2 = out, 3 = lists, 4 = route, 5 = step.

#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#if COOP
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#endif

#define WG_SIZE (32 * TG)
#ifndef STEP_PREFETCH
#define STEP_PREFETCH 0
#endif
#ifndef IN_F16
#define IN_F16 0
#endif
#include "common.glsl"
#include "prefill_args.h"
#define W_Q_BINDING 0
#define W_M_BINDING 0
#include "weights.glsl"

layout(local_size_x = WG_SIZE) in;

#if IN_F16
layout(std430, binding = 1) readonly restrict buffer InBuf16 { uvec4 in16[]; };  // 8 f16 each
#else
layout(std430, binding = 1) readonly restrict buffer InBuf4 { vec4 in4[]; };
#endif
layout(std430, binding = 2) writeonly restrict buffer OutBuf { float out_v[]; };
layout(std430, binding = 3) readonly restrict buffer ListBuf { uint lists[]; };
layout(std430, binding = 4) readonly restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 5) readonly restrict buffer StepBuf { uint step_words[]; };
layout(push_constant) uniform Push { PrefillFfnArgs args; };

#include "matmul_tile.glsl"

bool is_down() { return (args.flags & TS_PF_DOWN) != 0u; }
bool all_tokens() { return (args.flags & TS_PF_ALL_TOKENS) != 0u; }

float silu(float z) { return z / (1.0 + exp(-z)); }

#define DOWN_IN_SCALE (1.0 / 256.0)  // the down's h as staged (exact: a power of two)

// Each invocation's share of a step, fixed for the whole K loop (so the pair list is read once):
// staged W units u = lid + WG_SIZE i (row u / UNITS_PER_ROW, unit u % UNITS_PER_ROW) and input
// copies c = lid + WG_SIZE i (pair row c / (KT / 8), values 8 (c % (KT / 8)) .. + 8).
#define N_WU ((BM * UNITS_PER_ROW + WG_SIZE - 1) / WG_SIZE)
#define N_IC (KT / (16 * RSPLIT))  // (16 PG rows x KT / 8 copies) / 32 TG invocations
#define UNIT_NONE 0xFFFFFFFFu  // no unit for this invocation
#define UNIT_ZERO 0xFFFFFFFEu  // a row past the matrix: zeros
#define ROW_NONE 0xFFFFFFFFu   // a pair row past the list: zeros
#define PREFETCH_W ((STEP_PREFETCH & 1) != 0 && !W_PLAIN)
#define PREFETCH_X ((STEP_PREFETCH & 2) != 0)

struct StepShare {
  uint wrow[N_WU];  // the unit's row of its matrix, or UNIT_NONE / UNIT_ZERO
  WMat wmat[N_WU];
  uint xrow[N_IC];  // in4 (IN_F16: in16) index of the copy's first values at column 0, or ROW_NONE
};

// The columns of the step at k0 (KT, less on the last step).
uint step_cols(uint k0, uint cols) { return min(uint(KT), cols - k0); }

#if PREFETCH_W
// Unit i's words for the step at k0 (loaded, not used: split1_raw).
void load_w(StepShare sv, uint k0, uint cols, out W1Raw raw[N_WU]) {
  [[unroll]] for (uint i = 0; i < N_WU; ++i) {
    const uint ju = (gl_LocalInvocationIndex + uint(WG_SIZE) * i) % uint(UNITS_PER_ROW), k = k0 + 32u * ju;
    if (sv.wrow[i] < UNIT_ZERO && k < cols) raw[i] = load_raw_unit(sv.wmat[i].qbase, sv.wmat[i].mbase, sv.wrow[i], cols, k);
  }
}
#endif

// Stages unit i's values for the step at k0 (PREFETCH_W: from raw, loaded by load_w).
void stage_w(StepShare sv, uint k0, uint cols
#if PREFETCH_W
             , W1Raw raw[N_WU]
#endif
) {
  [[unroll]] for (uint i = 0; i < N_WU; ++i) {
    const uint u = gl_LocalInvocationIndex + uint(WG_SIZE) * i;
    const uint r = u / uint(UNITS_PER_ROW), ju = u % uint(UNITS_PER_ROW);
    if (sv.wrow[i] == UNIT_NONE || k0 + 32u * ju >= cols) continue;
    if (sv.wrow[i] == UNIT_ZERO) {
      stage_zero_unit(r, ju);
      continue;
    }
#if W_PLAIN
    stage_plain_unit(r, ju, sv.wmat[i].qbase + sv.wrow[i] * cols + k0 + 32u * ju);
#elif PREFETCH_W
    stage_raw_unit(r, ju, k0, sv.wrow[i], cols, raw[i]);
#else
    stage_block_unit(r, ju, sv.wmat[i].qbase, sv.wmat[i].mbase, sv.wrow[i], cols, k0);
#endif
  }
}

// Copy i's 8 input values of the step at k0 (zeros past the list; nothing past the step's
// columns): f32 in xa / xb, or (IN_F16) as they are in xa's bits.
#if IN_F16
void load_x(StepShare sv, uint k0, uint cols, out uvec4 xa[N_IC]) {
#else
void load_x(StepShare sv, uint k0, uint cols, out vec4 xa[N_IC], out vec4 xb[N_IC]) {
#endif
  [[unroll]] for (uint i = 0; i < N_IC; ++i) {
    const uint j8 = (gl_LocalInvocationIndex + uint(WG_SIZE) * i) % uint(KT / 8);
    const bool live = sv.xrow[i] != ROW_NONE && 8u * j8 < step_cols(k0, cols);
#if IN_F16
    xa[i] = live ? in16[sv.xrow[i] + (k0 >> 3)] : uvec4(0u);
#else
    xa[i] = vec4(0.0);
    xb[i] = vec4(0.0);
    if (live) {
      xa[i] = in4[sv.xrow[i] + (k0 >> 2)];
      xb[i] = in4[sv.xrow[i] + (k0 >> 2) + 1u];
    }
#endif
  }
}

// Stores copy i's values (f16; the down's times DOWN_IN_SCALE) for the step at k0.
#if IN_F16
void stage_x(uint k0, uint cols, uint nt, uvec4 xa[N_IC]) {
#else
void stage_x(uint k0, uint cols, uint nt, vec4 xa[N_IC], vec4 xb[N_IC]) {
#endif
  const float s = is_down() ? DOWN_IN_SCALE : 1.0;
  [[unroll]] for (uint i = 0; i < N_IC; ++i) {
    const uint c = gl_LocalInvocationIndex + uint(WG_SIZE) * i, t = c / uint(KT / 8), j8 = c % uint(KT / 8);
    if (t >= nt || 8u * j8 >= step_cols(k0, cols)) continue;
#if IN_F16
    sh[B0 + t * uint(RS) + j8] = xa[i];
#else
    const vec4 a = xa[i] * s, b = xb[i] * s;
    sh[B0 + t * uint(RS) + j8] = pack8(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
#endif
  }
}

void main() {
  const uint n_tok = min(step_words[args.count_word], args.t_max);
  const uint slot = gl_WorkGroupID.y, e = args.expert_lo + slot;
  const uint n_pairs = all_tokens() ? n_tok : lists[e];
  const uint p0 = gl_WorkGroupID.z * uint(16 * PG);  // the workgroup's first pair (of the slot's list)
  const bool down = is_down(), separate = (args.flags & TS_PF_SEPARATE_GATE_UP) != 0u;
  // Outputs per workgroup: down BM rows; gate-up BM / 2 (a gate and an up tile each).
  const uint out_rows = down ? args.n_embd : args.width, outs = down ? uint(BM) : uint(BM / 2);
  const uint o0 = gl_WorkGroupID.x * outs;
  if (p0 >= n_pairs || o0 >= out_rows) return;  // uniform per workgroup
  const uint lid = gl_LocalInvocationIndex, grp = lid / 32u, lane = lid % 32u;
  const uint pg = grp % uint(PG), m0 = grp / uint(PG) * uint(MRL);  // the group's pairs and row tiles
  const bool has_pairs = p0 + 16u * pg < n_pairs;  // uniform per group
  const uint K = args.n_used, cols = down ? args.width : args.n_embd;

  const uint base = all_tokens() ? 0u : slot * args.slot_stride;
  WMat m, mu;
  if (down) {
    m = w_mat_at(base + args.mat_offset, args.n_embd, args.width);
    mu = m;
  } else if (separate) {
    m = w_mat_at(args.mat_offset, args.width, args.n_embd);
    mu = w_mat_at(args.up_offset, args.width, args.n_embd);
  } else {
    m = w_mat_at(base + args.mat_offset, 2u * args.width, args.n_embd);
    mu = m;
  }

  // The staged pair rows: up to 16 PG, whole groups of 16 (rows past the list are zeros).
  const uint nt = min(uint(16 * PG), (n_pairs - p0 + 15u) / 16u * 16u);

  // W: staged row r of tile r / 16 (down: output o0 + r; gate-up: tile 2q the gate rows of
  // outputs o0 + 16q + r % 16, tile 2q + 1 their up rows).
  StepShare sv;
  [[unroll]] for (uint i = 0; i < N_WU; ++i) {
    const uint u = lid + uint(WG_SIZE) * i, r = u / uint(UNITS_PER_ROW);
    sv.wmat[i] = m;
    if (u >= uint(BM * UNITS_PER_ROW)) {
      sv.wrow[i] = UNIT_NONE;
    } else if (down) {
      sv.wrow[i] = o0 + r < out_rows ? o0 + r : UNIT_ZERO;
    } else {
      const uint io = o0 + 16u * (r / 32u) + r % 16u, up = (r / 16u) % 2u;
      sv.wrow[i] = io >= out_rows ? UNIT_ZERO : separate ? io : 2u * io + up;
      if (up == 1u && separate) sv.wmat[i] = mu;
    }
  }
  [[unroll]] for (uint i = 0; i < N_IC; ++i) {
    const uint c = lid + uint(WG_SIZE) * i, t = c / uint(KT / 8), j8 = c % uint(KT / 8), j = p0 + t;
    sv.xrow[i] = ROW_NONE;
    if (t < nt && j < n_pairs) {
      const uint p = all_tokens() ? args.pair_base + j : lists[args.n_expert + e * args.t_max + j];
      const uint row_in = down ? p : (all_tokens() ? j : p / K);
      sv.xrow[i] = (row_in * args.in_stride + 8u * j8) >> (IN_F16 != 0 ? 3 : 2);
    }
  }

  MATMUL_ACC(acc);
  acc_zero(acc);

#if IN_F16
  uvec4 xa[N_IC];
#define XS xa
#else
  vec4 xa[N_IC], xb[N_IC];
#define XS xa, xb
#endif
#if PREFETCH_W
  W1Raw wraw[N_WU];
  load_w(sv, 0u, cols, wraw);
#endif
#if PREFETCH_X
  load_x(sv, 0u, cols, XS);
#endif
  for (uint k0 = 0; k0 < cols; k0 += uint(KT)) {  // uniform
#if PREFETCH_W
    stage_w(sv, k0, cols, wraw);
#else
    stage_w(sv, k0, cols);
#endif
#if !PREFETCH_X
    load_x(sv, k0, cols, XS);
#endif
    stage_x(k0, cols, nt, XS);
    barrier();
    // The next step's loads, in flight during this step's products.
    if (k0 + uint(KT) < cols) {
#if PREFETCH_W
      load_w(sv, k0 + uint(KT), cols, wraw);
#endif
#if PREFETCH_X
      load_x(sv, k0 + uint(KT), cols, XS);
#endif
    }
    if (has_pairs) acc_step(step_cols(k0, cols) / 16u, grp, lane, acc);
    barrier();
  }

  // Epilogue: the group's tiles through sh, then out.
  acc_store(grp, lane, acc);
  barrier();
  if (!has_pairs) return;
  [[unroll]] for (uint q = 0; q < 8; ++q) {
    const uint el = lane + 32u * q, r = el % 16u, t = el / 16u;  // lanes 0..15: consecutive rows
    const uint j = p0 + 16u * pg + t;
    if (j >= n_pairs) continue;
    const uint p = all_tokens() ? args.pair_base + j : lists[args.n_expert + e * args.t_max + j];
    if (down) {
      const float w = (all_tokens() ? 1.0 : uintBitsToFloat(route[2u * p + 1u])) * (1.0 / DOWN_IN_SCALE);
      [[unroll]] for (uint i = 0; i < MRL; ++i) {
        const uint row = o0 + 16u * (m0 + i) + r;
        if (row < out_rows) out_v[p * args.out_stride + row] = w * acc_value(grp, i, r, t);
      }
    } else {
      [[unroll]] for (uint gt = 0; gt < MRL / 2; ++gt) {  // its gate tile 2 gt, up tile 2 gt + 1
        const uint i = o0 + 8u * m0 + 16u * gt + r;
        if (i < out_rows) out_v[p * args.out_stride + i] = silu(acc_value(grp, 2u * gt, r, t)) * acc_value(grp, 2u * gt + 1u, r, t);
      }
    }
  }
}
