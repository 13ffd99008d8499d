// GpuModel::decode_steps with queued steps (GpuModelOptions::pipeline): step i + 1 is submitted
// before the host waits for step i, or recorded after it in the same submission
// (steps_per_submit), so each step takes its input, position and attention group counts from
// what the previous step's sampler left in the step buffer. Checked against one submit and wait
// per step (pipeline off) for the same bits: self-fed and forced tokens, across the attention
// ranges (whose recordings and indirect counts change as the context grows), a stop in the
// middle (what is queued is discarded), a caller that throws, the early-start fallback, and bad
// requests.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

#include "format/error.h"
#include "format/tsr.h"
#include "runtime/model/gpu_model.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

using testfx::prompt;

testfx::ModelFixture fixture("gpu-pipeline");

bool have_vulkan() { return fixture.context() != nullptr; }

// Small ranges so that 20 steps from position 5 pass the single, mid, short and long ranges;
// `indirect`: the short and long ranges as the split kernel dispatched by the step buffer's group
// counts (by default the short one is the rows kernel and the long one a direct dispatch, which
// take any count), so that a count the sampler got wrong changes the logits. steps:
// GpuModelOptions::steps_per_submit (4: runs of 4 steps where they fit a range, single steps at
// the ranges' ends).
model::GpuModelOptions ranged(bool pipeline, bool indirect = false, uint32_t steps = 4) {
  model::GpuModelOptions o{.n_ctx = 40, .prefill_chunk = 0};
  o.attention.short_rows = !indirect;
  o.attention.direct_partial = !indirect;
  o.attention.single_max_kv = 7;
  o.attention.mid_max_kv = 13;
  o.attention.mid_groups = 3;
  o.attention.short_max_kv = 20;
  o.attention.min_chunk = 4;
  o.pipeline = pipeline;
  o.steps_per_submit = steps;
  return o;
}

struct Decoded {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // of the last step
  int n_past = 0;
  int32_t next = 0;  // sampled_token() after the steps
};

// 5 prompt tokens, then n steps (forced: fed ids spread over the vocabulary)
// through decode_steps.
Decoded run_steps(const model::GpuModelOptions& o, uint32_t n, bool forced, const std::string& compose = "all") {
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", compose).tsr);
  model::GpuModel m(*fixture.context(), tsr, o);
  m.forward(prompt(m.n_vocab(), 5), true);
  const std::vector<int32_t> ids = forced ? prompt(m.n_vocab(), n, 7) : std::vector<int32_t>{};
  Decoded r;
  const uint32_t done = m.decode_steps(n, ids, [&](int32_t t) {
    r.tokens.push_back(t);
    return true;
  });
  EXPECT_EQ(done, n);
  r.logits = m.last_logits();
  r.n_past = m.n_past();
  r.next = m.sampled_token();
  return r;
}

void expect_same(const Decoded& a, const Decoded& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.logits, b.logits) << "the last step's logits, bit for bit";
  EXPECT_EQ(a.n_past, b.n_past);
  EXPECT_EQ(a.next, b.next);
}

TEST(GpuPipeline, QueuedStepsDecodeWhatSingleStepsDecode) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* compose : {"all", "none"})
    for (bool indirect : {false, true}) {
      const Decoded one = run_steps(ranged(false, indirect), 20, false, compose);
      for (uint32_t steps : {1u, 4u}) {
        SCOPED_TRACE(cat(compose, indirect ? " indirect" : "", ", steps per submit ", steps));
        const Decoded queued = run_steps(ranged(true, indirect, steps), 20, false, compose);
        expect_same(one, queued);
        EXPECT_EQ(queued.n_past, 25);
        EXPECT_EQ(queued.next, queued.tokens.back()) << "the last sample is the next input";
      }
    }
}

TEST(GpuPipeline, ForcedTokensQueueAhead) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Decoded one = run_steps(ranged(false, true), 20, true);
  for (uint32_t steps : {1u, 4u}) {
    SCOPED_TRACE(cat("steps per submit ", steps));
    const Decoded queued = run_steps(ranged(true, true, steps), 20, true);
    expect_same(one, queued);
    EXPECT_EQ(queued.next, queued.tokens.back()) << "the forced ring is off after the steps";
  }
}

// Sampling (temperature, top-k, top-p; the draw seeded by the position the GPU advances): the
// same tokens queued as one step at a time.
TEST(GpuPipeline, SampledTokensQueueToo) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  Decoded runs[2];
  for (bool pipeline : {false, true}) {
    model::GpuModelOptions o = ranged(pipeline);
    o.sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .min_p = 0.f, .seed = 11};
    runs[pipeline] = run_steps(o, 20, false);
  }
  expect_same(runs[0], runs[1]);
  EXPECT_GT(std::set<int32_t>(runs[1].tokens.begin(), runs[1].tokens.end()).size(), 5u)
      << "draws, not one repeated token";
}

