#version 450
// D5 of the decode step for short contexts (docs/DECODE.md): the same split-K partials as
// attention_partial.comp (same arguments, chunking and partials layout, so the same merge), with
// another work split: workgroup (x = chunk c, y = head group, z = query) handles RH heads (by
// default one), and its NSG subgroups take the chunk's rows RB at a time (subgroup g: rows begin + g*RB .. +RB-1, then
// begin + (NSG + g)*RB ...). A lane holds DPL values of a row (words lane, lane + SUBGROUP_SIZE, ...) — the query's in
// registers for the whole chunk, the cache row's as it is loaded — so a score is one subgroup
// sum, and the lane's latent values of the rows it loaded are the ones it accumulates into o:
// no shared-memory staging, no workgroup barrier until the subgroups' states are combined once.
//   s(j) = kq_scale * (q_lat_h . c_j + rope(q_pe_h, pos) . kpe_j)
//   per subgroup: online softmax state m, l, o (o: the lane's latent values)
//   per workgroup: M = max_g m_g, l = sum_g exp(m_g - M) l_g, o = sum_g exp(m_g - M) o_g
// Where attention_partial.comp loads a tile into shared memory and passes six barriers per tile,
// this one waits for one round of loads per RB rows and subgroup.
//
// MERGE_TAIL (the decode step's mid range, 4 workgroups per head; the short range's with
// `--attention merge_tail=1`): the merge of attention_merge.comp folded in, so the step needs no
// merge dispatch and no barrier before it. After writing its partials, each
// workgroup makes them visible device-wide and counts itself in its head group's arrival counter;
// the one that arrives last (the n_chunks-th) resets the counter to zero for the next dispatch and
// merges every chunk's partials of its heads into olat:
//   M = max_c m_c,  L = sum_c exp(m_c - M) l_c,  olat[h*R + d] = sum_c exp(m_c - M) o_c[h][d] / L
// The counters start at zero (the owner fills them once) and every dispatch leaves them at zero.
// One query only (the decode step).
//
// SINGLE (the decode step's variant for the shortest contexts): the workgroup of a head group is
// the only one along the context (n_groups = 1, so its chunk is [0, kv_len)); it combines its
// subgroups into olat itself, normalized, and (Q8_OUT) also as int8 blocks of 32 (q8_quantize.glsl,
// the format attention_merge.comp's Q8_OUT writes and W_vo's int8 kernel reads). No partials, no
// merge dispatch and no barrier before W_vo:
//   olat[h*R + d] = sum_g exp(m_g - M) o_g[d] / sum_g exp(m_g - M) l_g
// Its query and (SINGLE_EARLY) its first round of rows are loaded before the step word (they do
// not depend on it), so those loads overlap the position's. One query (count_word is not read).
//
// Define ROWS_F16 (0/1, default 0; needs shaderFloat16): scores and the value sums in packed
// halves (a word of a row, two values, per instruction; the score's 18 products of a lane summed
// in f16, each round's weighted rows in f16, then in f32): ~2/3 of the instructions per (row, head).
// Define ROWS_COALESCED (0/1, default 1): lane l holds words l, l + SUBGROUP_SIZE, ... of a row (0: words
// l * kWpl ..., the layout until session 20).
//
// Defines: N_HEAD, KV_LORA (R), N_ROT (Dr) + the rope.glsl table; TILE (the chunking's rounding,
// as in attention_partial.comp); NSG (subgroups per workgroup), RB (rows per subgroup and
// round), RH (heads per workgroup: each loaded row serves RH heads); SUBGROUP_SIZE (the pipeline
// asks for full subgroups of this size); MERGE_TAIL (0/1; 1 needs NSG*RH*R >= n_groups floats of
// shared memory for the chunk weights); SINGLE (0/1, n_groups 1), SINGLE_EARLY (0/1, default 1);
// Q8_OUT (0/1, with SINGLE or MERGE_TAIL; R a multiple of 32); GATE_SIGNAL (0/1, with Q8_OUT):
// after the workgroup's olat and int8 blocks are written and made visible device-wide, it adds
// the number of heads it finished to the gate word (binding OLAT_Q8_BINDING + 1): the consumer
// (W_vo, matvec_q8.comp WAIT_GATE) is recorded with no barrier after this dispatch and waits
// until the word reaches N_HEAD (docs/DECODE.md "Early start").
// WAIT_GATE (0/1; the single and mid kernels with GATE_SIGNAL, the split partials without; the
// decode step's `--tune early_attn`): recorded with no barrier after the query's matvec and
// kv_write, which count word GATE_WORD of binding OLAT_Q8_BINDING + 2 (the split partials: 4) up
// to GATE_TARGET; every workgroup waits for it first (a wait that gives up sets the error words,
// binding OLAT_Q8_BINDING + 3, the split partials: 5), then reads the query and the cache with
// plain loads (no SM has read their lines since the last barrier).
// PARTIAL_SIGNAL (0/1; the split partials; AttentionTuning::merge_wait): every workgroup, those
// that return early too, adds 1 to word SIGNAL_WORD of binding 4 (with WAIT_GATE: 6) once its
// partials are written and visible device-wide, so that the merge (attention_merge.comp
// WAIT_GATE) is recorded with no barrier after this dispatch and waits for every workgroup.
// Bindings: 0 = q (f32, N_HEAD x (R+Dr) per query), 1 = cache (f16 rows of R+Dr, read as 32-bit
// words), 2 = step words, 3 = partials ([n_groups][N_HEAD][R] o, then [n_groups][N_HEAD] (m, l));
// MERGE_TAIL: 4 = arrival counters (one uint per head group), 5 = olat (f32 [N_HEAD][R]),
// Q8_OUT: 6 = olat_q8 (the merging workgroup also writes olat's int8 blocks).
// SINGLE: 3 = olat (f32 [N_HEAD][R]); Q8_OUT: 4 = olat_q8 (3 uvec4 per block of 32 values).
// Arguments: AttnPartialArgs (attention_args.h). Wrapper: AttentionOp (runtime/vulkan/kernels_attention.h).
#extension GL_GOOGLE_include_directive : require
#include "timeline.glsl"  // before main(): bench --timeline
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "attention_args.h"
#include "rope.glsl"
#ifndef ROWS_F16
#define ROWS_F16 0
#endif
#if ROWS_F16
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#ifndef MERGE_TAIL
#define MERGE_TAIL 0
#endif
#ifndef SINGLE
#define SINGLE 0
#endif
#ifndef SINGLE_EARLY
#define SINGLE_EARLY 1
#endif
#ifndef Q8_OUT
#define Q8_OUT 0
#endif
#ifndef GATE_SIGNAL
#define GATE_SIGNAL 0
#endif
#if GATE_SIGNAL && !Q8_OUT
#error "attention_rows.comp: GATE_SIGNAL needs Q8_OUT (the gate opens on olat's int8 blocks)"
#endif
#ifndef WAIT_GATE
#define WAIT_GATE 0
#endif
#ifndef PARTIAL_SIGNAL
#define PARTIAL_SIGNAL 0
#endif
#if PARTIAL_SIGNAL && (SINGLE || MERGE_TAIL)
#error "attention_rows.comp: PARTIAL_SIGNAL is for the split partials"
#endif
#if WAIT_GATE && !GATE_SIGNAL && (SINGLE || MERGE_TAIL)
#error "attention_rows.comp: the single and mid kernels wait with GATE_SIGNAL (the early W_vo's attention)"
#endif
#if WAIT_GATE && GATE_SIGNAL && !SINGLE && !MERGE_TAIL
#error "attention_rows.comp: the split partials open no gate (their merge does)"
#endif
#if WAIT_GATE
#extension GL_KHR_memory_scope_semantics : require
#endif
// Read by a consumer that runs beside this dispatch: coherent (the stores reach the device level).
#if GATE_SIGNAL
#define OUT_QUAL coherent writeonly
#else
#define OUT_QUAL writeonly restrict
#endif

