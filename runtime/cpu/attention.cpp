// Two independent computations of the same attention (forward.md §2.3-2.5):
//   absorbed: Q_i = [Kb_i·q_nope_i | q_pe_i] (Rkv+Dr), scores against the cached rows,
//             o_lat_i = Σ a·c, then Vb_i·o_lat_i (or the composed W_vo on all o_lat at once);
//   expanded: k_nope_i(j) = Kb_iᵀ·c_j, v_i(j) = Vb_i·c_j for every cached j, ordinary MHA.
// Both read the same f16-rounded cache, so they agree to f32/f64 rounding.
#include "runtime/cpu/attention.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "format/error.h"
#include "format/fp16.h"
#include "runtime/cpu/linear.h"

namespace tessera::cpu {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// In-place softmax of attention scores in f64 (max subtracted first).
void softmax_d(std::vector<double>& s) {
  double mx = -INFINITY;
  for (double v : s) mx = std::max(mx, v);
  double sum = 0;
  for (double& v : s) sum += (v = std::exp(v - mx));
  for (double& v : s) v /= sum;
}

// Absorbed path: q [T x H*qrow] is the query projection (qrow = Dk, or Rkv+Dr when composed),
// rope already applied to its pe parts; K [n_kv x (Rkv+Dr)] the cache rows.
void absorbed(const ForwardContext& ctx, const LayerWeights& lw, const std::vector<float>& q, uint32_t qrow,
              const std::vector<float>& K, uint32_t T, uint32_t pos0, float* out) {
  const ModelConfig& c = ctx.config;
  const uint32_t H = c.n_head, Rkv = c.kv_lora_rank, Dr = c.n_rot, Dn = c.n_nope, Dv = c.n_v, d = c.n_embd;
  const uint32_t row = Rkv + Dr;
  // Q [T x H x row]: latent query then roped pe
  std::vector<float> Q;
  if (!lw.qk.empty()) {
    Q = q;  // composed: the projection already yields [q_lat_i | q_pe_i] per head
  } else {
    Q.resize(size_t(T) * H * row);
    for (uint32_t i = 0; i < H; ++i) {
      matmul(ctx.weights, slab(ctx.weights, lw.k_b, i), q.data() + size_t(i) * qrow, size_t(H) * qrow, T,
             Q.data() + size_t(i) * row, size_t(H) * row, ctx.pool);
      for (uint32_t t = 0; t < T; ++t)
        std::copy_n(q.data() + (size_t(t) * H + i) * qrow + Dn, Dr, Q.data() + (size_t(t) * H + i) * row + Rkv);
    }
  }
  // o_lat [T x H x Rkv]
  std::vector<float> olat(size_t(T) * H * Rkv);
  const double scale = c.kq_scale();
  ctx.pool.parallel_for(size_t(T) * H, [&](size_t task) {
    const uint32_t t = uint32_t(task / H), i = uint32_t(task % H);
    const uint32_t n = pos0 + t + 1;  // causal: positions 0..pos0+t
    const float* Qi = Q.data() + (size_t(t) * H + i) * row;
    std::vector<double> s(n);
    for (uint32_t j = 0; j < n; ++j) {
      const float* Kj = K.data() + size_t(j) * row;
      double dot = 0;
      for (uint32_t r = 0; r < row; ++r) dot += double(Qi[r]) * Kj[r];
      s[j] = scale * dot;
    }
    softmax_d(s);
    std::vector<double> acc(Rkv, 0.0);
    for (uint32_t j = 0; j < n; ++j) {
      const float* Kj = K.data() + size_t(j) * row;
      for (uint32_t r = 0; r < Rkv; ++r) acc[r] += s[j] * Kj[r];
    }
    float* o = olat.data() + (size_t(t) * H + i) * Rkv;
    for (uint32_t r = 0; r < Rkv; ++r) o[r] = float(acc[r]);
  });
  if (!lw.vo.empty()) {
    matmul(ctx.weights, whole(ctx.weights, lw.vo), olat.data(), size_t(H) * Rkv, T, out, d, ctx.pool);
    return;
  }
  std::vector<float> o(size_t(T) * H * Dv);
  for (uint32_t i = 0; i < H; ++i)
    matmul(ctx.weights, slab(ctx.weights, lw.v_b, i), olat.data() + size_t(i) * Rkv, size_t(H) * Rkv, T,
           o.data() + size_t(i) * Dv, size_t(H) * Dv, ctx.pool);
  matmul(ctx.weights, whole(ctx.weights, lw.out), o.data(), size_t(H) * Dv, T, out, d, ctx.pool);
}

// Expanded path: q [T x H*Dk] with roped pe parts; K as above.
void expanded(const ForwardContext& ctx, const LayerWeights& lw, const std::vector<float>& q,
              const std::vector<float>& K, uint32_t T, uint32_t pos0, float* out) {
  const ModelConfig& c = ctx.config;
  const uint32_t H = c.n_head, Rkv = c.kv_lora_rank, Dr = c.n_rot, Dn = c.n_nope, Dv = c.n_v, d = c.n_embd;
  const uint32_t row = Rkv + Dr, Dk = Dn + Dr, n_kv = pos0 + T;
  const double scale = c.kq_scale();
  // latent part of every cached row, f64 [n_kv x Rkv]
  MatD C(n_kv, Rkv);
  for (uint32_t j = 0; j < n_kv; ++j)
    for (uint32_t r = 0; r < Rkv; ++r) C(j, r) = K[size_t(j) * row + r];
  std::vector<float> o(size_t(T) * H * Dv);
  ctx.pool.parallel_for(H, [&](size_t i) {
    std::vector<float> kb(size_t(Rkv) * Dn), vb(size_t(Dv) * Rkv);
    ctx.weights.read_rows(lw.k_b, i * Rkv, Rkv, kb.data());  // Kb_i: Rkv x Dn
    ctx.weights.read_rows(lw.v_b, i * Dv, Dv, vb.data());    // Vb_i: Dv x Rkv
    const MatD Kb = Eigen::Map<const MatF>(kb.data(), Rkv, Dn).cast<double>();
    const MatD Vb = Eigen::Map<const MatF>(vb.data(), Dv, Rkv).cast<double>();
    const MatD k_nope = C * Kb;           // [n_kv x Dn]: row j = Kb_iᵀ·c_j
    const MatD v = C * Vb.transpose();    // [n_kv x Dv]: row j = Vb_i·c_j
    for (uint32_t t = 0; t < T; ++t) {
      const uint32_t n = pos0 + t + 1;
      const float* qi = q.data() + (size_t(t) * H + i) * Dk;  // [q_nope (Dn) | q_pe (Dr)]
      std::vector<double> s(n);
      for (uint32_t j = 0; j < n; ++j) {
        double dot = 0;
        for (uint32_t m = 0; m < Dn; ++m) dot += double(qi[m]) * k_nope(j, m);
        const float* kpe = K.data() + size_t(j) * row + Rkv;
        for (uint32_t m = 0; m < Dr; ++m) dot += double(qi[Dn + m]) * kpe[m];
        s[j] = scale * dot;
      }
      softmax_d(s);
      float* oi = o.data() + (size_t(t) * H + i) * Dv;
      for (uint32_t m = 0; m < Dv; ++m) {
        double acc = 0;
        for (uint32_t j = 0; j < n; ++j) acc += s[j] * v(j, m);
        oi[m] = float(acc);
      }
    }
  });
  matmul(ctx.weights, whole(ctx.weights, lw.out), o.data(), size_t(H) * Dv, T, out, d, ctx.pool);
}

}  // namespace

