// End-to-end: synth GGUF -> convert -> GpuModel (Vulkan, lavapipe here) against the CPU reference
// on the original GGUF: logits of a prompt, greedy tokens, decode vs prompt, context and memory
// errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/tsr.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/tsr_weights.h"
#include "runtime/cpu/weight_source.h"
#include "runtime/model/gpu_model.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "tests/model/model_fixture.h"

namespace tessera {
namespace {

testfx::ModelFixture fixture("model");

vk::Context& context() { return *fixture.context(); }
bool have_vulkan() { return fixture.context() != nullptr; }

using Files = testfx::ModelFiles;
Files files(const std::string& preset, const std::string& type, const std::string& compose,
            const std::string& composed_type = "q8_0") {
  return fixture.files(preset, type, compose, composed_type);
}

// max |a[i] - b[i]| (worst) and max |a[i]| (scale) over [begin, end) (end 0: to the end).
struct Gap {
  float worst = 0, scale = 0;
};
Gap gap(const std::vector<float>& a, const std::vector<float>& b, size_t begin = 0, size_t end = 0) {
  EXPECT_EQ(a.size(), b.size());
  Gap g;
  for (size_t i = begin; i < std::min(end ? end : a.size(), std::min(a.size(), b.size())); ++i) {
    g.scale = std::max(g.scale, std::fabs(a[i]));
    g.worst = std::max(g.worst, std::fabs(a[i] - b[i]));
  }
  return g;
}

using testfx::prompt;

using Compare = testfx::LogitGap;
using testfx::compare_logits;

struct Case {
  const char* preset;
  const char* type;
  const char* compose;
  const char* composed_type;
  double tol;  // max relative logit error vs the CPU reference on the original GGUF
};

class GpuVsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(GpuVsCpu, PromptLogitsMatchTheReference) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Case& k = GetParam();
  const Files f = files(k.preset, k.type, k.compose, k.composed_type);
  TsrFile tsr = TsrFile::open(f.tsr);
  model::GpuModelOptions mo{.n_ctx = 64};
  mo.int8_activations = false;  // the f32 kernels: same arithmetic as the CPU up to order and f16
  model::GpuModel gpu(context(), tsr, mo);
  const auto p = prompt(gpu.n_vocab(), 9);
  const auto lg = gpu.forward(p, false);
  // Same weights (the packed file) on the CPU: only arithmetic order and f16 rounding differ.
  TsrWeights packed(f.tsr);
  CpuModel cpu_packed(packed, 64, 2, AttentionPath::Absorbed);
  const Compare same = compare_logits(lg, cpu_packed.forward(p, false), gpu.n_vocab());
  EXPECT_LT(same.max_rel, 2e-3) << k.preset << " " << k.type << " compose " << k.compose << " vs CPU on the .tsr";
  EXPECT_EQ(same.top1_same, same.rows);
  // The original GGUF: composition rounds the composed weights once more (composed_type), and
  // a routing decision near a tie can flip; the tolerance is per case.
  GgufWeights src(GgufFile::open(f.gguf));
  CpuModel cpu(src, 64, 2, AttentionPath::Absorbed);
  const Compare c = compare_logits(lg, cpu.forward(p, false), gpu.n_vocab());
  EXPECT_LT(c.max_rel, k.tol) << k.preset << " " << k.type << " compose " << k.compose << " vs CPU on the .gguf";
  // Factored: at most one position may differ (near-ties). Composed with a quantized type: the
  // extra rounding can flip an expert choice, so only a majority is required here; the .tsr
  // comparison above stays exact.
  const bool quantized_composition = std::string(k.compose) != "none" && std::string(k.composed_type) != "f32" &&
                                     std::string(k.composed_type) != "f16";
  if (quantized_composition) EXPECT_GE(2 * c.top1_same, c.rows) << "top-1 differs in most positions";
  else EXPECT_GE(c.top1_same + 1, c.rows) << "top-1 differs in more than one position";
  // The recording meets the dispatch budget: <= 12 per layer plus embed, output norm, head and sampler.
  EXPECT_LE(gpu.stats().dispatches, 12 * gpu.config().n_layer + 4);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, GpuVsCpu,
    ::testing::Values(Case{"tiny", "f32", "none", "q8_0", 2e-3}, Case{"tiny", "f32", "all", "f32", 2e-3},
                      Case{"tiny", "q8_0", "none", "q8_0", 2e-3}, Case{"tiny", "q4_0", "none", "q8_0", 2e-3},
                      Case{"tiny", "q4_k_m", "none", "q8_0", 2e-3}, Case{"tiny", "q4_0", "all", "q8_0", 0.3 /* a near-tie expert choice flips with the q8_0 composed weights; the .tsr check above is tight */},
                      Case{"tiny", "f16", "qk", "f16", 5e-3}, Case{"tiny", "bf16", "vo", "bf16", 2e-2},
                      Case{"tiny-lite", "f32", "none", "q8_0", 2e-3}, Case{"tiny-lite", "q4_k_m", "none", "q8_0", 2e-3},
                      Case{"tiny-lite", "q4_0", "all", "q8_0", 3e-2}, Case{"tiny-lite", "f32", "all", "f32", 2e-3},
                      // K-quant composed weights (measured on lavapipe: 0.023, 0.22, 0.068, 0.11; tiny's
                      // attn_qk falls back to q8_0 / q5_0): the extra rounding moves the logits and can
                      // flip near-tie expert choices; the .tsr check above stays tight.
                      Case{"tiny", "q4_k_m", "all", "q6_K", 5e-2}, Case{"tiny", "q4_0", "all", "q4_K", 0.35},
                      Case{"tiny-lite", "q4_0", "all", "q6_K", 0.12}, Case{"tiny-lite", "q4_k_m", "all", "q4_K", 0.2}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string s = std::string(i.param.preset) + "_" + i.param.type + "_" + i.param.compose + "_" + i.param.composed_type;
      std::replace(s.begin(), s.end(), '-', '_');
      return s;
    });

// The decode step's two recordings (GpuModel::record_steps): up to short_max_kv positions the rows
// attention with its merge folded in, past it the 20-head kernel and the merge dispatch. Token by
// token over both ranges (and with the merge kept separate, and with both ranges' partials on the
// tensor-core kernel, in its plain-FMA form where the device has no cooperative matrices), the
// logits match the CPU reference.
TEST(GpuModel, ShortAndLongAttentionRecordingsMatchTheReference) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* preset : {"tiny", "tiny-lite"}) {
    const Files f = files(preset, "q8_0", "all");
    TsrFile tsr = TsrFile::open(f.tsr);
    TsrWeights packed(f.tsr);
    CpuModel cpu(packed, 64, 2, AttentionPath::Absorbed);
    std::vector<float> want;
    for (int variant : {0, 1, 2}) {
      const char* name = variant == 0 ? " merge folded" : variant == 1 ? " merge dispatch" : " tensor-core partials";
      model::GpuModelOptions o{.n_ctx = 64, .prefill_chunk = 0};  // every token through the decode step
      o.int8_activations = false;
      o.attention.short_max_kv = 5;
      o.attention.merge_tail = variant == 0;
      o.attention.decode_tc = variant == 2 ? 1 : 0;
      o.attention.single = false;  // no single or mid range: positions 1-5 short, 6-9 long
      if (variant == 2 && !vk::attention_tc_supported(context(), true)) continue;  // no tensor-core kernel here
      model::GpuModel gpu(context(), tsr, o);
      const auto toks = prompt(gpu.n_vocab(), 9);
      if (want.empty()) want = cpu.forward(toks, false);
      const Compare c = compare_logits(gpu.forward(toks, false), want, gpu.n_vocab());
      // The f16 query and weights P of the tensor-core kernel round more than the f32 kernels.
      EXPECT_LT(c.max_rel, variant == 2 ? 5e-3 : 2e-3) << preset << name;
      EXPECT_EQ(c.top1_same, c.rows) << preset << name;
      EXPECT_LE(gpu.stats().dispatches, 12 * gpu.config().n_layer + 4);
    }
  }
}

