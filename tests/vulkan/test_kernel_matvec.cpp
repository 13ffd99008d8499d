// matvec.comp (MatvecOp) against the CPU: every readable type, awkward shapes (R and K not
// multiples of workgroups/subgroups), outputs poisoned with NaN before each run; accumulate,
// batched, fused RMSNorm, the shared-memory reduction path and row-chunked bindings.
#include <cmath>
#include <random>

#include "runtime/vulkan/kernels_matvec.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

struct Case {
  GgmlType type;
  uint32_t rows, cols;
  uint32_t batch = 1;
  bool accumulate = false;
  bool norm = false;
  uint32_t x_pad = 0, y_pad = 0;  // stride - length (batched form)
  uint64_t max_binding_bytes = 0;
  bool q8 = false;  // the int8-activation path (Q4_0 / Q8_0 / Q4_K / Q6_K)
  uint32_t blocks_per_iter = 0;  // MatvecTuning::blocks_per_iter (0: auto)
  bool xq8 = false;              // x also given pre-quantized (MatvecOp::x_q8)
  uint32_t ksplit = 0;           // MatvecTuning::ksplit (subgroups per long row)
};

std::string describe(const Case& c) {
  return cat(type_name(c.type), " ", c.rows, "x", c.cols, " batch ", c.batch, c.accumulate ? " acc" : "",
             c.norm ? " norm" : "", c.max_binding_bytes ? cat(" chunk ", c.max_binding_bytes) : "", c.q8 ? " q8act" : "",
             c.blocks_per_iter ? cat(" unroll ", c.blocks_per_iter) : "", c.xq8 ? " xq8" : "", c.ksplit ? cat(" ksplit ", c.ksplit) : "");
}

