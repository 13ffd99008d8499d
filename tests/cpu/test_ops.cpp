// Hand-checked cases for the building blocks of the CPU reference (forward.md §0, §3, §4, §5.2).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

#include "format/error.h"
#include "format/fp16.h"
#include "runtime/cpu/attention.h"
#include "runtime/cpu/ops.h"
#include "runtime/cpu/thread_pool.h"

using namespace tessera;
using namespace tessera::cpu;

TEST(RmsNorm, HandComputed) {
  const std::vector<float> x{1, 2, 3, 4}, w{1, 1, 2, 0.5f};
  std::vector<float> y(4);
  rms_norm(x, w, 0.f, y);
  const double s = 1.0 / std::sqrt(7.5);  // mean of squares = 30 / 4
  EXPECT_NEAR(y[0], 1 * s, 1e-6);
  EXPECT_NEAR(y[1], 2 * s, 1e-6);
  EXPECT_NEAR(y[2], 2 * 3 * s, 1e-6);
  EXPECT_NEAR(y[3], 0.5 * 4 * s, 1e-6);
  // eps enters under the root
  rms_norm(x, w, 2.5f, y);
  EXPECT_NEAR(y[0], 1 / std::sqrt(10.0), 1e-6);
  // in place
  std::vector<float> z = x;
  rms_norm(z, w, 0.f, z);
  EXPECT_NEAR(z[3], 0.5 * 4 * s, 1e-6);
}

