// An independent check of CpuModel: hand-sized models (2 heads, 16-wide) written with GgufWriter,
// whose logits this file computes a second time with plain loops in double, straight from the
// original (non-absorbed) MHA form of forward.md §2.5, §3 and §5. Also: composed W_qk / W_vo
// tensors built here give the same logits, and malformed files / bad calls give clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>

#include "format/error.h"
#include "format/fp16.h"
#include "format/gguf.h"
#include "format/model_config.h"
#include "runtime/cpu/forward.h"
#include "runtime/cpu/weight_source.h"
#include "tests/cpu/test_util.h"

namespace tessera {
namespace {

struct Tensor {
  std::vector<uint64_t> ne;
  std::vector<float> data;
  // element (column c of row r) of slab s: data[(s*ne1 + r)*ne0 + c]
  double at(uint64_t s, uint64_t r, uint64_t c) const { return data[(s * ne[1] + r) * ne[0] + c]; }
};

struct HandModel {
  ModelConfig config;
  std::map<std::string, Tensor> tensors;  // ordered by name; file order does not matter
};

ModelConfig hand_config(bool glm) {
  ModelConfig c;
  c.name = glm ? "hand glm" : "hand lite";
  c.n_layer = 3; c.n_embd = 16; c.n_head = 2; c.kv_lora_rank = 8; c.n_rot = 4; c.n_nope = 6;
  c.n_v = 5; c.n_ff = 20; c.n_ff_exp = 7; c.n_expert = 4; c.n_expert_used = 2;
  c.n_leading_dense = 1; c.n_vocab = 30; c.n_ctx_train = 64;
  if (glm) {
    c.q_lora_rank = 12; c.eps = 1e-5f; c.rope_base = 10000.f; c.gating = GatingFunc::Sigmoid;
    c.has_exp_probs_b = true; c.expert_weights_norm = true; c.expert_weights_scale = 1.8f;
    c.n_expert_shared = 1;
  } else {
    c.q_lora_rank = 0; c.eps = 1e-6f; c.rope_base = 500.f; c.gating = GatingFunc::Softmax;
    c.expert_weights_scale = 1.f; c.n_expert_shared = 2;
    c.yarn = true; c.rope_freq_scale = 0.25f; c.yarn_n_ctx_orig = 32; c.yarn_log_mul = 0.707f;
  }
  return c;
}

HandModel make_model(bool glm, uint64_t seed) {
  HandModel m;
  m.config = hand_config(glm);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  for (const TensorSpec& s : expected_tensors(m.config)) {
    Tensor t;
    t.ne = s.ne;
    uint64_t n = 1;
    for (uint64_t e : s.ne) n *= e;
    t.data.resize(n);
    const float in_scale = 1.0f / std::sqrt(float(s.ne[0]));
    for (float& v : t.data) {
      switch (s.role) {
        case TensorRole::Norm: v = 1.0f + 0.2f * nd(rng); break;
        case TensorRole::ExpProbsBias: v = 0.3f * nd(rng); break;
        case TensorRole::TokenEmbd: v = nd(rng); break;
        case TensorRole::Router: v = 2.0f * in_scale * nd(rng); break;
        default: v = in_scale * nd(rng);
      }
    }
    m.tensors[s.name] = std::move(t);
  }
  return m;
}

// Writes the model as an F32 GGUF; `replace` maps tensor names to drop -> nothing and adds extra.
std::string write_gguf(const HandModel& m, const std::string& file, const std::map<std::string, Tensor>& extra = {},
                       const std::vector<std::string>& drop = {}) {
  const std::string path = (test::temp_dir() / file).string();
  GgufWriter w;
  m.config.to_metadata(w.metadata());
  std::vector<const Tensor*> order;
  auto add = [&](const std::string& name, const Tensor& t) {
    if (std::find(drop.begin(), drop.end(), name) != drop.end()) return;
    w.add_tensor(name, GgmlType::F32, t.ne);
    order.push_back(&t);
  };
  for (const auto& [name, t] : m.tensors) add(name, t);
  for (const auto& [name, t] : extra) add(name, t);
  w.begin(path);
  for (size_t i = 0; i < order.size(); ++i) w.write_tensor(i, order[i]->data.data(), order[i]->data.size() * 4);
  w.finish();
  return path;
}

// ---- the naive second implementation -------------------------------------------------------

using Vec = std::vector<double>;

Vec matvec(const Tensor& t, const Vec& x, uint64_t slab = 0) {
  Vec y(t.ne[1], 0.0);
  for (uint64_t r = 0; r < t.ne[1]; ++r)
    for (uint64_t c = 0; c < t.ne[0]; ++c) y[r] += t.at(slab, r, c) * x[c];
  return y;
}

Vec rmsnorm(const Vec& x, const Tensor& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w.data[i];
  return y;
}

double round_f16(double v) { return fp16_to_f32(f32_to_fp16(float(v))); }

class Naive {
 public:
  explicit Naive(const HandModel& m) : m_(m), c_(m.config), cache_(c_.n_layer) {}

