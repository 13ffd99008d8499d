// The CPU reference forward pass of a deepseek2 model (GLM-4.7-Flash, DeepSeek-V2-Lite): the
// oracle every GPU kernel and every converted file is checked against. Straight from the spec
// (../shared/spec/forward.md), f32 values, f64 sums, weights dequantized row block by row block.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "format/model_config.h"
#include "runtime/cpu/attention.h"
#include "runtime/cpu/generate.h"
#include "runtime/cpu/model_weights.h"
#include "runtime/cpu/ops.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/cpu/weight_source.h"

namespace tessera {

class CpuModel : public LanguageModel {
 public:
  // Reads the hyperparameters (ModelConfig::from_metadata) and checks every tensor the chosen
  // attention path needs; allocates a latent f16 cache of n_ctx positions per layer.
  // `weights` must outlive the model. threads = 0: all hardware threads.
  // Throws Error(BadInput) for an unusable file, Error(Usage) for n_ctx < 1.
  CpuModel(const WeightSource& weights, int n_ctx, unsigned threads, AttentionPath path);

  // Process tokens at positions n_past().. (their KV rows are appended to the cache) and return
  // logits, row-major [n_tokens x n_vocab] for every token, or [1 x n_vocab] for the last token
  // only when last_only. Empty input returns an empty vector. Throws Error(Usage) if the tokens
  // do not fit in the context or a token id is outside the vocabulary (nothing is changed then).
  std::vector<float> forward(std::span<const int32_t> tokens, bool last_only = false) override;

  // Forget the cache (next forward starts at position 0).
  void reset() override { n_past_ = 0; }
  int n_past() const override { return int(n_past_); }
  int n_ctx() const override { return int(n_ctx_); }
  uint32_t n_vocab() const override { return config_.n_vocab; }
  AttentionPath path() const { return path_; }
  const ModelConfig& config() const { return config_; }

 private:
  const WeightSource& weights_;
  ModelConfig config_;
  cpu::ModelWeights tensors_;
  cpu::Rope rope_;
  ThreadPool pool_;
  AttentionPath path_;
  uint32_t n_ctx_, n_past_ = 0;
  std::vector<cpu::LatentKvCache> cache_;  // one per layer
};

}  // namespace tessera
