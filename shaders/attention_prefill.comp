#version 450
// D3 of the prefill chunk (docs/PREFILL.md): split-K absorbed MLA attention of a GROUP of GQ
// consecutive queries over one layer's latent cache, each staged cache tile used by all of them.
// Same math and same partials as attention_partial.comp (query t at position pos_t = p0 + t sees
// rows [0, kv_len_t), kv_len_t = min(pos_t + 1, n_ctx)):
//   s_{t,h}(j) = kq_scale * (q_lat_{t,h} . c_j + rope(q_pe_{t,h}, pos_t) . kpe_j),   j < kv_len_t
// and per chunk, per (query, head): m, l, o (R floats); attention_merge.comp (QueryBatch form,
// unchanged) combines the chunks of each query.
//
// Work split: workgroup (x = chunk c, y = head group, z = query group) handles PAIRS
// (query, head) = GQ queries x HW heads (pair p = query_in_group * HW + head_in_group). The
// pairs play the role the heads play in attention_partial.comp (same score / value thread
// layout, same register tiling); only the query vector, the rope position and the causal bound
// differ per pair. Every cached row a workgroup stages is therefore read from memory once per
// (query group, head group) instead of once per query: cache reads drop by GQ * HW / N_HEAD.
//
// Why heads and not latent columns are split across workgroups: a workgroup must hold
// GQ x heads x R f32 accumulators (GQ = 16, all 20 GLM heads, R = 512: 640 KB, far beyond a
// workgroup's registers). Splitting the R columns into S slices or the heads into groups both
// cut the accumulators by the same factor and both multiply the cache reads by it (a column
// slice still reads the full R + Dr row for its scores), but column slices recompute every score
// S times (H (R + Dr) FMAs per row and query, more than the H R of the values), heads cost
// nothing extra. Accumulators: 16 vec4 per value thread (OH <= 16 pairs x 4 columns = 64
// floats), R / 4 column quads: 32 pairs -> 128 x 2 = 256 value threads (the default, like the
// decode kernel's 20-32 heads), 64 pairs -> 512 (more registers per workgroup, opt-in).
// The cache reduction per query is PAIRS / N_HEAD, not GQ: GLM (H = 20) at 32 pairs: GQ = 8,
// HW = 4 (5 head groups), cache read 5 times per 8 queries (1.6x less); at 64 pairs GQ = 16,
// 5 times per 16 queries (3.2x less). Arithmetic is unchanged (each score computed once).
//
// Chunking: the chunk length comes from the group's LAST live query (ts_attn_chunk_len with
// CHUNK_TILE, the merge's TILE) and is >= every other query's own chunk length (the rule is
// monotone in kv_len), so query t's rows lie in chunks c < ceil(kv_len_t / len) <= the merge's
// chunk count for t. Query t writes the partials of every chunk c < ts_attn_num_chunks(kv_len_t)
// (the ones the merge reads): chunks holding none of its rows write m = -huge, l = 0, o = 0.
// Rows past a query's position get no weight (score masked, p = 0); padding queries (t >= the
// live count) and padding pairs write nothing. Query t's q at float t*N_HEAD*(R+Dr), partials
// at float t*n_groups*N_HEAD*(R+2) (AttnPartialArgs layout).
//
// Defines: N_HEAD, KV_LORA (R), N_ROT (Dr) + the rope.glsl table; WG (threads, multiple of 32),
// TILE (rows staged per step, even, divides CHUNK_TILE), CHUNK_TILE (attention_merge's TILE),
// GQ (queries per group), HW (heads per group), GQ*HW <= 64 pairs, SV (vec4 per score slice),
// OH (pairs per value thread, multiple of 4). The host sizes WG >= NS * ceil(P/4),
// WG >= (R/4) * ceil(P/OH), WG >= P (P = GQ*HW).
#extension GL_GOOGLE_include_directive : require
#include "timeline.glsl"  // before main(): bench --timeline
#extension GL_EXT_control_flow_attributes : require
#include "attention_args.h"
#include "rope.glsl"

layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly restrict buffer Query { vec4 q4[]; };       // [T][N_HEAD][R+Dr] f32
layout(std430, binding = 1) readonly restrict buffer Cache { uvec4 cache4[]; };  // n_ctx x (R+Dr) f16
layout(std430, binding = 2) readonly restrict buffer Step { uint step_words[]; };
// per query: [n_groups][N_HEAD][R] floats o, then [n_groups][N_HEAD] pairs (m, l)
layout(std430, binding = 3) writeonly restrict buffer Partials { float partials[]; };

layout(push_constant) uniform Push { AttnPartialArgs args; };

