// Small numeric building blocks of the deepseek2 forward pass (forward.md §0, §3, §5.2), written
// to be read against the spec and tested by hand. All take and return f32; sums are in f64.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "format/model_config.h"

namespace tessera::cpu {

// y_i = w_i * x_i / sqrt(mean_j(x_j^2) + eps). y may alias x. Sizes must match.
void rms_norm(std::span<const float> x, std::span<const float> w, float eps, std::span<float> y);

// silu(z) = z / (1 + exp(-z)).
float silu(float z);

// In-place softmax over v (max subtracted first); an all -inf input is not allowed.
void softmax(std::span<float> v);

// YaRN correction range (forward.md §3.2): {low, high} = {max(0, floor(corr(beta_fast))),
// min(n_rot-1, ceil(corr(beta_slow)))}, corr(b) = n_rot*ln(n_ctx_orig/(2*pi*b)) / (2*ln(base)).
struct YarnCorrDims { float low, high; };
YarnCorrDims yarn_corr_dims(uint32_t n_rot, uint32_t n_ctx_orig, float base, float beta_fast, float beta_slow);

// RoPE of the NORMAL (GPT-J, interleaved pairs) kind with optional YaRN, as ggml's rope_yarn:
// pair k of a n_rot-vector, (v[2k], v[2k+1]), is rotated by angle theta_k(p) and scaled by
// mscale, where theta_extrap = p * base^(-2k/n_rot), theta_interp = freq_scale * theta_extrap,
// theta = blend by the YaRN ramp when ext_factor != 0 (else theta_interp), and
// mscale = attn_factor * (ext_factor != 0 ? 1 + 0.1*ln(1/freq_scale) : 1).
class Rope {
 public:
  // Parameters from the model: n_rot, rope_base, rope_freq_scale, yarn_* and rope_attn_factor().
  explicit Rope(const ModelConfig& c);
  // Explicit parameters (tests). ext_factor 0 = plain RoPE.
  Rope(uint32_t n_rot, float base, float freq_scale, float ext_factor, float attn_factor, YarnCorrDims corr);

  uint32_t n_rot() const { return n_rot_; }
  // The angle of pair k at position pos (radians), before mscale.
  double theta(uint32_t k, int64_t pos) const;
  // The magnitude factor applied to cos and sin.
  double mscale() const { return mscale_; }
  // Rotate v (n_rot values) in place for position pos.
  void apply(std::span<float> v, int64_t pos) const;

 private:
  uint32_t n_rot_;
  double base_, freq_scale_, ext_factor_, mscale_;
  YarnCorrDims corr_;
};

// MoE routing of one token (forward.md §5.2 steps 2-7).
struct Route {
  std::vector<uint32_t> experts;  // chosen expert ids, best selection score first
  std::vector<float> weights;     // weight of each chosen expert (same order)
};
// router_logits: E values (W_router · h). bias: E values (exp_probs_b) or empty.
// Selection score = probs (+ bias); top-K by score, ties broken by the lower expert index.
// Weights come from the unbiased probs, then normalized (if c.expert_weights_norm) and scaled
// (if c.expert_weights_scale is not 0 or 1).
Route route_token(const ModelConfig& c, std::span<const float> router_logits, std::span<const float> bias);

}  // namespace tessera::cpu
