// Routing (router.comp in its routing-only form, routing.glsl), MoE gate-up (moe_gateup.comp) and
// down (moe_down.comp) on MOE_TILE1 tiles against the CPU: cpu::route_token for the routing and the
// double-precision loops of test_moe_util.h for the experts. GLM style (sigmoid + bias + norm +
// scale 1.8) and DeepSeek-V2 style (softmax) routing, ties, awkward sizes, every tile type for
// gate-up and down (mixed routed/shared types included), slot-range bindings, the shared-memory
// reduction path; h and the route output poisoned with NaN before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "tests/vulkan/test_moe_util.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using moetest::HostTile;
using moetest::TileTypes;
using vktest::Gpu;

enum class Style { Glm, V2 };

struct TileCase {
  uint32_t n_expert, n_used, w_routed, w_shared, n_embd;
  TileTypes types;
  Style style = Style::Glm;
  uint64_t max_binding_bytes = 0;
  bool no_subgroup = false;
  std::vector<float> logits;  // empty = distinct random logits
  bool per_workgroup_routing = false;  // no route buffer: the expert kernels route themselves
  bool q8 = false;                     // the int8-activation path (hq set on both kernels)
  bool gated_down = false;             // the down's early-start kernel (its gate words found open)
  bool down_late = true;               // MoeTuning::down_late (32-element types: the late path)
  uint32_t gateup_outs = 0;            // MoeTuning::q8_gateup_outs (all loads first, N outputs a pass)
  uint32_t down_first = 0;             // MoeTuning::down_first_rows (the down's loads first, N rows a pass)
};

TileCase make_case(uint32_t n_expert, uint32_t n_used, uint32_t w_routed, uint32_t w_shared, uint32_t n_embd,
                   TileTypes types, Style style, bool no_subgroup = false) {
  TileCase c;
  c.n_expert = n_expert;
  c.n_used = n_used;
  c.w_routed = w_routed;
  c.w_shared = w_shared;
  c.n_embd = n_embd;
  c.types = types;
  c.style = style;
  c.no_subgroup = no_subgroup;
  return c;
}

std::string describe(const TileCase& c) {
  return cat("E", c.n_expert, " K", c.n_used, " w", c.w_routed, "/", c.w_shared, " n_embd ", c.n_embd, " ",
             type_name(c.types.gateup), "/", type_name(c.types.down), " shared ", type_name(c.types.shared_gateup), "/",
             type_name(c.types.shared_down), c.style == Style::Glm ? " glm" : " v2",
             c.max_binding_bytes ? cat(" binding<=", c.max_binding_bytes) : "", c.no_subgroup ? " no-subgroup" : "",
             c.per_workgroup_routing ? " routing per workgroup" : "", c.q8 ? " q8act" : "",
             c.down_first ? cat(" down_first ", c.down_first) : "");
}

ModelConfig routing_config(const TileCase& c) {
  ModelConfig m;
  m.n_expert = c.n_expert;
  m.n_expert_used = c.n_used;
  if (c.style == Style::Glm) {
    m.gating = GatingFunc::Sigmoid;
    m.expert_weights_norm = true;
    m.expert_weights_scale = 1.8f;
    m.has_exp_probs_b = true;
  } else {
    m.gating = GatingFunc::Softmax;
    m.expert_weights_norm = false;
    m.expert_weights_scale = 1.0f;
  }
  return m;
}

