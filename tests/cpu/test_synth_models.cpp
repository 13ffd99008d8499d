// CpuModel on synthetic tiny models (convert/synth.h) of both structures and every synth type:
// the two attention paths agree, decoding token by token equals one batched prompt, quantized
// files run and give finite, non-degenerate logits.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "convert/synth.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/weight_source.h"
#include "tests/cpu/test_util.h"

namespace tessera {
namespace {

// Synthesizes (once per process) preset/type into the test temp folder.
const std::string& synth_model(const std::string& preset, const std::string& type) {
  static std::map<std::string, std::string> made;
  const std::string key = preset + "-" + type;
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const std::string path = (test::temp_dir() / (key + ".gguf")).string();
  synth::SynthOptions o;
  o.preset = preset;
  o.type = type;
  o.seed = 42;
  o.out_path = path;
  o.threads = 2;
  synth::synthesize(o);
  return made[key] = path;
}

std::vector<int32_t> prompt(size_t n, uint32_t vocab) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7919 + 13) % vocab);
  return t;
}

double stddev(const std::vector<float>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double s = 0;
  for (float x : v) s += (x - mean) * (x - mean);
  return std::sqrt(s / double(v.size()));
}

class TinyPreset : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyPreset, AbsorbedAndExpandedAgree) {
  GgufWeights w(synth_model(GetParam(), "f32"));
  CpuModel absorbed(w, 128, 2, AttentionPath::Absorbed);
  CpuModel expanded(w, 128, 2, AttentionPath::Expanded);
  for (size_t n : {1, 7, 100}) {
    absorbed.reset();
    expanded.reset();
    const std::vector<int32_t> tokens = prompt(n, absorbed.config().n_vocab);
    const std::vector<float> a = absorbed.forward(tokens), e = expanded.forward(tokens);
    ASSERT_EQ(a.size(), n * absorbed.config().n_vocab);
    EXPECT_TRUE(test::all_finite(a));
    EXPECT_LT(test::max_rel_diff(e, a), 1e-4) << n << " tokens";
    EXPECT_GT(stddev(a), 0.1) << "logits are degenerate";
  }
}

TEST_P(TinyPreset, StepByStepEqualsBatched) {
  GgufWeights w(synth_model(GetParam(), "f32"));
  for (AttentionPath p : {AttentionPath::Absorbed, AttentionPath::Expanded}) {
    CpuModel model(w, 64, 2, p);
    const std::vector<int32_t> tokens = prompt(12, model.config().n_vocab);
    const std::vector<float> batched = model.forward(tokens);
    model.reset();
    // first 5 as a chunk, then one at a time
    std::vector<float> stepped = model.forward(std::span<const int32_t>(tokens.data(), 5));
    for (size_t i = 5; i < tokens.size(); ++i) {
      const std::vector<float> l = model.forward(std::span<const int32_t>(&tokens[i], 1));
      stepped.insert(stepped.end(), l.begin(), l.end());
    }
    EXPECT_EQ(model.n_past(), 12);
    EXPECT_LT(test::max_rel_diff(stepped, batched), 1e-5) << attention_path_name(p);
  }
}

TEST_P(TinyPreset, EveryTypeRunsFinite) {
  std::vector<float> ref;
  for (const char* type : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m"}) {
    GgufWeights w(synth_model(GetParam(), type));
    CpuModel model(w, 16, 2, AttentionPath::Absorbed);
    const std::vector<float> l = model.forward(prompt(9, model.config().n_vocab), true);
    ASSERT_EQ(l.size(), model.config().n_vocab) << type;
    EXPECT_TRUE(test::all_finite(l)) << type;
    EXPECT_GT(stddev(l), 0.1) << type;
    if (ref.empty()) ref = l;
    // same seed, same values before quantization: every type stays close to f32
    EXPECT_LT(test::max_rel_diff(l, ref), 0.5) << type;
  }
}

TEST_P(TinyPreset, ThreadCountDoesNotChangeLogits) {
  GgufWeights w(synth_model(GetParam(), "q4_k_m"));
  CpuModel one(w, 32, 1, AttentionPath::Absorbed), three(w, 32, 3, AttentionPath::Absorbed);
  const std::vector<int32_t> tokens = prompt(20, one.config().n_vocab);
  EXPECT_EQ(one.forward(tokens), three.forward(tokens));  // bit for bit
}

INSTANTIATE_TEST_SUITE_P(Presets, TinyPreset, ::testing::Values("tiny", "tiny-lite"),
                         [](const auto& info) { return std::string(info.param) == "tiny" ? "tiny" : "tiny_lite"; });

}  // namespace
}  // namespace tessera