  // Logits of one token at the next position.
  Vec step(int32_t token) {
    const uint64_t d = c_.n_embd;
    Vec x(d);
    for (uint64_t i = 0; i < d; ++i) x[i] = T("token_embd.weight").at(0, token, i);
    for (uint32_t l = 0; l < c_.n_layer; ++l) {
      const Vec a = attention(l, rmsnorm(x, L(l, "attn_norm.weight"), c_.eps));
      for (uint64_t i = 0; i < d; ++i) x[i] += a[i];
      const Vec h2 = rmsnorm(x, L(l, "ffn_norm.weight"), c_.eps);
      const Vec f = c_.is_moe(l) ? moe(l, h2) : swiglu(L(l, "ffn_gate.weight"), L(l, "ffn_up.weight"),
                                                       L(l, "ffn_down.weight"), h2, 0);
      for (uint64_t i = 0; i < d; ++i) x[i] += f[i];
    }
    ++pos_;
    return matvec(T("output.weight"), rmsnorm(x, T("output_norm.weight"), c_.eps));
  }

 private:
  const Tensor& T(const std::string& n) const { return m_.tensors.at(n); }
  const Tensor& L(uint32_t l, const char* s) const { return T(blk(l, s)); }

  // forward.md §3: interleaved pairs, YaRN blend; the magnitude is exactly 1 for deepseek2.
  void rope(double* v, int64_t p) const {
    const double n = c_.n_rot, base = c_.rope_base;
    double low = 0, high = 0;
    if (c_.yarn) {
      auto corr = [&](double b) { return n * std::log(c_.yarn_n_ctx_orig / (2 * M_PI * b)) / (2 * std::log(base)); };
      low = std::max(0.0, std::floor(corr(32)));
      high = std::min(n - 1, std::ceil(corr(1)));
    }
    for (uint32_t k = 0; k < c_.n_rot / 2; ++k) {
      const double ext = p * std::pow(base, -2.0 * k / n);
      double theta = ext;
      if (c_.yarn) {
        const double ramp = 1 - std::min(1.0, std::max(0.0, (k - low) / std::max(0.001, high - low)));
        theta = ext * c_.rope_freq_scale * (1 - ramp) + ext * ramp;
      }
      const double a = v[2 * k], b = v[2 * k + 1];
      v[2 * k] = a * std::cos(theta) - b * std::sin(theta);
      v[2 * k + 1] = a * std::sin(theta) + b * std::cos(theta);
    }
  }

  double kq_scale() const {
    double ms = 1;
    if (c_.yarn) ms = 1 + 0.1 * c_.yarn_log_mul * std::log(1 / double(c_.rope_freq_scale));
    return ms * ms / std::sqrt(double(c_.n_nope + c_.n_rot));
  }

