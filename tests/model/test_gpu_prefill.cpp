// The batched prefill graph (docs/PREFILL.md) on the tiny synthetic models: logits of every
// position and of the last against the CPU reference, across chunk boundaries; prefill then decode
// against token-by-token decode; stats and context errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/tsr.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/tsr_weights.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/kernels_matmul.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

testfx::ModelFixture fixture("prefill");

vk::Context* context() { return fixture.context(); }

// Synthesizes and converts once per (preset, type, compose); returns the .tsr path.
std::string tsr_file(const std::string& preset, const std::string& type, const std::string& compose) {
  return fixture.files(preset, type, compose).tsr;
}

using testfx::prompt;

model::GpuModelOptions options(uint32_t n_ctx, uint32_t chunk) {
  model::GpuModelOptions o;
  o.n_ctx = n_ctx;
  o.prefill_chunk = chunk;
  o.int8_activations = false;  // prefill runs f32 activations; single tokens (decode) then match
  o.prefill_matmul = 0;         // f32 matvecs (the matmuls' f16 products: MatmulPrefill below)
  return o;
}

using Compare = testfx::LogitGap;
using testfx::compare_logits;

// Rows whose argmax differs although the reference's top two logits are more than `margin`
// (relative to the largest |logit| of the row) apart: a near tie may go either way under f16
// rounding, a clear winner may not.
size_t clear_top1_diffs(const std::vector<float>& a, const std::vector<float>& ref, size_t V, double margin) {
  size_t n = 0;
  for (size_t r = 0; r < std::min(a.size(), ref.size()) / V; ++r) {
    const float* x = a.data() + r * V;
    const float* y = ref.data() + r * V;
    const size_t top = std::max_element(y, y + V) - y;
    double second = -1e300, big = 0;
    for (size_t i = 0; i < V; ++i) {
      if (i != top) second = std::max(second, double(y[i]));
      big = std::max(big, std::abs(double(y[i])));
    }
    if (double(y[top]) - second > margin * big && size_t(std::max_element(x, x + V) - x) != top) ++n;
  }
  return n;
}

struct Case {
  const char* preset;
  const char* type;
  const char* compose;
};

class PrefillVsCpu : public ::testing::TestWithParam<Case> {};

