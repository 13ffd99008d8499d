// The decode step's short attention range on tensor cores (attention_coop.comp through
// AttentionOp::record_decode, AttentionTuning::short_coop) against the CPU reference: GLM's and
// DeepSeek-V2-Lite's shapes and an awkward one (17 heads: two overlapping head tiles; rows of 64
// values), chunk lengths that are not multiples of the block, several context workgroups and
// contexts from the range's start to the cache's last row (whose block reads the
// cache's padding rows). Runs where the device has NV cooperative matrices (not lavapipe: the
// test is skipped there, and run on the GPU machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
using attntest::gpu;

struct CoopCase {
  uint32_t n_head, kv_lora, n_rot, n_ctx, short_groups;
  std::vector<uint32_t> kv_lens;
};

TEST(AttentionCoop, ShortRangeMatchesTheReference) {
  REQUIRE_GPU();
  const std::vector<CoopCase> cases = {
      {20, 512, 64, 300, 0, {1, 2, 64, 65, 129, 200, 299, 300}},   // 64 groups: chunks of 8 at 300
      {20, 512, 64, 300, 7, {1, 43, 44, 100, 255, 300}},           // chunks of 48: blocks past the chunk
      {16, 512, 64, 257, 2, {1, 129, 130, 256, 257}},              // chunks of 144: three blocks (the last past the chunk)
      {17, 48, 16, 100, 3, {1, 17, 34, 35, 99, 100}},              // overlapping head tiles, rows of 64
  };
  for (const CoopCase& c : cases) {
    SCOPED_TRACE(cat("H", c.n_head, " R", c.kv_lora, " Dr", c.n_rot, " n_ctx ", c.n_ctx, " groups ", c.short_groups));
    const uint32_t row = c.kv_lora + c.n_rot;
    const vk::AttentionShape shape = make_shape(c.n_head, c.kv_lora, c.n_rot, c.n_ctx, kGlmRope);
    const cpu::Rope rope = cpu_rope(kGlmRope, c.n_rot);
    vk::AttentionTuning t = tuning(0, 0);
    t.single = false;
    t.mid = false;
    t.short_max_kv = c.n_ctx;  // every context in the short range
    t.short_groups = c.short_groups;
    vk::AttentionOp op(*gpu().ctx, shape, t);
    if (!op.short_coop()) GTEST_SKIP() << "no 16x16x16 f16 cooperative matrices here (" << gpu().ctx->info().name << ")";
    EXPECT_EQ(op.short_heads_per_group(), c.n_head);
    EXPECT_FALSE(op.merge_folded(vk::DecodeRange::Short));
    EXPECT_FALSE(op.decode_waits(vk::DecodeRange::Short));

    // The cache's rows past n_ctx are zero (what GpuModel leaves there), the others random.
    std::vector<uint16_t> cache_h(shape.cache_bytes() / 2, 0);
    const std::vector<float> v = test::random_values(size_t(c.n_ctx) * row, 1.f, 31);
    for (size_t i = 0; i < v.size(); ++i) cache_h[i] = f32_to_fp16(v[i]);
    const std::vector<float> q_h = test::random_values(size_t(c.n_head) * row, 2.f, 32);
    vk::Buffer q = make_buffer(q_h.size() * 4, "q"), cache = make_buffer(shape.cache_bytes(), "cache");
    vk::Buffer step = make_buffer(64, "step"), partials = make_buffer(op.partials_bytes(), "partials");
    vk::Buffer arrivals = make_buffer(op.arrivals_bytes(), "arrivals");
    vk::Buffer olat = make_buffer(size_t(c.n_head) * c.kv_lora * 4, "olat");
    upload(q, q_h);
    upload(cache, cache_h);
    vk::CommandRecorder rec(*gpu().ctx);
    rec.begin();
    op.record_decode(rec, q.whole(), cache.whole(), step.whole(), kPosWord, step.whole().sub(16, 24), partials.whole(),
                     arrivals.whole(), olat.whole(), vk::DecodeRange::Short, "attn");
    rec.end();
    EXPECT_EQ(rec.dispatch_count(), 2u);  // partials, merge
    for (uint32_t kv_len : c.kv_lens) {
      poison(olat);
      poison(partials);
      uint32_t words[vk::AttentionOp::kDecodeCountWords];
      op.decode_counts(kv_len, words);
      std::vector<uint32_t> sw = {0, kv_len - 1, 0, 0};
      sw.insert(sw.end(), words, words + vk::AttentionOp::kDecodeCountWords);
      upload(step, sw);
      rec.run();
      const std::vector<float> got = download<float>(olat, size_t(c.n_head) * c.kv_lora);
      if (!std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); })) {
        // What chunk 0 wrote, for the failure message: (m, l) and o's first values per head.
        const std::vector<float> part = download<float>(partials, op.partials_bytes() / 4);
        const size_t ml = size_t(op.decode_groups(vk::DecodeRange::Short)) * c.n_head * c.kv_lora;
        for (uint32_t h = 0; h < c.n_head; ++h)
          ADD_FAILURE() << "kv_len " << kv_len << " chunk 0 head " << h << ": m " << part[ml + 2 * h] << " l "
                        << part[ml + 2 * h + 1] << " o " << part[size_t(h) * c.kv_lora] << " "
                        << part[size_t(h) * c.kv_lora + 1] << " olat " << got[size_t(h) * c.kv_lora];
      }
      const std::vector<float> want =
          test::ref_attention(q_h, cache_h, c.n_head, c.kv_lora, c.n_rot, kv_len, kv_len - 1, shape.kq_scale, rope);
      // The query and the weights rounded to f16 (sums in f32): ~1e-3 of the values' scale.
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << "kv_len " << kv_len << " element " << i;
        max_err = std::max(max_err, double(std::abs(got[i] - want[i])));
        max_ref = std::max(max_ref, double(std::abs(want[i])));
      }
      EXPECT_LT(max_err, 1e-4 + 3e-3 * max_ref) << "kv_len " << kv_len;
    }
  }
}

// Where the device has no cooperative matrices, or the shape does not suit them (fewer than 16
// heads), the short range stays on the rows kernel.
TEST(AttentionCoop, FallsBackToTheRowsKernel) {
  REQUIRE_GPU();
  vk::AttentionTuning t = tuning(0, 0);
  const vk::AttentionOp few(*gpu().ctx, make_shape(4, 128, 16, 64, kGlmRope), t);
  EXPECT_FALSE(few.short_coop()) << "4 heads";
  t.short_coop = false;
  const vk::AttentionOp off(*gpu().ctx, make_shape(20, 512, 64, 64, kGlmRope), t);
  EXPECT_FALSE(off.short_coop()) << "turned off";
  t.short_coop = true;
  const vk::AttentionOp glm(*gpu().ctx, make_shape(20, 512, 64, 64, kGlmRope), t);
  EXPECT_EQ(glm.short_coop(), gpu().ctx->device().enabled().cooperative_matrix_nv && gpu().ctx->info().subgroup_size == 32 &&
                                  gpu().ctx->device().enabled().shader_float16);
  const vk::AttentionOp many(*gpu().ctx, make_shape(40, 512, 64, 64, kGlmRope), t);
  EXPECT_FALSE(many.short_coop()) << "40 heads";
}

}  // namespace
}  // namespace tessera
