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
// The tiles, their staging helpers and products: matmul_tile.glsl (shared with moe_matmul.comp).
// COOP 0 is the same kernel with the products as plain FMAs: the path the tests run on devices
// without cooperative matrices, and the proof of everything but the 16 x 16 x 16 product itself.
// REDUCE 1 is the split-K sum: invocation i < rows * n_tokens adds the n_splits partial sums of
// row i % rows, token i / rows, in order, into y (+ y with TS_MATVEC_ACCUMULATE).
//
// Defines: WTYPE (a SPLIT1 block type or F32 / F16 / BF16), MR (1, 2 or 4), TG (groups: 1, 2 or 4),
// KT (a multiple of 32; for K-quants, whose units interleave inside a block, of the span a unit's
// values cover: 64 for Q4_K / Q5_K, 128 for Q6_K), COOP;
// PREFETCH_B (0/1; KT <= 128), PREFETCH_W (0/1, SPLIT1 types: the next step's W words loaded
// (split1_raw) before this step's products, decoded and staged after them), W_AHEAD (1, or 2 with
// PREFETCH_W: the W words loaded two steps ahead, in two register sets), ACC_DONT_UNROLL
// (matmul_tile.glsl); or REDUCE 1 (and WG_SIZE).
// Bindings: 0 = W region Q (plain: the rows), 1 = W region M, 2 = x16 (f16), 3 = y (f32),
// 4 = partial sums (f32), 5 = the words holding the live token count (TS_MATMUL_LIVE_COUNT).

#ifndef REDUCE
#define REDUCE 0
#endif

#if REDUCE
#include "common.glsl"
layout(local_size_x = WG_SIZE) in;
layout(std430, binding = 3) restrict buffer YBuf { float y[]; };
layout(std430, binding = 4) readonly restrict buffer Part { float part[]; };
layout(std430, binding = 5) readonly restrict buffer StepBuf { uint step_words[]; };
layout(push_constant) uniform Push { MatmulArgs args; };

void main() {
  const uint i = linear_workgroup_id() * uint(WG_SIZE) + gl_LocalInvocationIndex;
  const uint n_live = (args.flags & TS_MATMUL_LIVE_COUNT) != 0u ? min(args.n_tokens, step_words[args.count_word]) : args.n_tokens;
  if (i >= args.rows * n_live) return;
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

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 2) readonly restrict buffer X16 { uvec4 x16v[]; };  // 8 f16 per element
layout(std430, binding = 3) restrict buffer YBuf { float y[]; };
layout(std430, binding = 4) writeonly restrict buffer Part { float part[]; };
layout(std430, binding = 5) readonly restrict buffer StepBuf { uint step_words[]; };
layout(push_constant) uniform Push { MatmulArgs args; };

#include "matmul_tile.glsl"

// The tokens this run computes: n_tokens, or with TS_MATMUL_LIVE_COUNT the live count of the
// chunk (a recording for T tokens serves shorter chunks: workgroups past it exit at once).
uint n_tok;

#ifndef PREFETCH_B
#define PREFETCH_B 0
#endif
#ifndef PREFETCH_W
#define PREFETCH_W 0
#endif
#if PREFETCH_W && W_PLAIN
#error "matmul.comp: PREFETCH_W reads SPLIT1 blocks"
#endif

// Unit u (0 .. BM * UNITS_PER_ROW) of the step at column k0 (columns below k_end) into sh: 32
// values of row u / UNITS_PER_ROW (zeros past the bound rows).
void stage_unit(uint u, uint row0, uint k0, uint k_end) {
  const uint r = u / uint(UNITS_PER_ROW), ju = u % uint(UNITS_PER_ROW);
  if (k0 + 32u * ju >= k_end) return;
  if (row0 + r >= args.rows) {
    stage_zero_unit(r, ju);
    return;
  }
#if W_PLAIN
  stage_plain_unit(r, ju, (row0 + r) * args.cols + k0 + 32u * ju);
#else
  stage_block_unit(r, ju, 0u, 0u, row0 + r, args.cols, k0);
#endif
}

// The workgroup's tokens' columns k0 .. min(k0 + KT, k_end) into sh, 8 values per copy: the token
// rows that exist in x16 (n_tokens rounded up to 16).
void stage_tokens(uint tok0, uint k0, uint k_end) {
  const uint n8 = min(uint(KT), k_end - k0) / 8u;  // uvec4 per token row this step
  const uint nt = min(uint(TG * 16), (n_tok + 15u) / 16u * 16u - tok0);
  for (uint c = gl_LocalInvocationIndex; c < nt * n8; c += uint(WG_SIZE)) {
    const uint t = c / n8, j = c % n8;
    sh[B0 + t * uint(RS) + j] = x16v[(args.x_offset + (tok0 + t) * args.x_stride + k0) / 8u + j];
  }
}

#ifndef W_AHEAD
#define W_AHEAD 1
#endif
#if W_AHEAD != 1 && (W_AHEAD != 2 || !PREFETCH_W)
#error "matmul.comp: W_AHEAD is 1, or 2 with PREFETCH_W"
#endif