layout(local_size_x = NSG * SUBGROUP_SIZE) in;

#if WAIT_GATE  // written beside this dispatch before the gate opens: not restrict
layout(std430, binding = 0) readonly buffer Query { float q[]; };
layout(std430, binding = 1) readonly buffer Cache { uint cache_w[]; };
#else
layout(std430, binding = 0) readonly restrict buffer Query { float q[]; };
layout(std430, binding = 1) readonly restrict buffer Cache { uint cache_w[]; };
#endif
layout(std430, binding = 2) readonly restrict buffer Step { uint step_words[]; };
#if SINGLE
layout(std430, binding = 3) OUT_QUAL buffer Out { float olat[]; };
#define OLAT_Q8_BINDING 4
#elif MERGE_TAIL
// Written by every workgroup, read back by the last one: coherent (no stale L1 lines).
layout(std430, binding = 3) coherent restrict buffer Partials { float partials[]; };
layout(std430, binding = 4) coherent restrict buffer Arrivals { uint arrivals[]; };
layout(std430, binding = 5) OUT_QUAL buffer Out { float olat[]; };
#define OLAT_Q8_BINDING 6
#else
layout(std430, binding = 3) writeonly restrict buffer Partials { float partials[]; };
#if WAIT_GATE  // the short range's partials, started beside the query's matvec and kv_write
layout(std430, binding = 4) coherent restrict buffer Gate { uint gate[]; };
layout(std430, binding = 5) coherent restrict buffer GateError { uint gate_error[]; };
#if PARTIAL_SIGNAL  // the merge's gate opened here, the query's polled (gate.glsl polls gate[])
layout(std430, binding = 6) coherent restrict buffer MergeGate { uint merge_gate[]; };
#define GATE_SIGNAL_BUFFER merge_gate
#endif
#define WG_SIZE (NSG * SUBGROUP_SIZE)
#define GATE_WAIT 1
#include "gate.glsl"
#elif PARTIAL_SIGNAL  // the merge's gate
layout(std430, binding = 4) coherent restrict buffer Gate { uint gate[]; };
#include "gate.glsl"
#endif
#endif
#if Q8_OUT
#ifndef OLAT_Q8_BINDING
#error "attention_rows.comp: Q8_OUT needs SINGLE or MERGE_TAIL (the kernel that writes olat)"
#endif
#include "q8_quantize.glsl"
layout(std430, binding = OLAT_Q8_BINDING) OUT_QUAL buffer OutQ8 { uvec4 olat_q8[]; };  // 3 per 32 values
#if WAIT_GATE  // W_vo's gate opened here, the query's polled (gate.glsl polls gate[])
layout(std430, binding = OLAT_Q8_BINDING + 1) coherent restrict buffer VoGate { uint vo_gate[]; };
layout(std430, binding = OLAT_Q8_BINDING + 2) coherent restrict buffer Gate { uint gate[]; };
layout(std430, binding = OLAT_Q8_BINDING + 3) coherent restrict buffer GateError { uint gate_error[]; };
#define GATE_SIGNAL_BUFFER vo_gate
#define WG_SIZE (NSG * SUBGROUP_SIZE)
#define GATE_WAIT 1
#include "gate.glsl"
#elif GATE_SIGNAL
layout(std430, binding = OLAT_Q8_BINDING + 1) coherent restrict buffer Gate { uint gate[]; };
#include "gate.glsl"
#endif
shared float q8_src[RH * KV_LORA];  // the workgroup's olat values, for the int8 blocks

