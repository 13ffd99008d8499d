#version 450
// Device ceilings for `tessera bench --roofline` (wrapper: runtime/model/bench_roofline.cpp).
//
// MODE 0 (read): every invocation reads UNROLL 16-byte words of `src` (n_vec4 uvec4 in all),
//   coalesced: workgroup g, step k reads src[g*WG_SIZE*UNROLL + k*WG_SIZE + local id]. The words
//   are folded into one value that is written only when it equals a value the host never stores,
//   so no load can be dropped and almost nothing is written: the time is the read of n_vec4*16 B.
// MODE 1 (tiny): one workgroup writes one word: the cost of a dispatch with no work in it.
// MODE 2 (chained): dispatch i (push n_vec4 = i) waits, in invocation 0 of each workgroup, until
//   counter i - 1 reaches `never` (the workgroups of dispatch i - 1; nothing to wait for when
//   i = 0), then each workgroup adds 1 to counter i: dependent dispatches ordered by a counter in
//   memory instead of a pipeline barrier. A wait that spins kSpinLimit polls (or finds dst[0] set
//   by one that did) gives up and sets dst[0] = 1: a driver that does not run the dispatches in
//   order ends the test with an error flag instead of a hang.
// MODE 3 (grid barrier): one dispatch of `never` workgroups, all meant to be resident at once,
//   passes n_vec4 rounds of a grid-wide barrier: invocation 0 of each workgroup adds 1 to
//   counter 0 and spins until it reaches (round + 1) * workgroups, then a workgroup barrier. What
//   a persistent kernel would pay per stage instead of a dispatch and a pipeline barrier. The
//   same bounded wait and error flag as MODE 2 (a device that cannot hold every workgroup at once,
//   such as lavapipe, ends the test with the flag set instead of a hang).
// MODE 4 (fenced grid barrier): MODE 3 as a persistent kernel needs it: each workgroup's writes
//   are released before it arrives (memoryBarrierBuffer) and acquired after the wait, which polls
//   with a volatile load instead of an atomic add of zero.
// MODE 5 (chained by gates; subgroups): MODE 2 as the decode step's early starts do it
//   (gate.glsl): dispatch i waits on word i - 1 by relaxed atomic loads and fences after it
//   (gate_wait), then each workgroup counts itself in word i (gate_signal). A wait that gives up
//   sets dst[0] = 1 (and dst[1] = what it saw); the dispatches after it do not wait.
// MODE 6 (gated read; subgroups, the device clock): what an early-started kernel can read from
//   the moment its gate opens, nothing loaded before it. Producer (pad1 != 0, one workgroup):
//   reads its region's first 8 KiB (into the L2, for MODE 7), spins pad0 ns on the device clock
//   so that the consumer's workgroups get resident and wait, then writes the clock at the
//   opening to word 1 and opens word 0: pad1 = 1 as gate.glsl does
//   it (a fence, then a relaxed add), 2 by an add with release semantics and no separate fence,
//   3 by a relaxed add without a fence (no ordering: a floor for the hop). Consumer (pad1 = 0,
//   recorded right after it with no barrier): invocation 0 polls word 0 (pad0 = 0: gate_poll's
//   relaxed atomic loads; 1: volatile loads of a coherent view) and takes a zero from the opened
//   word, so that no load of the read can be issued before the gate opened; then MODE 0's read
//   of its n_vec4 words, and after it invocation 0 records, relative to the opening, when it saw
//   the gate (atomicMin into word 2, atomicMax into word 4) and when its workgroup's loads had
//   landed (atomicMax into word 3).
// MODE 7 (gated broadcast): MODE 6 where every consumer workgroup's invocations below 64 read 8
//   words each of the region's first 8 KiB, which the producer read into the L2 before its spin:
//   the early gate-up's staging of x (a separate mode, so that MODE 6's loads compile as MODE 0's);
//   pad0 = 2: every invocation reads 2 of those words, a warp's loads consecutive (WG_SIZE 256).
// Bindings: 0 = src (uvec4[n_vec4]; MODE 2 / 3 / 5: the counters, uint), 1 = dst (uint[]);
// MODE 6 / 7: 2 = the gate and clock words (uint[5]), 3 = gate.glsl's error words (uint[2]).

#include "common.glsl"

layout(local_size_x = WG_SIZE) in;

#if MODE == 4
layout(std430, binding = 0) coherent volatile restrict buffer CounterBuf { uint counters[]; };
#endif
#if MODE == 2 || MODE == 3
layout(std430, binding = 0) coherent restrict buffer CounterBuf { uint counters[]; };
#endif
#if MODE == 5
#extension GL_KHR_memory_scope_semantics : require
layout(std430, binding = 0) coherent restrict buffer Gate { uint gate[]; };
layout(std430, binding = 1) coherent restrict buffer GateError { uint gate_error[]; };
#define GATE_WAIT 1
#include "gate.glsl"
shared bool gave_up;
#endif
#if MODE == 6 || MODE == 7
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_realtime_clock : require
layout(std430, binding = 2) coherent restrict buffer Gate { uint gate[]; };
layout(std430, binding = 3) coherent restrict buffer GateError { uint gate_error[]; };
#define GATE_WAIT 1
#include "gate.glsl"
layout(std430, binding = 2) coherent volatile restrict buffer GateVolatile { uint gate_v[]; };
shared uint gr_zero;  // 0, taken from the opened gate word
#endif
#if MODE >= 2 && MODE <= 4
layout(std430, binding = 1) coherent restrict buffer DstBuf { uint dst[]; };
const uint kSpinLimit = 1u << 20;
#elif MODE <= 1 || MODE == 6 || MODE == 7
layout(std430, binding = 0) readonly restrict buffer SrcBuf { uvec4 src[]; };
layout(std430, binding = 1) restrict buffer DstBuf { uint dst[]; };
#endif

