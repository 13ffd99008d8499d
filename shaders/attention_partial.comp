#version 450
// D5 of the decode step (docs/DECODE.md): split-K absorbed MLA attention over one layer's
// latent cache (forward.md section 2.3-2.4). For the query at position pos (kv_len = pos + 1 rows)
//   s_h(j) = kq_scale * (q_lat_h . c_j + rope(q_pe_h, pos) . kpe_j),   j < kv_len
// and per chunk of positions the softmax state of every head: m = max_j s, l = sum_j exp(s - m),
// o = sum_j exp(s - m) * c_j (R floats). attention_merge.comp combines the chunks.
//
// Work split: workgroup (x = chunk c, y = head group) handles the positions of chunk c
// (ts_attn_chunk_len of attention_args.h; chunks past kv_len exit at once, so the dispatch is
// sized for the largest context at record time while the work follows the current length) for
// HW <= 32 heads. With HW = all heads (the default) every cached row is read once from memory.
// Rows are staged TILE at a time in shared memory as f32 (the next tile is fetched into
// registers while the current one is used) and used twice, each phase register-tiled so that a
// value read from shared memory feeds several FMAs:
//   scores: thread (dim slice s, head quad g) holds the query of heads 4g..4g+3 on the SV vec4
//           s, s + NS, s + 2 NS, ... of the row in registers (q_pe roped at load: the query's
//           rope happens here) and writes one partial dot per row and head; the NS slice
//           partials are then summed;
//   values: thread (column quad c, head group o) accumulates columns 4c..4c+3 for OH heads.
//
// Defines: N_HEAD, KV_LORA (R), N_ROT (Dr) (R and Dr multiples of 8) + the rope.glsl table;
// WG (threads, a multiple of 32), TILE (rows per tile, a multiple of 2), HW (heads per
// workgroup, <= 32), SV (vec4 per score slice), OH (heads per value thread, a multiple of 4).
// The host sizes WG >= NS * ceil(HW/4), WG >= (R/4) * ceil(HW/OH), WG >= HW.
// PARTIAL_SIGNAL (0/1; the decode step's long range; AttentionTuning::merge_wait): every
// workgroup, those that return early too, adds 1 to word SIGNAL_WORD of binding 4 once its
// partials are written and visible device-wide; the merge (attention_merge.comp WAIT_GATE),
// recorded with no barrier after this dispatch, waits until the word counts them all.
#extension GL_GOOGLE_include_directive : require
#include "timeline.glsl"  // before main(): bench --timeline
#extension GL_EXT_control_flow_attributes : require
#include "attention_args.h"
#include "rope.glsl"

layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly restrict buffer Query { vec4 q4[]; };       // N_HEAD x (R+Dr) f32
layout(std430, binding = 1) readonly restrict buffer Cache { uvec4 cache4[]; };  // n_ctx x (R+Dr) f16
layout(std430, binding = 2) readonly restrict buffer Step { uint step_words[]; };
// [n_groups][N_HEAD][R] floats o, then [n_groups][N_HEAD] pairs (m, l)
layout(std430, binding = 3) writeonly restrict buffer Partials { float partials[]; };
#ifndef PARTIAL_SIGNAL
#define PARTIAL_SIGNAL 0
#endif
#if PARTIAL_SIGNAL  // the merge's gate
layout(std430, binding = 4) coherent restrict buffer Gate { uint gate[]; };
#include "gate.glsl"
#endif

layout(push_constant) uniform Push { AttnPartialArgs args; };

const uint kRow = KV_LORA + N_ROT;             // values per cache row
const uint kRowQ = kRow / 8;                   // uvec4 (8 halves) per cache row
const uint kRowV = kRow / 4;                   // vec4 per staged f32 row
const uint kLatV = KV_LORA / 4;                // vec4 of the latent part
const uint kNS = (kRowV + SV - 1) / SV;        // score slices
const uint kSItems = kNS * ((HW + 3) / 4);     // score threads
const uint kHWP = (HW + 3) / 4 * 4;            // heads per score row, padded to vec4
const uint kOQ = KV_LORA / 4;                  // latent column quads
const uint kOItems = kOQ * ((HW + OH - 1) / OH);  // value threads
const uint kLoads = (TILE * kRowQ + WG - 1) / WG;  // uvec4 fetched per thread per tile
const float kNegHuge = -3.0e38;                // "no score yet"; exp(kNegHuge - m) == 0

