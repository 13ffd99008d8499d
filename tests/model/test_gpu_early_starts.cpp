// Kernels started early: recorded with no barrier after their producer, waiting on its gate
// word (docs/DECODE.md "Early start"). Each is checked against the same kernels behind the
// barrier: the same logits and greedy tokens bit for bit, one barrier less where it applies.
// Stage 2 beside stage 1 (GpuModelOptions::early_qk and qk_q8 at -1, auto: where q_a's weights
// have 32-element blocks, Q4_0 / Q8_0; session 34) and the residual stream in two buffers that
// makes it safe: the matvec that writes x after the attention reads its residual from the buffer
// stage 1 read and writes the other (MatvecOp::residual), so the early-started FFN kernels never
// read x through an SM's stale L1 lines; the attention beside W_qk (early_attn), the gate-up
// beside W_vo (early_gateup), and what the waiting kernels read before their wait (session 35's
// row prefetch).
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

// The pipelines built so far whose name begins with `prefix` and holds `part`.
size_t built(vk::Context& ctx, std::string_view prefix, std::string_view part) {
  size_t n = 0;
  for (const vk::Pipeline* p : ctx.pipelines().all()) n += p->name().starts_with(prefix) && p->name().find(part) != std::string::npos;
  return n;
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

bool have_vulkan() { return fixture.context() != nullptr; }
testfx::Decoded decode(const TsrFile& tsr, const model::GpuModelOptions& o) {
  return testfx::decode(*fixture.context(), tsr, o);
}
testfx::ModelFiles files(const std::string& preset, const std::string& type, const std::string& compose) {
  return fixture.files(preset, type, compose);
}
using testfx::Decoded;

// The attention started beside W_qk and kv_write (early_attn): the same kernels' arithmetic, so
// the same logits and tokens bit for bit, through the single range (up to 3 positions), the
// mid range (up to 9) and the short one, whose rows partials wait too with short_wait (session
// 15); one barrier less per layer in the single range's recording (the stats describe it).
TEST(GpuModel, EarlyAttentionGivesTheSameBits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(files("tiny", "q4_0", "all").tsr);
  model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
  o.attention.single_max_kv = 3;
  o.attention.mid_max_kv = 9;
  o.attention.mid_groups = 3;
  o.attention.short_wait = true;
  o.early_attn = false;
  const Decoded ref = decode(tsr, o);
  o.early_attn = true;
  const Decoded early = decode(tsr, o);
  EXPECT_TRUE(early.early_starts) << "no wait gave up";
  if (ref.stats.barriers == early.stats.barriers) GTEST_SKIP() << "no early attention here (int8 kernels with subgroups)";
  EXPECT_EQ(ref.stats.barriers - early.stats.barriers, ref.stats.layers);
  EXPECT_EQ(ref.logits, early.logits);
  EXPECT_EQ(ref.tokens, early.tokens);
}

// The MoE gate-up started beside W_vo (early_gateup), with its norm weight and bias loaded before
// the wait (gateup_consts) or after, its input staged after its weight loads (gateup_stage_late,
// the default for Q4_0 experts) or before, and then loaded before the routing (gateup_input_first)
// or after the weights: the same arithmetic, the same bits; one barrier less per MoE layer.
TEST(GpuModel, EarlyGateUpGivesTheSameBits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(files("tiny", "q4_0", "all").tsr);
  model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
  o.attention.single_max_kv = 3;
  o.early_gateup = false;
  const Decoded ref = decode(tsr, o);
  o.early_gateup = true;  // the default
  const Decoded early = decode(tsr, o);
  EXPECT_TRUE(early.early_starts) << "no wait gave up";
  if (ref.stats.barriers == early.stats.barriers)
    GTEST_SKIP() << "no early gate-up here (int8 kernels with subgroups, the router fold)";
  const ModelConfig cfg = ModelConfig::from_metadata(tsr.metadata());
  uint32_t moe_layers = 0;
  for (uint32_t l = 0; l < cfg.n_layer; ++l) moe_layers += cfg.is_moe(l) ? 1 : 0;
  EXPECT_EQ(ref.stats.barriers - early.stats.barriers, moe_layers);
  EXPECT_EQ(ref.logits, early.logits);
  EXPECT_EQ(ref.tokens, early.tokens);
  EXPECT_GT(built(*fixture.context(), "moe_gateup.", ".consts.late"), 0u) << "no gate-up staging after its loads was built";
  o.moe.gateup_stage_late = false;  // the input staged first, one block an invocation
  const Decoded staged_first = decode(tsr, o);
  EXPECT_EQ(ref.logits, staged_first.logits);
  EXPECT_EQ(ref.tokens, staged_first.tokens);
  o.moe.gateup_stage_late = true;
  EXPECT_GT(built(*fixture.context(), "moe_gateup.", ".late.in"), 0u) << "no gate-up loading its input first was built";
  o.moe.gateup_input_first = false;  // the input loaded after the weights
  const Decoded input_late = decode(tsr, o);
  EXPECT_EQ(ref.logits, input_late.logits);
  EXPECT_EQ(ref.tokens, input_late.tokens);
  o.moe.gateup_input_first = true;
  o.moe.gateup_consts = false;  // the norm weight and the bias read after the wait instead
  const Decoded late = decode(tsr, o);
  EXPECT_EQ(ref.logits, late.logits);
  EXPECT_EQ(ref.tokens, late.tokens);
  EXPECT_GT(built(*fixture.context(), "moe_gateup.", ".wait.late"), 0u) << "no staging after the loads without consts";
}

// The same where the down stays behind its barrier (early_down off; DeepSeek-V2-Lite, whose shared
// slot is too wide for the early down): the gate-up still starts beside W_vo / attn_output, opening
// the down's words for no one; the same bits, one barrier less per MoE layer. GLM-like composed and
// V2-Lite-like factored files (the factored value path's attn_output opens the gate-up's).
TEST(GpuModel, EarlyGateUpWithoutTheEarlyDown) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* preset : {"tiny", "tiny-lite"}) {
    SCOPED_TRACE(preset);
    TsrFile tsr = TsrFile::open(files(preset, "q4_0", std::string(preset) == "tiny" ? "all" : "none").tsr);
    const ModelConfig cfg = ModelConfig::from_metadata(tsr.metadata());
    uint32_t moe_layers = 0;
    for (uint32_t l = 0; l < cfg.n_layer; ++l) moe_layers += cfg.is_moe(l) ? 1 : 0;
    model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
    o.attention.single_max_kv = 3;
    o.early_down = false;
    o.early_gateup = false;
    const Decoded ref = decode(tsr, o);
    o.early_gateup = true;
    const Decoded early = decode(tsr, o);
    EXPECT_TRUE(early.early_starts) << "no wait gave up";
    if (ref.stats.barriers == early.stats.barriers)
      GTEST_SKIP() << "no early gate-up here (int8 kernels with subgroups, the router fold)";
    EXPECT_EQ(ref.stats.barriers - early.stats.barriers, moe_layers);
    EXPECT_EQ(ref.stats.dispatches, early.stats.dispatches);
    EXPECT_EQ(ref.logits, early.logits);
    EXPECT_EQ(ref.tokens, early.tokens);
  }
}

