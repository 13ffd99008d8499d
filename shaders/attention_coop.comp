#version 450
// D5 of the decode step on tensor cores (VK_NV_cooperative_matrix: 16 x 16 x 16 products of f16
// matrices summed in f32): the short range's split-K partials of attention_rows.comp (same
// arguments, chunking and partials layout, so the same merge), every head of a chunk in one
// workgroup. MLA's heads share one latent cache row, so a chunk's scores and outputs are two
// small matrix products instead of H * (2R + Dr) FMAs per row and head on the FMA units:
//   S = Q K^T   (Q: [H][R+Dr] f16, the scaled, roped query; K: the chunk's cache rows)
//   O = P V     (P = exp(S - M) per head, f16; V: the rows' first R values)
// with, per head h of chunk c, M = max_j S[h][j], l = sum_j P[h][j], o = O[h] (unnormalized):
// the partial attention_merge.comp folds.
//
// Two head tiles of 16: heads 0..15 and H-16..H-1 (they overlap when H < 32; tile 0 is stored
// last, so it owns the heads both hold). Needs 16 <= H <= 32, R <= 512, R and Dr multiples of 16.
// The chunk is taken 16 rows (a block) at a time, staged into shared memory with 16-byte loads
// (the tensor-core loads then read shared memory), twice: once for its maximum (the scores), once
// for P and O (the scores again: cheap on tensor cores), so that O needs no rescaling (its
// accumulators stay in registers for the whole chunk); a chunk of one block is staged and scored
// once. Rows past the context in a block are read (the cache holds kCachePadRows more, zeroed at
// creation: AttentionShape::cache_bytes) and weighted 0.
//
// Work split: workgroup x = chunk c (empty chunks exit at once), 8 subgroups. Scores: subgroup
// t < 2 takes head tile t; outputs: subgroup g the latent column tiles g, g + 8, g + 16, g + 24
// of both head tiles (coop matrices held in named variables: arrays of them may live in local
// memory). Shared memory: the query (H x (R+Dr) f16), the block's rows (f16), its scores (f32)
// and weights (f16), rows padded against bank conflicts. Every staging loop issues its loads
// before it stores (a loop of load-convert-store waits one round trip per iteration).
// Defines: N_HEAD (16..32), KV_LORA (R <= 512), N_ROT (Dr) + the rope.glsl table; TILE (the
// chunking's rounding); SUBGROUP_SIZE (32, full subgroups).
// Bindings: 0 = q (f32 [H][R+Dr], q_pe unroped), 1 = cache (f16 rows of R+Dr), 2 = step words,
// 3 = partials ([n_groups][H][R] o, then [n_groups][H] (m, l)). One query (the decode step).
// Arguments: AttnPartialArgs (attention_args.h). Wrapper: AttentionOp (AttentionTuning::short_coop).
#extension GL_GOOGLE_include_directive : require
#include "timeline.glsl"  // before main(): bench --timeline
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#include "attention_args.h"
#include "rope.glsl"

#if N_HEAD < 16 || N_HEAD > 32 || KV_LORA % 16 != 0 || KV_LORA > 512 || N_ROT % 16 != 0
#error "attention_coop.comp: needs 16..32 heads, R <= 512 and R, Dr multiples of 16"
#endif

const uint kRow = KV_LORA + N_ROT;  // values per cache row
const uint kK = kRow / 16;          // 16-value steps of a score product
const uint kCT = KV_LORA / 16;      // latent column tiles
const uint SB = 16;                 // rows per block
const uint NSG = 8;                 // subgroups
const uint WG = NSG * SUBGROUP_SIZE;
// Shared-memory row strides, padded so that a tile's 16 rows do not share banks.
const uint kQS = kRow + 8;  // halves: the query and the block's cache rows
const uint kSS = SB + 4;    // floats: scores
const uint kPS = SB + 8;    // halves: weights
const uint kRowV = kRow / 8;  // uvec4 per cache row
const float kNegHuge = -3.0e38;

layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly restrict buffer Query { vec4 q4[]; };
layout(std430, binding = 1) readonly restrict buffer Cache { uvec4 cache4[]; };
layout(std430, binding = 2) readonly restrict buffer Step { uint step_words[]; };
layout(std430, binding = 3) writeonly restrict buffer Partials { float partials[]; };
layout(push_constant) uniform Push { AttnPartialArgs args; };

#define F16TILE fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32TILE fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