void run_case(Gpu& g, const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<uint8_t> w = vktest::random_matrix(rng, c.type, c.rows, c.cols);
  auto dm = vktest::upload_matrix(g, c.type, c.rows, c.cols, w);
  const uint32_t xs = c.batch > 1 ? c.cols + c.x_pad : c.cols;
  const uint32_t ys = c.batch > 1 ? c.rows + c.y_pad : c.rows;
  std::vector<float> x = vktest::random_values(rng, size_t(xs) * c.batch);
  std::vector<float> y0 = vktest::random_values(rng, size_t(ys) * c.batch);
  std::vector<float> nw = vktest::random_values(rng, c.cols);
  const float eps = 1e-5f;

  vk::Buffer xb = vktest::make_buffer(g, x.size() * 4, "x");
  vk::Buffer yb = vktest::make_buffer(g, y0.size() * 4, "y");
  vk::Buffer nb = vktest::make_buffer(g, nw.size() * 4, "norm");
  vktest::upload_bytes(g, xb, x.data(), x.size() * 4);
  vktest::upload_bytes(g, nb, nw.data(), nw.size() * 4);
  if (c.accumulate)
    vktest::upload_bytes(g, yb, y0.data(), y0.size() * 4);
  else
    vktest::poison(g, yb);

  vk::MatvecOp op;
  op.w = dm->ref;
  op.x = xb.whole();
  op.y = yb.whole();
  op.batch = c.batch;
  op.x_stride = xs;
  op.y_stride = ys;
  op.accumulate = c.accumulate;
  op.tuning.blocks_per_iter = c.blocks_per_iter;
  op.tuning.ksplit = c.ksplit;
  if (c.norm) op.norm_weight = nb.whole();
  op.norm_eps = eps;
  op.max_binding_bytes = c.max_binding_bytes;
  op.int8_activations = c.q8;
  vk::Buffer xq8b;
  if (c.xq8) {  // the same x as int8 blocks; x itself poisoned: the kernel must not read it
    const std::vector<uint32_t> blocks = vktest::q8_blocks(x);
    xq8b = vktest::make_buffer(g, blocks.size() * 4, "x q8");
    vktest::upload_bytes(g, xq8b, blocks.data(), blocks.size() * 4);
    vktest::poison(g, xb);
    op.x_q8 = xq8b.whole();
    EXPECT_NE(op.kernel_name(g.ctx.get()).find(".xq8"), std::string::npos) << describe(c);
  }
  if (c.q8) {
    ASSERT_TRUE(vk::q8_activations_type(*g.ctx, c.type)) << describe(c);
    EXPECT_NE(op.kernel_name(g.ctx.get()).find(".q8act"), std::string::npos) << describe(c);
  }
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  op.record(rec);
  rec.end();
  rec.run();
  const std::vector<float> got = vktest::download_floats(g, yb, y0.size());

  // CPU: dequantized rows, double accumulation.
  std::vector<double> want(y0.size()), tol(y0.size());
  std::vector<std::vector<float>> rows(c.rows);
  for (uint32_t r = 0; r < c.rows; ++r) rows[r] = vktest::dequant_row(c.type, w, c.cols, r);
  for (uint32_t b = 0; b < c.batch; ++b) {
    std::vector<double> xin(c.cols);
    double ss = 0;
    for (uint32_t k = 0; k < c.cols; ++k) ss += double(x[b * xs + k]) * x[b * xs + k];
    const double scale = c.norm ? 1.0 / std::sqrt(ss / c.cols + eps) : 1.0;
    for (uint32_t k = 0; k < c.cols; ++k) xin[k] = double(x[b * xs + k]) * (c.norm ? nw[k] : 1.0);
    if (c.q8) xin = vktest::q8_round(xin);  // the kernel quantizes x * norm weight, then scales the dot by 1/rms
    for (uint32_t k = 0; k < c.cols; ++k) xin[k] *= scale;
    for (uint32_t i = 0; i < ys; ++i) {
      const size_t o = size_t(b) * ys + i;
      if (i >= c.rows) {  // padding between batched y vectors: untouched
        want[o] = c.accumulate ? y0[o] : std::nan("");
        tol[o] = 0;
        continue;
      }
      double s = 0, mag = 0;
      for (uint32_t k = 0; k < c.cols; ++k) {
        s += rows[i][k] * xin[k];
        mag += std::fabs(rows[i][k] * xin[k]);
      }
      want[o] = s + (c.accumulate ? y0[o] : 0.0);
      // q8: a quantized value may land one step off where x * (127 / max|x|) is near a half.
      tol[o] = (c.q8 ? 1e-4 : 1e-5) * mag + 1e-5 * std::fabs(want[o]) + 1e-30;
    }
  }
  // NaN padding compares as a mismatch; compare padding separately.
  std::vector<float> got_cmp = got;
  for (size_t o = 0; o < want.size(); ++o)
    if (std::isnan(want[o])) {
      EXPECT_TRUE(std::isnan(got[o])) << describe(c) << ": padding element " << o << " was written";
      got_cmp[o] = 0;
      want[o] = 0;
    }
  vktest::expect_close(got_cmp, want, tol, describe(c));
}

const GgmlType kBlock32[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0};
const GgmlType kBlock256[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
const GgmlType kPlain[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};
const uint32_t kRows[] = {1, 7, 67, 1000};

TEST(KernelMatvec, Block32TypesAwkwardShapes) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  uint32_t seed = 1;
  for (GgmlType t : kBlock32)
    for (uint32_t r : kRows)
      for (uint32_t k : {32u, 96u, 288u, 2080u}) run_case(g, {t, r, k}, seed++);
}

TEST(KernelMatvec, KQuantTypesAwkwardShapes) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  uint32_t seed = 100;
  for (GgmlType t : kBlock256)
    for (uint32_t r : kRows)
      for (uint32_t k : {256u, 768u, 2304u}) run_case(g, {t, r, k}, seed++);
}

TEST(KernelMatvec, PlainTypesAnyLength) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  uint32_t seed = 200;
  // 1, 7, 33: scalar path; 96, 2080: 16-byte loads.
  for (GgmlType t : kPlain)
    for (uint32_t r : kRows)
      for (uint32_t k : {1u, 7u, 33u, 96u, 2080u}) run_case(g, {t, r, k}, seed++);
}

