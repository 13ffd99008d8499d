// Router + routing (router.comp), the dense FFN ops (moe_gateup/moe_down in their dense form) and a
// whole MoE block as the decode step records it (router | gate-up | down, barriers between) against the
// CPU reference of forward.md §5 (cpu::rms_norm, cpu::route_token and double loops); the block's
// recording is resubmitted with a new residual stream, which must change the routing and the result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "tests/vulkan/test_moe_util.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using moetest::HostTile;
using vktest::Gpu;

std::vector<double> rms_norm_ref(const std::vector<float>& x, const std::vector<float>& w, float eps) {
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = double(x[i]) * inv * w[i];
  return y;
}

// The router against the CPU: logits and the normalized input it writes for the gate-up.
void run_router_case(Gpu& g, GgmlType type, uint32_t n_expert, uint32_t n_embd, uint32_t seed) {
  SCOPED_TRACE(cat("router ", type_name(type), " E", n_expert, " n_embd ", n_embd));
  std::mt19937 rng(seed);
  const std::vector<uint8_t> w = vktest::random_matrix(rng, type, n_expert, n_embd);
  auto dm = vktest::upload_matrix(g, type, n_expert, n_embd, w);
  const std::vector<float> x = vktest::random_values(rng, n_embd), nw = vktest::random_values(rng, n_embd);
  const float eps = 1e-5f;
  vk::Buffer xb = vktest::make_buffer(g, n_embd * 4, "x"), nb = vktest::make_buffer(g, n_embd * 4, "norm");
  vk::Buffer lb = vktest::make_buffer(g, n_expert * 4, "logits"), hb = vktest::make_buffer(g, n_embd * 4, "h2");
  const uint32_t K = std::min(n_expert, 4u);
  vk::Buffer rb = vktest::make_buffer(g, vk::moe_route_bytes(K), "route");
  vktest::upload_bytes(g, xb, x.data(), n_embd * 4);
  vktest::upload_bytes(g, nb, nw.data(), n_embd * 4);
  vktest::poison(g, lb);
  vktest::poison(g, hb);
  std::vector<uint32_t> route0(2 * K + 1, 0x7FC00000u);
  route0.back() = 0;  // arrival counter
  vktest::upload_bytes(g, rb, route0.data(), route0.size() * 4);
  ModelConfig cfg;
  cfg.n_expert = n_expert;
  cfg.n_expert_used = K;
  cfg.gating = GatingFunc::Softmax;

  vk::RouterOp op;
  op.w = dm->ref;
  op.x = xb.whole();
  op.norm_weight = nb.whole();
  op.eps = eps;
  op.logits = lb.whole();
  op.h2 = hb.whole();
  op.routing = vk::MoeRouting::from_config(cfg);
  op.route = rb.whole();
  const uint64_t elem = type == GgmlType::F32 ? 4 : 2;
  EXPECT_EQ(op.bytes(), uint64_t(n_expert) * n_embd * elem + uint64_t(n_embd) * 12 + n_expert * 8 + (2 * K + 1) * 4);
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  op.record(rec);
  rec.end();
  rec.run();

  const std::vector<double> h2 = rms_norm_ref(x, nw, eps);
  std::vector<double> tol_h(n_embd);
  for (uint32_t i = 0; i < n_embd; ++i) tol_h[i] = 1e-5 * std::fabs(h2[i]) + 1e-7;
  vktest::expect_close(vktest::download_floats(g, hb, n_embd), h2, tol_h, "h2");
  std::vector<double> want(n_expert, 0.0), tol(n_expert, 0.0);
  for (uint32_t e = 0; e < n_expert; ++e) {
    const std::vector<float> row = vktest::dequant_row(type, w, n_embd, e);
    double a = 0;
    for (uint32_t k = 0; k < n_embd; ++k) {
      want[e] += row[k] * h2[k];
      a += std::fabs(row[k] * h2[k]);
    }
    tol[e] = moetest::sum_tol(a, want[e]);
  }
  const std::vector<float> got = vktest::download_floats(g, lb, n_expert);
  vktest::expect_close(got, want, tol, "router logits");
  // The routing of the GPU's logits (the CPU's own logits could differ at a near-tie).
  const cpu::Route route = cpu::route_token(cfg, got, {});
  std::vector<uint32_t> words(2 * K + 1);
  g.transfer->download(rb, 0, words.data(), words.size() * 4);
  for (uint32_t k = 0; k < K; ++k) {
    EXPECT_EQ(words[2 * k], route.experts[k]) << "slot " << k;
    float w;
    std::memcpy(&w, &words[2 * k + 1], 4);
    EXPECT_NEAR(w, route.weights[k], 2e-6 * route.weights[k] + 1e-7) << "slot " << k;
  }
  EXPECT_EQ(words[2 * K], 0u) << "arrival counter reset";
}

