// The matvec's early start (matvec_q8.comp WAIT_GATE, MatvecOp::gate; docs/DECODE.md "Early
// start"): the gated int8 matvec loads its weight blocks, waits on the gate word, then reads x's
// int8 blocks (or stages x). Against the ungated kernel on the same inputs: the same bits for
// every int8 type and awkward shapes (rows not a multiple of the workgroup, rows shorter than a
// subgroup's lanes, several rows per team); a matvec that opens a gate for the next one (SIGNAL_GATE);
// a gate that never opens sets the error word; and record() refuses the gate where the kernel
// cannot take it.
#include <algorithm>
#include <random>
#include <tuple>

#include "format/error.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/pipeline.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

using vktest::Gpu;

// The int8 kernel with subgroups runs here: the only matvec that waits on a gate or opens one.
bool int8_kernel_with_subgroups(Gpu& g) {
  return vk::q8_activations_type(*g.ctx, GgmlType::Q4_0) && g.ctx->pipelines().use_subgroup();
}

struct GateCase {
  GgmlType type;
  uint32_t rows, cols;
  uint32_t ksplit = 0, nrows = 0;  // MatvecTuning::ksplit / rows (0: auto)
  bool accumulate = true;
  uint32_t gate_x = 0;  // MatvecTuning::gate_x
  bool staged = false;  // x as floats, staged with the fused norm (the next layer's q_a / kv_a), not x_q8
  bool late = false;    // MatvecTuning::gate_late: the wait first, nothing loaded ahead
  bool residual = false;  // MatvecOp::residual: y0 in another buffer, y poisoned (written only)
  uint32_t preload_early = 0;  // MatvecTuning::preload_early: blocks per lane loaded before the wait
  uint32_t prefetch_rows = 0;  // MatvecOp::row_prefetch: rows of a 1152-byte cache read before the wait
};

std::string describe(const GateCase& c) {
  return cat(type_name(c.type), " ", c.rows, "x", c.cols, " ksplit ", c.ksplit, " rows ", c.nrows,
             c.accumulate ? " acc" : "", " gate_x ", c.gate_x, c.staged ? " staged+norm" : "", c.late ? " late" : "",
             c.residual ? " residual" : "", c.preload_early ? cat(" early ", c.preload_early) : "",
             c.prefetch_rows ? cat(" prefetch ", c.prefetch_rows) : "");
}

struct GateRun {
  std::vector<float> y;
  uint32_t error = 0, seen = 0;  // the error word and the gate value the wait saw last
};

