// Attention kernels (kv_write, attention_partial + merge) against the CPU reference of
// test_attention_ref.h on lavapipe (or any Vulkan device): awkward head counts, latent and rope
// widths, context lengths that the chunking does not divide, GLM and YaRN rope, outputs poisoned
// before every run, one recording resubmitted with changed positions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/fp16.h"
#include "runtime/cpu/ops.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "runtime/vulkan/memory.h"
#include "runtime/vulkan/recorder.h"
#include "tests/vulkan/attention_test_util.h"
#include "tests/vulkan/test_attention_ref.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using namespace attntest;
using attntest::gpu;  // (tessera::gpu is the shader-argument namespace)

// ---------------------------------------------------------------------------------------------

TEST(AttentionRope, FrequencyTableMatchesCpuRope) {
  for (const RopeCase& rc : {kGlmRope, kYarnRope})
    for (uint32_t n_rot : {16u, 64u}) {
      const vk::RopeParams p = rope_params(rc, n_rot);
      const cpu::Rope r = cpu_rope(rc, n_rot);
      EXPECT_NEAR(p.mscale(), r.mscale(), 1e-6) << rc.name;
      for (uint32_t k = 0; k < n_rot / 2; ++k)
        EXPECT_NEAR(p.frequency(k) * 1000.0, r.theta(k, 1000), 1e-9 * std::max(1.0, r.theta(k, 1000)))
            << rc.name << " n_rot " << n_rot << " pair " << k;
    }
  // YaRN: V2-Lite magnitude is exactly 1 (forward.md §3.2).
  EXPECT_NEAR(rope_params(kYarnRope, 64).mscale(), 1.0, 1e-6);
}

// kv_write: one recording, positions changed between submissions; each run writes exactly row pos.
struct KvWriteCase {
  uint32_t kv_lora, n_rot;
  RopeCase rope;
};
void PrintTo(const KvWriteCase& c, std::ostream* os) { *os << "R" << c.kv_lora << " Dr" << c.n_rot << " " << c.rope.name; }
class KvWriteTest : public ::testing::TestWithParam<KvWriteCase> {};

TEST_P(KvWriteTest, WritesNormalizedRopedRowAtPosition) {
  REQUIRE_GPU();
  const KvWriteCase c = GetParam();
  const uint32_t n_ctx = 5003, row = c.kv_lora + c.n_rot;
  const vk::AttentionShape shape = make_shape(4, c.kv_lora, c.n_rot, n_ctx, c.rope);
  const cpu::Rope rope = cpu_rope(c.rope, c.n_rot);
  vk::KvWriteOp op(*gpu().ctx, shape);

  vk::Buffer kv = make_buffer(row * 4, "kv"), norm = make_buffer(c.kv_lora * 4, "norm");
  vk::Buffer step = make_buffer(16, "step"), cache = make_buffer(shape.cache_bytes(), "cache");
  const std::vector<float> norm_w = test::random_values(c.kv_lora, 2.f, 7);
  upload(norm, norm_w);
  upload(cache, std::vector<uint16_t>(size_t(n_ctx) * row, 0x7E00));  // f16 NaN everywhere

  vk::CommandRecorder rec(*gpu().ctx);
  rec.begin();
  op.record(rec, kv.whole(), norm.whole(), step.whole(), kPosWord, cache.whole(), "kv_write");
  rec.end();
  EXPECT_EQ(rec.dispatch_count(), 1u);

  std::vector<std::vector<uint16_t>> expected_rows;
  const std::vector<uint32_t> positions = {0, 7, 4999, 5002, 1};
  for (size_t i = 0; i < positions.size(); ++i) {
    const uint32_t pos = positions[i];
    const std::vector<float> kv_in = test::random_values(row, 3.f, 100 + uint32_t(i));
    upload(kv, kv_in);
    upload(step, std::vector<uint32_t>{12345, pos, 0, 0});
    rec.run();
    expected_rows.push_back(test::ref_kv_row(kv_in, norm_w, shape.eps, rope, pos));
  }
  const std::vector<uint16_t> got = download<uint16_t>(cache, size_t(n_ctx) * row);
  size_t written = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    const uint16_t* g = &got[size_t(positions[i]) * row];
    for (uint32_t d = 0; d < row; ++d) {
      const float want = fp16_to_f32(expected_rows[i][d]), have = fp16_to_f32(g[d]);
      // f16 rounding of the GPU may differ by one unit in the last place.
      ASSERT_NEAR(have, want, std::abs(want) * 1.0e-3f + 1e-6f)
          << "pos " << positions[i] << " dim " << d << (d < c.kv_lora ? " (latent)" : " (rope)");
    }
    written += row;
  }
  size_t untouched = 0;
  for (uint16_t h : got) untouched += h == 0x7E00;
  EXPECT_EQ(untouched, got.size() - written) << "rows other than the written positions changed";
}

INSTANTIATE_TEST_SUITE_P(Shapes, KvWriteTest,
                         ::testing::Values(KvWriteCase{64, 16, kGlmRope}, KvWriteCase{512, 64, kGlmRope},
                                           KvWriteCase{128, 64, kYarnRope}, KvWriteCase{512, 64, kYarnRope}),
                         [](const auto& info) {
                           return std::string(info.param.rope.name) + "_R" + std::to_string(info.param.kv_lora) + "_Dr" +
                                  std::to_string(info.param.n_rot);
                         });

