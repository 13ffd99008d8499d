// PrefillAttentionOp (attention_prefill.comp + the QueryBatch merge) against the CPU reference of
// test_attention_ref.h and against the per-query path (AttentionOp with a QueryBatch): GLM (20
// heads), V2-Lite (16 heads) and tiny shapes; live query counts 1, G-1, G, G+1, 2G+3; contexts
// shorter than a tile; first positions off the tile grid; split-K chunk counts that differ between
// the queries of a group (the empty-partial case). One recording per case, resubmitted with
// changed (p0, n); outputs poisoned before every run; padding queries must stay NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "format/fp16.h"
#include "runtime/cpu/ops.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_matmul.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "tests/vulkan/test_attention_ref.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

constexpr uint32_t kPosWord = 0, kCountWord = 1;  // step words: [first position, live queries]

struct ChunkRun {
  uint32_t p0, n;  // first position, live queries
};

struct PrefillAttnCase {
  const char* name;
  uint32_t n_head, kv_lora, n_rot, n_ctx, T;
  vk::AttentionTuning split;
  vk::PrefillAttentionTuning tuning;
  std::vector<ChunkRun> runs;  // n in [1, T]; p0 + n <= n_ctx except where a case tests the context end
  float cache_ramp = 0;        // cache row j scaled by 1 + cache_ramp * j: scores that grow along the
                               // context, so the one-pass kernel's running maxima move (its rescales)
};

void PrintTo(const PrefillAttnCase& c, std::ostream* os) { *os << c.name; }

vk::AttentionShape make_shape(const PrefillAttnCase& c) {
  ModelConfig m;
  m.n_rot = c.n_rot;
  m.rope_base = 1e6f;  // GLM's plain rope
  vk::AttentionShape s;
  s.n_head = c.n_head;
  s.kv_lora = c.kv_lora;
  s.n_ctx = c.n_ctx;
  s.eps = 1e-5f;
  s.kq_scale = 1.f / std::sqrt(float(c.kv_lora / 2 + c.n_rot));
  s.rope = vk::RopeParams::from_config(m);
  return s;
}

class PrefillAttentionGroups : public ::testing::TestWithParam<PrefillAttnCase> {};

