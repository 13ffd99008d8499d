// matmul.comp (MatmulOp) against the CPU: every type, awkward shapes (rows not a multiple of the
// 16-row tiles, rows shorter and longer than one staging step, token counts not a multiple of 16
// or 64), accumulate, strides with padding, row-chunked bindings, every work split; the plain
// kernel everywhere, the tensor-core kernel where the device has it. Outputs poisoned with NaN;
// x16's padding token rows are NaN (they must not reach a stored output). And RmsNormOp's f16
// output (the matmul's input) against the CPU.
#include <cmath>
#include <random>

#include "format/fp16.h"
#include "runtime/vulkan/kernels_basic.h"
#include "runtime/vulkan/kernels_matmul.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

struct Case {
  GgmlType type;
  uint32_t rows, cols, tokens;
  bool accumulate = false;
  uint32_t x_pad = 0, y_pad = 0;  // stride - length
  uint64_t max_binding_bytes = 0;
  uint32_t row_tiles = 0, step = 0, groups = 0, splits = 0, prefetch = 0;  // MatmulTuning
  uint32_t live = 0;  // > 0: MatmulOp::live_count holds this many live tokens (the rest untouched)
  uint32_t prefetch_w = 0, loop = 0;  // MatmulTuning
};

std::string describe(const Case& c, vk::MatmulKernel k) {
  return cat(type_name(c.type), " ", c.rows, "x", c.cols, " tokens ", c.tokens, c.accumulate ? " acc" : "",
             c.x_pad || c.y_pad ? cat(" pad ", c.x_pad, "/", c.y_pad) : "",
             c.max_binding_bytes ? cat(" chunk ", c.max_binding_bytes) : "", c.row_tiles ? cat(" m", c.row_tiles) : "",
             c.step ? cat(" step ", c.step) : "", c.groups ? cat(" g", c.groups) : "",
             c.splits ? cat(" splits ", c.splits) : "", c.prefetch ? cat(" prefetch ", c.prefetch) : "", c.prefetch_w ? cat(" prefetch W ", c.prefetch_w) : "",
             c.loop == 2 ? " loop" : "",
             c.live ? cat(" live ", c.live) : "", k == vk::MatmulKernel::Coop ? " coop" : " plain");
}

