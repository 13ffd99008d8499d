// Prefill kernels (kernels_prefill.h, docs/PREFILL.md) against the CPU: routing + per-expert
// lists of a chunk, the expert-major gate-up / down and the sum into the residual (whole MoE
// block, several tile types, expert ranges split over bindings, the shared-memory path), the
// dense FFN, the last-row gather; and the multi-query attention / kv_write (QueryBatch) against
// the decode kernels run once per token. Outputs are NaN-poisoned before each run; live token
// counts below the chunk size check that padding tokens are left alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "format/fp16.h"
#include "runtime/cpu/ops.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "tests/vulkan/test_moe_util.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using moetest::HostTile;
using vktest::Gpu;

constexpr uint32_t kCountWord = 1;  // step words: [first position, live tokens]

using vktest::step_buffer;

std::vector<uint32_t> download_words(Gpu& g, const vk::Buffer& b, size_t n) {
  std::vector<uint32_t> v(n);
  g.transfer->download(b, 0, v.data(), n * 4);
  return v;
}

struct MoeCase {
  moetest::TileTypes types;
  uint32_t n_expert, w_routed, w_shared, n_embd, K, T, n;
  uint64_t max_binding_experts;  // 0: one binding; else expert ranges of this many slots
  bool sigmoid_bias;
  bool q8 = false;  // the int8-activation path where the type allows (Q4_0 / Q8_0 / Q4_K / Q6_K)
  bool matmul = false;  // the matmul form (moe_matmul.comp): f16 inputs and weights, f32 sums
  vk::FfnMatmulTuning matmul_tuning = {};  // its work split (0s: automatic)
  bool h2_f16 = false;  // the gate-up's matmul form reads an f16 copy of h2 (MoePrefillOp::h2_f16)
  vk::FfnInt8Tuning int8_tuning = {};  // the int8 path's work split (0s: automatic)
  bool h2_q8 = false;  // h2 written by an RmsNormOp with its int8 blocks, which the int8 gate-ups read
};

// v rounded to f16 (the matmul form stages inputs and weights as f16).
double f16_round(double v) { return fp16_to_f32(f32_to_fp16(float(v))); }
// The matmul form's down input: h times 2^-8 rounded to f16, times 2^8 (moe_matmul.comp).
std::vector<double> f16_round_down_input(const std::vector<double>& h) {
  std::vector<double> r(h.size());
  for (size_t i = 0; i < h.size(); ++i) r[i] = f16_round(float(h[i] / 256.0)) * 256.0;
  return r;
}
std::vector<double> f16_round(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = f16_round(v[i]);
  return r;
}
std::vector<float> f16_round(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = float(f16_round(v[i]));
  return r;
}

bool q8_type(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q6_K;
}

