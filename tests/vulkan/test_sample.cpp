// sample.comp (SampleOp) against the host: argmax over large and tiny vocabularies with ties
// (lowest id wins) and NaN logits; top-k = 1 and greedy equal the argmax; the kept set after
// top-k / top-p / min-p equals runtime/text's Sampler::kept_candidates; a fixed seed and position
// reproduce the token; thousands of self-feeding steps in one recording (the sampler advances the
// position it reads) give frequencies that follow softmax(logit / temperature).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "runtime/text/sampler.h"
#include "runtime/vulkan/kernels_sample.h"
#include "shaders/attention_args.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

// Buffers of one sampling setup; the scratch is zeroed once, here, and reused by every run.
struct Sampling {
  Gpu& g;
  uint32_t n_vocab;
  vk::Buffer logits, scratch, step, ring;
  uint32_t ring_len;

  Sampling(Gpu& gpu, uint32_t v, uint32_t ring_entries = 16)
      : g(gpu),
        n_vocab(v),
        logits(vktest::make_buffer(gpu, uint64_t(v) * 4, "logits")),
        scratch(vktest::make_buffer(gpu, vk::SampleOp::scratch_bytes(v), "scratch")),
        step(vktest::make_buffer(gpu, 16, "step", true)),
        ring(vktest::make_buffer(gpu, uint64_t(ring_entries) * 4, "tokens", true)),
        ring_len(ring_entries) {
    const std::vector<uint32_t> zeros(scratch.size() / 4, 0);
    vktest::upload_bytes(g, scratch, zeros.data(), scratch.size());
  }
  void set_logits(const std::vector<float>& l) { vktest::upload_bytes(g, logits, l.data(), l.size() * 4); }
  void set_step(uint32_t token, uint32_t pos) {
    const uint32_t w[4] = {token, pos, 0, 0};
    step.write(0, w, sizeof(w));
  }
  uint32_t step_word(uint32_t i) const {
    uint32_t v;
    step.read(i * 4, &v, 4);
    return v;
  }
  vk::SampleOp op(const vk::SampleParams& p, bool advance = false) const {
    vk::SampleOp s;
    s.n_vocab = n_vocab;
    s.params = p;
    s.logits = logits.whole();
    s.scratch = scratch.whole();
    s.step = step.whole();
    s.token_word = 0;
    s.pos_word = 1;
    s.advance_pos = advance;
    s.tokens_out = ring.whole();
    s.out_ring = ring_len;
    return s;
  }
  // One recording, one run at position pos; returns the statistics.
  vk::SampleStats run(const vk::SampleParams& p, uint32_t pos) {
    set_step(0xDEADBEEFu, pos);
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    op(p).record(rec);
    rec.end();
    rec.run();
    std::vector<uint32_t> words(8 + vk::SampleOp::kMaxTopK);
    g.transfer->download(scratch, 0, words.data(), words.size() * 4);
    const vk::SampleStats s = vk::SampleOp::read_stats(words);
    EXPECT_EQ(step_word(0), s.token) << "token in the step buffer";
    EXPECT_EQ(step_word(1), pos) << "position unchanged without advance_pos";
    uint32_t out;
    ring.read((pos % ring_len) * 4, &out, 4);
    EXPECT_EQ(out, s.token) << "token in the output ring";
    return s;
  }
};

uint32_t host_argmax(const std::vector<float>& l) {
  uint32_t best = 0;
  for (uint32_t i = 1; i < l.size(); ++i)
    if (l[i] > l[best] || std::isnan(l[best])) best = std::isnan(l[i]) ? best : i;
  return best;
}

std::vector<float> normal_logits(std::mt19937& rng, uint32_t n, float sigma) {
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

const vk::SampleParams kGreedy{0.f, 1, 1.f, 0.f, 0};

TEST(SampleKernel, ArgmaxLargeVocabularyTiesPickTheLowestId) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const uint32_t V = 154880;
  Sampling s(g, V);
  std::mt19937 rng(1);
  std::vector<float> l = normal_logits(rng, V, 2.f);
  s.set_logits(l);
  EXPECT_EQ(s.run(kGreedy, 3).token, host_argmax(l));
  // Ties in one workgroup's range and across workgroups.
  l[7001] = l[7000] = 50.f;
  s.set_logits(l);
  EXPECT_EQ(s.run(kGreedy, 4).token, 7000u);
  l[7000] = l[7001] = 0.f;
  l[150000] = l[120000] = 60.f;
  l[20] = 60.f;
  s.set_logits(l);
  EXPECT_EQ(s.run(kGreedy, 5).token, 20u);
  // NaN never wins.
  l[20] = l[120000] = l[150000] = std::numeric_limits<float>::quiet_NaN();
  s.set_logits(l);
  EXPECT_EQ(s.run(kGreedy, 6).token, host_argmax(l));
}