  // The original MHA form: per head, k = [Kb_hᵀ c_j | kpe_j], v = Vb_h c_j.
  Vec attention(uint32_t l, const Vec& h) {
    const uint32_t H = c_.n_head, R = c_.kv_lora_rank, Dr = c_.n_rot, Dn = c_.n_nope, Dv = c_.n_v;
    const uint32_t Dk = Dn + Dr;
    const Vec q = c_.q_lora_rank ? matvec(L(l, "attn_q_b.weight"),
                                          rmsnorm(matvec(L(l, "attn_q_a.weight"), h), L(l, "attn_q_a_norm.weight"), c_.eps))
                                 : matvec(L(l, "attn_q.weight"), h);
    Vec kv = matvec(L(l, "attn_kv_a_mqa.weight"), h);
    Vec lat(kv.begin(), kv.begin() + R);
    lat = rmsnorm(lat, L(l, "attn_kv_a_norm.weight"), c_.eps);
    rope(kv.data() + R, pos_);
    Vec row(R + Dr);
    for (uint32_t r = 0; r < R; ++r) row[r] = round_f16(lat[r]);
    for (uint32_t r = 0; r < Dr; ++r) row[R + r] = round_f16(kv[R + r]);
    cache_[l].push_back(row);

    const Tensor& kb = L(l, "attn_k_b.weight");  // {Dn, R, H}
    const Tensor& vb = L(l, "attn_v_b.weight");  // {R, Dv, H}
    Vec o(size_t(H) * Dv, 0.0);
    for (uint32_t i = 0; i < H; ++i) {
      Vec qi(q.begin() + i * Dk, q.begin() + (i + 1) * Dk);
      rope(qi.data() + Dn, pos_);
      const size_t n = cache_[l].size();
      Vec s(n);
      for (size_t j = 0; j < n; ++j) {
        const Vec& cj = cache_[l][j];
        double dot = 0;
        for (uint32_t m = 0; m < Dn; ++m) {
          double k_nope = 0;
          for (uint32_t r = 0; r < R; ++r) k_nope += kb.at(i, r, m) * cj[r];
          dot += qi[m] * k_nope;
        }
        for (uint32_t m = 0; m < Dr; ++m) dot += qi[Dn + m] * cj[R + m];
        s[j] = dot * kq_scale();
      }
      double mx = -1e300, sum = 0;
      for (double v : s) mx = std::max(mx, v);
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (size_t j = 0; j < n; ++j) {
        for (uint32_t m = 0; m < Dv; ++m) {
          double v = 0;
          for (uint32_t r = 0; r < R; ++r) v += vb.at(i, m, r) * cache_[l][j][r];
          o[i * Dv + m] += s[j] / sum * v;
        }
      }
    }
    return matvec(L(l, "attn_output.weight"), o);
  }

  Vec swiglu(const Tensor& g, const Tensor& u, const Tensor& dn, const Vec& x, uint64_t e) const {
    const Vec a = matvec(g, x, e), b = matvec(u, x, e);
    Vec act(a.size());
    for (size_t i = 0; i < a.size(); ++i) act[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
    return matvec(dn, act, e);
  }

  Vec moe(uint32_t l, const Vec& h) const {
    const uint32_t E = c_.n_expert;
    const Vec logits = matvec(L(l, "ffn_gate_inp.weight"), h);
    Vec p(E);
    if (c_.gating == GatingFunc::Sigmoid) {
      for (uint32_t e = 0; e < E; ++e) p[e] = 1 / (1 + std::exp(-logits[e]));
    } else {
      double mx = -1e300, sum = 0;
      for (double v : logits) mx = std::max(mx, v);
      for (uint32_t e = 0; e < E; ++e) sum += (p[e] = std::exp(logits[e] - mx));
      for (double& v : p) v /= sum;
    }
    Vec sel = p;
    if (c_.has_exp_probs_b)
      for (uint32_t e = 0; e < E; ++e) sel[e] += L(l, "exp_probs_b.bias").data[e];
    std::vector<uint32_t> chosen;
    std::vector<bool> taken(E, false);
    for (uint32_t k = 0; k < c_.n_expert_used; ++k) {  // repeated argmax, first index wins ties
      int best = -1;
      for (uint32_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || sel[e] > sel[best])) best = int(e);
      taken[best] = true;
      chosen.push_back(uint32_t(best));
    }
    double wsum = 0;
    for (uint32_t e : chosen) wsum += p[e];
    Vec y(c_.n_embd, 0.0);
    for (uint32_t e : chosen) {
      double w = p[e];
      if (c_.expert_weights_norm) w /= wsum;
      if (c_.expert_weights_scale != 0 && c_.expert_weights_scale != 1) w *= c_.expert_weights_scale;
      const Vec ye = swiglu(L(l, "ffn_gate_exps.weight"), L(l, "ffn_up_exps.weight"), L(l, "ffn_down_exps.weight"), h, e);
      for (size_t i = 0; i < y.size(); ++i) y[i] += w * ye[i];
    }
    const Vec sh = swiglu(L(l, "ffn_gate_shexp.weight"), L(l, "ffn_up_shexp.weight"), L(l, "ffn_down_shexp.weight"), h, 0);
    for (size_t i = 0; i < y.size(); ++i) y[i] += sh[i];
    return y;
  }

