// The router fold (shaders/router_partial.glsl in matvec.comp / matvec_q8.comp, ROUTER_FOLD in
// moe_gateup.comp) against the CPU: x_new = x + W in (the matvec that writes x), then the gate-up
// routes from the fold's accumulators. Checked: x_new; the logits workgroup 0 writes against
// W_router . RMSNorm(x_new; ffn_norm) in double; the route against cpu::route_token of those
// logits (ids exactly, weights to rounding); h of every slot against the double gate-up of
// RMSNorm(x_new). Awkward sizes (E not a multiple of anything, E + 1 > the workgroup), F32 / F16 /
// BF16 routers, the f32 and int8-activation matvecs and expert kernels, the shared-memory reduction
// path; route, logits and h poisoned with NaN before each run. Also: the same bits in every run,
// and a NaN / inf in x neither crashes nor yields an expert id out of range.
// The MoE down fused into the gate-up (MoeGateUpOp::down_acc, FUSED_DOWN): x after the dispatch
// against x_new + sum_k w_k down_{e_k} . q8(h_k) + down_shared . q8(h_shared) in double, from the
// GPU's h and route; the accumulators and the arrival counter left at zero; the same bits in
// every run; refused where it does not apply.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "runtime/cpu/ops.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/kernels_moe_internal.h"
#include "tests/vulkan/test_moe_util.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using moetest::TileTypes;
using vktest::Gpu;

struct FoldCase {
  uint32_t n_embd, in_cols, n_expert, n_used, w_routed, w_shared;
  GgmlType matvec_type, router_type;
  TileTypes tile;
  bool glm = true;     // sigmoid + bias + norm + scale 1.8; else softmax
  bool q8 = false;     // int8-activation matvec and expert kernels
  bool no_subgroup = false;
  bool fused_down = false;  // the down projection fused into the gate-up
  bool overlap_off = false;  // the gate-up's fold sums, staging and bias in separate phases (not the default)
  bool x_q8 = false;         // the matvec reads its input as int8 blocks (MatvecOp::x_q8; long rows: two subgroups each)
  uint32_t route_ranks = 0;  // MoeTuning::route_ranks: 0 auto, 1 ranks (softmax too), 2 subgroup 0's rounds
  bool tied_router = false;  // router rows (and biases) 2i and 2i + 1 equal: every logit tied with a neighbour
  uint32_t teams = 0;        // MoeTuning::q8_gateup_teams (0: auto)
};

std::string describe(const FoldCase& c) {
  return cat("n_embd ", c.n_embd, " in ", c.in_cols, " E", c.n_expert, " K", c.n_used, " w", c.w_routed, "/", c.w_shared,
             " matvec ", type_name(c.matvec_type), " router ", type_name(c.router_type), " tile ",
             type_name(c.tile.gateup), c.glm ? " glm" : " v2", c.q8 ? " q8act" : "", c.no_subgroup ? " no-subgroup" : "",
             c.fused_down ? " fused-down" : "", c.overlap_off ? " overlap-off" : "", c.x_q8 ? " x-q8" : "",
             c.route_ranks ? cat(" route_ranks ", c.route_ranks) : "", c.tied_router ? " tied" : "");
}

struct FoldResult {
  std::vector<float> x, logits, h;  // x: after the matvec (x_new)
  std::vector<float> x_final;       // fused_down: x after the gate-up
  std::vector<uint8_t> down_acc;    // fused_down: the accumulator slice after the run
  std::vector<uint32_t> route;  // K (id, weight bits) pairs
};

