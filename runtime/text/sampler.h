// Token sampling on the host, and stop-string matching for generated text.
//
// Sampling order (each stage sees the previous stage's survivors):
//   1. penalties over the last penalty_last_n accepted tokens: repeat (llama.cpp style: positive
//      logits divided by repeat_penalty, negative ones multiplied), then
//      logit -= count * frequency_penalty + (count > 0) * presence_penalty;
//   2. top-k (k <= 0 or k >= n keeps all);
//   3. top-p: the smallest set of most likely tokens whose probability reaches top_p (>= 1 keeps all);
//   4. min-p: drop tokens whose probability is below min_p times the most likely one's (<= 0 keeps all);
//   5. temperature: logits / temperature, softmax over the survivors;
//   6. draw one token with the seeded RNG (std::mt19937_64, 53-bit uniform).
// temperature <= 0 is greedy: the argmax after penalties (lowest id on ties), no RNG draw.
// Probabilities in 3-4 use the penalized logits at temperature 1, as llama.cpp does.
// Ties between equal logits are ordered by token id, so results never depend on sort stability.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::text {

struct SamplerParams {
  float temperature = 0.8f;  // 0 = greedy
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;  // 1 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int penalty_last_n = 64;  // window of accepted tokens the penalties look at (0 = off)
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerParams params);

  // Picks the next token from `logits` (one per vocab id). Does not accept it: call accept()
  // with the token actually used (it may be a forced one). Throws Error(Runtime) for empty logits.
  int32_t sample(std::span<const float> logits);
  // Records a token for the penalties.
  void accept(int32_t token);
  // Clears the penalty history and reseeds the RNG with params().seed.
  void reset();

  // Test hook: the candidate ids that survive stages 1-4, most likely first.
  std::vector<int32_t> kept_candidates(std::span<const float> logits) const;
  // Test hook: the logits after stage 1 (penalties).
  std::vector<float> penalized(std::span<const float> logits) const;

  const SamplerParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  std::vector<Candidate> filter(std::span<const float> logits) const;

  SamplerParams params_;
  std::mt19937_64 rng_;
  std::deque<int32_t> history_;  // last penalty_last_n accepted tokens
};

// Holds back generated text that might be the start of a stop string, so a stop string is never
// shown. Feed it decoded text chunks; it returns what is safe to print.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  // Adds `text`; returns the text now known not to be part of a stop string. When a stop string
  // completes, returns the text before it, stopped() becomes true, and later calls return "".
  std::string push(std::string_view text);
  // The text still held back (generation ended without a stop string); clears it.
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that matched ("" while not stopped).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tessera::text