// olat's int8 blocks for heads head0 .. head0 + n_heads - 1 of query qt from q8_src (complete
// and visible: after a barrier). Block b: values 32b .. 32b+31 of q8_src (KV_LORA % 32 == 0).
void write_olat_q8(uint qt, uint head0, uint n_heads) {
  for (uint b = gl_LocalInvocationIndex; b < n_heads * (KV_LORA / 32u); b += NSG * SUBGROUP_SIZE) {
    vec4 v[8];
    [[unroll]] for (uint k = 0; k < 8; ++k) {
      const uint i = 32u * b + 4u * k;
      v[k] = vec4(q8_src[i], q8_src[i + 1u], q8_src[i + 2u], q8_src[i + 3u]);
    }
    uvec4 lo, hi;
    vec4 ds;
    q8_quantize32(v, lo, hi, ds);
    const uint blk = (qt * N_HEAD + head0) * (KV_LORA / 32u) + b;
    olat_q8[3u * blk] = lo;
    olat_q8[3u * blk + 1u] = hi;
    olat_q8[3u * blk + 2u] = floatBitsToUint(ds);
  }
#if GATE_SIGNAL
  gate_signal(0u, n_heads);  // olat and its int8 blocks written
#endif
}
#endif

layout(push_constant) uniform Push { AttnPartialArgs args; };

