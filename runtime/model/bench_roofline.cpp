// Device ceilings: read bandwidth and dispatch costs. See bench_roofline.h.
#include "runtime/model/bench_roofline.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "format/error.h"
#include "runtime/vulkan/memory.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/vk_common.h"

namespace tessera::model {
namespace {

constexpr uint32_t kReadWorkgroup = 256;
constexpr uint32_t kReadUnroll = 8;
constexpr uint32_t kTinyWorkgroup = 64;
constexpr uint32_t kWideGroups = 256;  // workgroups per dispatch in the "wide" dependency tests
constexpr uint32_t kGridGroups = 128;  // the grid barrier test: fewer than the 132 SMs of an H100
constexpr uint32_t kGridRounds = 256;  // grid barriers timed per dispatch
constexpr uint32_t kFillWord = 0x3f800001u;  // what the read buffer holds (never zeros)
constexpr uint32_t kNever = 0xdeadbeefu;      // no fold of kFillWord words equals this

// Mirrors the push-constant block of shaders/roofline.comp.
struct RooflineArgs {
  uint32_t n_vec4 = 0;
  uint32_t never = kNever;
  uint32_t pad0 = 0, pad1 = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

const vk::Pipeline& roofline_pipeline(vk::Context& ctx, int mode) {
  vk::PipelineDesc desc;
  static const char* const kNames[] = {"roofline.read", "roofline.tiny", "roofline.chained",
                                       "roofline.grid", "roofline.grid_fenced", "roofline.gated",
                                       "roofline.gated_read", "roofline.gated_broadcast"};
  desc.name = kNames[mode];
  desc.file = "roofline.comp";
  const bool reads = mode == 0 || mode >= 6;
  desc.defines = {{"MODE", std::to_string(mode)},
                  {"WG_SIZE", std::to_string(reads ? kReadWorkgroup : kTinyWorkgroup)},
                  {"UNROLL", std::to_string(kReadUnroll)}};
  desc.num_buffers = mode >= 6 ? 4 : 2;
  desc.push_bytes = sizeof(RooflineArgs);
  desc.full_subgroups = mode >= 5;  // gate.glsl indexes subgroups
  return ctx.pipeline(desc);
}

// Median wall time of `runs` submissions of what `rec` holds (after one warm-up).
double median_run_us(vk::CommandRecorder& rec, int runs) {
  rec.run();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const double t0 = now_us();
    rec.run();
    t.push_back(now_us() - t0);
  }
  return median(t);
}

uint64_t read_buffer_bytes(const vk::DeviceInfo& info, uint64_t requested) {
  uint64_t bytes = requested ? requested : (info.type == VK_PHYSICAL_DEVICE_TYPE_CPU ? 64ull << 20 : 1ull << 30);
  bytes = std::min<uint64_t>(bytes, info.max_storage_buffer_range);
  bytes = std::min<uint64_t>(bytes, info.max_memory_allocation_size);
  bytes = std::min<uint64_t>(bytes, info.device_local_bytes() / 4);
  bytes = std::min<uint64_t>(bytes, uint64_t(UINT32_MAX) * 16);  // n_vec4 is a 32-bit count
  bytes = bytes / (16 * kReadWorkgroup * kReadUnroll) * (16 * kReadWorkgroup * kReadUnroll);
  if (bytes == 0) runtime_error("roofline: the device's buffer limits leave no room for the read test");
  return bytes;
}

// Short reads: for each size S (4 .. 32 MiB), min(regions of S in the buffer's first half,
// runs + 1) dispatches of the read kernel, at least 4, with a compute-only barrier before each,
// dispatch p reading region p of that half (the large passes ended in the second, whose tail the
// cache may still hold); the first is a warm-up. GPU timestamps.
std::vector<ShortRead> measure_short_reads(vk::Context& ctx, const vk::Pipeline& read, const vk::Buffer& src,
                                           const vk::Buffer& dst, uint64_t buffer_bytes, int runs) {
  std::vector<ShortRead> out;
  for (uint64_t size = 4ull << 20; size <= 32ull << 20; size *= 2) {
    const uint64_t regions = std::min<uint64_t>(buffer_bytes / 2 / size, uint64_t(runs) + 1);
    if (regions < 4) break;
    const vk::GroupCounts groups = vk::split_workgroups(size / 16 / (kReadWorkgroup * kReadUnroll), ctx.info());
    RooflineArgs args;
    args.n_vec4 = uint32_t(size / 16);
    // The decode step's barriers (compute only), so that each dispatch is timed as the profile
    // times a decode kernel.
    vk::CommandRecorder timed(ctx, vk::RecorderOptions{.timestamps = true, .barrier_scope = vk::BarrierScope::ComputeOnly});
    timed.begin();
    for (uint64_t p = 0; p < regions; ++p) {
      timed.barrier();
      const vk::BufferSlice bufs[2] = {src.slice(p * size, size), dst.whole()};
      timed.dispatch(read, bufs, args, groups.x, groups.y, 1, "roofline.read_short", size);
    }
    timed.end();
    timed.run();
    const std::vector<vk::DispatchTiming> times = timed.timings();
    if (times.size() != regions) break;
    std::vector<double> us;
    for (uint64_t p = 1; p < regions; ++p) us.push_back(times[p].microseconds);
    ShortRead s;
    s.bytes = size;
    s.us = median(us);
    s.gbps = double(size) / (s.us * 1e3);
    out.push_back(s);
  }
  return out;
}

// Gated reads (roofline.comp MODE 6): rounds of a producer that opens a gate after kGatedSpinNs
// and a consumer of S / 32 KiB workgroups recorded right after it with no barrier, each round
// reading its own region of S. The sizes take disjoint parts of [half / 2, half) of the buffer,
// away from the short reads' regions and from the last bytes of the large passes. Device clock;
// subgroups.
constexpr uint32_t kGatedSpinNs = 20000;  // long enough for the consumer's workgroups to get resident

// One size's rounds (the first a warm-up) of `mode` (6, or 7: the broadcast) with the producer's
// opening `kind` (pad1) and the consumer's `poll` (its pad0):
// the medians of the rounds' times from the opening (first seen, last seen, last end), in µs.
struct GatedRounds {
  double first_seen = 0, last_seen = 0, end = 0;
  bool gave_up = false;  // a wait gave up or a round's words were not written
  bool timed = false;    // at least one round after the warm-up
};

GatedRounds gated_rounds(vk::Context& ctx, const vk::Buffer& src, const vk::Buffer& dst, uint64_t area,
                         uint64_t size, uint64_t rounds, uint32_t kind, uint32_t poll, int mode = 6) {
  const vk::Pipeline& gated = roofline_pipeline(ctx, mode);
  vk::MemoryPool pool(ctx.device(), vk::MemoryKind::DeviceLocal, 1ull << 20);
  vk::MemoryPool host_pool(ctx.device(), vk::MemoryKind::Host, 1ull << 20);
  // Words 0-4: the gate, the opening's clock, the first seen, the last end, the last seen; 8-9:
  // gate.glsl's error words.
  constexpr uint64_t kWords = 48;
  vk::Buffer words = pool.create_buffer(kWords, "roofline gated-read words");
  vk::Buffer back = host_pool.create_buffer(rounds * kWords, "roofline gated-read results");
  RooflineArgs consumer, producer;
  consumer.n_vec4 = uint32_t(size / 16);
  producer.pad0 = kGatedSpinNs;
  producer.pad1 = kind;
  consumer.pad0 = poll;
  const vk::GroupCounts groups = vk::split_workgroups(size / 16 / (kReadWorkgroup * kReadUnroll), ctx.info());
  vk::CommandRecorder rec(ctx);
  rec.begin();
  for (uint64_t p = 0; p < rounds; ++p) {
    rec.fill(words.whole(), 0);
    rec.fill(words.slice(8, 4), 0xFFFFFFFFu);  // the first seen (atomicMin)
    rec.barrier();
    const vk::BufferSlice bufs[4] = {src.slice(area + p * size, size), dst.whole(), words.slice(0, 32),
                                     words.slice(32, 16)};
    rec.dispatch(gated, bufs, producer, 1, 1, 1, "roofline.gated_read.open", 0);
    rec.dispatch(gated, bufs, consumer, groups.x, groups.y, 1, "roofline.gated_read", size);
    rec.barrier();
    rec.copy(words.whole(), back.slice(p * kWords, kWords));
    rec.barrier();
  }
  rec.end();
  rec.run();
  GatedRounds g;
  std::vector<double> first, last, end;
  for (uint64_t p = 1; p < rounds; ++p) {
    uint32_t w[kWords / 4];
    std::memcpy(w, back.mapped() + p * kWords, sizeof w);
    if (w[8] != 0 || w[0] != 1 || w[2] == 0xFFFFFFFFu || w[3] < w[2] || w[4] < w[2]) {
      g.gave_up = true;
      continue;
    }
    first.push_back(w[2] / 1e3);  // device clock ticks read as ns
    last.push_back(w[4] / 1e3);
    end.push_back(w[3] / 1e3);
  }
  if (!first.empty()) {
    g.timed = true;
    g.first_seen = median(first);
    g.last_seen = median(last);
    g.end = median(end);
  }
  return g;
}

// The gated reads of 16, 8 and 4 MiB (as gate.glsl opens a gate), runs + 1 rounds each (at most
// the regions of S that its part of the buffer holds, at least 2), ascending; and the hops of
// the three openings and of the volatile polls (4 MiB rounds).
void measure_gated_reads(vk::Context& ctx, const vk::Buffer& src, const vk::Buffer& dst, uint64_t buffer_bytes,
                         int runs, RooflineResult& r) {
  const uint64_t half = buffer_bytes / 2, part = half / 2 / 3 / (1ull << 20) * (1ull << 20);
  static constexpr uint64_t kSizes[] = {16ull << 20, 8ull << 20, 4ull << 20};
  for (size_t k = 0; k < 3; ++k) {
    const uint64_t size = kSizes[k], area = half / 2 + k * part;
    const uint64_t rounds = std::min<uint64_t>(part / size, uint64_t(runs) + 1);
    if (rounds < 2) continue;
    const GatedRounds g = gated_rounds(ctx, src, dst, area, size, rounds, 1, 0);
    r.gated_read_gave_up = r.gated_read_gave_up || g.gave_up;
    if (!g.timed) continue;
    ShortRead s;
    s.bytes = size;
    s.us = std::max(1e-3, g.end - g.first_seen);
    s.open_us = g.first_seen;
    s.open_last_us = g.last_seen;
    s.gbps = double(size) / (s.us * 1e3);
    r.gated_reads.insert(r.gated_reads.begin(), s);
    if (size != 4ull << 20) continue;
    for (uint32_t i = 0; i < 4; ++i) {  // gate_hops' order: openings 1, 2, 3 polled by atomic loads; 1 by volatile loads
      const GatedRounds h = i == 0 ? g : gated_rounds(ctx, src, dst, area, size, rounds, i < 3 ? i + 1 : 1, i < 3 ? 0 : 1);
      r.gated_read_gave_up = r.gated_read_gave_up || h.gave_up;
      if (h.timed) r.gate_hops[i] = {h.first_seen, h.last_seen};
    }
    // The broadcast: as many workgroups as an 8 MiB read (256: the early gate-up's 240) staging
    // the same 8 KiB from the L2.
    for (uint32_t c = 0; c < 2; ++c) {  // as the staging reads (8 words an invocation), then coalesced
      const GatedRounds b = gated_rounds(ctx, src, dst, area, 8ull << 20 <= part ? 8ull << 20 : size, rounds, 1, 2 * c, 7);
      r.gated_read_gave_up = r.gated_read_gave_up || b.gave_up;
      if (b.timed) r.gated_broadcast[c] = {b.first_seen, b.end};
    }
  }
}

}  // namespace

RooflineResult measure_roofline(vk::Context& ctx, const RooflineOptions& options) {
  if (options.repetitions < 1) usage_error("roofline: repetitions must be >= 1, got ", options.repetitions);
  const vk::DeviceInfo& info = ctx.info();
  RooflineResult r;
  r.read_bytes = read_buffer_bytes(info, options.read_bytes);

  vk::MemoryPool pool(ctx.device(), vk::MemoryKind::DeviceLocal, 64ull << 20);
  vk::Buffer src = pool.create_buffer(r.read_bytes, "roofline read buffer");
  vk::Buffer dst = pool.create_buffer(4096, "roofline sink");
  const vk::Pipeline& read = roofline_pipeline(ctx, 0);
  const vk::Pipeline& tiny = roofline_pipeline(ctx, 1);
  const vk::BufferSlice bufs[2] = {src.whole(), dst.whole()};
  RooflineArgs args;
  args.n_vec4 = uint32_t(r.read_bytes / 16);
  const vk::GroupCounts groups = vk::split_workgroups(r.read_bytes / 16 / (kReadWorkgroup * kReadUnroll), info);

  // Fill the buffer (a non-zero word), then time passes over it.
  {
    vk::CommandRecorder fill(ctx);
    fill.begin();
    fill.fill(src.whole(), kFillWord);
    fill.fill(dst.whole(), 0);
    fill.end();
    fill.run();
  }
  const int runs = options.repetitions;
  const uint32_t passes = uint32_t(runs) + 1;  // the first pass is the warm-up
  vk::CommandRecorder timed(ctx, vk::RecorderOptions{.timestamps = true});
  timed.begin();
  for (uint32_t p = 0; p < passes; ++p) {
    timed.dispatch(read, bufs, args, groups.x, groups.y, 1, "roofline.read", r.read_bytes);
    timed.barrier();
  }
  timed.end();
  timed.run();
  const std::vector<vk::DispatchTiming> times = timed.timings();
  if (times.size() == passes) {
    std::vector<double> us;
    for (uint32_t p = 1; p < passes; ++p) us.push_back(times[p].microseconds);
    r.read_us = median(us);
    r.gpu_timestamps = true;
  } else {
    // No timestamps on this queue: host clock around a submission of one pass, less an empty one.
    vk::CommandRecorder empty(ctx), one(ctx);
    empty.begin();
    empty.end();
    one.begin();
    one.dispatch(read, bufs, args, groups.x, groups.y, 1, "roofline.read", r.read_bytes);
    one.end();
    r.read_us = std::max(1e-3, median_run_us(one, runs) - median_run_us(empty, runs));
  }
  r.read_gbps = double(r.read_bytes) / (r.read_us * 1e3);
  if (r.gpu_timestamps && (!options.read_only || options.short_reads))
    r.short_reads = measure_short_reads(ctx, read, src, dst, r.read_bytes, runs);
  if ((!options.read_only || options.short_reads) && ctx.pipelines().use_subgroup() &&
      ctx.device().enabled().device_clock)
    measure_gated_reads(ctx, src, dst, r.read_bytes, runs, r);
  if (options.read_only) return r;

  // Dispatch costs: N tiny dispatches with and without barriers, less the empty round trip.
  const uint32_t n = std::max<uint32_t>(options.dispatches, 1);
  r.dispatches = n;
  RooflineArgs tiny_args;
  vk::CommandRecorder empty(ctx), without(ctx);
  empty.begin();
  empty.end();
  without.begin();
  for (uint32_t i = 0; i < n; ++i) without.dispatch(tiny, bufs, tiny_args, 1, 1, 1, "roofline.tiny", 4);
  without.end();
  r.submit_us = median_run_us(empty, runs);
  r.dispatch_us = std::max(0.0, (median_run_us(without, runs) - r.submit_us) / n);
  // The same with a barrier after each dispatch of `groups` workgroups, per barrier scope.
  const auto with_barriers_us = [&](vk::BarrierScope scope, uint32_t groups) {
    vk::CommandRecorder rec(ctx, vk::RecorderOptions{.barrier_scope = scope});
    rec.begin();
    for (uint32_t i = 0; i < n; ++i) {
      rec.dispatch(tiny, bufs, tiny_args, groups, 1, 1, "roofline.tiny", 4);
      rec.barrier();
    }
    rec.end();
    return std::max(0.0, (median_run_us(rec, runs) - r.submit_us) / n);
  };
  r.dispatch_barrier_us = with_barriers_us(vk::BarrierScope::Full, 1);
  r.dispatch_barrier_compute_us = with_barriers_us(vk::BarrierScope::Compute, 1);
  r.dispatch_barrier_compute_only_us = with_barriers_us(vk::BarrierScope::ComputeOnly, 1);
  r.dispatch_barrier_execution_only_us = with_barriers_us(vk::BarrierScope::ExecutionOnly, 1);

  // Indirect dispatches (the decode attention's kind), counts written by the host.
  vk::MemoryPool host_pool(ctx.device(), vk::MemoryKind::Host, 1ull << 20);
  vk::Buffer indirect = host_pool.create_buffer(16, "roofline indirect counts");
  const uint32_t ones[4] = {1, 1, 1, 0};
  indirect.write(0, ones, sizeof ones);
  const auto indirect_us = [&](bool barriers) {
    vk::CommandRecorder rec(ctx, vk::RecorderOptions{.barrier_scope = vk::BarrierScope::ComputeOnly});
    rec.begin();
    for (uint32_t i = 0; i < n; ++i) {
      rec.dispatch_indirect(tiny, bufs, &tiny_args, sizeof tiny_args, indirect.slice(0, 12), "roofline.tiny", 4);
      if (barriers) rec.barrier();
    }
    rec.end();
    return std::max(0.0, (median_run_us(rec, runs) - r.submit_us) / n);
  };
  r.dispatch_indirect_us = indirect_us(false);
  r.dispatch_indirect_barrier_us = indirect_us(true);

  // Dependent dispatches of kWideGroups workgroups: through barriers, then through counters.
  r.wide_groups = std::min<uint32_t>(kWideGroups, info.max_workgroup_count[0]);
  r.dispatch_barrier_wide_us = with_barriers_us(vk::BarrierScope::Full, r.wide_groups);
  vk::Buffer counters = pool.create_buffer(uint64_t(n + 1) * 4, "roofline counters");
  vk::Buffer flag = host_pool.create_buffer(16, "roofline chain flag");
  const vk::Pipeline& chained = roofline_pipeline(ctx, 2);
  const vk::BufferSlice cbufs[2] = {counters.whole(), flag.whole()};
  // Median wall time of a recording that zeroes the counters and the flag, then `record`s its
  // dispatches; *timed_out |= the flag a bounded wait sets.
  const auto counted_run_us = [&](const auto& record, bool* timed_out) {
    vk::CommandRecorder rec(ctx);
    rec.begin();
    rec.fill(counters.whole(), 0);
    rec.fill(flag.whole(), 0);
    rec.barrier();
    record(rec);
    rec.end();
    const double us = median_run_us(rec, runs);
    uint32_t word = 0;
    std::memcpy(&word, flag.mapped(), 4);
    *timed_out = *timed_out || word != 0;
    return us;
  };
  const auto chained_us = [&](uint32_t groups) {
    const double us = counted_run_us(
        [&](vk::CommandRecorder& rec) {
          for (uint32_t i = 0; i < n; ++i) {
            RooflineArgs a;
            a.n_vec4 = i;                   // this dispatch's counter
            a.never = i > 0 ? groups : 0u;  // what the one before adds up to
            rec.dispatch(chained, cbufs, a, groups, 1, 1, "roofline.chained", 4);
          }
        },
        &r.chained_timed_out);
    return std::max(0.0, (us - r.submit_us) / n);
  };
  r.dispatch_chained_us = chained_us(1);
  r.dispatch_chained_wide_us = chained_us(r.wide_groups);
  // The same through the early starts' gates (gate.glsl: atomic-load polls), where they run.
  if (ctx.pipelines().use_subgroup()) {
    const vk::Pipeline& gated = roofline_pipeline(ctx, 5);
    const auto gated_us = [&](uint32_t groups) {
      const double us = counted_run_us(
          [&](vk::CommandRecorder& rec) {
            for (uint32_t i = 0; i < n; ++i) {
              RooflineArgs a;
              a.n_vec4 = i;
              a.never = groups;
              rec.dispatch(gated, cbufs, a, groups, 1, 1, "roofline.gated", 4);
            }
          },
          &r.gated_timed_out);
      return std::max(0.0, (us - r.submit_us) / n);
    };
    r.dispatch_gated_us = gated_us(1);
    r.dispatch_gated_wide_us = gated_us(r.wide_groups);
  }

  // A grid-wide barrier among resident workgroups (one per SM on an H100: 128 < 132): rounds of
  // it inside one dispatch, less the same dispatch with no rounds, per round.
  r.grid_groups = std::min<uint32_t>(kGridGroups, info.max_workgroup_count[0]);
  const auto grid_run_us = [&](int mode, uint32_t rounds) {
    const vk::Pipeline& grid = roofline_pipeline(ctx, mode);
    return counted_run_us(
        [&](vk::CommandRecorder& rec) {
          RooflineArgs a;
          a.n_vec4 = rounds;
          a.never = r.grid_groups;
          rec.dispatch(grid, cbufs, a, r.grid_groups, 1, 1, "roofline.grid", 4);
        },
        &r.grid_timed_out);
  };
  // (A CPU device runs it as a software emulation, milliseconds a round: a few rounds say enough.)
  const uint32_t rounds = std::min<uint32_t>(n, info.type == VK_PHYSICAL_DEVICE_TYPE_CPU ? 4u : kGridRounds);
  const double base_us = grid_run_us(3, 0);
  r.grid_barrier_us = std::max(0.0, (grid_run_us(3, rounds) - base_us) / rounds);
  r.grid_barrier_fenced_us = std::max(0.0, (grid_run_us(4, rounds) - base_us) / rounds);
  return r;
}

double short_read_ceiling_gbps(const std::vector<ShortRead>& reads, double bytes) {
  if (reads.size() < 2 || bytes <= 0) return 0;
  size_t i = 1;  // the pair (i - 1, i): the first whose upper size reaches `bytes`, else the last
  while (i + 1 < reads.size() && double(reads[i].bytes) < bytes) ++i;
  const ShortRead &a = reads[i - 1], &b = reads[i];
  const double slope = (b.us - a.us) / (double(b.bytes) - double(a.bytes));  // µs per byte
  const double us = a.us + slope * (bytes - double(a.bytes));
  return us > 0 ? bytes / (us * 1e3) : 0;
}

std::string roofline_markdown(const RooflineResult& r) {
  std::string s = "| figure | value |\n|---|---|\n";
  char line[384];
  std::snprintf(line, sizeof line, "| read bandwidth, 16-byte loads, %s buffer | %.1f GB/s (%.1f µs per pass, %s) |\n",
                vk::format_bytes(r.read_bytes).c_str(), r.read_gbps, r.read_us,
                r.gpu_timestamps ? "GPU timestamps" : "host clock");
  s += line;
  if (!r.short_reads.empty()) {
    std::string sizes, rates;
    for (const ShortRead& q : r.short_reads) {
      char one[96];
      sizes += (sizes.empty() ? "" : " / ") + vk::format_bytes(q.bytes);
      std::snprintf(one, sizeof one, "%s%.1f GB/s (%.0f %%, %.2f µs)", rates.empty() ? "" : " / ", q.gbps,
                    100.0 * q.gbps / r.read_gbps, q.us);
      rates += one;
    }
    s += "| one dispatch reading " + sizes + " after a barrier, bytes not cached | " + rates + " |\n";
  }
  if (!r.gated_reads.empty() || r.gated_read_gave_up) {
    std::string sizes, rates;
    for (const ShortRead& q : r.gated_reads) {
      char one[128];
      sizes += (sizes.empty() ? "" : " / ") + vk::format_bytes(q.bytes);
      std::snprintf(one, sizeof one, "%s%.1f GB/s (%.0f %%, %.2f µs; seen %.2f - %.2f µs after the opening)",
                    rates.empty() ? "" : " / ", q.gbps, 100.0 * q.gbps / r.read_gbps, q.us, q.open_us, q.open_last_us);
      rates += one;
    }
    s += "| resident workgroups reading " + sizes +
         " from the moment their gate opens (device clock, first seen -> last end), bytes not cached | " + rates +
         (r.gated_read_gave_up ? " (a wait gave up)" : "") + " |\n";
  }
  if (r.gate_hops[0].first_us > 0) {
    std::snprintf(line, sizeof line,
                  "| a gate's hop, opening -> first / last waiting workgroup to see it (fence + add as gate.glsl; "
                  "release add; add, no fence; gate.glsl's opening, volatile polls) | %.2f / %.2f; %.2f / %.2f; "
                  "%.2f / %.2f; %.2f / %.2f µs |\n",
                  r.gate_hops[0].first_us, r.gate_hops[0].last_us, r.gate_hops[1].first_us, r.gate_hops[1].last_us,
                  r.gate_hops[2].first_us, r.gate_hops[2].last_us, r.gate_hops[3].first_us, r.gate_hops[3].last_us);
    s += line;
  }
  if (r.gated_broadcast[0].last_us > 0) {
    std::snprintf(line, sizeof line,
                  "| after a gate, every waiting workgroup reading the same 8 KiB from the L2, 64 invocations x 8 "
                  "words (the early gate-up's staging of x) / coalesced: opening -> first seen / last end | %.2f / %.2f; "
                  "%.2f / %.2f µs |\n",
                  r.gated_broadcast[0].first_us, r.gated_broadcast[0].last_us, r.gated_broadcast[1].first_us,
                  r.gated_broadcast[1].last_us);
    s += line;
  }
  if (r.dispatches) {
    std::snprintf(line, sizeof line, "| dispatch cost with a barrier after each (%u in one submit) | %.3f µs each |\n",
                  r.dispatches, r.dispatch_barrier_us);
    s += line;
    std::snprintf(line, sizeof line, "| the same, compute-scoped barriers (--tune barrier=1 / 2 / 3) | %.3f / %.3f / %.3f µs each |\n",
                  r.dispatch_barrier_compute_us, r.dispatch_barrier_compute_only_us, r.dispatch_barrier_execution_only_us);
    s += line;
    std::snprintf(line, sizeof line, "| the same, %u workgroups per dispatch | %.3f µs each |\n", r.wide_groups,
                  r.dispatch_barrier_wide_us);
    s += line;
    std::snprintf(line, sizeof line,
                  "| dependent dispatches chained by a counter, no barrier (1 / %u workgroups) | %.3f / %.3f µs each%s |\n",
                  r.wide_groups, r.dispatch_chained_us, r.dispatch_chained_wide_us,
                  r.chained_timed_out ? " (a wait timed out: not run in order)" : "");
    s += line;
    if (r.dispatch_gated_us > 0 || r.dispatch_gated_wide_us > 0 || r.gated_timed_out) {
      std::snprintf(line, sizeof line,
                    "| the same chained by gates (atomic-load polls, gate.glsl; 1 / %u workgroups) | %.3f / %.3f µs each%s |\n",
                    r.wide_groups, r.dispatch_gated_us, r.dispatch_gated_wide_us,
                    r.gated_timed_out ? " (a wait gave up: not run in order)" : "");
      s += line;
    }
    std::snprintf(line, sizeof line,
                  "| grid-wide barrier among %u resident workgroups, inside one dispatch (atomic poll / fenced, load poll) | %.3f / %.3f µs each%s |\n",
                  r.grid_groups, r.grid_barrier_us, r.grid_barrier_fenced_us, r.grid_timed_out ? " (a wait timed out: not all resident)" : "");
    s += line;
    std::snprintf(line, sizeof line, "| dispatch cost without barriers (%u in one submit) | %.3f µs each |\n",
                  r.dispatches, r.dispatch_us);
    s += line;
    std::snprintf(line, sizeof line,
                  "| indirect dispatches (host-written counts), no barrier / compute-only barriers | %.3f / %.3f µs each |\n",
                  r.dispatch_indirect_us, r.dispatch_indirect_barrier_us);
    s += line;
    std::snprintf(line, sizeof line, "| empty submit + wait round trip | %.1f µs |\n", r.submit_us);
    s += line;
  }
  return s;
}

}  // namespace tessera::model