// One case on one kernel: the grouped FMA kernel (tensor_cores 0) against the reference and the
// per-query path within f32 rounding, or the tensor-core kernel (1; its plain-FMA form where the
// device has no cooperative matrices) against the reference with its query rounded to f16 as the
// kernel stages it, within the f16 weights' rounding (rel_tol of the largest value).
// tc: changes to the tensor-core kernel's tuning (its defaults otherwise).
void check_prefill_attention(const PrefillAttnCase& c, int tensor_cores, double rel_tol,
                             const std::function<void(vk::PrefillAttentionTuning&)>& tc = {}) {
  Gpu& g = vktest::gpu();
  const vk::AttentionShape s = make_shape(c);
  const cpu::Rope rope(c.n_rot, 1e6f, 1.f, 0.f, 1.f, cpu::YarnCorrDims{0.f, 0.f});
  const uint32_t T = c.T, H = c.n_head, R = c.kv_lora, row = s.row();
  vk::PrefillAttentionTuning tuning = c.tuning;
  tuning.tensor_cores = tensor_cores;
  if (tc) tc(tuning);
  vk::PrefillAttentionOp op(*g.ctx, s, c.split, tuning);
  ASSERT_EQ(op.tensor_cores(), tensor_cores == 1);
  if (op.tensor_cores() && tuning.tc_split)
    ASSERT_EQ(op.tc_split(), std::min(tuning.tc_split, op.attention().n_groups())) << "the split asked for";
  const bool f16 = tuning.tc_f16_olat;  // olat written as f16 (the composed W_vo's matmul input)
  ASSERT_EQ(op.writes_f16_olat(), f16);
  vk::AttentionOp per_query(*g.ctx, s, c.split);
  ASSERT_EQ(op.partials_bytes(), per_query.partials_bytes());
  SCOPED_TRACE(cat(c.name, op.tensor_cores() ? cat(", tensor cores, prefetch ", tuning.tc_prefetch, " margin ", tuning.tc_margin,
                                                    " double_k ", tuning.tc_double_k, " qreg ", tuning.tc_qreg,
                                                    " stagger ", tuning.tc_stagger, " m_tiles ", tuning.tc_m_tiles,
                                                    " split ", tuning.tc_split, " (built: ", op.tc_split(), ")",
                                                    " groups ", tuning.tc_groups, f16 ? " f16 olat" : "")
                                              : "",
                   ": G ", op.queries_per_group(), " heads/group ",
                   op.heads_per_group(), " tile ", op.tile(), " threads ", op.threads(), " split tile ",
                   op.attention().tile()));

  std::mt19937 rng(5);
  std::vector<uint16_t> cache_h(size_t(c.n_ctx) * row);
  {
    const std::vector<float> v = vktest::random_values(rng, cache_h.size());
    for (size_t i = 0; i < v.size(); ++i) cache_h[i] = f32_to_fp16(v[i] * (1.f + c.cache_ramp * float(i / row)));
  }
  const std::vector<float> q_h = vktest::random_values(rng, size_t(T) * H * row, 2.f);
  vk::Buffer q = vktest::make_buffer(g, q_h.size() * 4, "q"), cache = vktest::make_buffer(g, s.cache_bytes(), "cache");
  vktest::upload_bytes(g, q, q_h.data(), q_h.size() * 4);
  vktest::upload_bytes(g, cache, cache_h.data(), cache_h.size() * 2);
  vk::Buffer step = vktest::make_buffer(g, 16, "step");
  vk::Buffer part_a = vktest::make_buffer(g, T * op.partials_bytes(), "partials grouped");
  vk::Buffer part_b = vktest::make_buffer(g, T * op.partials_bytes(), "partials per query");
  vk::Buffer olat_a = vktest::make_buffer(g, size_t(T) * H * R * 4, "olat grouped");
  vk::Buffer olat_b = vktest::make_buffer(g, size_t(T) * H * R * 4, "olat per query");
  const vk::QueryBatch batch{T, kCountWord};
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  op.record(rec, q.whole(), cache.whole(), step.whole(), kPosWord, part_a.whole(), olat_a.whole(), "grouped", batch, f16);
  per_query.record(rec, q.whole(), cache.whole(), step.whole(), kPosWord, part_b.whole(), olat_b.whole(), "per query", batch);
  rec.end();

  for (const ChunkRun& run : c.runs) {
    SCOPED_TRACE(cat("p0 ", run.p0, " n ", run.n));
    const uint32_t words[4] = {run.p0, run.n, 0, 0};
    vktest::upload_bytes(g, step, words, sizeof words);
    for (vk::Buffer* b : {&part_a, &part_b, &olat_a, &olat_b}) vktest::poison(g, *b);
    rec.run();
    std::vector<float> a = vktest::download_floats(g, olat_a, size_t(T) * H * R);
    if (f16) {  // halves: the values, then the poison's words (0x7FC00000 as 0x0000, 0x7FC0) past the live queries
      std::vector<uint16_t> h(a.size());
      std::memcpy(h.data(), a.data(), h.size() * 2);
      for (size_t k = 0; k < h.size(); ++k)
        a[k] = k < size_t(run.n) * H * R ? fp16_to_f32(h[k])
                                         : (h[k] == (k % 2 ? 0x7FC0 : 0x0000) ? std::nanf("") : 0.f);
    }
    const std::vector<float> b = vktest::download_floats(g, olat_b, size_t(T) * H * R);
    for (uint32_t t = 0; t < run.n; ++t) {
      const uint32_t pos = run.p0 + t, kv_len = std::min(pos + 1, c.n_ctx);
      const std::vector<float> qt(q_h.begin() + long(t) * H * row, q_h.begin() + long(t + 1) * H * row);
      const std::vector<float> want =
          test::ref_attention(qt, cache_h, H, R, c.n_rot, kv_len, pos, s.kq_scale, rope, op.tensor_cores());
      double max_ref = 0;
      for (float v : want) max_ref = std::max(max_ref, double(std::fabs(v)));
      const double tol = 5e-6 + rel_tol * max_ref;
      for (size_t i = 0; i < want.size(); ++i) {
        const size_t k = size_t(t) * H * R + i;
        ASSERT_TRUE(std::isfinite(a[k])) << "query " << t << " head " << i / R << " col " << i % R;
        ASSERT_NEAR(a[k], want[i], tol) << "vs reference: query " << t << " head " << i / R << " col " << i % R;
        if (!op.tensor_cores()) {
          ASSERT_NEAR(a[k], b[k], tol) << "vs per-query kernel: query " << t << " head " << i / R << " col " << i % R;
        }
      }
    }
    for (size_t k = size_t(run.n) * H * R; k < a.size(); ++k)
      ASSERT_TRUE(std::isnan(a[k])) << "padding query " << k / (size_t(H) * R) << " wrote";
  }
}