// Distinct logits (steps of 0.15, shuffled) so that no two experts are near a tie.
std::vector<float> distinct_logits(std::mt19937& rng, uint32_t n) {
  std::vector<float> v(n);
  for (uint32_t e = 0; e < n; ++e) v[e] = (float(e) - float(n) / 2) * 0.15f;
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

struct Outcome {
  std::vector<uint32_t> ids;
  std::vector<float> weights;
  uint32_t dispatches = 0, barriers = 0;
};

Outcome run_tile_case(const TileCase& c, uint32_t seed) {
  Gpu& g = vktest::gpu(c.no_subgroup);
  Outcome out;
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  const HostTile ht = moetest::build_tile(rng, c.n_expert, c.w_routed, c.w_shared, c.n_embd, c.types);
  const MoeTileGeometry& geo = ht.g;
  const ModelConfig cfg = routing_config(c);
  const bool has_bias = c.style == Style::Glm;

  const std::vector<float> h2 = vktest::random_values(rng, c.n_embd, 0.5f);
  const std::vector<float> logits = c.logits.empty() ? distinct_logits(rng, c.n_expert) : c.logits;
  std::vector<float> bias;
  if (has_bias) {
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (uint32_t e = 0; e < c.n_expert; ++e) bias.push_back(c.logits.empty() ? u(rng) : 0.f);
  }
  const std::vector<float> x0 = vktest::random_values(rng, c.n_embd);
  const cpu::Route route = cpu::route_token(cfg, logits, bias);

  // Device buffers; the tile sits at a non-zero offset.
  const uint64_t tile_offset = 512;
  vk::Buffer tile_b = vktest::make_buffer(g, tile_offset + ht.bytes.size(), "tile");
  vktest::upload_bytes(g, tile_b, ht.bytes.data(), ht.bytes.size(), tile_offset);
  vk::Buffer h2_b = vktest::make_buffer(g, h2.size() * 4, "h2");
  vktest::upload_bytes(g, h2_b, h2.data(), h2.size() * 4);
  vk::Buffer logit_b = vktest::make_buffer(g, logits.size() * 4, "logits");
  vktest::upload_bytes(g, logit_b, logits.data(), logits.size() * 4);
  vk::Buffer bias_b = vktest::make_buffer(g, std::max<size_t>(bias.size(), 1) * 4, "bias");
  if (has_bias) vktest::upload_bytes(g, bias_b, bias.data(), bias.size() * 4);
  const uint64_t h_floats = vk::moe_h_floats(geo, c.n_used);
  vk::Buffer h_b = vktest::make_buffer(g, h_floats * 4, "h");
  vktest::poison(g, h_b);
  vk::Buffer route_b = vktest::make_buffer(g, vk::moe_route_bytes(c.n_used), "route");
  vktest::poison(g, route_b);
  const uint32_t zero = 0;
  vktest::upload_bytes(g, route_b, &zero, 4, 8ull * c.n_used);  // the arrival counter
  vk::Buffer x_b = vktest::make_buffer(g, x0.size() * 4, "x");
  vktest::upload_bytes(g, x_b, x0.data(), x0.size() * 4);
  vk::Buffer hq_b = vktest::make_buffer(g, vk::moe_hq_bytes(geo, c.n_used), "hq");
  if (c.q8) {
    EXPECT_TRUE(vk::moe_q8_usable(*g.ctx, geo, c.n_used));
  }

  vk::RouteOp ro;
  ro.n_expert = c.n_expert;
  ro.routing = vk::MoeRouting::from_config(cfg);
  ro.logits = logit_b.whole();
  if (has_bias) ro.bias = bias_b.whole();
  ro.route = route_b.whole();
  vk::MoeGateUpOp gu;
  gu.tile = {&tile_b, tile_offset, geo};
  gu.n_used = c.n_used;
  gu.h2 = h2_b.whole();
  gu.h = h_b.whole();
  gu.max_binding_bytes = c.max_binding_bytes;
  gu.tuning.q8_gateup_outs = c.gateup_outs;
  vk::MoeDownOp down;
  down.tile = gu.tile;
  down.n_used = c.n_used;
  down.h = h_b.whole();
  down.x = x_b.whole();
  down.max_binding_bytes = c.max_binding_bytes;
  if (c.q8) gu.hq = down.hq = hq_b.whole();
  if (c.per_workgroup_routing) {
    gu.routing = down.routing = ro.routing;
    gu.logits = down.logits = ro.logits;
    gu.bias = down.bias = ro.bias;
  } else {
    gu.route = down.route = route_b.whole();
  }
  EXPECT_GT(gu.bytes(), 0u);
  EXPECT_GT(down.bytes(), 0u);
  // The down's early-start form (moe_down.comp WAIT_GATE, MoeDownOp::gate) with its gate words
  // already at their targets (the route seen, every gate-up workgroup arrived): its arithmetic.
  vk::Buffer gate_b = vktest::make_buffer(g, 16, "down gate");
  vk::Buffer gate_err_b = vktest::make_buffer(g, 8, "down gate error");
  down.tuning.down_first_rows = c.down_first;
  if (c.gated_down) {
    const uint32_t target = 7;
    const uint32_t words[4] = {1, target, 0, 0}, no_error[2] = {0, 0};
    vktest::upload_bytes(g, gate_b, words, sizeof words);
    vktest::upload_bytes(g, gate_err_b, no_error, sizeof no_error);
    down.gate = gate_b.whole();
    down.tuning.down_late = c.down_late;
    down.gate_h_target = target;
    down.gate_error = gate_err_b.whole();
    EXPECT_TRUE(down.gate_supported(*g.ctx));
  }

  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  ro.record(rec);  // with per-workgroup routing: only for the route check below
  rec.barrier();
  gu.record(rec);
  rec.barrier();
  down.record(rec);
  rec.end();
  out.dispatches = rec.dispatch_count() - 1;  // the expert kernels' dispatches and barriers
  out.barriers = rec.barrier_count() - 1;
  rec.run();

  // Routing: ids exactly, weights to float rounding.
  const std::vector<float> rw = vktest::download_floats(g, route_b, c.n_used * 2 + 1);
  uint32_t counter;
  std::memcpy(&counter, &rw[2 * c.n_used], 4);
  EXPECT_EQ(counter, 0u) << "the arrival counter is left at 0 for the next step";
  for (uint32_t k = 0; k < c.n_used; ++k) {
    uint32_t id;
    std::memcpy(&id, &rw[2 * k], 4);
    out.ids.push_back(id);
    out.weights.push_back(rw[2 * k + 1]);
  }
  EXPECT_EQ(out.ids, route.experts) << "expert choice";
  if (c.gated_down) {
    const std::vector<float> ge = vktest::download_floats(g, gate_err_b, 2);
    uint32_t err;
    std::memcpy(&err, &ge[0], 4);
    EXPECT_EQ(err, 0u) << "the down's open gate was not seen";
  }
  for (uint32_t k = 0; k < c.n_used; ++k)
    EXPECT_NEAR(out.weights[k], route.weights[k], 2e-6 * std::fabs(route.weights[k]) + 1e-7) << "weight " << k;

  // Gate-up: each routed slot holds its chosen expert's h, the last slot the shared expert's.
  const std::vector<float> h = vktest::download_floats(g, h_b, h_floats);
  const uint32_t hs = vk::moe_h_stride(geo);
  const uint32_t n_slots = c.n_used + (geo.has_shared() ? 1 : 0);
  const double rel = c.q8 ? 1e-4 : 2e-5;
  std::vector<double> in(h2.begin(), h2.end());
  if (c.q8) in = vktest::q8_round(in);
  for (uint32_t k = 0; k < n_slots; ++k) {
    const uint32_t slot = k < c.n_used ? route.experts[k] : c.n_expert;
    const uint32_t w = uint32_t(geo.width(slot));
    std::vector<double> want, tol;
    moetest::ref_gateup([&](uint32_t i) { return ht.row(slot, MoePart::Gate, i); },
                        [&](uint32_t i) { return ht.row(slot, MoePart::Up, i); }, w, in, want, tol, rel);
    vktest::expect_close(std::vector<float>(h.begin() + k * hs, h.begin() + k * hs + w), want, tol,
                         cat("h slot ", k, " (expert ", slot, ")"));
  }

  // Down (from the GPU's h): x + sum_k w_k down_k h_k + down_shared h_shared.
  std::vector<double> want(x0.begin(), x0.end()), abs(c.n_embd, 0.0);
  for (uint32_t k = 0; k < n_slots; ++k) {
    const uint32_t slot = k < c.n_used ? route.experts[k] : c.n_expert;
    const double weight = k < c.n_used ? route.weights[k] : 1.0;
    const uint32_t w = uint32_t(geo.width(slot));
    std::vector<double> hk(h.begin() + k * hs, h.begin() + k * hs + w);
    if (c.q8) hk = vktest::q8_round(hk);  // the down kernel reads the gate-up's int8 copy of h
    moetest::ref_down_add([&](uint32_t r) { return ht.row(slot, MoePart::Down, r); }, c.n_embd, weight, hk.data(), want,
                          abs);
  }
  std::vector<double> tol(c.n_embd);
  for (uint32_t r = 0; r < c.n_embd; ++r) tol[r] = moetest::sum_tol(abs[r], want[r], rel);
  vktest::expect_close(vktest::download_floats(g, x_b, c.n_embd), want, tol, "x after down");
  return out;
}

#define REQUIRE_GPU(no_subgroup)                 \
  do {                                           \
    Gpu& gg = vktest::gpu(no_subgroup);          \
    VK_TEST_REQUIRE_GPU(gg);                     \
  } while (0)

constexpr TileTypes kQ4KM = {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q6_K};

TEST(MoeKernels, GlmStyleQ4KGateUpQ6KDown) {
  REQUIRE_GPU(false);
  const Outcome o = run_tile_case(make_case(64, 4, 256, 256, 256, kQ4KM, Style::Glm), 1);
  EXPECT_EQ(o.dispatches, 2u);  // one gate-up, one down: routed and shared slots together
  EXPECT_EQ(o.barriers, 1u);
  float sum = 0;
  for (float w : o.weights) sum += w;
  EXPECT_NEAR(sum, 1.8f, 1e-5f);  // normalized, then scaled (forward.md §9)
}

TEST(MoeKernels, V2StyleSoftmaxMixedSharedTypes) {
  REQUIRE_GPU(false);
  // DeepSeek-V2-Lite Q4_K_M shape of types: routed down Q5_0 (width not a multiple of 256), the
  // shared expert's down of another type -> separate dispatches, one extra barrier in the down.
  const TileTypes t = {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q8_0};
  const Outcome o = run_tile_case(make_case(64, 6, 96, 192, 256, t, Style::V2), 2);
  EXPECT_EQ(o.dispatches, 3u);  // gate-up (both Q4_K) together; down: routed part | shared part
  EXPECT_EQ(o.barriers, 2u);
}

TEST(MoeKernels, WideN2080SmallExpertCount) {
  REQUIRE_GPU(false);
  run_tile_case(make_case(8, 2, 160, 320, 2080, {GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_1}, Style::V2), 3);
}

TEST(MoeKernels, Width1408SharedTwice) {
  REQUIRE_GPU(false);
  run_tile_case(make_case(8, 6, 1408, 2816, 96, {GgmlType::Q5_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q5_0}, Style::V2), 4);
}

TEST(MoeKernels, NoSharedExpert) {
  REQUIRE_GPU(false);
  run_tile_case(make_case(8, 2, 64, 0, 96, {GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0}, Style::Glm), 5);
}

TEST(MoeKernels, PlainFloatTypes) {
  REQUIRE_GPU(false);
  // 16-byte vector path (rows multiple of 8) and the scalar path (n_embd 36, widths 20/40).
  run_tile_case(make_case(8, 3, 64, 128, 96, {GgmlType::F16, GgmlType::BF16, GgmlType::F16, GgmlType::BF16}, Style::Glm), 6);
  run_tile_case(make_case(8, 3, 20, 40, 36, {GgmlType::F32, GgmlType::F16, GgmlType::F32, GgmlType::F16}, Style::V2), 7);
}

TEST(MoeKernels, EveryTypeAsGateUpAndDown) {
  REQUIRE_GPU(false);
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
                            GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F32,  GgmlType::F16,  GgmlType::BF16};
  const size_t n = std::size(types);
  for (size_t i = 0; i < n; ++i) {
    const GgmlType gu = types[i], dn = types[(i + 3) % n];
    run_tile_case(make_case(8, 2, 256, 256, 256, {gu, dn, gu, dn}, i % 2 ? Style::V2 : Style::Glm), 10 + uint32_t(i));
  }
}

