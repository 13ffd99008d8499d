#version 450
// Y = W X for a chunk of tokens (the prefill's dense matrices): each workgroup reads its BM rows
// of W once for its 16 TG tokens, on tensor cores where the device has them
// (VK_NV_cooperative_matrix, 16 x 16 x 16 products of f16 with f32 sums). Arguments: MatmulArgs
// (kernel_args.h); wrapper: MatmulOp (runtime/vulkan/kernels_matmul.h).
//
// Workgroup (wx, wy, wz): rows BM * wx .. + BM (BM = 16 * MR), tokens 16 TG * wy .. + 16 TG,
// columns wz * k_split .. + k_split (split-K: several workgroups per tile, so that small
// matrices fill the GPU). TG groups of 32 invocations ("lanes"; with COOP the device's subgroups
// of 32), group g taking tokens 16 (TG wy + g) .. + 16 and all BM rows: MR 16 x 16 f32
// accumulators.
//   step (KT columns of W; the last may be short):
//     the invocations dequantize the BM x KT tile of W, 32-value units in turn, into sh (rows
//       0 .. BM), and copy the tokens' KT x16 values, 16 bytes at a time, into sh (rows BM ..):
//       f16 rows of KT + 8 values held as uvec4 (16 bytes of padding per row against bank
//       conflicts);
//     barrier;
//     each group, per 16 columns k: B = its tokens' rows [k .. k + 16] (column-major), and per
//       row tile m, A = W rows 16 m ..[k .. k + 16] (row-major), acc[m] += A B;
//     barrier.
//   epilogue: each group stores its accumulators as f32 into sh (row-major 16 x 16 tiles, where
//     the tiles were), then its lanes write the rows and tokens that exist: to y (+ y with
//     TS_MATVEC_ACCUMULATE), or with n_splits > 1 to the workgroup's partial sums.
// Tokens past n_tokens read x16 rows up to the next multiple of 16 (the host makes them exist)
// and are not stored; rows past `rows` are zero and not stored; columns past `cols` are never
// multiplied (cols is a multiple of 32).
// The cooperative-matrix loads and stores take sh (a uvec4 array) with offsets and strides in
// uvec4 units (8 f16 or 4 f32 values).
//
// COOP 0 is the same kernel with the products as plain FMAs (lane l holds the accumulator
// elements l + 32 i, i < 8, of each tile: row (l + 32 i) % 16, token (l + 32 i) / 16): the path the
// tests run on devices without cooperative matrices, and the proof of everything but the
// 16 x 16 x 16 product itself.
// REDUCE 1 is the split-K sum: invocation i < rows * n_tokens adds the n_splits partial sums of
// row i % rows, token i / rows, in order, into y (+ y with TS_MATVEC_ACCUMULATE).
//
// Defines: WTYPE (a SPLIT1 block type or F32 / F16 / BF16), MR (1, 2 or 4), TG (groups: 1, 2 or 4),
// KT (a multiple of 32; for K-quants, whose units interleave inside a block, of the span a unit's
// values cover: 64 for Q4_K / Q5_K, 128 for Q6_K), COOP;
// PREFETCH_B (0/1; KT <= 128); or REDUCE 1 (and WG_SIZE).
// Bindings: 0 = W region Q (plain: the rows), 1 = W region M, 2 = x16 (f16), 3 = y (f32),
// 4 = partial sums (f32).

#ifndef REDUCE
#define REDUCE 0
#endif

#if REDUCE
#include "common.glsl"
layout(local_size_x = WG_SIZE) in;
layout(std430, binding = 3) restrict buffer YBuf { float y[]; };
layout(std430, binding = 4) readonly restrict buffer Part { float part[]; };
layout(push_constant) uniform Push { MatmulArgs args; };