// kv_write's early start (kv_write.comp WAIT_GATE): with the gate word at its target the row is
// the ungated kernel's, bit for bit; a gate short of its target makes the wait give up and set
// the error words (the value it saw) instead of hanging; waiting and opening a gate of its own
// (SIGNAL_GATE too: early_qk chained to the early attention) writes the same row and arrives once.
TEST(KvWriteGate, OpenGateWritesTheSameRowAndAClosedOneSetsTheErrorWord) {
  REQUIRE_GPU();
  if (!vk::KvWriteOp::gate_supported(*gpu().ctx)) GTEST_SKIP() << "no subgroups: no gated kv_write";
  const uint32_t n_ctx = 37, R = 512, Dr = 64, row = R + Dr, pos = 29;
  const vk::AttentionShape shape = make_shape(4, R, Dr, n_ctx, kGlmRope);
  vk::KvWriteOp op(*gpu().ctx, shape);
  vk::Buffer kv = make_buffer(row * 4, "kv"), norm = make_buffer(R * 4, "norm"), step = make_buffer(16, "step");
  upload(kv, test::random_values(row, 3.f, 5));
  upload(norm, test::random_values(R, 2.f, 6));
  upload(step, std::vector<uint32_t>{0, pos, 0, 0});
  struct Run {
    std::vector<uint16_t> cache;
    std::vector<uint32_t> error;
  };
  // chain: also opens a gate of its own (word 2 of a second buffer: binding 6 after the wait's).
  auto run = [&](bool gated, uint32_t gate_value, uint32_t target, bool chain = false) {
    vk::Buffer cache = make_buffer(shape.cache_bytes(), "cache"), gate = make_buffer(16, "gate");
    vk::Buffer err = make_buffer(8, "gate error"), opened = make_buffer(16, "opened gate");
    upload(cache, std::vector<uint16_t>(size_t(n_ctx) * row, 0x7E00));
    upload(gate, std::vector<uint32_t>{0, gate_value, 0, 0});
    upload(err, std::vector<uint32_t>{0, 0});
    upload(opened, std::vector<uint32_t>{0, 0, 5, 0});
    vk::CommandRecorder rec(*gpu().ctx);
    rec.begin();
    op.record(rec, kv.whole(), norm.whole(), step.whole(), kPosWord, cache.whole(), "kv_write",
              gated ? vk::GateWait{gate.whole(), 1, target, err.whole()} : vk::GateWait{},
              chain ? opened.whole() : vk::BufferSlice{}, 2);
    rec.end();
    rec.run();
    if (chain) EXPECT_EQ(download<uint32_t>(opened, 4), (std::vector<uint32_t>{0, 0, 6, 0})) << "one arrival on word 2";
    return Run{download<uint16_t>(cache, size_t(n_ctx) * row), download<uint32_t>(err, 2)};
  };
  const Run plain = run(false, 0, 0), open = run(true, 3, 3), closed = run(true, 2, 3), chained = run(true, 3, 3, true);
  EXPECT_EQ(open.cache, plain.cache);
  EXPECT_EQ(open.error, (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(closed.error, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(chained.cache, plain.cache) << "waiting and signalling";
  EXPECT_EQ(chained.error, (std::vector<uint32_t>{0, 0}));
  size_t written = 0;
  for (uint16_t h : plain.cache) written += h != 0x7E00;
  EXPECT_EQ(written, row) << "one row written";
}

// attention partial + merge vs the reference, over a cache of random f16 rows.
struct AttnCase {
  uint32_t n_head, kv_lora, n_rot;
  RopeCase rope;
  std::vector<uint32_t> kv_lens;
  vk::AttentionTuning tuning;
  float q_scale;  // larger = sharper softmax
};
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "H" << c.n_head << " R" << c.kv_lora << " Dr" << c.n_rot << " " << c.rope.name;
}
class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, MatchesReferenceAtEveryContextLength) {
  REQUIRE_GPU();
  const AttnCase c = GetParam();
  uint32_t n_ctx = 0;
  for (uint32_t l : c.kv_lens) n_ctx = std::max(n_ctx, l);
  n_ctx += 3;  // capacity beyond the longest context used
  const uint32_t row = c.kv_lora + c.n_rot;
  const vk::AttentionShape shape = make_shape(c.n_head, c.kv_lora, c.n_rot, n_ctx, c.rope);
  const cpu::Rope rope = cpu_rope(c.rope, c.n_rot);
  vk::AttentionOp op(*gpu().ctx, shape, c.tuning);

  std::vector<uint16_t> cache_h(size_t(n_ctx) * row);
  {
    const std::vector<float> v = test::random_values(cache_h.size(), 1.f, 11);
    for (size_t i = 0; i < v.size(); ++i) cache_h[i] = f32_to_fp16(v[i]);
  }
  const std::vector<float> q_h = test::random_values(size_t(c.n_head) * row, c.q_scale, 12);

  vk::Buffer q = make_buffer(q_h.size() * 4, "q"), cache = make_buffer(shape.cache_bytes(), "cache");
  vk::Buffer step = make_buffer(16, "step"), partials = make_buffer(op.partials_bytes(), "partials");
  vk::Buffer olat = make_buffer(size_t(c.n_head) * c.kv_lora * 4, "olat");
  upload(q, q_h);
  upload(cache, cache_h);

  vk::CommandRecorder rec(*gpu().ctx);
  rec.begin();
  op.record(rec, q.whole(), cache.whole(), step.whole(), kPosWord, partials.whole(), olat.whole(), "attn");
  rec.end();
  EXPECT_EQ(rec.dispatch_count(), op.short_max_kv() ? 3u : 2u);  // (short +) long partial, merge
  EXPECT_EQ(rec.barrier_count(), 1u);

  for (uint32_t kv_len : c.kv_lens) {
    poison(partials);
    poison(olat);
    upload(step, std::vector<uint32_t>{0, kv_len - 1, 0, 0});
    rec.run();
    const std::vector<float> got = download<float>(olat, size_t(c.n_head) * c.kv_lora);
    const std::vector<float> want =
        test::ref_attention(q_h, cache_h, c.n_head, c.kv_lora, c.n_rot, kv_len, kv_len - 1, shape.kq_scale, rope);
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "kv_len " << kv_len << " head " << i / c.kv_lora << " col " << i % c.kv_lora;
      max_err = std::max(max_err, double(std::abs(got[i] - want[i])));
      max_ref = std::max(max_ref, double(std::abs(want[i])));
    }
    EXPECT_LT(max_err, 5e-6 + 2e-5 * max_ref) << "kv_len " << kv_len << " (" << op.num_chunks(kv_len)
                                                << " chunks, tile " << op.tile() << ", max |ref| " << max_ref << ")";
  }
}

