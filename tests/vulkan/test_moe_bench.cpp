// GPU timing of the router / MoE / sampling kernels at GLM-4.7-Flash shapes (n_embd 2048, 64
// experts of width 1536, 4 used + 1 shared, vocabulary 154880). DISABLED_ by default (CI runs on
// lavapipe, where timings mean nothing); on the GPU machine:
//   test_vulkan --gtest_also_run_disabled_tests --gtest_filter='MoeBench.*'
// Weights are filled on the GPU with a constant byte pattern (valid quant blocks; the values do not
// change the work), one copy per simulated block so they stream from memory, not from cache.
// Two figures: per kernel from GPU timestamps (each dispatch's time includes the barrier before
// it), and the wall time of whole submissions without timestamps, per block.
//
// Measured 2026-11-22 on an NVIDIA H200 (driver 580.159), best of 10 submissions of 48 blocks:
//   Q4_0     router 10.8 us | gate-up 28.6 us (17.7 MB) | down 23.3 us (8.9 MB) | block 62.7 us wall
//   Q4_K/Q6_K router 10.9   | gate-up 28.5 (17.7 MB)    | down 20.8 (13.0 MB)   | block 60.0
//   Q8_0     router 11.5    | gate-up 29.7 (33.5 MB)    | down 24.1 (16.8 MB)   | block 65.7
//   routing per workgroup (no route buffer), Q4_0: router 6.5 | gate-up 31.5 | down 25.9 | 64.1
//   same bytes without routing: dense gate-up 27.0 (norm fused: 44.8), generic MatvecOp 18.3
//   argmax 8.7 us, sampling k=40 96.5 us (vocabulary 154880)
// The time hardly depends on the bytes (Q8_0 moves twice Q4_0's in the same time) nor on the
// MoeTuning variants: these kernels (and the generic matvec) are latency-bound, far from the
// 4.5 TB/s the memory allows; a faster design needs loads software-pipelined across loop
// iterations and fewer live registers (more resident warps).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>

#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/kernels_sample.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

// Per label: average microseconds per call over the best of `runs` submissions (the GPU clocks
// up during the first ones), bytes per call and GB/s.
void print_kernel_times(vk::CommandRecorder& rec, int runs = 10) {
  struct Acc {
    double us = 0;
    uint64_t bytes = 0;
    int n = 0;
  };
  std::map<std::string, Acc> best;
  for (int run = 0; run < runs; ++run) {
    rec.run();
    std::map<std::string, Acc> by;
    for (const vk::DispatchTiming& t : rec.timings()) {
      Acc& a = by[t.label];
      a.us += t.microseconds;
      a.bytes += t.bytes;
      ++a.n;
    }
    for (const auto& [label, a] : by)
      if (!best.count(label) || a.us < best[label].us) best[label] = a;
  }
  std::printf("  %-28s %6s %10s %10s %9s\n", "kernel (timestamps)", "calls", "us/call", "MB/call", "GB/s");
  for (const auto& [label, a] : best)
    std::printf("  %-28s %6d %10.2f %10.2f %9.1f\n", label.c_str(), a.n, a.us / a.n, a.bytes / 1e6 / a.n,
                a.bytes / 1e3 / a.us);
}