// A MoE block of a chunk: route | gate-up | down | sum, against cpu::route_token and double loops.
void run_moe_case(Gpu& g, const MoeCase& c, uint32_t seed) {
  SCOPED_TRACE(cat("moe prefill ", type_name(c.types.gateup), "/", type_name(c.types.down), " E", c.n_expert, " K", c.K,
                   " T", c.T, " n", c.n, " ranges ", c.max_binding_experts, c.q8 ? cat(" q8act lanes ", c.int8_tuning.lanes, " rows ", c.int8_tuning.rows, c.h2_q8 ? " int8 input" : "") : "", c.matmul ? cat(" matmul rows ", c.matmul_tuning.row_tiles, " step ", c.matmul_tuning.step, " groups ", c.matmul_tuning.groups, " split ", c.matmul_tuning.split_rows, " loop ", c.matmul_tuning.loop, " prefetch ", c.matmul_tuning.prefetch, c.h2_f16 ? " f16 input" : "") : ""));
  std::mt19937 rng(seed);
  const HostTile ht = moetest::build_tile(rng, c.n_expert, c.w_routed, c.w_shared, c.n_embd, c.types);
  vk::Buffer tile = vktest::make_buffer(g, ht.bytes.size(), "tile");
  vktest::upload_bytes(g, tile, ht.bytes.data(), ht.bytes.size());
  const uint32_t E = c.n_expert, K = c.K, T = c.T, D = c.n_embd;
  const std::vector<float> logits = vktest::random_values(rng, size_t(T) * E, 2.f);
  std::vector<float> h2 = vktest::random_values(rng, size_t(T) * D);
  const std::vector<float> x0 = vktest::random_values(rng, size_t(T) * D);
  std::vector<float> bias = vktest::random_values(rng, E, 0.1f);
  const ModelConfig cfg = moetest::prefill_routing(E, K, c.sigmoid_bias);

  vk::Buffer lb = vktest::make_buffer(g, logits.size() * 4, "logits"), bb = vktest::make_buffer(g, E * 4, "bias");
  vk::Buffer hb2 = vktest::make_buffer(g, h2.size() * 4, "h2"), xb = vktest::make_buffer(g, x0.size() * 4, "x");
  vk::Buffer rb = vktest::make_buffer(g, vk::prefill_route_bytes(T, K), "route");
  vk::Buffer listb = vktest::make_buffer(g, vk::prefill_list_bytes(T, E), "lists");
  const uint64_t pairs = vk::prefill_pairs(T, K);
  vk::Buffer hb = vktest::make_buffer(g, pairs * vk::moe_h_stride(ht.g) * 4, "h");
  vk::Buffer yb = vktest::make_buffer(g, pairs * D * 4, "y");
  vk::Buffer step = step_buffer(g, 0, c.n);
  vktest::upload_bytes(g, lb, logits.data(), logits.size() * 4);
  vktest::upload_bytes(g, bb, bias.data(), E * 4);
  vktest::upload_bytes(g, hb2, h2.data(), h2.size() * 4);
  // h2_q8: h2 becomes RMSNorm(h2; random weight), with its int8 blocks (MoePrefillOp::h2_q8).
  vk::Buffer hq8 = vktest::make_buffer(g, std::max<size_t>(size_t(T) * D / 32 * 48, 16), "h2 int8 blocks");
  if (c.h2_q8) {
    vktest::poison(g, hq8);
    vk::Buffer raw = vktest::make_buffer(g, h2.size() * 4, "x before the norm");
    vktest::upload_bytes(g, raw, h2.data(), h2.size() * 4);
    const std::vector<float> nw = vktest::random_values(rng, D);
    vk::Buffer nwb = vktest::make_buffer(g, D * 4, "norm weight");
    vktest::upload_bytes(g, nwb, nw.data(), D * 4);
    vk::RmsNormOp norm;
    norm.x = raw.whole();
    norm.y = hb2.whole();
    norm.weight = nwb.whole();
    norm.y_q8 = hq8.whole();
    norm.n = D;
    norm.rows = T;
    vk::CommandRecorder nrec(*g.ctx);
    nrec.begin();
    norm.record(nrec);
    nrec.end();
    nrec.run();
    h2 = vktest::download_floats(g, hb2, h2.size());
  }
  // The values the int8 gate-ups read (a GPU's division may put an element one step from the
  // CPU's rounding of the same f32 value).
  const std::vector<double> h2_blocks =
      c.h2_q8 ? vktest::q8_values(download_words(g, hq8, size_t(T) * D / 32 * 12)) : std::vector<double>{};
  // The f16 copy (rows padded to 16 as the prefill's x16; the padding poisoned).
  vk::Buffer hb16 = vktest::make_buffer(g, (T + 15) / 16 * 16 * size_t(D) * 2, "h2 f16");
  vktest::poison(g, hb16);
  if (c.h2_f16) {
    std::vector<uint16_t> h16(h2.size());
    for (size_t i = 0; i < h2.size(); ++i) h16[i] = f32_to_fp16(h2[i]);
    vktest::upload_bytes(g, hb16, h16.data(), h16.size() * 2);
  }
  vktest::upload_bytes(g, xb, x0.data(), x0.size() * 4);
  vktest::poison(g, rb);
  vktest::poison(g, listb);
  vktest::poison(g, hb);
  vktest::poison(g, yb);

  const vk::PrefillRouteOp route = moetest::prefill_route_op(cfg, T, lb, c.sigmoid_bias ? &bb : nullptr, step, rb, listb);
  vk::MoePrefillOp moe;
  moe.tile = {&tile, 0, ht.g};
  moe.n_used = K;
  moe.t_max = T;
  moe.step = step.whole();
  moe.count_word = kCountWord;
  moe.h2 = hb2.whole();
  if (c.h2_f16) moe.h2_f16 = hb16.whole();
  if (c.h2_q8) moe.h2_q8 = hq8.whole();
  moe.route = rb.whole();
  moe.lists = listb.whole();
  moe.h = hb.whole();
  moe.y = yb.whole();
  moe.max_binding_bytes = c.max_binding_experts * ht.g.slot_stride;
  moe.form.int8_activations = c.q8;
  moe.form.matmul = c.matmul;
  moe.form.matmul_tuning = c.matmul_tuning;
  moe.form.int8_tuning = c.int8_tuning;
  vk::PrefillSumOp sum;
  sum.n_embd = D;
  sum.n_used = K;
  sum.t_max = T;
  sum.has_shared = ht.g.has_shared();
  sum.x = xb.whole();
  sum.y = yb.whole();
  sum.step = step.whole();
  sum.count_word = kCountWord;
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  route.record(rec);
  rec.barrier();
  moe.record_gateup(rec);
  rec.barrier();
  moe.record_down(rec);
  rec.barrier();
  sum.record(rec);
  rec.end();
  if (c.max_binding_experts) {
    EXPECT_GT(rec.dispatch_count(), 6u) << "expert ranges: several dispatches";
  }
  rec.run();

  // Routing and lists.
  const std::vector<uint32_t> rw = download_words(g, rb, 2ull * T * K);
  const std::vector<uint32_t> lw = download_words(g, listb, size_t(E) * (T + 1));
  std::vector<cpu::Route> routes;
  for (uint32_t t = 0; t < c.n; ++t) {
    routes.push_back(cpu::route_token(cfg, std::span<const float>(logits.data() + size_t(t) * E, E),
                                      c.sigmoid_bias ? std::span<const float>(bias) : std::span<const float>()));
    for (uint32_t k = 0; k < K; ++k) {
      EXPECT_EQ(rw[2 * (t * K + k)], routes[t].experts[k]) << "token " << t << " slot " << k;
      float w;
      std::memcpy(&w, &rw[2 * (t * K + k) + 1], 4);
      EXPECT_NEAR(w, routes[t].weights[k], 2e-6 * std::fabs(routes[t].weights[k]) + 1e-7);
    }
  }
  for (uint32_t e = 0; e < E; ++e) {
    std::vector<uint32_t> want;
    for (uint32_t p = 0; p < c.n * K; ++p)
      if (routes[p / K].experts[p % K] == e) want.push_back(p);
    ASSERT_EQ(lw[e], want.size()) << "expert " << e;
    for (size_t j = 0; j < want.size(); ++j) EXPECT_EQ(lw[E + e * T + j], want[j]) << "expert " << e << " entry " << j;
  }

  // x[t] += sum_k w_k down_k(h_k) + shared, per live token; padding tokens unchanged. Each pair's h
  // (the gate-up's output) against the reference first; the down's reference then reads the GPU's
  // h, so that an element the two round (to int8, to f16) one step apart does not count twice.
  const std::vector<float> got = vktest::download_floats(g, xb, x0.size());
  const uint32_t hs = vk::moe_h_stride(ht.g);
  const std::vector<float> gpu_h = vktest::download_floats(g, hb, pairs * hs);
  std::vector<double> want(x0.begin(), x0.end()), tol(x0.size(), 0.0);
  for (uint32_t t = 0; t < c.n; ++t) {
    const std::vector<double> in(h2.begin() + size_t(t) * D, h2.begin() + size_t(t + 1) * D);
    std::vector<double> y(D, 0.0), abs(D, 0.0);
    auto slot_add = [&](uint32_t slot, double weight, uint64_t pair) {
      std::vector<double> h, htol;
      const uint32_t w = uint32_t(ht.g.width(slot));
      // The int8 path rounds the inputs of the kernels whose type it serves (q8_activations.glsl).
      const bool shared = slot == E;
      const bool q8_gu = !c.matmul && c.q8 && q8_type(shared ? c.types.shared_gateup : c.types.gateup);
      const bool q8_down = !c.matmul && c.q8 && q8_type(shared ? c.types.shared_down : c.types.down);
      // The matmul form: inputs and weights rounded to f16 (its parts whose rows are a multiple of 32).
      const bool mm_gu = c.matmul && D % 32 == 0, mm_down = c.matmul && w % 32 == 0;
      auto row_of = [&](MoePart part, uint32_t i, bool f16) {
        const std::vector<float> r = ht.row(slot, part, i);
        return f16 ? f16_round(r) : r;
      };
      const std::vector<double> in_gu = q8_gu && c.h2_q8 ? std::vector<double>(h2_blocks.begin() + size_t(t) * D, h2_blocks.begin() + size_t(t + 1) * D)
                                        : q8_gu ? vktest::q8_round(in)
                                        : mm_gu ? f16_round(in)
                                                : in;
      moetest::ref_gateup([&](uint32_t i) { return row_of(MoePart::Gate, i, mm_gu); },
                          [&](uint32_t i) { return row_of(MoePart::Up, i, mm_gu); }, w, in_gu, h, htol, q8_gu ? 1e-4 : 2e-5);
      const std::vector<float> hg(gpu_h.begin() + pair * hs, gpu_h.begin() + pair * hs + w);
      vktest::expect_close(hg, h, htol, cat("h of token ", t, " slot ", slot));
      std::vector<double> hf(hg.begin(), hg.end());
      if (q8_down) hf = vktest::q8_round(hf);
      if (mm_down) hf = f16_round_down_input(hf);
      moetest::ref_down_add([&](uint32_t r) { return row_of(MoePart::Down, r, mm_down); }, D, weight, hf.data(), y, abs);
      double hmax = 0;
      for (double v : htol) hmax = std::max(hmax, v);
      for (uint32_t r = 0; r < D; ++r) abs[r] += 4 * hmax * w;  // h's own error through the down row
    };
    for (uint32_t k = 0; k < K; ++k) slot_add(routes[t].experts[k], routes[t].weights[k], uint64_t(t) * K + k);
    if (ht.g.has_shared()) slot_add(E, 1.0, uint64_t(T) * K + t);
    for (uint32_t r = 0; r < D; ++r) {
      want[size_t(t) * D + r] += y[r];
      // The matmul form rounds h to f16 for the down: where the GPU's h and the reference's
      // round to neighbouring f16 values, one ulp (2^-11 relative) of h reaches the output.
      tol[size_t(t) * D + r] = moetest::sum_tol(abs[r] + std::fabs(x0[size_t(t) * D + r]), want[size_t(t) * D + r],
                                                c.matmul ? 1e-3 : c.q8 ? 1e-4 : 2e-5);
    }
  }
  vktest::expect_close(got, want, tol, "x after the MoE block");
}

