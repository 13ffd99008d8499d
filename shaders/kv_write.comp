#version 450
// D4 of the decode step (docs/DECODE.md): append this token's row to one layer's latent
// KV cache (forward.md section 2.1-2.2):
//   cache[pos] = f16([ RMSNorm(kv[0:R]; attn_kv_a_norm, eps) | rope(kv[R:R+Dr], pos) ])
// pos is read from the step buffer (recorded command buffers are reused for every token).
// One workgroup per token (prefill: workgroup y = token t of the chunk, pos = base + t). The query's rope is NOT done here: attention_partial.comp applies it on load.
//
// Defines: KV_LORA (R, even), N_ROT (Dr, even) + the rope.glsl table, WG (workgroup size, power
// of two). WAIT_GATE (0/1; decode, subgroups; docs/DECODE.md "Early start"): recorded with no
// barrier after the kv_a matvec, which opens word GATE_WORD of binding 4 (GATE_TARGET arrivals);
// the workgroup waits on it (a wait that gives up sets the error words, binding 5), then reads kv.
// SIGNAL_GATE (0/1; decode, one token): the attention is recorded with no barrier after this:
// once the row is written, the workgroup adds 1 to word SIGNAL_WORD of binding 4 (gate.glsl
// gate_signal); binding 6 with WAIT_GATE (a chain: kv_a -> kv_write -> the attention).
#extension GL_GOOGLE_include_directive : require
#include "timeline.glsl"  // before main(): bench --timeline
#ifndef WAIT_GATE
#define WAIT_GATE 0
#endif
#ifndef SIGNAL_GATE
#define SIGNAL_GATE 0
#endif
#if WAIT_GATE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_memory_scope_semantics : require
#endif
#include "attention_args.h"
#include "rope.glsl"

layout(local_size_x = WG) in;

#if SIGNAL_GATE && WAIT_GATE
layout(std430, binding = 6) coherent restrict buffer SignalGate { uint signal_gate[]; };
#define GATE_SIGNAL_BUFFER signal_gate
#endif
#if WAIT_GATE
// Written by kv_a while this dispatch starts; plain loads after the wait's fence: no SM has read
// kv's lines since the last barrier (coherent loads are slow on the H100).
layout(std430, binding = 0) readonly buffer KvIn { float kv[]; };  // R + Dr
layout(std430, binding = 4) coherent restrict buffer Gate { uint gate[]; };
layout(std430, binding = 5) coherent restrict buffer GateError { uint gate_error[]; };
#define WG_SIZE WG
#define GATE_WAIT 1
#include "gate.glsl"
#else
layout(std430, binding = 0) readonly buffer KvIn { float kv[]; };         // R + Dr
#endif
#if SIGNAL_GATE && !WAIT_GATE
layout(std430, binding = 4) coherent restrict buffer Gate { uint gate[]; };
#include "gate.glsl"
#endif
#if SIGNAL_GATE
#define CACHE_QUAL coherent writeonly  // read beside this dispatch once the gate opens
#else
#define CACHE_QUAL writeonly
#endif
layout(std430, binding = 1) readonly buffer NormW { float norm_w[]; };    // R
layout(std430, binding = 2) readonly buffer Step { uint step_words[]; };  // per-token values
layout(std430, binding = 3) CACHE_QUAL buffer Cache { uint cache[]; };    // n_ctx x (R+Dr)/2 half pairs

layout(push_constant) uniform Push { KvWriteArgs args; };

const uint kRowWords = (KV_LORA + N_ROT) / 2;

shared float partial_sums[WG];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint t = gl_WorkGroupID.y;  // token of a prefill chunk (decode: 0)
  const uint n_tok = args.count_word == TS_ATTN_NO_COUNT ? 1u : step_words[args.count_word];
  if (t >= n_tok) return;  // uniform: a token past the chunk's count
  const uint pos = step_words[args.pos_word] + t;
  const uint kv0 = t * args.kv_stride;
#if WAIT_GATE
  gate_wait(uint(GATE_WORD), uint(GATE_TARGET), 0u, args.pad0);  // nothing to preload; pad0 is zero
#endif

  float sq = 0.0;
  for (uint i = tid; i < KV_LORA; i += WG) sq += kv[kv0 + i] * kv[kv0 + i];
  partial_sums[tid] = sq;
  barrier();
  for (uint width = WG / 2; width > 0; width /= 2) {
    if (tid < width) partial_sums[tid] += partial_sums[tid + width];
    barrier();
  }
  if (pos >= args.n_ctx) return;  // uniform: the host refuses a full context before this
  const float inv_rms = inversesqrt(partial_sums[0] / float(KV_LORA) + args.eps);

  const uint row = pos * kRowWords;
  for (uint w = tid; w < KV_LORA / 2; w += WG) {
    const vec2 c = vec2(kv[kv0 + 2 * w], kv[kv0 + 2 * w + 1]) * vec2(norm_w[2 * w], norm_w[2 * w + 1]) * inv_rms;
    cache[row + w] = packHalf2x16(c);
  }
  for (uint k = tid; k < N_ROT / 2; k += WG) {
    const vec2 pe = vec2(kv[kv0 + KV_LORA + 2 * k], kv[kv0 + KV_LORA + 2 * k + 1]);
    cache[row + KV_LORA / 2 + k] = packHalf2x16(rope_rotate(pe, rope_cos_sin(pos, k)));
  }
#if SIGNAL_GATE
  gate_signal(uint(SIGNAL_WORD), 1u);  // (the decode step: one token, pos < n_ctx, so every workgroup gets here)
#endif
}
