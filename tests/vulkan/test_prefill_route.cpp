// PrefillRouteOp with the router logits computed from x (moe_prefill_route.comp FROM_X, the
// short chunks' path since session 25) against a double-precision RMSNorm + router product and
// cpu::route_token: awkward row lengths (not a multiple of the lanes' 64 values), expert counts
// that are not a multiple of a pass's rows, f32 and f16 routers, with and without subgroups,
// live tokens fewer than the chunk (outputs NaN-poisoned first). And the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "runtime/cpu/ops.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "tests/vulkan/test_moe_util.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

constexpr uint32_t kCountWord = 1;  // step words: [first position, live tokens]

struct FromXCase {
  GgmlType type;
  uint32_t E, K, n_embd, T, n;
  bool sigmoid;  // sigmoid gating with the expert bias, normalized and scaled weights; else softmax
  vk::RouteFromXTuning tuning = {};
};

void run_from_x_case(Gpu& g, const FromXCase& c, uint32_t seed) {
  SCOPED_TRACE(cat(type_name(c.type), " E ", c.E, " K ", c.K, " n_embd ", c.n_embd, " T ", c.T, " n ", c.n,
                   c.sigmoid ? " sigmoid" : " softmax", " wg ", c.tuning.wg, " lanes ", c.tuning.lanes, " batch ", c.tuning.batch));
  std::mt19937 rng(seed);
  const float eps = 1e-5f;
  const std::vector<uint8_t> w = vktest::random_matrix(rng, c.type, c.E, c.n_embd);
  const std::vector<float> x = vktest::random_values(rng, size_t(c.T) * c.n_embd, 3.f);
  // Logits of a few units, as a router's are (a saturated softmax ties its zeros).
  const std::vector<float> nw = vktest::random_values(rng, c.n_embd, 2.f / std::sqrt(float(c.n_embd)));
  const std::vector<float> bias = vktest::random_values(rng, c.E, 0.1f);
  const ModelConfig cfg = moetest::prefill_routing(c.E, c.K, c.sigmoid);

  auto router = vktest::upload_matrix(g, c.type, c.E, c.n_embd, w);
  vk::Buffer xb = vktest::buffer_of(g, x, "x"), nb = vktest::buffer_of(g, nw, "norm"), bb = vktest::buffer_of(g, bias, "bias");
  vk::Buffer lb = vktest::make_buffer(g, size_t(c.T) * c.E * 4, "logits");
  vk::Buffer rb = vktest::make_buffer(g, vk::prefill_route_bytes(c.T, c.K), "route");
  vk::Buffer listb = vktest::make_buffer(g, vk::prefill_list_bytes(c.T, c.E), "lists");
  vk::Buffer step = vktest::step_buffer(g, 0, c.n);
  vktest::poison(g, lb);
  vktest::poison(g, rb);
  vktest::poison(g, listb);

  vk::PrefillRouteOp route = moetest::prefill_route_op(cfg, c.T, lb, c.sigmoid ? &bb : nullptr, step, rb, listb);
  route.router = router->ref;
  route.x = xb.whole();
  route.norm = nb.whole();
  route.eps = eps;
  route.tuning = c.tuning;
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  route.record(rec);
  rec.end();
  rec.run();

  const std::vector<float> logits = vktest::download_floats(g, lb, size_t(c.T) * c.E);
  std::vector<uint32_t> rw(2ull * c.T * c.K), lw(size_t(c.E) * (c.T + 1));
  g.transfer->download(rb, 0, rw.data(), rw.size() * 4);
  g.transfer->download(listb, 0, lw.data(), lw.size() * 4);
  std::vector<std::vector<float>> rows(c.E);
  for (uint32_t e = 0; e < c.E; ++e) rows[e] = vktest::dequant_row(c.type, w, c.n_embd, e);
  std::vector<std::vector<uint32_t>> want(c.E);
  for (uint32_t t = 0; t < c.n; ++t) {
    const float* xt = x.data() + size_t(t) * c.n_embd;
    double ss = 0;
    for (uint32_t k = 0; k < c.n_embd; ++k) ss += double(xt[k]) * xt[k];
    const double inv = 1.0 / std::sqrt(ss / c.n_embd + eps);
    for (uint32_t e = 0; e < c.E; ++e) {
      double sum = 0, mag = 0;
      for (uint32_t k = 0; k < c.n_embd; ++k) {
        const double p = double(rows[e][k]) * xt[k] * nw[k] * inv;
        sum += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(logits[size_t(t) * c.E + e], sum, 2e-6 * mag + 1e-6) << "token " << t << " expert " << e;
    }
    // The routing of the logits the kernel computed (a near tie may flip on the reference's).
    const cpu::Route r = cpu::route_token(cfg, std::span<const float>(logits.data() + size_t(t) * c.E, c.E),
                                          c.sigmoid ? std::span<const float>(bias) : std::span<const float>());
    for (uint32_t k = 0; k < c.K; ++k) {
      const uint32_t p = t * c.K + k;
      ASSERT_EQ(rw[2 * p], r.experts[k]) << "token " << t << " slot " << k;
      float wk;
      std::memcpy(&wk, &rw[2 * p + 1], 4);
      ASSERT_NEAR(wk, r.weights[k], 1e-6f * std::max(1.f, std::fabs(r.weights[k]))) << "token " << t << " slot " << k;
      want[r.experts[k]].push_back(p);
    }
  }
  for (uint32_t e = 0; e < c.E; ++e) {
    ASSERT_EQ(lw[e], want[e].size()) << "expert " << e;
    for (size_t j = 0; j < want[e].size(); ++j) ASSERT_EQ(lw[c.E + e * c.T + j], want[e][j]) << "expert " << e << " entry " << j;
  }
}

TEST(PrefillRoute, LogitsFromXMatchTheReference) {
  for (const bool no_subgroups : {false, true}) {
    Gpu& g = vktest::gpu(no_subgroups);
    VK_TEST_REQUIRE_GPU(g);
    SCOPED_TRACE(no_subgroups ? "no subgroups" : "subgroups");
    uint32_t seed = 90;
    run_from_x_case(g, {GgmlType::F32, 64, 4, 2048, 9, 7, true}, seed++);  // GLM-4.7-Flash's router
    run_from_x_case(g, {GgmlType::F16, 72, 6, 260, 5, 5, false}, seed++);  // 65 vec4s: 16 lanes, 5 short
    run_from_x_case(g, {GgmlType::F32, 70, 6, 36, 4, 3, false}, seed++);   // fewer vec4s than lanes
    run_from_x_case(g, {GgmlType::F16, 8, 2, 4096, 3, 2, true}, seed++);   // the longest row it stages
    // Work splits: several passes over the experts (16 rows at once for 70), 16-load batches
    // past a short row, 32 lanes with 4-load batches.
    run_from_x_case(g, {GgmlType::F32, 70, 6, 264, 4, 4, true, {.wg = 64, .lanes = 4, .batch = 16}}, seed++);
    run_from_x_case(g, {GgmlType::F32, 64, 4, 2048, 3, 3, false, {.wg = 256, .lanes = 32, .batch = 4}}, seed++);
  }
}

TEST(PrefillRoute, LogitsFromXRefusals) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  std::mt19937 rng(5);
  auto refused = [&](GgmlType type, uint32_t rows, uint32_t cols, const char* needle, vk::RouteFromXTuning tuning = {}) {
    SCOPED_TRACE(cat(type_name(type), " ", rows, " x ", cols));
    auto m = vktest::upload_matrix(g, type, rows, cols, vktest::random_matrix(rng, type, rows, cols));
    vk::Buffer big = vktest::make_buffer(g, 1 << 20, "big");
    ModelConfig cfg;
    cfg.n_expert = 8;
    cfg.n_expert_used = 2;
    cfg.gating = GatingFunc::Softmax;
    vk::PrefillRouteOp route;
    route.n_expert = 8;
    route.routing = vk::MoeRouting::from_config(cfg);
    route.t_max = 4;
    route.logits = route.step = route.route = route.lists = route.x = route.norm = big.whole();
    route.count_word = kCountWord;
    route.router = m->ref;
    route.tuning = tuning;
    EXPECT_FALSE(vk::route_from_x_supported(m->ref) && rows == 8 && tuning.wg == 0 && tuning.lanes == 0);
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    try {
      route.record(rec);
      ADD_FAILURE() << "not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(GgmlType::Q8_0, 8, 64, "cannot be read by the routing kernel");  // a block type
  refused(GgmlType::F32, 8, 4104, "cannot be read by the routing kernel");  // past kRouteFromXMaxEmbd
  refused(GgmlType::F32, 8, 34, "cannot be read by the routing kernel");    // not a multiple of 4
  refused(GgmlType::F32, 9, 64, "9 rows for 8 experts");
  refused(GgmlType::F32, 8, 64, "routing work split", {.wg = 64, .lanes = 12});
  refused(GgmlType::F32, 8, 64, "routing work split", {.wg = 96});
}

}  // namespace
}  // namespace tessera