TEST(SampleKernel, ArgmaxSmallVocabularies) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  std::mt19937 rng(2);
  for (uint32_t V : {1u, 7u, 1000u, 2049u, 5000u}) {
    SCOPED_TRACE(cat("vocab ", V));
    Sampling s(g, V);
    const std::vector<float> l = normal_logits(rng, V, 1.f);
    s.set_logits(l);
    EXPECT_EQ(s.run(kGreedy, 0).token, host_argmax(l));
    EXPECT_EQ(s.run({1.f, 1, 1.f, 0.f, 9}, 1).token, host_argmax(l)) << "top-k 1 at temperature 1";
  }
  Gpu& sm = vktest::gpu(true);
  VK_TEST_REQUIRE_GPU(sm);
  Sampling s(sm, 3000);
  const std::vector<float> l = normal_logits(rng, 3000, 1.f);
  s.set_logits(l);
  EXPECT_EQ(s.run(kGreedy, 0).token, host_argmax(l)) << "shared-memory reduction path";
}

TEST(SampleKernel, KeptSetMatchesTheHostSampler) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const uint32_t V = 50000;
  Sampling s(g, V);
  std::mt19937 rng(3);
  const std::vector<float> l = normal_logits(rng, V, 3.f);
  s.set_logits(l);
  const vk::SampleParams cases[] = {
      {0.8f, 40, 0.95f, 0.05f, 1}, {1.f, 128, 0.9f, 0.f, 2},  {1.5f, 10, 1.f, 0.f, 3},
      {1.f, 100, 1.f, 0.02f, 4},   {0.6f, 64, 0.3f, 0.1f, 5}, {2.f, 7, 0.99f, 0.001f, 6},
  };
  for (const vk::SampleParams& p : cases) {
    SCOPED_TRACE(cat("T ", p.temperature, " k ", p.top_k, " p ", p.top_p, " min_p ", p.min_p));
    ASSERT_TRUE(vk::SampleOp::exact(p, V));
    text::SamplerParams hp;
    hp.temperature = p.temperature;
    hp.top_k = p.top_k;
    hp.top_p = p.top_p;
    hp.min_p = p.min_p;
    const std::vector<int32_t> want = text::Sampler(hp).kept_candidates(l);
    const vk::SampleStats st = s.run(p, 11);
    EXPECT_EQ(st.candidates, uint32_t(p.top_k));
    EXPECT_EQ(std::vector<int32_t>(st.kept.begin(), st.kept.end()), want);
    EXPECT_NE(std::find(st.kept.begin(), st.kept.end(), st.token), st.kept.end()) << "token outside the kept set";
  }
  EXPECT_FALSE(vk::SampleOp::exact({1.f, 0, 0.9f, 0.f, 0}, V));  // no top-k: the GPU clamps to kMaxTopK
  EXPECT_TRUE(vk::SampleOp::exact({1.f, 0, 0.9f, 0.f, 0}, 100));
}

TEST(SampleKernel, FixedSeedAndPositionReproduce) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  Sampling s(g, 3000);
  std::mt19937 rng(4);
  s.set_logits(normal_logits(rng, 3000, 0.5f));  // flat: many plausible tokens
  const vk::SampleParams p{1.f, 50, 1.f, 0.f, 1234};
  std::vector<uint32_t> a, b, c;
  for (uint32_t pos = 0; pos < 12; ++pos) a.push_back(s.run(p, pos).token);
  for (uint32_t pos = 0; pos < 12; ++pos) b.push_back(s.run(p, pos).token);
  vk::SampleParams q = p;
  q.seed = 99;
  for (uint32_t pos = 0; pos < 12; ++pos) c.push_back(s.run(q, pos).token);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(std::set<uint32_t>(a.begin(), a.end()).size(), 4u) << "draws at different positions vary";
}

// n steps in one recording: each reads the position the previous one advanced.
std::vector<uint32_t> self_feeding_run(Sampling& s, const vk::SampleParams& p, uint32_t n) {
  s.set_step(0, 0);
  vk::CommandRecorder rec(*s.g.ctx);
  rec.begin();
  const vk::SampleOp op = s.op(p, true);
  for (uint32_t i = 0; i < n; ++i) {
    if (i) rec.barrier();
    op.record(rec);
  }
  rec.end();
  rec.run();
  EXPECT_EQ(s.step_word(1), n) << "position advanced once per step";
  std::vector<uint32_t> tokens(n);
  s.ring.read(0, tokens.data(), n * 4);
  EXPECT_EQ(s.step_word(0), tokens.back());
  return tokens;
}

TEST(SampleKernel, SelfFeedingStepsFollowTheDistribution) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const std::vector<double> prob = {0.35, 0.25, 0.15, 0.1, 0.07, 0.05, 0.02, 0.01};
  std::vector<float> l;
  for (double q : prob) l.push_back(float(std::log(q)) + 3.f);
  const uint32_t n = 2000;
  Sampling s(g, uint32_t(prob.size()), n);
  s.set_logits(l);
  for (float temperature : {1.f, 0.5f}) {
    SCOPED_TRACE(cat("temperature ", temperature));
    const std::vector<uint32_t> tokens = self_feeding_run(s, {temperature, 8, 1.f, 0.f, 77}, n);
    std::vector<double> want(prob.size());
    double z = 0;
    for (size_t i = 0; i < prob.size(); ++i) z += want[i] = std::pow(prob[i], 1.0 / temperature);
    for (size_t i = 0; i < prob.size(); ++i) {
      const double pi = want[i] / z;
      const double freq = double(std::count(tokens.begin(), tokens.end(), uint32_t(i))) / n;
      EXPECT_NEAR(freq, pi, 4.5 * std::sqrt(pi * (1 - pi) / n) + 1e-3) << "token " << i;
    }
  }
}