// Runs fill | matvec with the fold | barrier | gate-up with the fold, on x0 (NaNs allowed).
FoldResult run_fold(Gpu& g, const FoldCase& c, uint32_t seed, const std::vector<float>* x_override = nullptr,
                    bool check = true) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  const std::vector<uint8_t> wq = vktest::random_matrix(rng, c.matvec_type, c.n_embd, c.in_cols);
  auto wm = vktest::upload_matrix(g, c.matvec_type, c.n_embd, c.in_cols, wq);
  std::vector<uint8_t> rq = vktest::random_matrix(rng, c.router_type, c.n_expert, c.n_embd);
  const size_t router_row = rq.size() / c.n_expert;
  if (c.tied_router)
    for (uint32_t e = 1; e < c.n_expert; e += 2) std::memcpy(&rq[e * router_row], &rq[(e - 1) * router_row], router_row);
  auto rm = vktest::upload_matrix(g, c.router_type, c.n_expert, c.n_embd, rq);
  const moetest::HostTile ht = moetest::build_tile(rng, c.n_expert, c.w_routed, c.w_shared, c.n_embd, c.tile);
  const std::vector<float> in = vktest::random_values(rng, c.in_cols, 0.3f);
  std::vector<float> x0 = vktest::random_values(rng, c.n_embd);
  if (x_override) x0 = *x_override;
  std::vector<float> nw = vktest::random_values(rng, c.n_embd);
  for (float& v : nw) v = 0.5f + std::fabs(v);
  std::vector<float> bias;
  if (c.glm) {
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (uint32_t e = 0; e < c.n_expert; ++e) bias.push_back(c.tied_router && e % 2 ? bias.back() : u(rng));
  }
  ModelConfig cfg;
  cfg.n_expert = c.n_expert;
  cfg.n_expert_used = c.n_used;
  cfg.gating = c.glm ? GatingFunc::Sigmoid : GatingFunc::Softmax;
  cfg.expert_weights_norm = c.glm;
  cfg.expert_weights_scale = c.glm ? 1.8f : 1.0f;
  cfg.has_exp_probs_b = c.glm;
  const float eps = 1e-5f;

  vk::Buffer in_b = vktest::make_buffer(g, in.size() * 4, "in");
  vktest::upload_bytes(g, in_b, in.data(), in.size() * 4);
  vk::Buffer x_b = vktest::make_buffer(g, x0.size() * 4, "x");
  vktest::upload_bytes(g, x_b, x0.data(), x0.size() * 4);
  vk::Buffer nw_b = vktest::make_buffer(g, nw.size() * 4, "ffn_norm");
  vktest::upload_bytes(g, nw_b, nw.data(), nw.size() * 4);
  vk::Buffer bias_b = vktest::make_buffer(g, std::max<size_t>(bias.size(), 1) * 4, "bias");
  if (c.glm) vktest::upload_bytes(g, bias_b, bias.data(), bias.size() * 4);
  // The accumulators at a non-zero offset, poisoned around (the fill zeroes only the slice).
  const uint64_t acc_off = 256, acc_bytes = vk::router_fold_acc_bytes(c.n_expert);
  vk::Buffer acc_b = vktest::make_buffer(g, acc_off + acc_bytes + 256, "fold acc");
  vktest::poison(g, acc_b);
  const uint64_t tile_off = 256;
  vk::Buffer tile_b = vktest::make_buffer(g, tile_off + ht.bytes.size(), "tile");
  vktest::upload_bytes(g, tile_b, ht.bytes.data(), ht.bytes.size(), tile_off);
  const uint64_t h_floats = vk::moe_h_floats(ht.g, c.n_used);
  vk::Buffer h_b = vktest::make_buffer(g, h_floats * 4, "h");
  vktest::poison(g, h_b);
  vk::Buffer route_b = vktest::make_buffer(g, vk::moe_route_bytes(c.n_used), "route");
  vktest::poison(g, route_b);
  vk::Buffer logit_b = vktest::make_buffer(g, c.n_expert * 4ull, "logits");
  vktest::poison(g, logit_b);
  vk::Buffer hq_b = vktest::make_buffer(g, std::max<uint64_t>(vk::moe_hq_bytes(ht.g, c.n_used), 48), "hq");
  vk::Buffer x_mid_b = vktest::make_buffer(g, x0.size() * 4, "x after the matvec");
  const uint64_t dacc_off = 256, dacc_bytes = vk::moe_down_acc_bytes(c.n_embd);
  vk::Buffer dacc_b = vktest::make_buffer(g, dacc_off + dacc_bytes + 256, "down acc");
  vktest::poison(g, dacc_b);

  vk::MatvecOp mv;
  mv.w = wm->ref;
  mv.x = in_b.whole();
  mv.y = x_b.whole();
  mv.accumulate = true;
  mv.int8_activations = c.q8;
  vk::Buffer in_q8_b;
  if (c.x_q8) {  // the same input as int8 blocks (what the attention merge writes for W_vo)
    const std::vector<uint32_t> blocks = vktest::q8_blocks(in);
    in_q8_b = vktest::make_buffer(g, blocks.size() * 4, "in q8");
    vktest::upload_bytes(g, in_q8_b, blocks.data(), blocks.size() * 4);
    mv.x_q8 = in_q8_b.whole();
  }
  mv.router_fold = {rm->ref, nw_b.whole(), acc_b.slice(acc_off, acc_bytes)};
  if (check) EXPECT_NE(mv.kernel_name(g.ctx.get()).find(".rfold"), std::string::npos);
  vk::MoeGateUpOp gu;
  gu.tile = {&tile_b, tile_off, ht.g};
  gu.n_used = c.n_used;
  gu.h = h_b.whole();
  gu.route = route_b.whole();
  gu.fold_acc = mv.router_fold.acc;
  gu.x = x_b.whole();
  gu.norm_weight = nw_b.whole();
  gu.eps = eps;
  gu.routing = vk::MoeRouting::from_config(cfg);
  if (c.glm) gu.bias = bias_b.whole();
  gu.logits = logit_b.whole();
  if (c.q8) {
    EXPECT_TRUE(vk::moe_q8_usable(*g.ctx, ht.g, c.n_used));
    gu.hq = hq_b.whole();
  }
  gu.tuning.q8_fold_overlap = c.overlap_off ? 2u : 0u;
  gu.tuning.route_ranks = c.route_ranks;
  gu.tuning.q8_gateup_teams = c.teams;
  if (c.fused_down) {
    EXPECT_TRUE(vk::moe_fused_down_supported(*g.ctx, ht.g, c.n_used));
    gu.down_acc = dacc_b.slice(dacc_off, dacc_bytes);
  }
  // Where it can, the gate-up also opens the MoE down's gates (moe_gateup.comp GATE_SIGNAL): the
  // same outputs, checked below, and the gate words count the route and every workgroup.
  vk::Buffer gate_b = vktest::make_buffer(g, 16, "gate");
  const bool gated = gu.gate_supported(*g.ctx);
  EXPECT_EQ(gated, c.q8 && !c.fused_down && vk::moe_q8_usable(*g.ctx, ht.g, c.n_used));
  if (gated) {
    const uint32_t zero[4] = {};
    vktest::upload_bytes(g, gate_b, zero, sizeof zero);
    gu.gate = gate_b.slice(0, 8);
  }

  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  rec.fill(mv.router_fold.acc, 0);
  if (c.fused_down) rec.fill(gu.down_acc, 0);
  rec.barrier();
  mv.record(rec);
  rec.barrier();
  if (c.fused_down) {  // keep x_new for the checks below: the fused gate-up adds the down to x
    rec.copy(x_b.whole(), x_mid_b.whole());
    rec.barrier();
  }
  gu.record(rec);
  rec.end();
  rec.run();

  FoldResult r;
  if (gated) {
    const std::vector<float> gw = vktest::download_floats(g, gate_b, 2);
    uint32_t words[2];
    std::memcpy(words, gw.data(), sizeof words);
    EXPECT_EQ(words[0], 1u) << "route gate";
    EXPECT_EQ(words[1], gu.gate_h_target(*g.ctx)) << "h gate: every workgroup once";
  }
  r.x = vktest::download_floats(g, c.fused_down ? x_mid_b : x_b, c.n_embd);
  if (c.fused_down) {
    r.x_final = vktest::download_floats(g, x_b, c.n_embd);
    // Through a staging copy: on a discrete GPU the accumulators are device-local.
    const std::vector<float> acc = vktest::download_floats(g, dacc_b, dacc_bytes / 4, dacc_off);
    r.down_acc.resize(dacc_bytes);
    std::memcpy(r.down_acc.data(), acc.data(), dacc_bytes);
  }
  r.logits = vktest::download_floats(g, logit_b, c.n_expert);
  r.h = vktest::download_floats(g, h_b, h_floats);
  const std::vector<float> rw = vktest::download_floats(g, route_b, 2 * c.n_used);
  r.route.resize(rw.size());
  std::memcpy(r.route.data(), rw.data(), rw.size() * 4);
  if (!check) return r;

  // x_new = x0 + W in.
  std::vector<double> want_x(c.n_embd), tol_x(c.n_embd);
  std::vector<double> in_d(in.begin(), in.end());
  if (c.q8) in_d = vktest::q8_round(in_d);
  for (uint32_t i = 0; i < c.n_embd; ++i) {
    const vktest::RowDot d = vktest::row_dot(c.matvec_type, wq, c.in_cols, i, in_d.data());
    want_x[i] = x0[i] + d.sum;
    tol_x[i] = moetest::sum_tol(d.mag + std::fabs(x0[i]), want_x[i], c.q8 ? 1e-4 : 2e-5);
  }
  vktest::expect_close(r.x, want_x, tol_x, "x_new");

  // Logits from the GPU's x_new, in double.
  double ss = 0;
  for (float v : r.x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / c.n_embd + eps);
  std::vector<double> want_l(c.n_expert), tol_l(c.n_expert);
  for (uint32_t e = 0; e < c.n_expert; ++e) {
    const std::vector<float> row = vktest::dequant_row(c.router_type, rq, c.n_embd, e);
    double s = 0, a = 0;
    for (uint32_t k = 0; k < c.n_embd; ++k) {
      s += double(row[k]) * nw[k] * r.x[k];
      a += std::fabs(double(row[k]) * nw[k] * r.x[k]);
    }
    want_l[e] = s * inv;
    tol_l[e] = 1e-5 * a * inv + 1e-6;
  }
  vktest::expect_close(r.logits, want_l, tol_l, "router logits");

  // The route: the CPU routing of the GPU's logits.
  const cpu::Route route = cpu::route_token(cfg, r.logits, bias);
  for (uint32_t k = 0; k < c.n_used; ++k) {
    EXPECT_EQ(r.route[2 * k], route.experts[k]) << "expert of slot " << k;
    float wgt;
    std::memcpy(&wgt, &r.route[2 * k + 1], 4);
    EXPECT_NEAR(wgt, route.weights[k], 2e-6 * std::fabs(route.weights[k]) + 1e-7) << "weight of slot " << k;
  }

  // h = gate-up of RMSNorm(x_new; ffn_norm) for the chosen experts and the shared one.
  std::vector<double> h2(c.n_embd);
  for (uint32_t k = 0; k < c.n_embd; ++k) h2[k] = double(r.x[k]) * nw[k];
  if (c.q8) h2 = vktest::q8_round(h2);  // the kernel stages x * norm weight, 1/rms after the dots
  for (double& v : h2) v *= inv;
  const uint32_t hs = vk::moe_h_stride(ht.g);
  const uint32_t n_slots = c.n_used + (ht.g.has_shared() ? 1 : 0);
  for (uint32_t k = 0; k < n_slots; ++k) {
    const uint32_t slot = k < c.n_used ? route.experts[k] : c.n_expert;
    const uint32_t w = uint32_t(ht.g.width(slot));
    std::vector<double> want, tol;
    moetest::ref_gateup([&](uint32_t i) { return ht.row(slot, MoePart::Gate, i); },
                        [&](uint32_t i) { return ht.row(slot, MoePart::Up, i); }, w, h2, want, tol, c.q8 ? 1e-4 : 3e-5);
    vktest::expect_close(std::vector<float>(r.h.begin() + k * hs, r.h.begin() + k * hs + w), want, tol,
                         cat("h slot ", k, " (expert ", slot, ")"));
  }
  if (!c.fused_down) return r;

  // The fused down: x_new + the weighted down products of the int8 h blocks, from the GPU's h.
  std::vector<double> want_f(r.x.begin(), r.x.end()), abs_f(c.n_embd);
  for (uint32_t i = 0; i < c.n_embd; ++i) abs_f[i] = std::fabs(r.x[i]);
  for (uint32_t k = 0; k < n_slots; ++k) {
    const uint32_t slot = k < c.n_used ? route.experts[k] : c.n_expert;
    const uint32_t w = uint32_t(ht.g.width(slot));
    const std::vector<double> hk = vktest::q8_round(std::vector<double>(r.h.begin() + k * hs, r.h.begin() + k * hs + w));
    float wgt = 1.0f;
    if (k < c.n_used) std::memcpy(&wgt, &r.route[2 * k + 1], 4);
    moetest::ref_down_add([&](uint32_t i) { return ht.row(slot, MoePart::Down, i); }, c.n_embd, wgt, hk.data(), want_f,
                          abs_f);
  }
  std::vector<double> tol_f(c.n_embd);
  for (uint32_t i = 0; i < c.n_embd; ++i) tol_f[i] = moetest::sum_tol(abs_f[i], want_f[i], 1e-4);
  vktest::expect_close(r.x_final, want_f, tol_f, "x after the fused down");
  size_t nonzero = 0;
  for (uint8_t b : r.down_acc) nonzero += b != 0;
  EXPECT_EQ(nonzero, 0u) << "accumulator / counter bytes not reset";
  return r;
}

