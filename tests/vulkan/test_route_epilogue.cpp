// The router as the epilogue of the int8 matvec (shaders/route_epilogue.glsl) against the two
// dispatches it replaces (matvec_q8 with y += W x, then router.comp): the same y (bit for bit: same
// matvec code), the same h2 (within f32 rounding of a differently ordered sum of squares), the same
// experts and weights, the arrival counter reset; the recording is resubmitted on a new input, which
// must give the new routing. Row counts not multiples of the workgroup's rows, E not a multiple of
// the subgroup count, both gating functions, with and without the expert bias, and the
// shared-memory (no subgroup) path.
#include <gtest/gtest.h>

#include <cstring>

#include "format/model_config.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

struct Case {
  GgmlType type;
  uint32_t rows, cols, n_expert, n_used;
  GatingFunc gating;
  bool bias, norm_weights;
  float scale;
};

std::vector<uint32_t> download_words(Gpu& g, const vk::Buffer& b, size_t n) {
  std::vector<uint32_t> w(n);
  g.transfer->download(b, 0, w.data(), n * 4);
  return w;
}

void run_case(Gpu& g, const Case& c, uint32_t seed) {
  SCOPED_TRACE(cat(type_name(c.type), " ", c.rows, "x", c.cols, " E", c.n_expert, " K", c.n_used,
                   c.gating == GatingFunc::Sigmoid ? " sigmoid" : " softmax", c.bias ? " bias" : ""));
  std::mt19937 rng(seed);
  auto wm = vktest::upload_matrix(g, c.type, c.rows, c.cols, vktest::random_matrix(rng, c.type, c.rows, c.cols));
  auto rm = vktest::upload_matrix(g, GgmlType::F32, c.n_expert, c.rows,
                                  vktest::random_matrix(rng, GgmlType::F32, c.n_expert, c.rows));
  const std::vector<float> o = vktest::random_values(rng, c.cols), nw = vktest::random_values(rng, c.rows);
  const std::vector<float> bias = vktest::random_values(rng, c.n_expert, 0.1f);
  vk::Buffer ob = vktest::make_buffer(g, c.cols * 4, "o"), nb = vktest::make_buffer(g, c.rows * 4, "norm");
  vk::Buffer bb = vktest::make_buffer(g, c.n_expert * 4, "bias");
  vktest::upload_bytes(g, ob, o.data(), c.cols * 4);
  vktest::upload_bytes(g, nb, nw.data(), c.rows * 4);
  vktest::upload_bytes(g, bb, bias.data(), c.n_expert * 4);
  const uint32_t K = c.n_used;
  std::vector<uint32_t> route0(2 * K + 1, 0x7FC00000u);
  route0.back() = 0;  // arrival counter

  // Two independent sets of outputs: [0] = matvec then router, [1] = the fused dispatch.
  struct Out {
    vk::Buffer y, h2, route, logits, partials;
  } out[2];
  for (Out& u : out) {
    u.y = vktest::make_buffer(g, c.rows * 4, "y");
    u.h2 = vktest::make_buffer(g, c.rows * 4, "h2");
    u.route = vktest::make_buffer(g, (2 * K + 1) * 4, "route");
    u.logits = vktest::make_buffer(g, c.n_expert * 4, "logits");
    u.partials = vktest::make_buffer(g, uint64_t(c.n_expert) * c.rows * 4, "partials");
    vktest::poison(g, u.h2);
    vktest::upload_bytes(g, u.route, route0.data(), route0.size() * 4);
  }
  auto ops = [&](Out& u) {
    vk::MatvecOp mv;
    mv.w = wm->ref;
    mv.x = ob.whole();
    mv.y = u.y.whole();
    mv.accumulate = true;
    vk::RouterOp ro;
    ro.w = rm->ref;
    ro.x = u.y.whole();
    ro.norm_weight = nb.whole();
    ro.eps = 1e-5f;
    ro.routing = {K, c.gating, c.norm_weights, c.scale};
    if (c.bias) ro.bias = bb.whole();
    ro.logits = u.logits.whole();
    ro.h2 = u.h2.whole();
    ro.route = u.route.whole();
    return std::make_pair(mv, ro);
  };
  vk::CommandRecorder two(*g.ctx), fused(*g.ctx);
  {
    auto [mv, ro] = ops(out[0]);
    two.begin();
    mv.record(two);
    two.barrier();
    ro.record(two);
    two.end();
  }
  {
    auto [mv, ro] = ops(out[1]);
    ASSERT_TRUE(mv.router_fusable(*g.ctx));
    ASSERT_LE(mv.router_partials_bytes(*g.ctx, c.n_expert), out[1].partials.size());
    mv.router = ro.as_epilogue(*g.ctx, mv, out[1].partials.whole());
    ASSERT_TRUE(mv.router.has_value());
    EXPECT_NE(mv.kernel_name(g.ctx.get()).find(".route"), std::string::npos);
    fused.begin();
    mv.record(fused);
    fused.end();
    EXPECT_EQ(fused.dispatch_count(), 1u);
  }

  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(cat("round ", round));
    const std::vector<float> x = vktest::random_values(rng, c.rows, 2.f);  // the residual before the matvec
    for (Out& u : out) vktest::upload_bytes(g, u.y, x.data(), c.rows * 4);
    two.run();
    fused.run();
    const std::vector<float> y0 = vktest::download_floats(g, out[0].y, c.rows);
    const std::vector<float> y1 = vktest::download_floats(g, out[1].y, c.rows);
    ASSERT_EQ(std::memcmp(y0.data(), y1.data(), c.rows * 4), 0) << "y differs from the plain matvec's";
    const std::vector<float> h0 = vktest::download_floats(g, out[0].h2, c.rows);
    std::vector<double> want(h0.begin(), h0.end()), tol(c.rows);
    for (uint32_t i = 0; i < c.rows; ++i) tol[i] = 1e-5 * std::fabs(want[i]) + 1e-7;
    vktest::expect_close(vktest::download_floats(g, out[1].h2, c.rows), want, tol, "h2");
    const std::vector<uint32_t> r0 = download_words(g, out[0].route, 2 * K + 1);
    const std::vector<uint32_t> r1 = download_words(g, out[1].route, 2 * K + 1);
    for (uint32_t k = 0; k < K; ++k) {
      EXPECT_EQ(r1[2 * k], r0[2 * k]) << "slot " << k;
      float w0, w1;
      std::memcpy(&w0, &r0[2 * k + 1], 4);
      std::memcpy(&w1, &r1[2 * k + 1], 4);
      // A logit error d moves a weight by about d relative: the two logits differ by the f32
      // rounding of sums of a few hundred terms in different orders (~1e-5 of the largest).
      EXPECT_NEAR(w1, w0, 1e-4 * std::fabs(w0) + 1e-7) << "slot " << k;
    }
    EXPECT_EQ(r1[2 * K], 0u) << "arrival counter reset";
  }
}