// W_qk reading the attention's cache rows into the L2 before its wait (row_prefetch: 1 since
// session 35, 2 since session 37): loads whose values only join the wait's dependence, so the same
// logits and tokens, in the single and mid ranges (1), in the split range too (2, the default),
// there only its first rows (row_prefetch_short_rows), and with plain loads (row_prefetch_l1).
TEST(GpuStage2, RowPrefetchGivesTheSameBits) {
  if (!fixture.context()) GTEST_SKIP() << "no Vulkan device";
  // A context of its own: the counts of prefetching pipelines below start from none, whatever
  // the file's other tests built in the shared one (the default builds every range's).
  vk::Context own;
  vk::Context* ctx = &own;
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  model::GpuModelOptions o = options(-1, -1);
  o.row_prefetch = 0;
  const testfx::Decoded off = testfx::decode(*ctx, tsr, o);
  if (!off.stats.int8_activations) GTEST_SKIP() << "no integer dot product on this device";
  o.row_prefetch = 1;
  const testfx::Decoded on = testfx::decode(*ctx, tsr, o);
  EXPECT_TRUE(on.early_starts) << "no wait gave up";
  EXPECT_EQ(on.stats.dispatches, off.stats.dispatches);
  EXPECT_EQ(on.stats.barriers, off.stats.barriers);
  EXPECT_EQ(on.logits, off.logits);
  EXPECT_EQ(on.tokens, off.tokens);
  const auto prefetching = [&] { return built(*ctx, "matvec.", ".pf"); };
  const size_t single_mid = prefetching();
  EXPECT_GT(single_mid, 0u) << "no W_qk with PREFETCH_ROWS was built";

  const testfx::Decoded split = testfx::decode(*ctx, tsr, options(-1, -1));  // the default
  EXPECT_EQ(split.stats.dispatches, off.stats.dispatches);
  EXPECT_EQ(split.stats.barriers, off.stats.barriers);
  EXPECT_EQ(split.logits, off.logits);
  EXPECT_EQ(split.tokens, off.tokens);
  const size_t all_ranges = prefetching();
  EXPECT_GT(all_ranges, single_mid) << "no W_qk prefetching the split range's rows was built";
  model::GpuModelOptions o2 = options(-1, -1);
  o2.row_prefetch_short_rows = 5;  // the split range's first 5 rows only
  const testfx::Decoded first_rows = testfx::decode(*ctx, tsr, o2);
  EXPECT_EQ(first_rows.logits, off.logits);
  EXPECT_EQ(first_rows.tokens, off.tokens);
  EXPECT_GT(prefetching(), all_ranges) << "no W_qk prefetching the split range's first rows was built";

  // Plain prefetch loads (the form until session 37, which fill the L1 too): the same bits.
  model::GpuModelOptions o3 = options(-1, -1);
  o3.row_prefetch_l1 = true;
  const size_t before_l1 = prefetching();
  const testfx::Decoded l1 = testfx::decode(*ctx, tsr, o3);
  EXPECT_EQ(l1.logits, off.logits);
  EXPECT_EQ(l1.tokens, off.tokens);
  EXPECT_GT(prefetching(), before_l1) << "no W_qk with plain prefetch loads was built";
}