// Records `blocks` calls of `block` (each followed by its own barriers) twice: with timestamps for
// the per-kernel table, without for the wall time per block (best of 10 submissions).
void bench(const char* title, uint32_t blocks, const std::function<void(vk::CommandRecorder&, uint32_t)>& block) {
  Gpu& g = vktest::gpu();
  std::printf("%s\n", title);
  vk::CommandRecorder timed(*g.ctx, {.timestamps = true});
  timed.begin();
  for (uint32_t b = 0; b < blocks; ++b) block(timed, b);
  timed.end();
  print_kernel_times(timed);
  vk::CommandRecorder plain(*g.ctx);
  plain.begin();
  for (uint32_t b = 0; b < blocks; ++b) block(plain, b);
  plain.end();
  double best = 1e30;
  for (int run = 0; run < 10; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    plain.run();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("  wall: %.2f us per block (%u blocks, %u dispatches, %u barriers per submission)\n", best / blocks,
              blocks, plain.dispatch_count(), plain.barrier_count());
}

constexpr uint32_t kEmbd = 2048, kExperts = 64, kUsed = 4, kWidth = 1536, kCopies = 8, kBlocks = 48;

void bench_moe(GgmlType gu_type, GgmlType down_type, vk::MoeTuning tuning = {}, bool per_wg_routing = false) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const MoeTileGeometry geo =
      moe_tile_geometry(kExperts, kWidth, kWidth, kEmbd, gu_type, down_type, gu_type, down_type);
  std::vector<vk::Buffer> tiles;
  for (uint32_t l = 0; l < kCopies; ++l) tiles.push_back(vktest::make_buffer(g, geo.total_bytes, cat("tile ", l)));
  // The same bytes as dense FFN matrices (no routing) and as one generic matvec, for comparison.
  const uint32_t f = 5 * kWidth;
  const vk::WeightLayout lay = vk::WeightLayout::Split1;
  const uint64_t gu_bytes = vk::split1_bytes(gu_type, f, kEmbd), dn_bytes = vk::split1_bytes(down_type, kEmbd, f);
  std::vector<vk::Buffer> dense;
  for (uint32_t l = 0; l < kCopies; ++l) dense.push_back(vktest::make_buffer(g, 2 * gu_bytes + dn_bytes, cat("dense ", l)));
  vk::Buffer router = vktest::make_buffer(g, uint64_t(kExperts) * kEmbd * 4, "router");
  vk::Buffer x = vktest::make_buffer(g, kEmbd * 4, "x"), norm = vktest::make_buffer(g, kEmbd * 4, "norm");
  vk::Buffer h2 = vktest::make_buffer(g, kEmbd * 4, "h2"), logits = vktest::make_buffer(g, kExperts * 4, "logits");
  vk::Buffer bias = vktest::make_buffer(g, kExperts * 4, "bias");
  vk::Buffer route = vktest::make_buffer(g, vk::moe_route_bytes(kUsed), "route");
  vk::Buffer h = vktest::make_buffer(g, std::max<uint64_t>(vk::moe_h_floats(geo, kUsed), f) * 4, "h");
  vk::Buffer y = vktest::make_buffer(g, 2 * f * 4, "y");
  {
    vk::CommandRecorder init(*g.ctx);
    init.begin();
    for (vk::Buffer& t : tiles) init.fill(t.whole(), 0x11111111u);  // q nibbles 1, fp16 scales 0x1111
    for (vk::Buffer& t : dense) init.fill(t.whole(), 0x11111111u);
    init.fill(router.whole(), 0x3c000000u);  // ~0.0078: equal logits, experts 0..3 chosen
    init.fill(x.whole(), 0x3f800000u);
    init.fill(norm.whole(), 0x3f800000u);
    init.fill(bias.whole(), 0);
    init.fill(route.whole(), 0);
    init.end();
    init.run();
  }
  ModelConfig cfg;
  cfg.n_expert = kExperts;
  cfg.n_expert_used = kUsed;
  cfg.gating = GatingFunc::Sigmoid;
  cfg.expert_weights_norm = true;
  cfg.expert_weights_scale = 1.8f;

  bench(cat("GLM MoE block (router | gate-up | down), ", type_name(gu_type), "/", type_name(down_type), ", unroll ",
            tuning.unroll, " teams ", tuning.gateup_teams, " down rows ", tuning.down_rows,
            per_wg_routing ? ", routing per workgroup" : "")
            .c_str(),
        kBlocks, [&](vk::CommandRecorder& rec, uint32_t b) {
          vk::RouterOp ro;
          ro.w = {&router, 0, GgmlType::F32, vk::WeightLayout::Plain, kExperts, kEmbd};
          ro.x = x.whole();
          ro.norm_weight = norm.whole();
          ro.logits = logits.whole();
          ro.h2 = h2.whole();
          ro.routing = vk::MoeRouting::from_config(cfg);
          ro.bias = bias.whole();
          if (!per_wg_routing) ro.route = route.whole();
          ro.label = "router";
          ro.record(rec);
          rec.barrier();
          vk::MoeGateUpOp gu;
          gu.tile = {&tiles[b % kCopies], 0, geo};
          gu.n_used = kUsed;
          gu.h2 = h2.whole();
          if (per_wg_routing) {
            gu.routing = ro.routing;
            gu.logits = logits.whole();
            gu.bias = bias.whole();
          } else {
            gu.route = route.whole();
          }
          gu.h = h.whole();
          gu.label = cat("moe_gateup.", type_name(gu_type));
          gu.tuning = tuning;
          gu.record(rec);
          rec.barrier();
          vk::MoeDownOp dn;
          dn.tile = gu.tile;
          dn.n_used = kUsed;
          dn.h = h.whole();
          dn.route = gu.route;
          dn.routing = gu.routing;
          dn.logits = gu.logits;
          dn.bias = gu.bias;
          dn.x = x.whole();
          dn.label = cat("moe_down.", type_name(down_type));
          dn.tuning = tuning;
          dn.record(rec);
          rec.barrier();
        });
  if (tuning.unroll != 0 || per_wg_routing) return;
  bench("  same bytes, no routing: dense gate-up | dense down | generic matvec (gate rows)", kBlocks,
        [&](vk::CommandRecorder& rec, uint32_t b) {
          const vk::Buffer& d = dense[b % kCopies];
          vk::DenseGateUpOp dg;
          dg.gate = {&d, 0, gu_type, lay, f, kEmbd};
          dg.up = {&d, gu_bytes, gu_type, lay, f, kEmbd};
          dg.x = x.whole();
          dg.norm_weight = norm.whole();
          dg.h = h.whole();
          dg.label = "dense_gateup (norm fused)";
          dg.record(rec);
          rec.barrier();
          dg.x = h2.whole();
          dg.norm_weight = {};
          dg.label = "dense_gateup (input h2)";
          dg.record(rec);
          rec.barrier();
          vk::DenseDownOp dd;
          dd.down = {&d, 2 * gu_bytes, down_type, lay, kEmbd, f};
          dd.h = h.whole();
          dd.x = x.whole();
          dd.label = "dense_down";
          dd.record(rec);
          rec.barrier();
          vk::MatvecOp mv;
          mv.w = {&d, 0, gu_type, lay, 2 * f, kEmbd};
          mv.x = h2.whole();
          mv.y = y.whole();
          mv.label = "matvec (2F x n_embd)";
          mv.record(rec);
          rec.barrier();
        });
}