shared vec4 tile[TILE * kRowV];                // staged rows, f32
// [slice][row][head] partial scores; slice 0 then holds s, then exp(s - m); OH/4 vec4 of slack
// for the value threads' reads past the last head
shared vec4 scores4[kNS * TILE * kHWP / 4 + OH / 4];
shared float m_tile[kHWP];                     // running max including the current tile
shared float alpha[kHWP];                      // factor rescaling the previous accumulators

float score_at(uint idx) { return scores4[idx / 4][idx % 4]; }
void set_score(uint idx, float v) { scores4[idx / 4][idx % 4] = v; }

void partial_main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint chunk = gl_WorkGroupID.x;
  const uint head0 = gl_WorkGroupID.y * HW;
  const uint n_heads = min(uint(HW), uint(N_HEAD) - head0);
  const uint qt = gl_WorkGroupID.z;  // query of a prefill chunk (decode: 0)
  const uint n_q = args.count_word == TS_ATTN_NO_COUNT ? 1u : step_words[args.count_word];
  if (qt >= n_q) return;  // uniform
  const uint pos = step_words[args.pos_word] + qt;
  const uint kv_len = min(pos + 1, args.n_ctx);
  const uint q_base = qt * N_HEAD * kRowV;                            // vec4
  const uint p_base = qt * args.n_groups * N_HEAD * (KV_LORA + 2u);   // floats
  if (kv_len < args.kv_min || (args.kv_max != 0u && kv_len > args.kv_max)) return;  // the other variant's
  const uint chunk_len = ts_attn_chunk_len(kv_len, args.n_groups, args.min_chunk, TILE);
  const uint begin = chunk * chunk_len;
  if (begin >= kv_len) return;  // uniform: chunk beyond the current context
  const uint end = min(kv_len, begin + chunk_len);

  // Fetch of tile rows [t0, t0 + n) into registers: thread tid takes uvec4 tid + i*WG.
  uvec4 fetched[kLoads];
  [[unroll]] for (uint i = 0; i < kLoads; ++i) {
    const uint e = tid + i * WG;
    if (e < min(uint(TILE), end - begin) * kRowQ) fetched[i] = cache4[begin * kRowQ + e];
  }

  // Score role: slice s, head quad g; query values in registers (heads past the last duplicate it).
  const bool s_active = tid < kSItems;
  const uint s_slice = tid % kNS, s_quad = min(tid / kNS, (HW + 3) / 4 - 1);
  vec4 qreg[4][SV];
  [[unroll]] for (uint a = 0; a < 4; ++a) {
    const uint h = head0 + min(s_quad * 4 + a, n_heads - 1);
    [[unroll]] for (uint i = 0; i < SV; ++i) {
      const uint v = min(s_slice + i * kNS, kRowV - 1);
      vec4 qv = q4[q_base + h * kRowV + v];
      if (v >= kLatV) {  // rope pairs (4v - R)/2 and +1
        const uint k = (4 * v - KV_LORA) / 2;
        qv.xy = rope_rotate(qv.xy, rope_cos_sin(pos, k));
        qv.zw = rope_rotate(qv.zw, rope_cos_sin(pos, k + 1));
      }
      qreg[a][i] = qv;
    }
  }

  // Value role: column quad, head group; accumulators of OH heads.
  const bool o_active = tid < kOItems;
  const uint o_quad = tid % kOQ, o_head0 = (tid / kOQ) * OH;
  vec4 acc[OH];
  [[unroll]] for (uint a = 0; a < OH; ++a) acc[a] = vec4(0.0);
  float m_run = kNegHuge, l_run = 0.0;  // meaningful in thread tid == local head < n_heads

  for (uint t0 = begin; t0 < end; t0 += TILE) {
    const uint n_valid = min(uint(TILE), end - t0);
    barrier();  // previous tile fully consumed
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
    // Fetch the next tile while this one is used.
    const uint t1 = t0 + TILE;
    if (t1 < end) {
      [[unroll]] for (uint i = 0; i < kLoads; ++i) {
        const uint e = tid + i * WG;
        if (e < min(uint(TILE), end - t1) * kRowQ) fetched[i] = cache4[t1 * kRowQ + e];
      }
    }

    // Partial scores, two rows at a time (rows past n_valid are computed and ignored).
    if (s_active) {
      for (uint j = 0; j < n_valid; j += 2) {
        vec4 d0 = vec4(0.0), d1 = vec4(0.0);  // heads 4g..4g+3 of rows j, j+1
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
        scores4[((s_slice * TILE + j) * kHWP) / 4 + s_quad] = d0;
        scores4[((s_slice * TILE + j + 1) * kHWP) / 4 + s_quad] = d1;
      }
    }
    barrier();

    // Sum the slices into slice 0 (scaled; rows past the context and padding heads get kNegHuge).
    for (uint i = tid; i < TILE * kHWP; i += WG) {
      const uint j = i / kHWP, h = i % kHWP;
      float s = kNegHuge;
      if (j < n_valid && h < n_heads) {
        s = 0.0;
        for (uint sl = 0; sl < kNS; ++sl) s += score_at((sl * TILE + j) * kHWP + h);
        s *= args.kq_scale;
      }
      set_score(i, s);
    }
    barrier();

    // Online softmax bookkeeping, one thread per head.
    if (tid < n_heads) {
      float mx = kNegHuge;
      for (uint j = 0; j < n_valid; ++j) mx = max(mx, score_at(j * kHWP + tid));
      const float m_new = max(m_run, mx);
      alpha[tid] = exp(m_run - m_new);
      m_tile[tid] = m_new;
      m_run = m_new;
    }
    barrier();
    for (uint i = tid; i < TILE * kHWP; i += WG) {
      const uint j = i / kHWP, h = i % kHWP;
      set_score(i, (j < n_valid && h < n_heads) ? exp(score_at(i) - m_tile[h]) : 0.0);
    }
    barrier();

    // Weighted sum of the latent values.
    if (tid < n_heads) {
      float sum = 0.0;
      for (uint j = 0; j < n_valid; ++j) sum += score_at(j * kHWP + tid);
      l_run = l_run * alpha[tid] + sum;
    }
    if (o_active) {
      [[unroll]] for (uint a = 0; a < OH; ++a) acc[a] *= alpha[min(o_head0 + a, kHWP - 1)];
      for (uint j = 0; j < n_valid; ++j) {
        const vec4 v = tile[j * kRowV + o_quad];
        [[unroll]] for (uint a4 = 0; a4 < OH / 4; ++a4) {
          const vec4 p = scores4[(j * kHWP + o_head0) / 4 + a4];
          [[unroll]] for (uint c = 0; c < 4; ++c) acc[a4 * 4 + c] += p[c] * v;
        }
      }
    }
  }

  // Partial of this chunk: unnormalized o, then (m, l) per head.
  if (o_active) {
    [[unroll]] for (uint a = 0; a < OH; ++a) {
      if (o_head0 + a < n_heads) {
        const uint o = p_base + (chunk * N_HEAD + head0 + o_head0 + a) * KV_LORA + 4 * o_quad;
        partials[o] = acc[a].x;
        partials[o + 1] = acc[a].y;
        partials[o + 2] = acc[a].z;
        partials[o + 3] = acc[a].w;
      }
    }
  }
  if (tid < n_heads) {
    const uint ml = p_base + args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + head0 + tid) * 2;
    partials[ml] = m_run;
    partials[ml + 1] = l_run;
  }
}

void main() {
  partial_main();
#if PARTIAL_SIGNAL
  gate_signal(uint(SIGNAL_WORD), 1u);  // this workgroup's partials written (or none to write)
#endif
}