void main() {
  const uint i = linear_workgroup_id() * uint(WG_SIZE) + gl_LocalInvocationIndex;
  if (i >= args.rows * args.n_tokens) return;
  const uint r = i % args.rows, t = i / args.rows;
  float s = 0.0;
  for (uint z = 0; z < args.n_splits; ++z) s += part[(z * args.n_tokens + t) * args.part_rows + args.row_begin + r];
  const uint yi = t * args.y_stride + args.row_begin + r;
  y[yi] = (args.flags & TS_MATVEC_ACCUMULATE) != 0u ? y[yi] + s : s;
}

#else  // the matmul

#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#if COOP
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#endif

#define WG_SIZE (32 * TG)
#include "common.glsl"
#define W_Q_BINDING 0
#define W_M_BINDING 1
#include "weights.glsl"

#if MR != 1 && MR != 2 && MR != 4
#error "matmul.comp: MR is 1, 2 or 4"
#endif
#if TG != 1 && TG != 2 && TG != 4
#error "matmul.comp: TG is 1, 2 or 4"
#endif
#if KT % 32 != 0
#error "matmul.comp: KT holds whole units of 32"
#endif
#if WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q5_K
#define UNIT_SPAN 64   // units 2c, 2c + 1 fill columns 64c .. 64c + 64 of their block
#elif WTYPE == TS_TYPE_Q6_K
#define UNIT_SPAN 128  // units 4n .. 4n + 3 fill columns 128n .. 128n + 128
#else
#define UNIT_SPAN 32
#endif
#if KT % UNIT_SPAN != 0
#error "matmul.comp: KT holds whole unit spans"
#endif
#if COOP && (!USE_SUBGROUP || SUBGROUP_SIZE != 32)
#error "matmul.comp: COOP needs subgroups of 32"
#endif

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 2) readonly restrict buffer X16 { uvec4 x16v[]; };  // 8 f16 per element
layout(std430, binding = 3) restrict buffer YBuf { float y[]; };
layout(std430, binding = 4) writeonly restrict buffer Part { float part[]; };
layout(push_constant) uniform Push { MatmulArgs args; };

#define BM (16 * MR)
#define RS (KT / 8 + 1)  // row stride of the staged tiles in uvec4 (KT + 8 f16)
#define UNITS_PER_ROW (KT / 32)
#define B0 (BM * RS)     // sh index of the first token row
#define MAX_(a, b) ((a) > (b) ? (a) : (b))
#ifndef PREFETCH_B
#define PREFETCH_B 0
#endif

// The staged W rows then token rows; after the last step, the groups' accumulator tiles
// (TG x MR tiles of 16 x 16 f32 = 64 uvec4 each).
shared uvec4 sh[MAX_((BM + 16 * TG) * RS, TG * MR * 64)];

// 8 values as 8 f16 in a uvec4.
uvec4 pack8(float v0, float v1, float v2, float v3, float v4, float v5, float v6, float v7) {
  return uvec4(packHalf2x16(vec2(v0, v1)), packHalf2x16(vec2(v2, v3)), packHalf2x16(vec2(v4, v5)), packHalf2x16(vec2(v6, v7)));
}
#define PACK8(a, o) pack8(a[o], a[o + 1], a[o + 2], a[o + 3], a[o + 4], a[o + 5], a[o + 6], a[o + 7])