TEST(PrefillMoe, BlockMatchesTheReference) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  using T = GgmlType;
  // Awkward sizes: 9 experts, widths not multiples of the team count, T not a power of two,
  // fewer live tokens than T.
  run_moe_case(g, {{T::Q4_0, T::Q4_0, T::Q4_0, T::Q4_0}, 9, 96, 64, 128, 3, 7, 5, 0, false}, 1);
  run_moe_case(g, {{T::Q8_0, T::Q5_1, T::Q8_0, T::Q4_1}, 9, 64, 96, 96, 2, 6, 6, 4, true}, 2);
  run_moe_case(g, {{T::Q4_K, T::Q6_K, T::Q5_K, T::Q6_K}, 6, 256, 256, 256, 4, 5, 3, 0, true}, 3);
  run_moe_case(g, {{T::F16, T::BF16, T::F32, T::F16}, 5, 36, 0, 40, 2, 4, 4, 2, false}, 4);
  // More pairs (390 x 3) than the route kernel stages at once (1024).
  run_moe_case(g, {{T::Q4_0, T::Q8_0, T::Q4_0, T::Q4_0}, 5, 32, 32, 32, 3, 400, 390, 0, true}, 6);
}

// The int8-activation path (Q4_0 / Q8_0 / Q4_K / Q6_K dispatches; others keep f32 in the same
// block): passes of 4 pairs, experts with more pairs than a pass, fewer live tokens than T, expert
// ranges, the shared-memory path.
TEST(PrefillMoe, Int8ActivationPath) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_usable(*g.ctx, GgmlType::Q4_0, 64)) GTEST_SKIP() << "no integer dot product";
  using T = GgmlType;
  run_moe_case(g, {{T::Q4_0, T::Q4_0, T::Q4_0, T::Q4_0}, 9, 96, 64, 128, 3, 23, 21, 0, true, true}, 11);
  run_moe_case(g, {{T::Q8_0, T::Q5_1, T::Q8_0, T::Q4_0}, 9, 64, 96, 96, 2, 6, 6, 4, false, true}, 12);
  run_moe_case(g, {{T::Q4_0, T::Q8_0, T::Q4_0, T::Q8_0}, 4, 2048 / 32 * 32, 64, 256, 2, 17, 17, 0, true, true}, 13);
  run_moe_case(g, {{T::Q4_K, T::Q4_K, T::Q4_K, T::Q6_K}, 5, 256, 256, 512, 2, 11, 10, 0, true, true}, 15);
  // Q6_K: the Q4_K_M mix (Q6_K downs), Q6_K gate-ups next to a 32-element down and an f32-path down
  // (Q5_K), expert ranges.
  run_moe_case(g, {{T::Q4_K, T::Q6_K, T::Q4_K, T::Q6_K}, 7, 256, 512, 256, 3, 13, 11, 0, true, true}, 16);
  run_moe_case(g, {{T::Q6_K, T::Q8_0, T::Q6_K, T::Q5_K}, 6, 96, 256, 512, 2, 10, 9, 0, false, true}, 17);
  run_moe_case(g, {{T::Q6_K, T::Q6_K, T::Q4_0, T::Q6_K}, 8, 256, 256, 256, 2, 9, 7, 3, true, true}, 18);
  Gpu& gs = vktest::gpu(true);
  run_moe_case(gs, {{T::Q4_0, T::Q8_0, T::Q4_0, T::Q8_0}, 7, 64, 32, 64, 3, 9, 8, 3, true, true}, 14);
  run_moe_case(gs, {{T::Q4_K, T::Q6_K, T::Q4_K, T::Q6_K}, 5, 256, 256, 256, 2, 9, 8, 2, true, true}, 19);
}

