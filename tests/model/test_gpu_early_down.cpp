// The early-started MoE down (GpuModelOptions::early_down) holding its preloaded Q4_0 weight
// blocks in shared memory instead of registers (MoeTuning::down_shared, moe_down.comp
// DOWN_SHARED): the same blocks, the same dot products summed in the same order, so the same
// logits and tokens bit for bit as the register-held kernel, whatever the rows per workgroup
// (a count that does not divide n_embd included) and the rows per loading round; through the
// late path (lavapipe runs the down after the whole gate-up) and the waiting one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/tsr.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/pipeline.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

testfx::ModelFixture fixture("early_down");

using testfx::Decoded;

model::GpuModelOptions options(uint32_t shared_round, uint32_t rows, bool late) {
  model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
  o.attention.single_max_kv = 3;
  o.moe.down_shared = shared_round;
  o.moe.q8_down_rows = rows;
  o.moe.down_late = late;
  return o;
}

// Whether a pipeline of the shared-memory down with `round` rows per round was made.
bool made_shared_down(vk::Context& ctx, uint32_t round) {
  for (const vk::Pipeline* p : ctx.pipelines().all())
    if (p->name().find("moe_down.q4_0") == 0 && p->name().find(cat(".shared", round)) != std::string::npos) return true;
  return false;
}

TEST(GpuEarlyDown, SharedMemoryBlocksGiveTheSameBits) {
  vk::Context* ctx = fixture.context();
  if (!ctx) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  for (const bool late : {true, false}) {
    SCOPED_TRACE(late ? "late path" : "waiting path");
    const Decoded ref = testfx::decode(*ctx, tsr, options(0, 0, late));
    if (!ref.stats.int8_activations || !ctx->pipelines().use_subgroup())
      GTEST_SKIP() << "no early-started int8 down here (integer dot products, subgroups)";
    EXPECT_TRUE(ref.early_starts) << "no wait gave up";
    struct V {
      uint32_t round, rows, round_made;
    };
    // 8 rows (auto) loaded 1 and 4 at a time; 3 rows (256 = 85 x 3 + 1) in rounds of 2 -> 1.
    for (const V v : {V{1, 0, 1}, V{4, 0, 4}, V{2, 3, 1}}) {
      SCOPED_TRACE(cat("round ", v.round, " rows ", v.rows));
      const Decoded d = testfx::decode(*ctx, tsr, options(v.round, v.rows, late));
      EXPECT_TRUE(made_shared_down(*ctx, v.round_made));
      EXPECT_TRUE(d.early_starts) << "no wait gave up";
      EXPECT_EQ(ref.stats.barriers, d.stats.barriers);
      EXPECT_EQ(ref.stats.dispatches, d.stats.dispatches);
      EXPECT_EQ(ref.logits, d.logits);
      EXPECT_EQ(ref.tokens, d.tokens);
    }
  }
}

// Where the rows do not fit the device's shared memory the kernel takes fewer; a tuning past
// its bound is refused with a message naming it.
TEST(GpuEarlyDown, SharedRoundOutOfRangeIsRefused) {
  vk::Context* ctx = fixture.context();
  if (!ctx) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  try {
    model::GpuModel m(*ctx, tsr, options(9, 0, true));
    m.decode_step();
    FAIL() << "a round of 9 rows was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows per round"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