// W_vo reading the merge's int8 olat (GpuModelOptions::olat_q8, on by default), the LM head
// reading the output norm's int8 blocks (head_q8) and the dense down as the int8 matvec on the
// gate-up's int8 h (dense_down_matvec, on) instead of their other forms: the same int8 values, so
// the same logits up to the order of the sums. (The tiny models' rows are too short for the split
// over two subgroups that long rows get: the kernel and router-fold tests cover that.)
TEST(GpuModel, Int8InputsFromTheProducersGiveTheSameLogits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* preset : {"tiny", "tiny-lite"}) {
    const Files f = files(preset, "q4_0", "all");
    TsrFile tsr = TsrFile::open(f.tsr);
    std::vector<float> logits[8];
    for (int v = 0; v < 8; ++v) {
      model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
      o.olat_q8 = (v & 1) != 0;
      o.head_q8 = (v & 2) != 0;
      o.dense_down_matvec = (v & 4) != 0;
      model::GpuModel m(context(), tsr, o);
      if (!m.stats().int8_activations) GTEST_SKIP() << "no integer dot product on this device";
      logits[v] = m.forward(prompt(m.n_vocab(), 6), false);
    }
    for (int v = 1; v < 8; ++v) {
      ASSERT_EQ(logits[0].size(), logits[v].size());
      const Gap d = gap(logits[0], logits[v]);
      EXPECT_LE(d.worst, 1e-4f * d.scale) << preset << " olat_q8 " << (v & 1) << " head_q8 " << ((v >> 1) & 1)
                                      << " dense_down_matvec " << (v >> 2);
    }
  }
}

