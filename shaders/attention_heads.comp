#version 450
// D5 of the decode step for the short range with every head in one workgroup
// (AttentionTuning::short_all_heads; docs/DECODE.md): the same split-K partials as
// attention_partial.comp (same arguments, chunking and partials layout, so the same merge).
// Workgroup (x = chunk c, z = query) stages its chunk's cache rows in shared memory, RS rows a
// round, so each row leaves the L2 once for all heads (attention_rows.comp reads it once per head:
// 20 times at GLM's 20 heads, 94 MB of L2 reads per layer at 4096 positions). Subgroup h takes
// head h: a lane holds DPL consecutive values of a row, the query's in registers for the whole
// chunk and a staged row's as it reads it, so a score is one subgroup sum and the lane's latent
// values of a row go straight into its o accumulators (no combine between subgroups):
//   s(j) = kq_scale * (q_lat_h . c_j + rope(q_pe_h, pos) . kpe_j)
//   per head: online softmax state m, l, o (o: unnormalized, as the merge expects)
// The next round's words are loaded into registers while the current round is attended, then
// stored into the other half of the staging buffer: one barrier per round.
//
// Defines: N_HEAD, KV_LORA (R), N_ROT (Dr) + the rope.glsl table (R + Dr even); TILE (the
// chunking's rounding); SUBGROUP_SIZE (the pipeline asks for full subgroups of this size, N_HEAD
// of them); RS (rows staged per round); RB (rows a subgroup attends at a time, dividing RS).
// Bindings: 0 = q (f32, N_HEAD x (R+Dr) per query), 1 = cache (f16 rows of R+Dr, read as 32-bit
// words), 2 = step words, 3 = partials ([n_groups][N_HEAD][R] o, then [n_groups][N_HEAD] (m, l)),
// query t's at float t*n_groups*N_HEAD*(R+2).
// Arguments: AttnPartialArgs (attention_args.h). Wrapper: AttentionOp (runtime/vulkan/kernels_attention.h).
#extension GL_GOOGLE_include_directive : require
#include "timeline.glsl"  // before main(): bench --timeline
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "attention_args.h"
#include "rope.glsl"

#if RS % RB != 0
#error "attention_heads.comp: RB must divide RS"
#endif

layout(local_size_x = N_HEAD * SUBGROUP_SIZE) in;

layout(std430, binding = 0) readonly restrict buffer Query { float q[]; };
layout(std430, binding = 1) readonly restrict buffer Cache { uint cache_w[]; };
layout(std430, binding = 2) readonly restrict buffer Step { uint step_words[]; };
layout(std430, binding = 3) writeonly restrict buffer Partials { float partials[]; };

layout(push_constant) uniform Push { AttnPartialArgs args; };

const uint kRow = KV_LORA + N_ROT;                                                 // values per row
const uint kRowW = kRow / 2u;                                                      // words per row
const uint kDpl = 2u * ((kRow + 2u * SUBGROUP_SIZE - 1u) / (2u * SUBGROUP_SIZE));  // values per lane (even)
const uint kWpl = kDpl / 2u;                                                       // words per lane
const uint kWg = N_HEAD * SUBGROUP_SIZE;                                           // invocations
const uint kStageW = RS * kRowW;                                                   // words per round
const uint kLoads = (kStageW + kWg - 1u) / kWg;                                    // words per invocation
const float kNegHuge = -3.0e38;                                                    // "no score yet"

shared uint stage[2][kStageW];  // two rounds of rows, f16 pairs as loaded

// This lane's state for its subgroup's head.
float qv[kDpl];
float m, l;
float o[kDpl];

// The words of rows first .. first + RS - 1 this invocation stages (rows past `last` repeat it;
// attend masks them).
void fetch(uint first, uint last, out uint v[kLoads]) {
  [[unroll]] for (uint k = 0; k < kLoads; ++k) {
    const uint w = gl_LocalInvocationIndex + k * kWg;
    v[k] = w < kStageW ? cache_w[min(first + w / kRowW, last) * kRowW + w % kRowW] : 0u;
  }
}

void store(uint buf, uint v[kLoads]) {
  [[unroll]] for (uint k = 0; k < kLoads; ++k) {
    const uint w = gl_LocalInvocationIndex + k * kWg;
    if (w < kStageW) stage[buf][w] = v[k];
  }
}