// The merge with shared-memory tree reductions (the path of devices without subgroup arithmetic).
vk::AttentionTuning tree_merge(uint32_t n_groups, uint32_t min_chunk) {
  vk::AttentionTuning t = tuning(n_groups, min_chunk);
  t.merge_subgroup = false;
  return t;
}

// The short-context variant (fewer heads per workgroup) up to kv_len `max_kv`, then the long one.
vk::AttentionTuning short_variant(uint32_t max_kv, uint32_t heads) {
  vk::AttentionTuning t;
  t.short_max_kv = max_kv;
  t.short_heads_per_group = heads;
  return t;
}

// The short variant as attention_rows.comp (one head per workgroup, rows over its subgroups) up
// to `max_kv`, on a given chunking.
vk::AttentionTuning rows_variant(uint32_t max_kv, uint32_t n_groups = 0, uint32_t min_chunk = 0, uint32_t tile = 0,
                                 uint32_t subgroups = 0, uint32_t round = 0, uint32_t heads = 0) {
  vk::AttentionTuning t = tuning(n_groups, min_chunk, 0, tile);
  t.short_max_kv = max_kv;
  t.short_rows = true;
  t.rows_subgroups = subgroups;
  t.rows_round = round;
  t.rows_heads = heads;
  return t;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(
        // tiny heads, default split
        AttnCase{3, 64, 16, kGlmRope, {1, 7, 100, 1000}, {}, 1.f},
        // 5 heads, 7 groups with chunks of >= 24 rows (tile 8): chunk sizes that divide nothing
        AttnCase{5, 128, 64, kYarnRope, {1, 7, 100, 1000, 5000}, tuning(7, 24, 0, 8), 2.f},
        // GLM-like: 20 heads x 576, default split; sharp softmax
        AttnCase{20, 512, 64, kGlmRope, {1, 7, 100, 1000, 5000}, {}, 3.f},
        // 20 heads in workgroups of 8 (8 + 8 + 4), tile 8, many small chunks
        AttnCase{20, 512, 64, kYarnRope, {7, 100, 1000}, tuning(37, 16, 8, 8), 1.f},
        // V2-Lite-like: 16 heads, YaRN, one chunk holds everything
        AttnCase{16, 512, 64, kYarnRope, {1, 100, 1000}, tuning(1, 32), 1.f},
        // more heads than one workgroup takes (33 -> 17 + 16), tile 4
        AttnCase{33, 64, 16, kGlmRope, {1, 100, 1000}, tuning(0, 0, 0, 4), 2.f},
        // GLM-like with the short-context variant (10 heads per workgroup) up to 64 positions:
        // both variants and the switch between them, one recording
        AttnCase{20, 512, 64, kGlmRope, {1, 7, 64, 65, 100, 1000}, short_variant(64, 10), 3.f},
        // 7 heads per workgroup up to 100 positions (7 + 7 + 6)
        AttnCase{20, 512, 64, kYarnRope, {5, 100, 101, 700}, short_variant(100, 7), 1.f},
        // attention_rows.comp (where the device has subgroup arithmetic): chunks of 24 rows (tile
        // 8; not a multiple of the 16 rows a workgroup's subgroups load per round), the switch at
        // 300 positions; a single chunk of up to 1000 rows (many rounds per subgroup); rows of 80
        // values (most lanes past the row) with 3 and 33 heads; a sharp softmax
        AttnCase{20, 512, 64, kGlmRope, {1, 2, 17, 24, 25, 299, 300, 301, 1000}, rows_variant(300, 7, 24, 8), 3.f},
        AttnCase{16, 512, 64, kYarnRope, {1, 5, 999, 1000}, rows_variant(1000, 1, 16), 1.f},
        AttnCase{3, 64, 16, kGlmRope, {1, 7, 100, 1000}, rows_variant(1000, 5, 16, 4), 2.f},
        AttnCase{33, 64, 16, kYarnRope, {1, 33, 200}, rows_variant(4096), 8.f},
        // 3 subgroups loading 3 rows per round: 9 rows per round against chunks of 16
        AttnCase{20, 512, 64, kGlmRope, {1, 9, 10, 16, 17, 500}, rows_variant(500, 0, 0, 0, 3, 3), 2.f},
        // 3 heads per workgroup (20 = 6 x 3 + 2: the last group short) and 2 of 16 heads
        AttnCase{20, 512, 64, kYarnRope, {1, 17, 100, 700}, rows_variant(700, 0, 0, 0, 0, 0, 3), 2.f},
        AttnCase{16, 512, 64, kGlmRope, {2, 64, 300}, rows_variant(4096, 5, 16, 0, 2, 4, 2), 3.f},
        // the tree-reduction merge, many chunks (37 groups) and few
        AttnCase{20, 512, 64, kGlmRope, {1, 7, 100, 1000, 5000}, tree_merge(37, 16), 2.f}),
    [](const auto& info) {
      return "H" + std::to_string(info.param.n_head) + "_R" + std::to_string(info.param.kv_lora) + "_Dr" +
             std::to_string(info.param.n_rot) + "_" + info.param.rope.name + "_" + std::to_string(info.index);
    });