#define REQUIRE_FOLD(g)                                                                           \
  VK_TEST_REQUIRE_GPU(g);                                                                         \
  if (!vk::router_fold_supported(*(g).ctx)) GTEST_SKIP() << "no 64-bit integer buffer atomics"

constexpr TileTypes kQ8Tile = {GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0};
constexpr TileTypes kQ4Tile = {GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0};

TEST(RouterFold, F32MatvecF32RouterGlmStyle) {
  Gpu& g = vktest::gpu();
  REQUIRE_FOLD(g);
  run_fold(g, {160, 96, 37, 3, 64, 96, GgmlType::Q8_0, GgmlType::F32, kQ8Tile, true, false}, 1);
}

TEST(RouterFold, SoftmaxWithManyExpertsAndF16Router) {
  Gpu& g = vktest::gpu();
  REQUIRE_FOLD(g);
  // E + 1 = 201 accumulators: more than one per invocation on the smaller workgroups.
  run_fold(g, {96, 64, 200, 6, 32, 64, GgmlType::Q5_0, GgmlType::F16, kQ8Tile, false, false}, 2);
}

TEST(RouterFold, PlainMatvecBf16RouterNoSharedExpert) {
  Gpu& g = vktest::gpu();
  REQUIRE_FOLD(g);
  run_fold(g, {36, 20, 7, 2, 20, 0, GgmlType::F32, GgmlType::BF16, {GgmlType::F32, GgmlType::F32, GgmlType::F32, GgmlType::F32},
               true, false},
           3);
}