const uint kRow = KV_LORA + N_ROT;                                        // values per row
const uint kRowW = kRow / 2;                                              // words per row
const uint kDpl = 2u * ((kRow + 2u * SUBGROUP_SIZE - 1u) / (2u * SUBGROUP_SIZE));  // values per lane (even)
const uint kWpl = kDpl / 2u;                                              // words per lane
const float kNegHuge = -3.0e38;                                           // "no score yet"

shared float sg_m[NSG * RH], sg_l[NSG * RH];  // [subgroup][head]
shared float sg_o[NSG * RH * KV_LORA];         // [subgroup][head][latent]; MERGE_TAIL: then chunk weights
#if MERGE_TAIL
shared bool tail_last;  // this workgroup arrived last for its head group

// The merge of every chunk's partials of head h into olat (the last workgroup of the head group):
// the (m, l) pairs folded per thread, per subgroup and over the subgroups; the chunk weights
// exp(m_c - M) in shared memory; each thread sums whole columns over the chunks.
void merge_head(uint a, uint h, uint n_chunks) {
  const uint tid = gl_LocalInvocationIndex, g = gl_SubgroupID;
  const uint o_all = args.n_groups * N_HEAD * KV_LORA;  // where the (m, l) pairs begin
  float mx = kNegHuge, ls = 0.0;
  for (uint c = tid; c < n_chunks; c += NSG * SUBGROUP_SIZE) {
    const float m_c = partials[o_all + (c * N_HEAD + h) * 2u], l_c = partials[o_all + (c * N_HEAD + h) * 2u + 1u];
    const float m_new = max(mx, m_c);
    ls = ls * exp(mx - m_new) + l_c * exp(m_c - m_new);
    mx = m_new;
  }
  const float sm = subgroupMax(mx);
  const float sl = subgroupAdd(ls * exp(mx - sm));
  if (subgroupElect()) {
    sg_m[g] = sm;
    sg_l[g] = sl;
  }
  barrier();
  float big = kNegHuge;
  [[unroll]] for (uint k = 0; k < NSG; ++k) big = max(big, sg_m[k]);
  float lsum = 0.0;
  [[unroll]] for (uint k = 0; k < NSG; ++k) lsum += sg_l[k] * exp(sg_m[k] - big);
  for (uint c = tid; c < n_chunks; c += NSG * SUBGROUP_SIZE) sg_o[c] = exp(partials[o_all + (c * N_HEAD + h) * 2u] - big);
  barrier();
  const float inv_l = 1.0 / lsum;
  for (uint d = tid; d < KV_LORA; d += NSG * SUBGROUP_SIZE) {
    float acc = 0.0;
    for (uint c = 0; c < n_chunks; ++c) acc += sg_o[c] * partials[(c * N_HEAD + h) * KV_LORA + d];
    olat[h * KV_LORA + d] = acc * inv_l;
#if Q8_OUT
    q8_src[a * KV_LORA + d] = acc * inv_l;
#endif
  }
  barrier();  // sg_m, sg_l, sg_o are reused by the next head (and q8_src is complete)
}
#endif