// The MoE down fused into the gate-up (GpuModelOptions::fused_down): the same logits as the down
// dispatch up to rounding (64-bit fixed-point sums of the down products instead of f32 sums per
// row), one dispatch and one barrier less per MoE layer; greedy tokens of the decode graph equal
// the unfused model's. Composed and factored files, GLM-like and V2-Lite-like, Q4_0; Q4_K_M's
// tiles mix types, so there the down keeps its dispatch and nothing changes.
TEST(GpuModel, FusedDownMatchesTheDownDispatch) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  struct K { const char *preset, *type, *compose; };
  for (const K& k : {K{"tiny", "q4_0", "all"}, K{"tiny-lite", "q4_0", "none"}, K{"tiny", "q4_k_m", "none"}}) {
    SCOPED_TRACE(cat(k.preset, " ", k.type, " ", k.compose));
    const Files f = files(k.preset, k.type, k.compose);
    TsrFile tsr = TsrFile::open(f.tsr);
    std::vector<float> logits[2];
    std::vector<int32_t> tokens[2];
    model::DecodeStats stats[2];
    for (bool fused : {false, true}) {
      model::GpuModelOptions o{.n_ctx = 48, .prefill_chunk = 0};
      o.fused_down = fused;
      o.early_down = false;  // the down dispatch behind its barrier: the fused kernel saves that barrier
      o.early_gateup = false;  // and the gate-up behind W_vo's (the fused kernel has no early start)
      model::GpuModel m(context(), tsr, o);
      if (!m.stats().int8_activations || !m.stats().fused_router) GTEST_SKIP() << "no int8 path or router fold here";
      stats[fused] = m.stats();
      logits[fused] = m.forward(prompt(m.n_vocab(), 6), true);
      for (int i = 0; i < 16; ++i) tokens[fused].push_back(m.decode_step());
    }
    const uint32_t moe_layers = stats[0].layers - 1;  // the tiny presets: one dense layer first
    if (std::string(k.type) == "q4_k_m") {  // its down matrices are Q6_K (gate-up Q4_K): the down keeps its dispatch
      EXPECT_EQ(stats[1].dispatches, stats[0].dispatches);
      EXPECT_EQ(logits[0], logits[1]);
      continue;
    }
    EXPECT_EQ(stats[1].dispatches + moe_layers, stats[0].dispatches);
    EXPECT_EQ(stats[1].barriers + moe_layers, stats[0].barriers);
    ASSERT_EQ(logits[0].size(), logits[1].size());
    const Gap d = gap(logits[0], logits[1]);
    EXPECT_LE(d.worst, 1e-3f * d.scale);
    EXPECT_EQ(tokens[0], tokens[1]);
  }
}

// The layers reading the per-token words from the step's device copy (GpuModelOptions::
// step_local, default) or from the host step buffer: the same kernels on the same values, so the
// same bits, for a prompt and for 12 decoded tokens whose positions only the GPU sampler advances
// (a stale copy would attend over the wrong context or write the wrong cache row). The short and
// the long attention ranges both.
TEST(GpuModel, StepWordsFromTheDeviceCopyGiveTheSameBits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Files f = files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  for (uint32_t short_max : {0u, 4u}) {
    SCOPED_TRACE(cat("short_max ", short_max));
    std::vector<float> logits[2];
    std::vector<int32_t> tokens[2];
    for (bool local : {false, true}) {
      model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
      o.step_local = local;
      o.attention.short_max_kv = short_max;
      model::GpuModel m(context(), tsr, o);
      logits[local] = m.forward(prompt(m.n_vocab(), 5), false);
      for (int i = 0; i < 12; ++i) tokens[local].push_back(m.decode_step());
    }
    EXPECT_EQ(logits[0], logits[1]);
    EXPECT_EQ(tokens[0], tokens[1]);
  }
}

