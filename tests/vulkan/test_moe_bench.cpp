// GPU timing of the router / MoE / sampling kernels at GLM-4.7-Flash shapes (n_embd 2048, 64
// experts of width 1536, 4 used + 1 shared, vocabulary 154880). DISABLED_ by default (CI runs on
// lavapipe, where timings mean nothing); on the GPU machine:
//   test_vulkan --gtest_also_run_disabled_tests --gtest_filter='MoeBench.*'
// Tiles are filled on the GPU with a constant byte pattern (valid quant blocks; the values do not
// change the work), one tile per simulated block so the weights stream from memory, not cache.
// Prints per kernel: average microseconds per call (including the barrier before it) and GB/s
// from the bytes each op declares.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/kernels_sample.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

void print_timings(const vk::CommandRecorder& rec, const char* title) {
  struct Acc {
    double us = 0;
    uint64_t bytes = 0;
    int n = 0;
  };
  std::map<std::string, Acc> by;
  for (const vk::DispatchTiming& t : rec.timings()) {
    Acc& a = by[t.label];
    a.us += t.microseconds;
    a.bytes += t.bytes;
    ++a.n;
  }
  std::printf("%s\n  %-28s %6s %10s %10s %9s\n", title, "kernel", "calls", "us/call", "MB/call", "GB/s");
  for (const auto& [label, a] : by)
    std::printf("  %-28s %6d %10.2f %10.2f %9.1f\n", label.c_str(), a.n, a.us / a.n, a.bytes / 1e6 / a.n,
                a.bytes / 1e3 / a.us);
}

void bench_moe(GgmlType gu_type, GgmlType down_type, const std::string& title, vk::MoeTuning tuning = {}) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  const uint32_t n_embd = 2048, E = 64, K = 4, w = 1536, layers = 8, repeats = 6;
  const MoeTileGeometry geo = moe_tile_geometry(E, w, w, n_embd, gu_type, down_type, gu_type, down_type);
  const uint64_t tile_stride = (geo.total_bytes + 4095) / 4096 * 4096;
  std::vector<vk::Buffer> tiles;
  for (uint32_t l = 0; l < layers; ++l) tiles.push_back(vktest::make_buffer(g, tile_stride, cat("tile ", l)));
  vk::Buffer router = vktest::make_buffer(g, uint64_t(E) * n_embd * 4, "router");
  vk::Buffer x = vktest::make_buffer(g, n_embd * 4, "x"), norm = vktest::make_buffer(g, n_embd * 4, "norm");
  vk::Buffer h2 = vktest::make_buffer(g, n_embd * 4, "h2"), logits = vktest::make_buffer(g, E * 4, "logits");
  vk::Buffer bias = vktest::make_buffer(g, E * 4, "bias");
  vk::Buffer h = vktest::make_buffer(g, vk::moe_h_floats(geo, K) * 4, "h");
  {
    vk::CommandRecorder init(*g.ctx);
    init.begin();
    for (vk::Buffer& t : tiles) init.fill(t.whole(), 0x11111111u);  // q nibbles 1, fp16 scales 0x1111
    init.fill(router.whole(), 0x3c000000u);                          // ~0.0078
    init.fill(x.whole(), 0x3f800000u);
    init.fill(norm.whole(), 0x3f800000u);
    init.fill(bias.whole(), 0);
    init.end();
    init.run();
  }
  ModelConfig cfg;
  cfg.n_expert = E;
  cfg.n_expert_used = K;
  cfg.gating = GatingFunc::Sigmoid;
  cfg.expert_weights_norm = true;
  cfg.expert_weights_scale = 1.8f;

  vk::CommandRecorder rec(*g.ctx, {.timestamps = true});
  rec.begin();
  for (uint32_t r = 0; r < repeats; ++r)
    for (uint32_t l = 0; l < layers; ++l) {
      vk::RouterOp ro;
      ro.w = {&router, 0, GgmlType::F32, vk::WeightLayout::Plain, E, n_embd};
      ro.x = x.whole();
      ro.norm_weight = norm.whole();
      ro.logits = logits.whole();
      ro.h2 = h2.whole();
      ro.label = "router";
      ro.record(rec);
      rec.barrier();
      vk::MoeGateUpOp gu;
      gu.tile = {&tiles[l], 0, geo};
      gu.routing = vk::MoeRouting::from_config(cfg);
      gu.h2 = h2.whole();
      gu.logits = logits.whole();
      gu.bias = bias.whole();
      gu.h = h.whole();
      gu.label = cat("moe_gateup.", type_name(gu_type));
      gu.tuning = tuning;
      gu.record(rec);
      rec.barrier();
      vk::MoeDownOp dn;
      dn.tile = gu.tile;
      dn.routing = gu.routing;
      dn.h = h.whole();
      dn.logits = logits.whole();
      dn.bias = bias.whole();
      dn.x = x.whole();
      dn.label = cat("moe_down.", type_name(down_type));
      dn.tuning = tuning;
      dn.record(rec);
      rec.barrier();
    }
  rec.end();
  rec.run();  // warm-up
  rec.run();
  print_timings(rec, title.c_str());
}

TEST(MoeBench, DISABLED_GlmMoeBlockQ4_0) {
  bench_moe(GgmlType::Q4_0, GgmlType::Q4_0, "GLM MoE block, Q4_0 (default tuning)");
  // Work-split alternatives (MoeTuning): unroll, gate-up outputs per workgroup, down rows per workgroup.
  for (const vk::MoeTuning& t : {vk::MoeTuning{1, 4, 2}, vk::MoeTuning{2, 2, 1}, vk::MoeTuning{2, 8, 4},
                                 vk::MoeTuning{1, 8, 1}})
    bench_moe(GgmlType::Q4_0, GgmlType::Q4_0,
              cat("GLM MoE block, Q4_0, unroll ", t.unroll, ", gate-up teams ", t.gateup_teams, ", down rows ", t.down_rows), t);
}
TEST(MoeBench, DISABLED_GlmMoeBlockQ4_K_Q6_K) { bench_moe(GgmlType::Q4_K, GgmlType::Q6_K, "GLM MoE block, Q4_K/Q6_K"); }
TEST(MoeBench, DISABLED_GlmMoeBlockQ8_0) { bench_moe(GgmlType::Q8_0, GgmlType::Q8_0, "GLM MoE block, Q8_0"); }

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
  vk::CommandRecorder rec(*g.ctx, {.timestamps = true});
  rec.begin();
  for (int i = 0; i < 20; ++i) {
    for (const vk::SampleParams& p :
         {vk::SampleParams{0.f, 1, 1.f, 0.f, 0}, vk::SampleParams{0.8f, 40, 0.95f, 0.05f, 1}}) {
      vk::SampleOp op;
      op.n_vocab = V;
      op.params = p;
      op.logits = logits.whole();
      op.scratch = scratch.whole();
      op.step = step.whole();
      op.label = p.temperature > 0 ? "sample k40" : "argmax";
      if (i || p.temperature > 0) rec.barrier();
      op.record(rec);
    }
  }
  rec.end();
  rec.run();
  rec.run();
  print_timings(rec, "sampling, vocabulary 154880");
}

}  // namespace
}  // namespace tessera
