// The decode step's single and mid attention ranges (attention_rows.comp SINGLE, MERGE_TAIL +
// Q8_OUT) and the gate they and the merge open for an early-started W_vo (GATE_SIGNAL), against
// the CPU reference: GLM and awkward shapes, olat and its int8 blocks, counters left at zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/fp16.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/recorder.h"
#include "tests/vulkan/attention_test_util.h"

namespace tessera {
namespace {

using namespace attntest;
using attntest::gpu;  // (tessera::gpu is the shader-argument namespace)

// A range of the decode step recorded once (record_decode) over random cache rows and queries,
// run at contexts of its range: olat (poisoned before each run) against the reference, its int8
// blocks against the CPU quantization of the olat written beside them (where the latent is a
// multiple of 32), and the arrival counters left at zero. One dispatch, no barrier.
void check_olat_range(const vk::AttentionOp& op, vk::DecodeRange range, uint32_t n_head, uint32_t kv_lora,
                      uint32_t n_rot, uint32_t n_ctx, const std::vector<uint32_t>& kv_lens, uint32_t seed,
                      double rel_tol = kF32OlatTol) {
  const uint32_t row = kv_lora + n_rot;
  const vk::AttentionShape shape = make_shape(n_head, kv_lora, n_rot, n_ctx, kGlmRope);
  const cpu::Rope rope = cpu_rope(kGlmRope, n_rot);
  const bool q8 = kv_lora % 32 == 0;
  EXPECT_EQ(op.decode_writes_olat_q8(range), q8);
  std::vector<uint16_t> cache_h(size_t(n_ctx) * row);
  const std::vector<float> v = test::random_values(cache_h.size(), 1.f, seed);
  for (size_t i = 0; i < v.size(); ++i) cache_h[i] = f32_to_fp16(v[i]);
  const std::vector<float> q_h = test::random_values(size_t(n_head) * row, 2.f, seed + 1);
  vk::Buffer q = make_buffer(q_h.size() * 4, "q"), cache = make_buffer(shape.cache_bytes(), "cache");
  vk::Buffer step = make_buffer(64, "step"), partials = make_buffer(op.partials_bytes(), "partials");
  vk::Buffer arrivals = make_buffer(op.arrivals_bytes(), "arrivals");
  vk::Buffer olat = make_buffer(size_t(n_head) * kv_lora * 4, "olat");
  vk::Buffer olat_q8 = make_buffer(std::max<uint64_t>(op.olat_q8_bytes(), 48), "olat q8");
  upload(q, q_h);
  upload(cache, cache_h);
  upload(arrivals, std::vector<uint32_t>(op.arrivals_bytes() / 4, 0));
  vk::CommandRecorder rec(*gpu().ctx);
  rec.begin();
  op.record_decode(rec, q.whole(), cache.whole(), step.whole(), kPosWord, step.whole().sub(16, 24), partials.whole(),
                   arrivals.whole(), olat.whole(), range, "attn", q8 ? olat_q8.whole() : vk::BufferSlice{});
  rec.end();
  EXPECT_EQ(rec.dispatch_count(), 1u);
  EXPECT_EQ(rec.barrier_count(), 0u);
  // The kernel that also opens W_vo's gate (AttentionTuning::gate_signal): the same olat bits, and
  // the gate word counts every head once.
  const bool gated = op.decode_signals_gate(range);
  EXPECT_EQ(gated, q8) << "gate_signal was asked for";
  vk::Buffer gate = make_buffer(16, "gate");
  vk::CommandRecorder rec_gate(*gpu().ctx);
  if (gated) {
    rec_gate.begin();
    op.record_decode(rec_gate, q.whole(), cache.whole(), step.whole(), kPosWord, step.whole().sub(16, 24),
                     partials.whole(), arrivals.whole(), olat.whole(), range, "attn", olat_q8.whole(), gate.whole());
    rec_gate.end();
    EXPECT_EQ(rec_gate.dispatch_count(), 1u);
  }
  for (uint32_t kv_len : kv_lens) {
    poison(olat);
    poison(olat_q8);
    poison(partials);
    upload(step, std::vector<uint32_t>{0, kv_len - 1, 0, 0});
    rec.run();
    const std::vector<float> got = download<float>(olat, size_t(n_head) * kv_lora);
    expect_olat_near(got, q_h, cache_h, n_head, kv_lora, n_rot, kv_len, shape.kq_scale, rope, rel_tol);
    std::vector<uint32_t> got_q8;
    if (q8) {
      got_q8 = download<uint32_t>(olat_q8, op.olat_q8_bytes() / 4);
      vktest::expect_q8_blocks_close(got_q8, vktest::q8_blocks(got), cat("olat q8, kv_len ", kv_len));
    }
    for (uint32_t a : download<uint32_t>(arrivals, op.arrivals_bytes() / 4))
      ASSERT_EQ(a, 0u) << "kv_len " << kv_len << ": an arrival counter was left set";
    if (!gated) continue;
    poison(olat);
    poison(olat_q8);
    upload(gate, std::vector<uint32_t>{0, 0, 0, 0});
    rec_gate.run();
    EXPECT_EQ(download<float>(olat, size_t(n_head) * kv_lora), got) << "gated kernel, kv_len " << kv_len;
    EXPECT_EQ(download<uint32_t>(olat_q8, op.olat_q8_bytes() / 4), got_q8) << "gated kernel, kv_len " << kv_len;
    EXPECT_EQ(download<uint32_t>(gate, 4), (std::vector<uint32_t>{n_head, 0, 0, 0})) << "kv_len " << kv_len;
  }
  // No gate without the int8 blocks it opens on.
  if (gated) {
    vk::CommandRecorder bad(*gpu().ctx);
    bad.begin();
    EXPECT_THROW(op.record_decode(bad, q.whole(), cache.whole(), step.whole(), kPosWord, step.whole().sub(16, 24),
                                  partials.whole(), arrivals.whole(), olat.whole(), range, "attn", {}, gate.whole()),
                 Error);
    bad.end();
  }
}

// The decode step's single range (attention_rows.comp SINGLE): one workgroup per head over the
// whole context writes olat and its int8 blocks itself. GLM's shape and awkward ones (3 heads,
// rows of 80; a latent of 80, not a multiple of 32: no int8 blocks), the default work split and
// odd ones (3 subgroups x 3 rows: rounds that end inside the context), the first round loaded
// before the position word or not, contexts of one row to the range's end. The ranges: single,
// then the others, each context in exactly one.
TEST(AttentionDecode, SingleRangeMatchesTheReference) {
  REQUIRE_GPU();
  struct SingleCase {
    uint32_t n_head, kv_lora, n_rot, n_ctx, single_max, subgroups, round;
    std::vector<uint32_t> kv_lens;
    bool early = true;      // AttentionTuning::single_early
    bool coalesced = true;  // AttentionTuning::rows_coalesced
    bool f16 = false;       // AttentionTuning::rows_f16
  };
  const std::vector<SingleCase> cases = {
      {20, 512, 64, 300, 0, 0, 0, {1, 2, 63, 64, 65, 200, 256, 5}},
      {20, 512, 64, 300, 0, 0, 4, {1, 2, 63, 64, 65, 200, 256, 5}, false},
      {3, 64, 16, 100, 97, 3, 3, {1, 8, 9, 10, 96, 97}},
      {5, 80, 16, 50, 50, 2, 5, {1, 11, 49, 50}, false},
      {20, 512, 64, 300, 0, 0, 0, {1, 64, 65, 256}, true, false},  // the lane layout until session 20
      {20, 512, 64, 300, 0, 0, 0, {1, 2, 63, 64, 65, 256}, true, true, true},  // packed halves
      {5, 80, 16, 50, 50, 3, 3, {1, 11, 49, 50}, false, true, true},
  };
  for (const SingleCase& c : cases) {
    SCOPED_TRACE(cat("H", c.n_head, " R", c.kv_lora, " Dr", c.n_rot, " single_max ", c.single_max, " nsg ", c.subgroups,
                     " rb ", c.round, " early ", c.early, " coalesced ", c.coalesced,
                     " f16 ", c.f16));
    vk::AttentionTuning t;
    t.single_max_kv = c.single_max;
    t.single_subgroups = c.subgroups;
    t.single_round = c.round;
    t.single_early = c.early;
    t.rows_coalesced = c.coalesced;
    t.rows_f16 = c.f16;
    t.gate_signal = true;
    vk::AttentionOp op(*gpu().ctx, make_shape(c.n_head, c.kv_lora, c.n_rot, c.n_ctx, kGlmRope), t);
    if (!op.single_max_kv()) GTEST_SKIP() << "no single-workgroup kernel (subgroup arithmetic)";
    const uint32_t max_kv = op.single_max_kv();
    EXPECT_EQ(max_kv, std::min(c.single_max ? c.single_max : 256u, c.n_ctx));
    EXPECT_EQ(op.decode_range(1), vk::DecodeRange::Single);
    EXPECT_EQ(op.decode_range(max_kv), vk::DecodeRange::Single);
    if (max_kv < c.n_ctx) EXPECT_NE(op.decode_range(max_kv + 1), vk::DecodeRange::Single);
    const auto ranges = op.decode_ranges();
    ASSERT_FALSE(ranges.empty());
    EXPECT_EQ(ranges.front(), std::make_pair(vk::DecodeRange::Single, max_kv));
    EXPECT_EQ(ranges.back().second, c.n_ctx);
    for (size_t i = 1; i < ranges.size(); ++i) {
      EXPECT_GT(ranges[i].second, ranges[i - 1].second);
      EXPECT_EQ(op.decode_range(ranges[i].second), ranges[i].first);
      EXPECT_EQ(op.decode_range(ranges[i - 1].second + 1), ranges[i].first);
    }
    uint32_t words[vk::AttentionOp::kDecodeCountWords];
    op.decode_counts(max_kv, words);
    EXPECT_EQ(words[0], 0u) << "short range idle";
    EXPECT_EQ(words[3], 0u) << "long range idle";
    check_olat_range(op, vk::DecodeRange::Single, c.n_head, c.kv_lora, c.n_rot, c.n_ctx, c.kv_lens, 41,
                     c.f16 ? kF16OlatTol : kF32OlatTol);
  }
}

// The decode step's mid range (attention_rows.comp MERGE_TAIL + Q8_OUT): a few workgroups per
// head, the last to finish merging the head's chunks into olat and its int8 blocks. GLM's shape
// with the defaults, and awkward ones (3 heads, rows of 80, 3 groups of 5 subgroups; a latent of
// 80: no int8 blocks, 7 groups of 2 subgroups), contexts from just past the single range to the
// mid range's end.
TEST(AttentionDecode, MidRangeMatchesTheReference) {
  REQUIRE_GPU();
  struct MidCase {
    uint32_t n_head, kv_lora, n_rot, n_ctx, single_max, mid_max, groups, subgroups;
    std::vector<uint32_t> kv_lens;
    bool f16 = false;  // AttentionTuning::rows_f16
  };
  const std::vector<MidCase> cases = {
      {20, 512, 64, 1100, 0, 0, 0, 0, {257, 258, 300, 511, 768, 700, 257}},
      {3, 64, 16, 200, 20, 150, 3, 5, {21, 22, 100, 150, 23}},
      {5, 80, 16, 100, 10, 100, 7, 2, {11, 50, 99, 100}},
      {20, 512, 64, 1100, 0, 0, 0, 0, {257, 511, 768}, true},  // packed halves
  };
  for (const MidCase& c : cases) {
    SCOPED_TRACE(cat("H", c.n_head, " R", c.kv_lora, " Dr", c.n_rot, " mid_max ", c.mid_max, " groups ", c.groups,
                     " nsg ", c.subgroups));
    vk::AttentionTuning t;
    t.single_max_kv = c.single_max;
    t.mid_max_kv = c.mid_max;
    t.mid_groups = c.groups;
    t.mid_subgroups = c.subgroups;
    t.rows_f16 = c.f16;
    t.gate_signal = true;
    vk::AttentionOp op(*gpu().ctx, make_shape(c.n_head, c.kv_lora, c.n_rot, c.n_ctx, kGlmRope), t);
    if (!op.mid_max_kv()) GTEST_SKIP() << "no mid-range kernel (subgroup arithmetic)";
    const uint32_t lo = op.single_max_kv(), hi = op.mid_max_kv();
    EXPECT_EQ(hi, std::min(c.mid_max ? c.mid_max : 768u, c.n_ctx));
    EXPECT_EQ(op.mid_groups(), c.groups ? c.groups : 4u);
    EXPECT_EQ(op.decode_range(lo), vk::DecodeRange::Single);
    EXPECT_EQ(op.decode_range(lo + 1), vk::DecodeRange::Mid);
    EXPECT_EQ(op.decode_range(hi), vk::DecodeRange::Mid);
    if (hi < c.n_ctx) EXPECT_NE(op.decode_range(hi + 1), vk::DecodeRange::Mid);
    const auto ranges = op.decode_ranges();
    ASSERT_GE(ranges.size(), 2u);
    EXPECT_EQ(ranges[1], std::make_pair(vk::DecodeRange::Mid, hi));
    uint32_t words[vk::AttentionOp::kDecodeCountWords];
    op.decode_counts(hi, words);
    EXPECT_EQ(words[0], 0u) << "short range idle";
    EXPECT_EQ(words[3], 0u) << "long range idle";
    check_olat_range(op, vk::DecodeRange::Mid, c.n_head, c.kv_lora, c.n_rot, c.n_ctx, c.kv_lens, 51,
                     c.f16 ? kF16OlatTol : kF32OlatTol);
  }
}

// The gate tests' inputs, GLM-shaped (20 heads, a 512 + 64 latent row, 300 positions): random
// f16 cache rows (seed) and queries (seed + 1), the step words and olat; the op's partials,
// arrival counters (zero) and int8 olat.
struct GateInputs {
  static constexpr uint32_t H = 20, R = 512, Dr = 64, n_ctx = 300, row = R + Dr;
  const vk::AttentionShape shape = make_shape(H, R, Dr, n_ctx, kGlmRope);
  vk::Buffer q = make_buffer(size_t(H) * row * 4, "q"), cache = make_buffer(shape.cache_bytes(), "cache");
  vk::Buffer step = make_buffer(64, "step"), olat = make_buffer(size_t(H) * R * 4, "olat");
  explicit GateInputs(uint32_t seed) {
    std::vector<uint16_t> cache_h(size_t(n_ctx) * row);
    const std::vector<float> v = test::random_values(cache_h.size(), 1.f, seed);
    for (size_t i = 0; i < v.size(); ++i) cache_h[i] = f32_to_fp16(v[i]);
    upload(q, test::random_values(size_t(H) * row, 2.f, seed + 1));
    upload(cache, cache_h);
  }
  // The step words of a context of kv_len positions with op's group counts.
  void set_context(const vk::AttentionOp& op, uint32_t kv_len) {
    std::vector<uint32_t> counts(vk::AttentionOp::kDecodeCountWords);
    op.decode_counts(kv_len, counts.data());
    std::vector<uint32_t> words{0, kv_len - 1, 0, 0};
    words.insert(words.end(), counts.begin(), counts.end());
    upload(step, words);
  }
  std::vector<float> olat_values() { return download<float>(olat, size_t(H) * R); }
  // A short range up to 40 positions, then the long one; no single or mid range; the kernels
  // that open W_vo's gate.
  static vk::AttentionTuning split_tuning() {
    vk::AttentionTuning t = tuning(0, 0);
    t.short_max_kv = 40;
    t.single = false;
    t.gate_signal = true;
    return t;
  }
  // The op's buffers.
  struct OpBuffers {
    vk::Buffer partials, arrivals, olat_q8;
  };
  static OpBuffers op_buffers(const vk::AttentionOp& op) {
    OpBuffers b{make_buffer(op.partials_bytes(), "partials"), make_buffer(op.arrivals_bytes(), "arrivals"),
                make_buffer(op.olat_q8_bytes(), "olat q8")};
    upload(b.arrivals, std::vector<uint32_t>(op.arrivals_bytes() / 4, 0));
    return b;
  }
};

// The short and long ranges' merge dispatch opening W_vo's gate (AttentionTuning::gate_signal,
// attention_merge.comp GATE_SIGNAL): the same olat and int8 bits as the merge without it, the
// gate word counting every merge workgroup once (decode_gate_target); a folded merge opens none.
TEST(AttentionDecode, MergeOpensTheGate) {
  REQUIRE_GPU();
  GateInputs in(61);
  vk::AttentionTuning t = GateInputs::split_tuning();
  vk::AttentionOp op(*gpu().ctx, in.shape, t);
  ASSERT_TRUE(op.writes_olat_q8());
  EXPECT_TRUE(op.decode_signals_gate(vk::DecodeRange::Long));
  EXPECT_EQ(op.decode_signals_gate(vk::DecodeRange::Short), !op.merge_folded(vk::DecodeRange::Short));
  GateInputs::OpBuffers ob = GateInputs::op_buffers(op);
  vk::Buffer gate = make_buffer(16, "gate");
  for (vk::DecodeRange range : {vk::DecodeRange::Short, vk::DecodeRange::Long}) {
    if (!op.decode_signals_gate(range)) continue;
    SCOPED_TRACE(range == vk::DecodeRange::Short ? "short" : "long");
    vk::CommandRecorder plain(*gpu().ctx), gated(*gpu().ctx);
    for (bool g : {false, true}) {
      vk::CommandRecorder& rec = g ? gated : plain;
      rec.begin();
      op.record_decode(rec, in.q.whole(), in.cache.whole(), in.step.whole(), kPosWord, in.step.whole().sub(16, 24),
                       ob.partials.whole(), ob.arrivals.whole(), in.olat.whole(), range, "attn", ob.olat_q8.whole(),
                       g ? gate.whole() : vk::BufferSlice{});
      rec.end();
    }
    for (uint32_t kv_len : range == vk::DecodeRange::Short ? std::vector<uint32_t>{1, 17, 40} : std::vector<uint32_t>{41, 299}) {
      in.set_context(op, kv_len);
      poison(in.olat);
      poison(ob.olat_q8);
      plain.run();
      const std::vector<float> want = in.olat_values();
      const std::vector<uint32_t> want_q8 = download<uint32_t>(ob.olat_q8, op.olat_q8_bytes() / 4);
      poison(in.olat);
      poison(ob.olat_q8);
      upload(gate, std::vector<uint32_t>{0, 0, 0, 0});
      gated.run();
      EXPECT_EQ(in.olat_values(), want) << "kv_len " << kv_len;
      EXPECT_EQ(download<uint32_t>(ob.olat_q8, op.olat_q8_bytes() / 4), want_q8) << "kv_len " << kv_len;
      EXPECT_EQ(download<uint32_t>(gate, 1)[0], op.decode_gate_target(range)) << "kv_len " << kv_len;
    }
  }
}

// The short range's rows partials started beside the query's matvec (AttentionTuning::short_wait,
// the default since session 36; attention_rows.comp WAIT_GATE without GATE_SIGNAL): with the
// polled word at its target, the same olat bits as the partials recorded after a barrier and no
// error; below it, the wait gives up and says what it saw. The long range's partials do not wait.
TEST(AttentionDecode, ShortRangeWaitsOnTheQuerysGate) {
  REQUIRE_GPU();
  GateInputs in(71);
  vk::AttentionTuning t = GateInputs::split_tuning();
  t.short_wait = false;
  EXPECT_FALSE(vk::AttentionOp(*gpu().ctx, in.shape, t).decode_waits(vk::DecodeRange::Short));
  t.short_wait = true;  // the default
  vk::AttentionOp op(*gpu().ctx, in.shape, t);
  if (!op.decode_waits(vk::DecodeRange::Short)) GTEST_SKIP() << "no rows kernel for the short range on this device";
  EXPECT_FALSE(op.decode_waits(vk::DecodeRange::Long));
  GateInputs::OpBuffers ob = GateInputs::op_buffers(op);
  vk::Buffer gate = make_buffer(16, "gate"), words = make_buffer(16, "query gate"), error = make_buffer(8, "error");
  const vk::GateWait wait{words.whole(), 1, 3, error.whole()};
  const auto record = [&](vk::CommandRecorder& rec, vk::DecodeRange range, const vk::GateWait& w) {
    op.record_decode(rec, in.q.whole(), in.cache.whole(), in.step.whole(), kPosWord, in.step.whole().sub(16, 24),
                     ob.partials.whole(), ob.arrivals.whole(), in.olat.whole(), range, "attn", ob.olat_q8.whole(),
                     gate.whole(), w);
  };
  vk::CommandRecorder plain(*gpu().ctx), waiting(*gpu().ctx);
  for (bool w : {false, true}) {
    vk::CommandRecorder& rec = w ? waiting : plain;
    rec.begin();
    record(rec, vk::DecodeRange::Short, w ? wait : vk::GateWait{});
    rec.end();
  }
  EXPECT_NE(waiting.dispatches().front().label.find(".wait"), std::string::npos);
  for (uint32_t kv_len : {1u, 23u, 40u}) {
    SCOPED_TRACE(cat("kv_len ", kv_len));
    in.set_context(op, kv_len);
    poison(in.olat);
    upload(gate, std::vector<uint32_t>{0, 0, 0, 0});
    plain.run();
    const std::vector<float> want = in.olat_values();
    poison(in.olat);
    upload(gate, std::vector<uint32_t>{0, 0, 0, 0});
    upload(words, std::vector<uint32_t>{0, 3, 0, 0});
    upload(error, std::vector<uint32_t>{0, 0});
    waiting.run();
    EXPECT_EQ(in.olat_values(), want);
    EXPECT_EQ(download<uint32_t>(error, 2), (std::vector<uint32_t>{0, 0}));
  }
  upload(words, std::vector<uint32_t>{0, 2, 0, 0});  // one arrival short: every wait gives up
  waiting.run();
  EXPECT_EQ(download<uint32_t>(error, 2), (std::vector<uint32_t>{1, 2}));
  vk::CommandRecorder bad(*gpu().ctx);
  bad.begin();
  EXPECT_THROW(record(bad, vk::DecodeRange::Long, wait), Error);
  bad.end();
}

// The split ranges' merge recorded with no barrier after the partials and waiting on a word
// they count (AttentionTuning::merge_wait, the default; attention_rows.comp PARTIAL_SIGNAL,
// attention_merge.comp WAIT_GATE), the partials recorded after a barrier or waiting themselves on
// the query's gate (short_wait): the same olat and int8 bits as the merge after a barrier, with and
// without W_vo's gate, the word at decode_merge_target() (every partial workgroup, those past the
// context too) and no error; the same for the long range's partials (recorded after a barrier);
// refused with another target or without olat's int8 blocks.
TEST(AttentionDecode, MergeWaitsOnThePartials) {
  REQUIRE_GPU();
  GateInputs in(81);
  vk::AttentionTuning t = GateInputs::split_tuning();
  t.merge_wait = false;
  EXPECT_FALSE(vk::AttentionOp(*gpu().ctx, in.shape, t).decode_chains_merge(vk::DecodeRange::Short));
  t.merge_wait = true;  // the default
  vk::Buffer gate = make_buffer(16, "gate"), words = make_buffer(16, "merge gate"), error = make_buffer(8, "error");
  vk::Buffer query_words = make_buffer(16, "query gate");
  for (bool short_wait : {false, true}) {
    t.short_wait = short_wait;
    vk::AttentionOp op(*gpu().ctx, in.shape, t);
    if (!op.decode_chains_merge(vk::DecodeRange::Short)) GTEST_SKIP() << "no rows kernel or subgroup merge on this device";
    GateInputs::OpBuffers ob = GateInputs::op_buffers(op);
    for (vk::DecodeRange range : {vk::DecodeRange::Short, vk::DecodeRange::Long}) {
      const bool short_range = range == vk::DecodeRange::Short;
      if (!short_range && short_wait) continue;  // only the short range's partials wait
      ASSERT_TRUE(op.decode_chains_merge(range));
      const uint32_t target = op.decode_merge_target(range);
      const vk::GateWait wait{words.whole(), 2, target, error.whole()};
      const vk::GateWait query_wait = short_wait ? vk::GateWait{query_words.whole(), 1, 3, error.whole()} : vk::GateWait{};
      const auto record = [&](vk::CommandRecorder& rec, vk::BufferSlice vo_gate, vk::BufferSlice olat_q8,
                              const vk::GateWait& qw, const vk::GateWait& mw) {
        op.record_decode(rec, in.q.whole(), in.cache.whole(), in.step.whole(), kPosWord, in.step.whole().sub(16, 24),
                         ob.partials.whole(), ob.arrivals.whole(), in.olat.whole(), range, "attn", olat_q8, vo_gate, qw, mw);
      };
      for (bool vo_gate : {false, true}) {
        if (short_wait && !vo_gate) continue;  // the waiting partials belong to the early W_vo's attention
        SCOPED_TRACE(cat(short_range ? "short" : "long", short_wait ? ", partials waiting" : "",
                         vo_gate ? ", opening W_vo's gate" : ", no W_vo gate"));
        const vk::BufferSlice g = vo_gate ? gate.whole() : vk::BufferSlice{};
        vk::CommandRecorder plain(*gpu().ctx), chained(*gpu().ctx);
        for (bool c : {false, true}) {
          vk::CommandRecorder& rec = c ? chained : plain;
          rec.begin();
          record(rec, g, ob.olat_q8.whole(), c ? query_wait : vk::GateWait{}, c ? wait : vk::GateWait{});
          rec.end();
        }
        ASSERT_EQ(chained.dispatches().size(), 2u);
        EXPECT_NE(chained.dispatches().front().label.find(short_wait ? ".wait.signal" : ".signal"), std::string::npos);
        EXPECT_NE(chained.dispatches().back().label.find(".wait"), std::string::npos);
        for (uint32_t kv_len : short_range ? std::vector<uint32_t>{1, 23, 40} : std::vector<uint32_t>{41, 299}) {
          SCOPED_TRACE(cat("kv_len ", kv_len));
          in.set_context(op, kv_len);
          poison(in.olat);
          poison(ob.olat_q8);
          upload(gate, std::vector<uint32_t>{0, 0, 0, 0});
          plain.run();
          const std::vector<float> want = in.olat_values();
          const std::vector<uint32_t> want_q8 = download<uint32_t>(ob.olat_q8, op.olat_q8_bytes() / 4);
          poison(in.olat);
          poison(ob.olat_q8);
          upload(gate, std::vector<uint32_t>{0, 0, 0, 0});
          upload(words, std::vector<uint32_t>{0, 0, 0, 0});
          upload(query_words, std::vector<uint32_t>{0, 3, 0, 0});
          upload(error, std::vector<uint32_t>{0, 0});
          chained.run();
          EXPECT_EQ(in.olat_values(), want);
          EXPECT_EQ(download<uint32_t>(ob.olat_q8, op.olat_q8_bytes() / 4), want_q8);
          EXPECT_EQ(download<uint32_t>(words, 4), (std::vector<uint32_t>{0, 0, target, 0}));
          EXPECT_EQ(download<uint32_t>(error, 2), (std::vector<uint32_t>{0, 0}));
          if (vo_gate) EXPECT_EQ(download<uint32_t>(gate, 1)[0], op.decode_gate_target(range));
        }
      }
      vk::CommandRecorder bad(*gpu().ctx);
      bad.begin();
      EXPECT_THROW(record(bad, gate.whole(), ob.olat_q8.whole(), {}, vk::GateWait{words.whole(), 2, target + 1, error.whole()}),
                   Error) << "another target";
      EXPECT_THROW(record(bad, {}, {}, {}, wait), Error) << "no int8 olat";
      bad.end();
    }
  }
}

}  // namespace
}  // namespace tessera
