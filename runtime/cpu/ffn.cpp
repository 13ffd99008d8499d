#include "runtime/cpu/ffn.h"

#include <vector>

#include "runtime/cpu/linear.h"

namespace tessera::cpu {
namespace {

// y [n x d] = Down · (silu(Gate·x) ⊙ (Up·x)) with Gate/Up/Down given as row blocks of width f.
void swiglu(const ForwardContext& ctx, const RowBlock& gate, const RowBlock& up, const RowBlock& down,
            const float* x, uint32_t n, float* y) {
  const WeightSource& w = ctx.weights;
  const uint64_t d = ctx.config.n_embd, f = gate.n_out;
  std::vector<float> g(n * f), u(n * f);
  matmul(w, gate, x, d, n, g.data(), f, ctx.pool);
  matmul(w, up, x, d, n, u.data(), f, ctx.pool);
  for (size_t k = 0; k < g.size(); ++k) g[k] = silu(g[k]) * u[k];
  matmul(w, down, g.data(), f, n, y, d, ctx.pool);
}

}  // namespace

void dense_ffn(const ForwardContext& ctx, const LayerWeights& lw, const float* h, uint32_t T, float* out) {
  const WeightSource& w = ctx.weights;
  swiglu(ctx, whole(w, lw.ffn_gate), whole(w, lw.ffn_up), whole(w, lw.ffn_down), h, T, out);
}

void moe_ffn(const ForwardContext& ctx, const LayerWeights& lw, const float* h, uint32_t T, float* out) {
  const WeightSource& w = ctx.weights;
  const ModelConfig& c = ctx.config;
  const uint32_t d = c.n_embd, E = c.n_expert;
  // 1-7: router logits and routes per token
  std::vector<float> logits(size_t(T) * E);
  matmul(w, whole(w, lw.router), h, d, T, logits.data(), E, ctx.pool);
  // tokens (and their weights) per expert
  std::vector<std::vector<std::pair<uint32_t, float>>> by_expert(E);
  for (uint32_t t = 0; t < T; ++t) {
    const Route r = route_token(c, std::span<const float>(logits.data() + size_t(t) * E, E), lw.exp_probs_b);
    for (size_t k = 0; k < r.experts.size(); ++k) by_expert[r.experts[k]].push_back({t, r.weights[k]});
  }
  // 8. routed experts, accumulated in f64
  std::vector<double> acc(size_t(T) * d, 0.0);
  std::vector<float> x, y;
  for (uint32_t e = 0; e < E; ++e) {
    const auto& users = by_expert[e];
    if (users.empty()) continue;
    const uint32_t n = uint32_t(users.size());
    x.resize(size_t(n) * d);
    y.resize(size_t(n) * d);
    for (uint32_t k = 0; k < n; ++k) std::copy_n(h + size_t(users[k].first) * d, d, x.data() + size_t(k) * d);
    swiglu(ctx, slab(w, lw.gate_exps, e), slab(w, lw.up_exps, e), slab(w, lw.down_exps, e), x.data(), n, y.data());
    for (uint32_t k = 0; k < n; ++k) {
      double* a = acc.data() + size_t(users[k].first) * d;
      const double wk = users[k].second;
      for (uint32_t m = 0; m < d; ++m) a[m] += wk * y[size_t(k) * d + m];
    }
  }
  // 9. shared experts (unweighted)
  if (!lw.gate_shexp.empty()) {
    y.resize(size_t(T) * d);
    swiglu(ctx, whole(w, lw.gate_shexp), whole(w, lw.up_shexp), whole(w, lw.down_shexp), h, T, y.data());
    for (size_t k = 0; k < acc.size(); ++k) acc[k] += y[k];
  }
  // 10. sum
  for (size_t k = 0; k < acc.size(); ++k) out[k] = float(acc[k]);
}

}  // namespace tessera::cpu
