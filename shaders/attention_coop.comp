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
// A head tile is 16 heads: heads 0..15, 16..31, ..., the last one ending at head H - 1 (it
// overlaps the one before when 16 does not divide H; every head is computed the same way in
// each, and the tile that owns it is stored last). Needs H >= 16, R and Dr multiples of 16.
// The chunk is taken SB rows at a time, twice: once for its maximum (the scores), once for P and
// O (the scores again: cheap on tensor cores), so that O needs no rescaling (its accumulators stay
// in registers for the whole chunk). Rows past the context in a block are read (the cache holds a
// whole number of blocks, zeroed at creation: AttentionShape::cache_bytes) and weighted 0.
//
// Work split: workgroup x = chunk c (empty chunks exit at once), NSG subgroups. Scores: subgroup
// g takes score tile g (head tile g % HT, rows 16 (g / HT) .. of the block); outputs: subgroup g
// the latent column tiles n = g, g + NSG, ... of every head tile. Shared memory: the query (H x
// (R+Dr) f16), a block's scores (f32) and weights (f16).
// Defines: N_HEAD, KV_LORA (R), N_ROT (Dr) + the rope.glsl table; TILE (the chunking's
// rounding); NSG (subgroups, = HT * SB / 16); SB (rows per block, a multiple of 16);
// SUBGROUP_SIZE (full subgroups).
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

#if N_HEAD < 16 || KV_LORA % 16 != 0 || N_ROT % 16 != 0 || SB % 16 != 0
#error "attention_coop.comp: needs at least 16 heads and R, Dr, SB multiples of 16"
#endif

const uint kRow = KV_LORA + N_ROT;     // values per cache row
const uint kHT = (N_HEAD + 15) / 16;   // head tiles
const uint kRT = SB / 16;              // row tiles of a block
const uint kCT = KV_LORA / 16;         // latent column tiles
const uint kK = kRow / 16;             // 16-value steps of a score product
const uint kKB = 12;                   // K tiles loaded per round
const float kNegHuge = -3.0e38;
#if NSG != (N_HEAD + 15) / 16 * (SB / 16)
#error "attention_coop.comp: NSG must be the score tiles of a block (head tiles x SB / 16)"
#endif

layout(local_size_x = NSG * SUBGROUP_SIZE) in;

layout(std430, binding = 0) readonly restrict buffer Query { float q[]; };
layout(std430, binding = 1) readonly restrict buffer Cache { float16_t cache[]; };
layout(std430, binding = 2) readonly restrict buffer Step { uint step_words[]; };
layout(std430, binding = 3) writeonly restrict buffer Partials { float partials[]; };
layout(push_constant) uniform Push { AttnPartialArgs args; };

#define F16TILE fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32TILE fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

shared float16_t q_sh[N_HEAD * kRow];  // kq_scale * q, q_pe roped, [head][value]
shared float s_sh[N_HEAD * SB];        // a block's scores, [head][row]
shared float16_t p_sh[N_HEAD * SB];    // its weights exp(s - M), [head][row]
shared float m_sh[N_HEAD], l_sh[N_HEAD];

// First head of head tile t.
uint tile_head(uint t) { return min(t * 16u, uint(N_HEAD) - 16u); }

// The query, scaled and roped at pos, into q_sh as f16 (pairs of values per invocation).
void stage_query(uint pos) {
  for (uint i = gl_LocalInvocationIndex; i < N_HEAD * kRow / 2u; i += NSG * SUBGROUP_SIZE) {
    const uint h = i / (kRow / 2u), d = 2u * (i % (kRow / 2u));
    vec2 v = vec2(q[h * kRow + d], q[h * kRow + d + 1u]) * args.kq_scale;
    if (d >= KV_LORA) v = rope_rotate(v, rope_cos_sin(pos, (d - KV_LORA) / 2u));
    q_sh[h * kRow + d] = float16_t(v.x);
    q_sh[h * kRow + d + 1u] = float16_t(v.y);
  }
}