// Runs the int8 matvec on x's int8 blocks, with the gate word preset to `gate_value` (gated) or
// without a gate; y starts from y0.
GateRun run(Gpu& g, const GateCase& c, const vk::MatrixRef& w, const vk::Buffer& xq8, const std::vector<float>& y0,
            bool gated, uint32_t gate_value, uint32_t target) {
  vk::Buffer x = vktest::make_buffer(g, uint64_t(c.cols) * 4, "x");
  vk::Buffer nw = vktest::make_buffer(g, uint64_t(c.cols) * 4, "norm weight");
  if (c.staged) {  // the same x and norm weight for the gated and the plain run
    std::mt19937 rng(c.rows * 7919u + c.cols);
    const std::vector<float> xv = vktest::random_values(rng, c.cols), nv = vktest::random_values(rng, c.cols);
    vktest::upload_bytes(g, x, xv.data(), xv.size() * 4);
    vktest::upload_bytes(g, nw, nv.data(), nv.size() * 4);
  } else {
    vktest::poison(g, x);  // the kernel reads the int8 blocks only
  }
  vk::Buffer y = vktest::make_buffer(g, y0.size() * 4, "y");
  vk::Buffer res = vktest::make_buffer(g, y0.size() * 4, "residual");
  vktest::upload_bytes(g, c.residual ? res : y, y0.data(), y0.size() * 4);
  if (c.residual) vktest::poison(g, y);
  vk::Buffer gate = vktest::make_buffer(g, 16, "gate");
  const uint32_t gate_words[4] = {gate_value, 0, 0, 0};
  vktest::upload_bytes(g, gate, gate_words, sizeof gate_words);
  vk::Buffer err = vktest::make_buffer(g, 16, "gate error", true);
  const uint32_t zero[4] = {};
  vktest::upload_bytes(g, err, zero, sizeof zero);

  vk::MatvecOp op;
  op.w = w;
  op.x = x.whole();
  if (c.staged) op.norm_weight = nw.whole();
  else op.x_q8 = xq8.whole();
  op.y = y.whole();
  op.accumulate = c.accumulate;
  op.tuning.ksplit = c.ksplit;
  op.tuning.rows = c.nrows;
  op.tuning.gate_x = c.gate_x;
  op.tuning.gate_late = c.late ? 1u : 0u;
  op.tuning.preload_early = c.preload_early;
  vk::Buffer rows, step;
  if (gated && c.prefetch_rows) {
    constexpr uint32_t kRowBytes = 1152, kPosWord = 3;
    rows = vktest::make_buffer(g, uint64_t(c.prefetch_rows) * kRowBytes, "cache rows");
    vktest::poison(g, rows);
    step = vktest::make_buffer(g, 16, "step words");
    const uint32_t words[4] = {0, 0, 0, c.prefetch_rows - 1};  // pos: every row before it is read
    vktest::upload_bytes(g, step, words, sizeof words);
    op.row_prefetch = {rows.whole(), step.whole(), kPosWord, kRowBytes, c.prefetch_rows};
  }
  if (c.residual) {
    op.residual = res.whole();
    EXPECT_NE(op.kernel_name(g.ctx.get()).find(".res"), std::string::npos) << describe(c);
  }
  if (gated) {
    op.gate = {gate.whole(), 0, target, err.whole()};
    EXPECT_NE(op.kernel_name(g.ctx.get()).find(".gate"), std::string::npos) << describe(c);
    if (c.prefetch_rows) {
      EXPECT_NE(op.kernel_name(g.ctx.get()).find(".pf"), std::string::npos) << describe(c);
    }
  }
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  op.record(rec);
  rec.end();
  rec.run();
  GateRun r;
  r.y = vktest::download_floats(g, y, y0.size());
  uint32_t words[4];
  err.read(0, words, sizeof words);
  r.error = words[0];
  r.seen = words[1];
  return r;
}

// A matrix and x's int8 blocks for a case; skips (returns false) where the gate does not apply.
bool setup(Gpu& g, const GateCase& c, uint32_t seed, std::unique_ptr<vktest::DeviceMatrix>& dm, vk::Buffer& xq8,
           std::vector<float>& y0) {
  std::mt19937 rng(seed);
  const std::vector<uint8_t> w = vktest::random_matrix(rng, c.type, c.rows, c.cols);
  dm = vktest::upload_matrix(g, c.type, c.rows, c.cols, w);
  const std::vector<uint32_t> blocks = vktest::q8_blocks(vktest::random_values(rng, c.cols));
  xq8 = vktest::make_buffer(g, blocks.size() * 4, "x q8");
  vktest::upload_bytes(g, xq8, blocks.data(), blocks.size() * 4);
  y0 = vktest::random_values(rng, c.rows);
  vk::MatvecOp probe;
  probe.w = dm->ref;
  if (c.staged) probe.norm_weight = xq8.whole();  // any buffer: the variant only
  else probe.x_q8 = xq8.whole();
  probe.tuning.ksplit = c.ksplit;
  probe.tuning.rows = c.nrows;
  probe.tuning.gate_x = c.gate_x;
  return probe.gate_supported(*g.ctx);
}

