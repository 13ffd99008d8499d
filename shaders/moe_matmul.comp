#version 450
// Prefill FFN, expert-major, on tensor cores (the matmul form of moe_prefill.comp: same
// arguments, bindings, pairs and outputs; docs/PREFILL.md). Each workgroup multiplies BM staged
// rows of one slot's matrix by up to 16 TG of the slot's pairs, steps of KT columns, as
// matmul.comp does (VK_NV_cooperative_matrix 16 x 16 x 16 f16 products, f32 sums; COOP 0: the
// same with plain FMAs, the tests' path where no tensor cores are):
//   gate-up: staged tile 2q (rows 32q .. 32q + 15) = the gate rows of outputs i0 + 16q .. + 16,
//            tile 2q + 1 their up rows (MR = 2 or 4); h[p][i] = silu(gate_i . in_p) * (up_i . in_p)
//   down:    staged rows = output rows r0 .. r0 + 16 MR; y[p][r] = w_p * (down_r . h[p])
// The pairs' input rows (f32: h2 rows of their tokens, or h rows of the pairs) are gathered and
// converted to f16 into shared memory per step. The down's h is staged times 2^-8 (its products
// times 2^8): f16 holds h up to 1.7e7 instead of 65504 (SiLU * up is not normalized), at no cost
// in precision above 2^-6. Workgroup (x = row tile, y = slot, z = pair tile
// of 16 TG pairs; empty tiles exit at once).
// Pairs, lists and layouts: prefill_args.h; arguments: PrefillFfnArgs; wrapper: MoePrefillOp
// (runtime/vulkan/kernels_prefill.h, `matmul`).
// Defines: WTYPE, MR (2 or 4; the down also takes 1), TG (1, 2 or 4), KT (as matmul.comp), COOP.
// Bindings: 0 = weights (regions Q and M), 1 = in, 2 = out, 3 = lists, 4 = route, 5 = step.

#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#if COOP
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#endif

#define WG_SIZE (32 * TG)
#include "common.glsl"
#include "prefill_args.h"
#define W_Q_BINDING 0
#define W_M_BINDING 0
#include "weights.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 1) readonly restrict buffer InBuf4 { vec4 in4[]; };
layout(std430, binding = 2) writeonly restrict buffer OutBuf { float out_v[]; };
layout(std430, binding = 3) readonly restrict buffer ListBuf { uint lists[]; };
layout(std430, binding = 4) readonly restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 5) readonly restrict buffer StepBuf { uint step_words[]; };
layout(push_constant) uniform Push { PrefillFfnArgs args; };

#include "matmul_tile.glsl"

bool is_down() { return (args.flags & TS_PF_DOWN) != 0u; }
bool all_tokens() { return (args.flags & TS_PF_ALL_TOKENS) != 0u; }

// Unit ju (32 columns from k0 + 32 ju) of row `wrow` of m (cols long) into staged row r; zeros
// where !valid. Columns at or past cols: nothing.
void stage_unit(uint r, uint ju, bool valid, WMat m, uint wrow, uint cols, uint k0) {
  if (k0 + 32u * ju >= cols) return;
  if (!valid) {
    stage_zero_unit(r, ju);
    return;
  }
#if W_PLAIN
  stage_plain_unit(r, ju, m.qbase + wrow * cols + k0 + 32u * ju);
#else
  stage_block_unit(r, ju, m.qbase, m.mbase, wrow, cols, k0);
#endif
}

float silu(float z) { return z / (1.0 + exp(-z)); }

#define DOWN_IN_SCALE (1.0 / 256.0)  // the down's h as staged (exact: a power of two)