// 12 steps through decode_steps, interrupted after the first `cut` by `interrupt` (which
// decodes those and stops), then continued: the tokens and the last logits of the uninterrupted
// run, and after the interruption the model as after `cut` steps.
void expect_interruption_is_invisible(uint32_t cut,
                                      const std::function<void(model::GpuModel&, std::vector<int32_t>&)>& interrupt) {
  const Decoded whole = run_steps(ranged(true), 12, false);
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  model::GpuModel m(*fixture.context(), tsr, ranged(true));
  m.forward(prompt(m.n_vocab(), 5), true);
  std::vector<int32_t> got;
  interrupt(m, got);
  ASSERT_EQ(got.size(), cut);
  EXPECT_EQ(m.n_past(), int(5 + cut));
  EXPECT_EQ(m.sampled_token(), got.back());
  got.push_back(m.decode_step());  // one plain step in between
  m.decode_steps(11 - cut, {}, [&](int32_t t) {
    got.push_back(t);
    return true;
  });
  EXPECT_EQ(got, whole.tokens);
  EXPECT_EQ(m.last_logits(), whole.logits);
}

// Stopping after 4 of 12 steps (positions 5-8: two single steps, then the second of a run of
// four in one submission) discards the rest of the run and the submission queued after it.
TEST(GpuPipeline, StopDiscardsTheQueuedStep) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  expect_interruption_is_invisible(4, [](model::GpuModel& m, std::vector<int32_t>& got) {
    EXPECT_EQ(m.decode_steps(12, {}, [&](int32_t t) {
      got.push_back(t);
      return got.size() != 4;
    }), 4u);
  });
}

// A caller that stops by throwing from on_token (chat's Ctrl-C) leaves nothing queued.
TEST(GpuPipeline, AThrowingCallerLeavesNothingQueued) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  struct Stop {};
  expect_interruption_is_invisible(3, [](model::GpuModel& m, std::vector<int32_t>& got) {
    EXPECT_THROW(m.decode_steps(12, {}, [&](int32_t t) {
      got.push_back(t);
      if (got.size() == 3) throw Stop{};
      return true;
    }), Stop);
  });
}

// A wait that gives up (injected) in a queued step: the model re-records
// without early starts and runs that step and the queued one again.
TEST(GpuPipeline, EarlyStartFallbackRerunsTheQueuedSteps) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  model::GpuModelOptions plain = ranged(false);
  plain.early_vo = plain.early_down = plain.early_qk = plain.early_attn = plain.early_gateup = false;
  model::GpuModelOptions fault = ranged(true);
  fault.fault_gate_never_opens = true;
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  {
    model::GpuModel probe(*fixture.context(), tsr, fault);
    if (!probe.early_starts() || probe.stats().barriers == 0) GTEST_SKIP() << "no early starts on this device";
  }
  expect_same(run_steps(plain, 10, false), run_steps(fault, 10, false));
}

TEST(GpuPipeline, BadRequestsChangeNothing) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(fixture.files("tiny", "q4_0", "all").tsr);
  model::GpuModel m(*fixture.context(), tsr, ranged(true));
  m.forward(prompt(m.n_vocab(), 5), true);
  const int32_t next = m.sampled_token();
  auto any = [](int32_t) { return true; };
  EXPECT_THROW(m.decode_steps(36, {}, any), Error) << "5 + 36 positions exceed the context of 40";
  const std::vector<int32_t> two = {1, 2};
  EXPECT_THROW(m.decode_steps(3, two, any), Error) << "fewer forced tokens than steps";
  const std::vector<int32_t> outside = {1, int32_t(m.n_vocab()), 2};
  EXPECT_THROW(m.decode_steps(3, outside, any), Error) << "a forced id outside the vocabulary";
  EXPECT_EQ(m.n_past(), 5);
  EXPECT_EQ(m.sampled_token(), next);
  EXPECT_EQ(m.decode_steps(35, {}, any), 35u) << "the context's last position";
  for (uint32_t steps : {0u, 17u}) {
    model::GpuModelOptions o = ranged(true);
    o.steps_per_submit = steps;
    EXPECT_THROW(model::GpuModel(*fixture.context(), tsr, o), Error) << steps << " steps per submission";
  }
}

}  // namespace
}  // namespace tessera