// The decode step's attention (record_decode): one recording per context range, the partial
// kernel an indirect dispatch whose group counts the host writes per token (decode_counts: the
// context's chunks for its range, none for the other). With the rows kernel the short range's
// merge is folded into it (the last workgroup per head group merges; its arrival counters are
// left at zero by every dispatch). Each configuration over contexts on both sides of
// short_max_kv, repeated, against the reference.
struct DecodeCase {
  const char* name;
  uint32_t n_head, kv_lora, n_rot, n_ctx, short_max;
  bool rows, merge_tail;
  uint32_t n_groups, min_chunk, rows_heads;
  std::vector<uint32_t> kv_lens;
  bool direct = false;  // AttentionTuning::direct_partial: every context workgroup, no indirect counts
  uint32_t short_groups = 0;  // AttentionTuning::short_groups (0: auto)
  bool coalesced = true;      // AttentionTuning::rows_coalesced
  bool f16 = false;           // AttentionTuning::rows_f16
  bool tc = false;            // AttentionTuning::decode_tc = 1 (the plain-FMA form without cooperative matrices)
  bool tc_prefetch = true;    // AttentionTuning::decode_tc_prefetch
  bool tc_qreg = true;        // AttentionTuning::decode_tc_qreg (with cooperative matrices)
  uint32_t tc_m_tiles = 1;    // AttentionTuning::decode_tc_m_tiles
};