TEST(MoeBlock, Router) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  run_router_case(g, GgmlType::F32, 64, 2080, 1);
  run_router_case(g, GgmlType::F32, 6, 96, 2);
  run_router_case(g, GgmlType::BF16, 64, 256, 3);
  run_router_case(g, GgmlType::F16, 8, 36, 4);
  Gpu& s = vktest::gpu(true);
  VK_TEST_REQUIRE_GPU(s);
  run_router_case(s, GgmlType::F32, 64, 2080, 5);
}

// Dense FFN: x += W_down (silu(W_gate xn) * (W_up xn)), xn = RMSNorm(x; ffn_norm).
// q8: the int8-activation path (hq set on both ops), against the same rounding on the CPU.
void run_dense_case(Gpu& g, GgmlType gu_type, GgmlType down_type, uint32_t n_embd, uint32_t n_ff, uint32_t seed,
                    bool q8 = false) {
  SCOPED_TRACE(cat("dense ", type_name(gu_type), "/", type_name(down_type), " n_embd ", n_embd, " F ", n_ff,
                   q8 ? " q8act" : ""));
  std::mt19937 rng(seed);
  const std::vector<uint8_t> gate = vktest::random_matrix(rng, gu_type, n_ff, n_embd);
  const std::vector<uint8_t> up = vktest::random_matrix(rng, gu_type, n_ff, n_embd);
  const std::vector<uint8_t> down = vktest::random_matrix(rng, down_type, n_embd, n_ff);
  // Gate and up in one buffer (as in a .tsr layer span), the up matrix first, 256-aligned.
  const bool split = vk::split1_supported(gu_type);
  std::vector<uint8_t> gb = split ? vk::split1_from_gguf(gu_type, n_ff, n_embd, gate.data()) : gate;
  std::vector<uint8_t> ub = split ? vk::split1_from_gguf(gu_type, n_ff, n_embd, up.data()) : up;
  const uint64_t up_at = 0, gate_at = (ub.size() + 255) / 256 * 256;
  vk::Buffer wb = vktest::make_buffer(g, gate_at + (gb.size() + 255) / 256 * 256, "gate+up");
  vktest::upload_bytes(g, wb, ub.data(), ub.size(), up_at);
  vktest::upload_bytes(g, wb, gb.data(), gb.size(), gate_at);
  auto dm = vktest::upload_matrix(g, down_type, n_embd, n_ff, down);
  const vk::WeightLayout layout = split ? vk::WeightLayout::Split1 : vk::WeightLayout::Plain;

  const std::vector<float> x0 = vktest::random_values(rng, n_embd), nw = vktest::random_values(rng, n_embd);
  const float eps = 1e-6f;
  vk::Buffer xb = vktest::make_buffer(g, n_embd * 4, "x"), nb = vktest::make_buffer(g, n_embd * 4, "norm");
  vk::Buffer hb = vktest::make_buffer(g, n_ff * 4, "h");
  vk::Buffer hqb = vktest::make_buffer(g, vk::dense_hq_bytes(n_ff), "hq");
  vktest::upload_bytes(g, xb, x0.data(), n_embd * 4);
  vktest::upload_bytes(g, nb, nw.data(), n_embd * 4);
  vktest::poison(g, hb);
  vktest::poison(g, hqb);

  vk::DenseGateUpOp gu;
  gu.gate = {&wb, gate_at, gu_type, layout, n_ff, n_embd};
  gu.up = {&wb, up_at, gu_type, layout, n_ff, n_embd};
  gu.x = xb.whole();
  gu.norm_weight = nb.whole();
  gu.eps = eps;
  gu.h = hb.whole();
  vk::DenseDownOp dd;
  dd.down = dm->ref;
  dd.h = hb.whole();
  dd.x = xb.whole();
  if (q8) {
    EXPECT_TRUE(vk::dense_q8_usable(*g.ctx, gu.gate, dd.down));
    gu.hq = dd.hq = hqb.whole();
  }
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  gu.record(rec);
  rec.barrier();
  dd.record(rec);
  rec.end();
  rec.run();

  std::vector<double> xn_d = rms_norm_ref(x0, nw, eps);
  if (q8) {  // the kernel quantizes x * norm weight, then scales the dot products by 1/rms
    double ss = 0;
    for (float v : x0) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / n_embd + eps);
    std::vector<double> xw(n_embd);
    for (uint32_t k = 0; k < n_embd; ++k) xw[k] = double(x0[k]) * nw[k];
    xn_d = vktest::q8_round(xw);
    for (double& v : xn_d) v *= inv;
  }
  const double rel = q8 ? 1e-4 : 2e-5;
  std::vector<double> hw, ht;
  moetest::ref_gateup([&](uint32_t i) { return vktest::dequant_row(gu_type, gate, n_embd, i); },
                      [&](uint32_t i) { return vktest::dequant_row(gu_type, up, n_embd, i); }, n_ff, xn_d, hw, ht, rel);
  for (double& t : ht) t *= 2;  // the kernel applies 1/rms after the dot products
  const std::vector<float> h = vktest::download_floats(g, hb, n_ff);
  vktest::expect_close(h, hw, ht, "dense h");
  std::vector<double> want(x0.begin(), x0.end()), abs(n_embd, 0.0), tol(n_embd);
  std::vector<double> hd(h.begin(), h.end());
  if (q8) hd = vktest::q8_round(hd);  // the down kernel reads the gate-up's int8 copy of h
  moetest::ref_down_add([&](uint32_t r) { return vktest::dequant_row(down_type, down, n_ff, r); }, n_embd, 1.0, hd.data(),
                        want, abs);
  for (uint32_t r = 0; r < n_embd; ++r) tol[r] = moetest::sum_tol(abs[r], want[r], rel);
  vktest::expect_close(vktest::download_floats(g, xb, n_embd), want, tol, "x after the dense FFN");
}