TEST(Silu, Values) {
  EXPECT_FLOAT_EQ(silu(0.f), 0.f);
  EXPECT_NEAR(silu(1.f), 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
  EXPECT_NEAR(silu(-2.f), -2.0 / (1.0 + std::exp(2.0)), 1e-7);
}

TEST(Softmax, SumsToOneAndIsShiftInvariant) {
  std::vector<float> a{1, 2, 3}, b{1001, 1002, 1003};
  softmax(a);
  softmax(b);
  const double e = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(a[2], std::exp(3.0) / e, 1e-7);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(a[i], b[i], 1e-7);
}

TEST(Rope, NormalPairsByHand) {
  // n_rot 4, base 10000: theta_0 = p, theta_1 = p * 10000^(-1/2) = p / 100
  const Rope rope(4, 10000.f, 1.f, 0.f, 1.f, {0, 0});
  std::vector<float> v{1, 0, 0, 1};
  rope.apply(v, 1);
  EXPECT_NEAR(v[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(v[1], std::sin(1.0), 1e-6);
  EXPECT_NEAR(v[2], -std::sin(0.01), 1e-6);
  EXPECT_NEAR(v[3], std::cos(0.01), 1e-6);
}

TEST(Rope, PositionZeroIsIdentity) {
  for (const char* preset : {"glm47flash", "ds2lite"}) {
    const Rope rope(*ModelConfig::preset(preset));
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> v(64), orig;
    for (float& e : v) e = nd(rng);
    orig = v;
    rope.apply(v, 0);
    for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], orig[i], 1e-6) << preset;
  }
}

TEST(Rope, DotDependsOnlyOnPositionDifference) {
  for (const char* preset : {"glm47flash", "ds2lite"}) {
    const Rope rope(*ModelConfig::preset(preset));
    std::mt19937 rng(2);
    std::normal_distribution<float> nd;
    std::vector<float> q(64), k(64);
    for (float& e : q) e = nd(rng);
    for (float& e : k) e = nd(rng);
    auto dot_at = [&](int pq, int pk) {
      std::vector<float> a = q, b = k;
      rope.apply(a, pq);
      rope.apply(b, pk);
      double s = 0;
      for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
      return s;
    };
    const double base = dot_at(7, 3);
    EXPECT_NEAR(dot_at(107, 103), base, 1e-3 * std::abs(base) + 1e-3) << preset;
    EXPECT_NEAR(dot_at(4, 0), base, 1e-3 * std::abs(base) + 1e-3) << preset;
    // and it does depend on the difference
    EXPECT_GT(std::abs(dot_at(9, 3) - base), 1e-3) << preset;
  }
}

TEST(Yarn, CorrectionDimsForV2Lite) {
  const YarnCorrDims d = yarn_corr_dims(64, 4096, 10000.f, 32.f, 1.f);
  EXPECT_EQ(d.low, 10.f);
  EXPECT_EQ(d.high, 23.f);
}

TEST(Yarn, FrequenciesForV2Lite) {
  const ModelConfig c = *ModelConfig::preset("ds2lite");
  const Rope rope(c);
  const int64_t p = 1000;
  auto extrap = [&](int k) { return double(p) * std::pow(10000.0, -2.0 * k / 64.0); };
  for (int k : {0, 5, 10}) EXPECT_NEAR(rope.theta(k, p), extrap(k), 1e-9 * extrap(k)) << k;  // kept
  for (int k : {23, 24, 31}) EXPECT_NEAR(rope.theta(k, p), extrap(k) / 40.0, 1e-9 * extrap(k)) << k;  // / 40
  // linear blend in between: k = 16 is 6/13 of the way from 10 to 23
  const double mix = 1.0 - 6.0 / 13.0;
  EXPECT_NEAR(rope.theta(16, p), extrap(16) / 40.0 * (1 - mix) + extrap(16) * mix, 1e-9 * extrap(16));
  // llama.cpp's attn_factor makes the cos/sin magnitude exactly 1
  EXPECT_NEAR(rope.mscale(), 1.0, 1e-6);
  EXPECT_NEAR(c.rope_attn_factor(), 0.730520, 1e-6);
}

TEST(Rope, GlmHasNoScaling) {
  const ModelConfig c = *ModelConfig::preset("glm47flash");
  const Rope rope(c);
  EXPECT_DOUBLE_EQ(rope.mscale(), 1.0);
  EXPECT_NEAR(rope.theta(31, 5), 5 * std::pow(1e6, -62.0 / 64.0), 1e-12);
}

TEST(KqScale, PresetValues) {
  EXPECT_NEAR(ModelConfig::preset("glm47flash")->kq_scale(), 0.0625, 1e-7);
  EXPECT_NEAR(ModelConfig::preset("ds2lite")->kq_scale(), 0.114721, 1e-6);
}

namespace {
ModelConfig router_config(GatingFunc g, uint32_t used, bool norm, float scale) {
  ModelConfig c;
  c.gating = g;
  c.n_expert = 4;
  c.n_expert_used = used;
  c.expert_weights_norm = norm;
  c.expert_weights_scale = scale;
  return c;
}
double sigmoid(double z) { return 1 / (1 + std::exp(-z)); }
}  // namespace

TEST(Router, BiasChangesChoiceNotWeights) {
  const ModelConfig c = router_config(GatingFunc::Sigmoid, 2, false, 1.f);
  const std::vector<float> logits{2, 1, 0, -1};
  const Route plain = route_token(c, logits, {});
  EXPECT_EQ(plain.experts, (std::vector<uint32_t>{0, 1}));
  const std::vector<float> bias{0, 0, 5, 0};
  const Route biased = route_token(c, logits, bias);
  EXPECT_EQ(biased.experts, (std::vector<uint32_t>{2, 0}));
  // weights are the unbiased sigmoid probabilities
  EXPECT_NEAR(biased.weights[0], sigmoid(0), 1e-7);
  EXPECT_NEAR(biased.weights[1], sigmoid(2), 1e-7);
  EXPECT_NEAR(plain.weights[0], biased.weights[1], 1e-7);
}

TEST(Router, TiesGoToTheLowerIndex) {
  const ModelConfig c = router_config(GatingFunc::Sigmoid, 2, false, 1.f);
  EXPECT_EQ(route_token(c, std::vector<float>{1, 3, 3, 3}, {}).experts, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(route_token(c, std::vector<float>{0, 0, 0, 0}, {}).experts, (std::vector<uint32_t>{0, 1}));
}

TEST(Router, NormalizeThenScale) {
  const ModelConfig c = router_config(GatingFunc::Sigmoid, 3, true, 1.8f);
  const std::vector<float> logits{0.5f, -1, 2, 0.1f};
  const Route r = route_token(c, logits, {});
  EXPECT_EQ(r.experts, (std::vector<uint32_t>{2, 0, 3}));
  const double sum = sigmoid(2) + sigmoid(0.5) + sigmoid(0.1);
  EXPECT_NEAR(r.weights[0], 1.8 * sigmoid(2) / sum, 1e-6);
  EXPECT_NEAR(r.weights[0] + r.weights[1] + r.weights[2], 1.8, 1e-6);
}

TEST(Router, GlmPresetWeightsSumTo1_8) {
  ModelConfig c = *ModelConfig::preset("glm47flash");
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(c.n_expert), bias(c.n_expert);
    for (float& l : logits) l = 3 * nd(rng);
    for (float& b : bias) b = 0.1f * nd(rng);
    const Route r = route_token(c, logits, bias);
    ASSERT_EQ(r.experts.size(), 4u);
    EXPECT_NEAR(std::accumulate(r.weights.begin(), r.weights.end(), 0.0), 1.8, 1e-5);
  }
}

TEST(Router, SoftmaxIsRawProbability) {
  const ModelConfig c = router_config(GatingFunc::Softmax, 2, false, 1.f);
  const std::vector<float> logits{1, 2, 3, 0};
  const Route r = route_token(c, logits, {});
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + 1.0;
  EXPECT_EQ(r.experts, (std::vector<uint32_t>{2, 1}));
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(r.weights[1], std::exp(2.0) / z, 1e-6);
}

TEST(Router, NanLogitsDoNotCrash) {
  const ModelConfig c = router_config(GatingFunc::Sigmoid, 2, true, 1.8f);
  const Route r = route_token(c, std::vector<float>{NAN, 1, NAN, 0}, {});
  EXPECT_EQ(r.experts.size(), 2u);
}

TEST(ThreadPool, EveryIndexOnceAndErrorsPropagate) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(hits.size(), [&](size_t i) { hits[i]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(pool.parallel_for(100, [](size_t i) {
    if (i == 37) throw std::runtime_error("boom");
  }),
               std::runtime_error);
  // still usable afterwards
  std::atomic<int> n{0};
  pool.parallel_for(50, [&](size_t) { n++; });
  EXPECT_EQ(n.load(), 50);
}

TEST(LatentKvCache, RoundsToF16) {
  LatentKvCache cache(4, 3);
  const float row[3] = {0.1f, -3.14159f, 70000.f};
  cache.store(2, row);
  const std::vector<float> back = cache.read(3);
  EXPECT_EQ(back[6], fp16_to_f32(f32_to_fp16(0.1f)));
  EXPECT_NE(back[6], 0.1f);
  EXPECT_EQ(back[7], fp16_to_f32(f32_to_fp16(-3.14159f)));
  EXPECT_TRUE(std::isinf(back[8]));
}