TEST(RouterFold, Int8ActivationKernels) {
  Gpu& g = vktest::gpu();
  REQUIRE_FOLD(g);
  if (!vk::q8_activations_type(*g.ctx, GgmlType::Q4_0)) GTEST_SKIP() << "no integer dot product";
  run_fold(g, {224, 320, 64, 4, 64, 128, GgmlType::Q4_0, GgmlType::F32, kQ4Tile, true, true}, 4);
  run_fold(g, {96, 64, 70, 6, 32, 64, GgmlType::Q8_0, GgmlType::F16, kQ8Tile, false, true}, 5);
  // The default reads input, sums and bias in one phase; E 200 puts E + 1 + n_embd / 32 past the
  // workgroup (the sums wrap around to the first invocations). The separate phases, once each.
  run_fold(g, {544, 64, 200, 6, 32, 64, GgmlType::Q8_0, GgmlType::F16, kQ8Tile, true, true}, 19);
  run_fold(g, {224, 320, 64, 4, 64, 128, GgmlType::Q4_0, GgmlType::F32, kQ4Tile, true, true, false, false, true}, 4);
  run_fold(g, {96, 64, 70, 6, 32, 64, GgmlType::Q8_0, GgmlType::F16, kQ8Tile, false, true, false, false, true}, 5);
  // W_vo's default form: the input as int8 blocks, rows long enough for two subgroups each (more
  // than 2 x 2 x subgroup size blocks), with the fold's epilogue.
  if (vk::q8_activations_type(*g.ctx, GgmlType::Q8_0))
    run_fold(g, {224, 10240, 64, 4, 64, 128, GgmlType::Q8_0, GgmlType::F32, kQ4Tile, true, true, false, false, false, true}, 20);
}

