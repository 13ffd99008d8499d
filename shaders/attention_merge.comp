#version 450
// D6 of the decode step (docs/DECODE.md): combine the per-chunk softmax partials of
// attention_partial.comp into the latent attention output of every head:
//   M = max_c m_c,  w_c = exp(m_c - M),  olat[h*R + r] = sum_c w_c o_c[h][r] / sum_c w_c l_c
// The chunk count follows kv_len exactly as in attention_partial.comp (same arguments, same TILE).
// Workgroup (x = block of COLS latent columns, y = head) of COLS*LANES threads: every workgroup
// recomputes M and the weights of its head (n_groups <= MAX_GROUPS values); thread (column,
// lane) sums the chunks lane, lane + LANES, ... of its column, and the LANES sums are added.
//
// MERGE_SG (subgroup arithmetic): every thread folds its chunks' (m, l) into a running (max, sum),
// the subgroups combine theirs through shared memory (one barrier), and each (column, lane) thread
// weighs its chunks' o by exp(m_c - M) read beside them: two barriers in all, and the first
// chunk's loads are issued before the reduction. Without it: shared-memory tree reductions.
//
// Q8_OUT: olat is also written as int8 blocks of 32 (q8_quantize.glsl; block b = columns
// 32b..32b+31 of the flat [N_HEAD][R] output, 3 uvec4 each), the input format of the int8 matvec
// that reads olat (W_vo: matvec_q8.comp X_Q8), which then stages nothing.
//
// GATE_SIGNAL (with Q8_OUT): after its olat values and int8 blocks are written and made visible
// device-wide, each workgroup adds 1 to the gate word (binding 4), which an early-started W_vo
// waits on until it counts every workgroup (docs/DECODE.md "Early start").
//
// WAIT_GATE (0/1; MERGE_SG; AttentionTuning::merge_wait): recorded with no barrier after the
// partials (attention_rows.comp, attention_partial.comp or attention_prefill_tc.comp with
// PARTIAL_SIGNAL), every workgroup of which adds 1 to word
// GATE_WORD of the polled words (after the outputs' bindings) once its partials are written; each
// workgroup reads the step words, waits until that word reaches GATE_TARGET (a wait that gives up
// sets the error words, the binding after), then reads the partials with plain loads (no SM has
// read their lines since the last barrier).
//
// Defines: N_HEAD, KV_LORA (R), TILE (as given to attention_partial.comp), COLS, LANES (COLS*LANES
// a power of two), MAX_GROUPS (>= n_groups), MERGE_SG (0/1; 1 needs USE_SUBGROUP and full
// subgroups), Q8_OUT (0/1; 1 needs COLS and R multiples of 32), GATE_SIGNAL (0/1).
#extension GL_GOOGLE_include_directive : require
#include "timeline.glsl"  // before main(): bench --timeline
#extension GL_EXT_control_flow_attributes : require
#include "attention_args.h"
#ifndef Q8_OUT
#define Q8_OUT 0
#endif
#ifndef GATE_SIGNAL
#define GATE_SIGNAL 0
#endif
#if GATE_SIGNAL && !Q8_OUT
#error "attention_merge.comp: GATE_SIGNAL needs Q8_OUT"
#endif
// Read by a consumer that runs beside this dispatch: coherent (the stores reach the device level).
#if GATE_SIGNAL
#define OUT_QUAL coherent writeonly
#else
#define OUT_QUAL writeonly restrict
#endif
#ifndef WAIT_GATE
#define WAIT_GATE 0
#endif
#if WAIT_GATE && !MERGE_SG
#error "attention_merge.comp: WAIT_GATE needs MERGE_SG (gate.glsl's wait uses subgroups)"
#endif
#if MERGE_SG
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#if WAIT_GATE
#extension GL_KHR_memory_scope_semantics : require
#endif

#define WG (COLS * LANES)
layout(local_size_x = WG) in;

