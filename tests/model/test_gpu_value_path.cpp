// The factored value path on the int8 kernels (GpuModelOptions::vb_q8): attn_v_b as one matvec of
// stacked per-head matrices on the attention's int8 olat, writing o as int8 blocks that
// attn_output reads; with early starts both wait on gates instead of barriers. Checked against
// the f32 absorb path (the same model up to the int8 rounding of olat and o), the early starts
// against the barriers (the same kernels: the same bits), the preloaded weight blocks held as
// loaded or unpacked (GpuModelOptions::q8_raw: the same bits), and the gate that never opens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "format/tsr.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

testfx::ModelFixture fixture("value");

using testfx::Decoded;

Decoded run(const TsrFile& tsr, bool vb_q8, bool early, bool never_opens = false, bool q8_raw = true) {
  model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
  o.vb_q8 = vb_q8;
  o.q8_raw = q8_raw;
  o.early_vo = early;
  o.early_down = early;
  o.early_attn = early;
  o.fault_gate_never_opens = never_opens;
  o.attention.single_max_kv = 3;  // the single range, then the mid one, then the split one
  o.attention.mid_max_kv = 9;
  o.attention.mid_groups = 3;
  return testfx::decode(*fixture.context(), tsr, o);
}

// GLM-like (q LoRA, composed W_qk: compose "qk") and V2-Lite-like (factored: "none") files.
TEST(GpuValuePath, Int8ValuePathMatchesTheAbsorbAndGatesKeepTheBits) {
  if (!fixture.context()) GTEST_SKIP() << "no Vulkan device";
  struct F {
    const char* preset;
    const char* compose;
  };
  for (const F f : {F{"tiny", "qk"}, F{"tiny-lite", "none"}}) {
    SCOPED_TRACE(cat(f.preset, " compose ", f.compose));
    const testfx::ModelFiles files = fixture.files(f.preset, "q8_0", f.compose, "q8_0");
    TsrFile tsr = TsrFile::open(files.tsr);
    const Decoded absorb = run(tsr, false, false), barriers = run(tsr, true, false), early = run(tsr, true, true);
    if (!barriers.stats.int8_activations) GTEST_SKIP() << "no integer dot product on this device";
    // Against the absorb: the same model but for the rounding of olat and o to int8 blocks.
    ASSERT_EQ(absorb.logits.size(), barriers.logits.size());
    float worst = 0, scale = 0;
    for (size_t i = 0; i < absorb.logits.size(); ++i) {
      scale = std::max(scale, std::fabs(absorb.logits[i]));
      worst = std::max(worst, std::fabs(absorb.logits[i] - barriers.logits[i]));
    }
    EXPECT_LE(worst, 2e-2f * scale);
    EXPECT_GT(worst, 0.f) << "the int8 value path did not run";
    // One dispatch per layer more than W_vo would take, none more than the absorb (which also
    // takes attn_output): the same count; early starts drop the barriers between them.
    EXPECT_EQ(barriers.stats.dispatches, absorb.stats.dispatches);
    EXPECT_LT(early.stats.barriers, barriers.stats.barriers);
    EXPECT_TRUE(early.early_starts) << "a gate gave up";
    // Gates change no arithmetic; nor does holding the preloaded blocks unpacked (q8_raw off).
    EXPECT_EQ(early.logits, barriers.logits);
    EXPECT_EQ(early.tokens, barriers.tokens);
    const Decoded unpacked = run(tsr, true, true, false, false);
    EXPECT_EQ(unpacked.logits, early.logits);
    EXPECT_EQ(unpacked.tokens, early.tokens);
    // A gate that never opens (attn_v_b's): the model falls back to barriers, the same bits.
    const Decoded fallback = run(tsr, true, true, true);
    EXPECT_FALSE(fallback.early_starts);
    EXPECT_EQ(fallback.logits, barriers.logits);
    EXPECT_EQ(fallback.tokens, barriers.tokens);
  }
}

}  // namespace
}  // namespace tessera
