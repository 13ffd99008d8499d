// Micro-benchmark: absorbed MLA attention of one decoded token (partial + merge,
// shaders/attention_partial.comp and attention_merge.comp) at GLM-4.7-Flash's shape (20 heads,
// latent 512, rope 64) over several context lengths. Checked first against the CPU: the query's
// rope part is zero, so the reference needs no RoPE (the kernels do the same work either way):
// olat_h = sum_j softmax_j(kq_scale * q_lat_h . c_j) c_j[0:R], j <= p.
#include <cmath>
#include <random>

#include "bench/micro_util.h"
#include "format/fp16.h"
#include "format/model_config.h"
#include "runtime/vulkan/kernels_attention.h"

namespace tessera::microbench {
namespace {

void BM_Attention(benchmark::State& state, uint32_t kv_len) {
  Gpu& g = gpu();
  if (!require_gpu(state, g)) return;
  const ModelConfig cfg = *ModelConfig::preset("glm47flash");
  const vk::AttentionShape shape = vk::AttentionShape::from_config(cfg, kv_len);
  const uint32_t H = shape.n_head, R = shape.kv_lora, row = shape.row();
  std::mt19937 rng(kv_len);

  // Cache: f16 [kv_len][R + Dr] of random values; query: [H][R + Dr] with a zero rope part.
  const std::vector<float> cache_f = random_floats(rng, size_t(kv_len) * row, 0.5f);
  std::vector<uint16_t> cache_h(cache_f.size());
  for (size_t i = 0; i < cache_f.size(); ++i) cache_h[i] = f32_to_fp16(cache_f[i]);
  std::vector<float> q = random_floats(rng, size_t(H) * row, 0.05f);
  for (uint32_t h = 0; h < H; ++h)
    for (uint32_t k = R; k < row; ++k) q[size_t(h) * row + k] = 0;
  const uint32_t step_words[4] = {0, kv_len - 1, 0, 0};  // the token at position p = kv_len - 1

  vk::AttentionOp attn(*g.ctx, shape);
  attn.set_profile_kv_len(kv_len);
  const uint32_t copies = copies_for(g, shape.cache_bytes());
  std::vector<vk::Buffer> caches;
  for (uint32_t c = 0; c < copies; ++c) caches.push_back(upload(g, cache_h.data(), cache_h.size() * 2, "cache"));
  vk::Buffer qb = upload(g, q.data(), q.size() * 4, "q");
  vk::Buffer step = upload(g, step_words, sizeof step_words, "step");
  vk::Buffer partials = make_buffer(g, attn.partials_bytes(), "partials");
  vk::Buffer olat = make_buffer(g, size_t(H) * R * 4, "olat");
  auto record = [&](vk::CommandRecorder& rec, uint32_t c) {
    attn.record(rec, qb.whole(), caches[c].whole(), step.whole(), 1, partials.whole(), olat.whole(), "attention");
  };

  {
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    rec.fill(olat.whole(), 0x7fc00000u);
    rec.barrier();
    record(rec, 0);
    rec.end();
    rec.run();
    const std::vector<float> got = download(g, olat, size_t(H) * R);
    std::vector<double> want(size_t(H) * R, 0.0);
    std::vector<double> score(kv_len);
    for (uint32_t h = 0; h < H; ++h) {
      double mx = -INFINITY;
      for (uint32_t j = 0; j < kv_len; ++j) {
        double s = 0;
        for (uint32_t k = 0; k < R; ++k) s += double(q[size_t(h) * row + k]) * fp16_to_f32(cache_h[size_t(j) * row + k]);
        score[j] = s * shape.kq_scale;
        mx = std::max(mx, score[j]);
      }
      double sum = 0;
      for (uint32_t j = 0; j < kv_len; ++j) sum += (score[j] = std::exp(score[j] - mx));
      for (uint32_t j = 0; j < kv_len; ++j)
        for (uint32_t k = 0; k < R; ++k)
          want[size_t(h) * R + k] += score[j] / sum * fp16_to_f32(cache_h[size_t(j) * row + k]);
    }
    const double err = rel_error(got, want);
    if (!(err < 1e-4)) {
      state.SkipWithError(("attention disagrees with the CPU: relative error " + std::to_string(err)).c_str());
      return;
    }
  }
  TimedOps ops(g, copies, record);
  time_loop(state, ops, attn.partial_bytes(kv_len) + attn.merge_bytes(kv_len));
  state.counters["chunks"] = attn.num_chunks(kv_len);
}

const bool kRegistered = [] {
  for (uint32_t kv : {1u, 512u, 4096u, 16384u, 32768u})
    benchmark::RegisterBenchmark(("attention/glm/kv" + std::to_string(kv)).c_str(), BM_Attention, kv)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
}  // namespace tessera::microbench