// This lane's state: its query values (the RH heads'), and its subgroup's online softmax (m, l)
// with the lane's values of o.
float qv[RH][kDpl];
float m[RH], l[RH];
float o[RH][kDpl];
#if ROWS_F16
f16vec2 qh[RH][kWpl];  // qv as f16 pairs, one per word of a row (pack_query)

// qv (loaded, scaled and roped) into qh.
void pack_query() {
  [[unroll]] for (uint a = 0; a < RH; ++a)
    [[unroll]] for (uint t = 0; t < kWpl; ++t) qh[a][t] = f16vec2(qv[a][2u * t], qv[a][2u * t + 1u]);
}
#endif

// The lane's words of a row: word t * SUBGROUP_SIZE + lane for t = 0 .. kWpl - 1, so that each
// load instruction of a subgroup reads consecutive words (one 128-byte line for 32 lanes). With a
// lane's words consecutive instead (18 values at 36-byte strides between lanes) every load
// touched 9 lines: 8x the L1 traffic per row and head, the bound of the long-context kernel.
// Value i of a lane's slots (i = 2t + half) is row value lane_value(i).
#ifndef ROWS_COALESCED
#define ROWS_COALESCED 1
#endif
#if ROWS_COALESCED
uint lane_word(uint t) { return t * SUBGROUP_SIZE + gl_SubgroupInvocationID; }
#else  // the layout until session 20 (AttentionTuning::rows_coalesced false)
uint lane_word(uint t) { return gl_SubgroupInvocationID * kWpl + t; }
#endif
uint lane_value(uint i) { return 2u * lane_word(i / 2u) + (i & 1u); }

// The lane's words of rows j0 .. j0 + RB - 1, rows past `last` repeating it.
void load_rows(uint j0, uint last, out uint w[RB][kWpl]) {
  [[unroll]] for (uint b = 0; b < RB; ++b) {
    const uint row = min(j0 + b, last);
    [[unroll]] for (uint t = 0; t < kWpl; ++t) w[b][t] = lane_word(t) < kRowW ? cache_w[row * kRowW + lane_word(t)] : 0u;
  }
}

