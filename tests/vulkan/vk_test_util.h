// Helpers for the Vulkan kernel tests (test_vk_*.cpp, test_kernel_*.cpp): one shared context per
// test binary (tests skip only when no Vulkan device exists at all), buffers, host <-> device
// copies, NaN poisoning, random quantized matrices and CPU reference math.
#pragma once
#include <algorithm>
#include <cmath>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <cstring>
#include <vector>

#include "format/error.h"
#include "format/quant.h"
#include "runtime/vulkan/context.h"
#include "runtime/vulkan/memory.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/split1.h"
#include "runtime/vulkan/transfer.h"

namespace tessera::vktest {

struct Gpu {
  std::unique_ptr<vk::Context> ctx;
  std::unique_ptr<vk::MemoryPool> local;  // device-local
  std::unique_ptr<vk::MemoryPool> host;   // host-visible
  std::unique_ptr<vk::Transfer> transfer;
  std::string why;  // why there is no context
};
// The shared context (default cache dir), or one with subgroup ops disabled (shared-memory paths).
Gpu& gpu(bool no_subgroup_ops = false);

#define VK_TEST_REQUIRE_GPU(g) \
  if (!(g).ctx) GTEST_SKIP() << "no usable Vulkan device: " << (g).why

vk::Buffer make_buffer(Gpu& g, uint64_t bytes, const std::string& name, bool host_visible = false);
void upload_bytes(Gpu& g, vk::Buffer& b, const void* data, size_t bytes, uint64_t offset = 0);
// A device-local buffer holding `values`.
vk::Buffer buffer_of(Gpu& g, const std::vector<float>& values, const std::string& name);
// The prefill kernels' step words [first position p0, live tokens n, 0, 0].
constexpr uint32_t kStepCountWord = 1;  // the live token count's word
vk::Buffer step_buffer(Gpu& g, uint32_t p0, uint32_t n);
std::vector<float> download_floats(Gpu& g, const vk::Buffer& b, size_t n, uint64_t offset = 0);
// Fills the whole buffer with f32 quiet NaN.
void poison(Gpu& g, vk::Buffer& b);

// Random floats of varied magnitude (each group of 16 scaled by exp(U(-2, 2))), so block scales
// and K-quant sub-block scales take many values.
std::vector<float> random_values(std::mt19937& rng, size_t n, float scale = 1.f);
// A rows x cols matrix quantized to `type` (GGUF layout) from random_values.
std::vector<uint8_t> random_matrix(std::mt19937& rng, GgmlType type, uint32_t rows, uint32_t cols);
// Row r of a GGUF-layout matrix, dequantized.
std::vector<float> dequant_row(GgmlType type, const std::vector<uint8_t>& gguf, uint32_t cols, uint32_t r);

// A matrix uploaded in the layout kernels read: SPLIT1 for block types, plain otherwise; the
// buffer holds only this matrix (offset 0). Heap-allocated: ref points at buffer.
struct DeviceMatrix {
  vk::Buffer buffer;
  vk::MatrixRef ref;
};
std::unique_ptr<DeviceMatrix> upload_matrix(Gpu& g, GgmlType type, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& gguf);

// Row r of a GGUF-layout matrix dotted with x (cols values) in double: the sum, and the sum of the
// products' magnitudes for a tolerance.
struct RowDot {
  double sum = 0, mag = 0;
};
inline RowDot row_dot(GgmlType type, const std::vector<uint8_t>& gguf, uint32_t cols, uint32_t r, const double* x) {
  const std::vector<float> row = dequant_row(type, gguf, cols, r);
  RowDot d;
  for (uint32_t k = 0; k < cols; ++k) {
    const double p = double(row[k]) * x[k];
    d.sum += p;
    d.mag += std::fabs(p);
  }
  return d;
}

// Expects |got - want| <= tol for each element; reports the first few mismatches with `what`.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& tol,
                  const std::string& what);