// Chunks of T = 8: prompt lengths 1 (decode graph), T-1, T, T+1, 2T+3, each after a reset, and a
// second prompt continuing a context (p0 > 0, not a multiple of T).
TEST_P(PrefillVsCpu, LogitsOfEveryPositionMatchTheReference) {
  if (!context()) GTEST_SKIP() << "no Vulkan device";
  const Case& k = GetParam();
  const std::string path = tsr_file(k.preset, k.type, k.compose);
  TsrFile tsr = TsrFile::open(path);
  constexpr uint32_t T = 8;
  model::GpuModel gpu(*context(), tsr, options(64, T));
  ASSERT_EQ(gpu.prefill_stats().chunk, T);
  TsrWeights packed(path);
  const size_t V = gpu.n_vocab();
  for (size_t n : {size_t(1), size_t(T - 1), size_t(T), size_t(T + 1), size_t(2 * T + 3)}) {
    const auto p = prompt(gpu.n_vocab(), n);
    gpu.reset();
    const auto all = gpu.forward(p, false);
    EXPECT_EQ(gpu.n_past(), int(n));
    CpuModel cpu(packed, 64, 2, AttentionPath::Absorbed);
    const auto ref = cpu.forward(p, false);
    const Compare c = compare_logits(all, ref, V);
    EXPECT_LT(c.max_rel, 2e-3) << k.preset << " " << k.type << " " << k.compose << " n=" << n;
    EXPECT_EQ(c.top1_diff(), 0u) << "n=" << n;
    // last_only: the last row only (the head of one token; same body).
    gpu.reset();
    const auto last = gpu.forward(p, true);
    const std::vector<float> last_ref(all.end() - V, all.end());
    EXPECT_LT(compare_logits(last, last_ref, V).max_rel, 1e-4) << "n=" << n;
    // Continue the context: 5 more tokens at positions n.. (a chunk starting off the T grid).
    const auto more = prompt(gpu.n_vocab(), 5, 1);
    const auto cont = gpu.forward(more, false);
    const auto cont_ref = cpu.forward(more, false);
    const Compare cc = compare_logits(cont, cont_ref, V);
    EXPECT_LT(cc.max_rel, 2e-3) << "continuation after n=" << n;
    EXPECT_EQ(cc.top1_diff(), 0u) << "continuation after n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, PrefillVsCpu,
                         ::testing::Values(Case{"tiny", "f32", "none"}, Case{"tiny", "q4_0", "all"},
                                           Case{"tiny", "q4_k_m", "none"}, Case{"tiny", "bf16", "vo"},
                                           Case{"tiny-lite", "q4_k_m", "none"}, Case{"tiny-lite", "q4_0", "all"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string s = std::string(i.param.preset) + "_" + i.param.type + "_" + i.param.compose;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// The dense matrices as matmuls and the FFN in its matmul form (GpuModelOptions::
// prefill_matmul 1: the tensor-core kernels where the device has them, else the same kernels with
// plain FMAs): f16 inputs and weights, f32 sums. Prompts of 70 tokens in chunks of 64 and of 20 in
// chunks of 8, every position's logits against the CPU reference (the argmax wherever the
// reference's top two are apart); the stats say which kernel ran.
TEST_P(PrefillVsCpu, MatmulLogitsMatchTheReference) {
  if (!context()) GTEST_SKIP() << "no Vulkan device";
  if (!vk::matmul_supported(*context())) GTEST_SKIP() << "no shaderFloat16";
  const Case& k = GetParam();
  const std::string path = tsr_file(k.preset, k.type, k.compose);
  TsrFile tsr = TsrFile::open(path);
  TsrWeights packed(path);
  for (uint32_t T : {64u, 8u}) {
    model::GpuModelOptions o = options(128, T);
    o.prefill_matmul = 1;
    // The FFN's matmul form too (experts, dense layers; auto: only in chunks of >= 256), else its int8 form.
    o.prefill_moe_matmul = T == 64 ? 1 : 0;
    model::GpuModel gpu(*context(), tsr, o);
    ASSERT_TRUE(gpu.prefill_stats().matmul);
    EXPECT_EQ(gpu.prefill_stats().matmul_coop, vk::matmul_coop_supported(*context()));
    const size_t n = T == 64 ? 70 : 20;
    const auto p = prompt(gpu.n_vocab(), n);
    const auto all = gpu.forward(p, false);
    CpuModel cpu(packed, 128, 2, AttentionPath::Absorbed);
    const auto ref = cpu.forward(p, false);
    const Compare c = compare_logits(all, ref, gpu.n_vocab());
    EXPECT_LT(c.max_rel, 4e-3) << k.preset << " " << k.type << " " << k.compose << " T=" << T;
    EXPECT_LE(c.top1_diff(), 2u) << k.preset << " " << k.type << " " << k.compose << " T=" << T;
    EXPECT_EQ(clear_top1_diffs(all, ref, gpu.n_vocab(), 8e-3), 0u) << k.preset << " " << k.type << " " << k.compose << " T=" << T;
  }
}

// The default chunk (64) with a prompt of 70 tokens: one full chunk and a partial one.
TEST(GpuPrefill, DefaultChunkMatchesTheReference) {
  if (!context()) GTEST_SKIP() << "no Vulkan device";
  const std::string path = tsr_file("tiny", "q8_0", "all");
  TsrFile tsr = TsrFile::open(path);
  model::GpuModel gpu(*context(), tsr, options(128, model::GpuModelOptions{}.prefill_chunk));
  EXPECT_EQ(gpu.prefill_stats().chunk, 64u);
  const auto p = prompt(gpu.n_vocab(), 70);
  const auto lg = gpu.forward(p, false);
  TsrWeights packed(path);
  CpuModel cpu(packed, 128, 2, AttentionPath::Absorbed);
  const Compare c = compare_logits(lg, cpu.forward(p, false), gpu.n_vocab());
  EXPECT_LT(c.max_rel, 2e-3);
  EXPECT_EQ(c.top1_diff(), 0u);
}

// The tail recording: chunks of 32 with a tail chunk of 8. Prompts of 5 (tail), 20 (one chunk of
// the large recording: more than twice the tail remain) and 45 (32, then 8 + 5 in the tail's),
// each after a reset and continued by 3 tokens (tail), every position's logits against the CPU;
// with the f32 matvecs and with the matmuls (live token counts); and with up to 3 tail chunks
// (GpuModelOptions::prefill_tail_chunks: 20 as 8 + 8 + 4).
TEST(GpuPrefill, TailChunksMatchTheReference) {
  if (!context()) GTEST_SKIP() << "no Vulkan device";
  const std::string path = tsr_file("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(path);
  TsrWeights packed(path);
  struct Config {
    int matmul;
    uint32_t tail_chunks;
  };
  for (const Config& cfg : {Config{0, 2}, Config{1, 2}, Config{1, 3}}) {
    const int matmul = cfg.matmul;
    if (matmul && !vk::matmul_supported(*context())) continue;
    model::GpuModelOptions o = options(128, 32);
    o.prefill_tail_chunk = 8;
    o.prefill_tail_chunks = cfg.tail_chunks;
    o.prefill_matmul = matmul;
    model::GpuModel gpu(*context(), tsr, o);
    const size_t V = gpu.n_vocab();
    for (size_t n : {size_t(5), size_t(20), size_t(45)}) {
      gpu.reset();
      CpuModel cpu(packed, 128, 2, AttentionPath::Absorbed);
      const auto p = prompt(gpu.n_vocab(), n);
      const Compare c = compare_logits(gpu.forward(p, false), cpu.forward(p, false), V);
      EXPECT_LT(c.max_rel, matmul ? 4e-3 : 2e-3) << "n=" << n << " matmul " << matmul << " tail chunks " << cfg.tail_chunks;
      const auto more = prompt(gpu.n_vocab(), 3, 1);
      const Compare cc = compare_logits(gpu.forward(more, false), cpu.forward(more, false), V);
      EXPECT_LT(cc.max_rel, matmul ? 4e-3 : 2e-3) << "continuation after n=" << n << " matmul " << matmul;
      EXPECT_EQ(gpu.n_past(), int(n + 3));
    }
  }
}

// The prefill attention's work split (GpuModelOptions::prefill_attention_*): one chunk per query,
// chunks of at least 16 positions, 4 queries x 64 pairs per workgroup, and the tensor-core kernel
// (its plain-FMA form here), also with the dense matrices as matmuls (then the tensor-core
// kernel writes W_vo's f16 input rows itself), and its walks split in 3 context chunks and
// merged in every chunk, or (with the matmuls: W_vo's input then from the merge, f32) in the
// chunks from position 32 on (the deep recording beside the first); each against the CPU
// reference over prompts that cross chunk and group boundaries, then a continuation.
TEST(GpuPrefill, AttentionSplitsMatchTheReference) {
  if (!context()) GTEST_SKIP() << "no Vulkan device";
  const std::string path = tsr_file("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(path);
  TsrWeights packed(path);
  struct Split {
    uint32_t groups, min_chunk, queries, pairs;
    int tc = 0;  // PrefillAttentionTuning::tensor_cores
    bool matmul = false;
    uint32_t tc_split = 0;     // PrefillAttentionTuning::tc_split (0: automatic, 1 here: no SM count)
    uint32_t split_depth = 8;  // GpuModelOptions::prefill_tc_split_depth
  };
  for (const Split& sp : {Split{1, 0, 0, 0}, Split{3, 16, 0, 0}, Split{0, 0, 4, 64}, Split{0, 0, 0, 0, 1},
                          Split{0, 0, 0, 0, 1, true}, Split{4, 8, 0, 0, 1, false, 3, 0}, Split{4, 8, 0, 0, 1, true, 3, 1}}) {
    if (sp.tc && !vk::attention_tc_supported(*context(), true)) continue;
    if (sp.matmul && !vk::matmul_supported(*context())) continue;
    model::GpuModelOptions o = options(128, 32);
    if (sp.matmul) o.prefill_matmul = 1;
    o.prefill_attention_groups = sp.groups;
    o.prefill_attention_min_chunk = sp.min_chunk;
    o.prefill_attention.queries_per_group = sp.queries;
    o.prefill_attention.max_pairs = sp.pairs;
    o.prefill_attention.tensor_cores = sp.tc;
    o.prefill_attention.tc_split = sp.tc_split;
    o.prefill_tc_split_depth = sp.split_depth;
    model::GpuModel gpu(*context(), tsr, o);
    EXPECT_EQ(gpu.prefill_stats().attention_tc, sp.tc == 1);
    const size_t V = gpu.n_vocab();
    CpuModel cpu(packed, 128, 2, AttentionPath::Absorbed);
    const auto p = prompt(gpu.n_vocab(), 77);
    const Compare c = compare_logits(gpu.forward(p, false), cpu.forward(p, false), V);
    EXPECT_LT(c.max_rel, 2e-3) << "groups " << sp.groups << " min_chunk " << sp.min_chunk << " queries " << sp.queries
                               << " tc " << sp.tc << " matmul " << sp.matmul << " tc_split " << sp.tc_split;
    const auto more = prompt(gpu.n_vocab(), 5, 1);
    const Compare cc = compare_logits(gpu.forward(more, false), cpu.forward(more, false), V);
    EXPECT_LT(cc.max_rel, 2e-3) << "continuation, groups " << sp.groups;
  }
}

// Prefill of a prompt, then 32 greedy steps, equals the same prompt run token by token through
// the decode graph (prefill_chunk 0): the sampler's token and position carry over.
TEST(GpuPrefill, PrefillThenDecodeEqualsTokenByToken) {
  if (!context()) GTEST_SKIP() << "no Vulkan device";
  for (const char* preset : {"tiny", "tiny-lite"}) {
    const std::string path = tsr_file(preset, "q4_0", std::string(preset) == "tiny" ? "none" : "all");
    TsrFile tsr = TsrFile::open(path);
    model::GpuModel batched(*context(), tsr, options(64, 4));
    model::GpuModel stepwise(*context(), tsr, options(64, 0));
    EXPECT_EQ(stepwise.prefill_stats().chunk, 0u);
    const auto p = prompt(batched.n_vocab(), 11);
    batched.forward(p, true);
    stepwise.forward(p, true);
    EXPECT_EQ(batched.n_past(), 11);
    std::vector<int32_t> a{batched.sampled_token()}, b{stepwise.sampled_token()};
    for (int i = 1; i < 32; ++i) {
      a.push_back(batched.decode_step());
      b.push_back(stepwise.decode_step());
    }
    EXPECT_EQ(a, b) << preset;
    EXPECT_EQ(batched.n_past(), 11 + 31);
  }
}

TEST(GpuPrefill, StatsDescribeTheChunkGraph) {
  if (!context()) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(tsr_file("tiny", "q4_0", "all"));
  model::GpuModel gpu(*context(), tsr, options(64, 16));
  const model::PrefillStats& s = gpu.prefill_stats();
  EXPECT_EQ(s.chunk, 16u);
  // docs/PREFILL.md: embed | per layer 9 (dense) or 10 (MoE) barriers; with T/8 = 2 matvec
  // dispatches per matrix, 15 dispatches per dense and 19 per MoE layer (the router's logits in
  // the routing dispatch; tiny: 1 dense + 2 MoE).
  ASSERT_EQ(gpu.config().n_layer, 3u);
  EXPECT_EQ(s.dispatches, 1u + 15u + 2u * 19u);
  EXPECT_EQ(s.barriers, 1u + 9u + 2u * 10u);
  EXPECT_GT(s.weight_bytes, 0u);
  EXPECT_GT(s.scratch_bytes, 0u);
}

TEST(GpuPrefill, ContextFullIsAUsageErrorBeforeAnyWork) {
  if (!context()) GTEST_SKIP() << "no Vulkan device";
  TsrFile tsr = TsrFile::open(tsr_file("tiny", "q4_0", "all"));
  model::GpuModel m(*context(), tsr, options(8, 4));
  m.forward(prompt(m.n_vocab(), 6), true);
  try {
    m.forward(prompt(m.n_vocab(), 3), true);
    FAIL() << "expected a context-full error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("context full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.n_past(), 6);
  const int32_t bad[2] = {1, int32_t(m.n_vocab())};
  EXPECT_THROW(m.forward(bad, true), Error);
  EXPECT_EQ(m.n_past(), 6);
  m.forward(prompt(m.n_vocab(), 2), true);  // exactly full
  EXPECT_EQ(m.n_past(), 8);
}

}  // namespace
}  // namespace tessera
