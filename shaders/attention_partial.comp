#version 450
// D5 of the decode step (briefs/decode_plan.md): split-K absorbed MLA attention over one layer's
// latent cache (forward.md section 2.3-2.4). For the query at position pos (kv_len = pos + 1 cached rows)
//   s_h(j) = kq_scale * (q_lat_h . c_j + rope(q_pe_h, pos) . kpe_j),   j < kv_len
// and per chunk of positions the softmax state of every head: m = max_j s, l = sum_j exp(s - m),
// o = sum_j exp(s - m) * c_j (R floats). attention_merge.comp combines the chunks.
//
// Work split: workgroup (x = chunk c, y = head group) handles the positions of chunk c
// (ts_attn_chunk_len of attention_args.h; chunks past kv_len exit at once, so the dispatch is
// sized for the largest context at record time while the work follows the current length) for
// HW heads. With HW = all heads (the default) every cached row is read once from memory.
// Inside, tiles of TILE rows are staged in shared memory as f16 and used twice:
//   scores: thread (j, head group g, dim slice s) dots row j with HG heads over its slice of the
//           R+Dr dims (q_lat from the q buffer, q_pe roped on load into shared memory);
//   values: thread t owns latent column pairs t, t+WG, ... and accumulates all HW heads.
// The query's rope happens here (each workgroup ropes its heads' q_pe into shared memory), so
// q holds the unroped q_pe as the projection wrote it.
//
// Defines: N_HEAD, KV_LORA (R), N_ROT (Dr) (R and Dr multiples of 8) + the rope.glsl table;
// WG (threads), TILE (rows per tile), HW (heads per workgroup), HG (heads per score thread),
// NHG (head groups, NHG*HG >= HW), NSL (dim slices); TILE*NHG*NSL == WG, WG >= HW.
#extension GL_GOOGLE_include_directive : require
#include "attention_args.h"
#include "rope.glsl"

layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Query { vec4 q4[]; };         // N_HEAD x (R+Dr) f32
layout(std430, binding = 1) readonly buffer Cache { uvec4 cache4[]; };    // n_ctx x (R+Dr) f16
layout(std430, binding = 2) readonly buffer Step { uint step_words[]; };  // per-token values
// [n_groups][N_HEAD][R] floats o, then [n_groups][N_HEAD] pairs (m, l)
layout(std430, binding = 3) writeonly buffer Partials { float partials[]; };

layout(push_constant) uniform Push { AttnPartialArgs args; };

const uint kRow = KV_LORA + N_ROT;     // values per cache row
const uint kRowQ = kRow / 8;           // uvec4 (8 halves) per cache row
const uint kLatQ = KV_LORA / 8;        // uvec4 of the latent part
const uint kStride = kRowQ + 1;        // padded shared row: column reads hit distinct banks
const uint kHWP = (HW + 3) / 4 * 4;    // heads per score row, padded to vec4
const uint kPairs = KV_LORA / 2;       // latent column pairs (one f16 pair = one uint)
const uint kPairsPerThread = (kPairs + WG - 1) / WG;
const float kNegHuge = -3.0e38;        // "no score yet"; exp(kNegHuge - m) == 0

shared uvec4 tile_kv[TILE * kStride];
shared vec4 scores4[NSL * TILE * kHWP / 4];  // [slice][j][head]; slice 0 then holds exp(s - m)
shared vec4 q_pe4[HW * N_ROT / 4];           // roped q_pe of this workgroup's heads
shared float m_tile[kHWP];                   // running max including the current tile
shared float alpha[kHWP];                    // factor rescaling the previous accumulators

