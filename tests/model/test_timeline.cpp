// The device-clock timeline (bench --timeline): the summary's arithmetic on made-up spans, and on
// lavapipe a model whose kernels record their workgroups: every workgroup of every dispatch
// recorded, spans in order and in the host's time, and the same bits and tokens as without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/tsr.h"
#include "runtime/model/bench_roofline.h"
#include "runtime/model/gpu_model.h"
#include "runtime/model/timeline.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "runtime/vulkan/memory.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

testfx::ModelFixture fixture("timeline");

model::DispatchSpan span(std::string label, uint64_t bytes, uint32_t wgs, double start, double last, double end) {
  model::DispatchSpan d;
  d.label = std::move(label);
  d.bytes = bytes;
  d.workgroups = wgs;
  d.recorded = wgs;
  d.start_us = start;
  d.last_start_us = last;
  d.end_us = end;
  return d;
}

TEST(Timeline, SummaryPerFamilyAndTheMiddleLayer) {
  // Two tokens, three layers of two dispatches (a matvec, then a gate-up beside it), and a sampler.
  auto token = [](double skew) {
    std::vector<model::DispatchSpan> s;
    for (int l = 0; l < 3; ++l) {
      const double o = 20.0 * l + skew;
      s.push_back(span(cat("matvec.q4_0 blk.", l, ".attn_q_a.weight"), 4000, 8, o, o + 1, o + 8));
      s.push_back(span(cat("moe_gateup blk.", l, "."), 10000, 16, o + 6, o + 7, o + 16));
      s.back().marked = 16;  // its prologue ends at o + 9 .. o + 12
      s.back().first_mark_us = o + 9;
      s.back().last_mark_us = o + 12;
    }
    s.push_back(span("sample", 100, 1, 60 + skew, 60 + skew, 61 + skew));
    return s;
  };
  const std::vector<std::vector<model::DispatchSpan>> steps = {token(0), token(0)};
  const std::vector<double> wall = {70, 80};
  const model::TokenTimeline t = model::summarize_timeline(steps, wall, 9);
  EXPECT_EQ(t.depth, 9u);
  EXPECT_EQ(t.tokens, 2);
  EXPECT_EQ(t.dispatches, 7u);
  EXPECT_DOUBLE_EQ(t.device_us, 61.0);
  EXPECT_DOUBLE_EQ(t.token_us, 75.0);
  EXPECT_EQ(t.bytes_per_token, 3u * 14000u + 100u);
  ASSERT_EQ(t.families.size(), 3u);
  EXPECT_EQ(t.families[0].family, "moe_gateup");  // 3 calls x 10 µs
  EXPECT_DOUBLE_EQ(t.families[0].us_per_call, 10.0);
  EXPECT_DOUBLE_EQ(t.families[0].launch_us_per_call, 1.0);
  EXPECT_DOUBLE_EQ(t.families[0].gbps, 10000 / (10.0 * 1e3));
  EXPECT_DOUBLE_EQ(t.families[0].tail_us_per_call, 4.0);
  EXPECT_EQ(t.families[1].family, "matvec.q4_0");
  EXPECT_DOUBLE_EQ(t.families[1].us_per_call, 8.0);
  EXPECT_DOUBLE_EQ(t.families[1].tail_us_per_call, 0.0);  // no marks
  EXPECT_EQ(t.families[2].family, "sample");
  // The middle layer of 0..2 is 1: both dispatches relative to its first start; 20 µs to layer 2.
  EXPECT_EQ(t.layer, 1);
  EXPECT_DOUBLE_EQ(t.layer_us, 20.0);
  ASSERT_EQ(t.layer_rows.size(), 2u);
  EXPECT_EQ(t.layer_rows[1].label, "moe_gateup blk.1.");
  EXPECT_DOUBLE_EQ(t.layer_rows[1].start_us, 6.0);
  EXPECT_DOUBLE_EQ(t.layer_rows[1].last_start_us, 7.0);
  EXPECT_DOUBLE_EQ(t.layer_rows[1].end_us, 16.0);
  EXPECT_TRUE(t.layer_rows[1].marked);
  EXPECT_DOUBLE_EQ(t.layer_rows[1].first_mark_us, 9.0);
  EXPECT_DOUBLE_EQ(t.layer_rows[1].last_mark_us, 12.0);
  EXPECT_FALSE(t.layer_rows[0].marked);
  const std::string md = model::timeline_markdown(t);
  EXPECT_NE(md.find("| moe_gateup | 3 | 10.00 | 1.00 | 4.00 | 10000 | 1.000 |"), std::string::npos) << md;
  EXPECT_NE(md.find("layer 1, µs from its first start"), std::string::npos) << md;
  EXPECT_NE(md.find("| moe_gateup blk.1. | 16 | 6.00 | 7.00 | - | 9.00 - 12.00 | 16.00 | -, 0.00, 0.00 | 1.0 |"), std::string::npos) << md;
  EXPECT_EQ(md.find("tc_phases"), std::string::npos) << md;
  model::TokenTimeline phased = t;
  phased.tc_phases = 2;  // the layer table says what the tensor-core attention's marks hold
  EXPECT_NE(model::timeline_markdown(phased).find("early mark = the time in its blocks' statistics and P, its mark = the time in its blocks' O products"),
            std::string::npos);
}

