// Gates (docs/DECODE.md "Early start"): a consumer dispatch recorded with no barrier after its
// producer waits until a word the producer's workgroups count up reaches a target. The producer
// makes its outputs visible (memoryBarrierBuffer, then a barrier) before its atomicAdd
// (gate_signal); the consumer polls, then fences, then reads them (gate_poll, gate_wait). No
// deadlock: the queue launches the producer's workgroups before any of the consumer's.
// How the consumer reads the producer's output after the fence (PERFORMANCE.md sessions 10-11):
// plain loads where no SM has read those lines since the last barrier (olat_q8, hq, q_a's cq);
// coherent loads where one may hold them in L1 (the down's x: its workgroups read their old rows,
// whose 32-byte sectors span other workgroups' rows). Coherent loads are slow on the H100.
//
// The including kernel declares, before including:
//   coherent buffer gate[]        the gate words (or names another array GATE_SIGNAL_BUFFER for
//                                 gate_signal: a kernel that waits on one gate and opens another)
// and, with GATE_WAIT 1 (the consumer's side; it also enables GL_KHR_memory_scope_semantics):
//   coherent buffer gate_error[]  [0] = 1 when a wait gave up, [1] = what it saw (host-visible:
//                                 the decode step checks it and re-records without the gates)
//   GATE_ON_OPEN(first)           optional: run by the polling invocation once its poll is over
//                                 (first: the value its first poll saw; gate statistics)
#ifndef TESSERA_GATE_GLSL
#define TESSERA_GATE_GLSL
#include "gate_args.h"

#ifndef GATE_SIGNAL_BUFFER
#define GATE_SIGNAL_BUFFER gate
#endif

// The producer's side: after the workgroup's outputs, one arrival of `n` on gate[i]. Uniform
// control flow.
void gate_signal(uint i, uint n) {
  memoryBarrierBuffer();  // this invocation's stores visible device-wide
  barrier();
  if (gl_LocalInvocationIndex == 0u) atomicAdd(GATE_SIGNAL_BUFFER[i], n);
}

// The same for a producer of many workgroups (hundreds or more): read-modify-writes of one word
// serialize at the L2 (PERFORMANCE.md session 10: 1024 arrivals on one word cost the early start
// its gain), so workgroup `wg` of `n_wg` arrives on word base + wg % TS_GATE_TREE_GROUPS, and the
// last arrival of each group adds 1 to word `top`, which reaches min(n_wg, TS_GATE_TREE_GROUPS).
// The last arrival's fence orders its group's outputs (seen through the group's arrivals) before
// its add. Uniform control flow.
void gate_signal_tree(uint top, uint base, uint wg, uint n_wg) {
  memoryBarrierBuffer();
  barrier();
  if (gl_LocalInvocationIndex == 0u) {
    const uint g = wg % TS_GATE_TREE_GROUPS;
    const uint members = n_wg / TS_GATE_TREE_GROUPS + (g < n_wg % TS_GATE_TREE_GROUPS ? 1u : 0u);
    if (atomicAdd(GATE_SIGNAL_BUFFER[base + g], 1u) + 1u == members) {
      memoryBarrierBuffer();
      atomicAdd(GATE_SIGNAL_BUFFER[top], 1u);
    }
  }
}

#if defined(GATE_WAIT) && GATE_WAIT
// Polls before a wait gives up: several ms on an H100 (each poll an L2 round trip), far past any
// producer; below the 65535 iterations at which llvmpipe ends a loop by itself.
const uint kGateSpins = 1u << 15;

// One poll: an atomic load (relaxed, device scope). A plain load, even a volatile one, may be
// hoisted out of the loop (llvmpipe did); an atomic add of zero is not, but the workgroups'
// read-modify-writes of one word serialize at the L2 (PERFORMANCE.md session 10).
uint gate_load(uint i) { return atomicLoad(gate[i], gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed); }

// GATE_BACKOFF (a process-wide tuning define, bench --tune gate_backoff=N; default 0): N dependent
// integer steps between two polls, so that hundreds of polling workgroups take fewer turns at the
// gate word's L2 slice. Returns 0 at run time (`zero`), after the steps: the next poll's address
// depends on it, so it is not issued before them.
#ifndef GATE_BACKOFF
#define GATE_BACKOFF 0
#endif
uint gate_backoff(uint seen, uint zero) {
  uint d = seen;
  for (uint k = 0u; k < uint(GATE_BACKOFF); ++k) d = d * 1664525u + 1013904223u;
  return d & zero;
}

// Polls gate[i] + zero until it reaches target, or gives up (the error words). `zero` is 0 at run
// time; the caller makes it depend on loads it wants issued before the wait (the compiler may
// otherwise sink them past it). One invocation calls it. Returns the first value seen.
uint gate_poll(uint i, uint target, uint zero) {
  const uint first = gate_load(i) + zero;
  uint seen = first;
  for (uint spins = 1u; seen < target && spins < kGateSpins; ++spins) seen = gate_load(i + gate_backoff(seen, zero)) + zero;
  // Checked after the loop: a driver may end a long loop by itself (llvmpipe at 65535).
  if (seen < target) {
    gate_error[1] = seen;
    gate_error[0] = 1u;
  }
  return first;
}

#ifndef GATE_ON_OPEN
#define GATE_ON_OPEN(first)
#endif

shared uint gate_dep[WG_SIZE / SUBGROUP_SIZE];  // zero; orders the preloaded loads before the wait

// Until gate[i] reaches target, with the loads folded into `dep` landed first: each subgroup
// stores (its lanes' dep) & zero_mask (zero at run time, unknown to the compiler: e.g. the high
// half of the push constants' flags) into shared memory before the first barrier, and the
// polling invocation adds the first such word to what it polls. Without that data dependence the
// compiler may sink the loads past the wait (it did on the H100: 35 registers for W_vo, the loads
// issued after the gate opened). Invocation 0 polls, the workgroup waits at the second barrier,
// then fences. Uniform control flow; subgroups.
void gate_wait(uint i, uint target, uint dep, uint zero_mask) {
  if (subgroupElect()) gate_dep[gl_SubgroupID] = subgroupOr(dep) & zero_mask;
  barrier();  // every lane's preloaded loads have landed
  if (gl_LocalInvocationIndex == 0u) {
    const uint first = gate_poll(i, target, gate_dep[0]);
    GATE_ON_OPEN(first);
  }
  barrier();
  memoryBarrierBuffer();
  TS_MARK_GATE();  // bench --timeline: the wait's end (the mark, or with mark_gates the early mark)
}
#endif  // GATE_WAIT

#endif  // TESSERA_GATE_GLSL
