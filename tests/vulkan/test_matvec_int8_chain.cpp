// A matvec that writes the next matvec's input pre-quantized (matvec_q8.comp OUT_Q8 / X_SS,
// MatvecOp::out_q8 / x_ss): q_a writes cq times q_a_norm as int8 blocks and its sums of squares,
// W_qk reads them with no staging. Checked against the CPU quantization of the producer's own y,
// and the consumer against the staged kernel with the fused norm on the same y (the int8 blocks
// are the same; only the order of the sum of squares differs); with a gate between the two the
// bits of the pair without one.
#include <cmath>
#include <random>

#include "runtime/vulkan/kernels_matvec.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

struct Chain {
  GgmlType a, b;
  uint32_t embd, mid, out;  // producer embd -> mid rows (the consumer's row length), consumer -> out rows
};

TEST(MatvecInt8Output, FeedsTheNextMatvecWithoutStaging) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_type(*g.ctx, GgmlType::Q4_0) || !g.ctx->pipelines().use_subgroup())
    GTEST_SKIP() << "no int8 kernel with subgroups here";
  uint32_t ran = 0, ran_gated = 0;
  // q_a -> W_qk-like; a producer of one block of rows; a consumer of many rows. Whole blocks of 32
  // rows per workgroup, and halves of 16 (MatvecOp::out_q8_halves / x_q8_halves), each half with
  // its own scale.
  for (const bool halves : {false, true})
  for (const Chain ch : {Chain{GgmlType::Q4_0, GgmlType::Q8_0, 256, 96, 70}, Chain{GgmlType::Q8_0, GgmlType::Q4_0, 64, 32, 5},
                         Chain{GgmlType::Q4_K, GgmlType::Q8_0, 512, 160, 2100}, Chain{GgmlType::Q4_0, GgmlType::Q6_K, 128, 256, 33}}) {
    SCOPED_TRACE(cat(type_name(ch.a), " ", ch.embd, " -> ", ch.mid, " -> ", type_name(ch.b), " ", ch.out, halves ? " halves" : ""));
    if (!vk::q8_activations_type(*g.ctx, ch.a) || !vk::q8_activations_type(*g.ctx, ch.b)) continue;
    std::mt19937 rng(ch.embd * 7 + ch.mid);
    auto wa = vktest::upload_matrix(g, ch.a, ch.mid, ch.embd, vktest::random_matrix(rng, ch.a, ch.mid, ch.embd));
    const std::vector<uint8_t> wb_bytes = vktest::random_matrix(rng, ch.b, ch.out, ch.mid);
    auto wb = vktest::upload_matrix(g, ch.b, ch.out, ch.mid, wb_bytes);
    const std::vector<float> xv = vktest::random_values(rng, ch.embd), n1 = vktest::random_values(rng, ch.embd),
                             n2 = vktest::random_values(rng, ch.mid);
    auto buffer = [&](const std::vector<float>& v, const char* name) {
      vk::Buffer b = vktest::make_buffer(g, v.size() * 4, name);
      vktest::upload_bytes(g, b, v.data(), v.size() * 4);
      return b;
    };
    vk::Buffer x = buffer(xv, "x"), nw1 = buffer(n1, "norm 1"), nw2 = buffer(n2, "norm 2");

    vk::MatvecOp a;
    a.w = wa->ref;
    a.x = x.whole();
    a.norm_weight = nw1.whole();
    a.out_q8_norm = nw2.whole();
    a.out_q8_halves = halves;
    ASSERT_TRUE(a.out_q8_supported(*g.ctx));
    const uint32_t parts = a.out_parts(*g.ctx);
    EXPECT_EQ(parts, ch.mid / (halves ? 16 : 32)) << "rows per workgroup";
    vk::Buffer y1 = vktest::make_buffer(g, ch.mid * 4ull, "y1"), y1_plain = vktest::make_buffer(g, ch.mid * 4ull, "y1 plain");
    vk::Buffer yq = vktest::make_buffer(g, ch.mid / 32 * 48ull, "y1 int8"), ss = vktest::make_buffer(g, parts * 4ull, "sums");
    for (vk::Buffer* b : {&y1, &y1_plain, &yq, &ss}) vktest::poison(g, *b);
    vk::MatvecOp a_plain = a;
    a_plain.y = y1_plain.whole();
    a_plain.out_q8_norm = {};
    a.y = y1.whole();
    a.out_q8 = yq.whole();
    a.out_q8_norm = nw2.whole();
    a.out_ss = ss.whole();
    EXPECT_NE(a.kernel_name(g.ctx.get()).find(halves ? ".oq8h" : ".oq8"), std::string::npos);

    // Consumers: int8 x with the sums (ungated, and gated on the producer's word), and the staged
    // kernel with the fused norm on the producer's y.
    vk::Buffer gate = vktest::make_buffer(g, 16, "gate", true), err = vktest::make_buffer(g, 16, "gate error", true);
    const uint32_t zero[4] = {};
    vktest::upload_bytes(g, gate, zero, sizeof zero);
    vktest::upload_bytes(g, err, zero, sizeof zero);
    vk::Buffer y2[3] = {vktest::make_buffer(g, ch.out * 4ull, "y2 int8"), vktest::make_buffer(g, ch.out * 4ull, "y2 gated"),
                        vktest::make_buffer(g, ch.out * 4ull, "y2 staged")};
    vk::MatvecOp b[3];
    for (int k = 0; k < 3; ++k) {
      vktest::poison(g, y2[k]);
      b[k].w = wb->ref;
      b[k].x = y1.whole();
      b[k].y = y2[k].whole();
      b[k].norm_eps = 1e-5f;
      if (k < 2) {
        b[k].x_q8 = yq.whole();
        b[k].x_ss = ss.whole();
        b[k].x_ss_parts = parts;
        b[k].x_q8_halves = halves;
      } else {
        b[k].norm_weight = nw2.whole();
      }
    }
    EXPECT_NE(b[0].kernel_name(g.ctx.get()).find(".xq8.rms"), std::string::npos);
    const bool gated = b[1].gate_supported(*g.ctx);
    if (gated) {
      a.signal = gate.whole();
      b[1].gate = {gate.whole(), 0, a.signal_count(*g.ctx), err.whole()};
    }
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    a_plain.record(rec);
    a.record(rec);
    if (gated) b[1].record(rec);  // no barrier: waits on the producer's gate
    rec.barrier();
    b[0].record(rec);
    b[2].record(rec);
    rec.end();
    rec.run();
    ++ran;

    // The producer's y is the plain kernel's (32 rows per workgroup change no sum's order).
    const std::vector<float> yv = vktest::download_floats(g, y1, ch.mid), yp = vktest::download_floats(g, y1_plain, ch.mid);
    for (uint32_t i = 0; i < ch.mid; ++i) ASSERT_EQ(yv[i], yp[i]) << "row " << i;
    // Its int8 blocks are those of y times the next norm's weight; the sums add up to sum(y^2).
    std::vector<float> scaled(ch.mid);
    double want_ss = 0;
    for (uint32_t i = 0; i < ch.mid; ++i) {
      scaled[i] = yv[i] * n2[i];
      want_ss += double(yv[i]) * yv[i];
    }
    std::vector<uint32_t> got_q(ch.mid / 32 * 12);
    yq.read(0, got_q.data(), got_q.size() * 4);
    vktest::expect_q8_blocks_close(got_q, vktest::q8_blocks(scaled, halves), "the producer's int8 output");
    const std::vector<float> parts_v = vktest::download_floats(g, ss, parts);
    double got_ss = 0;
    for (float p : parts_v) got_ss += p;
    EXPECT_NEAR(got_ss, want_ss, 1e-5 * want_ss);
    // The consumer on int8 x: whole blocks equal the staged kernel up to the rounding of 1/rms
    // (the same blocks); halves, W times the values of the producer's blocks / rms in double.
    const std::vector<float> y_int8 = vktest::download_floats(g, y2[0], ch.out), y_staged = vktest::download_floats(g, y2[2], ch.out);
    if (halves) {
      const std::vector<double> xq = vktest::q8_values(got_q);
      const double inv_rms = 1.0 / std::sqrt(want_ss / ch.mid + 1e-5);
      for (uint32_t i = 0; i < ch.out; ++i) {
        const vktest::RowDot d = vktest::row_dot(ch.b, wb_bytes, ch.mid, i, xq.data());
        ASSERT_NEAR(y_int8[i], d.sum * inv_rms, 1e-5 * d.mag * inv_rms + 1e-7) << "row " << i;
      }
    } else {
      float most = 0;
      for (float v : y_staged) most = std::max(most, std::fabs(v));
      for (uint32_t i = 0; i < ch.out; ++i) ASSERT_NEAR(y_int8[i], y_staged[i], 1e-5f * most) << "row " << i;
    }
    if (gated) {
      ++ran_gated;
      const std::vector<float> y_gated = vktest::download_floats(g, y2[1], ch.out);
      for (uint32_t i = 0; i < ch.out; ++i) ASSERT_EQ(y_gated[i], y_int8[i]) << "gated row " << i;
      uint32_t e[2];
      err.read(0, e, sizeof e);
      EXPECT_EQ(e[0], 0u) << "the gated consumer gave up";
    }
  }
  EXPECT_GE(ran, 4u);
  EXPECT_GE(ran_gated, 2u);
}