// The step a sampler leaves for the next one (GpuModel::decode_steps queues it before this one
// ends): the next step's attention group counts by the rule in the step buffer, at awkward bounds
// on both sides of each range and past the cache, and a forced input from the ring while the ring
// is on (the sample still goes to the output ring). It reads the words from step_in (the decode
// step's device copy) and writes them to step.
TEST(SampleKernel, LeavesTheNextStepsCountsAndForcedInput) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  Sampling s(g, 37);
  vk::Buffer step = vktest::make_buffer(g, 128 * 4, "step", true);
  vk::Buffer step_in = vktest::make_buffer(g, 128 * 4, "step copy", true);  // what the sampler reads
  const gpu::AttnDecodeRule rule{3, 9, 40, 5, 7, 3, 2, 50, 4, 4, 0, 0};
  std::vector<float> l(37, 0.f);
  l[11] = 2.f;
  s.set_logits(l);
  constexpr uint32_t kCounts = 4, kRule = 16, kInput = 64;
  vk::SampleOp op = s.op(kGreedy, true);
  op.step = step.whole();
  op.step_in = step_in.whole();
  op.counts_word = kCounts;
  op.rule_word = kRule;
  op.input_word = kInput;
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  op.record(rec);
  rec.end();
  // Hand-worked counts (x short, y, 1, x long, y, 1) for some next-step lengths.
  const std::map<uint32_t, std::array<uint32_t, 6>> worked = {
      {3, {0, 3, 1, 0, 2, 1}},  {9, {0, 3, 1, 0, 2, 1}},  {10, {3, 3, 1, 0, 2, 1}},
      {20, {5, 3, 1, 0, 2, 1}}, {41, {0, 3, 1, 6, 2, 1}}, {61, {0, 3, 1, 7, 2, 1}}};
  for (uint32_t pos = 0; pos < 60; ++pos) {
    SCOPED_TRACE(cat("position ", pos));
    std::vector<uint32_t> words(128, 0xDEADBEEFu);
    words[0] = 5;
    words[1] = pos;
    std::memcpy(&words[kRule], &rule, sizeof rule);
    const bool forced = pos % 3 == 1;
    words[kInput] = forced ? 1u : 0u;
    for (uint32_t i = 0; i < s.ring_len; ++i) words[kInput + 1 + i] = 100 + i;
    step_in.write(0, words.data(), words.size() * 4);
    const std::vector<uint32_t> stale(128, 0xDEADBEEFu);  // the words written, and nothing read from here
    step.write(0, stale.data(), stale.size() * 4);
    rec.run();
    std::vector<uint32_t> out(128);
    step.read(0, out.data(), out.size() * 4);
    EXPECT_EQ(out[1], pos + 1);
    EXPECT_EQ(out[0], forced ? 100 + (pos + 1) % s.ring_len : 11u) << "the next step's input";
    uint32_t sampled = 0;
    s.ring.read((pos % s.ring_len) * 4, &sampled, 4);
    EXPECT_EQ(sampled, 11u) << "the sample in the output ring";
    for (uint32_t i = 0; i < 6; ++i) {
      EXPECT_EQ(out[kCounts + i], gpu::ts_attn_decode_count(rule, pos + 2, i)) << "word " << i;
      if (worked.count(pos + 2)) EXPECT_EQ(out[kCounts + i], worked.at(pos + 2)[i]) << "word " << i;
    }
  }
  vk::CommandRecorder bad(*g.ctx);
  bad.begin();
  vk::SampleOp no_rule = op;
  no_rule.rule_word = vk::SampleOp::kNoWord;
  EXPECT_THROW(no_rule.record(bad), Error);
  vk::SampleOp no_advance = op;
  no_advance.advance_pos = false;
  EXPECT_THROW(no_advance.record(bad), Error);
  vk::SampleOp short_step = op;
  short_step.step = step.slice(0, 64 * 4);  // the input ring does not fit
  EXPECT_THROW(short_step.record(bad), Error);
}

TEST(SampleKernel, RefusesBadBindings) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  Sampling s(g, 1000);
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  vk::SampleOp op = s.op(kGreedy);
  op.pos_word = 0;  // same word as the token
  EXPECT_THROW(op.record(rec), Error);
  op = s.op(kGreedy);
  op.scratch = s.scratch.slice(0, 64);
  EXPECT_THROW(op.record(rec), Error);
  op = s.op(kGreedy);
  op.n_vocab = 2000;  // more than the logits binding holds
  EXPECT_THROW(op.record(rec), Error);
}

}  // namespace
}  // namespace tessera