// The routing by ranks (routing.glsl ROUTE_RANKS: the int8 gate-up's default for sigmoid gating,
// asked for softmax) against subgroup 0's rounds: both against the CPU, then the same route (ids
// and weight bits) and the same h bits. Sigmoid: E 64, E 200 (ROUTE_E 224), E 37 (ROUTE_E 64: teams
// past n_expert); softmax: E 70 (ROUTE_E 96), E 200; workgroups of 32 subgroups (1-8 invocations an
// expert by the subgroup size); and routers whose logits tie in pairs (ties inside and across the
// top-K cut: the lower expert first). The E 70 case keeps the seed of Int8ActivationKernels: seed
// 33 draws logits whose softmax underflows, where the GPU (either path) flushes the probabilities
// the CPU keeps as denormals and orders those experts otherwise.
TEST(RouterFold, RanksGiveTheRoundsRoute) {
  Gpu& g = vktest::gpu();
  REQUIRE_FOLD(g);
  if (!vk::q8_activations_type(*g.ctx, GgmlType::Q4_0)) GTEST_SKIP() << "no integer dot product";
  if (!g.ctx->pipelines().use_subgroup() || !g.ctx->info().features.subgroup_shuffle)
    GTEST_SKIP() << "no subgroup shuffles: the rounds only";
  std::vector<FoldCase> cases = {{224, 320, 64, 4, 64, 128, GgmlType::Q4_0, GgmlType::F32, kQ4Tile, true, true},
                                 {544, 64, 200, 6, 32, 64, GgmlType::Q8_0, GgmlType::F16, kQ8Tile, true, true},
                                 {96, 64, 37, 3, 32, 64, GgmlType::Q8_0, GgmlType::F32, kQ8Tile, true, true},
                                 {96, 64, 70, 6, 32, 64, GgmlType::Q8_0, GgmlType::F16, kQ8Tile, false, true},
                                 {544, 64, 200, 6, 32, 64, GgmlType::Q4_0, GgmlType::F32, kQ4Tile, false, true}};
  for (size_t i = 0, n = cases.size(); i < n; ++i) {
    FoldCase t = cases[i];
    t.tied_router = true;
    cases.push_back(t);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    FoldCase c = cases[i];
    // Workgroups of 32 subgroups: at least ROUTE_E invocations with lavapipe's subgroups of 8.
    c.teams = 32;
    c.route_ranks = 1;  // softmax ranks only when asked
    vk::MoeTuning tuning;
    tuning.q8_gateup_teams = c.teams;
    tuning.route_ranks = c.route_ranks;
    const uint32_t re = vk::moe_detail::route_e(c.n_expert, true);
    ASSERT_EQ(vk::moe_detail::route_ranks(*g.ctx, tuning, c.teams, re, c.glm ? GatingFunc::Sigmoid : GatingFunc::Softmax),
              c.glm ? 1u : 2u)
        << describe(c);
    const uint32_t seed = i == 3 ? 5 : uint32_t(30 + i);
    const FoldResult ranks = run_fold(g, c, seed);
    c.route_ranks = 2;
    const FoldResult rounds = run_fold(g, c, seed);
    SCOPED_TRACE(describe(c));
    EXPECT_EQ(ranks.route, rounds.route);
    ASSERT_EQ(ranks.h.size(), rounds.h.size());
    EXPECT_EQ(std::memcmp(ranks.h.data(), rounds.h.data(), ranks.h.size() * 4), 0);
    if (c.tied_router)  // the pair of a chosen even expert is chosen right after it, or lost at the cut
      for (uint32_t k = 0; k + 1 < c.n_used; ++k)
        if (ranks.route[2 * k] % 2 == 0) EXPECT_EQ(ranks.route[2 * k + 2], ranks.route[2 * k] + 1) << "slot " << k;
  }
}