// Stage 1's staged values loaded before its weight blocks (MatvecTuning::input_first, the default
// where q_a and kv_a both load their weights first): the same bits as staging after them.
TEST(GpuStage2, InputFirstGivesTheSameBits) {
  if (!fixture.context()) GTEST_SKIP() << "no Vulkan device";
  vk::Context own;  // the counts of pipelines below start from none
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  model::GpuModelOptions o = options(-1, -1);
  o.matvec.input_first = false;
  const testfx::Decoded off = testfx::decode(own, tsr, o);
  if (!off.stats.int8_activations) GTEST_SKIP() << "no integer dot product on this device";
  if (built(own, "matvec.", ".pre") == 0) GTEST_SKIP() << "stage 1 does not load its weights first here";
  EXPECT_EQ(built(own, "matvec.", ".pre.in"), 0u);
  const testfx::Decoded on = testfx::decode(own, tsr, options(-1, -1));  // the default
  EXPECT_EQ(on.logits, off.logits);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_GT(built(own, "matvec.", ".pre.in"), 0u) << "no stage-1 matvec loading its input first was built";
}

// The short range's merge chained to its partials by a gate (AttentionTuning::merge_wait, the
// default since session 36): the same kernels' arithmetic, so the same logits and tokens through
// the single, mid and split ranges (the stats describe the single range's recording: no merge).
TEST(GpuStage2, MergeWaitGivesTheSameBits) {
  vk::Context* ctx = fixture.context();
  if (!ctx) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  model::GpuModelOptions o = options(-1, -1);
  o.attention.merge_wait = false;
  const testfx::Decoded off = testfx::decode(*ctx, tsr, o);
  if (!off.stats.int8_activations) GTEST_SKIP() << "no integer dot product on this device";
  const testfx::Decoded on = testfx::decode(*ctx, tsr, options(-1, -1));  // the default
  EXPECT_TRUE(on.early_starts) << "no wait gave up";
  EXPECT_EQ(on.logits, off.logits);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_GT(built(*ctx, "attention_merge", ".wait"), 0u) << "no merge waiting on the partials was built";
}

}  // namespace
}  // namespace tessera