TEST_P(PrefillAttentionGroups, MatchReferenceAndPerQueryPath) {
  VK_TEST_REQUIRE_GPU(vktest::gpu());
  // Scores of hundreds of nats (the rising cases) lose f32 digits in exp(s - m): 1e-7 of 400 is
  // 4e-5 (the H100's split and per-query kernels differed by 1.2e-4 of the largest value).
  check_prefill_attention(GetParam(), 0, GetParam().cache_ramp != 0 ? 5e-4 : 2e-5);
}

// The tensor-core kernel (attention_prefill_tc.comp) on the same cases: f16 queries (roped and
// scaled; the reference rounds them too) and f16 weights P, f32 sums.
TEST_P(PrefillAttentionGroups, TensorCoreKernelMatchesTheReference) {
  VK_TEST_REQUIRE_GPU(vktest::gpu());
  if (!vk::attention_tc_supported(*vktest::gpu().ctx, true)) GTEST_SKIP() << "no subgroup shuffles of >= 8 lanes";
  vk::Context& ctx = *vktest::gpu().ctx;
  if (!vk::attention_tc_fits(ctx, make_shape(GetParam())))
    GTEST_SKIP() << vk::attention_tc_shared_bytes(ctx, make_shape(GetParam())) << " bytes of shared memory: more than the device has";
  check_prefill_attention(GetParam(), 1, 1e-3);
  using Tuning = vk::PrefillAttentionTuning;
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_prefetch = false; });  // each block in its turn
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_margin = 0; });  // a rescale at every new maximum
  // two buffers, 3 barriers (they alternate by the walk's step, not the block's index)
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_double_k = true; });
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_groups = 8, t.tc_m_tiles = 1; });  // 256 invocations
  // every workgroup's walk from block 0 (the default walks from its own block, around)
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_stagger = false; });
  // one tile of 16 rows a workgroup (the default: two, 8 groups, each staged block serving both)
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_m_tiles = 1; });
  if (vk::matmul_coop_supported(ctx))
    check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_qreg = false; });  // the query in shared memory
  // each tile's walk in 2 or 3 context chunks (at most the case's split groups), the partials
  // merged: chunk bounds that differ between the queries of a tile, chunks empty for some rows
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_split = 2; });
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_split = 3, t.tc_m_tiles = 1; });
  check_prefill_attention(GetParam(), 1, 1e-3, [](Tuning& t) { t.tc_split = 3, t.tc_margin = 0, t.tc_stagger = false; });
  if (ctx.device().enabled().shader_float16)  // olat as f16: one more f16 rounding
    check_prefill_attention(GetParam(), 1, 2e-3, [](Tuning& t) { t.tc_f16_olat = true; });
}

vk::AttentionTuning split(uint32_t n_groups, uint32_t min_chunk, uint32_t tile = 0) {
  vk::AttentionTuning t;
  t.n_groups = n_groups;
  t.min_chunk = min_chunk;
  t.tile = tile;
  return t;
}