// Expects op.record() to throw an Error whose message contains `message` (`why` names the case).
void expect_refused(Gpu& g, const vk::MatvecOp& op, const char* why, const char* message) {
  SCOPED_TRACE(why);
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  try {
    op.record(rec);
    ADD_FAILURE() << "recorded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
  rec.end();
}

// Runs case `a` and case `b` (each gated, with the gate already open, or not) on the same matrix,
// int8 x and y0 (from `seed`) and expects the same y bit for bit and no wait that gave up.
// Returns false, running nothing, where the gate does not apply to `a`.
bool same_bits(Gpu& g, const GateCase& a, bool a_gated, const GateCase& b, bool b_gated, uint32_t seed) {
  std::unique_ptr<vktest::DeviceMatrix> dm;
  vk::Buffer xq8;
  std::vector<float> y0;
  if (!setup(g, a, seed, dm, xq8, y0)) return false;
  const GateRun ra = run(g, a, dm->ref, xq8, y0, a_gated, 3, 3);
  const GateRun rb = run(g, b, dm->ref, xq8, y0, b_gated, 3, 3);
  EXPECT_EQ(ra.error, 0u);
  EXPECT_EQ(rb.error, 0u);
  EXPECT_EQ(ra.y.size(), rb.y.size());
  for (size_t i = 0; i < std::min(ra.y.size(), rb.y.size()); ++i) {
    EXPECT_EQ(ra.y[i], rb.y[i]) << "row " << i;
    if (ra.y[i] != rb.y[i]) break;  // the first differing row says enough
  }
  return true;
}

TEST(MatvecGate, OpenGateGivesTheUngatedBits) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!int8_kernel_with_subgroups(g))
    GTEST_SKIP() << "no int8 kernel with subgroups here";
  const uint32_t sg = g.ctx->info().subgroup_size;
  const std::vector<GateCase> cases = {
      {GgmlType::Q8_0, 67, 32 * sg, 2},        // W_vo's split: two subgroups per row, blocks per lane < 1
      {GgmlType::Q8_0, 1000, 96 * sg, 2},      // 3 blocks per lane
      {GgmlType::Q4_0, 7, 32 * (2 * sg + 3)},  // the last block round partly past the row
      {GgmlType::Q4_0, 3000, 64, 0, 0, false}, // more rows than kFewRows: several rows per team; no accumulate
      {GgmlType::Q4_K, 33, 256 * sg / 4, 2},
      {GgmlType::Q6_K, 19, 512, 1, 2},
      // staged x with the fused norm (one pass, one subgroup per row): q_a / kv_a after the MoE down
      {GgmlType::Q4_0, 77, 64 * sg, 1, 0, false, 0, true},
      {GgmlType::Q8_0, 5, 32 * (sg + 5), 1, 0, false, 0, true},
      {GgmlType::Q4_K, 3000, 256, 1, 0, false, 0, true},
  };
  uint32_t seed = 7, ran = 0, ran_staged = 0;
  for (const GateCase& base : cases) {
    for (uint32_t gx : {0u, 1u, 2u, 3u, 4u}) {  // auto, coherent per lane, staged, plain per lane; late
      GateCase c = base;
      c.gate_x = gx % 4;
      c.late = gx == 4;
      SCOPED_TRACE(describe(c));
      if (!vk::q8_activations_type(*g.ctx, c.type)) continue;
      if (!same_bits(g, c, false, c, true, ++seed)) continue;
      ++ran;
      ran_staged += c.staged ? 1 : 0;
    }
  }
  EXPECT_GE(ran, 20u) << "too few cases took the gate";
  EXPECT_GE(ran_staged, 10u) << "too few staged cases took the gate";
}

// Part of the preload after the wait (MatvecTuning::preload_early: W_vo's stream beside the
// attention thinned) and the cache rows read before it (MatvecOp::row_prefetch: W_qk warming the
// L2 for the attention): the same products in the same order, so the ungated kernel's bits.
TEST(MatvecGate, PartialPreloadAndRowPrefetchGiveTheUngatedBits) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!int8_kernel_with_subgroups(g)) GTEST_SKIP() << "no int8 kernel with subgroups here";
  const uint32_t sg = g.ctx->info().subgroup_size;
  uint32_t seed = 301, ran = 0;
  for (uint32_t early : {0u, 1u, 2u}) {
    for (uint32_t rows : {0u, 1u, 200u}) {
      for (const GateCase& base : {GateCase{GgmlType::Q8_0, 1000, 96 * sg, 2},  // 3 blocks per lane
                                   GateCase{GgmlType::Q4_0, 37, 32 * (4 * sg + 3), 1},  // 5, the last partly past the row
                                   GateCase{GgmlType::Q4_0, 77, 64 * sg, 1, 0, true, 0, true}}) {  // staged x (no early split)
        GateCase c = base;
        c.preload_early = early;
        c.prefetch_rows = rows;
        SCOPED_TRACE(describe(c));
        if (same_bits(g, c, false, c, true, ++seed)) ++ran;
      }
    }
  }
  EXPECT_EQ(ran, 27u);
  bool partial = false;
  for (const vk::Pipeline* p : g.ctx->pipelines().all()) partial = partial || p->name().find(".pe1") != std::string::npos;
  EXPECT_TRUE(partial) << "no kernel with PRELOAD_EARLY was built";
}