TEST(RouterFold, SharedMemoryReductionPath) {
  Gpu& g = vktest::gpu(true);
  REQUIRE_FOLD(g);
  run_fold(g, {160, 96, 37, 3, 64, 96, GgmlType::Q8_0, GgmlType::F32, kQ8Tile, true, false, true}, 6);
  if (vk::q8_activations_type(*g.ctx, GgmlType::Q4_0))
    run_fold(g, {96, 64, 70, 6, 32, 64, GgmlType::Q4_0, GgmlType::F32, kQ4Tile, false, true, true}, 7);
}

TEST(RouterFold, SameBitsEveryRun) {
  Gpu& g = vktest::gpu();
  REQUIRE_FOLD(g);
  const FoldCase c{160, 96, 64, 4, 64, 96, GgmlType::Q8_0, GgmlType::F32, kQ8Tile, true, false};
  const FoldResult a = run_fold(g, c, 8, nullptr, false), b = run_fold(g, c, 8, nullptr, false);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4), 0);
  EXPECT_EQ(a.route, b.route);
}

TEST(RouterFold, NanAndInfInXStayInRange) {
  Gpu& g = vktest::gpu();
  REQUIRE_FOLD(g);
  const FoldCase c{160, 96, 37, 3, 64, 96, GgmlType::Q8_0, GgmlType::F32, kQ8Tile, true, false};
  std::mt19937 rng(9);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY, 3e38f}) {
    std::vector<float> x = vktest::random_values(rng, c.n_embd);
    x[17] = bad;
    const FoldResult r = run_fold(g, c, 9, &x, false);
    for (uint32_t k = 0; k < c.n_used; ++k) EXPECT_LT(r.route[2 * k], c.n_expert) << "x[17] = " << bad;
  }
}