// The int8 path's work split (FfnInt8Tuning): 8, 16 and 32 lanes per row (the team sums by
// shuffles where the subgroup holds whole teams, else through shared memory), 32, 64 and 128 rows
// per workgroup in either kind of dispatch (several rows per team; a last tile past the rows),
// passes of 1, 2 and 8 pairs (the default: 4), two output rows per team at once, the block loops
// unrolled and not, the gate-ups' inputs as int8 blocks from the RMSNorm, on both team-sum paths; row lengths of 3, 5 and 12
// blocks (lanes without a block, blocks past the lanes).
TEST(PrefillMoe, Int8WorkSplits) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_usable(*g.ctx, GgmlType::Q4_0, 64)) GTEST_SKIP() << "no integer dot product";
  using T = GgmlType;
  using S = vk::FfnInt8Tuning;
  const MoeCase base{{T::Q4_0, T::Q4_0, T::Q4_0, T::Q8_0}, 6, 160, 96, 384, 3, 21, 19, 0, true, true};
  uint32_t seed = 41;
  for (const S& t : {S{.lanes = 16, .rows = 64, .rows_all = 128, .pairs = 2}, S{.lanes = 32, .rows = 128, .rows_all = 32, .pairs = 8, .outs = 2, .unroll = 1},
                     S{.lanes = 8, .rows = 32, .outs = 2, .unroll = 2}}) {
    MoeCase c = base;
    c.int8_tuning = t;
    run_moe_case(g, c, seed++);
  }
  MoeCase c{{T::Q4_K, T::Q6_K, T::Q4_0, T::Q8_0}, 5, 256, 160, 256, 2, 13, 12, 0, false, true};
  c.int8_tuning = {.lanes = 16, .pairs = 1, .unroll = 1};
  run_moe_case(g, c, seed++);
  // The gate-ups' inputs as int8 blocks from the RMSNorm (MoePrefillOp::h2_q8), with expert ranges
  // and an f32-path shared gate-up (Q5_1: ignores them).
  MoeCase q{{T::Q4_0, T::Q4_0, T::Q5_1, T::Q8_0}, 7, 96, 64, 128, 3, 19, 17, 3, true, true};
  q.h2_q8 = true;
  run_moe_case(g, q, seed++);
  q.types = {T::Q6_K, T::Q4_0, T::Q8_0, T::Q4_0};
  q.n_embd = 256;
  q.int8_tuning = {.lanes = 16, .rows = 32};
  run_moe_case(g, q, seed++);
  Gpu& gs = vktest::gpu(true);
  MoeCase s = base;
  s.int8_tuning = {.lanes = 32, .rows = 64, .rows_all = 32, .pairs = 8, .outs = 2, .unroll = 1};
  s.h2_q8 = true;
  run_moe_case(gs, s, seed++);
}