// W_vo, the MoE down and stage 2 started early (GpuModelOptions::early_vo, early_down, early_qk,
// default; early_next): no barrier between the attention and W_vo (every range: the single and
// mid kernels or the merge open W_vo's gate), between the gate-up and the down, between q_a /
// kv_a and W_qk / kv_write, nor between the down and the next layer's q_a / kv_a (staged x, read
// after the down's gate), the same kernels' sums otherwise, so
// the same bits as with the barriers: a prompt and 12 decoded tokens across the single, mid and
// short ranges (bounds 3 and 9), the gate words reset every step.
TEST(GpuModel, EarlyStartsGiveTheSameBits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Files f = files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  std::vector<float> logits[4];
  std::vector<int32_t> tokens[4];
  uint32_t barriers[4] = {}, layers = 0;
  // Barriers; early starts; early starts that wait first (gate_late); early starts whose down
  // always waits on h (down_late off: lavapipe runs the down after the whole gate-up, so its
  // workgroups otherwise take the late path).
  for (int variant : {0, 1, 2, 3}) {
    const bool early = variant > 0;
    model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
    o.matvec.gate_late = variant == 2 ? 1u : 0u;
    o.moe.down_late = variant != 3;
    o.early_vo = early;
    o.early_down = early;
    o.early_next = early;  // off by default: tested here
    o.early_qk = early;
    o.early_gateup = early;
    o.gate_stats = early;  // the counters change nothing either
    o.attention.single_max_kv = 3;
    o.attention.mid_max_kv = 9;
    o.attention.mid_groups = 3;
    model::GpuModel m(context(), tsr, o);
    barriers[variant] = m.stats().barriers;
    layers = m.stats().layers;
    logits[variant] = m.forward(prompt(m.n_vocab(), 5), false);
    for (int i = 0; i < 12; ++i) tokens[variant].push_back(m.decode_step());
    // No wait gave up (a gate whose target its producer never reaches: the model would have
    // fallen back to barriers, with the same logits).
    EXPECT_EQ(m.early_starts(), early);
    // Every decode step's gated W_vo polled once per workgroup (prompt included: prefill_chunk 0).
    if (early && barriers[0] != barriers[1]) EXPECT_GT(m.gate_trace().workgroups, 0u);
    if (!early) EXPECT_EQ(m.gate_trace().workgroups, 0u);
  }
  if (barriers[0] == barriers[1]) GTEST_SKIP() << "no early start here (int8 kernels with subgroups)";
  // With no barrier after q_a / kv_a (early_qk), W_vo writes x into the other of the two x
  // buffers, its residual read from the one stage 1 read (MatvecOp::residual): the kernels after
  // it never meet x's old lines in an L1 (session 34's H200 race; llvmpipe runs one dispatch at a
  // time and cannot show it). Only early_qk makes these pipelines.
  bool residual_in = false;
  for (const vk::Pipeline* p : context().pipelines().all())
    residual_in = residual_in || (p->name().rfind("matvec.", 0) == 0 && p->name().find(".res") != std::string::npos);
  EXPECT_TRUE(residual_in);
  // One barrier less per layer (W_vo), per layer with a q LoRA (stage 2) that does not follow a
  // MoE layer (after one, its first matvecs wait on the down instead of a barrier, and stage 2
  // keeps its barrier: the down's layer read the x buffer this one's add would write), per layer
  // whose composed W_qk and kv_write open the attention's gate (early_attn, chained after stage
  // 2's gates; the recorded range's attention waits), two per MoE layer (the gate-up after W_vo,
  // the down) and one per MoE layer that has a next one.
  const ModelConfig cfg = ModelConfig::from_metadata(tsr.metadata());
  ASSERT_GT(cfg.q_lora_rank, 0u) << "tiny has a q LoRA: stage 2 is gated";
  uint32_t moe_layers = 0, moe_then_layer = 0;
  for (uint32_t l = 0; l < cfg.n_layer; ++l) {
    moe_layers += cfg.is_moe(l) ? 1 : 0;
    moe_then_layer += cfg.is_moe(l) && l + 1 < cfg.n_layer ? 1 : 0;
  }
  EXPECT_EQ(barriers[0] - barriers[1], (3 * layers - moe_then_layer) + 2 * moe_layers + moe_then_layer);
  EXPECT_EQ(barriers[2], barriers[1]);
  EXPECT_EQ(barriers[3], barriers[1]);
  for (int v : {1, 2, 3}) {
    EXPECT_EQ(logits[0], logits[v]) << "variant " << v;
    EXPECT_EQ(tokens[0], tokens[v]) << "variant " << v;
  }
}


// q_a handing W_qk its output as int8 blocks and sums of squares (GpuModelOptions::qk_q8): whole
// blocks are the same int8 blocks W_qk stages itself, only the sum of squares added in another
// order, so logits within rounding and the same greedy tokens; halves (qk_q8_halves, each 16 rows
// with their own scale) round cq otherwise, so they are held to the int8 path's bound against the
// f32 CPU reference (Int8ActivationsTrackTheReference). Gated on q_a (early_qk), the bits of the
// ungated hand-over.
TEST(GpuModel, QLoraHandsW_qkInt8Blocks) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* compose : {"all", "none"}) {  // W_qk, or q_b (factored)
    SCOPED_TRACE(compose);
    const Files f = files("tiny", "q4_0", compose);
    TsrFile tsr = TsrFile::open(f.tsr);
    constexpr int kVariants = 5;  // staged; whole blocks; the same gated; halves; the same gated
    std::vector<float> logits[kVariants], steps[kVariants];  // the prompt's; the decode steps' (concatenated)
    std::vector<int32_t> tokens[kVariants];
    int32_t first_in = 0;  // variant 0's first decode input
    for (int variant = 0; variant < kVariants; ++variant) {
      model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
      o.qk_q8 = variant > 0;
      o.qk_q8_halves = variant >= 3;
      o.early_qk = variant == 2 || variant == 4;
      model::GpuModel m(context(), tsr, o);
      logits[variant] = m.forward(prompt(m.n_vocab(), 5), false);
      // Every variant is fed variant 0's greedy tokens, so that a near-tie that one rounding
      // breaks the other way does not send the rest of the steps down another path.
      for (size_t i = 0; i < 10; ++i) {
        const int32_t first = variant == 0 ? m.sampled_token() : first_in;
        if (variant == 0 && i == 0) first_in = first;
        tokens[variant].push_back(m.decode_step(i == 0 ? first : tokens[0][i - 1]));
        const std::vector<float> l = m.last_logits();
        steps[variant].insert(steps[variant].end(), l.begin(), l.end());
      }
      EXPECT_EQ(m.early_starts(), true) << "no wait gave up";
    }
    bool handed = false, halves = false;  // the hand-over's producers were built (int8 kernels with subgroups)
    for (const vk::Pipeline* p : context().pipelines().all()) {
      handed = handed || p->name().find(".oq8.") != std::string::npos;
      halves = halves || p->name().find(".oq8h") != std::string::npos;
    }
    if (!handed) GTEST_SKIP() << "no int8 hand-over here (int8 kernels with subgroups)";
    EXPECT_TRUE(halves);
    const Gap d = gap(logits[0], logits[1]);
    EXPECT_LE(d.worst, 1e-3f * d.scale);
    // The decode steps: within 3 % (past the prompt a near-tie expert choice may flip with the
    // rounding: ~1 % on tiny's random weights; a wrong hand-over moves the logits by their own
    // scale), and the same greedy token wherever variant 0's best logit leads the next by more
    // than twice the step's gap.
    const size_t V = steps[0].size() / tokens[0].size();
    for (size_t i = 0; i < tokens[0].size(); ++i) {
      SCOPED_TRACE(i);
      const Gap ds = gap(steps[0], steps[1], i * V, (i + 1) * V);
      EXPECT_LE(ds.worst, 3e-2f * ds.scale);
      std::vector<float> row(steps[0].begin() + i * V, steps[0].begin() + (i + 1) * V);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
      if (row[0] - row[1] > 2 * ds.worst) EXPECT_EQ(tokens[0][i], tokens[1][i]);
    }
    EXPECT_EQ(logits[1], logits[2]);
    EXPECT_EQ(steps[1], steps[2]);
    EXPECT_EQ(tokens[1], tokens[2]);
    TsrWeights packed(f.tsr);
    CpuModel cpu(packed, 32, 2, AttentionPath::Absorbed);
    const Compare c = compare_logits(logits[3], cpu.forward(prompt(static_cast<uint32_t>(logits[3].size() / 5), 5), false),
                              logits[3].size() / 5);
    EXPECT_LT(c.max_rel, 0.35);
    EXPECT_GE(2 * c.top1_same, c.rows);
    EXPECT_EQ(logits[3], logits[4]);
    EXPECT_EQ(steps[3], steps[4]);
    EXPECT_EQ(tokens[3], tokens[4]);
  }
}

