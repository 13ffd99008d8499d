// The device's ceilings, measured with small kernels of tessera's own (shaders/roofline.comp):
//  - read bandwidth: one pass over a large buffer with coalesced 16-byte loads (GPU timestamps
//    when the queue has them, else the host clock minus an empty submission);
//  - the same for short reads (4 to 32 MiB, the size of one decode kernel's weights), each a
//    dispatch after a compute-only barrier (the decode step's) over bytes no earlier pass read
//    lately, timed as the profiler times a decode kernel: what one such kernel can
//    reach with nothing but its loads (launch, DRAM ramp and drain included);
//  - reads of 4 to 16 MiB by resident workgroups from the moment a gate opens (device clock):
//    what an early-started kernel can reach when none of its loads may precede its gate;
//  - the cost of one dispatch with a barrier after it (each vk::BarrierScope), and without
//    barriers (N tiny dispatches in one submission, host clock, minus the empty submission);
//  - the same dependency through a counter in memory instead of a barrier (no pipeline barrier:
//    what chaining the decode step's stages in the shaders would cost);
//  - the round trip of an empty submit + wait.
// `tessera bench --roofline` prints these; the profiler's floor divides bytes by the bandwidth.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/vulkan/context.h"

namespace tessera::model {

struct RooflineOptions {
  uint64_t read_bytes = 0;     // size of the read test's buffer (0: 1 GiB on a GPU, 64 MiB on a
                               // CPU device; always capped by the device's buffer limits)
  uint32_t dispatches = 1000;  // tiny dispatches per submission in the dispatch-cost tests
  int repetitions = 7;         // timed runs of each test after one warm-up (the median is kept)
  bool read_only = false;      // measure only the read bandwidth (what the profiler needs)
  bool short_reads = false;    // with read_only: the short reads too (what the timeline needs)
};

// One short read (RooflineResult::short_reads).
struct ShortRead {
  uint64_t bytes = 0;  // read by one dispatch
  double us = 0;       // median time of one, from the barrier before it (GPU timestamps)
  double gbps = 0;     // bytes / us
  double open_us = 0;       // gated reads: from the gate's opening to the first workgroup that saw it
  double open_last_us = 0;  // ... and to the last one
};

// A gate's hop: from the producer's clock just before it opens the gate to the first and the last
// of the waiting workgroups that saw it (4 MiB gated reads; µs, medians over the rounds).
struct GateHop {
  double first_us = 0, last_us = 0;
};

struct RooflineResult {
  uint64_t read_bytes = 0;          // bytes read per pass
  double read_gbps = 0;             // median read bandwidth, GB/s (1e9 bytes per second)
  double read_us = 0;               // median time of one pass
  bool gpu_timestamps = false;      // the read test was timed with GPU timestamps
  // Reads of 4, 8, 16 and 32 MiB (the sizes of which the buffer's first half holds at least four),
  // each one dispatch after a compute-only barrier over a region of that half, which the large
  // passes read least lately; GPU timestamps only (empty without them, and with read_only).
  std::vector<ShortRead> short_reads;
  // Gated reads of 4, 8 and 16 MiB (those the buffer leaves room for): the resident workgroups of
  // a dispatch recorded with no barrier after a producer wait on its gate (gate.glsl) and read
  // their region once it opens, nothing before (roofline.comp MODE 6); `us` from the first
  // workgroup that saw the gate to the last whose loads landed (device clock). What an
  // early-started kernel whose addresses depend on its producer (the routed experts) can reach
  // with nothing but its loads. Measured with the short reads, where the device has subgroups and
  // a shader device clock.
  std::vector<ShortRead> gated_reads;
  bool gated_read_gave_up = false;  // a gated read's wait gave up or its words were not written
  // The hop of a gate opened three ways (roofline.comp MODE 6's producer): [0] as gate.glsl does
  // (a fence, then a relaxed add), [1] an add with release semantics, [2] a relaxed add with no
  // fence (no ordering: the floor); all polled by relaxed atomic loads (gate.glsl); [3] opened as
  // [0], polled by volatile loads. Zero where not measured.
  GateHop gate_hops[4];
  // After a gate opens, each of 256 waiting workgroups (128 where the buffer holds no 8 MiB region)
  // reads the same 8 KiB, which the producer read into the L2: [0] its first 64 invocations 8
  // words each (the early gate-up's staging of x), [1] every invocation 2 words, coalesced;
  // first_us = the opening -> the first seen, last_us = the opening -> the last workgroup's
  // loads landed (roofline.comp MODE 7).
  GateHop gated_broadcast[2];
  uint32_t dispatches = 0;          // per submission in the dispatch tests (0: not measured)
  double dispatch_barrier_us = 0;   // per dispatch, each followed by a barrier (BarrierScope::Full)
  double dispatch_barrier_compute_us = 0;       // the same with BarrierScope::Compute ...
  double dispatch_barrier_compute_only_us = 0;  // ... and BarrierScope::ComputeOnly
  double dispatch_barrier_execution_only_us = 0;  // ... and BarrierScope::ExecutionOnly (no memory barrier)
  double dispatch_us = 0;           // per dispatch, no barriers
  // Indirect dispatches (group counts {1,1,1} written by the host), no barriers / a compute-only
  // barrier after each.
  double dispatch_indirect_us = 0;
  double dispatch_indirect_barrier_us = 0;
  // Wider dispatches (wide_groups workgroups each), dependent on the one before: through a
  // barrier (BarrierScope::Full), or through a counter in memory that each workgroup waits for
  // and adds to (roofline.comp MODE 2; chained_us also for one workgroup per dispatch).
  uint32_t wide_groups = 0;
  double dispatch_barrier_wide_us = 0;
  double dispatch_chained_us = 0;
  double dispatch_chained_wide_us = 0;
  bool chained_timed_out = false;   // a counter wait gave up (the driver did not run them in order)
  // The same through the early starts' gates (roofline.comp MODE 5: relaxed atomic-load polls and
  // fences, gate.glsl; 0 where the device has no subgroups).
  double dispatch_gated_us = 0;
  double dispatch_gated_wide_us = 0;
  bool gated_timed_out = false;
  // A grid-wide barrier among grid_groups workgroups of one dispatch (roofline.comp MODE 3), per
  // barrier: what a persistent kernel would pay per stage.
  uint32_t grid_groups = 0;
  double grid_barrier_us = 0;
  double grid_barrier_fenced_us = 0;  // the same with release / acquire fences, polling by a volatile load (MODE 4)
  bool grid_timed_out = false;      // a wait gave up (not every workgroup was resident)
  double submit_us = 0;             // an empty submit + wait round trip (median)
};

// What one dispatch reading `bytes` on its own after a barrier reaches (GB/s), from the measured
// short reads (ascending sizes): the time taken as linear in the bytes between the two nearest
// sizes (past the first or last, along the nearest pair). 0 with fewer than two reads or bytes 0.
// The ceiling a decode kernel of that many bytes is held to (bench --timeline); through the gated
// reads, the ceiling of an early-started one.
double short_read_ceiling_gbps(const std::vector<ShortRead>& reads, double bytes);

// Runs the tests on ctx's device. Throws Error(Runtime) when buffers cannot be allocated or a
// submission fails.
RooflineResult measure_roofline(vk::Context& ctx, const RooflineOptions& options);

// A markdown table of the result (one row per figure).
std::string roofline_markdown(const RooflineResult& r);

}  // namespace tessera::model