const Case kCases[] = {
    {GgmlType::Q8_0, 200, 320, 64, 4, GatingFunc::Sigmoid, true, true, 2.5f},  // GLM-like routing
    {GgmlType::Q4_0, 2048, 512, 64, 6, GatingFunc::Softmax, false, false, 1.f},  // DeepSeek-V2-Lite-like
    {GgmlType::Q4_K, 300, 512, 7, 2, GatingFunc::Softmax, false, true, 0.f},
};

TEST(RouteEpilogue, MatchesMatvecThenRouter) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_type(*g.ctx, GgmlType::Q8_0)) GTEST_SKIP() << "no integer dot product: no int8 matvec";
  uint32_t seed = 1;
  for (const Case& c : kCases) run_case(g, c, seed++);
}

TEST(RouteEpilogue, SharedMemoryPath) {
  Gpu& g = vktest::gpu(true);
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_type(*g.ctx, GgmlType::Q8_0)) GTEST_SKIP() << "no integer dot product: no int8 matvec";
  run_case(g, kCases[0], 11);
  run_case(g, kCases[2], 12);
}

TEST(RouteEpilogue, RefusedWhereItCannotRun) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  std::mt19937 rng(5);
  auto wm = vktest::upload_matrix(g, GgmlType::Q8_0, 64, 64, vktest::random_matrix(rng, GgmlType::Q8_0, 64, 64));
  auto rm = vktest::upload_matrix(g, GgmlType::F16, 8, 64, vktest::random_matrix(rng, GgmlType::F16, 8, 64));
  vk::Buffer b = vktest::make_buffer(g, 64 * 64 * 4, "scratch");
  vk::MatvecOp mv;
  mv.w = wm->ref;
  mv.x = b.whole();
  mv.y = b.whole();
  mv.accumulate = true;
  vk::RouterOp ro;
  ro.w = rm->ref;
  ro.x = b.whole();
  ro.norm_weight = b.whole();
  ro.routing = {2, GatingFunc::Softmax, false, 0.f};
  ro.logits = ro.h2 = ro.route = b.whole();
  EXPECT_FALSE(ro.as_epilogue(*g.ctx, mv, b.whole()).has_value()) << "F16 router weight";
  mv.accumulate = false;
  EXPECT_FALSE(mv.router_fusable(*g.ctx)) << "y = W x (no residual)";
  mv.accumulate = true;
  mv.batch = 2;
  mv.x_stride = mv.y_stride = 64;
  EXPECT_FALSE(mv.router_fusable(*g.ctx)) << "two columns";
}

}  // namespace
}  // namespace tessera