TEST(AttentionDecode, EachRangeMatchesTheReference) {
  REQUIRE_GPU();
  const std::vector<DecodeCase> cases = {
      // GLM shape, the 5-head short kernel (attention_partial.comp), default chunking
      {"partial kernel, 5 heads", 20, 512, 64, 300, 40, false, false, 0, 0, 0, {1, 17, 40, 41, 299, 40}},
      // the rows kernel with its merge separate, then folded in (default chunking: up to 37 chunks)
      {"rows kernel, merge dispatch", 20, 512, 64, 300, 40, true, false, 0, 0, 0, {1, 17, 40, 41, 299, 17}, false},
      // the short range on 7 groups, the long one on the default 128 (37 chunks at 299)
      {"rows kernel, 7 short-range groups", 20, 512, 64, 300, 100, true, false, 0, 0, 0, {1, 60, 100, 101, 299}, true, 7},
      {"rows kernel, merge folded", 20, 512, 64, 300, 299, true, true, 0, 0, 0, {1, 2, 9, 17, 299, 300, 298, 1, 9}},
      // many chunks of the folded merge (128 groups, chunks of 8: 125 chunks at 1000 positions)
      {"folded, 125 chunks", 16, 512, 64, 1001, 1000, true, true, 128, 8, 0, {1000, 999, 8, 9, 1000, 1001}, false, 128},
      // 3 heads per workgroup (20 = 6 x 3 + 2): one counter per head group, the last one short
      {"folded, 3 heads per workgroup", 20, 512, 64, 200, 150, true, true, 7, 8, 3, {1, 8, 9, 57, 150, 151, 56}, false, 7},
      // rows of 80 values with 3 heads; 300 groups need more chunk weights than the kernel's
      // shared o arrays hold (4 x 64 floats): the merge stays a dispatch
      {"too many groups to fold", 3, 64, 16, 700, 600, true, true, 300, 0, 0, {1, 3, 599, 600, 601, 700}, false, 300},
      // direct dispatches of every context workgroup (the surplus exit), merge separate and folded
      {"direct, merge dispatch", 20, 512, 64, 300, 40, true, false, 0, 0, 0, {1, 17, 40, 41, 299}, true},
      {"direct, merge folded", 16, 512, 64, 400, 399, true, true, 37, 8, 0, {1, 9, 300, 399, 400, 5}, true},
      // the rows kernels' lane layout until session 20 (a lane's words consecutive)
      {"folded, per-lane words", 20, 512, 64, 300, 299, true, true, 0, 0, 0, {1, 9, 299, 300}, false, 0, false},
      {"rows of 80, per-lane words", 3, 64, 16, 200, 150, true, false, 7, 8, 0, {1, 8, 150, 151}, false, 7, false},
      // the rows kernel in packed halves (short range folded; the long range's kernel unchanged)
      {"folded, packed halves", 20, 512, 64, 1100, 1000, true, true, 0, 0, 0, {1, 9, 300, 1000, 1001}, false, 0, true, true},
      {"2 heads, packed halves", 5, 80, 16, 200, 150, true, false, 7, 8, 2, {1, 8, 150, 151}, false, 7, true, true},
      // the long range on tensor cores (attention_prefill_tc.comp SPLIT): GLM's shape (42 KB
      // of shared memory in the plain form: devices with cooperative matrices or more shared memory),
      // 20 heads in rows of 192 (two head tiles, the second overlapping the first: heads 4-19),
      // 17 heads x 48 with chunks of 8 rows (half blocks; tiles 0-15 and 1-16), 33 heads with
      // indirect counts (tiles 0, 16, 17), 3 heads (one tile, 13 dead rows: the masked writes)
      {"tensor cores, GLM", 20, 512, 64, 600, 16, true, false, 0, 0, 0, {1, 16, 17, 300, 301, 599, 33}, true, 0, true, false, true},
      {"tensor cores, rows of 192", 20, 128, 64, 600, 16, true, false, 0, 0, 0, {1, 16, 17, 300, 301, 599, 33}, true, 0, true, false, true},
      {"tensor cores, 17 x 48, chunks of 8", 17, 32, 16, 330, 6, true, false, 40, 8, 0, {1, 7, 8, 9, 200, 201, 300, 330}, true, 5, true, false, true},
      {"tensor cores, indirect counts", 33, 64, 16, 300, 8, true, true, 9, 8, 0, {1, 9, 100, 101, 299}, false, 5, true, false, true},
      {"tensor cores, 3 heads", 3, 64, 16, 300, 8, true, false, 9, 8, 0, {1, 9, 100, 101, 299}, true, 5, true, false, true},
      // each block's rows loaded in its turn; the query in shared memory (with cooperative matrices)
      {"tensor cores, no prefetch", 20, 128, 64, 600, 16, true, false, 0, 0, 0, {1, 16, 17, 300, 301, 599, 33}, true, 0, true, false, true, false},
      {"tensor cores, GLM, query in shared memory", 20, 512, 64, 600, 16, true, false, 0, 0, 0, {1, 17, 301, 599}, true, 0, true, false, true, true, false},
      // two head tiles a workgroup (each staged block serves both): GLM's and rows of 192 (one
      // workgroup: tiles 0-15, 4-19), 33 heads (tiles 0, 16 | 17 and again 17), 3 heads (a dead
      // second tile), the query in shared memory (with cooperative matrices)
      {"tensor cores, two tiles, GLM", 20, 512, 64, 600, 16, true, false, 0, 0, 0, {1, 17, 301, 599}, true, 0, true, false, true, true, true, 2},
      {"tensor cores, two tiles, rows of 192", 20, 128, 64, 600, 16, true, false, 0, 0, 0, {1, 16, 17, 300, 599, 33}, true, 0, true, false, true, true, true, 2},
      {"tensor cores, two tiles, 33 heads", 33, 64, 16, 300, 8, true, true, 9, 8, 0, {1, 9, 100, 101, 299}, false, 5, true, false, true, true, true, 2},
      {"tensor cores, two tiles, 3 heads", 3, 64, 16, 300, 8, true, false, 9, 8, 0, {1, 9, 100, 299}, true, 5, true, false, true, true, true, 2},
      {"tensor cores, two tiles, query in shared memory", 20, 128, 64, 600, 16, true, false, 0, 0, 0, {1, 17, 301, 599}, true, 0, true, false, true, true, false, 2},
  };
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE(c.name);
    const uint32_t row = c.kv_lora + c.n_rot;
    const vk::AttentionShape shape = make_shape(c.n_head, c.kv_lora, c.n_rot, c.n_ctx, kGlmRope);
    const cpu::Rope rope = cpu_rope(kGlmRope, c.n_rot);
    vk::AttentionTuning t = tuning(c.n_groups, c.min_chunk);
    t.short_max_kv = c.short_max;
    t.short_rows = c.rows;
    t.merge_tail = c.merge_tail;
    t.rows_heads = c.rows_heads;
    t.direct_partial = c.direct;
    t.short_groups = c.short_groups;
    t.rows_coalesced = c.coalesced;
    t.rows_f16 = c.f16;
    t.decode_tc = c.tc ? 1 : 0;
    t.decode_tc_prefetch = c.tc_prefetch;
    t.decode_tc_qreg = c.tc_qreg;
    t.decode_tc_m_tiles = c.tc_m_tiles;
    t.single = false;  // the single range: SingleRangeMatchesTheReference
    vk::AttentionOp op(*gpu().ctx, shape, t);
    if (c.rows && op.short_heads_per_group() != std::max(1u, c.rows_heads)) continue;  // no subgroup arithmetic
    if (c.tc && !op.decode_uses_tc()) {
      EXPECT_FALSE(vk::attention_tc_fits(*gpu().ctx, shape, vk::decode_tc_tuning(t)) &&
                   vk::attention_tc_supported(*gpu().ctx, true))
          << "the tensor-core kernel fits but was not built";
      continue;  // its shared memory does not fit this device in the plain form
    }
    const uint32_t sgroups = op.decode_groups(vk::DecodeRange::Short);
    if (c.rows) EXPECT_EQ(sgroups, c.short_groups ? c.short_groups : std::min(op.n_groups(), 32u));
    const bool folded = c.merge_tail && uint64_t(4) * std::max(1u, c.rows_heads) * c.kv_lora >= sgroups;
    EXPECT_EQ(op.merge_folded(vk::DecodeRange::Short), folded);
    EXPECT_FALSE(op.merge_folded(vk::DecodeRange::Long));
    EXPECT_EQ(op.decode_range(c.short_max), vk::DecodeRange::Short);
    EXPECT_EQ(op.decode_range(c.short_max + 1), vk::DecodeRange::Long);
    uint32_t words[vk::AttentionOp::kDecodeCountWords];
    op.decode_counts(c.short_max, words);
    EXPECT_EQ(words[0], gpu::ts_attn_num_chunks(c.short_max, sgroups, op.min_chunk(), op.tile()));
    EXPECT_EQ(words[1], (c.n_head + op.short_heads_per_group() - 1) / op.short_heads_per_group());
    if (c.tc) EXPECT_EQ(words[4], ((c.n_head + 15) / 16 + c.tc_m_tiles - 1) / c.tc_m_tiles);
    EXPECT_EQ(words[3], 0u) << "long range idle";
    op.decode_counts(c.short_max + 1, words);
    EXPECT_EQ(words[0], 0u) << "short range idle";
    EXPECT_EQ(words[3], op.num_chunks(c.short_max + 1));

    std::vector<uint16_t> cache_h(size_t(c.n_ctx) * row);
    const std::vector<float> v = test::random_values(cache_h.size(), 1.f, 21);
    for (size_t i = 0; i < v.size(); ++i) cache_h[i] = f32_to_fp16(v[i]);
    // A new query for every context length: a kernel that used shared memory it did not write
    // this run (a workgroup before it staged the same query) would read the last run's.
    std::vector<float> q_h = test::random_values(size_t(c.n_head) * row, 2.f, 22);
    vk::Buffer q = make_buffer(q_h.size() * 4, "q"), cache = make_buffer(shape.cache_bytes(), "cache");
    vk::Buffer step = make_buffer(64, "step"), partials = make_buffer(op.partials_bytes(), "partials");
    vk::Buffer arrivals = make_buffer(op.arrivals_bytes(), "arrivals");
    vk::Buffer olat = make_buffer(size_t(c.n_head) * c.kv_lora * 4, "olat");
    upload(q, q_h);
    upload(cache, cache_h);
    upload(arrivals, std::vector<uint32_t>(op.arrivals_bytes() / 4, 0));
    vk::CommandRecorder rec_short(*gpu().ctx), rec_long(*gpu().ctx);
    for (vk::DecodeRange range : {vk::DecodeRange::Short, vk::DecodeRange::Long}) {
      vk::CommandRecorder& rec = range == vk::DecodeRange::Short ? rec_short : rec_long;
      rec.begin();
      op.record_decode(rec, q.whole(), cache.whole(), step.whole(), kPosWord, step.whole().sub(16, 24),
                       partials.whole(), arrivals.whole(), olat.whole(), range, "attn");
      rec.end();
      const bool f = op.merge_folded(range);
      EXPECT_EQ(rec.dispatch_count(), f ? 1u : 2u);  // partial (+ merge)
      EXPECT_EQ(rec.barrier_count(), f ? 0u : 1u);
    }
    for (uint32_t kv_len : c.kv_lens) {
      q_h = test::random_values(q_h.size(), 2.f, 22 + kv_len);
      upload(q, q_h);
      poison(olat);
      poison(partials);
      op.decode_counts(kv_len, words);
      if (c.direct) std::fill(words, words + vk::AttentionOp::kDecodeCountWords, 0u);  // unread
      std::vector<uint32_t> sw = {0, kv_len - 1, 0, 0};
      sw.insert(sw.end(), words, words + vk::AttentionOp::kDecodeCountWords);
      upload(step, sw);
      (op.decode_range(kv_len) == vk::DecodeRange::Short ? rec_short : rec_long).run();
      const std::vector<float> got = download<float>(olat, size_t(c.n_head) * c.kv_lora);
      // The tensor-core kernel (the long range): against the reference with its query rounded to
      // f16 as staged, P in f16.
      const bool tc = c.tc && op.decode_range(kv_len) == vk::DecodeRange::Long;
      expect_olat_near(got, q_h, cache_h, c.n_head, c.kv_lora, c.n_rot, kv_len, shape.kq_scale, rope,
                       c.f16 ? kF16OlatTol : tc ? kTcOlatTol : kF32OlatTol, tc);
      for (uint32_t a : download<uint32_t>(arrivals, op.arrivals_bytes() / 4))
        ASSERT_EQ(a, 0u) << "kv_len " << kv_len << ": an arrival counter was left set";
    }
  }
}