// The int8-activation path against the CPU on the same rounded x: awkward row counts, a row of one
// block, rows longer than a subgroup's blocks, the fused norm, accumulate, the shared-memory path.
TEST(KernelMatvec, Int8ActivationsAwkwardShapes) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_usable(*g.ctx, GgmlType::Q4_0, 64)) GTEST_SKIP() << "no integer dot product on this device";
  uint32_t seed = 900;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0}) {
    run_case(g, {t, 67, 288, 1, false, false, 0, 0, 0, true}, seed++);
    run_case(g, {t, 1, 32, 1, false, false, 0, 0, 0, true}, seed++);
    run_case(g, {t, 5, 2080, 1, true, true, 0, 0, 0, true}, seed++);
    run_case(g, {t, 130, 96, 1, true, false, 0, 0, 0, true}, seed++);
    run_case(g, {t, 9, 10240, 1, false, false, 0, 0, 0, true}, seed++);
    // Enough rows for 4 (short rows) and 2 rows per subgroup, a partial last workgroup.
    run_case(g, {t, 4100, 96, 1, false, true, 0, 0, 0, true}, seed++);
    run_case(g, {t, 2051, 2080, 1, true, false, 0, 0, 0, true}, seed++);
    // Batched columns (prefill): strides with padding, a full batch of 8 with the norm.
    run_case(g, {t, 67, 288, 3, false, false, 4, 5, 0, true}, seed++);
    run_case(g, {t, 130, 2048, 8, true, true, 0, 3, 0, true}, seed++);
    // Rows longer than one staging pass (64 blocks at batch 8, 512 at batch 1): two passes.
    run_case(g, {t, 37, 2080, 8, false, true, 0, 0, 0, true}, seed++);
    run_case(g, {t, 5, 16416, 1, true, false, 0, 0, 0, true}, seed++);
    // the norm's sums gathered over two staging passes, with accumulation
    run_case(g, {t, 5, 16416, 1, true, true, 0, 0, 0, true}, seed++);
    // The int8 path takes up to 16 columns.
    run_case(g, {t, 67, 288, 16, false, false, 4, 1, 0, true}, seed++);
    run_case(g, {t, 37, 2080, 13, true, true, 0, 0, 0, true}, seed++);
    // Four blocks per lane and iteration: rows of 1, 3 (65 blocks: a partial last iteration) and
    // 320 blocks, one and two staging passes, batched.
    run_case(g, {t, 67, 32, 1, false, false, 0, 0, 0, true, 4}, seed++);
    run_case(g, {t, 2051, 2080, 1, true, false, 0, 0, 0, true, 4}, seed++);
    run_case(g, {t, 9, 10240, 1, false, true, 0, 0, 0, true, 4}, seed++);
    run_case(g, {t, 5, 16416, 1, true, false, 0, 0, 0, true, 4}, seed++);
    run_case(g, {t, 37, 2080, 8, false, true, 0, 0, 0, true, 4}, seed++);
    // Pre-quantized x (no staging): one block, rows of 65 and 320 blocks, 2 and 4 blocks per
    // iteration, many rows with accumulation.
    run_case(g, {t, 67, 32, 1, false, false, 0, 0, 0, true, 0, true}, seed++);
    run_case(g, {t, 9, 10240, 1, false, false, 0, 0, 0, true, 0, true}, seed++);
    run_case(g, {t, 2051, 2080, 1, true, false, 0, 0, 0, true, 4, true}, seed++);
    run_case(g, {t, 130, 16416, 1, true, false, 0, 0, 0, true, 0, true}, seed++);
  }
  // K-quants, 32 elements per int8 block: Q4_K (sub-blocks with their own 6-bit scales and mins),
  // Q6_K (two 16-element sub-blocks with int8 scales per block, 6-bit values split over ql / qh).
  // Rows of 1, 9, 65 super-blocks (65 x 8 = 520 blocks: two staging passes at batch 1), row counts
  // off the tile (1, 5, 37, 67, 4100), batched with padded strides, up to 16 columns, many rows.
  for (GgmlType k : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    run_case(g, {k, 67, 256, 1, false, false, 0, 0, 0, true}, seed++);
    run_case(g, {k, 1, 2304, 1, false, false, 0, 0, 0, true}, seed++);
    run_case(g, {k, 5, 2304, 1, true, true, 0, 0, 0, true}, seed++);
    run_case(g, {k, 4100, 256, 1, false, true, 0, 0, 0, true}, seed++);
    run_case(g, {k, 37, 2304, 8, false, true, 0, 0, 0, true}, seed++);
    run_case(g, {k, 67, 768, 3, true, false, 4, 5, 0, true}, seed++);
    run_case(g, {k, 37, 512, 16, false, false, 4, 1, 0, true}, seed++);
    run_case(g, {k, 5, 16640, 1, false, false, 0, 0, 0, true}, seed++);
    run_case(g, {k, 67, 256, 1, false, false, 0, 0, 4096, true}, seed++);  // row chunks of a few KiB
    run_case(g, {k, 5, 16640, 1, false, true, 0, 0, 0, true, 4}, seed++);   // four blocks per iteration
    run_case(g, {k, 67, 2304, 1, true, false, 0, 0, 0, true, 0, true}, seed++);  // pre-quantized x
  }
  Gpu& gs = vktest::gpu(/*no_subgroup_ops=*/true);
  run_case(gs, {GgmlType::Q4_0, 67, 288, 1, false, true, 0, 0, 0, true}, seed++);
  run_case(gs, {GgmlType::Q4_K, 9, 512, 1, false, true, 0, 0, 0, true}, seed++);
  run_case(gs, {GgmlType::Q6_K, 67, 768, 1, true, false, 0, 0, 0, true}, seed++);
  run_case(gs, {GgmlType::Q6_K, 7, 512, 3, false, true, 4, 2, 0, true}, seed++);
}