shared float m_sh[N_HEAD], l_sh[N_HEAD];
shared float s_sh[N_HEAD * kSS];      // a block's scores, [head][row]
shared float16_t p_sh[N_HEAD * kPS];  // its weights exp(s - M), [head][row]
shared float16_t q_sh[N_HEAD * kQS];  // kq_scale * q, q_pe roped, [head][value]
shared uvec4 kv_sh[SB * kQS / 8];     // the block's cache rows, [row][value] as 8 halves a uvec4

// First head of head tile t (0 or 1: heads 0..15, then H-16..H-1).
uint tile_head(uint t) { return t == 0u ? 0u : uint(N_HEAD) - 16u; }

// The query, scaled and roped at pos, into q_sh as f16: four values per 16-byte load, every load
// issued before the first use.
const uint kQV = N_HEAD * kRow / 4;     // vec4 of the query
const uint kQPer = (kQV + WG - 1) / WG;  // per invocation
void stage_query(uint pos) {
  vec4 v[kQPer];
  [[unroll]] for (uint k = 0; k < kQPer; ++k) {
    const uint i = gl_LocalInvocationIndex + k * WG;
    if (i < kQV) v[k] = q4[i];
  }
  [[unroll]] for (uint k = 0; k < kQPer; ++k) {
    const uint i = gl_LocalInvocationIndex + k * WG;
    if (i < kQV) {
      const uint h = i / (kRow / 4u), d = 4u * (i % (kRow / 4u));
      vec4 w = v[k] * args.kq_scale;
      if (d >= KV_LORA) {
        w.xy = rope_rotate(w.xy, rope_cos_sin(pos, (d - KV_LORA) / 2u));
        w.zw = rope_rotate(w.zw, rope_cos_sin(pos, (d - KV_LORA) / 2u + 1u));
      }
      [[unroll]] for (uint c = 0; c < 4; ++c) q_sh[h * kQS + d + c] = float16_t(w[c]);
    }
  }
}

// Cache rows j0 .. j0 + SB - 1 into kv_sh (coalesced 16-byte loads, all issued first); the caller
// has passed a barrier since kv_sh was last read.
const uint kKV = (SB * kRowV + WG - 1) / WG;  // uvec4 per invocation
void stage_block(uint j0) {
  uvec4 w[kKV];
  [[unroll]] for (uint k = 0; k < kKV; ++k) {
    const uint i = gl_LocalInvocationIndex + k * WG;
    if (i < SB * kRowV) w[k] = cache4[j0 * kRowV + i];
  }
  [[unroll]] for (uint k = 0; k < kKV; ++k) {
    const uint i = gl_LocalInvocationIndex + k * WG;
    if (i < SB * kRowV) kv_sh[(i / kRowV) * (kQS / 8u) + i % kRowV] = w[k];
  }
}

// The block's scores into s_sh: subgroup t < 2 computes head tile t; tile 1 is stored first,
// then (after a barrier) tile 0, which owns the heads both hold. Needs kv_sh staged (a barrier).
void block_scores() {
  const uint g = gl_SubgroupID;
  F32TILE acc = F32TILE(0.0);
  if (g < 2u) {
    for (uint k = 0; k < kK; ++k) {
      F16TILE a, b;
      coopMatLoadNV(a, q_sh, tile_head(g) * kQS + k * 16u, kQS, false);
      coopMatLoadNV(b, kv_sh, k * 2u, kQS / 8u, true);  // column j = row j: uvec4 units (8 halves)
      acc = coopMatMulAddNV(a, b, acc);
    }
  }
  if (g == 1u) coopMatStoreNV(acc, s_sh, tile_head(1u) * kSS, kSS, false);
  barrier();
  if (g == 0u) coopMatStoreNV(acc, s_sh, 0u, kSS, false);
  barrier();
}

// Head h's weights exp(s - m_sh[h]) of the block (rows past `end` 0) into p_sh; their sum.
float block_weights(uint h, uint j0, uint end) {
  const uint lane = gl_SubgroupInvocationID;
  float p = 0.0;
  if (lane < SB) {
    const float16_t ph = float16_t(j0 + lane < end ? exp(s_sh[h * kSS + lane] - m_sh[h]) : 0.0);
    p_sh[h * kPS + lane] = ph;
    p = float(ph);
  }
  return subgroupAdd(p);
}