TEST(MoeBlock, DenseFfn) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  run_dense_case(g, GgmlType::Q4_K, GgmlType::Q6_K, 256, 512, 10);  // GLM Q4_K_M layer 0 shape of types
  run_dense_case(g, GgmlType::Q4_0, GgmlType::Q8_0, 96, 160, 11);
  run_dense_case(g, GgmlType::BF16, GgmlType::F32, 96, 72, 12);
  run_dense_case(g, GgmlType::F16, GgmlType::F16, 36, 20, 13);  // scalar plain paths
  Gpu& s = vktest::gpu(true);
  VK_TEST_REQUIRE_GPU(s);
  run_dense_case(s, GgmlType::Q5_K, GgmlType::Q5_1, 256, 96, 14);
}

// The dense FFN on the int8-activation path: the Q4_K_M shape of types (Q4_K gate/up, Q6_K down),
// Q6_K gate/up, Q6_K next to 32-element types, the shared-memory path; an FFN wider than 256
// blocks of 32 (8224: 2 blocks per workgroup, the last workgroup with one).
TEST(MoeBlock, DenseFfnInt8Activations) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_usable(*g.ctx, GgmlType::Q4_0, 64)) GTEST_SKIP() << "no integer dot product";
  run_dense_case(g, GgmlType::Q4_K, GgmlType::Q6_K, 256, 512, 20, true);
  run_dense_case(g, GgmlType::Q6_K, GgmlType::Q6_K, 512, 256, 21, true);
  run_dense_case(g, GgmlType::Q4_0, GgmlType::Q6_K, 96, 768, 22, true);
  run_dense_case(g, GgmlType::Q6_K, GgmlType::Q8_0, 256, 160, 23, true);
  run_dense_case(g, GgmlType::Q4_0, GgmlType::Q8_0, 64, 8224, 25, true);
  Gpu& s = vktest::gpu(true);
  VK_TEST_REQUIRE_GPU(s);
  run_dense_case(s, GgmlType::Q4_0, GgmlType::Q4_0, 64, 8224, 27, true);
  run_dense_case(s, GgmlType::Q4_K, GgmlType::Q6_K, 256, 256, 24, true);
}

