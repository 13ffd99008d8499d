#version 450
// Prefill FFN, expert-major, on tensor cores (the matmul form of moe_prefill.comp: same
// arguments, bindings, pairs and outputs; docs/PREFILL.md). Each workgroup multiplies BM staged
// rows of one slot's matrix by up to 16 TG of the slot's pairs, steps of KT columns, as
// matmul.comp does (VK_NV_cooperative_matrix 16 x 16 x 16 f16 products, f32 sums; COOP 0: the
// same with plain FMAs, the tests' path where no tensor cores are):
//   gate-up: staged rows 0..15 = the gate rows of outputs i0 .. i0 + 16, rows 16..31 = their up
//            rows (MR = 2); h[p][i] = silu(gate_i . in_p) * (up_i . in_p)
//   down:    staged rows = output rows r0 .. r0 + 16 MR; y[p][r] = w_p * (down_r . h[p])
// The pairs' input rows (f32: h2 rows of their tokens, or h rows of the pairs) are gathered and
// converted to f16 into shared memory per step. The down's h is staged times 2^-8 (its products
// times 2^8): f16 holds h up to 1.7e7 instead of 65504 (SiLU * up is not normalized), at no cost
// in precision above 2^-6. Workgroup (x = row tile, y = slot, z = pair tile
// of 16 TG pairs; empty tiles exit at once).
// Pairs, lists and layouts: prefill_args.h; arguments: PrefillFfnArgs; wrapper: MoePrefillOp
// (runtime/vulkan/kernels_prefill.h, `matmul`).
// Defines: WTYPE, MR (down: 1, 2 or 4; gate-up: 2), TG (1, 2 or 4), KT (as matmul.comp), COOP.
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

#if WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q5_K
#define UNIT_SPAN 64
#elif WTYPE == TS_TYPE_Q6_K
#define UNIT_SPAN 128
#else
#define UNIT_SPAN 32
#endif
#if KT % UNIT_SPAN != 0 || (MR != 1 && MR != 2 && MR != 4) || (TG != 1 && TG != 2 && TG != 4)
#error "moe_matmul.comp: KT holds whole unit spans; MR and TG are 1, 2 or 4"
#endif
#if COOP && (!USE_SUBGROUP || SUBGROUP_SIZE != 32)
#error "moe_matmul.comp: COOP needs subgroups of 32"
#endif

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 1) readonly restrict buffer InBuf4 { vec4 in4[]; };
layout(std430, binding = 2) writeonly restrict buffer OutBuf { float out_v[]; };
layout(std430, binding = 3) readonly restrict buffer ListBuf { uint lists[]; };
layout(std430, binding = 4) readonly restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 5) readonly restrict buffer StepBuf { uint step_words[]; };
layout(push_constant) uniform Push { PrefillFfnArgs args; };

#define BM (16 * MR)
#define RS (KT / 8 + 1)  // row stride of the staged tiles in uvec4 (KT + 8 f16)
#define UNITS_PER_ROW (KT / 32)
#define B0 (BM * RS)     // sh index of the first pair row
#define MAX_(a, b) ((a) > (b) ? (a) : (b))
shared uvec4 sh[MAX_((BM + 16 * TG) * RS, TG * MR * 64)];

bool is_down() { return (args.flags & TS_PF_DOWN) != 0u; }
bool all_tokens() { return (args.flags & TS_PF_ALL_TOKENS) != 0u; }

uvec4 pack8(float v0, float v1, float v2, float v3, float v4, float v5, float v6, float v7) {
  return uvec4(packHalf2x16(vec2(v0, v1)), packHalf2x16(vec2(v2, v3)), packHalf2x16(vec2(v4, v5)), packHalf2x16(vec2(v6, v7)));
}
#define PACK8(a, o) pack8(a[o], a[o + 1], a[o + 2], a[o + 3], a[o + 4], a[o + 5], a[o + 6], a[o + 7])