// Stacked per-head matrices (MatvecOp::x_head_rows, matvec_q8.comp X_HEAD_ROWS): row r reads x
// vector r / x_head_rows, as the factored value path's o_h = Vb_h olat_h. Against the CPU on the
// int8 x; with the plain int8 output (no norm: OUT_NORM 0) where the heads are whole blocks of
// rows, those blocks are y's; gated on a producer's word, the same bits.
TEST(MatvecHeadX, EachHeadReadsItsOwnVector) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_type(*g.ctx, GgmlType::Q4_0) || !g.ctx->pipelines().use_subgroup())
    GTEST_SKIP() << "no int8 kernel with subgroups here";
  struct HeadCase {
    GgmlType type;
    uint32_t heads, head_rows, cols;
    bool out_q8;
  };
  for (const HeadCase hc : {HeadCase{GgmlType::Q4_0, 5, 64, 96, true}, HeadCase{GgmlType::Q8_0, 3, 40, 64, false},
                            HeadCase{GgmlType::Q4_K, 2, 32, 256, true}}) {
    SCOPED_TRACE(cat(type_name(hc.type), " ", hc.heads, " heads x ", hc.head_rows, " rows x ", hc.cols));
    if (!vk::q8_activations_type(*g.ctx, hc.type)) continue;
    const uint32_t rows = hc.heads * hc.head_rows;
    std::mt19937 rng(rows + hc.cols);
    const std::vector<uint8_t> wv = vktest::random_matrix(rng, hc.type, rows, hc.cols);
    auto m = vktest::upload_matrix(g, hc.type, rows, hc.cols, wv);
    const std::vector<float> xv = vktest::random_values(rng, size_t(hc.heads) * hc.cols);
    const std::vector<uint32_t> xq = vktest::q8_blocks(xv);
    vk::Buffer x = vktest::make_buffer(g, xv.size() * 4, "x"), xq8 = vktest::make_buffer(g, xq.size() * 4, "x int8");
    vktest::poison(g, x);  // the int8 kernel reads x_q8 only
    vktest::upload_bytes(g, xq8, xq.data(), xq.size() * 4);
    vk::Buffer y = vktest::make_buffer(g, rows * 4ull, "y"), y_gated = vktest::make_buffer(g, rows * 4ull, "y gated");
    vk::Buffer yq = vktest::make_buffer(g, std::max(rows / 32, 1u) * 48ull, "y int8");
    for (vk::Buffer* b : {&y, &y_gated, &yq}) vktest::poison(g, *b);
    vk::MatvecOp op;
    op.w = m->ref;
    op.x = x.whole();
    op.x_q8 = xq8.whole();
    op.x_head_rows = hc.head_rows;
    op.y = y.whole();
    if (hc.out_q8) op.out_q8 = yq.whole();
    ASSERT_TRUE(op.head_x_supported(*g.ctx));
    EXPECT_NE(op.kernel_name(g.ctx.get()).find(".xq8"), std::string::npos);
    EXPECT_NE(op.kernel_name(g.ctx.get()).find(".hd"), std::string::npos);
    // The same op gated on a word that a one-row producer opens.
    vk::Buffer gate = vktest::make_buffer(g, 16, "gate", true), err = vktest::make_buffer(g, 16, "gate error", true);
    const uint32_t zero[4] = {};
    vktest::upload_bytes(g, gate, zero, sizeof zero);
    vktest::upload_bytes(g, err, zero, sizeof zero);
    vk::MatvecOp gated = op;
    gated.y = y_gated.whole();
    gated.out_q8 = {};
    vk::Buffer py = vktest::make_buffer(g, 32 * 4, "producer y");
    vk::MatvecOp producer;
    auto pm = vktest::upload_matrix(g, GgmlType::Q8_0, 32, 64, vktest::random_matrix(rng, GgmlType::Q8_0, 32, 64));
    vk::Buffer px = vktest::make_buffer(g, 64 * 4, "producer x");
    vktest::upload_bytes(g, px, vktest::random_values(rng, 64).data(), 64 * 4);
    producer.w = pm->ref;
    producer.x = px.whole();
    producer.y = py.whole();
    const bool can_gate = gated.gate_supported(*g.ctx) && producer.signal_supported(*g.ctx);
    if (can_gate) {
      producer.signal = gate.whole();
      gated.gate = {gate.whole(), 0, producer.signal_count(*g.ctx), err.whole()};
    }
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    op.record(rec);
    if (can_gate) {
      producer.record(rec);
      gated.record(rec);
    }
    rec.end();
    rec.run();

    const std::vector<float> got = vktest::download_floats(g, y, rows);
    std::vector<double> want(rows), tol(rows);
    for (uint32_t r = 0; r < rows; ++r) {
      const uint32_t h = r / hc.head_rows;
      std::vector<double> xin(hc.cols);
      for (uint32_t k = 0; k < hc.cols; ++k) xin[k] = xv[size_t(h) * hc.cols + k];
      xin = vktest::q8_round(xin);
      const vktest::RowDot d = vktest::row_dot(hc.type, wv, hc.cols, r, xin.data());
      want[r] = d.sum;
      tol[r] = 1e-4 * d.mag + 1e-30;
    }
    vktest::expect_close(got, want, tol, "per-head matvec");
    if (hc.out_q8) {
      std::vector<uint32_t> got_q(rows / 32 * 12);
      yq.read(0, got_q.data(), got_q.size() * 4);
      vktest::expect_q8_blocks_close(got_q, vktest::q8_blocks(got), "its int8 output (no norm)");
    }
    if (can_gate) {
      const std::vector<float> gv = vktest::download_floats(g, y_gated, rows);
      for (uint32_t r = 0; r < rows; ++r) ASSERT_EQ(gv[r], got[r]) << "gated row " << r;
      uint32_t e[2];
      err.read(0, e, sizeof e);
      EXPECT_EQ(e[0], 0u) << "the gated kernel gave up";
    }
  }
  // Refused: heads that do not divide the rows, and without int8 x.
  std::mt19937 rng(9);
  auto m = vktest::upload_matrix(g, GgmlType::Q4_0, 96, 64, vktest::random_matrix(rng, GgmlType::Q4_0, 96, 64));
  vk::Buffer b = vktest::make_buffer(g, 4096, "any");
  vk::MatvecOp op;
  op.w = m->ref;
  op.x = op.y = b.whole();
  op.x_head_rows = 32;
  EXPECT_FALSE(op.head_x_supported(*g.ctx)) << "no int8 x";
  op.x_q8 = b.whole();
  EXPECT_TRUE(op.head_x_supported(*g.ctx));
  op.x_head_rows = 40;
  EXPECT_FALSE(op.head_x_supported(*g.ctx)) << "40 does not divide 96";
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  EXPECT_THROW(op.record(rec), Error);
  rec.end();
}

