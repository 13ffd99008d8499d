// The router fold's accumulator copies (GpuModelOptions::fold_slots, kernel_args.h
// TS_ROUTER_FOLD_SLOTS): W_vo / attn_output add the partial logits and sum of squares into copy
// (workgroup id % slots) and the gate-up sums the copies. The sums are 64-bit integers, so any
// count gives the same bits: composed (W_vo, the early gate-up) and factored (attn_output) files,
// an odd count and one copy against the default 16; and a count past the buffers is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/error.h"
#include "format/tsr.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

testfx::ModelFixture fixture("fold_slots");

TEST(GpuFoldSlots, AnyCopyCountGivesTheSameBits) {
  if (!fixture.context()) GTEST_SKIP() << "no Vulkan device";
  for (const char* compose : {"all", "none"}) {
    SCOPED_TRACE(compose);
    TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", compose).tsr);
    model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
    const testfx::Decoded ref = testfx::decode(*fixture.context(), tsr, o);
    for (uint32_t slots : {3u, 1u}) {
      SCOPED_TRACE(slots);
      o.fold_slots = slots;
      const size_t pipelines = fixture.context()->pipelines().all().size();
      const testfx::Decoded d = testfx::decode(*fixture.context(), tsr, o);
      EXPECT_GT(fixture.context()->pipelines().all().size(), pipelines) << "kernels built for the count";
      EXPECT_EQ(ref.logits, d.logits);
      EXPECT_EQ(ref.tokens, d.tokens);
    }
    o.fold_slots = 17;
    EXPECT_THROW(model::GpuModel(*fixture.context(), tsr, o), Error);
  }
}

}  // namespace
}  // namespace tessera