// x as the int8-activation path sees it (shaders/q8_activations.glsl): blocks of 32 rounded to
// d * q, d = max|x| / 127, q = roundEven(x * (127 / max|x|)) in f32.
inline std::vector<double> q8_round(const std::vector<double>& x) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t k = b; k < b + 32 && k < x.size(); ++k) amax = std::max(amax, std::fabs(float(x[k])));
    const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (size_t k = b; k < b + 32 && k < x.size(); ++k) out[k] = double(d) * std::nearbyint(float(x[k]) * inv);
  }
  return out;
}

// The same blocks in the buffer format of shaders/q8_quantize.glsl (MatvecOp::x_q8, the merge's
// olat_q8): per block of 32, 12 words = lo (int8 of elements 0..15, 4 per word), hi (16..31),
// floatBits(d, d * sum(q lo), d * sum(q hi), 0). x.size() a multiple of 32. halves: each half
// with its own scale (q8_quantize.glsl "Halves"): (d_lo, d_lo * sum(q lo), d_hi * sum(q hi), d_hi).
inline std::vector<uint32_t> q8_blocks(const std::vector<float>& x, bool halves = false) {
  std::vector<uint32_t> out(x.size() / 32 * 12, 0);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax[2] = {0, 0};
    for (size_t k = 0; k < 32; ++k) amax[halves ? k / 16 : 0] = std::max(amax[halves ? k / 16 : 0], std::fabs(x[32 * b + k]));
    if (!halves) amax[1] = amax[0];
    float d[2], inv[2];
    for (int h = 0; h < 2; ++h) {
      d[h] = amax[h] / 127.0f;
      inv[h] = amax[h] > 0 ? 127.0f / amax[h] : 0.0f;
    }
    int sums[2] = {0, 0};
    for (size_t k = 0; k < 32; ++k) {
      const int q = int(std::nearbyint(x[32 * b + k] * inv[k / 16]));
      sums[k / 16] += q;
      out[12 * b + k / 4] |= uint32_t(q & 0xFF) << (8 * (k % 4));
    }
    const float ds[4] = {d[0], d[0] * float(sums[0]), d[1] * float(sums[1]), halves ? d[1] : 0.0f};
    std::memcpy(&out[12 * b + 8], ds, sizeof ds);
  }
  return out;
}

// The values such blocks stand for: q * d of its half (ds.w, where not zero, for the high half).
inline std::vector<double> q8_values(const std::vector<uint32_t>& blocks) {
  std::vector<double> out(blocks.size() / 12 * 32);
  for (size_t b = 0; b < blocks.size() / 12; ++b) {
    float ds[4];
    std::memcpy(ds, &blocks[12 * b + 8], sizeof ds);
    for (size_t k = 0; k < 32; ++k) {
      const int q = int8_t(blocks[12 * b + k / 4] >> (8 * (k % 4)));
      out[32 * b + k] = double(q) * (k >= 16 && ds[3] != 0.0f ? ds[3] : ds[0]);
    }
  }
  return out;
}

// Int8 blocks written by a kernel against q8_blocks of the same values: each int8 within one step
// and the scales within rounding (a GPU's division may differ from the CPU's by an ulp).
inline void expect_q8_blocks_close(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want,
                                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t b = 0; b < want.size() / 12; ++b) {
    for (size_t w = 0; w < 8; ++w)
      for (uint32_t k = 0; k < 4; ++k) {
        const int gq = int8_t(got[12 * b + w] >> (8 * k)), wq = int8_t(want[12 * b + w] >> (8 * k));
        ASSERT_LE(std::abs(gq - wq), 1) << what << ": block " << b << " element " << 4 * w + k;
      }
    float gd[4], wd[4];
    std::memcpy(gd, &got[12 * b + 8], 16);
    std::memcpy(wd, &want[12 * b + 8], 16);
    ASSERT_NEAR(gd[0], wd[0], 1e-6f * std::fabs(wd[0])) << what << ": block " << b << " scale";
    ASSERT_NEAR(gd[3], wd[3], 1e-6f * std::fabs(wd[3])) << what << ": block " << b << " scale of the high half";
    for (int k = 1; k < 3; ++k)
      ASSERT_NEAR(gd[k], wd[k], 2.f * (k == 2 && gd[3] != 0 ? gd[3] : gd[0]) + 1e-6f * std::fabs(wd[k])) << what << ": block " << b;
  }
}

}  // namespace tessera::vktest
