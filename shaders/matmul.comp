#version 450
// Y = W X for a chunk of tokens (the prefill's dense matrices): each workgroup reads its BM rows
// of W once for up to 64 tokens, on tensor cores where the device has them
// (VK_NV_cooperative_matrix, 16 x 16 x 16 products of f16 with f32 sums). Arguments: MatmulArgs
// (kernel_args.h); wrapper: MatmulOp (runtime/vulkan/kernels_matmul.h).
//
// Workgroup (wx, wy): rows BM * wx .. + BM (BM = 16 * MR), tokens 16 TG * wy .. + 16 TG; TG
// groups of 32 invocations ("lanes"; with COOP the device's subgroups of 32), group g taking
// tokens 16 (TG wy + g) .. + 16 and all BM rows: MR 16 x 16 f32 accumulators.
//   step (KT columns of W; the last may be short):
//     the invocations dequantize the BM x KT tile of W, 32-value units in turn, into a_sh (f16,
//       row-major, row stride KTP = KT + 8: 16 bytes of padding against bank conflicts);
//     barrier;
//     each group, per 16 columns k: B = x16[tokens][k .. k + 16] (16 x 16, straight from the
//       buffer: column-major with the token stride; KB of them loaded before their products, so
//       that their L2 round trips overlap) and, per row tile m, A = a_sh[16 m ..][k ..],
//       acc[m] += A B;
//     barrier.
//   epilogue: each group stores its accumulators into c_sh (row-major 16 x 16 each), then its
//     lanes write the rows and tokens that exist to y (+ y with TS_MATVEC_ACCUMULATE).
// Tokens past n_tokens read x16 rows up to the next multiple of 16 (the host makes them exist)
// and are not stored; rows past `rows` are zero in a_sh and not stored; columns past `cols` are
// never multiplied (cols is a multiple of 32).
//
// COOP 0 is the same kernel with the products as plain FMAs (lane l holds the accumulator
// elements l + 32 i, i < 8, of each tile: row (l + 32 i) % 16, token (l + 32 i) / 16): the path the
// tests run on devices without cooperative matrices, and the proof of everything but the
// 16 x 16 x 16 product itself.
//
// Defines: WTYPE (a SPLIT1 block type or F32 / F16 / BF16), MR (1, 2 or 4), TG (groups: 1, 2 or 4),
// KT (a multiple of 32; of 256 for K-quants, whose units interleave inside a block), COOP.
// Bindings: 0 = W region Q (plain: the rows), 1 = W region M, 2 = x16 (f16), 3 = y (f32).

#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
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
#if !W_PLAIN
#if KT % W_BLOCK != 0
#error "matmul.comp: KT holds whole blocks"
#endif
#endif
#if COOP && (!USE_SUBGROUP || SUBGROUP_SIZE != 32)
#error "matmul.comp: COOP needs subgroups of 32"
#endif

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 2) readonly restrict buffer X16 { float16_t x16[]; };
layout(std430, binding = 3) restrict buffer YBuf { float y[]; };
layout(push_constant) uniform Push { MatmulArgs args; };

#define BM (16 * MR)
#define KTP (KT + 8)  // a_sh row stride (f16)
#define UNITS_PER_ROW (KT / 32)
#define KB 8          // B tiles loaded ahead of their products

shared float16_t a_sh[BM * KTP];
shared float c_sh[TG * MR * 256];

// Unit u (0 .. BM * UNITS_PER_ROW) of the step at column k0 into a_sh: 32 values of row
// u / UNITS_PER_ROW (zeros past the bound rows; nothing for columns past cols).
void stage_unit(uint u, uint row0, uint k0) {
  const uint r = u / uint(UNITS_PER_ROW), ju = u % uint(UNITS_PER_ROW);
  const uint k = k0 + 32u * ju;  // the unit's first column
  if (k >= args.cols) return;
  const uint at = r * uint(KTP) + 32u * ju;
  if (row0 + r >= args.rows) {
    [[unroll]] for (uint i = 0; i < 32; ++i) a_sh[at + i] = float16_t(0.0);
    return;
  }
#if W_PLAIN
  float v[8];
  [[unroll]] for (uint g = 0; g < 4; ++g) {
    plain_vec8(((row0 + r) * args.cols + k) / 8u + g, v);
    [[unroll]] for (uint i = 0; i < 8; ++i) a_sh[at + 8u * g + i] = float16_t(v[i]);
  }
#else
  // The unit of a block type: block k / W_BLOCK of the row, its unit (k % W_BLOCK) / 32, whose
  // values land at the block offsets split1_unit reports.
  const uint nb = args.cols / uint(W_BLOCK);
  const uint entry = (row0 + r) * nb + k / uint(W_BLOCK), j = (k % uint(W_BLOCK)) / 32u;
  float lo[16], hi[16];
  uint off_lo, off_hi;
  split1_unit(0u, 0u, entry, j, lo, hi, off_lo, off_hi);
  const uint base = at - (k % uint(W_BLOCK));  // a_sh index of the block's element 0
  [[unroll]] for (uint i = 0; i < 16; ++i) {
    a_sh[base + off_lo + i] = float16_t(lo[i]);
    a_sh[base + off_hi + i] = float16_t(hi[i]);
  }
#endif
}