// The rows j0 .. j0 + RB - 1 (those < end) into every head's state (j0 uniform per subgroup).
void attend(uint j0, uint end, uint w[RB][kWpl]) {
  [[unroll]] for (uint a = 0; a < RH; ++a) {
    float s[RB];
    float m_new = m[a];
    [[unroll]] for (uint b = 0; b < RB; ++b) {
#if ROWS_F16
      // Packed half products, one instruction per word, summed in two f16 pairs (even and odd
      // words: at most 5 terms each) and then in f32.
      f16vec2 acc0 = f16vec2(0.0), acc1 = f16vec2(0.0);
      [[unroll]] for (uint t = 0; t < kWpl; t += 2u) acc0 = fma(unpackFloat2x16(w[b][t]), qh[a][t], acc0);
      [[unroll]] for (uint t = 1u; t < kWpl; t += 2u) acc1 = fma(unpackFloat2x16(w[b][t]), qh[a][t], acc1);
      const float part = (float(acc0.x) + float(acc0.y)) + (float(acc1.x) + float(acc1.y));
#else
      // Two chains of fused multiply-adds (one per half of a word): two instructions per word where
      // dot() and a sum took three; the kernel is bound by its instructions at long contexts.
      vec2 acc = vec2(0.0);
      [[unroll]] for (uint t = 0; t < kWpl; ++t)
        acc = fma(unpackHalf2x16(w[b][t]), vec2(qv[a][2u * t], qv[a][2u * t + 1u]), acc);
      const float part = acc.x + acc.y;
#endif
      s[b] = j0 + b < end ? subgroupAdd(part) : kNegHuge;
      m_new = max(m_new, s[b]);
    }
    // Rescale what is accumulated only where the maximum grew (the same in every lane of the
    // subgroup: no divergence); past the first rows it rarely does. alpha is exactly 1 otherwise:
    // the same arithmetic (lavapipe: the same bits; NVIDIA's compiler contracts o * alpha + p * v
    // otherwise than o + p * v, so its rounding differs). 18 multiplies less per row pair and head.
    float alpha = 1.0;
    if (m_new > m[a]) {
      alpha = exp(m[a] - m_new);
      [[unroll]] for (uint i = 0; i < kDpl; ++i) o[a][i] *= alpha;
      m[a] = m_new;
    }
    float p[RB];
    float psum = 0.0;
    [[unroll]] for (uint b = 0; b < RB; ++b) {
      p[b] = j0 + b < end ? exp(s[b] - m_new) : 0.0;
      psum += p[b];
    }
    l[a] = l[a] * alpha + psum;
#if ROWS_F16
    // The round's rows weighed in packed halves (p <= 1), their sum added to o in f32.
    f16vec2 ph[RB];
    [[unroll]] for (uint b = 0; b < RB; ++b) ph[b] = f16vec2(float16_t(p[b]));
    [[unroll]] for (uint t = 0; t < kWpl; ++t) {
      f16vec2 v = f16vec2(0.0);
      [[unroll]] for (uint b = 0; b < RB; ++b) v = fma(ph[b], unpackFloat2x16(w[b][t]), v);
      o[a][2u * t] += float(v.x);
      o[a][2u * t + 1u] += float(v.y);
    }
#else
    [[unroll]] for (uint t = 0; t < kWpl; ++t) {
      vec2 v = vec2(o[a][2u * t], o[a][2u * t + 1u]);
      [[unroll]] for (uint b = 0; b < RB; ++b) v += p[b] * unpackHalf2x16(w[b][t]);
      o[a][2u * t] = v.x;
      o[a][2u * t + 1u] = v.y;
    }
#endif
  }
}

// Each head's query values d0 .. d0 + kDpl - 1 scaled by kq_scale (zero past the row), unroped.
void load_query(uint qt, uint head0, uint n_heads) {
  [[unroll]] for (uint a = 0; a < RH; ++a) {
    const uint q_base = (qt * N_HEAD + head0 + min(a, n_heads - 1u)) * kRow;
    [[unroll]] for (uint i = 0; i < kDpl; ++i) qv[a][i] = lane_value(i) < kRow ? q[q_base + lane_value(i)] * args.kq_scale : 0.0;
  }
}

// The rope part of the query rotated to position pos (pairs (R + 2k, R + 2k + 1): a lane's word).
void rope_query(uint pos) {
  [[unroll]] for (uint a = 0; a < RH; ++a) {
    [[unroll]] for (uint i = 0; i < kDpl; i += 2u) {
      const uint d = lane_value(i);
      if (d >= KV_LORA && d < kRow) {
        const vec2 r = rope_rotate(vec2(qv[a][i], qv[a][i + 1u]), rope_cos_sin(pos, (d - KV_LORA) / 2u));
        qv[a][i] = r.x;
        qv[a][i + 1u] = r.y;
      }
    }
  }
}