// A wait that gives up (here forced: W_vo's gate target one above what the attention counts) makes
// the model print a warning, re-record the step without early starts and run the step again:
// the logits and tokens of the model without early starts, bit for bit.
TEST(GpuModel, GateThatNeverOpensFallsBackToBarriers) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Files f = files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  std::vector<float> logits[2];
  std::vector<int32_t> tokens[2];
  for (bool fault : {false, true}) {
    model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
    o.early_vo = fault;  // the reference: no early starts at all
    o.early_down = fault;
    o.early_qk = fault;
    o.early_attn = fault;
    o.early_gateup = fault;
    o.fault_gate_never_opens = fault;
    model::GpuModel m(context(), tsr, o);
    if (fault && m.stats().barriers == 0) GTEST_SKIP();
    EXPECT_EQ(m.early_starts(), fault);
    logits[fault] = m.forward(prompt(m.n_vocab(), 4), false);
    for (int i = 0; i < 6; ++i) tokens[fault].push_back(m.decode_step());
    EXPECT_FALSE(m.early_starts()) << "the fallback turned the early starts off";
  }
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_EQ(tokens[0], tokens[1]);
}

// The decode step's attention ranges (single workgroup per head, the merging mid range, the
// split short range) give the logits of the split attention everywhere: 14 tokens through
// recordings whose ranges end at 3 and 9 positions, against the model without the first two
// ranges; the recordings switch as the context grows (and the mid range's counters are left at
// zero between tokens, or the next token's merge would be skipped).
TEST(GpuModel, AttentionRangesGiveTheSameLogits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Files f = files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  std::vector<float> logits[2];
  for (int ranges = 0; ranges < 2; ++ranges) {
    model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
    o.attention.single = ranges == 1;
    o.attention.single_max_kv = 3;
    o.attention.mid_max_kv = 9;
    o.attention.mid_groups = 3;
    model::GpuModel m(context(), tsr, o);
    logits[ranges] = m.forward(prompt(m.n_vocab(), 14), false);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  const size_t V = logits[0].size() / 14;
  for (size_t t = 0; t < 14; ++t) {
    const Gap d = gap(logits[0], logits[1], t * V, (t + 1) * V);
    EXPECT_LE(d.worst, 2e-3f * d.scale) << "position " << t;
  }
}

// Both router paths: the router fold (default where the device has 64-bit integer atomics) and
// the router's own dispatch.
class GreedyTokens : public ::testing::TestWithParam<bool> {};

TEST_P(GreedyTokens, EqualTheReference) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Files f = files("tiny", "q8_0", "none");
  TsrFile tsr = TsrFile::open(f.tsr);
  model::GpuModelOptions mo{.n_ctx = 64};
  mo.int8_activations = false;  // the f32 kernels (the int8 path rounds: see Int8Activations*)
  mo.fused_router = GetParam();
  model::GpuModel gpu(context(), tsr, mo);
  EXPECT_EQ(gpu.stats().fused_router, GetParam() && vk::router_fold_supported(context()));
  GgufWeights src(GgufFile::open(f.gguf));
  CpuModel cpu(src, 64, 2, AttentionPath::Absorbed);
  const auto p = prompt(gpu.n_vocab(), 4);
  gpu.forward(p, true);
  std::vector<float> lc = cpu.forward(p, true);
  std::vector<int32_t> tg, tc;
  int32_t t = gpu.sampled_token();
  for (int i = 0; i < 32; ++i) {
    tg.push_back(t);
    tc.push_back(int32_t(std::max_element(lc.begin(), lc.end()) - lc.begin()));
    if (i == 31) break;
    t = gpu.decode_step();
    const int32_t next[1] = {tc.back()};
    lc = cpu.forward(next, true);
  }
  EXPECT_EQ(tg, tc);
}