// The read rate from the first early mark (with mark_gates: the end of an early-started kernel's
// gated wait) to the end, per family, over the calls that have one, and as a share of the
// device's read bandwidth where the bench measured it.
TEST(Timeline, RateFromTheEarlyMark) {
  std::vector<model::DispatchSpan> s;
  for (int l = 0; l < 2; ++l) {
    const double o = 20.0 * l;
    s.push_back(span(cat("moe_down blk.", l, "."), 9000, 8, o, o + 1, o + 10));
    s.back().early_marked = true;  // the gate seen at o + 4 .. o + 6: 6 µs to the end
    s.back().first_early_us = o + 4;
    s.back().last_early_us = o + 6;
  }
  s.push_back(span("sample", 100, 1, 50, 50, 51));  // no early mark
  const std::vector<std::vector<model::DispatchSpan>> steps = {s};
  const std::vector<double> wall = {60};
  model::TokenTimeline t = model::summarize_timeline(steps, wall, 0);
  ASSERT_EQ(t.families.size(), 2u);
  EXPECT_EQ(t.families[0].family, "moe_down");
  EXPECT_DOUBLE_EQ(t.families[0].gbps, 9000 / (10.0 * 1e3));
  EXPECT_DOUBLE_EQ(t.families[0].early_gbps, 9000 / (6.0 * 1e3));
  EXPECT_DOUBLE_EQ(t.families[1].early_gbps, 0.0);
  std::string md = model::timeline_markdown(t);
  EXPECT_NE(md.find("| moe_down | 2 | 10.00 | 1.00 | - | 9000 | 0.900 | 1.500 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| sample | 1 | 1.00 | 0.00 | - | 100 | 0.100 | - |"), std::string::npos) << md;
  t.read_gbps = 3.0;
  md = model::timeline_markdown(t);
  EXPECT_NE(md.find("GB/s from the first early mark (% of the read bandwidth)"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0.900 | 1.500 (50 %) |"), std::string::npos) << md;
  t.families[0].ceiling_gbps = 2.0;  // a bare read of its 9000 bytes: 2 GB/s
  md = model::timeline_markdown(t);
  EXPECT_NE(md.find("GB/s from the first early mark (% of the read bandwidth; of a bare read of its size)"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| 0.900 | 1.500 (50 %; 75 % of 2.000) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0.100 | - |"), std::string::npos) << md;  // no early mark: no rate, no ceiling
  t.families[0].gated_ceiling_gbps = 3.0;  // resident workgroups reading 9000 bytes from a gate: 3 GB/s
  md = model::timeline_markdown(t);
  EXPECT_NE(md.find("(% of the read bandwidth; of a bare read of its size, of a gated read of its size)"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| 0.900 | 1.500 (50 %; 75 % of 2.000, 50 % of 3.000) |"), std::string::npos) << md;
  t.families[0].gated_ceiling_gbps = 0;
  t.read_gbps = 0;
  md = model::timeline_markdown(t);
  EXPECT_NE(md.find("| 0.900 | 1.500 (75 % of 2.000) |"), std::string::npos) << md;
}

// The ceiling of a read of any size from the measured short reads: time linear in the bytes
// between the nearest two sizes, along the nearest pair outside them; nothing from fewer than two.
TEST(Timeline, ShortReadCeiling) {
  using model::ShortRead;
  const std::vector<ShortRead> reads = {{4000, 4.0, 1.0}, {8000, 5.0, 1.6}, {16000, 7.0, 2.29}};
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps(reads, 8000), 8000 / 5.0e3);    // a measured size
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps(reads, 6000), 6000 / 4.5e3);    // between 4000 and 8000
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps(reads, 12000), 12000 / 6.0e3);  // between 8000 and 16000
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps(reads, 32000), 32000 / 11.0e3); // past the last pair
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps(reads, 2000), 2000 / 3.5e3);    // before the first pair
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps(reads, 0), 0.0);
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps({reads[0]}, 4000), 0.0);       // one read: no line
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps({}, 4000), 0.0);
  // A line that reaches zero time before the size asked: no ceiling rather than a negative one.
  EXPECT_DOUBLE_EQ(model::short_read_ceiling_gbps({{4000, 1.0, 4.0}, {8000, 5.0, 1.6}}, 1000), 0.0);
}