layout(push_constant) uniform Push {
  uint n_vec4;   // 16-byte words in src
  uint never;    // a value no fold of the buffer's contents equals (the host picks it)
  uint pad0, pad1;
} args;

void main() {
#if MODE == 6 || MODE == 7
  if (args.pad1 != 0u) {  // the producer
    // The region's first 8 KiB into the L2 (MODE 7 reads it), kept by a store no fold equals.
    const uvec4 w = src[gl_LocalInvocationIndex] ^ src[gl_LocalInvocationIndex + WG_SIZE];
    if ((w.x ^ w.y ^ w.z ^ w.w) == args.never) dst[gl_LocalInvocationIndex] = 1u;
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
      const uint t0 = clockRealtime2x32EXT().x;
      uint t = t0;
      for (uint spins = 0u; t - t0 < args.pad0 && spins < (1u << 24); ++spins) t = clockRealtime2x32EXT().x;
      gate[1] = t;
      if (args.pad1 == 2u) {
        atomicAdd(gate[0], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
      } else {
        if (args.pad1 == 1u) memoryBarrierBuffer();
        atomicAdd(gate[0], 1u);
      }
    }
    return;
  }
  if (gl_LocalInvocationIndex == 0u) {
    if (args.pad0 == 1u) {
      uint v = gate_v[0];
      for (uint spins = 0u; v < 1u && spins < kGateSpins; ++spins) v = gate_v[0];
      if (v < 1u) gate_error[0] = 1u;
    } else {
      gate_poll(0u, 1u, 0u);
    }
    gr_zero = gate_load(0u) - 1u;  // the producer opens it once: 0
  }
  barrier();
  memoryBarrierBuffer();
  const uint seen = clockRealtime2x32EXT().x;
  const uint base = linear_workgroup_id() * (WG_SIZE * UNROLL) + gl_LocalInvocationIndex + gr_zero;
#endif
#if MODE == 0 || MODE == 6 || MODE == 7
#if MODE == 0
  const uint base = linear_workgroup_id() * (WG_SIZE * UNROLL) + gl_LocalInvocationIndex;
#endif
  uvec4 acc = uvec4(0);
  [[unroll]] for (uint k = 0; k < UNROLL; ++k) {
#if MODE == 7  // pad0 = 2: the same 8 KiB read coalesced, two consecutive words an invocation
    const uint i = args.pad0 == 2u ? (k < 2u ? gl_LocalInvocationIndex + k * WG_SIZE + gr_zero : args.n_vec4)
                   : gl_LocalInvocationIndex < 64u ? 8u * gl_LocalInvocationIndex + k + gr_zero : args.n_vec4;
#else
    const uint i = base + k * WG_SIZE;
#endif
    if (i < args.n_vec4) acc ^= src[i];
  }
  const uint folded = acc.x ^ acc.y ^ acc.z ^ acc.w;
  if (folded == args.never) dst[gl_LocalInvocationIndex] = folded;
#if MODE == 6 || MODE == 7
  barrier();  // every invocation's loads have landed (its fold needed them)
  if (gl_LocalInvocationIndex == 0u) {
    const uint end = clockRealtime2x32EXT().x, opened = gate[1];
    atomicMin(gate[2], seen - opened);
    atomicMax(gate[3], end - opened);
    atomicMax(gate[4], seen - opened);
  }
#endif
#elif MODE == 1
  if (gl_LocalInvocationIndex == 0) dst[0] = args.never + gl_WorkGroupID.x;
#elif MODE == 3
  for (uint r = 0u; r < args.n_vec4; ++r) {
    if (gl_LocalInvocationIndex == 0u) {
      atomicAdd(counters[0], 1u);
      const uint target = (r + 1u) * args.never;
      uint spins = 0u;
      while (atomicAdd(counters[0], 0u) < target) {
        if (++spins >= kSpinLimit || atomicAdd(dst[0], 0u) != 0u) {
          atomicOr(dst[0], 1u);
          break;
        }
      }
    }
    barrier();
  }
#elif MODE == 4
  for (uint r = 0u; r < args.n_vec4; ++r) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
      atomicAdd(counters[0], 1u);
      const uint target = (r + 1u) * args.never;
      uint spins = 0u;
      while (counters[0] < target) {
        if (++spins >= kSpinLimit || dst[0] != 0u) {
          atomicOr(dst[0], 1u);
          break;
        }
      }
    }
    barrier();
    memoryBarrierBuffer();
  }
#elif MODE == 5
  const uint i = args.n_vec4;
  // A give-up before this dispatch: do not wait again (read once, for the whole workgroup).
  if (gl_LocalInvocationIndex == 0u) gave_up = gate_error[0] != 0u;
  barrier();
  if (i > 0u && !gave_up) gate_wait(i - 1u, args.never, 0u, args.pad0);  // pad0 is zero
  gate_signal(i, 1u);
#else
  const uint i = args.n_vec4;
  if (i > 0u) {
    if (gl_LocalInvocationIndex == 0u) {
      uint spins = 0u;
      while (atomicAdd(counters[i - 1u], 0u) < args.never) {
        if (++spins >= kSpinLimit || atomicAdd(dst[0], 0u) != 0u) {
          atomicOr(dst[0], 1u);
          break;
        }
      }
    }
    barrier();
  }
  memoryBarrierBuffer();
  barrier();
  if (gl_LocalInvocationIndex == 0u) atomicAdd(counters[i], 1u);
#endif
}