// The matmul form (moe_matmul.comp; tensor cores where the device has them, else plain FMAs):
// every type family, expert ranges, a shared expert, token counts past one pair tile, a slot of
// 36 values (its down stays on moe_prefill.comp), sigmoid routing with bias.
TEST(PrefillMoe, MatmulForm) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::matmul_supported(*g.ctx)) GTEST_SKIP() << "no shaderFloat16";
  using T = GgmlType;
  run_moe_case(g, {{T::Q4_0, T::Q4_0, T::Q4_0, T::Q4_0}, 9, 96, 64, 128, 3, 23, 21, 0, true, false, true}, 31);
  run_moe_case(g, {{T::Q8_0, T::Q5_1, T::Q8_0, T::Q4_1}, 9, 64, 96, 96, 2, 6, 6, 4, true, false, true}, 32);
  run_moe_case(g, {{T::Q4_K, T::Q6_K, T::Q5_K, T::Q6_K}, 6, 256, 256, 256, 4, 5, 3, 0, true, false, true}, 33);
  run_moe_case(g, {{T::F16, T::BF16, T::F32, T::F16}, 5, 36, 0, 64, 2, 4, 4, 2, false, false, true}, 34);
  run_moe_case(g, {{T::Q4_0, T::Q8_0, T::Q4_0, T::Q8_0}, 3, 64, 32, 64, 2, 70, 67, 0, true, false, true}, 35);
  // The cases above run 4 row tiles a workgroup (the default: the gate-up's 2 gate + 2 up tiles,
  // 32 outputs; the down's 64 rows); here 2, and with 4 a shared width of 48 (f16 / f32: a
  // half-empty last output tile).
  run_moe_case(g, {{T::Q4_0, T::Q4_0, T::F16, T::F32}, 9, 96, 48, 128, 3, 23, 21, 0, true, false, true, {.row_tiles = 4}}, 36);
  run_moe_case(g, {{T::Q4_K, T::Q6_K, T::Q5_K, T::Q6_K}, 6, 256, 256, 256, 4, 5, 3, 0, true, false, true, {.row_tiles = 2}}, 37);
  run_moe_case(g, {{T::Q8_0, T::Q5_1, T::Q8_0, T::Q4_1}, 9, 64, 96, 96, 2, 6, 6, 4, true, false, true, {.row_tiles = 2}}, 38);
  run_moe_case(g, {{T::Q4_0, T::Q8_0, T::Q4_0, T::Q8_0}, 3, 64, 32, 64, 2, 70, 67, 0, true, false, true, {.row_tiles = 2}}, 39);
}

// The matmul form's steps, prefetch and f16 input (moe_matmul.comp STEP_PREFETCH: the next step's W
// words and input values loaded before this step's products, by default both, as MatmulForm
// runs; IN_F16: the gate-up reads f16 rows): every SPLIT1 type family without the loads ahead,
// each one alone, steps of 32, 128 and 256 columns (inputs of 96 and 160 columns: a short last step),
// 8 row tiles, fewer groups of pairs, row tiles split between groups everywhere (by default only
// in the routed experts' dispatches) or nowhere, the products as a loop, plain types, expert ranges. Each case compiles its own kernels: kept few for CI's cold cache.
TEST(PrefillMoe, MatmulFormStepsAndPrefetch) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::matmul_supported(*g.ctx)) GTEST_SKIP() << "no shaderFloat16";
  using T = GgmlType;
  const MoeCase q4{{T::Q4_0, T::Q5_0, T::Q4_1, T::Q5_1}, 9, 96, 64, 160, 3, 23, 21, 0, true, false, true};
  const MoeCase q8{{T::Q8_0, T::Q4_0, T::Q5_0, T::Q8_0}, 5, 64, 96, 96, 2, 37, 35, 3, true, false, true};
  const MoeCase kq{{T::Q4_K, T::Q6_K, T::Q5_K, T::Q6_K}, 4, 256, 256, 512, 2, 9, 9, 0, true, false, true};
  const MoeCase plain{{T::F16, T::BF16, T::F32, T::F16}, 5, 64, 0, 96, 2, 4, 4, 2, false, false, true};
  struct Variant {
    MoeCase c;
    vk::FfnMatmulTuning t;
    bool h2_f16;
  };
  const Variant variants[] = {
      {q4, {.prefetch = 1}, false},
      {q8, {.row_tiles = 2, .prefetch = 1}, true},
      {kq, {.prefetch = 1}, true},
      {kq, {.step = 128, .groups = 2, .prefetch = 4}, false},
      {q4, {.prefetch = 2}, true},
      {q8, {.groups = 1, .loop = 2, .prefetch = 3}, true},
      {q4, {}, true},
      {q4, {.step = 128, .loop = 2, .prefetch = 4}, true},
      {q4, {.step = 256, .prefetch = 1}, false},
      {q8, {.step = 32}, true},
      {q8, {.row_tiles = 8, .prefetch = 1}, false},
      {q4, {.split_rows = 1}, true},
      {q8, {.groups = 1, .split_rows = 2, .prefetch = 1}, false},
      {plain, {.row_tiles = 2, .step = 128, .prefetch = 4}, true},
      {plain, {.step = 256, .prefetch = 1}, false},
  };

  uint32_t seed = 40;
  for (const Variant& v : variants) {
    MoeCase c = v.c;
    c.matmul_tuning = v.t;
    c.h2_f16 = v.h2_f16;
    run_moe_case(g, c, seed++);
  }
}