// The residual from another buffer (MatvecOp::residual, matvec_q8.comp RESIDUAL_IN: W_vo writing
// the other of the decode step's two x buffers): y = residual + W x with y poisoned before, the
// bits of the in-place add, gated (preloaded into shared memory before the wait, with the late
// wait too) and not, on int8 x and on staged x with the fused norm; refused without accumulate.
TEST(MatvecGate, ResidualFromAnotherBufferGivesTheInPlaceBits) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!int8_kernel_with_subgroups(g))
    GTEST_SKIP() << "no int8 kernel with subgroups here";
  const uint32_t sg = g.ctx->info().subgroup_size;
  const std::vector<GateCase> cases = {
      {GgmlType::Q8_0, 67, 32 * sg, 2},          // W_vo's split
      {GgmlType::Q4_0, 3000, 64, 0, 0, true},    // several rows per team, rows not a multiple of the workgroup
      {GgmlType::Q4_0, 77, 64 * sg, 1, 0, true, 0, true},  // staged with the norm
  };
  uint32_t seed = 101, ran = 0;
  for (const GateCase& base : cases) {
    for (int mode : {0, 1, 2}) {  // ungated, gated, gated late
      GateCase c = base;
      c.late = mode == 2;
      SCOPED_TRACE(cat(describe(c), mode ? " gated" : ""));
      GateCase other = c;
      other.residual = true;
      if (same_bits(g, c, mode > 0, other, mode > 0, ++seed)) ++ran;
    }
  }
  EXPECT_GE(ran, 6u) << "too few cases ran";
  // Without accumulate there is nothing to add it to: refused, naming the problem.
  std::mt19937 rng(5);
  auto dm = vktest::upload_matrix(g, GgmlType::Q4_0, 32, 64, vktest::random_matrix(rng, GgmlType::Q4_0, 32, 64));
  vk::Buffer x = vktest::make_buffer(g, 64 * 4, "x"), y = vktest::make_buffer(g, 32 * 4, "y");
  vk::MatvecOp op;
  op.w = dm->ref;
  op.x = x.whole();
  op.y = y.whole();
  op.residual = y.whole();
  EXPECT_FALSE(op.residual_supported(*g.ctx));
  expect_refused(g, op, "a residual without accumulate", "residual");
}