// O tiles (head tiles 0 and 1) of latent column tile n += the block's weights times its rows.
#define O_BLOCK(n, o0, o1)                                              \
  if ((n) < kCT) {                                                      \
    F16TILE v, p0, p1;                                                  \
    coopMatLoadNV(v, kv_sh, (n) * 2u, kQS / 8u, false);                 \
    coopMatLoadNV(p0, p_sh, 0u, kPS, false);                            \
    coopMatLoadNV(p1, p_sh, tile_head(1u) * kPS, kPS, false);           \
    o0 = coopMatMulAddNV(p0, v, o0);                                    \
    o1 = coopMatMulAddNV(p1, v, o1);                                    \
  }
// Its store into the partials: tile 1 first, then (after a barrier, outside) tile 0.
#define O_STORE(n, o, t) \
  if ((n) < kCT) coopMatStoreNV(o, partials, p_base + tile_head(t) * KV_LORA + (n) * 16u, KV_LORA, false)

void main() {
  const uint chunk = gl_WorkGroupID.x, g = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint pos = step_words[args.pos_word];
  const uint kv_len = min(pos + 1u, args.n_ctx);
  if (kv_len < args.kv_min || (args.kv_max != 0u && kv_len > args.kv_max)) return;  // uniform
  const uint len = ts_attn_chunk_len(kv_len, args.n_groups, args.min_chunk, TILE);
  const uint begin = chunk * len;
  if (begin >= kv_len) return;  // uniform
  const uint end = min(begin + len, kv_len);
  stage_query(pos);
  stage_block(begin);
  for (uint h = gl_LocalInvocationIndex; h < N_HEAD; h += WG) {
    m_sh[h] = kNegHuge;
    l_sh[h] = 0.0;
  }
  barrier();
  TS_MARK_EARLY();  // bench --timeline: the query and the first block staged

  // Pass 1: every head's maximum over the chunk (head h's by subgroup h % NSG). A chunk of one
  // block keeps its scores and rows for pass 2.
  const bool one_block = end - begin <= SB;
  for (uint j0 = begin; j0 < end; j0 += SB) {
    if (j0 != begin) {
      stage_block(j0);
      barrier();
    }
    block_scores();
    for (uint h = g; h < N_HEAD; h += NSG) {
      const float mx = subgroupMax(lane < SB && j0 + lane < end ? s_sh[h * kSS + lane] : kNegHuge);
      if (subgroupElect()) m_sh[h] = max(m_sh[h], mx);
    }
    barrier();
  }
  TS_MARK();  // bench --timeline: pass 1 done

  // Pass 2: the weights (summed by the subgroup that writes them) and O, latent column tiles
  // g, g + 8, g + 16, g + 24 of both head tiles per subgroup, in registers for the whole chunk.
  F32TILE o00 = F32TILE(0.0), o01 = F32TILE(0.0), o10 = F32TILE(0.0), o11 = F32TILE(0.0);
  F32TILE o20 = F32TILE(0.0), o21 = F32TILE(0.0), o30 = F32TILE(0.0), o31 = F32TILE(0.0);
  for (uint j0 = begin; j0 < end; j0 += SB) {
    if (!one_block) {
      stage_block(j0);
      barrier();
      block_scores();
    }
    for (uint h = g; h < N_HEAD; h += NSG) {
      const float ls = block_weights(h, j0, end);
      if (subgroupElect()) l_sh[h] += ls;
    }
    barrier();
    O_BLOCK(g, o00, o01);
    O_BLOCK(g + 8u, o10, o11);
    O_BLOCK(g + 16u, o20, o21);
    O_BLOCK(g + 24u, o30, o31);
    barrier();  // kv_sh, p_sh and s_sh are rewritten by the next block
  }

  // The partial: o per head (tile 1, a barrier, tile 0: the owner of the heads both hold last),
  // then (M, l).
  const uint p_base = chunk * N_HEAD * KV_LORA;
  O_STORE(g, o01, 1u);
  O_STORE(g + 8u, o11, 1u);
  O_STORE(g + 16u, o21, 1u);
  O_STORE(g + 24u, o31, 1u);
  memoryBarrierBuffer();
  barrier();
  O_STORE(g, o00, 0u);
  O_STORE(g + 8u, o10, 0u);
  O_STORE(g + 16u, o20, 0u);
  O_STORE(g + 24u, o30, 0u);
  for (uint h = gl_LocalInvocationIndex; h < N_HEAD; h += WG) {
    const uint ml = args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + h) * 2u;
    partials[ml] = m_sh[h];
    partials[ml + 1u] = l_sh[h];
  }
}
