// Helpers of the attention kernel tests (test_attention.cpp, test_attention_decode.cpp): the
// shared Vulkan context, buffers, rope parameters of GLM and YaRN, the attention shape, the
// split-K tuning and the comparison of one query's olat with the CPU reference.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/ops.h"
#include "runtime/vulkan/kernels_attention.h"
#include "runtime/vulkan/memory.h"
#include "tests/vulkan/test_attention_ref.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera::attntest {

// The shared context of the test binary (tests skip only when no Vulkan device exists at all).
using vktest::gpu;
#define REQUIRE_GPU() VK_TEST_REQUIRE_GPU(gpu())

template <class T>
inline void upload(vk::Buffer& b, const std::vector<T>& v) {
  vktest::upload_bytes(gpu(), b, v.data(), v.size() * sizeof(T));
}
template <class T>
inline std::vector<T> download(const vk::Buffer& b, size_t n) {
  std::vector<T> v(n);
  gpu().transfer->download(b, 0, v.data(), n * sizeof(T));
  return v;
}
inline vk::Buffer make_buffer(uint64_t bytes, const char* name) { return vktest::make_buffer(gpu(), bytes, name); }
inline void poison(vk::Buffer& b) { vktest::poison(gpu(), b); }

struct RopeCase {
  const char* name;
  float base, freq_scale, ext_factor, attn_factor;
  uint32_t n_ctx_orig;
};
// GLM-4.7-Flash (plain rope, base 1e6) and DeepSeek-V2-Lite (YaRN, factor 40) parameters.
inline const RopeCase kGlmRope{"glm", 1e6f, 1.f, 0.f, 1.f, 0};
inline const RopeCase kYarnRope{"yarn", 1e4f, 1.f / 40, 1.f, float(1.0 / (1.0 + 0.1 * std::log(40.0))), 4096};

inline vk::RopeParams rope_params(const RopeCase& c, uint32_t n_rot) {
  ModelConfig m;
  m.n_rot = n_rot;
  m.rope_base = c.base;
  m.rope_freq_scale = c.freq_scale;
  m.yarn = c.ext_factor != 0;
  m.yarn_n_ctx_orig = c.n_ctx_orig;
  vk::RopeParams p = vk::RopeParams::from_config(m);
  p.attn_factor = c.attn_factor;
  return p;
}
inline cpu::Rope cpu_rope(const RopeCase& c, uint32_t n_rot) {
  const cpu::YarnCorrDims corr = c.ext_factor != 0 ? cpu::yarn_corr_dims(n_rot, c.n_ctx_orig, c.base, 32.f, 1.f)
                                                   : cpu::YarnCorrDims{0.f, 0.f};
  return cpu::Rope(n_rot, c.base, c.freq_scale, c.ext_factor, c.attn_factor, corr);
}

inline vk::AttentionShape make_shape(uint32_t n_head, uint32_t kv_lora, uint32_t n_rot, uint32_t n_ctx, const RopeCase& rope) {
  vk::AttentionShape s;
  s.n_head = n_head;
  s.kv_lora = kv_lora;
  s.n_ctx = n_ctx;
  s.eps = 1e-5f;
  s.kq_scale = 1.f / std::sqrt(float(kv_lora / 2 + n_rot));
  s.rope = rope_params(rope, n_rot);
  return s;
}

// Where the position sits in the step buffer (word 0 would be the token id).
constexpr uint32_t kPosWord = 1;

inline vk::AttentionTuning tuning(uint32_t n_groups, uint32_t min_chunk, uint32_t heads_per_group = 0, uint32_t tile = 0) {
  vk::AttentionTuning t;
  t.n_groups = n_groups;
  t.min_chunk = min_chunk;
  t.heads_per_group = heads_per_group;
  t.tile = tile;
  t.decode_tc = 0;  // the f32 kernels unless a test asks for the tensor-core one
  return t;
}

// olat of one query (got) against the reference attention of q_h over the first kv_len rows of
// cache_h at position kv_len - 1: every value finite, the largest error within f32 rounding
// (rel_tol of the largest value; the f16 arithmetic of AttentionTuning::rows_f16: kF16OlatTol; the
// tensor-core kernel, whose f16 query f16_query rounds in the reference too, and its f16 P:
// kTcOlatTol, as the prefill's tensor-core tests).
constexpr double kF32OlatTol = 2e-5, kF16OlatTol = 3e-3, kTcOlatTol = 1e-3;
inline void expect_olat_near(const std::vector<float>& got, const std::vector<float>& q_h, const std::vector<uint16_t>& cache_h,
                      uint32_t n_head, uint32_t kv_lora, uint32_t n_rot, uint32_t kv_len, float kq_scale,
                      const cpu::Rope& rope, double rel_tol = kF32OlatTol, bool f16_query = false) {
  const std::vector<float> want =
      test::ref_attention(q_h, cache_h, n_head, kv_lora, n_rot, kv_len, kv_len - 1, kq_scale, rope, f16_query);
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "kv_len " << kv_len << " element " << i;
    max_err = std::max(max_err, double(std::abs(got[i] - want[i])));
    max_ref = std::max(max_ref, double(std::abs(want[i])));
  }
  EXPECT_LT(max_err, 5e-6 + rel_tol * max_ref) << "kv_len " << kv_len << " (max |ref| " << max_ref << ")";
}

}  // namespace tessera::attntest