TEST(MoeKernels, SlotRangesWhenTheTileExceedsOneBinding) {
  REQUIRE_GPU(false);
  // Bindings of at most 3 routed slots: routed parts + a shared part, barriers between down parts.
  TileCase c = make_case(16, 4, 64, 128, 256, {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q8_0}, Style::Glm);
  const MoeTileGeometry geo = moe_tile_geometry(16, 64, 128, 256, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_0,
                                                GgmlType::Q8_0);
  c.max_binding_bytes = 3 * geo.slot_stride;
  const Outcome o = run_tile_case(c, 20);
  EXPECT_EQ(o.dispatches, 2u * (6 + 1));  // ceil(16 / 3) routed parts + the shared part, each kernel
  EXPECT_EQ(o.barriers, 1u + 6);           // gate-up | down, and between the 7 down parts
}

TEST(MoeKernels, SharedMemoryReductionPath) {
  REQUIRE_GPU(true);
  run_tile_case(make_case(64, 4, 96, 96, 256, {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_0}, Style::Glm, true),
                30);
  run_tile_case(make_case(8, 2, 64, 64, 96, {GgmlType::F16, GgmlType::Q8_0, GgmlType::F16, GgmlType::Q8_0}, Style::V2, true),
                31);
}

TEST(MoeKernels, RoutingPerWorkgroupWithoutRouteBuffer) {
  REQUIRE_GPU(false);
  for (bool no_subgroup : {false, true}) {
    TileCase c = make_case(64, 4, 64, 64, 256, {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q8_0},
                           Style::Glm, no_subgroup);
    c.per_workgroup_routing = true;
    run_tile_case(c, 60);
    c = make_case(64, 6, 64, 128, 96, {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q5_0}, Style::V2,
                  no_subgroup);
    c.per_workgroup_routing = true;
    run_tile_case(c, 61);
  }
}