INSTANTIATE_TEST_SUITE_P(GpuModel, GreedyTokens, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "FusedRouter" : "RouterDispatch"; });

// Prompt logits (decode graph, token by token) of a model with the router fold and without it.
std::vector<float> decode_logits(vk::Context& ctx, const TsrFile& tsr, bool fused, bool int8, model::DecodeStats* stats) {
  model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
  o.fused_router = fused;
  o.int8_activations = int8;
  o.early_down = false;  // only with the fold: it would take one more barrier from the fused side
  o.early_gateup = false;  // the same (it needs the fold too)
  model::GpuModel m(ctx, tsr, o);
  if (stats) *stats = m.stats();
  return m.forward(prompt(m.n_vocab(), 6), false);
}

// The router fold computes the same logits as the router dispatch up to rounding (fixed-point sums
// of the partial logits and of x^2 instead of f32 reductions), with one dispatch and one barrier
// less per MoE layer; composed (GLM-like) and factored (V2-Lite-like) files, f32 and int8 kernels.
TEST(GpuModel, FusedRouterMatchesTheSeparateRouter) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  if (!vk::router_fold_supported(context())) GTEST_SKIP() << "no 64-bit integer buffer atomics";
  struct M {
    const char *preset, *type, *compose;
  };
  for (const M& m : {M{"tiny", "q4_0", "all"}, M{"tiny-lite", "q8_0", "none"}, M{"tiny", "f16", "qk"}}) {
    for (bool int8 : {false, true}) {
      const Files f = files(m.preset, m.type, m.compose);
      TsrFile tsr = TsrFile::open(f.tsr);
      model::DecodeStats fs, ps;
      const std::vector<float> a = decode_logits(context(), tsr, true, int8, &fs);
      const std::vector<float> b = decode_logits(context(), tsr, false, int8, &ps);
      ASSERT_EQ(a.size(), b.size());
      const ModelConfig cfg = ModelConfig::from_metadata(tsr.metadata());
      uint32_t moe_layers = 0;
      for (uint32_t l = 0; l < cfg.n_layer; ++l) moe_layers += cfg.is_moe(l) ? 1 : 0;
      ASSERT_GT(moe_layers, 0u);
      EXPECT_TRUE(fs.fused_router);
      EXPECT_FALSE(ps.fused_router);
      // Where the router dispatch made a factored q-LoRA file drop the short attention variant
      // (budget), the fold keeps it: one more (indirect) dispatch per layer there.
      const uint32_t kept_variant = fs.dispatches + moe_layers > ps.dispatches ? cfg.n_layer : 0;
      EXPECT_EQ(fs.dispatches + moe_layers, ps.dispatches + kept_variant) << m.preset << " " << m.type;
      EXPECT_EQ(fs.barriers + moe_layers, ps.barriers) << m.preset << " " << m.type;
      EXPECT_LE(fs.dispatches, 12 * cfg.n_layer + 4);
      const size_t V = cfg.n_vocab;
      const Gap d = gap(b, a);
      size_t top1 = 0;
      for (size_t r = 0; r < a.size() / V; ++r)
        top1 += std::max_element(a.begin() + r * V, a.begin() + (r + 1) * V) - a.begin() ==
                std::max_element(b.begin() + r * V, b.begin() + (r + 1) * V) - b.begin();
      std::printf("%s %s %s %s: fused vs router dispatch max |diff| %.3g of max |logit| %.3g, top-1 %zu / %zu\n",
                  m.preset, m.type, m.compose, int8 ? "int8" : "f32", d.worst, d.scale, top1, a.size() / V);
      EXPECT_LE(d.worst, 1e-3f * d.scale) << m.preset << " " << m.type << (int8 ? " int8" : " f32");
      EXPECT_EQ(top1, a.size() / V);
    }
  }
}

// Without 64-bit integer buffer atomics the model records the router dispatch (fused_router is
// ignored): the same recording, the same logits as fused_router = false.
TEST(GpuModel, FusedRouterFallsBackWithoutInt64Atomics) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  vk::Context plain_ctx({.no_int64_atomics = true});
  EXPECT_FALSE(vk::router_fold_supported(plain_ctx));
  const Files f = files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  model::DecodeStats fs, ps;
  const std::vector<float> a = decode_logits(plain_ctx, tsr, true, true, &fs);
  const std::vector<float> b = decode_logits(context(), tsr, false, true, &ps);
  EXPECT_FALSE(fs.fused_router);
  EXPECT_EQ(fs.dispatches, ps.dispatches);
  EXPECT_EQ(fs.barriers, ps.barriers);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "logit " << i;
}