// The merge's int8 copy of olat (record_merge with olat_q8, the input of W_vo's int8 kernel):
// every block equals the CPU quantization of the f32 olat it wrote (a byte may be one step off
// where x / d lands on a half: the GPU's division), over GLM and tiny shapes and several chunkings.
TEST(AttentionMerge, WritesOlatAsInt8Blocks) {
  REQUIRE_GPU();
  struct MergeCase {
    uint32_t n_head, kv_lora, n_rot, kv_len;
  };
  for (const MergeCase& c : {MergeCase{20, 512, 64, 1}, MergeCase{20, 512, 64, 1000}, MergeCase{3, 64, 16, 77},
                             MergeCase{16, 512, 64, 300}}) {
    SCOPED_TRACE(cat("H", c.n_head, " R", c.kv_lora, " kv_len ", c.kv_len));
    const uint32_t row = c.kv_lora + c.n_rot, n_ctx = c.kv_len + 2;
    const vk::AttentionShape shape = make_shape(c.n_head, c.kv_lora, c.n_rot, n_ctx, kGlmRope);
    vk::AttentionOp op(*gpu().ctx, shape, {});
    ASSERT_TRUE(op.writes_olat_q8());
    std::vector<uint16_t> cache_h(size_t(n_ctx) * row);
    const std::vector<float> v = test::random_values(cache_h.size(), 1.f, 31);
    for (size_t i = 0; i < v.size(); ++i) cache_h[i] = f32_to_fp16(v[i]);
    const std::vector<float> q_h = test::random_values(size_t(c.n_head) * row, 2.f, 32);
    vk::Buffer q = make_buffer(q_h.size() * 4, "q"), cache = make_buffer(shape.cache_bytes(), "cache");
    vk::Buffer step = make_buffer(16, "step"), partials = make_buffer(op.partials_bytes(), "partials");
    vk::Buffer olat = make_buffer(size_t(c.n_head) * c.kv_lora * 4, "olat");
    vk::Buffer olat_q8 = make_buffer(op.olat_q8_bytes(), "olat q8");
    upload(q, q_h);
    upload(cache, cache_h);
    upload(step, std::vector<uint32_t>{0, c.kv_len - 1, 0, 0});
    poison(olat_q8);
    vk::CommandRecorder rec(*gpu().ctx);
    rec.begin();
    op.record_partial(rec, q.whole(), cache.whole(), step.whole(), kPosWord, partials.whole(), "partial");
    rec.barrier();
    op.record_merge(rec, partials.whole(), step.whole(), kPosWord, olat.whole(), "merge", {}, olat_q8.whole());
    rec.end();
    rec.run();
    const std::vector<float> o = download<float>(olat, size_t(c.n_head) * c.kv_lora);
    const std::vector<uint32_t> got = download<uint32_t>(olat_q8, op.olat_q8_bytes() / 4);
    vktest::expect_q8_blocks_close(got, vktest::q8_blocks(o), "olat q8");
  }
}