// Records as the kernels write them: the clock's low 32 bits wrap between the two dispatches, a
// workgroup without a record, marks on some workgroups only.
TEST(Timeline, SpansFromRecordsAcrossTheClocksWrap) {
  const uint32_t base = 0xFFFFF000u;  // 4096 ns before the low 32 bits wrap
  const std::vector<uint32_t> a = {
      base + 1000, 0, 0, 3000,                       // wg 0: 1000 .. 4000 ns, no marks
      base + 0, 101, 2001, 5000,                     // wg 1: 0 .. 5000, early mark at 100, mark at 2000
      0, 0, 0, 0};                                   // wg 2: no record
  const std::vector<uint32_t> b = {
      base + 6000, 0, 501, 1000,                     // 6000 .. 7000 (past the wrap), mark at 6500
      base + 5500, 0, 0, 2500};                      // 5500 .. 8000
  const std::vector<model::DispatchRecords> in = {{"gateup blk.0.", 100, 3, a.data(), 3},
                                                  {"down blk.0.", 200, 2, b.data(), 2}};
  const std::vector<model::DispatchSpan> s = model::spans_from_records(in);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].label, "gateup blk.0.");
  EXPECT_EQ(s[0].workgroups, 3u);
  EXPECT_EQ(s[0].recorded, 2u);
  EXPECT_DOUBLE_EQ(s[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(s[0].last_start_us, 1.0);
  EXPECT_DOUBLE_EQ(s[0].end_us, 5.0);
  EXPECT_EQ(s[0].marked, 1u);
  EXPECT_TRUE(s[0].early_marked);
  EXPECT_DOUBLE_EQ(s[0].first_early_us, 0.1);
  EXPECT_DOUBLE_EQ(s[0].first_mark_us, 2.0);
  EXPECT_DOUBLE_EQ(s[0].last_mark_us, 2.0);
  EXPECT_DOUBLE_EQ(s[0].wg_us, 4.0);      // the median of 3000 and 5000 ns
  EXPECT_DOUBLE_EQ(s[1].start_us, 5.5);   // after the wrap, still after the first dispatch
  EXPECT_DOUBLE_EQ(s[1].last_start_us, 6.0);
  EXPECT_DOUBLE_EQ(s[1].end_us, 8.0);
  EXPECT_DOUBLE_EQ(s[1].first_mark_us, 6.5);
  EXPECT_FALSE(s[1].early_marked);
  EXPECT_DOUBLE_EQ(s[1].wg_tail_us, 0.5);  // mark -> end of the marked workgroup
}

TEST(Timeline, RefusesEmptyOrMismatchedSteps) {
  const std::vector<double> wall = {1};
  EXPECT_THROW(model::summarize_timeline({}, wall, 0), Error);
  const std::vector<std::vector<model::DispatchSpan>> uneven = {{span("a", 1, 1, 0, 0, 1), span("b", 1, 1, 1, 1, 2)},
                                                                {span("a", 1, 1, 0, 0, 1)}};
  EXPECT_THROW(model::summarize_timeline(uneven, wall, 0), Error);
}

// A model made with the timeline: the same logits (bit for bit) and tokens as without it, and a
// timeline step in the middle of a session changes nothing for the session. Every workgroup of
// every dispatch leaves a record; a dispatch ends after its last workgroup starts; the device span
// is the host's time, read as nanoseconds.
TEST(GpuTimeline, EveryWorkgroupRecordedSameTokens) {
  vk::Context* ctx = fixture.context();
  if (ctx == nullptr) GTEST_SKIP() << "no Vulkan device";
  if (!ctx->device().enabled().device_clock) GTEST_SKIP() << "no shader device clock";
  const testfx::ModelFiles f = fixture.files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  const std::vector<int32_t> prompt = {3, 17, 42, 5, 99};
  std::vector<float> logits[3];
  std::vector<int32_t> tokens[3];
  for (int mode : {0, 1, 2}) {  // no timeline; the timeline; the timeline with mark_gates
    SCOPED_TRACE(mode);
    const bool timeline = mode > 0;
    model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
    o.timeline = timeline;
    o.mark_gates = mode == 2;
    model::GpuModel m(*ctx, tsr, o);
    logits[mode] = m.forward(prompt, true);
    for (int i = 0; i < 4; ++i) tokens[mode].push_back(m.decode_step());
    if (timeline) {
      EXPECT_EQ(m.timeline_untimed(), 0u);
      double wall = 0;
      const std::vector<model::DispatchSpan> spans = m.timeline_step(uint32_t(m.n_past()) + 1, &wall);
      ASSERT_EQ(spans.size(), m.stats().dispatches);
      double end = 0;
      uint32_t gateups = 0, vo_early = 0;
      for (const model::DispatchSpan& d : spans) {
        SCOPED_TRACE(d.label);
        EXPECT_GT(d.workgroups, 0u);  // the decode step's dispatches are direct
        EXPECT_EQ(d.recorded, d.workgroups);
        EXPECT_LE(d.start_us, d.last_start_us);
        EXPECT_LE(d.last_start_us, d.end_us);
        end = std::max(end, d.end_us);
        EXPECT_GT(d.wg_us, 0.0);
        EXPECT_LE(d.wg_us, d.span_us() + 1e-9);
        if (d.marked) {  // a gated wait's end or the gate-up's prologue: inside the dispatch
          // (Medians over workgroups do not subtract: each workgroup's mark -> end lies within the
          // dispatch's span; each workgroup passes its early mark before its mark.)
          EXPECT_LE(d.wg_tail_us, d.span_us() + 1e-9);
          if (d.early_marked) {
            EXPECT_LE(d.start_us, d.first_early_us);
            EXPECT_LE(d.first_early_us, d.last_early_us);
            EXPECT_LE(d.last_early_us, d.end_us);
            EXPECT_LE(d.wg_early_us, d.span_us() + 1e-9);
            EXPECT_LE(d.first_early_us, d.first_mark_us);  // the early mark comes first
          }
          EXPECT_LE(d.start_us, d.first_mark_us);
          EXPECT_LE(d.first_mark_us, d.last_mark_us);
          EXPECT_LE(d.last_mark_us, d.end_us);
          EXPECT_LE(d.marked, d.recorded);
        }
        if (d.label.rfind("moe_gateup", 0) == 0) {
          ++gateups;
          EXPECT_GT(d.marked, 0u);  // its routed workgroups mark the prologue's end
        }
        // W_vo (gated, no early mark of its own): an early mark only where it is the gate's.
        if (d.label.find("attn_vo") != std::string::npos && d.early_marked) ++vo_early;
      }
      EXPECT_GT(gateups, 0u);
      if (mode == 2) EXPECT_GT(vo_early, 0u) << "mark_gates: the gated W_vo's wait end as its early mark";
      else EXPECT_EQ(vo_early, 0u);
      EXPECT_DOUBLE_EQ(spans.front().start_us, 0.0);  // the embedding starts the step
      EXPECT_GT(end, 0.0);
      EXPECT_LE(end, wall * 1.05 + 50.0) << "device clock ticks are not nanoseconds here";
      EXPECT_GE(end, wall * 0.2) << "device clock ticks are not nanoseconds here";
    }
    for (int i = 0; i < 4; ++i) tokens[mode].push_back(m.decode_step());
  }
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(logits[0], logits[2]);
  EXPECT_EQ(tokens[0], tokens[2]);
}

// bench --tune tc_phases (GpuModelOptions::tc_phases): the tensor-core attention's two marks carry
// two of its phase sums, so its workgroups' early mark and mark lie within their time, each of the
// four choices marks them, and two of the sums are well short of the spans the plain marks close;
// the tokens are those of the plain timeline; 5 is refused.
TEST(GpuTimeline, TensorCorePhasesReplaceItsMarks) {
  vk::Context* ctx = fixture.context();
  if (ctx == nullptr) GTEST_SKIP() << "no Vulkan device";
  if (!ctx->device().enabled().device_clock) GTEST_SKIP() << "no shader device clock";
  if (!vk::attention_tc_supported(*ctx, true)) GTEST_SKIP() << "no tensor-core attention kernel here";
  const testfx::ModelFiles f = fixture.files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  const std::vector<int32_t> prompt = {3, 17, 42, 5, 99, 7, 11, 13, 2, 8, 21, 34};
  std::vector<int32_t> tokens[5];
  double early[5] = {}, mark[5] = {};  // the tensor-core attention's, medians over its workgroups, summed over layers
  for (uint32_t phases = 0; phases <= 4; ++phases) {
    SCOPED_TRACE(phases);
    model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
    o.timeline = true;
    o.tc_phases = phases;
    o.attention.decode_tc = 1;  // the long range (past 4 positions) on the tensor-core kernel
    o.attention.short_max_kv = 4;
    o.attention.single = false;
    o.attention.mid = false;
    model::GpuModel m(*ctx, tsr, o);
    m.forward(prompt, false);
    for (int i = 0; i < 2; ++i) tokens[phases].push_back(m.decode_step());
    const std::vector<model::DispatchSpan> spans = m.timeline_step(uint32_t(m.n_past()) + 1);
    uint32_t tc = 0;
    for (const model::DispatchSpan& d : spans) {
      if (d.label.find("partial.tc") == std::string::npos) continue;
      SCOPED_TRACE(d.label);
      ++tc;
      EXPECT_TRUE(d.early_marked);  // the queries staged (0), or a phase sum
      EXPECT_GT(d.marked, 0u);      // the rows attended (0), or a phase sum (chunks past the context: none)
      EXPECT_LE(d.wg_early_us, d.wg_us + 1e-9);
      EXPECT_GE(d.wg_tail_us, 0.0);
      early[phases] += d.wg_early_us;
      mark[phases] += d.wg_us - d.wg_tail_us;
    }
    if (phases == 0 && tc == 0) GTEST_SKIP() << "the tiny model's tensor-core attention does not fit this device";
    EXPECT_EQ(tc, m.config().n_layer) << "one tensor-core attention a layer";
  }
  for (uint32_t phases = 1; phases <= 4; ++phases) EXPECT_EQ(tokens[phases], tokens[0]) << phases;
  // Sums, not points in time: loading the query's tiles into registers (3's early mark; nothing in
  // the plain form) takes less than the whole prologue (the plain early mark), and O's products
  // (2's mark) less than the prologue and every phase of every block (the plain mark).
  EXPECT_LT(early[3], 0.5 * early[0]);
  EXPECT_LT(mark[2], 0.75 * mark[0]);
  model::GpuModelOptions bad{.n_ctx = 32, .prefill_chunk = 0};
  bad.tc_phases = 5;
  try {
    model::GpuModel m(*ctx, tsr, bad);
    ADD_FAILURE() << "tc_phases 5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tc_phases 5"), std::string::npos) << e.what();
  }
  model::GpuModel reset(*ctx, tsr, model::GpuModelOptions{.n_ctx = 32, .prefill_chunk = 0});  // TS_TC_PHASES back to 0
}