// The scores of rows j0 .. j0 + SB - 1 into s_sh (this subgroup's tile; the tile that owns the
// overlapping heads stored last, by the same subgroup for the same rows).
void block_scores(uint j0) {
  const uint g = gl_SubgroupID, t = g % kHT, rt = g / kHT;
  const uint b0 = (j0 + rt * 16u) * kRow;  // column j of a K tile = cache row j0 + 16 rt + j
  F32TILE acc = F32TILE(0.0);
  // kKB tiles of K loaded before their products: one round trip per kKB steps, not per step.
  [[dont_unroll]] for (uint k0 = 0; k0 < kK; k0 += kKB) {
    F16TILE b[kKB];
    [[unroll]] for (uint i = 0; i < kKB; ++i)
      if (k0 + i < kK) coopMatLoadNV(b[i], cache, b0 + (k0 + i) * 16u, kRow, true);
    [[unroll]] for (uint i = 0; i < kKB; ++i) {
      if (k0 + i < kK) {
        F16TILE a;
        coopMatLoadNV(a, q_sh, tile_head(t) * kRow + (k0 + i) * 16u, kRow, false);
        acc = coopMatMulAddNV(a, b[i], acc);
      }
    }
  }
  // Head tiles in reverse order of ownership: tile t's rows below the next tile's start are its own.
  [[unroll]] for (uint u = kHT; u-- > 0u;) {
    if (u == t) coopMatStoreNV(acc, s_sh, tile_head(t) * SB + rt * 16u, SB, false);
    barrier();
  }
}

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
  for (uint h = gl_LocalInvocationIndex; h < N_HEAD; h += NSG * SUBGROUP_SIZE) {
    m_sh[h] = kNegHuge;
    l_sh[h] = 0.0;
  }
  barrier();
  TS_MARK_EARLY();  // bench --timeline: the query staged

  // Pass 1: every head's maximum over the chunk.
  for (uint j0 = begin; j0 < end; j0 += SB) {
    block_scores(j0);
    for (uint h = g; h < N_HEAD; h += NSG) {
      float mx = kNegHuge;
      for (uint j = lane; j < SB; j += SUBGROUP_SIZE) mx = j0 + j < end ? max(mx, s_sh[h * SB + j]) : mx;
      mx = subgroupMax(mx);
      if (subgroupElect()) m_sh[h] = max(m_sh[h], mx);
    }
    barrier();
  }

  // Pass 2: the weights and O; each head's weights summed by the subgroup that writes them.
  F32TILE o[kHT][(kCT + NSG - 1) / NSG];
  [[unroll]] for (uint t = 0; t < kHT; ++t)
    [[unroll]] for (uint i = 0; i < (kCT + NSG - 1) / NSG; ++i) o[t][i] = F32TILE(0.0);
  for (uint j0 = begin; j0 < end; j0 += SB) {
    block_scores(j0);
    for (uint h = g; h < N_HEAD; h += NSG) {
      const float mh = m_sh[h];
      float ls = 0.0;
      for (uint j = lane; j < SB; j += SUBGROUP_SIZE) {
        const float16_t p = float16_t(j0 + j < end ? exp(s_sh[h * SB + j] - mh) : 0.0);
        p_sh[h * SB + j] = p;
        ls += float(p);
      }
      ls = subgroupAdd(ls);
      if (subgroupElect()) l_sh[h] += ls;
    }
    barrier();
    [[unroll]] for (uint i = 0; i < (kCT + NSG - 1) / NSG; ++i) {
      const uint n = g + i * NSG;
      if (n < kCT) {  // uniform per subgroup
        [[unroll]] for (uint k = 0; k < kRT; ++k) {
          F16TILE v;
          coopMatLoadNV(v, cache, (j0 + k * 16u) * kRow + n * 16u, kRow, false);  // rows of the block, latent columns
          [[unroll]] for (uint t = 0; t < kHT; ++t) {
            F16TILE p;
            coopMatLoadNV(p, p_sh, tile_head(t) * SB + k * 16u, SB, false);
            o[t][i] = coopMatMulAddNV(p, v, o[t][i]);
          }
        }
      }
    }
    barrier();  // p_sh and s_sh are rewritten by the next block
  }

  // The partial: o per head (head tiles in reverse order, a barrier between: the tile that owns
  // overlapping heads stored last), then (M, l).
  const uint p_base = chunk * N_HEAD * KV_LORA;
  [[unroll]] for (uint u = kHT; u-- > 0u;) {
    [[unroll]] for (uint i = 0; i < (kCT + NSG - 1) / NSG; ++i) {
      const uint n = g + i * NSG;
      if (n < kCT) coopMatStoreNV(o[u][i], partials, p_base + tile_head(u) * KV_LORA + n * 16u, KV_LORA, false);
    }
    if (u > 0u) {
      memoryBarrierBuffer();
      barrier();
    }
  }
  for (uint h = gl_LocalInvocationIndex; h < N_HEAD; h += NSG * SUBGROUP_SIZE) {
    const uint ml = args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + h) * 2u;
    partials[ml] = m_sh[h];
    partials[ml + 1u] = l_sh[h];
  }
}