TEST(MoeBench, DISABLED_GlmMoeBlockQ4_0) {
  bench_moe(GgmlType::Q4_0, GgmlType::Q4_0);
  bench_moe(GgmlType::Q4_0, GgmlType::Q4_0, {}, true);
  bench_moe(GgmlType::Q4_0, GgmlType::Q4_0, {1, 4, 2});
  bench_moe(GgmlType::Q4_0, GgmlType::Q4_0, {2, 8, 4});
}
TEST(MoeBench, DISABLED_GlmMoeBlockQ4_K_Q6_K) { bench_moe(GgmlType::Q4_K, GgmlType::Q6_K); }
TEST(MoeBench, DISABLED_GlmMoeBlockQ8_0) { bench_moe(GgmlType::Q8_0, GgmlType::Q8_0); }

TEST(MoeBench, DISABLED_SampleGlmVocab) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const uint32_t V = 154880;
  vk::Buffer logits = vktest::make_buffer(g, uint64_t(V) * 4, "logits");
  vk::Buffer scratch = vktest::make_buffer(g, vk::SampleOp::scratch_bytes(V), "scratch");
  vk::Buffer step = vktest::make_buffer(g, 16, "step", true);
  std::mt19937 rng(1);
  const std::vector<float> l = vktest::random_values(rng, V);
  vktest::upload_bytes(g, logits, l.data(), l.size() * 4);
  const std::vector<uint32_t> zeros(scratch.size() / 4 + 4, 0);
  vktest::upload_bytes(g, scratch, zeros.data(), scratch.size());
  vktest::upload_bytes(g, step, zeros.data(), 16);
  for (const vk::SampleParams& p : {vk::SampleParams{0.f, 1, 1.f, 0.f, 0}, vk::SampleParams{0.8f, 40, 0.95f, 0.05f, 1}})
    bench(p.temperature > 0 ? "sampling k=40, vocabulary 154880" : "argmax, vocabulary 154880", 20,
          [&](vk::CommandRecorder& rec, uint32_t) {
            vk::SampleOp op;
            op.n_vocab = V;
            op.params = p;
            op.logits = logits.whole();
            op.scratch = scratch.whole();
            op.step = step.whole();
            op.record(rec);
            rec.barrier();
          });
}

}  // namespace
}  // namespace tessera
