#include "tests/vulkan/vk_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "format/error.h"

namespace tessera::vktest {

namespace {
Gpu shared[2];
bool made[2] = {false, false};

// The shared contexts are released when the tests end, before main returns. Left to the static
// destructors they were destroyed after the driver's own exit handlers (registered when the
// first context loaded it, so run before destructors registered earlier), and the portable
// test binary crashed at exit on the H100 after its tests had passed.
class ReleaseSharedGpus : public ::testing::Environment {
 public:
  void TearDown() override {
    for (Gpu& g : shared) {
      g.transfer.reset();
      g.host.reset();
      g.local.reset();
      g.ctx.reset();
      g.why = "released at the end of the tests";
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kReleaseSharedGpus = ::testing::AddGlobalTestEnvironment(new ReleaseSharedGpus);
}  // namespace

Gpu& gpu(bool no_subgroup_ops) {
  Gpu& g = shared[no_subgroup_ops ? 1 : 0];
  if (made[no_subgroup_ops ? 1 : 0]) return g;
  made[no_subgroup_ops ? 1 : 0] = true;
  try {
    vk::ContextOptions o;
    o.no_subgroup_ops = no_subgroup_ops;
    g.ctx = std::make_unique<vk::Context>(o);
    g.local = std::make_unique<vk::MemoryPool>(g.ctx->device(), vk::MemoryKind::DeviceLocal);
    g.host = std::make_unique<vk::MemoryPool>(g.ctx->device(), vk::MemoryKind::Host);
    g.transfer = std::make_unique<vk::Transfer>(g.ctx->device());
  } catch (const Error& e) {
    g.why = e.what();
    g.ctx.reset();
  }
  return g;
}

vk::Buffer make_buffer(Gpu& g, uint64_t bytes, const std::string& name, bool host_visible) {
  return (host_visible ? g.host : g.local)->create_buffer(bytes, name);
}

void upload_bytes(Gpu& g, vk::Buffer& b, const void* data, size_t bytes, uint64_t offset) {
  g.transfer->upload(b, offset, data, bytes);
  g.transfer->finish();
}

vk::Buffer buffer_of(Gpu& g, const std::vector<float>& values, const std::string& name) {
  vk::Buffer b = make_buffer(g, values.size() * 4, name);
  upload_bytes(g, b, values.data(), values.size() * 4);
  return b;
}

vk::Buffer step_buffer(Gpu& g, uint32_t p0, uint32_t n) {
  vk::Buffer b = make_buffer(g, 16, "step");
  const uint32_t w[4] = {p0, n, 0, 0};
  upload_bytes(g, b, w, sizeof w);
  return b;
}

std::vector<float> download_floats(Gpu& g, const vk::Buffer& b, size_t n, uint64_t offset) {
  std::vector<float> v(n);
  g.transfer->download(b, offset, v.data(), n * 4);
  return v;
}

void poison(Gpu& g, vk::Buffer& b) {
  std::vector<float> nan(b.size() / 4, std::numeric_limits<float>::quiet_NaN());
  upload_bytes(g, b, nan.data(), nan.size() * 4);
}

std::vector<float> random_values(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> mag(-2.f, 2.f);
  std::vector<float> v(n);
  float group = 1.f;
  for (size_t i = 0; i < n; ++i) {
    if (i % 16 == 0) group = std::exp(mag(rng));
    v[i] = normal(rng) * group * scale;
  }
  return v;
}

std::vector<uint8_t> random_matrix(std::mt19937& rng, GgmlType type, uint32_t rows, uint32_t cols) {
  const uint64_t rb = row_bytes(type, cols);
  std::vector<uint8_t> out(rb * rows);
  for (uint32_t r = 0; r < rows; ++r) {
    const std::vector<float> v = random_values(rng, cols);
    quantize_row(type, v.data(), out.data() + r * rb, cols);
  }
  return out;
}

std::vector<float> dequant_row(GgmlType type, const std::vector<uint8_t>& gguf, uint32_t cols, uint32_t r) {
  std::vector<float> v(cols);
  dequantize_row(type, gguf.data() + r * row_bytes(type, cols), v.data(), cols);
  return v;
}

std::unique_ptr<DeviceMatrix> upload_matrix(Gpu& g, GgmlType type, uint32_t rows, uint32_t cols,
                                            const std::vector<uint8_t>& gguf) {
  auto p = std::make_unique<DeviceMatrix>();
  DeviceMatrix& m = *p;
  const bool split = vk::split1_supported(type);
  std::vector<uint8_t> bytes = split ? vk::split1_from_gguf(type, rows, cols, gguf.data()) : gguf;
  bytes.resize((bytes.size() + 15) / 16 * 16, 0);
  m.buffer = make_buffer(g, bytes.size(), cat("matrix ", type_name(type), " ", rows, "x", cols));
  upload_bytes(g, m.buffer, bytes.data(), bytes.size());
  m.ref = {&m.buffer, 0, type, split ? vk::WeightLayout::Split1 : vk::WeightLayout::Plain, rows, cols};
  return p;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= tol[i])) {  // NaN fails too
      ++bad;
      if (reported++ < 5)
        ADD_FAILURE() << what << ": element " << i << ": got " << got[i] << ", want " << want[i] << " (tolerance "
                      << tol[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
}

}  // namespace tessera::vktest