// [n_groups][N_HEAD][R] floats o, then [n_groups][N_HEAD] pairs (m, l)
#if WAIT_GATE  // written beside this dispatch before the gate opens: not restrict
layout(std430, binding = 0) readonly buffer Partials { float partials[]; };
#else
layout(std430, binding = 0) readonly restrict buffer Partials { float partials[]; };
#endif
layout(std430, binding = 1) readonly restrict buffer Step { uint step_words[]; };
layout(std430, binding = 2) OUT_QUAL buffer Out { float olat[]; };  // N_HEAD x R
#if Q8_OUT
#include "q8_quantize.glsl"
layout(std430, binding = 3) OUT_QUAL buffer OutQ8 { uvec4 olat_q8[]; };  // 3 per 32 values
#if GATE_SIGNAL && WAIT_GATE  // W_vo's gate opened here, the partials' polled (gate.glsl polls gate[])
layout(std430, binding = 4) coherent restrict buffer VoGate { uint vo_gate[]; };
#define GATE_SIGNAL_BUFFER vo_gate
#elif GATE_SIGNAL
layout(std430, binding = 4) coherent restrict buffer Gate { uint gate[]; };
#include "gate.glsl"
#endif
shared float q8_src[COLS];
#endif
#if WAIT_GATE
#if GATE_SIGNAL
#define WAIT_BINDING 5
#elif Q8_OUT
#define WAIT_BINDING 4
#else
#define WAIT_BINDING 3
#endif
layout(std430, binding = WAIT_BINDING) coherent restrict buffer Gate { uint gate[]; };
layout(std430, binding = WAIT_BINDING + 1) coherent restrict buffer GateError { uint gate_error[]; };
#define WG_SIZE WG
#define GATE_WAIT 1
#include "gate.glsl"
#endif

layout(push_constant) uniform Push { AttnMergeArgs args; };

shared float reduce_buf[WG];
#if MERGE_SG
shared float sg_max[WG / SUBGROUP_SIZE], sg_sum[WG / SUBGROUP_SIZE];
#else
shared float weights[MAX_GROUPS];
#endif

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint head = gl_WorkGroupID.y;
  const uint qt = gl_WorkGroupID.z;  // query of a prefill chunk (decode: 0)
  const uint n_q = args.count_word == TS_ATTN_NO_COUNT ? 1u : step_words[args.count_word];
#if WAIT_GATE
  // The step word (not written beside this dispatch) before the wait, the partials after it.
  gate_wait(uint(GATE_WORD), uint(GATE_TARGET), step_words[args.pos_word] + n_q, args.zero);
#endif
  if (qt >= n_q) return;  // uniform
  const uint pos = step_words[args.pos_word] + qt;
  const uint kv_len = min(pos + 1, args.n_ctx);
  const uint n_chunks = ts_attn_num_chunks(kv_len, args.n_groups, args.min_chunk, TILE);
  const uint p_base = qt * args.n_groups * N_HEAD * (KV_LORA + 2u);
  const uint ml_base = p_base + args.n_groups * N_HEAD * KV_LORA;
  const uint col = tid % COLS, lane = tid / COLS;
  const uint r = gl_WorkGroupID.x * COLS + col;