// Unit u (0 .. BM * UNITS_PER_ROW) of the step at column k0 (columns below k_end) into sh: 32
// values of row u / UNITS_PER_ROW (zeros past the bound rows).
void stage_unit(uint u, uint row0, uint k0, uint k_end) {
  const uint r = u / uint(UNITS_PER_ROW), ju = u % uint(UNITS_PER_ROW);
  const uint k = k0 + 32u * ju;  // the unit's first column
  if (k >= k_end) return;
  if (row0 + r >= args.rows) {
    [[unroll]] for (uint i = 0; i < 4; ++i) sh[r * uint(RS) + 4u * ju + i] = uvec4(0u);
    return;
  }
#if W_PLAIN
  float v[8];
  [[unroll]] for (uint g = 0; g < 4; ++g) {
    plain_vec8(((row0 + r) * args.cols + k) / 8u + g, v);
    sh[r * uint(RS) + 4u * ju + g] = PACK8(v, 0);
  }
#else
  // The unit of a block type: block k / W_BLOCK of the row, its unit (k % W_BLOCK) / 32, whose
  // 16 + 16 values land at the block offsets split1_unit reports (multiples of 16, inside the
  // step: it holds whole unit spans).
  const uint nb = args.cols / uint(W_BLOCK);
  const uint entry = (row0 + r) * nb + k / uint(W_BLOCK), j = (k % uint(W_BLOCK)) / 32u;
  float lo[16], hi[16];
  uint off_lo, off_hi;
  split1_unit(0u, 0u, entry, j, lo, hi, off_lo, off_hi);
  const uint block0 = k - k % uint(W_BLOCK);  // the block's first column
  const uint at_lo = r * uint(RS) + (block0 + off_lo - k0) / 8u, at_hi = r * uint(RS) + (block0 + off_hi - k0) / 8u;
  sh[at_lo] = PACK8(lo, 0);
  sh[at_lo + 1u] = PACK8(lo, 8);
  sh[at_hi] = PACK8(hi, 0);
  sh[at_hi + 1u] = PACK8(hi, 8);
#endif
}

// The workgroup's tokens' columns k0 .. min(k0 + KT, k_end) into sh, 8 values per copy: the token
// rows that exist in x16 (n_tokens rounded up to 16).
void stage_tokens(uint tok0, uint k0, uint k_end) {
  const uint n8 = min(uint(KT), k_end - k0) / 8u;  // uvec4 per token row this step
  const uint nt = min(uint(TG * 16), (args.n_tokens + 15u) / 16u * 16u - tok0);
  for (uint c = gl_LocalInvocationIndex; c < nt * n8; c += uint(WG_SIZE)) {
    const uint t = c / n8, j = c % n8;
    sh[B0 + t * uint(RS) + j] = x16v[(args.x_offset + (tok0 + t) * args.x_stride + k0) / 8u + j];
  }
}

#if PREFETCH_B
// PREFETCH_B: the next step's token values are loaded into registers (KT / 16 uvec4 per
// invocation) before the products of this step, and stored into sh after them: their L2 latency
// overlaps the tensor-core work instead of preceding it.
uvec4 bq[KT / 16];
void load_tokens(uint tok0, uint k0, uint k_end) {
  const uint n8 = min(uint(KT), k_end - k0) / 8u;
  const uint nt = min(uint(TG * 16), (args.n_tokens + 15u) / 16u * 16u - tok0);
  [[unroll]] for (uint i = 0; i < uint(KT / 16); ++i) {
    const uint c = gl_LocalInvocationIndex + i * uint(WG_SIZE), t = c / uint(KT / 8), j = c % uint(KT / 8);
    bq[i] = t < nt && j < n8 ? x16v[(args.x_offset + (tok0 + t) * args.x_stride + k0) / 8u + j] : uvec4(0u);
  }
}
void store_tokens() {
  [[unroll]] for (uint i = 0; i < uint(KT / 16); ++i) {
    const uint c = gl_LocalInvocationIndex + i * uint(WG_SIZE);
    sh[B0 + c / uint(KT / 8) * uint(RS) + c % uint(KT / 8)] = bq[i];
  }
}
#endif

#if !COOP
// f16 value k of staged row `row` (W rows from 0, token rows from BM).
float sh_value(uint row, uint k) {
  return unpackHalf2x16(sh[row * uint(RS) + k / 8u][(k % 8u) / 2u] >> ((k & 1u) * 16u)).x;
}
#endif