TEST(GpuTimeline, Errors) {
  vk::Context* ctx = fixture.context();
  if (ctx == nullptr) GTEST_SKIP() << "no Vulkan device";
  const testfx::ModelFiles f = fixture.files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  {
    model::GpuModel m(*ctx, tsr, model::GpuModelOptions{.n_ctx = 16, .prefill_chunk = 0});
    EXPECT_THROW(m.timeline_step(1), Error);  // made without the option
    EXPECT_EQ(m.timeline_untimed(), 0u);
  }
  if (!ctx->device().enabled().device_clock) GTEST_SKIP() << "no shader device clock";
  // A kernel made in timeline mode needs a recorder with the timeline's records.
  vk::MemoryPool pool(ctx->device(), vk::MemoryKind::Host);
  vk::Buffer x = pool.create_buffer(64 * 4, "x"), w = pool.create_buffer(64 * 4, "w");
  vk::RmsNormOp norm{.x = x.whole(), .weight = w.whole(), .y = x.whole(), .n = 64};
  {
    vk::PipelineLibrary::TimelineScope on(ctx->pipelines(), true);
    vk::CommandRecorder rec(*ctx);
    rec.begin();
    try {
      norm.record(rec);
      ADD_FAILURE() << "a timeline kernel recorded without a timeline buffer";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("timeline"), std::string::npos) << e.what();
    }
    rec.end();
  }
  EXPECT_FALSE(ctx->pipelines().timeline());  // the scope ended
  vk::CommandRecorder rec(*ctx);  // made outside timeline mode: the plain kernel
  rec.begin();
  norm.record(rec);
  rec.end();
  rec.run();
}

}  // namespace
}  // namespace tessera
