// The CPU reference (CpuModel) over packed files through TsrWeights: with --compose none the
// logits equal the original GGUF's bit for bit (the packed layouts are lossless); with composed
// weights they agree within the stored type's error (same top-1, small relative difference).
// Also TsrWeights itself: the un-tiled expert tensors read back exactly as the GGUF's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "runtime/cpu/forward.h"
#include "runtime/cpu/tsr_weights.h"
#include "runtime/cpu/weight_source.h"
#include "tests/convert/convert_test_util.h"

namespace tessera::convert {
namespace {

using testing::packed_model;
using testing::synth_model;

std::vector<int32_t> prompt(size_t n, uint32_t vocab) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7919 + 13) % vocab);
  return t;
}

// Logits of a 9-token prompt (every position) on the absorbed path, 2 threads.
std::vector<float> logits(const WeightSource& w) {
  CpuModel m(w, 64, 2, AttentionPath::Absorbed);
  return m.forward(prompt(9, m.config().n_vocab));
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::abs(double(b[i])));
  }
  return diff / ref;
}

// Fraction of positions whose arg-max agrees.
double top1_agreement(const std::vector<float>& a, const std::vector<float>& b, size_t vocab) {
  size_t same = 0, n = a.size() / vocab;
  for (size_t p = 0; p < n; ++p) {
    const auto ia = std::max_element(a.begin() + int64_t(p * vocab), a.begin() + int64_t((p + 1) * vocab));
    const auto ib = std::max_element(b.begin() + int64_t(p * vocab), b.begin() + int64_t((p + 1) * vocab));
    same += (ia - a.begin()) == (ib - b.begin());
  }
  return double(same) / double(n);
}

struct Case {
  const char* preset;
  const char* type;
};
class PackedCpuLogits : public ::testing::TestWithParam<Case> {};

TEST_P(PackedCpuLogits, UncomposedIsExactComposedIsClose) {
  const Case c = GetParam();
  const GgufWeights orig(synth_model(c.preset, c.type));
  const std::vector<float> ref = logits(orig);
  const size_t vocab = ModelConfig::from_metadata(orig.metadata()).n_vocab;

  const std::unique_ptr<WeightSource> none = open_weights(packed_model(c.preset, c.type, "none"));
  ASSERT_NE(dynamic_cast<const TsrWeights*>(none.get()), nullptr) << "open_weights picks TsrWeights by magic";
  const std::vector<float> exact = logits(*none);
  ASSERT_EQ(exact.size(), ref.size());
  EXPECT_TRUE(exact == ref) << "max rel diff " << max_rel_diff(exact, ref);

  // Composed: f32 storage isolates the algebra (float64 products rounded once), q8_0 adds its
  // quantization. Tolerances: relative to the largest logit magnitude.
  const struct { const char* type; double tol; } composed[] = {{"f32", 1e-4}, {"q8_0", 3e-2}};
  for (const auto& k : composed) {
    SCOPED_TRACE(k.type);
    const TsrWeights w(packed_model(c.preset, c.type, "all", k.type));
    const std::vector<float> got = logits(w);
    const double d = max_rel_diff(got, ref);
    EXPECT_LT(d, k.tol);
    EXPECT_GE(top1_agreement(got, ref, vocab), 8.0 / 9.0) << "max rel diff " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(Synth, PackedCpuLogits,
                         ::testing::Values(Case{"tiny", "q4_k_m"}, Case{"tiny-lite", "q4_0"}, Case{"tiny", "bf16"},
                                           Case{"tiny-lite", "q4_k_m"}),
                         [](const auto& info) {
                           std::string n = std::string(info.param.preset) + "_" + info.param.type;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

TEST(TsrWeights, ExpertTensorsReadBackAsTheGguf) {
  const GgufWeights orig(synth_model("tiny-lite", "q4_k_m"));
  const TsrWeights packed(packed_model("tiny-lite", "q4_k_m", "all"), /*check_tensors=*/true);
  for (const char* name : {"blk.1.ffn_gate_exps.weight", "blk.2.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight",
                           "blk.2.ffn_gate_shexp.weight", "blk.1.ffn_down_shexp.weight", "token_embd.weight",
                           "blk.0.attn_kv_a_mqa.weight", "blk.1.ffn_gate_inp.weight"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(packed.has(name));
    const TensorDesc a = orig.desc(name), b = packed.desc(name);
    EXPECT_EQ(a.type, b.type);
    EXPECT_EQ(a.ne, b.ne);
    EXPECT_EQ(orig.read_all(name), packed.read_all(name));
    // A row range in the middle (crossing an expert boundary for 3-D tensors).
    const uint64_t r0 = a.n_rows() / 2 - 1;
    std::vector<float> x(2 * a.ne[0]), y(2 * a.ne[0]);
    orig.read_rows(name, r0, 2, x.data());
    packed.read_rows(name, r0, 2, y.data());
    EXPECT_EQ(x, y);
  }
  EXPECT_FALSE(packed.has("blk.1.attn_k_b.weight"));  // replaced by attn_qk
  EXPECT_TRUE(packed.has("blk.1.attn_qk.weight"));
  EXPECT_FALSE(packed.has("blk.1.ffn_moe_tile"));     // only its GGUF-named parts are shown
  std::vector<float> out(256);
  EXPECT_THROW(packed.read_rows("blk.1.ffn_down_shexp.weight", 256, 1, out.data()), Error);
  EXPECT_THROW(packed.desc("nope"), Error);
}

}  // namespace
}  // namespace tessera::convert
