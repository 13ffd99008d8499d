// forward.md §1: embedding -> per layer (attention, FFN or MoE, each with a pre-norm and a
// residual add) -> output norm -> LM head.
#include "runtime/cpu/forward.h"

#include <thread>

#include "format/error.h"
#include "runtime/cpu/ffn.h"
#include "runtime/cpu/linear.h"

namespace tessera {

namespace {
unsigned resolve_threads(unsigned n) {
  if (n) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? hw : 1;
}

uint32_t checked_ctx(int n_ctx) {
  if (n_ctx < 1) usage_error("context size must be at least 1, got ", n_ctx);
  return uint32_t(n_ctx);
}

// y[t] = RMSNorm(x[t]; w) for T rows of width w.size().
void norm_rows(const float* x, uint32_t T, const std::vector<float>& w, float eps, float* y) {
  const size_t d = w.size();
  for (uint32_t t = 0; t < T; ++t)
    cpu::rms_norm(std::span<const float>(x + t * d, d), w, eps, std::span<float>(y + t * d, d));
}
}  // namespace

CpuModel::CpuModel(const WeightSource& weights, int n_ctx, unsigned threads, AttentionPath path)
    : weights_(weights),
      config_(ModelConfig::from_metadata(weights.metadata())),
      tensors_(cpu::ModelWeights::load(weights, config_, path)),
      rope_(config_),
      pool_(resolve_threads(threads)),
      path_(path),
      n_ctx_(checked_ctx(n_ctx)) {
  cache_.reserve(config_.n_layer);
  for (uint32_t l = 0; l < config_.n_layer; ++l) cache_.emplace_back(n_ctx_, config_.kv_row());
}

std::vector<float> CpuModel::forward(std::span<const int32_t> tokens, bool last_only) {
  if (tokens.empty()) return {};
  const uint64_t T64 = tokens.size();
  if (n_past_ + T64 > n_ctx_)
    usage_error("context full: ", n_past_, " cached + ", T64, " new tokens exceed the context size ", n_ctx_,
                " (raise --ctx)");
  for (size_t t = 0; t < tokens.size(); ++t)
    if (tokens[t] < 0 || uint32_t(tokens[t]) >= config_.n_vocab)
      usage_error("token id ", tokens[t], " (position ", t, ") is outside the vocabulary [0, ", config_.n_vocab, ")");
  const uint32_t T = uint32_t(T64), d = config_.n_embd;
  const cpu::ForwardContext ctx{weights_, config_, rope_, pool_};

  std::vector<float> x(size_t(T) * d), h(size_t(T) * d), delta(size_t(T) * d);
  for (uint32_t t = 0; t < T; ++t) weights_.read_rows(tensors_.token_embd, uint64_t(tokens[t]), 1, x.data() + size_t(t) * d);

  for (uint32_t l = 0; l < config_.n_layer; ++l) {
    const cpu::LayerWeights& lw = tensors_.layers[l];
    norm_rows(x.data(), T, lw.attn_norm, config_.eps, h.data());
    cpu::attention(ctx, lw, cache_[l], h.data(), T, n_past_, path_, delta.data());
    for (size_t k = 0; k < x.size(); ++k) x[k] += delta[k];
    norm_rows(x.data(), T, lw.ffn_norm, config_.eps, h.data());
    if (lw.moe)
      cpu::moe_ffn(ctx, lw, h.data(), T, delta.data());
    else
      cpu::dense_ffn(ctx, lw, h.data(), T, delta.data());
    for (size_t k = 0; k < x.size(); ++k) x[k] += delta[k];
  }
  n_past_ += T;

  const uint32_t first = last_only ? T - 1 : 0, n_out = T - first;
  norm_rows(x.data() + size_t(first) * d, n_out, tensors_.output_norm, config_.eps, h.data());
  std::vector<float> logits(size_t(n_out) * config_.n_vocab);
  cpu::matmul(weights_, cpu::whole(weights_, tensors_.output), h.data(), d, n_out, logits.data(), config_.n_vocab,
              pool_);
  return logits;
}

}  // namespace tessera