constexpr TileTypes kQ4KTile = {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K};

#define REQUIRE_FUSED_DOWN(g)                                                                          \
  REQUIRE_FOLD(g);                                                                                     \
  if (!vk::q8_activations_type(*(g).ctx, GgmlType::Q4_0)) GTEST_SKIP() << "no integer dot product"; \
  if (!(g).ctx->pipelines().use_subgroup()) GTEST_SKIP() << "no subgroup arithmetic"

TEST(MoeFusedDown, MatchesTheReference) {
  Gpu& g = vktest::gpu();
  REQUIRE_FUSED_DOWN(g);
  // GLM-like Q4_0; softmax Q8_0 with six experts; no shared expert; n_embd not a multiple of the
  // workgroup (rows left over in the down loop); two blocks of 32 outputs in the last workgroup
  // of a slot (w 96); K-quant blocks of 256.
  run_fold(g, {224, 320, 64, 4, 64, 128, GgmlType::Q4_0, GgmlType::F32, kQ4Tile, true, true, false, true}, 11);
  run_fold(g, {96, 64, 70, 6, 32, 64, GgmlType::Q8_0, GgmlType::F16, kQ8Tile, false, true, false, true}, 5);
  run_fold(g, {160, 96, 37, 3, 64, 0, GgmlType::Q8_0, GgmlType::F32, kQ4Tile, true, true, false, true}, 13);
  run_fold(g, {544, 64, 20, 2, 96, 32, GgmlType::Q8_0, GgmlType::F32, kQ4Tile, true, true, false, true}, 14);
  run_fold(g, {224, 320, 64, 4, 64, 128, GgmlType::Q4_0, GgmlType::F32, kQ4Tile, true, true, false, true, true}, 11);
  if (vk::q8_activations_type(*g.ctx, GgmlType::Q4_K))
    run_fold(g, {256, 64, 16, 2, 256, 256, GgmlType::Q8_0, GgmlType::F32, kQ4KTile, true, true, false, true}, 15);
}

