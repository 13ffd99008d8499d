#include "runtime/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "format/error.h"

namespace tessera::cpu {

void rms_norm(std::span<const float> x, std::span<const float> w, float eps, std::span<float> y) {
  if (x.size() != w.size() || y.size() != x.size())
    runtime_error("rms_norm: sizes differ (x ", x.size(), ", w ", w.size(), ", y ", y.size(), ")");
  double sum_sq = 0;
  for (float v : x) sum_sq += double(v) * double(v);
  const double scale = 1.0 / std::sqrt(sum_sq / double(x.size()) + double(eps));
  for (size_t i = 0; i < x.size(); ++i) y[i] = float(double(x[i]) * scale) * w[i];
}

float silu(float z) { return float(double(z) / (1.0 + std::exp(-double(z)))); }

void softmax(std::span<float> v) {
  if (v.empty()) return;
  const float mx = *std::max_element(v.begin(), v.end());
  double sum = 0;
  for (float& e : v) {
    e = float(std::exp(double(e) - double(mx)));
    sum += e;
  }
  for (float& e : v) e = float(double(e) / sum);
}

YarnCorrDims yarn_corr_dims(uint32_t n_rot, uint32_t n_ctx_orig, float base, float beta_fast, float beta_slow) {
  auto corr = [&](double b) {
    return double(n_rot) * std::log(double(n_ctx_orig) / (b * 2.0 * M_PI)) / (2.0 * std::log(double(base)));
  };
  const double low = std::max(0.0, std::floor(corr(beta_fast)));
  const double high = std::min(double(n_rot) - 1.0, std::ceil(corr(beta_slow)));
  return {float(low), float(high)};
}

Rope::Rope(const ModelConfig& c)
    : Rope(c.n_rot, c.rope_base, c.rope_freq_scale, c.yarn_ext_factor(), c.rope_attn_factor(),
           c.yarn ? yarn_corr_dims(c.n_rot, c.yarn_n_ctx_orig, c.rope_base, c.yarn_beta_fast, c.yarn_beta_slow)
                  : YarnCorrDims{0.f, 0.f}) {}

Rope::Rope(uint32_t n_rot, float base, float freq_scale, float ext_factor, float attn_factor, YarnCorrDims corr)
    : n_rot_(n_rot), base_(base), freq_scale_(freq_scale), ext_factor_(ext_factor), corr_(corr) {
  if (n_rot % 2 != 0) bad_input("rope.dimension_count must be even, found ", n_rot);
  mscale_ = attn_factor;
  if (ext_factor != 0.f) mscale_ *= 1.0 + 0.1 * std::log(1.0 / double(freq_scale));
}

double Rope::theta(uint32_t k, int64_t pos) const {
  const double theta_extrap = double(pos) * std::pow(base_, -2.0 * double(k) / double(n_rot_));
  const double theta_interp = freq_scale_ * theta_extrap;
  if (ext_factor_ == 0.0) return theta_interp;
  const double y = (double(k) - corr_.low) / std::max(0.001, double(corr_.high) - corr_.low);
  const double ramp_mix = (1.0 - std::clamp(y, 0.0, 1.0)) * ext_factor_;
  return theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
}

void Rope::apply(std::span<float> v, int64_t pos) const {
  if (v.size() != n_rot_) runtime_error("rope: vector of ", v.size(), " values, expected ", n_rot_);
  for (uint32_t k = 0; k < n_rot_ / 2; ++k) {
    const double t = theta(k, pos);
    const double cs = std::cos(t) * mscale_, sn = std::sin(t) * mscale_;
    const double a = v[2 * k], b = v[2 * k + 1];
    v[2 * k] = float(a * cs - b * sn);
    v[2 * k + 1] = float(a * sn + b * cs);
  }
}

Route route_token(const ModelConfig& c, std::span<const float> router_logits, std::span<const float> bias) {
  const size_t n_expert = router_logits.size();
  if (!bias.empty() && bias.size() != n_expert)
    runtime_error("route_token: ", bias.size(), " bias values for ", n_expert, " experts");
  if (c.n_expert_used == 0 || c.n_expert_used > n_expert)
    runtime_error("route_token: ", c.n_expert_used, " experts used of ", n_expert);
  // 2. probabilities
  std::vector<float> probs(router_logits.begin(), router_logits.end());
  if (c.gating == GatingFunc::Sigmoid) {
    for (float& p : probs) p = float(1.0 / (1.0 + std::exp(-double(p))));
  } else if (c.gating == GatingFunc::Softmax) {
    softmax(probs);
  } else {
    bad_input("expert_gating_func ", uint32_t(c.gating), " is not supported (1 softmax, 2 sigmoid)");
  }
  // 3. selection score (bias only steers the choice)
  std::vector<float> score = probs;
  for (size_t e = 0; e < bias.size(); ++e) score[e] += bias[e];
  for (float& s : score)
    if (std::isnan(s)) s = -INFINITY;  // keeps the ordering strict-weak for garbage inputs
  // 4. top-K, descending score, ties -> lower index first
  std::vector<uint32_t> order(n_expert);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return score[a] > score[b]; });
  Route r;
  r.experts.assign(order.begin(), order.begin() + c.n_expert_used);
  // 5. weights from the unbiased probabilities
  for (uint32_t e : r.experts) r.weights.push_back(probs[e]);
  // 6. normalization
  if (c.expert_weights_norm) {
    double sum = 0;
    for (float w : r.weights) sum += w;
    const double denom = std::max(sum, 6.103515625e-5);
    for (float& w : r.weights) w = float(double(w) / denom);
  }
  // 7. scale
  if (c.expert_weights_scale != 0.f && c.expert_weights_scale != 1.f)
    for (float& w : r.weights) w *= c.expert_weights_scale;
  return r;
}

}  // namespace tessera::cpu