const uint kPairs = GQ * HW;
const uint kRow = KV_LORA + N_ROT;
const uint kRowQ = kRow / 8;                   // uvec4 (8 halves) per cache row
const uint kRowV = kRow / 4;                   // vec4 per staged f32 row
const uint kLatV = KV_LORA / 4;
const uint kNS = (kRowV + SV - 1) / SV;        // score slices
const uint kSItems = kNS * ((kPairs + 3) / 4); // score threads
const uint kPP = (kPairs + 3) / 4 * 4;         // pairs per score row, padded to vec4
const uint kOQ = KV_LORA / 4;                  // latent column quads
const uint kOItems = kOQ * ((kPairs + OH - 1) / OH);  // value threads
const uint kLoads = (TILE * kRowQ + WG - 1) / WG;
const float kNegHuge = -3.0e38;

shared vec4 tile[TILE * kRowV];
shared vec4 scores4[kNS * TILE * kPP / 4 + OH / 4];  // [slice][row][pair]; slice 0: s, then p
shared float m_tile[kPP];
shared float alpha[kPP];

float score_at(uint idx) { return scores4[idx / 4][idx % 4]; }
void set_score(uint idx, float v) { scores4[idx / 4][idx % 4] = v; }

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint chunk = gl_WorkGroupID.x;
  const uint head0 = gl_WorkGroupID.y * HW;
  const uint n_heads = min(uint(HW), uint(N_HEAD) - head0);
  const uint t0q = gl_WorkGroupID.z * GQ;  // first query of the group
  const uint n_q = step_words[args.count_word];
  if (t0q >= n_q) return;  // uniform: padding group
  const uint n_live = min(uint(GQ), n_q - t0q);
  const uint p0 = step_words[args.pos_word];
  // Chunking of the group (from its last live query) and the chunks any of its queries merges.
  const uint kv_last = min(p0 + t0q + n_live, args.n_ctx);
  const uint chunk_len = ts_attn_chunk_len(kv_last, args.n_groups, args.min_chunk, CHUNK_TILE);
  uint max_chunks = 0;
  for (uint i = 0; i < n_live; ++i)
    max_chunks = max(max_chunks, ts_attn_num_chunks(min(p0 + t0q + i + 1, args.n_ctx), args.n_groups, args.min_chunk, CHUNK_TILE));
  if (chunk >= max_chunks) return;  // uniform
  const uint begin = min(chunk * chunk_len, kv_last);
  const uint end = min(kv_last, begin + chunk_len);  // may equal begin: empty partials only

  // Pair p = (query PAIR_Q, head PAIR_H); its causal bound PAIR_KV (rows < kv_len of its query;
  // padding pairs see no row), recomputed where needed instead of held per thread.