// The int8 olat is written by the merge dispatch only: where the short range's merge is folded
// into the rows kernel there is none, so record_decode refuses an olat_q8 binding there (W_vo
// would read stale blocks) instead of ignoring it; the long range's merge writes it.
TEST(AttentionDecode, FoldedMergeRefusesInt8Olat) {
  REQUIRE_GPU();
  const vk::AttentionShape shape = make_shape(4, 64, 16, 64, kGlmRope);
  vk::AttentionTuning t;
  t.short_max_kv = 32;
  t.merge_tail = true;
  vk::AttentionOp op(*gpu().ctx, shape, t);
  if (!op.merge_folded(vk::DecodeRange::Short)) GTEST_SKIP() << "no rows kernel (subgroup arithmetic)";
  ASSERT_TRUE(op.writes_olat_q8());
  vk::Buffer q = make_buffer(4 * shape.row() * 4, "q"), cache = make_buffer(shape.cache_bytes(), "cache");
  vk::Buffer step = make_buffer(64, "step"), partials = make_buffer(op.partials_bytes(), "partials");
  vk::Buffer arrivals = make_buffer(op.arrivals_bytes(), "arrivals"), olat = make_buffer(4 * 64 * 4, "olat");
  vk::Buffer olat_q8 = make_buffer(op.olat_q8_bytes(), "olat q8");
  vk::CommandRecorder rec(*gpu().ctx);
  rec.begin();
  EXPECT_THROW(op.record_decode(rec, q.whole(), cache.whole(), step.whole(), kPosWord, step.whole().sub(16, 24),
                                partials.whole(), arrivals.whole(), olat.whole(), vk::DecodeRange::Short, "attn",
                                olat_q8.whole()),
               Error);
  op.record_decode(rec, q.whole(), cache.whole(), step.whole(), kPosWord, step.whole().sub(16, 24), partials.whole(),
                   arrivals.whole(), olat.whole(), vk::DecodeRange::Long, "attn", olat_q8.whole());
  rec.end();
  EXPECT_NE(rec.dispatches().back().label.find(".q8out"), std::string::npos);
}

// The decode loop as the model records it: kv_write, barrier, attention; one recording reused for
// every token, the position advanced by the host between submissions.
TEST(AttentionDecode, KvWriteThenAttentionOverGrowingContext) {
  REQUIRE_GPU();
  const uint32_t n_head = 5, kv_lora = 64, n_rot = 16, n_ctx = 40, row = kv_lora + n_rot;
  const vk::AttentionShape shape = make_shape(n_head, kv_lora, n_rot, n_ctx, kYarnRope);
  const cpu::Rope rope = cpu_rope(kYarnRope, n_rot);
  vk::KvWriteOp write(*gpu().ctx, shape);
  vk::AttentionOp attn(*gpu().ctx, shape, tuning(4, 8, 0, 8));

  vk::Buffer kv = make_buffer(row * 4, "kv"), norm = make_buffer(kv_lora * 4, "norm");
  vk::Buffer q = make_buffer(n_head * row * 4, "q"), step = make_buffer(16, "step");
  vk::Buffer cache = make_buffer(shape.cache_bytes(), "cache"), partials = make_buffer(attn.partials_bytes(), "partials");
  vk::Buffer olat = make_buffer(n_head * kv_lora * 4, "olat");
  const std::vector<float> norm_w = test::random_values(kv_lora, 1.5f, 3);
  upload(norm, norm_w);
  upload(cache, std::vector<uint16_t>(size_t(n_ctx) * row, 0x7E00));

  vk::CommandRecorder rec(*gpu().ctx);
  rec.begin();
  write.record(rec, kv.whole(), norm.whole(), step.whole(), kPosWord, cache.whole(), "kv_write");
  rec.barrier();
  attn.record(rec, q.whole(), cache.whole(), step.whole(), kPosWord, partials.whole(), olat.whole(), "attn");
  rec.end();

  std::vector<uint16_t> cache_ref(size_t(n_ctx) * row);
  for (uint32_t pos = 0; pos < 37; ++pos) {
    const std::vector<float> kv_in = test::random_values(row, 2.f, 1000 + pos);
    const std::vector<float> q_in = test::random_values(n_head * row, 1.5f, 2000 + pos);
    upload(kv, kv_in);
    upload(q, q_in);
    upload(step, std::vector<uint32_t>{0, pos, 0, 0});
    poison(olat);
    rec.run();
    const std::vector<uint16_t> r = test::ref_kv_row(kv_in, norm_w, shape.eps, rope, pos);
    std::copy(r.begin(), r.end(), cache_ref.begin() + long(pos) * row);
    // Compare against the reference over the GPU's own cache rows (f16 rounding may differ by an ulp).
    const std::vector<uint16_t> cache_gpu = download<uint16_t>(cache, size_t(n_ctx) * row);
    for (size_t i = 0; i < size_t(pos + 1) * row; ++i)
      ASSERT_NEAR(fp16_to_f32(cache_gpu[i]), fp16_to_f32(cache_ref[i]), std::abs(fp16_to_f32(cache_ref[i])) * 1e-3f + 1e-6f)
          << "pos " << pos << " element " << i;
    const std::vector<float> want = test::ref_attention(q_in, cache_gpu, n_head, kv_lora, n_rot, pos + 1, pos, shape.kq_scale, rope);
    const std::vector<float> got = download<float>(olat, n_head * kv_lora);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 5e-6 + 2e-5 * std::abs(want[i])) << "pos " << pos << " index " << i;
  }
}