// Long rows shared by 2 or 4 subgroups (MatvecTuning::ksplit): rows of 130 (just past two loop
// iterations), 320 (W_vo) and 513 blocks (two staging passes), 9 to 2051 rows (partial last
// workgroup), with the input norm, accumulation, four blocks per iteration and pre-quantized x;
// the kernel's name says where the split applies (not for rows of two iterations or fewer).
TEST(KernelMatvec, Int8LongRowsSplitOverSubgroups) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_usable(*g.ctx, GgmlType::Q4_0, 64)) GTEST_SKIP() << "no integer dot product on this device";
  if (!g.ctx->pipelines().use_subgroup()) GTEST_SKIP() << "no subgroup arithmetic";
  uint32_t seed = 1300;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q6_K}) {
    const bool k256 = t == GgmlType::Q6_K;  // rows of 136 / 520 blocks for a 256-element block type
    const uint32_t past_two = k256 ? 4352 : 4160, two_passes = k256 ? 16640 : 16416;
    for (uint32_t k : {2u, 4u}) {
      run_case(g, {t, 9, 10240, 1, false, false, 0, 0, 0, true, 0, false, k}, seed++);
      run_case(g, {t, 2051, past_two, 1, true, true, 0, 0, 0, true, 0, false, k}, seed++);
      run_case(g, {t, 37, two_passes, 1, true, false, 0, 0, 0, true, 0, false, k}, seed++);
      run_case(g, {t, 67, 10240, 1, true, false, 0, 0, 0, true, 4, false, k}, seed++);
      if (!k256) run_case(g, {t, 130, 10240, 1, true, false, 0, 0, 0, true, 0, true, k}, seed++);
    }
  }
  // Where it applies: the name carries it; 3 subgroups per row is refused.
  std::mt19937 rng(1399);
  auto dm = vktest::upload_matrix(g, GgmlType::Q8_0, 64, 10240, vktest::random_matrix(rng, GgmlType::Q8_0, 64, 10240));
  vk::Buffer xb = vktest::make_buffer(g, 10240 * 4, "x");
  vk::Buffer yb = vktest::make_buffer(g, 64 * 4, "y");
  vk::MatvecOp op;
  op.w = dm->ref;
  op.x = xb.whole();
  op.y = yb.whole();
  op.int8_activations = true;
  op.tuning.ksplit = 2;
  EXPECT_NE(op.kernel_name(g.ctx.get()).find(".ks2"), std::string::npos);
  vk::MatvecOp short_rows = op;
  short_rows.w.cols = 32 * 2 * 2 * g.ctx->info().subgroup_size;  // two iterations of 2 blocks per lane
  EXPECT_EQ(short_rows.kernel_name(g.ctx.get()).find(".ks"), std::string::npos);
  op.tuning.ksplit = 3;
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  EXPECT_THROW(op.record(rec), Error);
  rec.end();
}