// The producer's side (MatvecOp::signal, matvec_q8.comp SIGNAL_GATE): q_a opening W_qk's gate.
// A norm-fused matvec that opens a gate and a gated one that reads its y, recorded with no barrier
// between them, give the bits of the two with a barrier; the gate word ends at signal_count(),
// which is one arrival per workgroup with rows (16 rows each for at most 2048 rows); the producer's
// own y is unchanged by the signal.
TEST(MatvecGate, ProducerOpensTheGateForItsConsumer) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!int8_kernel_with_subgroups(g))
    GTEST_SKIP() << "no int8 kernel with subgroups here";
  struct Chain {
    uint32_t embd, mid, out;  // producer embd -> mid rows, consumer mid -> out rows
    GgmlType a, b;
  };
  uint32_t ran = 0;
  // q_a-like, a producer taller than kFewRows (several rows per team, 2 teams' rows in its last
  // workgroup), a producer of two workgroups; consumers of rows not a multiple of anything.
  for (const Chain ch : {Chain{256, 96, 70, GgmlType::Q4_0, GgmlType::Q8_0}, Chain{96, 2080, 33, GgmlType::Q8_0, GgmlType::Q4_0},
                         Chain{64, 32, 5, GgmlType::Q4_0, GgmlType::Q8_0}}) {
    const uint32_t mid = ch.mid;  // the producer's rows, the consumer's row length
    SCOPED_TRACE(cat(ch.embd, " -> ", mid, " -> ", ch.out));
    std::mt19937 rng(ch.embd + ch.mid);
    auto wa = vktest::upload_matrix(g, ch.a, mid, ch.embd, vktest::random_matrix(rng, ch.a, mid, ch.embd));
    auto wb = vktest::upload_matrix(g, ch.b, ch.out, mid, vktest::random_matrix(rng, ch.b, ch.out, mid));
    vk::MatvecOp probe;
    probe.w = wb->ref;
    probe.norm_weight = wb->buffer.whole();  // any buffer: the variant only
    if (!probe.gate_supported(*g.ctx)) continue;  // too many blocks per lane for narrow subgroups
    ++ran;
    const std::vector<float> xv = vktest::random_values(rng, ch.embd), n1 = vktest::random_values(rng, ch.embd),
                             n2 = vktest::random_values(rng, mid);
    std::vector<float> ys[2][2];
    uint32_t word = 0, count = 0;
    for (bool early : {false, true}) {
      vk::Buffer x = vktest::make_buffer(g, xv.size() * 4, "x"), nw1 = vktest::make_buffer(g, n1.size() * 4, "norm 1");
      vk::Buffer nw2 = vktest::make_buffer(g, n2.size() * 4, "norm 2");
      vktest::upload_bytes(g, x, xv.data(), xv.size() * 4);
      vktest::upload_bytes(g, nw1, n1.data(), n1.size() * 4);
      vktest::upload_bytes(g, nw2, n2.data(), n2.size() * 4);
      vk::Buffer y1 = vktest::make_buffer(g, uint64_t(mid) * 4, "y1"), y2 = vktest::make_buffer(g, ch.out * 4ull, "y2");
      vktest::poison(g, y1);
      vktest::poison(g, y2);
      vk::Buffer gate = vktest::make_buffer(g, 16, "gate", true), err = vktest::make_buffer(g, 16, "gate error", true);
      const uint32_t zero[4] = {};
      vktest::upload_bytes(g, gate, zero, sizeof zero);
      vktest::upload_bytes(g, err, zero, sizeof zero);
      vk::MatvecOp a;
      a.w = wa->ref;
      a.x = x.whole();
      a.y = y1.whole();
      a.norm_weight = nw1.whole();
      vk::MatvecOp b;
      b.w = wb->ref;
      b.x = y1.whole();
      b.y = y2.whole();
      b.norm_weight = nw2.whole();
      if (early) {
        ASSERT_TRUE(a.signal_supported(*g.ctx));
        a.signal = gate.whole();
        a.signal_word = 1;
        count = a.signal_count(*g.ctx);
        b.gate = {gate.whole(), 1, count, err.whole()};
        EXPECT_NE(a.kernel_name(g.ctx.get()).find(".open"), std::string::npos);
      }
      vk::CommandRecorder rec(*g.ctx);
      rec.begin();
      a.record(rec);
      if (!early) rec.barrier();
      b.record(rec);
      rec.end();
      rec.run();
      ys[early][0] = vktest::download_floats(g, y1, mid);
      ys[early][1] = vktest::download_floats(g, y2, ch.out);
      if (early) {
        uint32_t words[4], errs[2];
        gate.read(0, words, sizeof words);
        err.read(0, errs, sizeof errs);
        word = words[1];
        EXPECT_EQ(words[0], 0u) << "only the asked word counts";
        EXPECT_EQ(errs[0], 0u) << "the consumer's wait gave up";
      }
    }
    EXPECT_EQ(word, count);
    if (mid <= 2048) EXPECT_EQ(count, (mid + 15) / 16);
    else EXPECT_GE(count, 1u);
    for (int k = 0; k < 2; ++k)
      for (size_t i = 0; i < ys[0][k].size(); ++i) ASSERT_EQ(ys[0][k][i], ys[1][k][i]) << "output " << k << " row " << i;
  }
  EXPECT_GE(ran, 2u) << "too few chains took the gate";
}

