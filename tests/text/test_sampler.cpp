// Sampler stages and stop strings.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/text/sampler.h"

using namespace tessera::text;

namespace {

SamplerParams only(int top_k, float top_p, float min_p) {
  SamplerParams p;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

// Logits whose softmax is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

}  // namespace

TEST(Sampler, GreedyIsArgmax) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  SamplerParams p;
  p.temperature = 0;
  Sampler s(p);
  for (int iter = 0; iter < 50; ++iter) {
    std::vector<float> logits(1000);
    for (float& l : logits) l = normal(rng);
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(s.sample(logits), best);
  }
  EXPECT_EQ(s.sample(std::vector<float>{1, 3, 3, 2}), 1);  // ties -> lowest id
  EXPECT_EQ(s.sample(std::vector<float>{NAN, 0.5f, -1}), 1);
}

TEST(Sampler, TopKKeepsExactlyK) {
  Sampler s(only(3, 1.0f, 0.0f));
  EXPECT_EQ(s.kept_candidates(std::vector<float>{1, 5, 3, 4, 2}), (std::vector<int32_t>{1, 3, 2}));
  Sampler all(only(0, 1.0f, 0.0f));
  EXPECT_EQ(all.kept_candidates(std::vector<float>{1, 5, 3, 4, 2}), (std::vector<int32_t>{1, 3, 2, 4, 0}));
  Sampler big(only(100, 1.0f, 0.0f));
  EXPECT_EQ(big.kept_candidates(std::vector<float>{2, 2, 1}), (std::vector<int32_t>{0, 1, 2}));
}

TEST(Sampler, TopPKeepsSmallestSetReachingP) {
  const std::vector<float> logits = logits_of({0.1, 0.5, 0.15, 0.25});
  EXPECT_EQ(Sampler(only(0, 0.45f, 0.0f)).kept_candidates(logits), (std::vector<int32_t>{1}));
  EXPECT_EQ(Sampler(only(0, 0.7f, 0.0f)).kept_candidates(logits), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(Sampler(only(0, 0.8f, 0.0f)).kept_candidates(logits), (std::vector<int32_t>{1, 3, 2}));
  EXPECT_EQ(Sampler(only(0, 0.95f, 0.0f)).kept_candidates(logits), (std::vector<int32_t>{1, 3, 2, 0}));
  // top-p renormalizes over the top-k survivors: of {0.5, 0.25}, 0.5 is 2/3.
  EXPECT_EQ(Sampler(only(2, 0.6f, 0.0f)).kept_candidates(logits), (std::vector<int32_t>{1}));
}

TEST(Sampler, MinPKeepsTokensAboveFractionOfBest) {
  const std::vector<float> logits = logits_of({0.1, 0.5, 0.15, 0.25});
  EXPECT_EQ(Sampler(only(0, 1.0f, 0.25f)).kept_candidates(logits), (std::vector<int32_t>{1, 3, 2}));  // >= 0.125
  EXPECT_EQ(Sampler(only(0, 1.0f, 0.4f)).kept_candidates(logits), (std::vector<int32_t>{1, 3}));      // >= 0.2
  EXPECT_EQ(Sampler(only(0, 1.0f, 0.9f)).kept_candidates(logits), (std::vector<int32_t>{1}));
  EXPECT_EQ(Sampler(only(0, 1.0f, 0.15f)).kept_candidates(logits), (std::vector<int32_t>{1, 3, 2, 0}));
}

TEST(Sampler, SameSeedSameSequence) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 2;
  const auto run = [&](uint64_t seed) {
    SamplerParams p = only(0, 1.0f, 0.0f);
    p.temperature = 1.0f;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));

  SamplerParams p = only(0, 1.0f, 0.0f);
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler s(p);
  std::vector<int32_t> first;
  for (int i = 0; i < 64; ++i) first.push_back(s.sample(logits));
  s.reset();
  std::vector<int32_t> again;
  for (int i = 0; i < 64; ++i) again.push_back(s.sample(logits));
  EXPECT_EQ(first, again);
}

TEST(Sampler, DrawFollowsTemperatureScaledDistribution) {
  SamplerParams p = only(0, 1.0f, 0.0f);
  p.seed = 5;
  p.temperature = 1.0f;
  Sampler s(p);
  const std::vector<float> logits = logits_of({0.75, 0.25});
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits) == 1;
  EXPECT_NEAR(ones / double(n), 0.25, 0.03);

  p.temperature = 0.5f;  // probabilities squared and renormalized: 0.9 / 0.1
  Sampler cold(p);
  ones = 0;
  for (int i = 0; i < n; ++i) ones += cold.sample(logits) == 1;
  EXPECT_NEAR(ones / double(n), 0.1, 0.02);
}

TEST(Sampler, PenaltiesChangeOnlyRecentTokens) {
  SamplerParams p;
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.penalty_last_n = 3;
  Sampler s(p);
  for (int32_t t : {7, 2, 2, 5}) s.accept(t);  // the window keeps {2, 2, 5}
  const std::vector<float> logits = {1, 1, 4, 1, 1, -1, 1, 3};
  const std::vector<float> pen = s.penalized(logits);
  EXPECT_FLOAT_EQ(pen[2], 4.0f / 2 - 2 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(pen[5], -1.0f * 2 - 1 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(pen[7], 3.0f);  // left the window
  for (int i : {0, 1, 3, 4, 6}) EXPECT_FLOAT_EQ(pen[i], 1.0f);
  s.reset();
  EXPECT_EQ(s.penalized(logits), logits);

  // Greedy sees the penalties: token 2 drops below token 7.
  p.temperature = 0;
  Sampler greedy(p);
  EXPECT_EQ(greedy.sample(logits), 2);
  greedy.accept(2);
  EXPECT_EQ(greedy.sample(logits), 7);
}

TEST(StopMatcher, HoldsBackPossiblePrefixes) {
  StopMatcher m({"</s>", "STOP", ""});
  EXPECT_EQ(m.push("Hello <"), "Hello ");
  EXPECT_EQ(m.push("/"), "");
  EXPECT_EQ(m.push("x"), "</x");
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.push("OR"), "STOR");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("ab</s>cd"), "ab");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</s>");
  EXPECT_EQ(m.push("more"), "");

  StopMatcher tail({"END"});
  EXPECT_EQ(tail.push("the E"), "the ");
  EXPECT_EQ(tail.flush(), "E");
  EXPECT_FALSE(tail.stopped());

  StopMatcher earliest({"bc", "abcd"});  // the stop string that starts first wins
  EXPECT_EQ(earliest.push("xabcd"), "x");
  EXPECT_EQ(earliest.matched(), "abcd");
}