void run_case(Gpu& g, const Case& c, vk::MatmulKernel kernel, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<uint8_t> w = vktest::random_matrix(rng, c.type, c.rows, c.cols);
  auto dm = vktest::upload_matrix(g, c.type, c.rows, c.cols, w);
  const uint32_t xs = c.cols + c.x_pad, ys = c.rows + c.y_pad;
  const uint32_t padded = (c.tokens + 15) / 16 * 16;
  // x16: the tokens' values rounded to f16; padding columns and token rows NaN.
  std::vector<float> x = vktest::random_values(rng, size_t(xs) * c.tokens);
  std::vector<uint16_t> x16(size_t(xs) * padded, 0x7E00);
  for (uint32_t t = 0; t < c.tokens; ++t)
    for (uint32_t k = 0; k < c.cols; ++k) x16[size_t(t) * xs + k] = f32_to_fp16(x[size_t(t) * xs + k]);
  std::vector<float> y0 = vktest::random_values(rng, size_t(ys) * c.tokens);

  vk::Buffer xb = vktest::make_buffer(g, x16.size() * 2, "x16");
  vk::Buffer yb = vktest::make_buffer(g, y0.size() * 4, "y");
  vktest::upload_bytes(g, xb, x16.data(), x16.size() * 2);
  if (c.accumulate)
    vktest::upload_bytes(g, yb, y0.data(), y0.size() * 4);
  else
    vktest::poison(g, yb);

  vk::MatmulOp op;
  op.w = dm->ref;
  op.x16 = xb.whole();
  op.y = yb.whole();
  op.n_tokens = c.tokens;
  op.x_stride = xs;
  op.y_stride = ys;
  op.accumulate = c.accumulate;
  op.kernel = kernel;
  op.tuning = {.row_tiles = c.row_tiles, .step = c.step, .groups = c.groups, .prefetch = c.prefetch, .splits = c.splits,
               .prefetch_w = c.prefetch_w, .loop = c.loop};
  op.max_binding_bytes = c.max_binding_bytes;
  EXPECT_NE(op.kernel_name(*g.ctx).find(kernel == vk::MatmulKernel::Coop ? ".coop" : ".plain"), std::string::npos);
  if (c.splits > 1) EXPECT_GT(op.splits(*g.ctx), 1u) << describe(c, kernel);
  vk::Buffer pb = vktest::make_buffer(g, std::max<uint64_t>(op.partials_bytes(*g.ctx), 16), "partials");
  vktest::poison(g, pb);
  op.partials = pb.whole();
  vk::Buffer cb;
  if (c.live) {  // the count at word 1
    const uint32_t words[2] = {12345u, c.live};
    cb = vktest::make_buffer(g, 16, "live count");
    vktest::upload_bytes(g, cb, words, 8);
    op.live_count = cb.whole();
    op.count_word = 1;
  }
  const uint32_t n_live = c.live ? std::min(c.live, c.tokens) : c.tokens;
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  op.record(rec);
  rec.barrier();
  op.record_sum(rec);
  rec.end();
  rec.run();
  const std::vector<float> got = vktest::download_floats(g, yb, y0.size());

  // CPU: dequantized rows (rounded to f16, as the kernel stages them) times the f16 x, in double.
  std::vector<std::vector<double>> rows(c.rows);
  for (uint32_t r = 0; r < c.rows; ++r) {
    const std::vector<float> row = vktest::dequant_row(c.type, w, c.cols, r);
    rows[r].resize(c.cols);
    for (uint32_t k = 0; k < c.cols; ++k) rows[r][k] = fp16_to_f32(f32_to_fp16(row[k]));
  }
  std::vector<float> got_cmp = got;
  std::vector<double> want(got.size()), tol(got.size());
  for (uint32_t t = 0; t < c.tokens; ++t)
    for (uint32_t i = 0; i < ys; ++i) {
      const size_t o = size_t(t) * ys + i;
      if (i >= c.rows || t >= n_live) {  // padding between token rows, tokens past the live count: untouched
        if (c.accumulate)
          EXPECT_EQ(got[o], y0[o]) << describe(c, kernel) << ": padding element " << o << " changed";
        else
          EXPECT_TRUE(std::isnan(got[o])) << describe(c, kernel) << ": padding element " << o << " was written";
        got_cmp[o] = 0;
        continue;
      }
      double s = 0, mag = 0;
      for (uint32_t k = 0; k < c.cols; ++k) {
        const double p = rows[i][k] * fp16_to_f32(x16[size_t(t) * xs + k]);
        s += p;
        mag += std::fabs(p);
      }
      want[o] = s + (c.accumulate ? y0[o] : 0.0);
      tol[o] = 2e-6 * mag + 1e-6 * std::fabs(want[o]) + 1e-30;  // f32 sums of exact f16 products
    }
  vktest::expect_close(got_cmp, want, tol, describe(c, kernel));
}

// The kernels this device runs: plain always, the tensor-core one where present.
std::vector<vk::MatmulKernel> kernels(Gpu& g) {
  std::vector<vk::MatmulKernel> k{vk::MatmulKernel::Plain};
  if (vk::matmul_coop_supported(*g.ctx)) k.push_back(vk::MatmulKernel::Coop);
  return k;
}

#define MATMUL_REQUIRE(g)          \
  VK_TEST_REQUIRE_GPU(g);          \
  if (!vk::matmul_supported(*(g).ctx)) GTEST_SKIP() << "no shaderFloat16 on this device"

TEST(KernelMatmul, BlockTypesAwkwardShapes) {
  Gpu& g = vktest::gpu();
  MATMUL_REQUIRE(g);
  uint32_t seed = 1;
  for (vk::MatmulKernel k : kernels(g))
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1}) {
      run_case(g, {t, 37, 96, 13}, k, seed++);     // one short step, a partial row tile, 13 tokens
      run_case(g, {t, 16, 1056, 64}, k, seed++);   // three steps (the last of 32 columns), 64 tokens
      run_case(g, {t, 70, 544, 70, true}, k, seed++);  // two token tiles (the second of 6), accumulate
    }
}