#if PREFETCH_W
// PREFETCH_W: each invocation's units u = lid + WG_SIZE i of a later step, as loaded: W_AHEAD
// sets, set s holding the steps s, s + W_AHEAD, ... of the workgroup's K range (with 2, each
// load has two steps' products to arrive in). Sets are named by constants (the unrolled set loop).
#define N_WU ((BM * UNITS_PER_ROW + WG_SIZE - 1) / WG_SIZE)
W1Raw wq[W_AHEAD][N_WU];
void load_w(uint set, uint row0, uint k0, uint k_end) {
  [[unroll]] for (uint i = 0; i < uint(N_WU); ++i) {
    const uint u = gl_LocalInvocationIndex + i * uint(WG_SIZE), r = u / uint(UNITS_PER_ROW), k = k0 + 32u * (u % uint(UNITS_PER_ROW));
    if (u < uint(BM * UNITS_PER_ROW) && k < k_end && row0 + r < args.rows) wq[set][i] = load_raw_unit(0u, 0u, row0 + r, args.cols, k);
  }
}
// stage_unit for the units load_w loaded into `set` for the step at k0.
void store_w(uint set, uint row0, uint k0, uint k_end) {
  [[unroll]] for (uint i = 0; i < uint(N_WU); ++i) {
    const uint u = gl_LocalInvocationIndex + i * uint(WG_SIZE), r = u / uint(UNITS_PER_ROW), ju = u % uint(UNITS_PER_ROW);
    if (u >= uint(BM * UNITS_PER_ROW) || k0 + 32u * ju >= k_end) continue;
    if (row0 + r >= args.rows) {
      stage_zero_unit(r, ju);
      continue;
    }
    stage_raw_unit(r, ju, k0, row0 + r, args.cols, wq[set][i]);
  }
}
#endif

#if PREFETCH_B
// PREFETCH_B: the next step's token values are loaded into registers (KT / 16 uvec4 per
// invocation) before the products of this step, and stored into sh after them: their L2 latency
// overlaps the tensor-core work instead of preceding it.
uvec4 bq[KT / 16];
void load_tokens(uint tok0, uint k0, uint k_end) {
  const uint n8 = min(uint(KT), k_end - k0) / 8u;
  const uint nt = min(uint(TG * 16), (n_tok + 15u) / 16u * 16u - tok0);
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

void main() {
  n_tok = (args.flags & TS_MATMUL_LIVE_COUNT) != 0u ? min(args.n_tokens, step_words[args.count_word]) : args.n_tokens;
  const uint row0 = gl_WorkGroupID.x * uint(BM);
  const uint tok0 = gl_WorkGroupID.y * uint(TG) * 16u;  // the workgroup's first token
  if (row0 >= args.rows || tok0 >= n_tok) return;        // uniform per workgroup
  const uint lid = gl_LocalInvocationIndex, grp = lid / 32u, lane = lid % 32u;
  const uint tok = tok0 + 16u * grp;                     // the group's first token
  const bool has_tokens = tok < n_tok;                   // uniform per group
  const uint k_begin = gl_WorkGroupID.z * args.k_split;
  const uint k_end = min(args.cols, k_begin + args.k_split);

  MATMUL_ACC(acc);
  acc_zero(acc);
#if PREFETCH_B
  load_tokens(tok0, k_begin, k_end);
#endif
#if PREFETCH_W
  load_w(0u, row0, k_begin, k_end);
#if W_AHEAD == 2
  load_w(1u, row0, k_begin + uint(KT), k_end);
#endif
#endif
  for (uint k1 = k_begin; k1 < k_end; k1 += uint(W_AHEAD * KT)) {  // uniform
    // Step k0 takes W from set `set` (a constant once unrolled).
    [[unroll]] for (uint set = 0u; set < uint(W_AHEAD); ++set) {
      const uint k0 = k1 + set * uint(KT);
      if (W_AHEAD > 1 && k0 >= k_end) break;
#if PREFETCH_W
      store_w(set, row0, k0, k_end);
#else
      [[unroll]] for (uint u = lid; u < uint(BM * UNITS_PER_ROW); u += uint(WG_SIZE)) stage_unit(u, row0, k0, k_end);
#endif
#if PREFETCH_B
      store_tokens();
#else
      stage_tokens(tok0, k0, k_end);
#endif
      barrier();
      // The loads ahead, in flight during this step's products: the next step's tokens, and W of
      // the step W_AHEAD steps on into the same set.
#if PREFETCH_B
      if (k0 + uint(KT) < k_end) load_tokens(tok0, k0 + uint(KT), k_end);
#endif
#if PREFETCH_W
      if (k0 + uint(W_AHEAD * KT) < k_end) load_w(set, row0, k0 + uint(W_AHEAD * KT), k_end);
#endif
      if (has_tokens) acc_step(min(uint(KT), k_end - k0) / 16u, grp, lane, acc);
      barrier();
    }
  }

  // Epilogue: the group's tiles through sh, then out.
  acc_store(grp, lane, acc);
  barrier();
  if (!has_tokens) return;
  const bool split = args.n_splits > 1u;
  const bool add = (args.flags & TS_MATVEC_ACCUMULATE) != 0u;
  [[unroll]] for (uint m = 0; m < MR; ++m) {
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      const uint e = lane + 32u * i, r = e % 16u, t = e / 16u;  // lanes 0..15: consecutive rows
      const uint row = row0 + 16u * m + r;
      if (row < args.rows && tok + t < n_tok) {
        const float v = acc_value(grp, m, r, t);
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