// The ungated staged path with the weights loaded before the staging (MatvecTuning::preload_blocks,
// matvec_q8.comp PRELOAD_FIRST), and with x's staged values loaded before them (input_first,
// INPUT_FIRST): the bits of the default order, for every int8 type, rows not a multiple of the
// workgroup, rows of fewer blocks than a subgroup has lanes, several rows per subgroup (W_qk's
// split).
TEST(MatvecGate, PreloadFirstGivesTheSameBits) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!g.ctx->pipelines().use_subgroup()) GTEST_SKIP() << "no subgroups";
  const uint32_t sg = g.ctx->info().subgroup_size;
  uint32_t ran = 0;
  for (const auto& [type, rows, cols] : {std::tuple{GgmlType::Q4_0, 77u, 32 * (2 * sg - 3)}, std::tuple{GgmlType::Q8_0, 16u, 32 * sg},
                                         std::tuple{GgmlType::Q4_K, 35u, 256u}, std::tuple{GgmlType::Q6_K, 3u, 512u},
                                         std::tuple{GgmlType::Q4_0, 19u, 96u}, std::tuple{GgmlType::Q8_0, 3000u, 96u}}) {
    SCOPED_TRACE(cat(type_name(type), " ", rows, "x", cols));
    if (!vk::q8_activations_type(*g.ctx, type) || cols > 64 * sg) continue;
    std::mt19937 rng(rows * 31 + cols);
    auto dm = vktest::upload_matrix(g, type, rows, cols, vktest::random_matrix(rng, type, rows, cols));
    const std::vector<float> xv = vktest::random_values(rng, cols), nv = vktest::random_values(rng, cols);
    vk::Buffer x = vktest::make_buffer(g, cols * 4ull, "x"), nw = vktest::make_buffer(g, cols * 4ull, "norm");
    vktest::upload_bytes(g, x, xv.data(), xv.size() * 4);
    vktest::upload_bytes(g, nw, nv.data(), nv.size() * 4);
    std::vector<float> y[3];
    for (uint32_t pre : {0u, 1u, 2u}) {  // off, weights first, weights first after x's loads
      vk::Buffer yb = vktest::make_buffer(g, rows * 4ull, "y");
      vktest::poison(g, yb);
      vk::MatvecOp op;
      op.w = dm->ref;
      op.x = x.whole();
      op.y = yb.whole();
      op.norm_weight = nw.whole();
      op.tuning.preload_blocks = pre ? 8 : 0;  // every case / off
      op.tuning.input_first = pre == 2;
      vk::CommandRecorder rec(*g.ctx);
      rec.begin();
      op.record(rec);
      rec.end();
      rec.run();
      y[pre] = vktest::download_floats(g, yb, rows);
    }
    ++ran;
    for (uint32_t i = 0; i < rows; ++i) {
      ASSERT_EQ(y[0][i], y[1][i]) << "row " << i;
      ASSERT_EQ(y[0][i], y[2][i]) << "row " << i << " (input first)";
    }
  }
  EXPECT_GE(ran, 3u);
  bool built = false, input_first = false;  // the variants were made (their pipelines' names)
  for (const vk::Pipeline* p : g.ctx->pipelines().all()) {
    built = built || p->name().ends_with(".pre");
    input_first = input_first || p->name().ends_with(".pre.in");
  }
  EXPECT_TRUE(built);
  EXPECT_TRUE(input_first);
}

// A gate that never reaches its target: the wait gives up and sets the error word (the decode
// step then re-records without the early start) instead of hanging the queue.
TEST(MatvecGate, GateThatNeverOpensSetsTheErrorWord) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!vk::q8_activations_type(*g.ctx, GgmlType::Q8_0) || !g.ctx->pipelines().use_subgroup())
    GTEST_SKIP() << "no int8 kernel with subgroups here";
  const GateCase c{GgmlType::Q8_0, 5, 64, 1};
  std::unique_ptr<vktest::DeviceMatrix> dm;
  vk::Buffer xq8;
  std::vector<float> y0;
  ASSERT_TRUE(setup(g, c, 3, dm, xq8, y0));
  const GateRun short_by_one = run(g, c, dm->ref, xq8, y0, true, 2, 3);
  EXPECT_EQ(short_by_one.error, 1u);
  EXPECT_EQ(short_by_one.seen, 2u);
  EXPECT_EQ(run(g, c, dm->ref, xq8, y0, true, 0, 1000).error, 1u);
  // The same with steps between the polls (gate.glsl GATE_BACKOFF, a process-wide define).
  g.ctx->pipelines().set_global_define("GATE_BACKOFF", "16");
  const GateRun backoff = run(g, c, dm->ref, xq8, y0, true, 2, 3);
  g.ctx->pipelines().set_global_define("GATE_BACKOFF", "0");
  EXPECT_EQ(backoff.error, 1u);
  EXPECT_EQ(backoff.seen, 2u);
}