// The barrier scopes (vk::BarrierScope) change what the driver is told to order, not what runs:
// the decode step and the batched prefill give the same logits, bit for bit, with each; the
// counts stay the same. (lavapipe honours every scope alike; the GPU measurement is the check
// that the narrow one is enough: PERFORMANCE.md.)
TEST(GpuModel, BarrierScopesGiveTheSameLogits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* preset : {"tiny", "tiny-lite"}) {
    const Files f = files(preset, "q4_0", "all");
    TsrFile tsr = TsrFile::open(f.tsr);
    for (uint32_t chunk : {0u, 4u}) {  // token by token through the decode step; prefill chunks of 4
      std::vector<float> base;
      uint32_t dispatches = 0;
      for (vk::BarrierScope scope : {vk::BarrierScope::Full, vk::BarrierScope::Compute, vk::BarrierScope::ComputeOnly}) {
        model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = chunk};
        o.barrier_scope = scope;
        model::GpuModel m(context(), tsr, o);
        const std::vector<float> logits = m.forward(prompt(m.n_vocab(), 6), false);
        if (base.empty()) {
          base = logits;
          dispatches = m.stats().dispatches;
          continue;
        }
        EXPECT_EQ(m.stats().dispatches, dispatches) << preset;
        ASSERT_EQ(logits.size(), base.size());
        for (size_t i = 0; i < logits.size(); ++i)
          ASSERT_EQ(logits[i], base[i]) << preset << " chunk " << chunk << " logit " << i;
      }
    }
  }
}

// The int8-activation path end to end (every Q4_0 / Q8_0 / Q4_K / Q6_K matvec and expert kernel
// takes int8 inputs, the q4_k_m files' Q6_K LM head included; its kernels are checked exactly
// against the same rounding in tests/vulkan): the logits stay close to the f32 reference and pick
// the same top token in most positions. The bound is loose because the tiny random models amplify
// a rounding through 2-3 layers; a real model's error is what `tessera verify`-style comparisons
// on the GPU machine report.
TEST(GpuModel, Int8ActivationsTrackTheReference) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* type : {"q4_0", "q8_0", "q4_k_m"}) {
    for (const char* preset : {"tiny", "tiny-lite"}) {
      const Files f = files(preset, type, "none");
      TsrFile tsr = TsrFile::open(f.tsr);
      model::GpuModel gpu(context(), tsr, {.n_ctx = 64});
      if (!gpu.stats().int8_activations) GTEST_SKIP() << "no integer dot product on this device";
      const auto p = prompt(gpu.n_vocab(), 9);
      const auto lg = gpu.forward(p, false);
      TsrWeights packed(f.tsr);
      CpuModel cpu(packed, 64, 2, AttentionPath::Absorbed);
      const Compare c = compare_logits(lg, cpu.forward(p, false), gpu.n_vocab());
      std::printf("%s %s int8 activations vs CPU f32: max rel %.4f, top-1 %zu / %zu\n", preset, type, c.max_rel,
                  c.top1_same, c.rows);
      EXPECT_LT(c.max_rel, 0.35) << preset << " " << type;
      EXPECT_GE(2 * c.top1_same, c.rows) << preset << " " << type;
    }
  }
}

// The decode kernels' work splits (bench --tune) move rows between workgroups, never the order of
// a row's dot product; only the fused norms' sums of squares are reduced over a workgroup of
// another size. So the logits agree to f32 rounding. Awkward splits: 3 rows per subgroup, 6
// teams, 3 down rows per workgroup, 12 gate-up subgroups.
TEST(GpuModel, TunedWorkSplitsGiveTheSameLogits) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* type : {"q4_0", "q4_k_m"}) {
    const Files f = files("tiny", type, "all");
    TsrFile tsr = TsrFile::open(f.tsr);
    // Without q_a's int8 hand-over (qk_q8), which needs q_a's default split: the splits alone.
    model::GpuModelOptions base{.n_ctx = 32, .prefill_chunk = 0};
    base.qk_q8 = 0;
    model::GpuModel plain(context(), tsr, base);
    if (!plain.stats().int8_activations) GTEST_SKIP() << "no integer dot product on this device";
    model::GpuModelOptions o = base;
    o.matvec = {.teams = 6, .rows = 3, .blocks_per_iter = 4};
    o.moe.q8_gateup_teams = 12;
    o.moe.q8_down_rows = 3;
    o.moe.q8_fold_overlap = 2;  // off (the default reads input, sums and bias in one phase)
    model::GpuModel tuned(context(), tsr, o);
    const auto p = prompt(plain.n_vocab(), 5);
    const std::vector<float> a = tuned.forward(p, false), b = plain.forward(p, false);
    ASSERT_EQ(a.size(), b.size());
    const auto [worst, scale] = gap(b, a);  // scale: the default's logits
    std::printf("%s: tuned vs default max |diff| %.3g of max |logit| %.3g\n", type, worst, scale);
    EXPECT_LE(worst, 1e-4f * scale) << type;

    // The gate-up with every weight load of a pass first, 3 outputs a pass (10 subgroups): through
    // the decode step's router fold, its gates and its early-started down.
    model::GpuModelOptions go = base;
    go.moe.q8_gateup_outs = 3;
    model::GpuModel outs3(context(), tsr, go);
    const std::vector<float> c3 = outs3.forward(p, false);
    ASSERT_EQ(c3.size(), b.size());
    EXPECT_LE(gap(c3, b).worst, 1e-4f * scale) << type << " gate-up outputs 3";

    // The batched prefill's matvecs (prefill_chunk 8: one dispatch of 8 columns per matrix).
    model::GpuModelOptions po{.n_ctx = 32, .prefill_chunk = 8};
    model::GpuModel pplain(context(), tsr, po);
    po.matvec = {.batch_teams = 5, .batch_rows = 3};
    model::GpuModel ptuned(context(), tsr, po);
    const std::vector<float> pa = ptuned.forward(p, false), pb = pplain.forward(p, false);
    ASSERT_EQ(pa.size(), pb.size());
    EXPECT_LE(gap(pa, pb).worst, 1e-4f * scale) << type << " prefill";
  }
}