void rows_main() {
#if WAIT_GATE
  gate_wait(uint(GATE_WORD), uint(GATE_TARGET), 0u, 0u);  // nothing loaded ahead
#endif
  const uint chunk = gl_WorkGroupID.x, head0 = gl_WorkGroupID.y * RH, qt = gl_WorkGroupID.z;
  const uint g = gl_SubgroupID;
  [[unroll]] for (uint a = 0; a < RH; ++a) {
    m[a] = kNegHuge;
    l[a] = 0.0;
    [[unroll]] for (uint i = 0; i < kDpl; ++i) o[a][i] = 0.0;
  }
#if SINGLE
  // The loads that need no step word are issued before it: the query, and this subgroup's first
  // round of rows (the context starts at row 0; rows the context turns out not to reach are
  // zeroed below, so no stale value meets a zero weight).
  const uint n_heads = min(uint(RH), uint(N_HEAD) - head0);
  load_query(qt, head0, n_heads);
#if SINGLE_EARLY
  uint w0[RB][kWpl];
  load_rows(g * RB, args.n_ctx - 1u, w0);
#endif
  const uint pos = step_words[args.pos_word] + qt;
  const uint kv_len = min(pos + 1u, args.n_ctx);
  if (kv_len < args.kv_min || (args.kv_max != 0u && kv_len > args.kv_max) || head0 >= N_HEAD) return;  // uniform
  const uint end = kv_len;
  rope_query(pos);
#if ROWS_F16
  pack_query();
#endif
  TS_MARK_EARLY();  // bench --timeline: the query loaded and roped
#if SINGLE_EARLY
  [[unroll]] for (uint b = 0; b < RB; ++b)
    [[unroll]] for (uint t = 0; t < kWpl; ++t) w0[b][t] = g * RB + b < end ? w0[b][t] : 0u;
  if (g * RB < end) attend(g * RB, end, w0);  // uniform per subgroup
  for (uint j0 = (NSG + g) * RB; j0 < end; j0 += NSG * RB) {  // uniform per subgroup
#else
  for (uint j0 = g * RB; j0 < end; j0 += NSG * RB) {  // uniform per subgroup
#endif
    uint w[RB][kWpl];
    load_rows(j0, end - 1u, w);
    attend(j0, end, w);
  }
#else
  // The query's loads first: they need no step word (query qt < the dispatch's z count is bound).
  const uint n_heads = min(uint(RH), uint(N_HEAD) - head0);  // heads past the last repeat it, unwritten
  load_query(qt, head0, n_heads);
  const uint n_q = args.count_word == TS_ATTN_NO_COUNT ? 1u : step_words[args.count_word];
  if (qt >= n_q) return;  // uniform
  const uint pos = step_words[args.pos_word] + qt;
  const uint kv_len = min(pos + 1u, args.n_ctx);
  if (kv_len < args.kv_min || (args.kv_max != 0u && kv_len > args.kv_max)) return;  // the other variant's
  const uint chunk_len = ts_attn_chunk_len(kv_len, args.n_groups, args.min_chunk, TILE);
  const uint begin = chunk * chunk_len;
  if (begin >= kv_len || head0 >= N_HEAD) return;  // uniform
  const uint end = min(kv_len, begin + chunk_len);
  rope_query(pos);
#if ROWS_F16
  pack_query();
#endif
  for (uint j0 = begin + g * RB; j0 < end; j0 += NSG * RB) {  // uniform per subgroup
    // RB rows' words for this lane, all loads issued before any is used (rows past the chunk
    // repeat its last row and are masked in attend); each row serves the RH heads.
    uint w[RB][kWpl];
    load_rows(j0, end - 1u, w);
    attend(j0, end, w);
  }
#endif

  TS_MARK();  // bench --timeline: the rows attended
  // Combine the subgroups (a subgroup without rows has m = kNegHuge, l = 0, o = 0).
  [[unroll]] for (uint a = 0; a < RH; ++a) {
    if (subgroupElect()) {
      sg_m[g * RH + a] = m[a];
      sg_l[g * RH + a] = l[a];
    }
    [[unroll]] for (uint i = 0; i < kDpl; ++i)
      if (lane_value(i) < KV_LORA) sg_o[(g * RH + a) * KV_LORA + lane_value(i)] = o[a][i];
  }
  barrier();
#if SINGLE
  for (uint a = 0; a < n_heads; ++a) {  // uniform
    float big = kNegHuge;
    [[unroll]] for (uint k = 0; k < NSG; ++k) big = max(big, sg_m[k * RH + a]);
    float f[NSG];
    float lsum = 0.0;
    [[unroll]] for (uint k = 0; k < NSG; ++k) {
      f[k] = exp(sg_m[k * RH + a] - big);
      lsum += f[k] * sg_l[k * RH + a];
    }
    const float inv_l = 1.0 / lsum;  // lsum >= 1: the row holding the maximum weighs exp(0)
    const uint o_base = (qt * N_HEAD + head0 + a) * KV_LORA;
    for (uint d = gl_LocalInvocationIndex; d < KV_LORA; d += NSG * SUBGROUP_SIZE) {
      float acc = 0.0;
      [[unroll]] for (uint k = 0; k < NSG; ++k) acc += f[k] * sg_o[(k * RH + a) * KV_LORA + d];
      olat[o_base + d] = acc * inv_l;
#if Q8_OUT
      q8_src[a * KV_LORA + d] = acc * inv_l;
#endif
    }
  }
#if Q8_OUT
  barrier();
  write_olat_q8(qt, head0, n_heads);
#endif
#else
  const uint p_base = qt * args.n_groups * N_HEAD * (KV_LORA + 2u);
  for (uint a = 0; a < n_heads; ++a) {  // uniform
    float big = kNegHuge;
    [[unroll]] for (uint k = 0; k < NSG; ++k) big = max(big, sg_m[k * RH + a]);
    float f[NSG];
    [[unroll]] for (uint k = 0; k < NSG; ++k) f[k] = exp(sg_m[k * RH + a] - big);
    const uint h = head0 + a;
    const uint o_base = p_base + (chunk * N_HEAD + h) * KV_LORA;
    for (uint d = gl_LocalInvocationIndex; d < KV_LORA; d += NSG * SUBGROUP_SIZE) {
      float acc = 0.0;
      [[unroll]] for (uint k = 0; k < NSG; ++k) acc += f[k] * sg_o[(k * RH + a) * KV_LORA + d];
      partials[o_base + d] = acc;
    }
    if (gl_LocalInvocationIndex == 0u) {
      float lsum = 0.0;
      [[unroll]] for (uint k = 0; k < NSG; ++k) lsum += f[k] * sg_l[k * RH + a];
      const uint ml = p_base + args.n_groups * N_HEAD * KV_LORA + (chunk * N_HEAD + h) * 2u;
      partials[ml] = big;
      partials[ml + 1u] = lsum;
    }
  }
#endif  // SINGLE
#if MERGE_TAIL
  memoryBarrierBuffer();  // this invocation's partials visible device-wide before the arrival
  barrier();
  const uint n_chunks = ts_attn_num_chunks(kv_len, args.n_groups, args.min_chunk, TILE);
  if (gl_LocalInvocationIndex == 0u) {
    const uint before = atomicAdd(arrivals[gl_WorkGroupID.y], 1u);
    tail_last = before + 1u == n_chunks;
    if (tail_last) atomicExchange(arrivals[gl_WorkGroupID.y], 0u);  // every chunk has arrived
  }
  barrier();
  if (!tail_last) return;  // uniform
  memoryBarrierBuffer();
  for (uint a = 0; a < n_heads; ++a) merge_head(a, head0 + a, n_chunks);  // uniform
#if Q8_OUT
  write_olat_q8(0u, head0, n_heads);  // one query; merge_head's last barrier made q8_src visible
#endif
#endif
}

void main() {
  rows_main();
#if PARTIAL_SIGNAL
  gate_signal(uint(SIGNAL_WORD), 1u);  // this workgroup's partials written (or none to write)
#endif
}