float score_part(uint slice, uint j, uint h) { return scores4[((slice * TILE + j) * kHWP + h) / 4][h % 4]; }

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint chunk = gl_WorkGroupID.x;
  const uint head0 = gl_WorkGroupID.y * HW;
  const uint n_heads = min(uint(HW), uint(N_HEAD) - head0);
  const uint pos = step_words[args.pos_word];
  const uint kv_len = min(pos + 1, args.n_ctx);
  const uint chunk_len = ts_attn_chunk_len(kv_len, args.n_groups, args.min_chunk, TILE);
  const uint begin = chunk * chunk_len;
  if (begin >= kv_len) return;  // uniform: chunk beyond the current context
  const uint end = min(kv_len, begin + chunk_len);

  // Rope this workgroup's q_pe at the query position.
  for (uint i = tid; i < n_heads * (N_ROT / 2); i += WG) {
    const uint hl = i / (N_ROT / 2), k = i % (N_ROT / 2);
    const uint src = (head0 + hl) * kRow + KV_LORA + 2 * k;
    const vec2 pe = rope_rotate(vec2(q4[src / 4][src % 4], q4[(src + 1) / 4][(src + 1) % 4]), rope_cos_sin(pos, k));
    const uint dst = hl * N_ROT + 2 * k;
    q_pe4[dst / 4][dst % 4] = pe.x;
    q_pe4[(dst + 1) / 4][(dst + 1) % 4] = pe.y;
  }

  // Score-thread role: row j of the tile, heads g*HG.., dims of slice s (in uvec4 units).
  const uint sj = tid % TILE;
  const uint sg = (tid / TILE) % NHG;
  const uint ss = tid / (TILE * NHG);
  const uint u_begin = ss * kRowQ / NSL, u_end = (ss + 1) * kRowQ / NSL;

  // Value-thread role: latent column pairs tid + i*WG; accumulators of all HW heads.
  vec2 acc[kPairsPerThread][HW];
  for (uint i = 0; i < kPairsPerThread; ++i)
    for (uint h = 0; h < HW; ++h) acc[i][h] = vec2(0.0);
  float m_run = kNegHuge, l_run = 0.0;  // meaningful in thread tid == local head < n_heads

  for (uint t0 = begin; t0 < end; t0 += TILE) {
    const uint n_valid = min(uint(TILE), end - t0);
    barrier();  // previous tile fully consumed (and q_pe4 written, on the first tile)
    for (uint i = tid; i < n_valid * kRowQ; i += WG) {
      const uint r = i / kRowQ, u = i % kRowQ;
      tile_kv[r * kStride + u] = cache4[(t0 + r) * kRowQ + u];
    }
    barrier();

    // Partial scores over this thread's dim slice.
    float dots[HG];
    for (uint i = 0; i < HG; ++i) dots[i] = 0.0;
    for (uint u = u_begin; u < min(u_end, kLatQ); ++u) {
      const uvec4 w = tile_kv[sj * kStride + u];
      const vec4 ka = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
      const vec4 kb = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
      for (uint i = 0; i < HG; ++i) {
        const uint h = head0 + min(sg * HG + i, n_heads - 1);
        const uint q = (h * kRow) / 4 + 2 * u;
        dots[i] += dot(q4[q], ka) + dot(q4[q + 1], kb);
      }
    }
    for (uint u = max(u_begin, kLatQ); u < u_end; ++u) {
      const uvec4 w = tile_kv[sj * kStride + u];
      const vec4 ka = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
      const vec4 kb = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
      for (uint i = 0; i < HG; ++i) {
        const uint hl = min(sg * HG + i, n_heads - 1);
        const uint q = (hl * N_ROT) / 4 + 2 * (u - kLatQ);
        dots[i] += dot(q_pe4[q], ka) + dot(q_pe4[q + 1], kb);
      }
    }
    for (uint i = 0; i < HG; ++i) {
      const uint hl = sg * HG + i;
      if (hl < n_heads) {
        const uint idx = (ss * TILE + sj) * kHWP + hl;
        scores4[idx / 4][idx % 4] = dots[i];
      }
    }
    barrier();

    // Online softmax bookkeeping, one thread per head.
    if (tid < n_heads) {
      float mx = kNegHuge;
      for (uint j = 0; j < n_valid; ++j) {
        float s = 0.0;
        for (uint sl = 0; sl < NSL; ++sl) s += score_part(sl, j, tid);
        mx = max(mx, s * args.kq_scale);
      }
      const float m_new = max(m_run, mx);
      alpha[tid] = exp(m_run - m_new);
      m_tile[tid] = m_new;
      m_run = m_new;
    }
    barrier();

    // Probabilities exp(s - m) into slice 0 (rows past the context get 0).
    for (uint i = tid; i < TILE * kHWP; i += WG) {
      const uint j = i / kHWP, hl = i % kHWP;
      float p = 0.0;
      if (hl < n_heads && j < n_valid) {
        float s = 0.0;
        for (uint sl = 0; sl < NSL; ++sl) s += score_part(sl, j, hl);
        p = exp(s * args.kq_scale - m_tile[hl]);
      }
      scores4[i / 4][i % 4] = p;
    }
    barrier();

    // Weighted sum of the latent values.
    if (tid < n_heads) {
      float sum = 0.0;
      for (uint j = 0; j < n_valid; ++j) sum += scores4[(j * kHWP + tid) / 4][tid % 4];
      l_run = l_run * alpha[tid] + sum;
    }
    for (uint i = 0; i < kPairsPerThread; ++i) {
      const uint cp = tid + i * WG;
      if (cp >= kPairs) continue;
      for (uint h = 0; h < HW; ++h) acc[i][h] *= alpha[h];
      for (uint j = 0; j < n_valid; ++j) {
        const vec2 v = unpackHalf2x16(tile_kv[j * kStride + cp / 4][cp % 4]);
        for (uint h4 = 0; h4 < kHWP / 4; ++h4) {
          const vec4 p = scores4[(j * kHWP) / 4 + h4];
          for (uint c = 0; c < 4; ++c)
            if (h4 * 4 + c < HW) acc[i][h4 * 4 + c] += p[c] * v;
        }
      }
    }
  }

  // Partial of this chunk: unnormalized o, then (m, l) per head.
  for (uint i = 0; i < kPairsPerThread; ++i) {
    const uint cp = tid + i * WG;
    if (cp >= kPairs) continue;
    for (uint h = 0; h < HW; ++h) {
      if (h >= n_heads) break;
      const uint o = (chunk * N_HEAD + head0 + h) * KV_LORA + 2 * cp;
      partials[o] = acc[i][h].x;
      partials[o + 1] = acc[i][h].y;
    }
  }
  if (tid < n_heads) {
    const uint ml = args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + head0 + tid) * 2;
    partials[ml] = m_run;
    partials[ml + 1] = l_run;
  }
}