// One MoE block recorded once (router | gate-up | down) and run for two different residual
// streams: each run must match the CPU's full forward.md section 5.2 math for its input.
TEST(MoeBlock, RecordedBlockFollowsTheResidualStream) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const uint32_t E = 16, K = 4, n_embd = 256, w = 64;
  std::mt19937 rng(20);
  const HostTile ht = moetest::build_tile(rng, E, w, 2 * w, n_embd, {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_0});
  ModelConfig cfg;
  cfg.n_expert = E;
  cfg.n_expert_used = K;
  cfg.gating = GatingFunc::Sigmoid;
  cfg.expert_weights_norm = true;
  cfg.expert_weights_scale = 2.5f;
  const float eps = 1e-5f;
  std::vector<float> router = vktest::random_values(rng, size_t(E) * n_embd, 0.05f);
  std::vector<float> nw = vktest::random_values(rng, n_embd), bias = vktest::random_values(rng, E, 0.02f);

  vk::Buffer tile_b = vktest::make_buffer(g, ht.bytes.size(), "tile");
  vktest::upload_bytes(g, tile_b, ht.bytes.data(), ht.bytes.size());
  vk::Buffer rb = vktest::make_buffer(g, router.size() * 4, "router");
  vktest::upload_bytes(g, rb, router.data(), router.size() * 4);
  vk::Buffer nb = vktest::make_buffer(g, n_embd * 4, "ffn_norm"), bb = vktest::make_buffer(g, E * 4, "bias");
  vktest::upload_bytes(g, nb, nw.data(), n_embd * 4);
  vktest::upload_bytes(g, bb, bias.data(), E * 4);
  vk::Buffer xb = vktest::make_buffer(g, n_embd * 4, "x"), h2b = vktest::make_buffer(g, n_embd * 4, "h2");
  vk::Buffer lb = vktest::make_buffer(g, E * 4, "logits"), routeb = vktest::make_buffer(g, vk::moe_route_bytes(K), "route");
  const std::vector<uint32_t> zeros(2 * K + 1, 0);
  vktest::upload_bytes(g, routeb, zeros.data(), zeros.size() * 4);
  vk::Buffer hb = vktest::make_buffer(g, vk::moe_h_floats(ht.g, K) * 4, "h");

  vk::RouterOp ro;
  ro.w = {&rb, 0, GgmlType::F32, vk::WeightLayout::Plain, E, n_embd};
  ro.x = xb.whole();
  ro.norm_weight = nb.whole();
  ro.eps = eps;
  ro.logits = lb.whole();
  ro.h2 = h2b.whole();
  ro.routing = vk::MoeRouting::from_config(cfg);
  ro.bias = bb.whole();
  ro.route = routeb.whole();
  vk::MoeGateUpOp gu;
  gu.tile = {&tile_b, 0, ht.g};
  gu.n_used = K;
  gu.h2 = h2b.whole();
  gu.route = routeb.whole();
  gu.h = hb.whole();
  vk::MoeDownOp dn;
  dn.tile = gu.tile;
  dn.n_used = K;
  dn.h = hb.whole();
  dn.route = routeb.whole();
  dn.x = xb.whole();
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  ro.record(rec);
  rec.barrier();
  gu.record(rec);
  rec.barrier();
  dn.record(rec);
  rec.end();
  EXPECT_EQ(rec.dispatch_count(), 3u);
  EXPECT_EQ(rec.barrier_count(), 2u);

  std::vector<std::vector<uint32_t>> chosen;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(cat("run ", run));
    const std::vector<float> x0 = vktest::random_values(rng, n_embd);
    vktest::upload_bytes(g, xb, x0.data(), n_embd * 4);
    vktest::poison(g, hb);
    vktest::poison(g, h2b);
    rec.run();

    // CPU: h2, logits, routing, experts.
    const std::vector<double> h2d = rms_norm_ref(x0, nw, eps);
    const std::vector<float> h2(h2d.begin(), h2d.end());
    std::vector<float> logits(E);
    for (uint32_t e = 0; e < E; ++e) {
      double s = 0;
      for (uint32_t k = 0; k < n_embd; ++k) s += double(router[size_t(e) * n_embd + k]) * h2[k];
      logits[e] = float(s);
    }
    const cpu::Route route = cpu::route_token(cfg, logits, bias);
    chosen.push_back(route.experts);
    const std::vector<float> rw = vktest::download_floats(g, routeb, K * 2);
    for (uint32_t k = 0; k < K; ++k) {
      uint32_t id;
      std::memcpy(&id, &rw[2 * k], 4);
      EXPECT_EQ(id, route.experts[k]) << "slot " << k;
    }
    std::vector<double> want(x0.begin(), x0.end()), abs(n_embd, 0.0);
    for (uint32_t k = 0; k <= K; ++k) {
      const uint32_t slot = k < K ? route.experts[k] : E;
      std::vector<double> hk, tol;
      moetest::ref_gateup([&](uint32_t i) { return ht.row(slot, MoePart::Gate, i); },
                          [&](uint32_t i) { return ht.row(slot, MoePart::Up, i); }, uint32_t(ht.g.width(slot)),
                          std::vector<double>(h2.begin(), h2.end()), hk, tol);
      moetest::ref_down_add([&](uint32_t r) { return ht.row(slot, MoePart::Down, r); }, n_embd,
                            k < K ? route.weights[k] : 1.0, hk.data(), want, abs);
    }
    std::vector<double> tol(n_embd);
    for (uint32_t r = 0; r < n_embd; ++r) tol[r] = 1e-4 * abs[r] + 1e-5;
    vktest::expect_close(vktest::download_floats(g, xb, n_embd), want, tol, "x after the MoE block");
  }
  EXPECT_NE(chosen[0], chosen[1]) << "the two inputs should route to different experts";
}

}  // namespace
}  // namespace tessera