void LatentKvCache::store(uint32_t pos, const float* values) {
  if (pos >= n_ctx_) runtime_error("KV cache: position ", pos, " beyond the context of ", n_ctx_);
  const size_t need = (size_t(pos) + 1) * row_;
  if (data_.size() < need) data_.resize(std::min(std::max(need, 2 * data_.size()), size_t(n_ctx_) * row_));
  uint16_t* dst = data_.data() + size_t(pos) * row_;
  for (uint32_t r = 0; r < row_; ++r) dst[r] = f32_to_fp16(values[r]);
}

std::vector<float> LatentKvCache::read(uint32_t n) const {
  if (size_t(n) * row_ > data_.size()) runtime_error("KV cache: ", n, " rows requested, ", data_.size() / row_, " held");
  std::vector<float> out(size_t(n) * row_);
  for (size_t k = 0; k < out.size(); ++k) out[k] = fp16_to_f32(data_[k]);
  return out;
}

void attention(const ForwardContext& ctx, const LayerWeights& lw, LatentKvCache& cache, const float* h, uint32_t T,
               uint32_t pos0, AttentionPath path, float* out) {
  const ModelConfig& c = ctx.config;
  const WeightSource& w = ctx.weights;
  const uint32_t H = c.n_head, Rq = c.q_lora_rank, Rkv = c.kv_lora_rank, Dr = c.n_rot, d = c.n_embd;
  const uint32_t row = Rkv + Dr;
  // 1. query input: cq = RMSNorm(W_qa·h) with q LoRA, else h itself
  std::vector<float> cq;
  const float* q_in = h;
  size_t q_in_stride = d;
  if (Rq) {
    cq.resize(size_t(T) * Rq);
    matmul(w, whole(w, lw.q_a), h, d, T, cq.data(), Rq, ctx.pool);
    for (uint32_t t = 0; t < T; ++t) {
      std::span<float> v(cq.data() + size_t(t) * Rq, Rq);
      rms_norm(v, lw.q_a_norm, c.eps, v);
    }
    q_in = cq.data();
    q_in_stride = Rq;
  }
  // 2. query projection: per head Dk = [nope | pe], or [q_lat | pe] (Rkv+Dr) when composed
  const uint32_t qrow = lw.qk.empty() ? c.n_qk() : row;
  std::vector<float> q(size_t(T) * H * qrow);
  matmul(w, whole(w, lw.qk.empty() ? lw.q : lw.qk), q_in, q_in_stride, T, q.data(), size_t(H) * qrow, ctx.pool);
  for (uint32_t t = 0; t < T; ++t)
    for (uint32_t i = 0; i < H; ++i)
      ctx.rope.apply(std::span<float>(q.data() + (size_t(t) * H + i) * qrow + (qrow - Dr), Dr), pos0 + t);
  // 3. compressed kv: c = RMSNorm(kv[0..Rkv)), k_pe = rope(kv[Rkv..]); append to the cache
  std::vector<float> kv(size_t(T) * row);
  matmul(w, whole(w, lw.kv_a), h, d, T, kv.data(), row, ctx.pool);
  for (uint32_t t = 0; t < T; ++t) {
    float* r = kv.data() + size_t(t) * row;
    rms_norm(std::span<const float>(r, Rkv), lw.kv_a_norm, c.eps, std::span<float>(r, Rkv));
    ctx.rope.apply(std::span<float>(r + Rkv, Dr), pos0 + t);
    cache.store(pos0 + t, r);
  }
  // 4. attend over the cached rows (f16-rounded, as stored)
  const std::vector<float> K = cache.read(pos0 + T);
  if (path == AttentionPath::Absorbed)
    absorbed(ctx, lw, q, qrow, K, T, pos0, out);
  else
    expanded(ctx, lw, q, K, T, pos0, out);
}

}  // namespace tessera::cpu