TEST(MoeKernels, RoutingTiesPreferLowerExpertIds) {
  REQUIRE_GPU(false);
  const TileTypes t = {GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0};
  // All equal: experts 0..K-1. Sigmoid and softmax.
  for (Style s : {Style::Glm, Style::V2}) {
    TileCase c = make_case(8, 3, 32, 32, 64, t, s);
    c.logits.assign(8, 0.25f);
    const Outcome o = run_tile_case(c, 40);
    EXPECT_EQ(o.ids, (std::vector<uint32_t>{0, 1, 2}));
  }
  // Ties inside and across the cut: the best pair {5, 2} -> 2 first; then 1.0 x {0, 3, 7} -> 0.
  TileCase c = make_case(8, 3, 32, 32, 64, t, Style::V2);
  c.logits = {1.f, -1.f, 2.f, 1.f, -3.f, 2.f, 0.f, 1.f};
  const Outcome o = run_tile_case(c, 41);
  EXPECT_EQ(o.ids, (std::vector<uint32_t>{2, 5, 0}));
}

// The int8-activation path (gate-up quantizes h2 and writes h as int8 blocks, down reads them)
// against the CPU on the same rounded inputs: GLM and V2 routing, Q4_0 / Q8_0 / Q4_K / Q6_K mixed
// (routed and shared parts of different types: separate dispatches), widths of one and several
// blocks per lane, slot ranges, per-workgroup routing, the shared-memory path.
TEST(MoeKernels, Int8ActivationPath) {
  REQUIRE_GPU(false);
  if (!vk::q8_activations_usable(*vktest::gpu().ctx, GgmlType::Q4_0, 64)) GTEST_SKIP() << "no integer dot product";
  const TileTypes q40 = {GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0};
  const TileTypes mixed = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q8_0};
  uint32_t seed = 700;
  std::vector<TileCase> cases = {make_case(16, 4, 96, 96, 256, q40, Style::Glm),
                                 make_case(8, 2, 1536, 3072, 2048, mixed, Style::V2),
                                 make_case(12, 3, 32, 64, 96, q40, Style::Glm),
                                 make_case(8, 2, 64, 0, 320, mixed, Style::V2)};
  const TileTypes q4k = {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K};
  const TileTypes q4k_mix = {GgmlType::Q4_K, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K};
  cases.push_back(make_case(8, 2, 256, 256, 512, q4k, Style::Glm));
  cases.push_back(make_case(6, 3, 256, 512, 256, q4k_mix, Style::V2));
  // Q6_K: the Q4_K_M mix (Q4_K gate-up, Q6_K down), all Q6_K, Q6_K next to 32-element types.
  const TileTypes q6k = {GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q6_K};
  const TileTypes q6k_mix = {GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q6_K};
  cases.push_back(make_case(8, 2, 256, 512, 512, kQ4KM, Style::Glm));
  cases.push_back(make_case(6, 3, 512, 256, 256, q6k, Style::V2));
  cases.push_back(make_case(9, 3, 96, 256, 256, q6k_mix, Style::Glm));
  TileCase q4km_ranged = make_case(12, 3, 256, 256, 256, kQ4KM, Style::V2);
  q4km_ranged.max_binding_bytes = 5 * moe_tile_geometry(12, 256, 256, 256, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_K,
                                                        GgmlType::Q6_K).slot_stride;
  cases.push_back(q4km_ranged);
  TileCase q4km_per_wg = make_case(16, 4, 256, 256, 256, kQ4KM, Style::Glm);
  q4km_per_wg.per_workgroup_routing = true;
  cases.push_back(q4km_per_wg);
  cases.push_back(make_case(8, 2, 256, 512, 256, kQ4KM, Style::V2, /*no_subgroup=*/true));
  cases.push_back(make_case(6, 2, 256, 256, 512, q6k_mix, Style::Glm, /*no_subgroup=*/true));
  TileCase ranged = make_case(16, 4, 96, 96, 256, q40, Style::Glm);
  ranged.max_binding_bytes = 3 * moetest::build_tile(*std::make_unique<std::mt19937>(1), 16, 96, 96, 256, q40).g.slot_stride;
  cases.push_back(ranged);
  TileCase per_wg = make_case(16, 4, 96, 96, 256, mixed, Style::Glm);
  per_wg.per_workgroup_routing = true;
  cases.push_back(per_wg);
  cases.push_back(make_case(16, 4, 96, 96, 256, q40, Style::Glm, /*no_subgroup=*/true));
  for (TileCase& c : cases) {
    c.q8 = true;
    run_tile_case(c, seed++);
  }
  // Q4_K gate-ups over rows of several pairs per lane (n_embd 2048: 32 pairs).
  run_tile_case([&] {
    TileCase c = make_case(8, 2, 256, 256, 2048, q4k, Style::Glm);
    c.q8 = true;
    return c;
  }(), seed++);
  // The down's early-start form (the decode step's default where it fits) on every int8 type:
  // Q4_0 (its late path, and its wait with down_late off), Q8_0, the Q4_K_M mix (Q6_K downs), all
  // Q6_K, Q4_K downs; with 32-lane subgroups GLM's width of 1536 (48 blocks: lanes with 2 and 1).
  const TileTypes q80 = {GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0};
  std::vector<TileCase> gated = {make_case(16, 4, 96, 96, 256, q40, Style::Glm),
                                 make_case(8, 2, 256, 512, 512, kQ4KM, Style::Glm),
                                 make_case(6, 3, 512, 256, 256, q6k, Style::V2),
                                 make_case(8, 2, 256, 256, 512, q4k, Style::Glm),
                                 make_case(16, 4, 96, 96, 256, q40, Style::Glm),
                                 make_case(8, 3, 128, 64, 256, q80, Style::V2)};
  gated[4].down_late = false;
  if (vktest::gpu().ctx->info().subgroup_size >= 32) gated.push_back(make_case(8, 4, 1536, 1536, 256, kQ4KM, Style::Glm));
  for (TileCase& c : gated) {
    c.q8 = c.gated_down = true;
    run_tile_case(c, seed++);
  }
  // The gate-up with every load of a pass first (MoeTuning::q8_gateup_outs): 1, 3 (10 subgroups of
  // 3: a second pass for the last 2 outputs of 32, the rest clamped), 4 and 8 outputs a pass; rows
  // of fewer units than lanes (n_embd 256, 320), of two units a lane (2048); Q4_0, Q8_0 beside
  // Q4_0, Q4_K pairs, Q6_K; per-workgroup routing; the shared-memory path ignores it.
  {
    const uint32_t outs[] = {1, 3, 4, 8};
    std::vector<TileCase> gu = {make_case(16, 4, 96, 96, 256, q40, Style::Glm),
                                make_case(8, 2, 1536, 3072, 2048, mixed, Style::V2),
                                make_case(8, 2, 256, 256, 2048, q4k, Style::Glm),
                                make_case(8, 2, 256, 512, 512, kQ4KM, Style::Glm),
                                make_case(9, 3, 96, 256, 256, q6k_mix, Style::Glm),
                                make_case(8, 2, 64, 0, 320, mixed, Style::V2),
                                per_wg,
                                make_case(8, 2, 256, 512, 256, kQ4KM, Style::V2, /*no_subgroup=*/true)};
    for (size_t i = 0; i < gu.size(); ++i) {
      gu[i].q8 = true;
      gu[i].gateup_outs = outs[i % std::size(outs)];
      run_tile_case(gu[i], seed++);
    }
    // Q4_0's default is 2 outputs a pass; the two-output loop it replaced, forced.
    TileCase loop = make_case(16, 4, 96, 96, 2048, q40, Style::Glm);
    loop.q8 = true;
    loop.gateup_outs = vk::kQ8GateUpLoop;
    run_tile_case(loop, seed++);
  }
  // The down behind a barrier with every weight block of a pass's rows loaded first (DOWN_FIRST,
  // Q4_0's default with 1 row a pass): 1, 2 and 4 rows a pass, none (the
  // default's loop, forced, on a slot range); lane blocks clamped (width 96 on 256 rows), two
  // blocks a lane (1536 / 3072 wide), Q4_K_M's Q6_K downs and Q6_K beside Q4_0 (forced on),
  // per-workgroup routing.
  {
    const uint32_t first[] = {1, 2, 4, 2, vk::kQ8DownFirstOff, 4};  // per case below
    TileCase ranged = make_case(8, 2, 64, 128, 256, q40, Style::Glm);
    ranged.max_binding_bytes = 3 * moe_tile_geometry(8, 64, 128, 256, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0,
                                                     GgmlType::Q4_0).slot_stride;
    const TileCase cases[] = {make_case(16, 4, 96, 96, 256, q40, Style::Glm), make_case(8, 2, 1536, 3072, 2048, mixed, Style::V2),
                              make_case(8, 2, 256, 512, 512, kQ4KM, Style::Glm), make_case(9, 3, 96, 256, 256, q6k_mix, Style::Glm),
                              ranged, per_wg};
    for (size_t i = 0; i < std::size(cases); ++i) {
      TileCase c = cases[i];
      c.q8 = true;
      c.down_first = first[i];
      run_tile_case(c, seed++);
    }
  }
  // Q4_K gate-ups one sub-block per lane and step (KQ_PAIRS 0; the default takes pairs), on both
  // test devices (with and without subgroup arithmetic: two contexts).
  struct PairsOff {
    PairsOff() { set("0"); }
    ~PairsOff() { set("1"); }
    static void set(const char* v) {
      for (bool no_subgroup : {false, true}) vktest::gpu(no_subgroup).ctx->pipelines().set_global_define("KQ_PAIRS", v);
    }
  } pairs_off;
  for (TileCase c : {make_case(8, 2, 256, 256, 512, q4k, Style::Glm), make_case(8, 2, 256, 256, 2048, q4k, Style::Glm),
                     gated[1], gated[2], make_case(8, 2, 256, 512, 256, kQ4KM, Style::V2, /*no_subgroup=*/true)}) {
    c.q8 = true;
    run_tile_case(c, seed++);
  }
}