TEST(MoeFusedDown, SameBitsEveryRun) {
  Gpu& g = vktest::gpu();
  REQUIRE_FUSED_DOWN(g);
  const FoldCase c{224, 320, 64, 4, 64, 128, GgmlType::Q4_0, GgmlType::F32, kQ4Tile, true, true, false, true};
  const FoldResult a = run_fold(g, c, 16, nullptr, false), b = run_fold(g, c, 16, nullptr, false);
  ASSERT_EQ(a.x_final.size(), b.x_final.size());
  EXPECT_EQ(std::memcmp(a.x_final.data(), b.x_final.data(), a.x_final.size() * 4), 0);
}

TEST(MoeFusedDown, RefusedWhereItDoesNotApply) {
  Gpu& g = vktest::gpu();
  REQUIRE_FUSED_DOWN(g);
  // Mixed tile types (the down of another type than the gate-up), a tile wider than the binding.
  std::mt19937 rng(17);
  const moetest::HostTile mixed =
      moetest::build_tile(rng, 8, 64, 64, 64, {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q8_0});
  EXPECT_FALSE(vk::moe_fused_down_supported(*g.ctx, mixed.g, 2));
  const moetest::HostTile same = moetest::build_tile(rng, 8, 64, 64, 64, kQ4Tile);
  EXPECT_TRUE(vk::moe_fused_down_supported(*g.ctx, same.g, 2));
  EXPECT_FALSE(vk::moe_fused_down_supported(*g.ctx, same.g, 2, same.g.total_bytes / 2));
  // More than 1023 workgroups (16 x 2048 / 32 = 1024) could wrap the int64 sums: refused (the int8
  // path's shared-memory bound refuses such widths on most devices too).
  const MoeTileGeometry wide = moe_tile_geometry(16, 2048, 0, 64, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0);
  EXPECT_FALSE(vk::moe_fused_down_supported(*g.ctx, wide, 16));
  // Set without the router fold: an error naming the problem, before anything is recorded.
  vk::Buffer tile_b = vktest::make_buffer(g, same.bytes.size(), "tile");
  vk::Buffer any = vktest::make_buffer(g, 1 << 16, "any");
  vk::MoeGateUpOp gu;
  gu.tile = {&tile_b, 0, same.g};
  gu.n_used = 2;
  gu.routing.n_used = 2;
  gu.h = any.whole();
  gu.h2 = any.whole();
  gu.route = any.whole();
  gu.hq = any.whole();
  gu.down_acc = any.whole();
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  try {
    gu.record(rec);
    ADD_FAILURE() << "a fused down without the router fold was recorded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router fold"), std::string::npos) << e.what();
  }
  rec.end();
}

TEST(MoeFusedDown, NotOnTheSharedMemoryPath) {
  Gpu& g = vktest::gpu(true);
  VK_TEST_REQUIRE_GPU(g);
  std::mt19937 rng(18);
  const moetest::HostTile t = moetest::build_tile(rng, 8, 64, 64, 64, kQ4Tile);
  EXPECT_FALSE(vk::moe_fused_down_supported(*g.ctx, t.g, 2));
}

}  // namespace
}  // namespace tessera