TEST(KernelMatmul, KQuantTypesAwkwardShapes) {
  Gpu& g = vktest::gpu();
  MATMUL_REQUIRE(g);
  uint32_t seed = 100;
  for (vk::MatmulKernel k : kernels(g))
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
      run_case(g, {t, 21, 256, 5}, k, seed++);
      run_case(g, {t, 48, 1280, 33, true}, k, seed++);
      // Steps of one unit span (64 / 128 columns) and of 384 (Q6_K: three 128-spans, straddling
      // blocks), split along K.
      const uint32_t span = t == GgmlType::Q6_K ? 128 : 64;
      run_case(g, {t, 33, 1536, 20, false, 0, 0, 0, 1, span, 2, 3}, k, seed++);
      run_case(g, {t, 40, 1536, 17, true, 0, 0, 0, 1, 384, 1, 2}, k, seed++);
    }
}

TEST(KernelMatmul, PlainTypes) {
  Gpu& g = vktest::gpu();
  MATMUL_REQUIRE(g);
  uint32_t seed = 200;
  for (vk::MatmulKernel k : kernels(g))
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
      run_case(g, {t, 19, 64, 17}, k, seed++);
      run_case(g, {t, 64, 2080, 64, true}, k, seed++);
    }
}

TEST(KernelMatmul, WorkSplitsStridesAndChunks) {
  Gpu& g = vktest::gpu();
  MATMUL_REQUIRE(g);
  uint32_t seed = 300;
  for (vk::MatmulKernel k : kernels(g)) {
    // Row tiles x token groups at 64-column steps (40 and 16 tokens: partial and whole groups;
    // 17 steps a row), other step widths (128, 256; 512 and 1024: one short step), K-quant steps
    // of whole blocks. Where the shared memory cannot hold a split it is skipped (lavapipe's 32
    // KiB: four of them, the widest).
    struct Split {
      GgmlType type;
      uint32_t mr, step, tg;
    };
    std::vector<Split> splits;
    for (uint32_t mr : {1u, 2u, 4u})
      for (uint32_t tg : {1u, 2u, 4u}) splits.push_back({GgmlType::Q4_0, mr, 64, tg});
    for (uint32_t step : {128u, 256u, 512u, 1024u}) splits.push_back({GgmlType::Q4_0, 1, step, 1});
    for (uint32_t mr : {1u, 2u}) splits.push_back({GgmlType::Q6_K, mr, 128, 2});
    splits.push_back({GgmlType::Q6_K, 1, 256, 1});
    splits.push_back({GgmlType::Q6_K, 1, 512, 1});
    uint32_t ran = 0;
    for (const Split& sp : splits) {
      if (uint64_t(16 * sp.mr + 16 * sp.tg) * (sp.step + 8) * 2 + 1024ull * sp.tg * sp.mr > g.ctx->info().max_compute_shared_memory)
        continue;
      if (sp.type == GgmlType::Q4_0)
        run_case(g, {GgmlType::Q4_0, 83, 1088, 40, true, 0, 0, 0, sp.mr, sp.step, sp.tg}, k, seed++);
      else
        run_case(g, {GgmlType::Q6_K, 50, 768, 16, false, 0, 0, 0, sp.mr, sp.step, sp.tg}, k, seed++);
      ++ran;
    }
    EXPECT_GE(ran, splits.size() - 4);
    // Split along K: 3 and 5 workgroups (the last shorter) over rows of 9 and 17 steps, with
    // accumulation and padded strides; and the automatic split of a short, wide matrix.
    run_case(g, {GgmlType::Q4_0, 37, 1152, 21, true, 0, 0, 0, 1, 128, 2, 3}, k, seed++);
    run_case(g, {GgmlType::Q8_0, 45, 1088, 40, false, 8, 3, 0, 1, 64, 4, 5}, k, seed++);
    run_case(g, {GgmlType::Q6_K, 20, 2304, 19, true, 0, 0, 0, 1, 256, 1, 4}, k, seed++);
    run_case(g, {GgmlType::F32, 64, 2048, 64}, k, seed++);
    // Token values loaded a step ahead: several steps, a short last one, split along K, 21 tokens
    // (a partial group), K-quants.
    run_case(g, {GgmlType::Q4_0, 37, 1120, 21, true, 0, 0, 0, 2, 64, 2, 2, 1}, k, seed++);
    run_case(g, {GgmlType::Q8_0, 70, 416, 40, false, 8, 0, 0, 1, 128, 4, 1, 1}, k, seed++);
    run_case(g, {GgmlType::Q4_K, 33, 768, 50, false, 0, 0, 0, 2, 64, 4, 0, 1}, k, seed++);
    run_case(g, {GgmlType::Q8_0, 45, 288, 29, false, 8, 3}, k, seed++);  // padded strides
    // The next step's W words and token values loaded ahead (the default), either alone or
    // neither (2: off), the products as a loop: several steps, a short last one, split along K,
    // rows past a tile, every SPLIT1 family.
    run_case(g, {GgmlType::Q4_0, 37, 1120, 21, true, 0, 0, 0, 2, 64, 2, 2, 2, 0, 2, 0}, k, seed++);
    run_case(g, {GgmlType::Q5_1, 70, 416, 40, false, 8, 0, 0, 1, 128, 4, 1, 1, 0, 1, 2}, k, seed++);
    run_case(g, {GgmlType::Q4_K, 33, 768, 50, false, 0, 0, 0, 2, 64, 4, 0, 2, 0, 1, 2}, k, seed++);
    run_case(g, {GgmlType::Q6_K, 50, 768, 16, true, 0, 0, 0, 1, 128, 2, 0, 2, 0, 2, 0}, k, seed++);
    run_case(g, {GgmlType::Q8_0, 45, 288, 29, false, 8, 3, 0, 0, 0, 0, 0, 0, 0, 2, 2}, k, seed++);
    run_case(g, {GgmlType::F16, 40, 96, 20, true, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, k, seed++);
    // W two steps ahead (prefetch_w 3: two register sets): per workgroup an odd step count (9 of
    // 64, the last of 32), 4 steps of 128 (the last of 32) without the tokens ahead, automatic
    // splits with the products as a loop, K-quant units, one step only, a live count of 20 of 70.
    run_case(g, {GgmlType::Q4_0, 37, 1120, 21, true, 0, 0, 0, 2, 64, 2, 2, 0, 0, 3, 0}, k, seed++);
    run_case(g, {GgmlType::Q8_0, 70, 416, 40, false, 8, 0, 0, 1, 128, 4, 1, 2, 0, 3, 0}, k, seed++);
    run_case(g, {GgmlType::Q4_K, 33, 768, 50, false, 0, 0, 0, 2, 64, 4, 0, 0, 0, 3, 2}, k, seed++);
    run_case(g, {GgmlType::Q6_K, 50, 768, 16, true, 0, 0, 0, 1, 128, 2, 0, 0, 0, 3, 0}, k, seed++);
    run_case(g, {GgmlType::Q8_0, 33, 64, 40, false, 0, 0, 0, 2, 64, 4, 1, 0, 0, 3, 0}, k, seed++);
    run_case(g, {GgmlType::Q4_0, 37, 1152, 70, true, 0, 0, 0, 1, 128, 2, 3, 0, 20, 3, 0}, k, seed++);
    // A live token count below n_tokens: 20 of 70 (a partial token group, whole workgroups
    // skipped), with accumulation and split along K; 64 of 64; 1 of 40.
    run_case(g, {GgmlType::Q4_0, 37, 1152, 70, true, 0, 0, 0, 1, 128, 2, 3, 0, 20}, k, seed++);
    run_case(g, {GgmlType::Q4_K, 50, 512, 64, false, 0, 0, 0, 0, 0, 0, 0, 0, 64}, k, seed++);
    run_case(g, {GgmlType::Q8_0, 33, 256, 40, false, 0, 0, 0, 2, 64, 4, 2, 1, 1}, k, seed++);
    run_case(g, {GgmlType::Q4_0, 45, 288, 29, true, 24, 5}, k, seed++);
    // Row chunks: bindings of at most 4 KiB (several dispatches, each its own row_begin).
    run_case(g, {GgmlType::Q4_0, 100, 256, 20, false, 0, 0, 4096}, k, seed++);
    run_case(g, {GgmlType::F32, 40, 96, 20, true, 0, 0, 4096}, k, seed++);
  }
}

TEST(KernelMatmul, RefusesWhatItCannotRun) {
  Gpu& g = vktest::gpu();
  MATMUL_REQUIRE(g);
  std::mt19937 rng(7);
  const std::vector<uint8_t> w = vktest::random_matrix(rng, GgmlType::Q4_0, 32, 64);
  auto dm = vktest::upload_matrix(g, GgmlType::Q4_0, 32, 64, w);
  vk::Buffer xb = vktest::make_buffer(g, 16 * 64 * 2, "x16");
  vk::Buffer yb = vktest::make_buffer(g, 16 * 32 * 4, "y");
  auto refused = [&](vk::MatmulOp op, const std::string& text) {
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    try {
      op.record(rec);
      ADD_FAILURE() << "accepted; expected an error with '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  vk::MatmulOp op;
  op.w = dm->ref;
  op.x16 = xb.whole();
  op.y = yb.whole();
  op.n_tokens = 16;
  op.label = "test matmul";
  vk::MatmulOp bad = op;
  bad.n_tokens = 17;  // 32 token rows needed in x16
  refused(bad, "32 token rows");
  bad = op;
  bad.x_stride = 68;
  refused(bad, "multiples of 8");
  bad = op;
  bad.n_tokens = 0;
  refused(bad, "no tokens");
  bad = op;
  bad.tuning.step = 48;
  refused(bad, "matmul tuning");
  bad = op;
  bad.tuning.groups = 3;
  refused(bad, "matmul tuning");
  std::mt19937 rng2(8);
  const std::vector<uint8_t> wk = vktest::random_matrix(rng2, GgmlType::Q4_K, 32, 256);
  auto dk = vktest::upload_matrix(g, GgmlType::Q4_K, 32, 256, wk);
  bad = op;
  bad.w = dk->ref;
  bad.tuning.step = 32;  // Q4_K units fill 64 columns together
  refused(bad, "multiples of 64");
  bad = op;
  bad.w = dm->ref;
  bad.tuning = {1, 32, 1, 0, 2};  // two splits, no partial sums bound
  refused(bad, "partial sums");
  if (!vk::matmul_coop_supported(*g.ctx)) {
    bad = op;
    bad.kernel = vk::MatmulKernel::Coop;
    refused(bad, "cooperative matrices");
  }
}

// The automatic work split on GLM-4.7-Flash's shapes (docs/PERFORMANCE.md session 24): no split
// where the tiles fill the GPU in a few steps (W_qk), splits where a tile's K loop is long (W_vo,
// also at 512 tokens), in 64-token chunks 16-row tiles for small matrices and 64-row tiles for
// W_vo; W two steps ahead only in chunks of more than 64 tokens (session 25).
TEST(KernelMatmul, AutomaticSplitOnModelShapes) {
  Gpu& g = vktest::gpu();
  MATMUL_REQUIRE(g);
  auto op_of = [](GgmlType type, uint32_t rows, uint32_t cols, uint32_t tokens) {
    vk::MatmulOp op;
    op.w.type = type;
    op.w.layout = type == GgmlType::F32 ? vk::WeightLayout::Plain : vk::WeightLayout::Split1;
    op.w.rows = rows;
    op.w.cols = cols;
    op.n_tokens = tokens;
    return op;
  };
  vk::Context& ctx = *g.ctx;
  EXPECT_EQ(op_of(GgmlType::Q8_0, 11520, 768, 64).splits(ctx), 1u);   // W_qk: 360 tiles of 12 steps
  const vk::MatmulOp w_vo = op_of(GgmlType::Q8_0, 2048, 10240, 64);
  EXPECT_NE(w_vo.kernel_name(ctx).find(".m4"), std::string::npos) << w_vo.kernel_name(ctx);
  EXPECT_EQ(w_vo.splits(ctx), 8u);                                    // 32 row tiles, 256 workgroups
  EXPECT_EQ(w_vo.kernel_name(ctx).find(".pf."), std::string::npos);   // no B prefetch in short chunks
  EXPECT_NE(w_vo.kernel_name(ctx).find(".pw"), std::string::npos);    // W one step ahead in short chunks
  EXPECT_EQ(w_vo.kernel_name(ctx).find(".pw2"), std::string::npos);
  const vk::MatmulOp w_vo_512 = op_of(GgmlType::Q8_0, 2048, 10240, 512);
  EXPECT_EQ(w_vo_512.splits(ctx), 2u);                                // 512 tiles of 160 steps
  EXPECT_NE(w_vo_512.kernel_name(ctx).find(".pw2"), std::string::npos) << w_vo_512.kernel_name(ctx);  // two steps ahead
  const vk::MatmulOp q_a = op_of(GgmlType::Q4_0, 768, 2048, 64);
  EXPECT_NE(q_a.kernel_name(ctx).find(".m1"), std::string::npos) << q_a.kernel_name(ctx);
  EXPECT_EQ(q_a.splits(ctx), 16u);  // 48 row tiles
  EXPECT_NE(op_of(GgmlType::Q4_0, 768, 2048, 512).kernel_name(ctx).find(".m2"), std::string::npos);
  EXPECT_NE(op_of(GgmlType::F32, 64, 2048, 64).kernel_name(ctx).find(".m1"), std::string::npos);
}

// RmsNormOp's f16 output: normalized (the matmul's input after a norm) and as it is.
TEST(KernelMatmul, NormWritesF16Rows) {
  Gpu& g = vktest::gpu();
  MATMUL_REQUIRE(g);
  std::mt19937 rng(11);
  const uint32_t n = 2080, rows = 5, ys = 2088;
  const std::vector<float> x = vktest::random_values(rng, size_t(n) * rows, 30.f);
  const std::vector<float> wn = vktest::random_values(rng, n);
  vk::Buffer xb = vktest::make_buffer(g, x.size() * 4, "x");
  vk::Buffer wb = vktest::make_buffer(g, wn.size() * 4, "w");
  vk::Buffer yb = vktest::make_buffer(g, size_t(ys) * rows * 2, "y16");
  vktest::upload_bytes(g, xb, x.data(), x.size() * 4);
  vktest::upload_bytes(g, wb, wn.data(), wn.size() * 4);
  for (bool normalize : {true, false}) {
    vktest::poison(g, yb);
    vk::RmsNormOp op;
    op.x = xb.whole();
    op.weight = wb.whole();
    op.y = yb.whole();
    op.n = n;
    op.rows = rows;
    op.y_stride = ys;
    op.eps = 1e-5f;
    op.f16_out = true;
    op.normalize = normalize;
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    op.record(rec);
    rec.end();
    rec.run();
    std::vector<uint16_t> got(size_t(ys) * rows);
    const std::vector<float> raw = vktest::download_floats(g, yb, got.size() / 2);
    std::memcpy(got.data(), raw.data(), got.size() * 2);
    for (uint32_t t = 0; t < rows; ++t) {
      double ss = 0;
      for (uint32_t i = 0; i < n; ++i) ss += double(x[t * n + i]) * x[t * n + i];
      const double scale = normalize ? 1.0 / std::sqrt(ss / n + 1e-5) : 1.0;
      for (uint32_t i = 0; i < ys; ++i) {
        const size_t at = size_t(t) * ys + i;
        const float v = fp16_to_f32(got[at]);
        if (i >= n) {  // the stride's padding: untouched (the f32 NaN poison 0x7FC00000, as halves)
          EXPECT_EQ(got[at], at % 2 ? 0x7FC0 : 0x0000) << "padding " << t << "," << i;
          continue;
        }
        const double want = double(x[t * n + i]) * scale * (normalize ? wn[i] : 1.0);
        ASSERT_NEAR(v, want, std::fabs(want) * 1e-3 + 1e-6) << (normalize ? "norm" : "copy") << " row " << t << " i " << i;
      }
    }
  }
}

// Sums fused into a norm (RmsNormOp::add, rmsnorm.comp SUM_IN): the prefill's FFN sum into x
// (x gains exactly prefill_sum's f32 sums, compared bit for bit) and a split-K matmul's parts
// (x replaced by matmul.comp REDUCE's sums), on the live rows only; x16 holds the norm of the new
// rows. Routed pairs with and without the shared pair, the dense FFN's single pair (K = 0), 16
// parts of q_a's width; a row wider than one vec4 batch of the workgroup.
TEST(KernelMatmul, SumThenNormMatchesPrefillSum) {
  Gpu& g = vktest::gpu();
  MATMUL_REQUIRE(g);
  struct Case {
    uint32_t n, rows, live, K;
    bool shared;
    bool parts = false;  // K split-K parts: row (k * rows + t), x replaced
  };
  uint32_t seed = 40;
  for (const Case& c : {Case{2048, 5, 3, 4, true}, Case{1028, 3, 3, 0, true}, Case{64, 4, 4, 6, false},
                        Case{768, 6, 4, 16, false, true}}) {
    SCOPED_TRACE(cat("n ", c.n, " rows ", c.rows, " live ", c.live, " K ", c.K, c.shared ? " shared" : "", c.parts ? " parts" : ""));
    std::mt19937 rng(seed++);
    const uint32_t pair_base = c.rows * c.K, pairs = pair_base + (c.shared ? c.rows : 0);
    auto summand = [&](uint32_t t, uint32_t k) { return c.parts ? size_t(k) * c.rows + t : size_t(t) * c.K + k; };
    const std::vector<float> x = vktest::random_values(rng, size_t(c.n) * c.rows, 3.f);
    const std::vector<float> y = vktest::random_values(rng, size_t(c.n) * pairs, 1.f);
    const std::vector<float> wn = vktest::random_values(rng, c.n);
    vk::Buffer xb = vktest::buffer_of(g, x, "x"), yb = vktest::buffer_of(g, y, "y"), wb = vktest::buffer_of(g, wn, "w");
    vk::Buffer x16 = vktest::make_buffer(g, size_t(c.n) * c.rows * 2, "x16");
    vk::Buffer step = vktest::step_buffer(g, 0, c.live);
    vktest::poison(g, x16);
    vk::RmsNormOp op;
    op.x = xb.whole();
    op.weight = wb.whole();
    op.y = x16.whole();
    op.n = c.n;
    op.rows = c.rows;
    op.eps = 1e-5f;
    op.f16_out = true;
    op.add.y = yb.whole();
    op.add.n_used = c.K;
    op.add.has_shared = c.shared;
    op.add.pair_base = pair_base;
    op.add.step = step.whole();
    op.add.count_word = 1;
    if (c.parts) {
      op.add.stride_t = 1;
      op.add.stride_k = c.rows;
      op.add.replace = true;
    }
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    op.record(rec);
    rec.end();
    rec.run();
    const std::vector<float> xg = vktest::download_floats(g, xb, x.size());
    std::vector<uint16_t> got(size_t(c.n) * c.rows);
    const std::vector<float> raw = vktest::download_floats(g, x16, got.size() / 2);
    std::memcpy(got.data(), raw.data(), got.size() * 2);
    for (uint32_t t = 0; t < c.rows; ++t) {
      std::vector<float> row(c.n);
      double ss = 0;
      for (uint32_t i = 0; i < c.n; ++i) {
        float acc = 0.f;  // prefill_util.comp MODE_SUM's / matmul.comp REDUCE's order, in f32
        for (uint32_t k = 0; k < c.K; ++k) acc += y[summand(t, k) * c.n + i];
        if (c.shared) acc += y[size_t(pair_base + t) * c.n + i];
        const float x0 = x[size_t(t) * c.n + i];
        row[i] = t < c.live ? (c.parts ? acc : x0 + acc) : x0;
        ASSERT_EQ(xg[size_t(t) * c.n + i], row[i]) << "x row " << t << " i " << i;
        ss += double(row[i]) * row[i];
      }
      const double scale = 1.0 / std::sqrt(ss / c.n + 1e-5);
      for (uint32_t i = 0; i < c.n; ++i) {
        const double want = row[i] * scale * wn[i];
        ASSERT_NEAR(fp16_to_f32(got[size_t(t) * c.n + i]), want, std::fabs(want) * 1e-3 + 1e-6) << "row " << t << " i " << i;
      }
    }
  }
  // Refused: rows not of whole vec4s; with int8 output blocks.
  vk::Buffer b = vktest::make_buffer(g, 1 << 16, "b");
  vk::RmsNormOp bad;
  bad.x = bad.weight = bad.y = bad.add.y = bad.add.step = b.whole();
  bad.n = 66;
  bad.f16_out = true;
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  EXPECT_THROW(bad.record(rec), Error);
  bad.n = 64;
  bad.f16_out = false;
  vk::Buffer q = vktest::make_buffer(g, 1 << 16, "q"), q8 = vktest::make_buffer(g, 1 << 16, "q8");
  bad.y = q.whole();
  bad.y_q8 = q8.whole();
  EXPECT_THROW(bad.record(rec), Error);
  rec.end();
}

}  // namespace
}  // namespace tessera