// A matrix of `rows` x `cols` at byte `base` of binding 0 (moe_prefill.comp's mat_at).
struct Mat {
  uint qbase;  // SPLIT1: region Q in 16-byte units; plain: first element index
  uint mbase;  // SPLIT1: region M in 32-bit words
};
Mat mat_at(uint base, uint rows, uint cols) {
#if W_PLAIN
  return Mat(base / uint(WTYPE == TS_TYPE_F32 ? 4 : 2), 0u);
#else
  const uint m_off = (rows * (cols / W_BLOCK) * (16u * W_QVEC) + 255u) & ~255u;
  return Mat(base >> 4, (base + m_off) >> 2);
#endif
}

// Unit ju (32 columns from k0 + 32 ju) of row `wrow` of m (cols long) into staged row r; zeros
// where !valid. Columns at or past k_end: nothing.
void stage_unit(uint r, uint ju, bool valid, Mat m, uint wrow, uint cols, uint k0, uint k_end) {
  const uint k = k0 + 32u * ju;
  if (k >= k_end) return;
  if (!valid) {
    [[unroll]] for (uint i = 0; i < 4; ++i) sh[r * uint(RS) + 4u * ju + i] = uvec4(0u);
    return;
  }
#if W_PLAIN
  const uint e0 = m.qbase + wrow * cols + k;
  [[unroll]] for (uint g = 0; g < 4; ++g)
    sh[r * uint(RS) + 4u * ju + g] = pack8(plain_value(e0 + 8u * g), plain_value(e0 + 8u * g + 1u), plain_value(e0 + 8u * g + 2u),
                                           plain_value(e0 + 8u * g + 3u), plain_value(e0 + 8u * g + 4u), plain_value(e0 + 8u * g + 5u),
                                           plain_value(e0 + 8u * g + 6u), plain_value(e0 + 8u * g + 7u));
#else
  const uint nb = cols / uint(W_BLOCK);
  float lo[16], hi[16];
  uint off_lo, off_hi;
  split1_unit(m.qbase, m.mbase, wrow * nb + k / uint(W_BLOCK), (k % uint(W_BLOCK)) / 32u, lo, hi, off_lo, off_hi);
  const uint block0 = k - k % uint(W_BLOCK);
  const uint at_lo = r * uint(RS) + (block0 + off_lo - k0) / 8u, at_hi = r * uint(RS) + (block0 + off_hi - k0) / 8u;
  sh[at_lo] = PACK8(lo, 0);
  sh[at_lo + 1u] = PACK8(lo, 8);
  sh[at_hi] = PACK8(hi, 0);
  sh[at_hi + 1u] = PACK8(hi, 8);
#endif
}

#if !COOP
float sh_value(uint row, uint k) {
  return unpackHalf2x16(sh[row * uint(RS) + k / 8u][(k % 8u) / 2u] >> ((k & 1u) * 16u)).x;
}
#endif

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
  Mat m, mu;
  if (down) {
    m = mat_at(base + args.mat_offset, args.n_embd, args.width);
    mu = m;
  } else if (separate) {
    m = mat_at(args.mat_offset, args.width, args.n_embd);
    mu = mat_at(args.up_offset, args.width, args.n_embd);
  } else {
    m = mat_at(base + args.mat_offset, 2u * args.width, args.n_embd);
    mu = m;
  }

  // This invocation's pair rows to gather per step (rows t of the staged pair block).
  const uint nt = min(uint(16 * TG), (n_pairs - p0 + 15u) / 16u * 16u);

#if COOP
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[MR];
  [[unroll]] for (uint i = 0; i < MR; ++i) acc[i] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
#else
  float acc[MR][8];
  [[unroll]] for (uint i = 0; i < MR; ++i) {
    [[unroll]] for (uint q = 0; q < 8; ++q) acc[i][q] = 0.0;
  }