// The routing of a long chunk alone: pairs over several of the list builder's 1024-pair tiles,
// sigmoid with bias and softmax, with subgroups (each subgroup lists its experts by prefix sums)
// and without; live tokens fewer than the chunk.
TEST(PrefillRoute, ListsOverSeveralTilesMatchTheReference) {
  using vk::PrefillRouteOp;
  for (const bool no_subgroups : {false, true}) {
    Gpu& g = vktest::gpu(no_subgroups);
    VK_TEST_REQUIRE_GPU(g);
    for (const bool sigmoid : {true, false}) {
      SCOPED_TRACE(cat(no_subgroups ? "no subgroups" : "subgroups", sigmoid ? " sigmoid" : " softmax"));
      std::mt19937 rng(sigmoid ? 71 : 72);
      const uint32_t E = 64, K = 4, T = 700, n = 651;
      const std::vector<float> logits = vktest::random_values(rng, size_t(T) * E, 2.f);
      const std::vector<float> bias = vktest::random_values(rng, E, 0.1f);
      const ModelConfig cfg = moetest::prefill_routing(E, K, sigmoid);
      vk::Buffer lb = vktest::make_buffer(g, logits.size() * 4, "logits"), bb = vktest::make_buffer(g, E * 4, "bias");
      vk::Buffer rb = vktest::make_buffer(g, vk::prefill_route_bytes(T, K), "route");
      vk::Buffer listb = vktest::make_buffer(g, vk::prefill_list_bytes(T, E), "lists");
      vk::Buffer step = step_buffer(g, 0, n);
      vktest::upload_bytes(g, lb, logits.data(), logits.size() * 4);
      vktest::upload_bytes(g, bb, bias.data(), E * 4);
      vktest::poison(g, rb);
      vktest::poison(g, listb);
      const PrefillRouteOp route = moetest::prefill_route_op(cfg, T, lb, sigmoid ? &bb : nullptr, step, rb, listb);
      vk::CommandRecorder rec(*g.ctx);
      rec.begin();
      route.record(rec);
      rec.end();
      rec.run();
      const std::vector<uint32_t> rw = download_words(g, rb, 2ull * T * K);
      const std::vector<uint32_t> lw = download_words(g, listb, size_t(E) * (T + 1));
      std::vector<std::vector<uint32_t>> want(E);
      for (uint32_t t = 0; t < n; ++t) {
        const cpu::Route r = cpu::route_token(cfg, std::span<const float>(logits.data() + size_t(t) * E, E),
                                             sigmoid ? std::span<const float>(bias) : std::span<const float>());
        for (uint32_t k = 0; k < K; ++k) {
          ASSERT_EQ(rw[2 * (t * K + k)], r.experts[k]) << "token " << t << " slot " << k;
          want[r.experts[k]].push_back(t * K + k);
        }
      }
      for (uint32_t e = 0; e < E; ++e) {
        ASSERT_EQ(lw[e], want[e].size()) << "expert " << e;
        for (size_t j = 0; j < want[e].size(); ++j) ASSERT_EQ(lw[E + e * T + j], want[e][j]) << "expert " << e << " entry " << j;
      }
    }
  }
}

TEST(PrefillMoe, SharedMemoryPathMatches) {
  Gpu& g = vktest::gpu(true);
  VK_TEST_REQUIRE_GPU(g);
  using T = GgmlType;
  run_moe_case(g, {{T::Q4_0, T::Q8_0, T::Q4_0, T::Q8_0}, 7, 64, 32, 64, 3, 9, 8, 3, true}, 5);
}