void main() {
  const uint n_tok = min(step_words[args.count_word], args.t_max);
  const uint slot = gl_WorkGroupID.y, e = args.expert_lo + slot;
  const uint n_pairs = all_tokens() ? n_tok : lists[e];
  const uint p0 = gl_WorkGroupID.z * uint(16 * TG);  // the workgroup's first pair (of the slot's list)
  const bool down = is_down(), separate = (args.flags & TS_PF_SEPARATE_GATE_UP) != 0u;
  // Outputs per workgroup: down BM rows; gate-up BM / 2 (a gate and an up tile each).
  const uint out_rows = down ? args.n_embd : args.width, outs = down ? uint(BM) : uint(BM / 2);
  const uint o0 = gl_WorkGroupID.x * outs;
  if (p0 >= n_pairs || o0 >= out_rows) return;  // uniform per workgroup
  const uint lid = gl_LocalInvocationIndex, grp = lid / 32u, lane = lid % 32u;
  const bool has_pairs = p0 + 16u * grp < n_pairs;  // uniform per group
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

  // This invocation's pair rows to gather per step (rows t of the staged pair block).
  const uint nt = min(uint(16 * TG), (n_pairs - p0 + 15u) / 16u * 16u);

  MATMUL_ACC(acc);
  acc_zero(acc);

  for (uint k0 = 0; k0 < cols; k0 += uint(KT)) {  // uniform
    // W: staged row r of tile r / 16 (down: output o0 + r; gate-up: tile 2q the gate rows of
    // outputs o0 + 16q + r % 16, tile 2q + 1 their up rows).
    for (uint u = lid; u < uint(BM * UNITS_PER_ROW); u += uint(WG_SIZE)) {
      const uint r = u / uint(UNITS_PER_ROW), ju = u % uint(UNITS_PER_ROW);
      if (down) {
        stage_unit(r, ju, o0 + r < out_rows, m, o0 + r, cols, k0);
      } else {
        const uint i = o0 + 16u * (r / 32u) + r % 16u, up = (r / 16u) % 2u;
        const uint wrow = separate ? i : 2u * i + up;
        stage_unit(r, ju, i < out_rows, up == 1u && separate ? mu : m, wrow, cols, k0);
      }
    }
    // The pairs' inputs, 8 values per copy (f32 -> f16); rows past the list: zeros.
    const uint n8 = min(uint(KT), cols - k0) / 8u;
    for (uint c = lid; c < nt * n8; c += uint(WG_SIZE)) {
      const uint t = c / n8, j8 = c % n8, j = p0 + t;
      uvec4 v = uvec4(0u);
      if (j < n_pairs) {
        const uint p = all_tokens() ? args.pair_base + j : lists[args.n_expert + e * args.t_max + j];
        const uint row_in = down ? p : (all_tokens() ? j : p / K);
        const uint at = (row_in * args.in_stride + k0 + 8u * j8) >> 2;
        const float s = down ? DOWN_IN_SCALE : 1.0;
        const vec4 a = in4[at] * s, b = in4[at + 1u] * s;
        v = pack8(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
      }
      sh[B0 + t * uint(RS) + j8] = v;
    }
    barrier();
    if (has_pairs) acc_step(min(uint(KT), cols - k0) / 16u, grp, lane, acc);
    barrier();
  }

  // Epilogue: the group's tiles through sh, then out.
  acc_store(grp, lane, acc);
  barrier();
  if (!has_pairs) return;
  [[unroll]] for (uint q = 0; q < 8; ++q) {
    const uint el = lane + 32u * q, r = el % 16u, t = el / 16u;  // lanes 0..15: consecutive rows
    const uint j = p0 + 16u * grp + t;
    if (j >= n_pairs) continue;
    const uint p = all_tokens() ? args.pair_base + j : lists[args.n_expert + e * args.t_max + j];
    if (down) {
      const float w = (all_tokens() ? 1.0 : uintBitsToFloat(route[2u * p + 1u])) * (1.0 / DOWN_IN_SCALE);
      [[unroll]] for (uint i = 0; i < MR; ++i) {
        const uint row = o0 + 16u * i + r;
        if (row < out_rows) out_v[p * args.out_stride + row] = w * acc_value(grp, i, r, t);
      }
    } else {
      [[unroll]] for (uint gt = 0; gt < MR / 2; ++gt) {  // gate tile 2 gt, up tile 2 gt + 1
        const uint i = o0 + 16u * gt + r;
        if (i < out_rows) out_v[p * args.out_stride + i] = silu(acc_value(grp, 2u * gt, r, t)) * acc_value(grp, 2u * gt + 1u, r, t);
      }
    }
  }
}