TEST(KernelMatvec, AccumulateAddsToY) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  run_case(g, {GgmlType::Q4_0, 67, 288, 1, true}, 300);
  run_case(g, {GgmlType::Q6_K, 7, 768, 1, true}, 301);
  run_case(g, {GgmlType::F16, 67, 33, 1, true}, 302);
}

TEST(KernelMatvec, BatchedColumns) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  run_case(g, {GgmlType::Q4_0, 67, 288, 3, false, false, 4, 5}, 400);
  run_case(g, {GgmlType::Q5_K, 7, 768, 8, true, false, 0, 1}, 401);
  run_case(g, {GgmlType::Q8_0, 1, 96, 2}, 402);
  run_case(g, {GgmlType::BF16, 67, 96, 4, false, false, 8, 3}, 403);
  run_case(g, {GgmlType::F32, 7, 7, 3, false, false, 1, 0}, 404);
}

TEST(KernelMatvec, FusedInputNorm) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  run_case(g, {GgmlType::Q4_0, 67, 2080, 1, false, true}, 500);
  run_case(g, {GgmlType::Q4_K, 7, 2304, 1, true, true}, 501);
  run_case(g, {GgmlType::F32, 67, 33, 1, false, true}, 502);
  run_case(g, {GgmlType::Q6_K, 7, 256, 3, false, true, 4, 0}, 503);
}

TEST(KernelMatvec, SharedMemoryReductionPath) {
  Gpu& g = vktest::gpu(/*no_subgroup_ops=*/true);
  VK_TEST_REQUIRE_GPU(g);
  run_case(g, {GgmlType::Q4_0, 67, 288}, 600);
  run_case(g, {GgmlType::Q5_1, 7, 2080}, 601);
  run_case(g, {GgmlType::Q4_K, 67, 768}, 602);
  run_case(g, {GgmlType::Q6_K, 1, 2304}, 603);
  run_case(g, {GgmlType::F16, 67, 2080}, 604);
  run_case(g, {GgmlType::F32, 7, 33}, 605);
  run_case(g, {GgmlType::Q8_0, 7, 96, 3, true, true, 4, 2}, 606);
}

TEST(KernelMatvec, RowChunkedBindings) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  // Bindings limited to a few KiB: the matrix is split into row chunks, one dispatch each.
  run_case(g, {GgmlType::Q6_K, 67, 256, 1, false, false, 0, 0, 4096}, 700);
  run_case(g, {GgmlType::Q4_0, 1000, 96, 1, true, false, 0, 0, 8192}, 701);
  run_case(g, {GgmlType::F16, 67, 33, 2, false, true, 0, 0, 1024}, 702);
}

TEST(KernelMatvec, RejectsBadShapes) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  std::mt19937 rng(800);
  auto dm = vktest::upload_matrix(g, GgmlType::Q4_0, 4, 64, vktest::random_matrix(rng, GgmlType::Q4_0, 4, 64));
  vk::Buffer xb = vktest::make_buffer(g, 64 * 4, "x");
  vk::Buffer yb = vktest::make_buffer(g, 4 * 4, "y");
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  vk::MatvecOp op;
  op.w = dm->ref;
  op.x = xb.slice(0, 32 * 4);  // too short
  op.y = yb.whole();
  try {
    op.record(rec);
    ADD_FAILURE() << "a short x binding was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x binding"), std::string::npos) << e.what();
  }
  op.x = xb.whole();
  op.w.cols = 48;  // not a multiple of the 32-element block
  EXPECT_THROW(op.record(rec), Error);
  op.w.cols = 64;
  op.w.layout = vk::WeightLayout::Plain;  // a block type cannot be read plain
  EXPECT_THROW(op.record(rec), Error);
  rec.end();
}

}  // namespace
}  // namespace tessera