// Dense FFN of a chunk (gate and up in one buffer), then the sum with K = 0; and the gather.
TEST(PrefillDense, FfnAndGatherMatchTheReference) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  for (const bool mm : {false, true})
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F32}) {
    if (mm && !vk::matmul_supported(*g.ctx)) continue;
    SCOPED_TRACE(cat(type_name(type), mm ? " matmul" : ""));
    std::mt19937 rng(7);
    const uint32_t D = type == GgmlType::Q4_K ? 256 : 64, F = type == GgmlType::Q4_K ? 512 : type == GgmlType::Q8_0 ? 96 : 72, T = 6, n = 4;
    const auto gate = vktest::random_matrix(rng, type, F, D), up = vktest::random_matrix(rng, type, F, D);
    const auto down_q = vktest::random_matrix(rng, type == GgmlType::Q4_K ? GgmlType::Q6_K : type, D, F);
    const GgmlType down_type = type == GgmlType::Q4_K ? GgmlType::Q6_K : type;
    auto layout = [](GgmlType t, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& q) {
      std::vector<uint8_t> b = vk::split1_supported(t) ? vk::split1_from_gguf(t, rows, cols, q.data()) : q;
      b.resize((b.size() + 255) / 256 * 256, 0);
      return b;
    };
    std::vector<uint8_t> gu = layout(type, F, D, gate);
    const uint64_t up_at = gu.size();
    const std::vector<uint8_t> ub = layout(type, F, D, up);
    gu.insert(gu.end(), ub.begin(), ub.end());
    vk::Buffer wb = vktest::make_buffer(g, gu.size(), "gate+up");
    vktest::upload_bytes(g, wb, gu.data(), gu.size());
    auto dm = vktest::upload_matrix(g, down_type, D, F, down_q);
    const vk::WeightLayout wl = vk::split1_supported(type) ? vk::WeightLayout::Split1 : vk::WeightLayout::Plain;
    const std::vector<float> h2 = vktest::random_values(rng, size_t(T) * D), x0 = vktest::random_values(rng, size_t(T) * D);
    vk::Buffer hb2 = vktest::make_buffer(g, h2.size() * 4, "h2"), xb = vktest::make_buffer(g, x0.size() * 4, "x");
    vk::Buffer hb = vktest::make_buffer(g, size_t(T) * F * 4, "h"), yb = vktest::make_buffer(g, size_t(T) * D * 4, "y");
    vk::Buffer last = vktest::make_buffer(g, D * 4, "last");
    vk::Buffer step = step_buffer(g, 3, n);
    vktest::upload_bytes(g, hb2, h2.data(), h2.size() * 4);
    vktest::upload_bytes(g, xb, x0.data(), x0.size() * 4);
    vktest::poison(g, hb);
    vktest::poison(g, yb);
    vktest::poison(g, last);
    vk::DensePrefillOp d;
    d.gate = {&wb, 0, type, wl, F, D};
    d.up = {&wb, up_at, type, wl, F, D};
    d.down = dm->ref;
    d.t_max = T;
    d.step = step.whole();
    d.count_word = kCountWord;
    d.h2 = hb2.whole();
    d.h = hb.whole();
    d.y = yb.whole();
    d.form.int8_activations = false;  // f32 reference tolerance (the int8 path: PrefillMoe.Int8ActivationPath)
    d.form.matmul = mm;               // f16 inputs and weights: the reference rounds them below
    vk::PrefillSumOp sum;
    sum.n_embd = D;
    sum.n_used = 0;
    sum.t_max = T;
    sum.x = xb.whole();
    sum.y = yb.whole();
    sum.step = step.whole();
    sum.count_word = kCountWord;
    vk::PrefillGatherOp gather;
    gather.n_embd = D;
    gather.x = xb.whole();
    gather.out = last.whole();
    gather.step = step.whole();
    gather.count_word = kCountWord;
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    d.record_gateup(rec);
    rec.barrier();
    d.record_down(rec);
    rec.barrier();
    sum.record(rec);
    rec.barrier();
    gather.record(rec);
    rec.end();
    rec.run();
    std::vector<double> want(x0.begin(), x0.end()), tol(x0.size(), 0.0);
    for (uint32_t t = 0; t < n; ++t) {
      std::vector<double> in(h2.begin() + size_t(t) * D, h2.begin() + size_t(t + 1) * D);
      if (mm) in = f16_round(in);
      // The matmul form takes the parts whose input rows are a multiple of 32 values.
      auto rowf = [&](GgmlType ty, const std::vector<uint8_t>& q, uint32_t cols, uint32_t i) {
        const std::vector<float> r = vktest::dequant_row(ty, q, cols, i);
        return mm && cols % 32 == 0 ? f16_round(r) : r;
      };
      std::vector<double> h, htol, y(D, 0.0), abs(D, 0.0);
      moetest::ref_gateup([&](uint32_t i) { return rowf(type, gate, D, i); }, [&](uint32_t i) { return rowf(type, up, D, i); }, F,
                          in, h, htol);
      const std::vector<float> hf32(h.begin(), h.end());  // h as the GPU stores it (f32)
      std::vector<double> hf(hf32.begin(), hf32.end());
      if (mm && F % 32 == 0) hf = f16_round_down_input(hf);
      moetest::ref_down_add([&](uint32_t r) { return rowf(down_type, down_q, F, r); }, D, 1.0, hf.data(), y, abs);
      double hmax = 0;
      for (double v : htol) hmax = std::max(hmax, v);
      for (uint32_t r = 0; r < D; ++r) {
        want[size_t(t) * D + r] += y[r];
        tol[size_t(t) * D + r] = moetest::sum_tol(abs[r] + 4 * hmax * F + std::fabs(x0[size_t(t) * D + r]), want[size_t(t) * D + r],
                                                  mm ? 1e-3 : 2e-5);  // f16 h: one ulp where roundings part
      }
    }
    const std::vector<float> got = vktest::download_floats(g, xb, x0.size());
    vktest::expect_close(got, want, tol, "x after the dense FFN");
    const std::vector<float> lastv = vktest::download_floats(g, last, D);
    EXPECT_TRUE(std::equal(lastv.begin(), lastv.end(), got.begin() + size_t(n - 1) * D)) << "gather of row n-1";
  }
}

