// The device-clock timeline of a decoded token (bench --timeline, GpuModelOptions::timeline):
// every workgroup of every kernel writes when it started and ended (shaders/timeline.glsl), and the
// step runs as the throughput tests run it, so kernels that overlap (the early starts' gated
// pairs) are seen overlapping, where the timestamp profile (profile.h) serializes them and adds
// each timestamp's cost. Per dispatch: the first start, the last start and the last end.
//
//   std::vector<std::vector<DispatchSpan>> steps = ...;   // GpuModel::timeline_step, per token
//   TokenTimeline t = summarize_timeline(steps, wall_us, depth);
//   std::puts(timeline_markdown(t).c_str());
//
// Units: the device clock is read as nanoseconds (NVIDIA's global timer, Mesa's CPU clock); the
// table also gives the device span next to the host's submit-to-done time as a check.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tessera::model {

struct DispatchSpan {
  std::string label;           // the recorder's label, e.g. "moe_gateup.q8act blk.3."
  uint64_t bytes = 0;          // bytes the kernel declares
  uint32_t workgroups = 0;     // workgroups dispatched (0: an indirect dispatch, count unknown)
  uint32_t recorded = 0;       // workgroups that wrote a record (0: the dispatch ran no workgroup)
  double start_us = 0;         // first workgroup start, from the step's first start
  double last_start_us = 0;    // last workgroup start
  double end_us = 0;           // last workgroup end
  uint32_t marked = 0;         // workgroups that passed the kernel's TS_MARK() (timeline.glsl)
  double first_mark_us = 0, last_mark_us = 0;  // the first and the last of those marks
  bool early_marked = false;   // some workgroup passed TS_MARK_EARLY()
  double first_early_us = 0, last_early_us = 0;
  // One workgroup's times, medians over the dispatch's workgroups: start -> end, mark -> end,
  // start -> early mark.
  double wg_us = 0, wg_tail_us = 0, wg_early_us = 0;
  double span_us() const { return end_us - start_us; }
};

// One dispatch's records as its kernel wrote them (shaders/timeline.glsl), one per workgroup:
//   words[4g]     start: the device clock's low 32 bits
//   words[4g + 1] the early mark - start + 1, words[4g + 2] the mark - start + 1 (0: none)
//   words[4g + 3] end - start                              (all four 0: no record)
struct DispatchRecords {
  std::string label;
  uint64_t bytes = 0;
  uint32_t workgroups = 0;        // dispatched (0: indirect, unknown)
  const uint32_t* words = nullptr;
  uint64_t n_records = 0;         // records to read
};

// The spans of one step's dispatches from their records, in µs from the step's first start (the
// clock read as ns; starts compared by signed 32-bit differences from the first record's, so a
// step across the low bits' wrap is ordered right).
std::vector<DispatchSpan> spans_from_records(std::span<const DispatchRecords> dispatches);

struct TimelineFamily {
  std::string family;          // kernel_family() of the labels (profile.h)
  double calls_per_token = 0;
  double us_per_call = 0;      // median span (first start -> last end) over every call
  double launch_us_per_call = 0;  // median first start -> last start: how long the workgroups took to start
  double tail_us_per_call = 0;    // median last mark -> last end, over marked calls (0: none marked)
  double bytes_per_call = 0;
  double gbps = 0;             // declared bytes / span, over all calls (1e9 B/s)
  // Declared bytes / (first early mark -> last end), over the calls with an early mark (0: none).
  // With mark_gates (timeline.glsl TS_MARK_GATES) an early-started kernel's early mark is the end
  // of its gated wait: this is its read rate from the moment its producer's output was seen.
  double early_gbps = 0;
  // What one dispatch of bytes_per_call reaches on its own after a barrier (short_read_ceiling_gbps
  // of the roofline's short reads; 0: not measured): early_gbps / ceiling_gbps is how close the
  // kernel runs to a bare read of its size.
  double ceiling_gbps = 0;
  // What resident workgroups reading bytes_per_call from the moment a gate opens reach (the same
  // line through the roofline's gated reads; 0: not measured): the ceiling of an early-started
  // kernel none of whose loads may precede its gate.
  double gated_ceiling_gbps = 0;
};

// One dispatch of the middle layer, relative to that layer's first start (medians over tokens).
struct LayerRow {
  std::string label;
  uint64_t bytes = 0;
  uint32_t workgroups = 0;
  double start_us = 0, last_start_us = 0, end_us = 0;
  bool marked = false;
  double first_mark_us = 0, last_mark_us = 0;
  bool early_marked = false;
  double first_early_us = 0, last_early_us = 0;
  double wg_us = 0, wg_tail_us = 0, wg_early_us = 0;  // DispatchSpan's, medians over tokens
};

struct TokenTimeline {
  uint32_t depth = 0;
  int tokens = 0;
  uint32_t dispatches = 0;     // per token
  uint32_t untimed = 0;        // dispatches past the timeline's regions (no records of their own)
  double device_us = 0;        // median: the step's first start -> last end, device clock
  double token_us = 0;         // median: host time from submit to done
  uint64_t bytes_per_token = 0;
  double read_gbps = 0;        // the device's read bandwidth (bench's roofline pass; 0: not measured)
  std::vector<TimelineFamily> families;  // longest us_per_call x calls first
  int layer = -1;              // the layer of `layer_rows` (the middle one; -1: no layer labels)
  double layer_us = 0;         // its first start -> the next layer's first start (median)
  std::vector<LayerRow> layer_rows;
  // GpuModelOptions::tc_phases of the run (0: none): the tensor-core attention's marks are then
  // two of its phase sums, which a note before the tables says.
  uint32_t tc_phases = 0;
};

// Summarizes timeline steps (each the spans of one decode step; all of the same recording) with
// their host times. Throws Error(Runtime) when `steps` is empty, a step has no dispatch, or the
// steps disagree on their dispatch count.
TokenTimeline summarize_timeline(std::span<const std::vector<DispatchSpan>> steps, std::span<const double> token_wall_us,
                                 uint32_t depth, uint32_t untimed = 0);

// The per-family table (GB/s also from the first early mark, as a share of read_gbps and of the
// family's ceiling_gbps where set), the token's device span against its host time, and the middle
// layer's dispatches as a waterfall (start, last start, end, GB/s, and a bar of 1 µs per character).
std::string timeline_markdown(const TokenTimeline& t);

}  // namespace tessera::model