#if MERGE_SG
  // This (column, lane)'s first chunk, loaded before the reduction (it does not depend on it).
  const bool has_first = r < KV_LORA && lane < n_chunks;
  const float o_first = has_first ? partials[p_base + (lane * N_HEAD + head) * KV_LORA + r] : 0.0;
  const float m_first = has_first ? partials[ml_base + (lane * N_HEAD + head) * 2] : 0.0;
  // (max, sum of l scaled to it) over this thread's chunks, then the subgroup's, then all.
  float mx = -3.0e38, lsum = 0.0;
  for (uint c = tid; c < n_chunks; c += WG) {
    const uint ml = ml_base + (c * N_HEAD + head) * 2;
    const float m_c = partials[ml], l_c = partials[ml + 1];
    const float m_new = max(mx, m_c);
    lsum = lsum * exp(mx - m_new) + l_c * exp(m_c - m_new);
    mx = m_new;
  }
  const float sg_m = subgroupMax(mx);
  const float sg_l = subgroupAdd(lsum * exp(mx - sg_m));
  if (subgroupElect()) {
    sg_max[gl_SubgroupID] = sg_m;
    sg_sum[gl_SubgroupID] = sg_l;
  }
  barrier();
  float m_all = -3.0e38;
  for (uint s = 0; s < WG / SUBGROUP_SIZE; ++s) m_all = max(m_all, sg_max[s]);
  float l_all = 0.0;
  for (uint s = 0; s < WG / SUBGROUP_SIZE; ++s) l_all += sg_sum[s] * exp(sg_max[s] - m_all);
  const float inv_l = 1.0 / l_all;

  float o = has_first ? exp(m_first - m_all) * o_first : 0.0;
  if (r < KV_LORA) {
    for (uint c = lane + LANES; c < n_chunks; c += LANES)
      o += exp(partials[ml_base + (c * N_HEAD + head) * 2] - m_all) * partials[p_base + (c * N_HEAD + head) * KV_LORA + r];
  }
#else
  float mx = -3.0e38;
  for (uint c = tid; c < n_chunks; c += WG) mx = max(mx, partials[ml_base + (c * N_HEAD + head) * 2]);
  reduce_buf[tid] = mx;
  barrier();
  for (uint width = WG / 2; width > 0; width /= 2) {
    if (tid < width) reduce_buf[tid] = max(reduce_buf[tid], reduce_buf[tid + width]);
    barrier();
  }
  const float m_all = reduce_buf[0];
  barrier();

  float sum = 0.0;
  for (uint c = tid; c < n_chunks; c += WG) {
    const uint ml = ml_base + (c * N_HEAD + head) * 2;
    const float w = exp(partials[ml] - m_all);
    weights[c] = w;
    sum += w * partials[ml + 1];
  }
  reduce_buf[tid] = sum;
  barrier();
  for (uint width = WG / 2; width > 0; width /= 2) {
    if (tid < width) reduce_buf[tid] += reduce_buf[tid + width];
    barrier();
  }
  const float inv_l = 1.0 / reduce_buf[0];
  barrier();

  float o = 0.0;
  if (r < KV_LORA) {
    for (uint c = lane; c < n_chunks; c += LANES) o += weights[c] * partials[p_base + (c * N_HEAD + head) * KV_LORA + r];
  }
#endif
  reduce_buf[tid] = o;
  barrier();
  if (lane == 0 && r < KV_LORA) {
    for (uint l = 1; l < LANES; ++l) o += reduce_buf[l * COLS + col];
    olat[qt * N_HEAD * KV_LORA + head * KV_LORA + r] = o * inv_l;
#if Q8_OUT
    q8_src[col] = o * inv_l;
#endif
  }
#if Q8_OUT
  barrier();
  const uint c0 = gl_WorkGroupID.x * COLS;  // this workgroup's first column (KV_LORA % 32 == 0)
  if (tid < COLS / 32u && c0 + 32u * tid < KV_LORA) {
    vec4 v[8];
    [[unroll]] for (uint k = 0; k < 8; ++k) {
      const uint i = 32u * tid + 4u * k;
      v[k] = vec4(q8_src[i], q8_src[i + 1u], q8_src[i + 2u], q8_src[i + 3u]);
    }
    uvec4 lo, hi;
    vec4 ds;
    q8_quantize32(v, lo, hi, ds);
    const uint blk = (qt * N_HEAD * KV_LORA + head * KV_LORA + c0) / 32u + tid;
    olat_q8[3u * blk] = lo;
    olat_q8[3u * blk + 1u] = hi;
    olat_q8[3u * blk + 2u] = floatBitsToUint(ds);
  }
#endif
#if GATE_SIGNAL
  gate_signal(0u, 1u);  // olat and its int8 blocks written
#endif
}
