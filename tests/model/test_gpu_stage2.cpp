// Stage 2 started beside stage 1 by default (GpuModelOptions::early_qk and qk_q8 at -1, auto:
// where q_a's weights have 32-element blocks, Q4_0 / Q8_0; session 34) and the residual stream in
// two buffers that makes it safe: the matvec that writes x after the attention reads its residual
// from the buffer stage 1 read and writes the other (MatvecOp::residual), so the early-started
// FFN kernels never read x through an SM's stale L1 lines. Checked: which files take the default
// (barriers, the int8 hand-over's producer), the same logits and greedy tokens as the same
// kernels with the barrier (early_qk off), and the factored path's x writer (attn_output).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/quant.h"
#include "format/tsr.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/pipeline.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

testfx::ModelFixture fixture("stage2");

// The type of q_a's weights in a file.
GgmlType q_a_type(const TsrFile& tsr) {
  const TsrTensor* t = tsr.find_tensor("blk.0.attn_q_a.weight");
  EXPECT_NE(t, nullptr);
  return t ? t->type : GgmlType::F32;
}

model::GpuModelOptions options(int early_qk, int qk_q8) {
  model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
  o.early_qk = early_qk;
  o.qk_q8 = qk_q8;
  o.attention.single_max_kv = 3;  // the single range, then the mid one, then the split one
  o.attention.mid_max_kv = 9;
  o.attention.mid_groups = 3;
  return o;
}

// Q4_0 / Q8_0 q_a: on by default (one barrier less per layer, the int8 hand-over's producer
// built); a K-quant q_a (Q4_K_M's): off by default (the barriers of early_qk=0). On or off, the
// early start gives the bits of the same kernels behind the barrier (llvmpipe runs one dispatch
// at a time: the race it removes shows only on a GPU, PERFORMANCE.md session 34).
TEST(GpuStage2, EarlyByDefaultWhereQaHas32ElementBlocks) {
  vk::Context* ctx = fixture.context();
  if (!ctx) GTEST_SKIP() << "no Vulkan device";
  uint32_t checked = 0;
  for (const char* type : {"q4_0", "q8_0", "q4_k_m"}) {
    for (const char* compose : {"all", "none"}) {  // x written by W_vo, or by attn_output
      SCOPED_TRACE(std::string(type) + " " + compose);
      TsrFile tsr = TsrFile::open(fixture.files("tiny", type, compose).tsr);
      const bool blocks32 = type_info(q_a_type(tsr)).block_elems == 32;
      const testfx::Decoded def = testfx::decode(*ctx, tsr, options(-1, -1));
      const testfx::Decoded barrier = testfx::decode(*ctx, tsr, options(0, blocks32 ? 1 : 0));
      if (!def.stats.int8_activations) GTEST_SKIP() << "no integer dot product on this device";
      const uint32_t layers = def.stats.layers;
      if (blocks32) {
        EXPECT_EQ(barrier.stats.barriers - def.stats.barriers, layers) << "stage 2's barrier, every layer";
        EXPECT_EQ(def.logits, barrier.logits);
        EXPECT_EQ(def.tokens, barrier.tokens);
      } else {
        EXPECT_EQ(barrier.stats.barriers, def.stats.barriers) << "a K-quant q_a keeps the barrier";
        EXPECT_EQ(def.tokens, barrier.tokens);
      }
      EXPECT_TRUE(def.early_starts) << "no wait gave up";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6u);
  // Both kinds were seen: the synthetic Q4_K_M keeps q_a in a K-quant.
  EXPECT_NE(type_info(q_a_type(TsrFile::open(fixture.files("tiny", "q4_k_m", "all").tsr))).block_elems, 32u);
}

// W_qk reading the attention's cache rows into the L2 before its wait (row_prefetch, the default
// since session 35):
// loads whose values only join the wait's dependence, so the same logits and tokens, in the
// single and mid ranges (the split range's W_qk does not prefetch).
TEST(GpuStage2, RowPrefetchGivesTheSameBits) {
  vk::Context* ctx = fixture.context();
  if (!ctx) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  model::GpuModelOptions o = options(-1, -1);
  o.row_prefetch = false;
  const testfx::Decoded off = testfx::decode(*ctx, tsr, o);
  if (!off.stats.int8_activations) GTEST_SKIP() << "no integer dot product on this device";
  const testfx::Decoded on = testfx::decode(*ctx, tsr, options(-1, -1));  // the default
  EXPECT_TRUE(on.early_starts) << "no wait gave up";
  EXPECT_EQ(on.stats.dispatches, off.stats.dispatches);
  EXPECT_EQ(on.stats.barriers, off.stats.barriers);
  EXPECT_EQ(on.logits, off.logits);
  EXPECT_EQ(on.tokens, off.tokens);
  bool prefetching = false;
  for (const vk::Pipeline* p : ctx->pipelines().all())
    prefetching = prefetching || (p->name().rfind("matvec.", 0) == 0 && p->name().find(".pf") != std::string::npos);
  EXPECT_TRUE(prefetching) << "no W_qk with PREFETCH_ROWS was built";
}

}  // namespace
}  // namespace tessera