// Refused where it cannot work: rows that are not whole blocks of 32, the f32 kernel; sums of
// squares without int8 x.
TEST(MatvecInt8Output, RefusedWhereItDoesNotApply) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_type(*g.ctx, GgmlType::Q4_0) || !g.ctx->pipelines().use_subgroup())
    GTEST_SKIP() << "no int8 kernel with subgroups here";
  std::mt19937 rng(5);
  auto m = vktest::upload_matrix(g, GgmlType::Q4_0, 40, 64, vktest::random_matrix(rng, GgmlType::Q4_0, 40, 64));
  vk::Buffer x = vktest::make_buffer(g, 64 * 4, "x"), y = vktest::make_buffer(g, 64 * 4, "y"), q = vktest::make_buffer(g, 4096, "q");
  vk::MatvecOp op;
  op.w = m->ref;
  op.x = x.whole();
  op.y = y.whole();
  op.out_q8 = q.whole();
  op.out_q8_norm = q.whole();
  op.out_ss = q.whole();
  EXPECT_FALSE(op.out_q8_supported(*g.ctx)) << "40 rows";
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  EXPECT_THROW(op.record(rec), Error);
  op.out_q8 = {};
  op.x_ss = q.whole();
  op.x_ss_parts = 1;
  EXPECT_THROW(op.record(rec), Error) << "sums without int8 x";
  rec.end();
}

}  // namespace
}  // namespace tessera