TEST(AttentionShapeTest, RefusesUnusableSizes) {
  vk::AttentionShape s = make_shape(4, 60, 16, 100, kGlmRope);
  EXPECT_THROW(s.validate(), Error);  // kv_lora not a multiple of 8
  s = make_shape(4, 64, 12, 100, kGlmRope);
  EXPECT_THROW(s.validate(), Error);  // rope dims not a multiple of 8
  s = make_shape(4, 64, 16, 0, kGlmRope);
  EXPECT_THROW(s.validate(), Error);  // no context
  s = make_shape(4, 64, 16, 100, kGlmRope);
  EXPECT_NO_THROW(s.validate());
}

// The decode step's tensor-core long range (AttentionTuning::decode_tc): built where asked and
// possible, and then the rows kernel's range ends at 6144 positions (unless short_max_kv says
// otherwise); never with decode_tc 0; a group count other than 4 or 8 is refused by name; a shape
// the kernel cannot take (rows of 136 values, not a multiple of 16) leaves the FMA kernels in place.
TEST(AttentionShapeTest, DecodeTensorCoresWhereAskedAndPossible) {
  REQUIRE_GPU();
  vk::Context& ctx = *gpu().ctx;
  const vk::AttentionShape shape = make_shape(20, 128, 64, 20000, kGlmRope);
  vk::AttentionTuning t;
  t.decode_tc = 0;
  const vk::AttentionOp off(ctx, shape, t);
  EXPECT_FALSE(off.decode_uses_tc());
  t.decode_tc = 1;
  const bool possible = vk::attention_tc_supported(ctx, true) && vk::attention_tc_fits(ctx, shape);
  const vk::AttentionOp on(ctx, shape, t);
  EXPECT_EQ(on.decode_uses_tc(), possible);
  if (possible && on.short_heads_per_group() == 1) {  // the rows kernel's short range
    EXPECT_EQ(on.short_max_kv(), 6144u);
    EXPECT_EQ(on.decode_range(6145), vk::DecodeRange::Long);
    EXPECT_EQ(off.short_max_kv(), 16384u);
    t.short_max_kv = 9000;
    EXPECT_EQ(vk::AttentionOp(ctx, shape, t).short_max_kv(), 9000u);
    t.short_max_kv = 0;
  }
  t.decode_tc_groups = 5;
  try {
    vk::AttentionOp bad(ctx, shape, t);
    ADD_FAILURE() << "5 groups accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("5 tensor-core groups"), std::string::npos) << e.what();
  }
  t.decode_tc_groups = 8;
  EXPECT_EQ(vk::decode_tc_tuning(t).tc_groups, 8u);
  EXPECT_EQ(vk::AttentionOp(ctx, shape, t).decode_uses_tc(),
            vk::attention_tc_supported(ctx, true) && vk::attention_tc_fits(ctx, shape, vk::decode_tc_tuning(t)));
  t.decode_tc_groups = 4;
  EXPECT_FALSE(vk::AttentionOp(ctx, make_shape(20, 128, 8, 20000, kGlmRope), t).decode_uses_tc()) << "rows of 136";
}

// The rows kernel's tuning: out-of-range knobs and subgroup counts whose (m, l, o) would not fit
// the device's shared memory are refused with a message, not handed to the driver.
TEST(AttentionShapeTest, RowsKernelRefusesWhatTheDeviceCannotHold) {
  REQUIRE_GPU();
  if (!gpu().ctx->pipelines().use_subgroup()) GTEST_SKIP() << "no subgroup arithmetic: no rows kernel";
  const vk::AttentionShape shape = make_shape(20, 512, 64, 100, kGlmRope);
  vk::AttentionTuning t;
  t.rows_subgroups = 17;
  EXPECT_THROW(vk::AttentionOp(*gpu().ctx, shape, t), Error);
  t.rows_subgroups = 4;
  t.rows_round = 9;
  EXPECT_THROW(vk::AttentionOp(*gpu().ctx, shape, t), Error);
  t.rows_round = 0;
  t.rows_heads = 5;
  EXPECT_THROW(vk::AttentionOp(*gpu().ctx, shape, t), Error);
  t.rows_heads = 0;
  t.rows_round = 0;
  t.rows_subgroups = 16;
  const vk::DeviceInfo& info = gpu().ctx->info();
  const bool fits = 16ull * (512 + 2) * 4 <= info.max_compute_shared_memory &&
                    16ull * info.subgroup_size <= info.max_compute_workgroup_invocations;
  if (fits)
    EXPECT_NO_THROW(vk::AttentionOp(*gpu().ctx, shape, t));
  else
    EXPECT_THROW(vk::AttentionOp(*gpu().ctx, shape, t), Error);
}

TEST(AttentionChunks, ChunkRuleCoversContextWithinGroupBudget) {
  for (uint32_t groups : {1u, 7u, 256u})
    for (uint32_t min_chunk : {8u, 64u})
      for (uint32_t kv_len : {1u, 7u, 63u, 64u, 65u, 1000u, 5000u, 202752u}) {
        const uint32_t len = gpu::ts_attn_chunk_len(kv_len, groups, min_chunk, 8);
        const uint32_t n = gpu::ts_attn_num_chunks(kv_len, groups, min_chunk, 8);
        EXPECT_LE(n, groups);
        EXPECT_GE(uint64_t(n) * len, kv_len);
        EXPECT_LT(uint64_t(n - 1) * len, kv_len);  // the last chunk is not empty
        EXPECT_EQ(len % 8, 0u);
        EXPECT_GE(len, min_chunk);
      }
}

}  // namespace
}  // namespace tessera