// The gate only where the kernel can take it: the int8 kernel with pre-quantized x, and few
// enough blocks per lane to hold while waiting.
TEST(MatvecGate, RefusedWhereTheKernelCannotWait) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  std::mt19937 rng(11);
  const uint32_t rows = 9, cols = 32 * 64 * 9;  // 9 blocks per lane even with 64 lanes per row
  auto dm = vktest::upload_matrix(g, GgmlType::Q8_0, rows, cols, vktest::random_matrix(rng, GgmlType::Q8_0, rows, cols));
  vk::Buffer x = vktest::make_buffer(g, uint64_t(cols) * 4, "x"), y = vktest::make_buffer(g, rows * 4, "y");
  vk::Buffer xq8 = vktest::make_buffer(g, cols / 32 * 48, "x q8"), gate = vktest::make_buffer(g, 16, "gate");
  vk::MatvecOp op;
  op.w = dm->ref;
  op.x = x.whole();
  op.y = y.whole();
  op.gate = {gate.whole(), 0, 1, gate.whole()};
  auto refused = [&](const char* why) {
    SCOPED_TRACE(why);
    EXPECT_FALSE(op.gate_supported(*g.ctx));
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    EXPECT_THROW(op.record(rec), Error);
    rec.end();
  };
  refused("no int8 x");
  op.x_q8 = xq8.whole();
  refused("too many blocks per lane");
  op.int8_activations = false;
  refused("the f32 kernel");
}

// A row prefetch only comes with the early-started int8 kernel that loads its weights first, and
// its buffers must hold what it reads; anything else is refused with an error naming it.
TEST(MatvecGate, RowPrefetchRefusedWhereItCannotRun) {
  Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  if (!int8_kernel_with_subgroups(g)) GTEST_SKIP() << "no int8 kernel with subgroups here";
  std::mt19937 rng(12);
  const uint32_t rows = 64, cols = 256;
  auto dm = vktest::upload_matrix(g, GgmlType::Q8_0, rows, cols, vktest::random_matrix(rng, GgmlType::Q8_0, rows, cols));
  vk::Buffer x = vktest::make_buffer(g, uint64_t(cols) * 4, "x"), y = vktest::make_buffer(g, rows * 4, "y");
  vk::Buffer xq8 = vktest::make_buffer(g, cols / 32 * 48, "x q8"), gate = vktest::make_buffer(g, 16, "gate");
  vk::Buffer cache = vktest::make_buffer(g, 4 * 1152, "cache"), step = vktest::make_buffer(g, 16, "step");
  vk::MatvecOp op;
  op.w = dm->ref;
  op.x = x.whole();
  op.x_q8 = xq8.whole();
  op.y = y.whole();
  op.row_prefetch = {cache.whole(), step.whole(), 3, 1152, 4};
  auto refused = [&](const char* why, const char* message) { expect_refused(g, op, why, message); };
  EXPECT_FALSE(op.row_prefetch_supported(*g.ctx));
  refused("no gate", "row prefetch needs the early-started int8 kernel");
  op.gate = {gate.whole(), 0, 1, gate.whole()};
  ASSERT_TRUE(op.row_prefetch_supported(*g.ctx));
  op.tuning.gate_late = 1;
  EXPECT_FALSE(op.row_prefetch_supported(*g.ctx));
  refused("the late wait loads nothing first", "row prefetch needs the early-started int8 kernel");
  op.tuning.gate_late = 0;
  op.row_prefetch.max_rows = 5;
  refused("more rows than the cache holds", "row prefetch of 5 rows");
  op.row_prefetch.max_rows = 4;
  op.row_prefetch.pos_word = 4;
  refused("no such step word", "pos word 4");
  op.row_prefetch.pos_word = 3;
  op.row_prefetch.row_bytes = 1000;
  refused("rows not in whole 32-byte sectors", "rows of 1000 bytes");
}

}  // namespace
}  // namespace tessera