void main() {
  const uint row0 = gl_WorkGroupID.x * uint(BM);
  if (row0 >= args.rows) return;  // uniform per workgroup
  const uint lid = gl_LocalInvocationIndex, grp = lid / 32u, lane = lid % 32u;
  const uint tok = (gl_WorkGroupID.y * uint(TG) + grp) * 16u;  // the group's first token
  const bool has_tokens = tok < args.n_tokens;              // uniform per group
  const uint xb = args.x_offset + tok * args.x_stride;  // x16 index of the group's B tiles

#if COOP
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[MR];
  [[unroll]] for (uint m = 0; m < MR; ++m) acc[m] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
#else
  float acc[MR][8];
  [[unroll]] for (uint m = 0; m < MR; ++m) {
    [[unroll]] for (uint i = 0; i < 8; ++i) acc[m][i] = 0.0;
  }
#endif

  for (uint k0 = 0; k0 < args.cols; k0 += uint(KT)) {  // uniform
    [[unroll]] for (uint u = lid; u < uint(BM * UNITS_PER_ROW); u += uint(WG_SIZE)) stage_unit(u, row0, k0);
    barrier();
    const uint nk = min(uint(KT), args.cols - k0) / 16u;
    if (has_tokens) {
#if COOP
      for (uint kb = 0; kb < nk; kb += uint(KB)) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b[KB];
        [[unroll]] for (uint i = 0; i < KB; ++i)
          if (kb + i < nk) coopMatLoadNV(b[i], x16, xb + k0 + 16u * (kb + i), args.x_stride, true);
        [[unroll]] for (uint i = 0; i < KB; ++i) {
          if (kb + i < nk) {
            [[unroll]] for (uint m = 0; m < MR; ++m) {
              fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
              coopMatLoadNV(a, a_sh, 16u * m * uint(KTP) + 16u * (kb + i), uint(KTP), false);
              acc[m] = coopMatMulAddNV(a, b[i], acc[m]);
            }
          }
        }
      }
#else
      for (uint kk = 0; kk < nk; ++kk) {
        [[unroll]] for (uint i = 0; i < 8; ++i) {
          const uint r = (lane + 32u * i) % 16u, t = (lane + 32u * i) / 16u;
          const uint xi = xb + t * args.x_stride + k0 + 16u * kk;
          [[unroll]] for (uint m = 0; m < MR; ++m) {
            const uint ai = (16u * m + r) * uint(KTP) + 16u * kk;
            float s = acc[m][i];
            for (uint q = 0; q < 16u; ++q) s += float(a_sh[ai + q]) * float(x16[xi + q]);
            acc[m][i] = s;
          }
        }
      }
#endif
    }
    barrier();
  }

  // Epilogue: the group's tiles through c_sh (row-major), then to y.
  const uint cb = grp * uint(MR) * 256u;
#if COOP
  [[unroll]] for (uint m = 0; m < MR; ++m) coopMatStoreNV(acc[m], c_sh, cb + 256u * m, 16u, false);
#else
  [[unroll]] for (uint m = 0; m < MR; ++m) {
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      const uint e = lane + 32u * i;
      c_sh[cb + 256u * m + (e % 16u) * 16u + e / 16u] = acc[m][i];
    }
  }
#endif
  barrier();
  if (!has_tokens) return;
  const bool add = (args.flags & TS_MATVEC_ACCUMULATE) != 0u;
  [[unroll]] for (uint m = 0; m < MR; ++m) {
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      const uint e = lane + 32u * i, r = e % 16u, t = e / 16u;  // lanes 0..15: consecutive rows
      const uint row = row0 + 16u * m + r;
      if (row < args.rows && tok + t < args.n_tokens) {
        const uint yi = (tok + t) * args.y_stride + args.row_begin + row;
        const float v = c_sh[cb + 256u * m + r * 16u + t];
        y[yi] = add ? y[yi] + v : v;
      }
    }
  }
}
