// MLA attention of one layer over a batch of tokens (forward.md §2), with the latent KV cache.
#pragma once
#include <cstdint>
#include <vector>

#include "format/model_config.h"
#include "runtime/cpu/model_weights.h"
#include "runtime/cpu/ops.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/cpu/weight_source.h"

namespace tessera::cpu {

// What every part of the forward pass reads.
struct ForwardContext {
  const WeightSource& weights;
  const ModelConfig& config;
  const Rope& rope;
  ThreadPool& pool;
};

// One layer's cache: per position a row [c (Rkv) | k_pe roped (Dr)] (Rkv+Dr values, latent
// first), stored rounded to IEEE f16 like llama.cpp's default f16 K cache.
class LatentKvCache {
 public:
  // Memory grows with the positions stored, up to n_ctx rows.
  LatentKvCache(uint32_t n_ctx, uint32_t row) : n_ctx_(n_ctx), row_(row) {}
  uint32_t row() const { return row_; }
  // Store one row (row() floats) at position pos (< n_ctx), rounding each value to f16.
  void store(uint32_t pos, const float* values);
  // Rows [0, n) as f32, row-major (n * row() floats); n must not exceed the rows stored so far.
  std::vector<float> read(uint32_t n) const;

 private:
  uint32_t n_ctx_, row_;
  std::vector<uint16_t> data_;  // [positions x row] fp16 bits
};

// Attention of T tokens at positions pos0..pos0+T-1 for one layer: h [T x d] is the normed input
// (attn_norm already applied); writes the T cache rows, then each token attends to positions
// <= its own. out [T x d] receives the attention output (before the residual add).
void attention(const ForwardContext& ctx, const LayerWeights& lw, LatentKvCache& cache, const float* h, uint32_t T,
               uint32_t pos0, AttentionPath path, float* out);

}  // namespace tessera::cpu