// The L2 prefetch only reads weights: the logits are the same bits with and without it, and each
// layer records one prefetch dispatch beside its attention (plus one beside q_a with a q LoRA, and
// one beside the MoE for the next layer's norm).
TEST(GpuModel, PrefetchChangesNoLogit) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  for (const char* preset : {"tiny", "tiny-lite"}) {
    const Files f = files(preset, "q4_0", std::string(preset) == "tiny" ? "all" : "none");
    TsrFile tsr = TsrFile::open(f.tsr);
    model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
    o.attention.short_variant = false;  // the dispatch budget would drop it on one side only
    model::GpuModel plain(context(), tsr, o);
    o.prefetch = model::kPrefetchAll;
    model::GpuModel fetched(context(), tsr, o);
    const auto p = prompt(plain.n_vocab(), 5);
    const std::vector<float> a = fetched.forward(p, false), b = plain.forward(p, false);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << preset << " logit " << i;
    const auto& cfg = plain.config();
    const uint32_t per_layer = 1 + (cfg.q_lora_rank ? 1 : 0);
    uint32_t next_norm = 0;  // MoE layers with a layer after them
    for (uint32_t l = 0; l + 1 < cfg.n_layer; ++l) next_norm += cfg.is_moe(l) ? 1 : 0;
    EXPECT_EQ(fetched.stats().dispatches, plain.stats().dispatches + per_layer * cfg.n_layer + next_norm) << preset;
    EXPECT_EQ(fetched.stats().barriers, plain.stats().barriers) << preset;
  }
}

// With per-range recordings (GpuModel::record_steps) the short-context attention variant adds no
// dispatch to any recording: the short range's recording has at most the long one's dispatches.
// So where a recording breaks the dispatch budget (here: the L2 prefetch and the router dispatch
// on a factored q-LoRA file), dropping the short variant would not bring it back within the budget;
// the variant stays (its partial kernel runs at short contexts).
TEST(GpuModel, BudgetKeepsTheShortVariantWhereDroppingItSavesNothing) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  if (!context().device().has_timestamps()) GTEST_SKIP() << "no timestamp queries";
  const Files f = files("tiny", "q4_0", "none");
  TsrFile tsr = TsrFile::open(f.tsr);
  model::GpuModelOptions o{.n_ctx = 32, .prefill_chunk = 0};
  o.fused_router = false;
  o.prefetch = model::kPrefetchAll;
  o.attention.single = false;  // position 0 in the short range
  model::GpuModel m(context(), tsr, o);
  ASSERT_GT(m.stats().dispatches, 12 * m.config().n_layer + 4) << "the case must break the budget";
  const std::vector<vk::DispatchTiming> t = m.profile_step(1);
  const bool short_kernel = std::any_of(t.begin(), t.end(), [](const vk::DispatchTiming& d) {
    return d.label.find("attention blk.0. partial short") != std::string::npos;
  });
  EXPECT_TRUE(short_kernel) << "the short attention variant was dropped";
  // The same model without the short variant records as many dispatches: nothing was saved.
  o.attention.short_variant = false;
  model::GpuModel without(context(), tsr, o);
  EXPECT_EQ(without.stats().dispatches, m.stats().dispatches);
}

TEST(GpuModel, DecodeOfTokenNEqualsPromptOfNTokens) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Files f = files("tiny-lite", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  // The decode graph alone (prefill_chunk 0): the prompt runs token by token too. The batched
  // prefill graph against decode: test_gpu_prefill.cpp.
  model::GpuModel a(context(), tsr, {.n_ctx = 32, .prefill_chunk = 0});
  const auto p = prompt(a.n_vocab(), 6);
  const auto whole = a.forward(p, false);
  a.reset();
  std::vector<float> last;
  for (int32_t tok : p) last = a.forward(std::span<const int32_t>(&tok, 1), true);
  const size_t V = a.n_vocab();
  const std::vector<float> ref(whole.end() - V, whole.end());
  EXPECT_EQ(last, ref);  // the same recording, the same inputs: bit-identical
}

TEST(GpuModel, ContextFullIsAUsageError) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Files f = files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  model::GpuModel m(context(), tsr, {.n_ctx = 4});
  const auto p = prompt(m.n_vocab(), 5);
  try {
    m.forward(p, true);
    FAIL() << "expected a context-full error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("context full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.n_past(), 0);  // nothing was processed
}

TEST(GpuModel, TooLittleMemoryIsRefusedBeforeAllocating) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const Files f = files("tiny", "q4_0", "all");
  TsrFile tsr = TsrFile::open(f.tsr);
  try {
    model::GpuModel m(context(), tsr, {.n_ctx = 64, .memory_limit = 1 << 20});
    FAIL() << "expected the memory plan to refuse";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_NE(std::string(e.what()).find("memory plan"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