#endif

  for (uint k0 = 0; k0 < cols; k0 += uint(KT)) {  // uniform
    // W: staged row r of tile r / 16 (down: output o0 + r; gate-up: tile 0 the gate rows of
    // outputs o0 + r, tile 1 their up rows).
    for (uint u = lid; u < uint(BM * UNITS_PER_ROW); u += uint(WG_SIZE)) {
      const uint r = u / uint(UNITS_PER_ROW), ju = u % uint(UNITS_PER_ROW);
      if (down) {
        stage_unit(r, ju, o0 + r < out_rows, m, o0 + r, cols, k0, cols);
      } else {
        const uint i = o0 + r % 16u, up = r / 16u;  // MR == 2
        const uint wrow = separate ? i : 2u * i + up;
        stage_unit(r, ju, i < out_rows, up == 1u && separate ? mu : m, wrow, cols, k0, cols);
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
    const uint nk = min(uint(KT), cols - k0) / 16u;
    if (has_pairs) {
      for (uint kk = 0; kk < nk; ++kk) {
#if COOP
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b;
        coopMatLoadNV(b, sh, B0 + 16u * grp * uint(RS) + 2u * kk, uint(RS), true);
        [[unroll]] for (uint i = 0; i < MR; ++i) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
          coopMatLoadNV(a, sh, 16u * i * uint(RS) + 2u * kk, uint(RS), false);
          acc[i] = coopMatMulAddNV(a, b, acc[i]);
        }
#else
        [[unroll]] for (uint q = 0; q < 8; ++q) {
          const uint r = (lane + 32u * q) % 16u, t = (lane + 32u * q) / 16u;
          [[unroll]] for (uint i = 0; i < MR; ++i) {
            float s = acc[i][q];
            for (uint kq = 0; kq < 16u; ++kq) s += sh_value(16u * i + r, 16u * kk + kq) * sh_value(BM + 16u * grp + t, 16u * kk + kq);
            acc[i][q] = s;
          }
        }
#endif
      }
    }
    barrier();
  }

  // Epilogue: the group's tiles as f32 into sh (row-major 16 x 16), then out.
  const uint cb = grp * uint(MR) * 64u;
#if COOP
  [[unroll]] for (uint i = 0; i < MR; ++i) coopMatStoreNV(acc[i], sh, cb + 64u * i, 4u, false);
#else
  [[unroll]] for (uint i = 0; i < MR; ++i) {
    [[unroll]] for (uint q = 0; q < 8; ++q) {
      const uint el = lane + 32u * q, f = (el % 16u) * 16u + el / 16u;
      sh[cb + 64u * i + f / 4u][f % 4u] = floatBitsToUint(acc[i][q]);
    }
  }
#endif
  barrier();
  if (!has_pairs) return;
#define C_AT(tile, r, t) uintBitsToFloat(sh[cb + 64u * (tile) + ((r) * 16u + (t)) / 4u][((r) * 16u + (t)) % 4u])
  [[unroll]] for (uint q = 0; q < 8; ++q) {
    const uint el = lane + 32u * q, r = el % 16u, t = el / 16u;  // lanes 0..15: consecutive rows
    const uint j = p0 + 16u * grp + t;
    if (j >= n_pairs) continue;
    const uint p = all_tokens() ? args.pair_base + j : lists[args.n_expert + e * args.t_max + j];
    if (down) {
      const float w = (all_tokens() ? 1.0 : uintBitsToFloat(route[2u * p + 1u])) * (1.0 / DOWN_IN_SCALE);
      [[unroll]] for (uint i = 0; i < MR; ++i) {
        const uint row = o0 + 16u * i + r;
        if (row < out_rows) out_v[p * args.out_stride + row] = w * C_AT(i, r, t);
      }
    } else {
      const uint i = o0 + r;
      if (i < out_rows) out_v[p * args.out_stride + i] = silu(C_AT(0u, r, t)) * C_AT(1u, r, t);
    }
  }
}