// Staged rows b0 .. b0 + RB - 1 of round buffer `buf` (context rows j0 .., those < end) into the
// head's state (uniform per subgroup).
void attend(uint buf, uint b0, uint j0, uint end) {
  const uint lw = gl_SubgroupInvocationID * kWpl;  // this lane's first word of a row
  uint w[RB][kWpl];
  [[unroll]] for (uint b = 0; b < RB; ++b)
    [[unroll]] for (uint t = 0; t < kWpl; ++t) w[b][t] = lw + t < kRowW ? stage[buf][(b0 + b) * kRowW + lw + t] : 0u;
  float s[RB];
  float m_new = m;
  [[unroll]] for (uint b = 0; b < RB; ++b) {
    float acc = 0.0;
    [[unroll]] for (uint t = 0; t < kWpl; ++t) acc += dot(unpackHalf2x16(w[b][t]), vec2(qv[2u * t], qv[2u * t + 1u]));
    s[b] = j0 + b < end ? subgroupAdd(acc) : kNegHuge;
    m_new = max(m_new, s[b]);
  }
  const float alpha = exp(m - m_new);
  float p[RB];
  float psum = 0.0;
  [[unroll]] for (uint b = 0; b < RB; ++b) {
    p[b] = j0 + b < end ? exp(s[b] - m_new) : 0.0;
    psum += p[b];
  }
  l = l * alpha + psum;
  m = m_new;
  [[unroll]] for (uint t = 0; t < kWpl; ++t) {
    vec2 v = vec2(o[2u * t], o[2u * t + 1u]) * alpha;
    [[unroll]] for (uint b = 0; b < RB; ++b) v += p[b] * unpackHalf2x16(w[b][t]);
    o[2u * t] = v.x;
    o[2u * t + 1u] = v.y;
  }
}

void main() {
  const uint chunk = gl_WorkGroupID.x, qt = gl_WorkGroupID.z, h = gl_SubgroupID;
  const uint d0 = gl_SubgroupInvocationID * kDpl;  // this lane's first value of a row
  const uint n_q = args.count_word == TS_ATTN_NO_COUNT ? 1u : step_words[args.count_word];
  if (qt >= n_q) return;  // uniform
  const uint pos = step_words[args.pos_word] + qt;
  const uint kv_len = min(pos + 1u, args.n_ctx);
  if (kv_len < args.kv_min || (args.kv_max != 0u && kv_len > args.kv_max)) return;  // the other variant's
  const uint chunk_len = ts_attn_chunk_len(kv_len, args.n_groups, args.min_chunk, TILE);
  const uint begin = chunk * chunk_len;
  if (begin >= kv_len) return;  // uniform
  const uint end = min(kv_len, begin + chunk_len);

  uint v[kLoads];
  fetch(begin, end - 1u, v);  // the first round in flight while the query loads
  const uint q_base = (qt * N_HEAD + h) * kRow;
  [[unroll]] for (uint i = 0; i < kDpl; ++i) qv[i] = d0 + i < kRow ? q[q_base + d0 + i] * args.kq_scale : 0.0;
  [[unroll]] for (uint i = 0; i < kDpl; i += 2u) {  // the rope part, rotated to pos (d0 is even)
    const uint d = d0 + i;
    if (d >= KV_LORA && d < kRow) {
      const vec2 r = rope_rotate(vec2(qv[i], qv[i + 1u]), rope_cos_sin(pos, (d - KV_LORA) / 2u));
      qv[i] = r.x;
      qv[i + 1u] = r.y;
    }
  }
  m = kNegHuge;
  l = 0.0;
  [[unroll]] for (uint i = 0; i < kDpl; ++i) o[i] = 0.0;
  store(0u, v);
  barrier();
  TS_MARK_EARLY();  // bench --timeline: the query roped, the first round staged
  uint buf = 0u;
  for (uint r0 = begin; r0 < end; r0 += RS) {  // uniform
    const bool more = r0 + RS < end;
    if (more) fetch(r0 + RS, end - 1u, v);
    [[unroll]] for (uint b0 = 0; b0 < RS; b0 += RB)
      if (r0 + b0 < end) attend(buf, b0, r0 + b0, end);  // uniform
    if (more) store(buf ^ 1u, v);
    barrier();  // the next round staged; this one read by every subgroup
    buf ^= 1u;
  }
  TS_MARK();  // bench --timeline: the rows attended

  const uint p_base = qt * args.n_groups * N_HEAD * (KV_LORA + 2u);
  const uint o_base = p_base + (chunk * N_HEAD + h) * KV_LORA;
  [[unroll]] for (uint i = 0; i < kDpl; ++i)
    if (d0 + i < KV_LORA) partials[o_base + d0 + i] = o[i];
  if (subgroupElect()) {
    const uint ml = p_base + args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + h) * 2u;
    partials[ml] = m;
    partials[ml + 1u] = l;
  }
}