TEST(MoeKernels, RefusesBadShapes) {
  REQUIRE_GPU(false);
  Gpu& g = vktest::gpu();
  std::mt19937 rng(50);
  const HostTile ht = moetest::build_tile(rng, 8, 32, 32, 64, {GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0});
  vk::Buffer tile_b = vktest::make_buffer(g, ht.bytes.size(), "tile");
  vk::Buffer small = vktest::make_buffer(g, 64, "small");
  vk::RouteOp ro;
  ro.n_expert = 8;
  ro.routing = {9, GatingFunc::Softmax, false, 0.f};  // K > E
  ro.logits = ro.route = small.whole();
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  EXPECT_THROW(ro.record(rec), Error);
  ro.routing.gating = GatingFunc::None;
  ro.routing.n_used = 2;
  EXPECT_THROW(ro.record(rec), Error);  // gating function 0
  vk::MoeGateUpOp gu;
  gu.tile = {&tile_b, 0, ht.g};
  gu.n_used = 2;
  gu.h2 = gu.route = gu.h = small.whole();
  EXPECT_THROW(gu.record(rec), Error);  // h2 (64 floats) and h too small
  vk::MoeDownOp dn;
  dn.tile = {&tile_b, 16, ht.g};  // not 256-aligned and overruns the buffer
  dn.n_used = 2;
  dn.h = dn.route = dn.x = small.whole();
  EXPECT_THROW(dn.record(rec), Error);
}

}  // namespace
}  // namespace tessera