  const HandModel& m_;
  const ModelConfig& c_;
  std::vector<std::vector<Vec>> cache_;  // [layer][position] -> f16-rounded [c | kpe]
  int64_t pos_ = 0;
};

// ---- composition (forward.md §8), computed here from the factored weights -----------------

std::map<std::string, Tensor> compose(const HandModel& m, uint32_t l, bool qk, bool vo) {
  const ModelConfig& c = m.config;
  const uint64_t H = c.n_head, R = c.kv_lora_rank, Dr = c.n_rot, Dn = c.n_nope, Dv = c.n_v, d = c.n_embd;
  const uint64_t Dk = Dn + Dr, q_in = c.q_lora_rank ? c.q_lora_rank : d;
  std::map<std::string, Tensor> out;
  if (qk) {
    const Tensor& qb = m.tensors.at(blk(l, c.q_lora_rank ? "attn_q_b.weight" : "attn_q.weight"));
    const Tensor& kb = m.tensors.at(blk(l, "attn_k_b.weight"));
    Tensor t{{q_in, H * (R + Dr)}, std::vector<float>(q_in * H * (R + Dr))};
    for (uint64_t i = 0; i < H; ++i) {
      for (uint64_t r = 0; r < R; ++r)
        for (uint64_t col = 0; col < q_in; ++col) {
          double s = 0;
          for (uint64_t j = 0; j < Dn; ++j) s += kb.at(i, r, j) * qb.at(0, i * Dk + j, col);
          t.data[(i * (R + Dr) + r) * q_in + col] = float(s);
        }
      for (uint64_t r = 0; r < Dr; ++r)
        for (uint64_t col = 0; col < q_in; ++col)
          t.data[(i * (R + Dr) + R + r) * q_in + col] = float(qb.at(0, i * Dk + Dn + r, col));
    }
    out[blk(l, "attn_qk.weight")] = std::move(t);
  }
  if (vo) {
    const Tensor& wo = m.tensors.at(blk(l, "attn_output.weight"));  // {H*Dv, d}
    const Tensor& vb = m.tensors.at(blk(l, "attn_v_b.weight"));     // {R, Dv, H}
    Tensor t{{H * R, d}, std::vector<float>(H * R * d)};
    for (uint64_t o = 0; o < d; ++o)
      for (uint64_t i = 0; i < H; ++i)
        for (uint64_t r = 0; r < R; ++r) {
          double s = 0;
          for (uint64_t m2 = 0; m2 < Dv; ++m2) s += wo.at(0, o, i * Dv + m2) * vb.at(i, m2, r);
          t.data[o * H * R + i * R + r] = float(s);
        }
    out[blk(l, "attn_vo.weight")] = std::move(t);
  }
  return out;
}

const std::vector<int32_t> kPrompt{3, 17, 0, 29, 8, 8, 21, 5, 12};

std::vector<float> naive_logits(const HandModel& m, const std::vector<int32_t>& tokens) {
  Naive naive(m);
  std::vector<float> all;
  for (int32_t t : tokens) {
    const Vec l = naive.step(t);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

class HandModelTest : public ::testing::TestWithParam<bool> {};

TEST_P(HandModelTest, MatchesNaiveImplementation) {
  const bool glm = GetParam();
  const HandModel m = make_model(glm, glm ? 11 : 12);
  const std::string path = write_gguf(m, glm ? "hand_glm.gguf" : "hand_lite.gguf");
  const std::vector<float> ref = naive_logits(m, kPrompt);
  GgufWeights w(path);
  for (AttentionPath p : {AttentionPath::Absorbed, AttentionPath::Expanded}) {
    CpuModel model(w, 32, 2, p);
    const std::vector<float> batched = model.forward(kPrompt);
    EXPECT_EQ(model.n_past(), int(kPrompt.size()));
    EXPECT_LT(test::max_rel_diff(batched, ref), 1e-4) << attention_path_name(p);
    // one token at a time
    model.reset();
    std::vector<float> stepped;
    for (int32_t t : kPrompt) {
      const std::vector<float> l = model.forward(std::span<const int32_t>(&t, 1));
      stepped.insert(stepped.end(), l.begin(), l.end());
    }
    EXPECT_LT(test::max_rel_diff(stepped, ref), 1e-4) << attention_path_name(p);
    // last_only returns the last row
    model.reset();
    const std::vector<float> last = model.forward(kPrompt, true);
    ASSERT_EQ(last.size(), size_t(m.config.n_vocab));
    EXPECT_LT(test::max_rel_diff(last, std::vector<float>(ref.end() - m.config.n_vocab, ref.end())), 1e-4);
  }
  // the model really mixes positions: logits of the same token differ with context
  const size_t V = m.config.n_vocab;
  EXPECT_GT(test::max_rel_diff(std::vector<float>(ref.begin() + 4 * V, ref.begin() + 5 * V),
                               std::vector<float>(ref.begin() + 5 * V, ref.begin() + 6 * V)),
            1e-3);
}

TEST_P(HandModelTest, ComposedTensorsGiveTheSameLogits) {
  const bool glm = GetParam();
  const HandModel m = make_model(glm, 21);
  const std::vector<float> ref = naive_logits(m, kPrompt);
  const char* q_name = glm ? "attn_q_b.weight" : "attn_q.weight";
  for (int mode = 1; mode <= 3; ++mode) {  // 1 qk, 2 vo, 3 both
    const bool qk = mode & 1, vo = mode & 2;
    std::map<std::string, Tensor> extra;
    std::vector<std::string> drop;
    for (uint32_t l = 0; l < m.config.n_layer; ++l) {
      extra.merge(compose(m, l, qk, vo));
      if (qk) drop.insert(drop.end(), {blk(l, q_name), blk(l, "attn_k_b.weight")});
      if (vo) drop.insert(drop.end(), {blk(l, "attn_v_b.weight"), blk(l, "attn_output.weight")});
    }
    const std::string path = write_gguf(m, "composed" + std::to_string(mode) + ".gguf", extra, drop);
    GgufWeights w(path);
    CpuModel model(w, 16, 2, AttentionPath::Absorbed);
    EXPECT_LT(test::max_rel_diff(model.forward(kPrompt), ref), 1e-4) << "mode " << mode;
    // the expanded path needs the split originals
    try {
      CpuModel bad(w, 16, 1, AttentionPath::Expanded);
      ADD_FAILURE() << "expanded path accepted a composed-only file";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      EXPECT_NE(std::string(e.what()).find(qk ? "attn_k_b" : "attn_v_b"), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GlmAndLite, HandModelTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? std::string("glm") : std::string("lite"); });

// ---- errors ----------------------------------------------------------------------------------

ErrorKind kind_of(const std::function<void()>& f, std::string* msg = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.kind();
  }
  ADD_FAILURE() << "no tessera::Error thrown";
  return ErrorKind::Runtime;
}

TEST(HandModelErrors, ContextAndTokenChecks) {
  const HandModel m = make_model(true, 5);
  GgufWeights w(write_gguf(m, "err.gguf"));
  CpuModel model(w, 4, 1, AttentionPath::Absorbed);
  std::string msg;
  EXPECT_EQ(kind_of([&] { model.forward(std::vector<int32_t>{1, 2, 3, 4, 5}); }, &msg), ErrorKind::Usage);
  EXPECT_NE(msg.find("context"), std::string::npos) << msg;
  EXPECT_EQ(model.n_past(), 0);
  model.forward(std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(kind_of([&] { model.forward(std::vector<int32_t>{1, 2}); }), ErrorKind::Usage);
  EXPECT_EQ(model.n_past(), 3);
  EXPECT_EQ(kind_of([&] { model.forward(std::vector<int32_t>{30}); }, &msg), ErrorKind::Usage);
  EXPECT_NE(msg.find("30"), std::string::npos) << msg;
  EXPECT_EQ(kind_of([&] { model.forward(std::vector<int32_t>{-1}); }), ErrorKind::Usage);
  EXPECT_TRUE(model.forward(std::vector<int32_t>{}).empty());
  EXPECT_EQ(kind_of([&] { CpuModel bad(w, 0, 1, AttentionPath::Absorbed); }), ErrorKind::Usage);
}

TEST(HandModelErrors, MissingAndMisshapenTensors) {
  HandModel m = make_model(true, 6);
  std::string msg;
  {
    GgufWeights w(write_gguf(m, "missing.gguf", {}, {"blk.2.ffn_up_exps.weight"}));
    EXPECT_EQ(kind_of([&] { CpuModel model(w, 8, 1, AttentionPath::Absorbed); }, &msg), ErrorKind::BadInput);
    EXPECT_NE(msg.find("blk.2.ffn_up_exps.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing.gguf"), std::string::npos) << msg;
  }
  {
    Tensor& t = m.tensors.at("blk.1.attn_kv_a_mqa.weight");
    t.ne = {16, 11};
    t.data.resize(16 * 11);
    GgufWeights w(write_gguf(m, "shape.gguf"));
    EXPECT_EQ(kind_of([&] { CpuModel model(w, 8, 1, AttentionPath::Expanded); }, &msg), ErrorKind::BadInput);
    EXPECT_NE(msg.find("blk.1.attn_kv_a_mqa.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("{16, 11}"), std::string::npos) << msg;
    EXPECT_NE(msg.find("{16, 12}"), std::string::npos) << msg;
  }
}

TEST(WeightSource, ReadRowsBoundsAndOpenWeights) {
  const HandModel m = make_model(false, 7);
  const std::string path = write_gguf(m, "rows.gguf");
  std::unique_ptr<WeightSource> w = open_weights(path);
  const TensorDesc d = w->desc("blk.1.ffn_down_exps.weight");
  EXPECT_EQ(d.ne, (std::array<uint64_t, 4>{7, 16, 4, 1}));
  EXPECT_EQ(d.n_rows(), 64u);
  EXPECT_EQ(d.shape_string(), "{7, 16, 4}");
  // slab-major row numbering: row = slab*ne1 + r
  std::vector<float> row(7);
  w->read_rows("blk.1.ffn_down_exps.weight", 2 * 16 + 5, 1, row.data());
  const Tensor& t = m.tensors.at("blk.1.ffn_down_exps.weight");
  for (int c = 0; c < 7; ++c) EXPECT_EQ(row[c], float(t.at(2, 5, c)));
  EXPECT_EQ(kind_of([&] { w->read_rows("blk.1.ffn_down_exps.weight", 63, 2, row.data()); }), ErrorKind::BadInput);
  EXPECT_EQ(kind_of([&] { w->desc("nope.weight"); }), ErrorKind::BadInput);
  EXPECT_EQ(w->read_all("output_norm.weight").size(), 16u);
  // unknown magic / missing file
  const std::string junk = (test::temp_dir() / "junk.bin").string();
  FILE* f = std::fopen(junk.c_str(), "wb");
  std::fputs("NOPE, not a model", f);
  std::fclose(f);
  std::string msg;
  EXPECT_EQ(kind_of([&] { open_weights(junk); }, &msg), ErrorKind::BadInput);
  EXPECT_NE(msg.find("NOPE"), std::string::npos) << msg;
  EXPECT_EQ(kind_of([&] { open_weights((test::temp_dir() / "absent.gguf").string()); }), ErrorKind::Runtime);
}

}  // namespace
}  // namespace tessera