void main() {
  const uint row0 = gl_WorkGroupID.x * uint(BM);
  if (row0 >= args.rows) return;  // uniform per workgroup
  const uint lid = gl_LocalInvocationIndex, grp = lid / 32u, lane = lid % 32u;
  const uint tok0 = gl_WorkGroupID.y * uint(TG) * 16u;  // the workgroup's first token
  const uint tok = tok0 + 16u * grp;                     // the group's first token
  const bool has_tokens = tok < args.n_tokens;           // uniform per group
  const uint k_begin = gl_WorkGroupID.z * args.k_split;
  const uint k_end = min(args.cols, k_begin + args.k_split);

#if COOP
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[MR];
  [[unroll]] for (uint m = 0; m < MR; ++m) acc[m] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
#else
  float acc[MR][8];
  [[unroll]] for (uint m = 0; m < MR; ++m) {
    [[unroll]] for (uint i = 0; i < 8; ++i) acc[m][i] = 0.0;
  }
#endif

#if PREFETCH_B
  load_tokens(tok0, k_begin, k_end);
#endif
  for (uint k0 = k_begin; k0 < k_end; k0 += uint(KT)) {  // uniform
    [[unroll]] for (uint u = lid; u < uint(BM * UNITS_PER_ROW); u += uint(WG_SIZE)) stage_unit(u, row0, k0, k_end);
#if PREFETCH_B
    store_tokens();
    barrier();
    if (k0 + uint(KT) < k_end) load_tokens(tok0, k0 + uint(KT), k_end);
#else
    stage_tokens(tok0, k0, k_end);
    barrier();
#endif
    const uint nk = min(uint(KT), k_end - k0) / 16u;
    if (has_tokens) {
      for (uint kk = 0; kk < nk; ++kk) {
#if COOP
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b;
        coopMatLoadNV(b, sh, B0 + 16u * grp * uint(RS) + 2u * kk, uint(RS), true);
        [[unroll]] for (uint m = 0; m < MR; ++m) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
          coopMatLoadNV(a, sh, 16u * m * uint(RS) + 2u * kk, uint(RS), false);
          acc[m] = coopMatMulAddNV(a, b, acc[m]);
        }
#else
        [[unroll]] for (uint i = 0; i < 8; ++i) {
          const uint r = (lane + 32u * i) % 16u, t = (lane + 32u * i) / 16u;
          [[unroll]] for (uint m = 0; m < MR; ++m) {
            float s = acc[m][i];
            for (uint q = 0; q < 16u; ++q) s += sh_value(16u * m + r, 16u * kk + q) * sh_value(BM + 16u * grp + t, 16u * kk + q);
            acc[m][i] = s;
          }
        }
#endif
      }
    }
    barrier();
  }

  // Epilogue: the group's tiles as f32 into sh (row-major 16 x 16, 64 uvec4 each), then out.
  const uint cb = grp * uint(MR) * 64u;
#if COOP
  [[unroll]] for (uint m = 0; m < MR; ++m) coopMatStoreNV(acc[m], sh, cb + 64u * m, 4u, false);
#else
  [[unroll]] for (uint m = 0; m < MR; ++m) {
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      const uint e = lane + 32u * i, f = (e % 16u) * 16u + e / 16u;  // row-major index of (row, token)
      sh[cb + 64u * m + f / 4u][f % 4u] = floatBitsToUint(acc[m][i]);
    }
  }
#endif
  barrier();
  if (!has_tokens) return;
  const bool split = args.n_splits > 1u;
  const bool add = (args.flags & TS_MATVEC_ACCUMULATE) != 0u;
  [[unroll]] for (uint m = 0; m < MR; ++m) {
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      const uint e = lane + 32u * i, r = e % 16u, t = e / 16u;  // lanes 0..15: consecutive rows
      const uint row = row0 + 16u * m + r;
      if (row < args.rows && tok + t < args.n_tokens) {
        const uint f = r * 16u + t;
        const float v = uintBitsToFloat(sh[cb + 64u * m + f / 4u][f % 4u]);
        if (split) {
          part[(gl_WorkGroupID.z * args.n_tokens + tok + t) * args.part_rows + args.row_begin + row] = v;
        } else {
          const uint yi = (tok + t) * args.y_stride + args.row_begin + row;
          y[yi] = add ? y[yi] + v : v;
        }
      }
    }
  }
}
#endif  // REDUCE
