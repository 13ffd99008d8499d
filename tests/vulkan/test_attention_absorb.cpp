// absorb.comp (factored MLA path: q_lat_h = Kb_h q_nope_h with q_pe copied, o_h = Vb_h olat_h)
// against plain loops over the dequantized weights, for every readable weight type, SPLIT1 and
// plain layouts, the subgroup and the shared-memory reduction paths, outputs poisoned.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/quant.h"
#include "runtime/vulkan/kernels_attention.h"
#include "tests/vulkan/test_attention_ref.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera {
namespace {

struct AbsorbCase {
  GgmlType type;
  bool no_subgroup_ops;  // force the shared-memory reduction path
};
void PrintTo(const AbsorbCase& c, std::ostream* os) {
  *os << type_name(c.type) << (c.no_subgroup_ops ? " shared-memory" : " subgroup");
}
class AbsorbTest : public ::testing::TestWithParam<AbsorbCase> {};

// Dequantized rows x cols matrix and its device copy.
struct TestMatrix {
  std::vector<float> values;
  std::unique_ptr<vktest::DeviceMatrix> device;
};
TestMatrix make_matrix(vktest::Gpu& g, std::mt19937& rng, GgmlType type, uint32_t rows, uint32_t cols) {
  const std::vector<uint8_t> gguf = vktest::random_matrix(rng, type, rows, cols);
  TestMatrix m;
  for (uint32_t r = 0; r < rows; ++r) {
    const std::vector<float> row = vktest::dequant_row(type, gguf, cols, r);
    m.values.insert(m.values.end(), row.begin(), row.end());
  }
  m.device = vktest::upload_matrix(g, type, rows, cols, gguf);
  return m;
}

// Tolerance of output (h, r): f32 accumulation error relative to sum_k |w x|.
std::vector<double> tolerances(const std::vector<float>& w, const std::vector<float>& x, uint32_t n_head, uint32_t rows,
                               uint32_t cols, uint32_t x_stride, uint32_t y_stride, uint32_t y_size) {
  std::vector<double> tol(y_size, 0.0);
  for (uint32_t h = 0; h < n_head; ++h)
    for (uint32_t r = 0; r < rows; ++r) {
      double mag = 0;
      for (uint32_t k = 0; k < cols; ++k) mag += std::abs(double(w[(size_t(h) * rows + r) * cols + k]) * x[h * x_stride + k]);
      tol[h * y_stride + r] = 1e-5 * mag + 1e-6;
    }
  return tol;
}

TEST_P(AbsorbTest, QueryAbsorptionAndValueProjectionMatchReference) {
  const AbsorbCase c = GetParam();
  vktest::Gpu& g = vktest::gpu(c.no_subgroup_ops);
  VK_TEST_REQUIRE_GPU(g);
  const bool kquant = type_info(c.type).block_elems == 256;
  std::mt19937 rng(uint32_t(c.type) * 7 + c.no_subgroup_ops);

  // D3': H heads, latent R, nope Dn (a multiple of the block), rope Dr.
  {
    const uint32_t n_head = kquant ? 3 : 5, kv_lora = kquant ? 40 : 72, n_nope = kquant ? 256 : 96, n_rot = 16;
    TestMatrix k_b = make_matrix(g, rng, c.type, n_head * kv_lora, n_nope);
    const std::vector<float> q_in = vktest::random_values(rng, size_t(n_head) * (n_nope + n_rot));
    vk::Buffer x = vktest::make_buffer(g, q_in.size() * 4, "q_b out");
    vk::Buffer y = vktest::make_buffer(g, size_t(n_head) * (kv_lora + n_rot) * 4, "q");
    vktest::upload_bytes(g, x, q_in.data(), q_in.size() * 4);
    vktest::poison(g, y);

    const vk::AbsorbOp op = vk::AbsorbOp::query(k_b.device->ref, n_head, n_rot, x.whole(), y.whole());
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    op.record(rec);
    rec.end();
    rec.run();
    EXPECT_EQ(rec.dispatch_count(), 1u);

    const uint32_t ys = kv_lora + n_rot, xs = n_nope + n_rot;
    std::vector<float> want_f(size_t(n_head) * ys);
    test::ref_absorb(k_b.values, q_in, want_f, n_head, kv_lora, n_nope, xs, 0, ys, 0);
    std::vector<double> tol = tolerances(k_b.values, q_in, n_head, kv_lora, n_nope, xs, ys, n_head * ys);
    for (uint32_t h = 0; h < n_head; ++h)
      for (uint32_t i = 0; i < n_rot; ++i) {
        want_f[h * ys + kv_lora + i] = q_in[h * xs + n_nope + i];  // q_pe copied exactly
        tol[h * ys + kv_lora + i] = 0;
      }
    vktest::expect_close(vktest::download_floats(g, y, want_f.size()), std::vector<double>(want_f.begin(), want_f.end()),
                         tol, "query absorb");
  }

  // D7': H heads, latent R (a multiple of the block), value width Dv.
  {
    const uint32_t n_head = kquant ? 3 : 5, kv_lora = kquant ? 512 : 128, n_v = kquant ? 24 : 40;
    TestMatrix v_b = make_matrix(g, rng, c.type, n_head * n_v, kv_lora);
    const std::vector<float> olat = vktest::random_values(rng, size_t(n_head) * kv_lora);
    vk::Buffer x = vktest::make_buffer(g, olat.size() * 4, "olat");
    vk::Buffer y = vktest::make_buffer(g, size_t(n_head) * n_v * 4, "o");
    vktest::upload_bytes(g, x, olat.data(), olat.size() * 4);
    vktest::poison(g, y);

    vk::AbsorbOp op = vk::AbsorbOp::value(v_b.device->ref, n_head, x.whole(), y.whole());
    op.label = "v_b";
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    op.record(rec);
    rec.end();
    rec.run();
    ASSERT_EQ(rec.dispatches().size(), 1u);
    EXPECT_EQ(rec.dispatches()[0].label, "v_b");
    EXPECT_EQ(rec.dispatches()[0].bytes, op.bytes());

    std::vector<float> want_f(size_t(n_head) * n_v);
    test::ref_absorb(v_b.values, olat, want_f, n_head, n_v, kv_lora, kv_lora, 0, n_v, 0);
    vktest::expect_close(vktest::download_floats(g, y, want_f.size()), std::vector<double>(want_f.begin(), want_f.end()),
                         tolerances(v_b.values, olat, n_head, n_v, kv_lora, kv_lora, n_v, n_head * n_v), "value projection");
  }
}

std::vector<AbsorbCase> all_cases() {
  std::vector<AbsorbCase> v;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                     GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    v.push_back({t, false});
  for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K}) v.push_back({t, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Types, AbsorbTest, ::testing::ValuesIn(all_cases()), [](const auto& info) {
  return std::string(type_name(info.param.type)) + (info.param.no_subgroup_ops ? "_shared" : "_subgroup");
});

TEST(AbsorbValidation, RefusesMismatchedShapes) {
  vktest::Gpu& g = vktest::gpu();
  VK_TEST_REQUIRE_GPU(g);
  std::mt19937 rng(5);
  TestMatrix k_b = make_matrix(g, rng, GgmlType::Q8_0, 5 * 16, 64);
  vk::Buffer x = vktest::make_buffer(g, 5 * 80 * 4, "x"), y = vktest::make_buffer(g, 5 * 32 * 4, "y");
  vk::CommandRecorder rec(*g.ctx);
  rec.begin();
  // 80 rows do not split into 3 heads.
  EXPECT_THROW(vk::AbsorbOp::query(k_b.device->ref, 3, 16, x.whole(), y.whole()).record(rec), Error);
  // y too small: 5 heads x (16 + 16) floats fit exactly; with 24 rope values they do not.
  EXPECT_NO_THROW(vk::AbsorbOp::query(k_b.device->ref, 5, 16, x.whole(), y.whole()).record(rec));
  EXPECT_THROW(vk::AbsorbOp::query(k_b.device->ref, 5, 24, x.whole(), y.whole()).record(rec), Error);
  // x offset not a multiple of 4.
  vk::AbsorbOp op = vk::AbsorbOp::query(k_b.device->ref, 5, 16, x.whole(), y.whole());
  op.x_offset = 2;
  op.x_stride = 82;
  EXPECT_THROW(op.record(rec), Error);
  rec.end();
}

}  // namespace
}  // namespace tessera