// T queries in one dispatch (QueryBatch) == the decode kernels run once per position, bit for bit:
// kv_write of T rows, then causal attention of every query over the rows written so far.
TEST(PrefillAttention, BatchedQueriesEqualOnePerPosition) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  vk::AttentionShape s;
  s.n_head = 3;
  s.kv_lora = 64;
  s.n_ctx = 40;
  s.eps = 1e-5f;
  s.kq_scale = 0.125f;
  ModelConfig m;
  m.n_rot = 16;
  m.rope_base = 10000;
  s.rope = vk::RopeParams::from_config(m);
  const uint32_t T = 9, n = 7, p0 = 13, row = s.row(), H = s.n_head, R = s.kv_lora;
  vk::KvWriteOp kvw(*g.ctx, s);
  vk::AttentionOp attn(*g.ctx, s, {.n_groups = 4, .min_chunk = 4});
  std::mt19937 rng(11);
  const std::vector<float> kv = vktest::random_values(rng, size_t(T) * row), q = vktest::random_values(rng, size_t(T) * H * row);
  const std::vector<float> nw = vktest::random_values(rng, R), old = vktest::random_values(rng, size_t(p0) * row);
  // Rows before p0: an earlier context (f16 of random values).
  std::vector<uint16_t> cache0(size_t(s.n_ctx) * row, 0);
  for (size_t i = 0; i < old.size(); ++i) cache0[i] = f32_to_fp16(old[i]);
  vk::Buffer kvb = vktest::make_buffer(g, kv.size() * 4, "kv"), qb = vktest::make_buffer(g, q.size() * 4, "q");
  vk::Buffer nwb = vktest::make_buffer(g, R * 4, "norm");
  vk::Buffer cache_a = vktest::make_buffer(g, s.cache_bytes(), "cache batched"), cache_b = vktest::make_buffer(g, s.cache_bytes(), "cache single");
  vk::Buffer part_a = vktest::make_buffer(g, T * attn.partials_bytes(), "partials"), part_b = vktest::make_buffer(g, attn.partials_bytes(), "partials 1");
  vk::Buffer olat_a = vktest::make_buffer(g, size_t(T) * H * R * 4, "olat"), olat_b = vktest::make_buffer(g, size_t(T) * H * R * 4, "olat 1");
  vktest::upload_bytes(g, kvb, kv.data(), kv.size() * 4);
  vktest::upload_bytes(g, qb, q.data(), q.size() * 4);
  vktest::upload_bytes(g, nwb, nw.data(), R * 4);
  vktest::upload_bytes(g, cache_a, cache0.data(), cache0.size() * 2);
  vktest::upload_bytes(g, cache_b, cache0.data(), cache0.size() * 2);
  vktest::poison(g, olat_a);
  vktest::poison(g, olat_b);
  vk::Buffer step = step_buffer(g, p0, n);
  const vk::QueryBatch batch{T, kCountWord};
  {
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    kvw.record_rows(rec, kvb.whole(), nwb.whole(), step.whole(), 0, batch, cache_a.whole(), "kv_write rows");
    rec.barrier();
    attn.record(rec, qb.whole(), cache_a.whole(), step.whole(), 0, part_a.whole(), olat_a.whole(), "attention", batch);
    rec.end();
    rec.run();
  }
  // One position at a time through the decode form (step word 0 = position).
  for (uint32_t t = 0; t < n; ++t) {
    vk::Buffer st = step_buffer(g, p0 + t, 0);
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    kvw.record(rec, kvb.whole().sub(uint64_t(t) * row * 4, row * 4), nwb.whole(), st.whole(), 0, cache_b.whole(), "kv_write");
    rec.barrier();
    attn.record(rec, qb.whole().sub(uint64_t(t) * H * row * 4, uint64_t(H) * row * 4), cache_b.whole(), st.whole(), 0,
                part_b.whole(), olat_b.whole().sub(uint64_t(t) * H * R * 4, uint64_t(H) * R * 4), "attention");
    rec.end();
    rec.run();
  }
  std::vector<uint16_t> ca(cache0.size()), cb(cache0.size());
  g.transfer->download(cache_a, 0, ca.data(), ca.size() * 2);
  g.transfer->download(cache_b, 0, cb.data(), cb.size() * 2);
  EXPECT_EQ(ca, cb) << "cache rows (padding tokens t >= n must not write)";
  const std::vector<float> oa = vktest::download_floats(g, olat_a, size_t(T) * H * R);
  const std::vector<float> ob = vktest::download_floats(g, olat_b, size_t(T) * H * R);
  for (size_t i = 0; i < size_t(n) * H * R; ++i) ASSERT_EQ(oa[i], ob[i]) << "olat value " << i;
  for (size_t i = size_t(n) * H * R; i < oa.size(); ++i) ASSERT_TRUE(std::isnan(oa[i])) << "padding query wrote " << i;
}

// AbsorbOp over several tokens (z = token) == one dispatch per token, bit for bit, for the query
// absorption (with the q_pe copy) and the value projection.
TEST(PrefillAttention, AbsorbOverTokensEqualsOnePerToken) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const uint32_t H = 3, R = 64, Dn = 32, Dr = 16, Dv = 40, T = 5;
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::F16}) {
    SCOPED_TRACE(type_name(type));
    std::mt19937 rng(21);
    auto kb = vktest::upload_matrix(g, type, H * R, Dn, vktest::random_matrix(rng, type, H * R, Dn));
    auto vb = vktest::upload_matrix(g, type, H * Dv, R, vktest::random_matrix(rng, type, H * Dv, R));
    const std::vector<float> qin = vktest::random_values(rng, size_t(T) * H * (Dn + Dr));
    const std::vector<float> olat = vktest::random_values(rng, size_t(T) * H * R);
    vk::Buffer qb = vktest::make_buffer(g, qin.size() * 4, "q_b out"), ob = vktest::make_buffer(g, olat.size() * 4, "olat");
    vktest::upload_bytes(g, qb, qin.data(), qin.size() * 4);
    vktest::upload_bytes(g, ob, olat.data(), olat.size() * 4);
    const uint64_t qs = uint64_t(H) * (R + Dr), os = uint64_t(H) * Dv;
    vk::Buffer qa = vktest::make_buffer(g, T * qs * 4, "q batched"), q1 = vktest::make_buffer(g, T * qs * 4, "q single");
    vk::Buffer oa = vktest::make_buffer(g, T * os * 4, "o batched"), o1 = vktest::make_buffer(g, T * os * 4, "o single");
    for (vk::Buffer* b : {&qa, &q1, &oa, &o1}) vktest::poison(g, *b);
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    vk::AbsorbOp aq = vk::AbsorbOp::query(kb->ref, H, Dr, qb.whole(), qa.whole());
    aq.n_tokens = T;
    aq.record(rec);
    vk::AbsorbOp av = vk::AbsorbOp::value(vb->ref, H, ob.whole(), oa.whole());
    av.n_tokens = T;
    av.record(rec);
    for (uint32_t t = 0; t < T; ++t) {
      const uint64_t qi = uint64_t(H) * (Dn + Dr) * 4, li = uint64_t(H) * R * 4;
      vk::AbsorbOp::query(kb->ref, H, Dr, qb.whole().sub(t * qi, qi), q1.whole().sub(t * qs * 4, qs * 4)).record(rec);
      vk::AbsorbOp::value(vb->ref, H, ob.whole().sub(t * li, li), o1.whole().sub(t * os * 4, os * 4)).record(rec);
    }
    rec.end();
    rec.run();
    const auto a = vktest::download_floats(g, qa, T * qs), b = vktest::download_floats(g, q1, T * qs);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "q value " << i;
    const auto c = vktest::download_floats(g, oa, T * os), d = vktest::download_floats(g, o1, T * os);
    for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], d[i]) << "o value " << i;
  }
}

}  // namespace
}  // namespace tessera