#define PAIR_Q(p) ((p) / HW)
#define PAIR_H(p) ((p) % HW)
#define PAIR_LIVE(p) ((p) < kPairs && PAIR_Q(p) < n_live && PAIR_H(p) < n_heads)
#define PAIR_KV(p) (PAIR_LIVE(p) ? min(p0 + t0q + PAIR_Q(p) + 1, args.n_ctx) : 0u)

  uvec4 fetched[kLoads];
  [[unroll]] for (uint i = 0; i < kLoads; ++i) {
    const uint e = tid + i * WG;
    if (e < min(uint(TILE), end - begin) * kRowQ) fetched[i] = cache4[begin * kRowQ + e];
  }

  // Score role: slice s, pair quad g; query values in registers (padding pairs load a live one).
  const bool s_active = tid < kSItems;
  const uint s_slice = tid % kNS, s_quad = min(tid / kNS, (kPairs + 3) / 4 - 1);
  vec4 qreg[4][SV];
  [[unroll]] for (uint a = 0; a < 4; ++a) {
    const uint p = s_quad * 4 + a;
    const uint qi = min(PAIR_Q(p), n_live - 1), h = head0 + min(PAIR_H(p), n_heads - 1);
    const uint pos = p0 + t0q + qi;
    const uint q_base = ((t0q + qi) * N_HEAD + h) * kRowV;
    [[unroll]] for (uint i = 0; i < SV; ++i) {
      const uint v = min(s_slice + i * kNS, kRowV - 1);
      vec4 qv = q4[q_base + v];
      if (v >= kLatV) {
        const uint k = (4 * v - KV_LORA) / 2;
        qv.xy = rope_rotate(qv.xy, rope_cos_sin(pos, k));
        qv.zw = rope_rotate(qv.zw, rope_cos_sin(pos, k + 1));
      }
      qreg[a][i] = qv;
    }
  }

  const bool o_active = tid < kOItems;
  const uint o_quad = tid % kOQ, o_pair0 = (tid / kOQ) * OH;
  vec4 acc[OH];
  [[unroll]] for (uint a = 0; a < OH; ++a) acc[a] = vec4(0.0);
  float m_run = kNegHuge, l_run = 0.0;  // meaningful in thread tid == pair < kPairs

  for (uint r0 = begin; r0 < end; r0 += TILE) {
    const uint n_valid = min(uint(TILE), end - r0);
    barrier();
    [[unroll]] for (uint i = 0; i < kLoads; ++i) {
      const uint e = tid + i * WG;
      if (e < n_valid * kRowQ) {
        const uint r = e / kRowQ, u = e % kRowQ;
        const uvec4 w = fetched[i];
        tile[r * kRowV + 2 * u] = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
        tile[r * kRowV + 2 * u + 1] = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
      }
    }
    barrier();
    const uint r1 = r0 + TILE;
    if (r1 < end) {
      [[unroll]] for (uint i = 0; i < kLoads; ++i) {
        const uint e = tid + i * WG;
        if (e < min(uint(TILE), end - r1) * kRowQ) fetched[i] = cache4[r1 * kRowQ + e];
      }
    }

    if (s_active) {
      for (uint j = 0; j < n_valid; j += 2) {
        vec4 d0 = vec4(0.0), d1 = vec4(0.0);
        [[unroll]] for (uint i = 0; i < SV; ++i) {
          const uint v = s_slice + i * kNS;
          if (v < kRowV) {
            const vec4 k0 = tile[j * kRowV + v], k1 = tile[(j + 1) * kRowV + v];
            [[unroll]] for (uint a = 0; a < 4; ++a) {
              d0[a] += dot(qreg[a][i], k0);
              d1[a] += dot(qreg[a][i], k1);
            }
          }
        }
        scores4[((s_slice * TILE + j) * kPP) / 4 + s_quad] = d0;
        scores4[((s_slice * TILE + j + 1) * kPP) / 4 + s_quad] = d1;
      }
    }
    barrier();

    // Slice sums into slice 0; rows past the pair's query (or the chunk) and padding pairs: kNegHuge.
    for (uint i = tid; i < TILE * kPP; i += WG) {
      const uint j = i / kPP, p = i % kPP;
      float s = kNegHuge;
      if (j < n_valid && r0 + j < PAIR_KV(p)) {
        s = 0.0;
        for (uint sl = 0; sl < kNS; ++sl) s += score_at((sl * TILE + j) * kPP + p);
        s *= args.kq_scale;
      }
      set_score(i, s);
    }
    barrier();

    if (tid < kPairs) {
      float mx = kNegHuge;
      for (uint j = 0; j < n_valid; ++j) mx = max(mx, score_at(j * kPP + tid));
      const float m_new = max(m_run, mx);
      alpha[tid] = exp(m_run - m_new);
      m_tile[tid] = m_new;
      m_run = m_new;
    }
    barrier();
    for (uint i = tid; i < TILE * kPP; i += WG) {
      const uint j = i / kPP, p = i % kPP;
      set_score(i, (j < n_valid && r0 + j < PAIR_KV(p)) ? exp(score_at(i) - m_tile[p]) : 0.0);
    }
    barrier();

    if (tid < kPairs) {
      float sum = 0.0;
      for (uint j = 0; j < n_valid; ++j) sum += score_at(j * kPP + tid);
      l_run = l_run * alpha[tid] + sum;
    }
    if (o_active) {
      [[unroll]] for (uint a = 0; a < OH; ++a) acc[a] *= alpha[min(o_pair0 + a, kPP - 1)];
      for (uint j = 0; j < n_valid; ++j) {
        const vec4 v = tile[j * kRowV + o_quad];
        [[unroll]] for (uint a4 = 0; a4 < OH / 4; ++a4) {
          const vec4 p = scores4[(j * kPP + o_pair0) / 4 + a4];
          [[unroll]] for (uint c = 0; c < 4; ++c) acc[a4 * 4 + c] += p[c] * v;
        }
      }
    }
  }

  // Partials of this chunk for the queries that merge it: o, then (m, l).
  const uint R2 = KV_LORA + 2u;
  if (o_active) {
    [[unroll]] for (uint a = 0; a < OH; ++a) {
      const uint p = o_pair0 + a;
      if (PAIR_LIVE(p) && chunk < ts_attn_num_chunks(PAIR_KV(p), args.n_groups, args.min_chunk, CHUNK_TILE)) {
        const uint t = t0q + PAIR_Q(p), h = head0 + PAIR_H(p);
        const uint o = t * args.n_groups * N_HEAD * R2 + (chunk * N_HEAD + h) * KV_LORA + 4 * o_quad;
        partials[o] = acc[a].x;
        partials[o + 1] = acc[a].y;
        partials[o + 2] = acc[a].z;
        partials[o + 3] = acc[a].w;
      }
    }
  }
  if (PAIR_LIVE(tid) && chunk < ts_attn_num_chunks(PAIR_KV(tid), args.n_groups, args.min_chunk, CHUNK_TILE)) {
    const uint t = t0q + PAIR_Q(tid), h = head0 + PAIR_H(tid);
    const uint ml = t * args.n_groups * N_HEAD * R2 + args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + h) * 2;
    partials[ml] = m_run;
    partials[ml + 1] = l_run;
  }
}