// The grouped FMA kernel's tuning (tensor_cores 0: these cases check it wherever they run).
vk::PrefillAttentionTuning group(uint32_t queries, uint32_t max_pairs = 0, uint32_t tile = 0) {
  vk::PrefillAttentionTuning t;
  t.tensor_cores = 0;
  t.queries_per_group = queries;
  t.max_pairs = max_pairs;
  t.tile = tile;
  return t;
}

// Live counts 1, G-1, G, G+1, 2G+3 (G = 8) at first positions on and off the tile grid.
std::vector<ChunkRun> counts_g8(uint32_t p0_off) {
  return {{p0_off, 1}, {0, 7}, {p0_off, 8}, {p0_off + 16, 9}, {p0_off, 19}, {0, 19}, {0, 2}};
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PrefillAttentionGroups,
    ::testing::Values(
        // GLM-4.7-Flash: 20 heads, R 512, Dr 64; G 8 x 4 heads (5 head groups); prefill split-K.
        PrefillAttnCase{"glm", 20, 512, 64, 160, 19, split(32, 8), {}, counts_g8(37)},
        // V2-Lite: 16 heads; 4 split groups with chunks of >= 16 rows (several chunks per query).
        PrefillAttnCase{"v2lite", 16, 512, 64, 200, 19, split(4, 16), {}, counts_g8(53)},
        // tiny, 3 heads, G 5 (one head group, 15 pairs); 4 groups of >= 4 rows: the chunk count of
        // the queries of one group differs (e.g. kv_len 16 -> 4 chunks, 17 -> 3), so queries
        // write empty partials for chunks past their rows; n_ctx reached by the last run.
        PrefillAttnCase{"tiny", 3, 64, 16, 48, 13, split(4, 4, 4), group(5),
                        {{0, 1}, {0, 4}, {0, 5}, {11, 6}, {15, 13}, {3, 13}, {12, 2}, {40, 8}}},
        // tiny, 64 pairs (G 16 x 3 heads = 48), staged tile 2, 7 split groups of >= 8 rows.
        PrefillAttnCase{"tiny-64pairs", 3, 64, 16, 120, 35, split(7, 8, 8), group(16, 64, 2),
                        {{0, 1}, {5, 15}, {5, 16}, {29, 17}, {61, 35}, {0, 35}}},
        // 5 heads, G 6 -> 5 heads per group at 32 pairs; tile 4 staging a tile-16 split.
        PrefillAttnCase{"h5", 5, 128, 32, 90, 14, split(5, 16, 16), group(6, 32, 4),
                        {{0, 1}, {2, 5}, {2, 6}, {7, 7}, {30, 14}, {76, 14}}},
        // Scores growing along the context (to hundreds of nats): the one-pass kernel's row
        // maxima move past its margin, some by more than f32's exp range (a scale of 0).
        PrefillAttnCase{"h5-rising", 5, 128, 32, 120, 14, split(5, 16, 16), group(6, 32, 4),
                        {{0, 14}, {40, 14}, {99, 14}}, 0.1f},
        PrefillAttnCase{"glm-rising", 20, 512, 64, 200, 19, split(32, 8), {}, {{0, 19}, {90, 19}, {181, 19}}, 0.05f}),
    [](const ::testing::TestParamInfo<PrefillAttnCase>& info) {
      std::string name = info.param.name;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// Two tiles of 16 rows a workgroup (the default) where they fit the shared memory, else one: asking
// for two never fits less than asking for one, and the layout reported is one that fits. On
// lavapipe (32 KB) rows of 256 without the query in registers fit only as one tile (21.4 KB
// against 34.4), GLM's rows in neither form.
TEST(PrefillAttentionShape, TwoTilesFallBackToOneWhereTheyDoNotFit) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  vk::Context& ctx = *g.ctx;
  if (!vk::attention_tc_supported(ctx, true)) GTEST_SKIP() << "no subgroup shuffles of >= 8 lanes";
  for (const PrefillAttnCase& c : {PrefillAttnCase{"glm", 20, 512, 64, 160, 19, {}, {}, {}},
                                   PrefillAttnCase{"rows of 256", 20, 192, 64, 160, 19, {}, {}, {}},
                                   PrefillAttnCase{"tiny", 3, 64, 16, 48, 13, {}, {}, {}}}) {
    for (bool qreg : {true, false}) {
      SCOPED_TRACE(cat(c.name, " qreg ", qreg));
      const vk::AttentionShape shape = make_shape(c);
      vk::PrefillAttentionTuning one, two;
      one.tc_m_tiles = 1;
      two.tc_m_tiles = 2;
      one.tc_qreg = two.tc_qreg = qreg;
      one.tensor_cores = two.tensor_cores = 1;
      const bool fits = vk::attention_tc_fits(ctx, shape, two);
      EXPECT_EQ(fits, vk::attention_tc_fits(ctx, shape, one));
      if (!fits) continue;
      EXPECT_LE(vk::attention_tc_shared_bytes(ctx, shape, two), ctx.info().max_compute_shared_memory);
      EXPECT_LE(vk::attention_tc_shared_bytes(ctx, shape, one), vk::attention_tc_shared_bytes(ctx, shape, two));
      EXPECT_TRUE(vk::PrefillAttentionOp(ctx, shape, {}, two).tensor_cores());
    }
  }
}

// The automatic split of the tensor-core walks: the smallest within 5 % of the fewest rounds of
// resident workgroups, none where the SM count is unknown.
TEST(PrefillAttentionShape, AutomaticSplitTakesTheFewestRounds) {
  EXPECT_EQ(vk::prefill_tc_split(320, 132, 4), 2u);  // 512 tokens x 20 heads / 32 rows: 3 rounds -> 2.5
  EXPECT_EQ(vk::prefill_tc_split(320, 132, 8), 2u);  // (7: 2.43, within 5 % of 2.5)
  EXPECT_EQ(vk::prefill_tc_split(40, 132, 4), 3u);   // a 64-token tail: one third of a round
  EXPECT_EQ(vk::prefill_tc_split(264, 132, 4), 1u);  // two whole rounds already
  EXPECT_EQ(vk::prefill_tc_split(100, 132, 8), 5u);  // 500 fifths in 4 rounds: 0.8 (halves: 2 rounds, 1.0)
  EXPECT_EQ(vk::prefill_tc_split(100, 132, 4), 1u);  // halves, thirds, quarters: 1.0 each, a tie
  EXPECT_EQ(vk::prefill_tc_split(320, 132, 1), 1u);
  EXPECT_EQ(vk::prefill_tc_split(320, 0, 8), 1u);
  EXPECT_EQ(vk::prefill_tc_split(0, 132, 8), 1u);
}

// The declared bytes: the cache once per (query group, head group), not once per query.
TEST(PrefillAttentionBytes, CacheReadOncePerGroup) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  PrefillAttnCase c{"glm", 20, 512, 64, 8192 + 64, 64, split(32, 8), group(0), {}};
  const vk::AttentionShape s = make_shape(c);
  vk::PrefillAttentionOp op(*g.ctx, s, c.split, c.tuning);
  vk::AttentionOp per_query(*g.ctx, s, c.split);
  const uint64_t row_bytes = s.row() * 2ull, kv = 8192;
  const uint64_t passes = (64 / op.queries_per_group()) * ((20 + op.heads_per_group() - 1) / op.heads_per_group());
  const uint64_t rest = 64ull * 20 * s.row() * 4 + 64ull * per_query.num_chunks(kv) * 20 * (512 + 2) * 4;
  EXPECT_EQ(op.partial_bytes(kv, 64), passes * kv * row_bytes + rest);
  EXPECT_LT(op.partial_bytes(kv, 64), 64 * per_query.partial_bytes(kv));
}

}  // namespace
}  // namespace tessera
