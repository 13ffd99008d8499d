// Numerical sanity of the synthetic weights: element scales per tensor and per row, both value
// paths (floats + quantize_row, direct blocks), and a one-token forward pass (position 0, where
// attention is exact without RoPE or a cache) showing activations stay O(1) through the layers
// and the router picks varied experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "convert/synth.h"
#include "format/fp16.h"
#include "format/gguf.h"
#include "tests/synth/test_util.h"

namespace tessera::synth {
namespace {

using testing::options;

using testing::ScratchDir;

struct Moments {
  double mean = 0, rms = 0;
};
Moments moments(const float* v, size_t n) {
  double s = 0, s2 = 0;
  for (size_t i = 0; i < n; ++i) s += v[i], s2 += double(v[i]) * v[i];
  return {s / double(n), std::sqrt(s2 / double(n))};
}

// One chunk of a 2048 x 256 matrix of `type` through generate_chunk, dequantized.
std::vector<float> generated_matrix(GgmlType type, bool direct, uint64_t seed) {
  Plan plan = make_plan(options("tiny", "f32"));
  plan.direct_blocks = direct;
  PlannedTensor t;
  t.spec = {"blk.0.ffn_up.weight", {2048, 256}, TensorRole::Matrix, 0};
  t.type = type;
  t.nbytes = row_bytes(type, 2048) * 256;
  EXPECT_GE(rows_per_chunk(t), 256u);
  std::vector<uint8_t> bytes(t.nbytes);
  std::vector<float> scratch;
  EXPECT_EQ(generate_chunk(plan, t, 0, seed, bytes.data(), scratch), t.nbytes);
  std::vector<float> out(2048 * 256);
  for (size_t r = 0; r < 256; ++r) dequantize_row(type, bytes.data() + r * row_bytes(type, 2048), out.data() + r * 2048, 2048);
  return out;
}

TEST(SynthValues, MatrixScaleEveryTypeAndPath) {
  const double want = 1 / std::sqrt(2048.0);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0,
                        GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    for (bool direct : {false, true}) {
      SCOPED_TRACE(std::string(type_name(type)) + (direct ? " direct blocks" : " floats"));
      const std::vector<float> w = generated_matrix(type, direct, 9);
      const Moments all = moments(w.data(), w.size());
      EXPECT_NEAR(all.rms, want, 0.05 * want);
      EXPECT_LT(std::abs(all.mean), 0.01 * want);
      for (size_t r = 0; r < 256; ++r) {
        const Moments row = moments(w.data() + r * 2048, 2048);
        ASSERT_GT(row.rms, 0.8 * want) << "row " << r;
        ASSERT_LT(row.rms, 1.2 * want) << "row " << r;
        ASSERT_LT(std::abs(row.mean), 0.15 * want) << "row " << r;
      }
      // Not degenerate: many distinct values, and a bell shape (most mass within 2 sigma).
      std::set<float> distinct(w.begin(), w.begin() + 4096);
      EXPECT_GT(distinct.size(), 20u);
      const size_t inside = size_t(std::count_if(w.begin(), w.end(), [&](float v) { return std::abs(v) < 2 * want; }));
      EXPECT_GT(double(inside) / double(w.size()), 0.9);
    }
  }
}

// The raw bytes of one direct-block chunk of a 2048 x 256 matrix.
std::vector<uint8_t> direct_chunk(GgmlType type) {
  Plan plan = make_plan(options("tiny", "f32"));
  plan.direct_blocks = true;
  PlannedTensor t;
  t.spec = {"blk.0.ffn_gate.weight", {2048, 256}, TensorRole::Matrix, 0};
  t.type = type;
  t.nbytes = row_bytes(type, 2048) * 256;
  std::vector<uint8_t> bytes(t.nbytes);
  std::vector<float> scratch;
  generate_chunk(plan, t, 0, 21, bytes.data(), scratch);
  return bytes;
}

// Every dequantized element of a direct block is step * level with an integer level in the
// symmetric range the drawer uses; the tails are symmetric and use most of the range. Catches bit-packing mistakes that a
// moments check could miss (a wrong high-bit plane or offset leaves the range).
TEST(SynthValues, DirectBlocksDecodeToSymmetricIntegerLevels) {
  struct Case {
    GgmlType type;
    int max_level;
  };
  for (Case cs : {Case{GgmlType::Q8_0, 127}, Case{GgmlType::Q4_0, 7}, Case{GgmlType::Q5_0, 15}, Case{GgmlType::Q4_K, 7},
                  Case{GgmlType::Q6_K, 31}}) {
    SCOPED_TRACE(type_name(cs.type));
    const TypeInfo& ti = type_info(cs.type);
    const std::vector<uint8_t> bytes = direct_chunk(cs.type);
    std::vector<float> x(ti.block_elems);
    std::map<int, size_t> hist;
    for (size_t b = 0; b < bytes.size() / ti.block_bytes; ++b) {
      const uint8_t* blk = bytes.data() + b * ti.block_bytes;
      dequantize_row(cs.type, blk, x.data(), ti.block_elems);
      for (uint32_t e = 0; e < ti.block_elems; ++e) {
        float step = 0;
        switch (cs.type) {
          case GgmlType::Q6_K: step = fp16_to_f32(uint16_t(blk[208] | blk[209] << 8)) * float(int8_t(blk[192 + e / 16])); break;
          case GgmlType::Q4_K: {  // sub-block scale (low 6 bits for j < 4, split for j >= 4)
            const uint32_t j = e / 32;
            const int sc = j < 4 ? blk[4 + j] & 63 : (blk[4 + j + 4] & 15) | ((blk[4 + j - 4] >> 6) << 4);
            step = fp16_to_f32(uint16_t(blk[0] | blk[1] << 8)) * float(sc);
            break;
          }
          default: step = fp16_to_f32(uint16_t(blk[0] | blk[1] << 8)); break;
        }
        ASSERT_GT(step, 0.f) << "block " << b;
        const float level = x[e] / step;
        const int rounded = int(std::lround(level));
        ASSERT_NEAR(level, float(rounded), 1e-3f) << "block " << b << " element " << e;
        ASSERT_LE(std::abs(rounded), cs.max_level) << "block " << b << " element " << e;
        ++hist[rounded];
      }
    }
    // The tails reach most of the range, on both sides equally.
    const int top = std::max(-hist.begin()->first, hist.rbegin()->first);
    EXPECT_GE(top, cs.max_level * 4 / 5);
    EXPECT_GT(hist[top], 0u);
    EXPECT_GT(hist[-top], 0u);
    for (int k = 1; k <= 3; ++k) {  // symmetric around 0 within sampling noise
      const double a = double(hist[k]), c = double(hist[-k]);
      EXPECT_NEAR(a / (a + c), 0.5, 0.02) << "level " << k;
    }
  }
}

TEST(SynthValues, SeedAndChunkGiveDifferentStreams) {
  const auto a = generated_matrix(GgmlType::Q4_0, true, 1);
  const auto b = generated_matrix(GgmlType::Q4_0, true, 2);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, generated_matrix(GgmlType::Q4_0, true, 1));
  // Rows of one chunk are not copies of each other.
  EXPECT_FALSE(std::equal(a.begin(), a.begin() + 2048, a.begin() + 2048));
}

TEST(SynthValues, Distributions) {
  EXPECT_EQ(value_dist({"blk.0.attn_norm.weight", {256}, TensorRole::Norm, 0}).mean, 1.f);
  EXPECT_FLOAT_EQ(value_dist({"output.weight", {2048, 9}, TensorRole::Output, -1}).stddev, 2.f / std::sqrt(2048.f));
  EXPECT_FLOAT_EQ(value_dist({"blk.0.attn_k_b.weight", {192, 512, 20}, TensorRole::Matrix, 0}).stddev, 1.f / std::sqrt(192.f));
  EXPECT_LT(value_dist({"blk.1.exp_probs_b.bias", {64}, TensorRole::ExpProbsBias, 1}).stddev, 0.1f);
}

// ---- a whole tiny file, dequantized ----

struct Model {
  ModelConfig c;
  std::map<std::string, std::vector<float>> w;  // dequantized tensors by name
  const std::vector<float>& operator[](const std::string& n) const { return w.at(n); }
};

Model load(const std::string& path) {
  const GgufFile f = GgufFile::open(path);
  Model m{ModelConfig::from_metadata(f.metadata()), {}};
  for (const GgufTensorInfo& t : f.tensors()) {
    std::vector<float> v(t.n_elements());
    const uint64_t rb = row_bytes(t.type, t.ne[0]);
    for (uint64_t r = 0; r < t.n_rows(); ++r) dequantize_row(t.type, f.tensor_data(t) + r * rb, v.data() + r * t.ne[0], int64_t(t.ne[0]));
    m.w.emplace(t.name, std::move(v));
  }
  return m;
}

// y = W x for a row-major rows x cols slab starting at `w`.
std::vector<float> matvec(const float* w, size_t rows, size_t cols, const std::vector<float>& x) {
  std::vector<float> y(rows);
  for (size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (size_t c = 0; c < cols; ++c) s += double(w[r * cols + c]) * x[c];
    y[r] = float(s);
  }
  return y;
}
std::vector<float> rmsnorm(const std::vector<float>& x, const std::vector<float>& g, float eps) {
  const double ms = std::inner_product(x.begin(), x.end(), x.begin(), 0.0) / double(x.size());
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float(x[i] / std::sqrt(ms + eps)) * g[i];
  return y;
}
double rms(const std::vector<float>& v) { return moments(v.data(), v.size()).rms; }

std::vector<float> ffn(const float* gate, const float* up, const float* down, size_t d, size_t f, const std::vector<float>& h) {
  std::vector<float> g = matvec(gate, f, d, h), u = matvec(up, f, d, h);
  for (size_t i = 0; i < f; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  return matvec(down, d, f, g);
}

struct Trace {
  std::vector<double> residual_rms, attn_rms, ffn_rms;
  std::set<int> experts;
  std::vector<float> logits;
};

// One token at position 0: a single cached row, so attention weights are exactly 1 and the
// absorbed output is W_o * concat_h(Vb_h * c); RoPE at position 0 is the identity.
Trace forward_first_token(const Model& m, int token) {
  const ModelConfig& c = m.c;
  const size_t d = c.n_embd, R = c.kv_lora_rank, H = c.n_head;
  Trace tr;
  std::vector<float> x(m["token_embd.weight"].begin() + long(token * d), m["token_embd.weight"].begin() + long((token + 1) * d));
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    auto W = [&](const char* s) -> const std::vector<float>& { return m[blk(l, s)]; };
    const std::vector<float> h = rmsnorm(x, W("attn_norm.weight"), c.eps);
    std::vector<float> kv = matvec(W("attn_kv_a_mqa.weight").data(), R + c.n_rot, d, h);
    kv.resize(R);
    const std::vector<float> lat = rmsnorm(kv, W("attn_kv_a_norm.weight"), c.eps);
    std::vector<float> o;
    for (size_t hd = 0; hd < H; ++hd) {
      const std::vector<float> oh = matvec(W("attn_v_b.weight").data() + hd * c.n_v * R, c.n_v, R, lat);
      o.insert(o.end(), oh.begin(), oh.end());
    }
    const std::vector<float> attn = matvec(W("attn_output.weight").data(), d, H * c.n_v, o);
    for (size_t i = 0; i < d; ++i) x[i] += attn[i];
    tr.attn_rms.push_back(rms(attn));

    const std::vector<float> h2 = rmsnorm(x, W("ffn_norm.weight"), c.eps);
    std::vector<float> y;
    if (!c.is_moe(l)) {
      y = ffn(W("ffn_gate.weight").data(), W("ffn_up.weight").data(), W("ffn_down.weight").data(), d, c.n_ff, h2);
    } else {
      const std::vector<float> logit = matvec(W("ffn_gate_inp.weight").data(), c.n_expert, d, h2);
      std::vector<float> p(c.n_expert), sel(c.n_expert);
      const float mx = *std::max_element(logit.begin(), logit.end());
      double z = 0;
      for (size_t e = 0; e < c.n_expert; ++e) z += std::exp(logit[e] - mx);
      for (size_t e = 0; e < c.n_expert; ++e) {
        p[e] = c.gating == GatingFunc::Sigmoid ? 1 / (1 + std::exp(-logit[e])) : float(std::exp(logit[e] - mx) / z);
        sel[e] = p[e] + (c.has_exp_probs_b ? W("exp_probs_b.bias")[e] : 0.f);
      }
      std::vector<int> idx(c.n_expert);
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + c.n_expert_used, idx.end(), [&](int a, int b) { return sel[a] > sel[b]; });
      idx.resize(c.n_expert_used);
      double wsum = 0;
      for (int e : idx) wsum += p[e];
      y = ffn(W("ffn_gate_shexp.weight").data(), W("ffn_up_shexp.weight").data(), W("ffn_down_shexp.weight").data(), d,
              c.n_ff_shared(), h2);
      const size_t slab = size_t(c.n_ff_exp) * d;
      for (int e : idx) {
        float wt = p[e];
        if (c.expert_weights_norm) wt = float(wt / wsum);
        if (c.expert_weights_scale != 0 && c.expert_weights_scale != 1) wt *= c.expert_weights_scale;
        const std::vector<float> ye = ffn(W("ffn_gate_exps.weight").data() + e * slab, W("ffn_up_exps.weight").data() + e * slab,
                                          W("ffn_down_exps.weight").data() + e * slab, d, c.n_ff_exp, h2);
        for (size_t i = 0; i < d; ++i) y[i] += wt * ye[i];
        tr.experts.insert(int(l * 1000 + e));
      }
    }
    for (size_t i = 0; i < d; ++i) x[i] += y[i];
    tr.ffn_rms.push_back(rms(y));
    tr.residual_rms.push_back(rms(x));
  }
  tr.logits = matvec(m["output.weight"].data(), c.n_vocab, d, rmsnorm(x, m["output_norm.weight"], c.eps));
  return tr;
}

void check_forward(const std::string& path, size_t n_layer) {
  const Model m = load(path);
  ASSERT_EQ(m.c.n_layer, n_layer);
  std::set<int> experts, argmax;
  for (int token : {0, 17, 300, 511, 777, 1000, 1050, 1099}) {
    const Trace t = forward_first_token(m, token);
    for (size_t l = 0; l < n_layer; ++l) {
      SCOPED_TRACE("token " + std::to_string(token) + " layer " + std::to_string(l));
      EXPECT_GT(t.attn_rms[l], 0.05);
      EXPECT_LT(t.attn_rms[l], 5.0);
      EXPECT_GT(t.ffn_rms[l], 0.05);
      EXPECT_LT(t.ffn_rms[l], 5.0);
      EXPECT_GT(t.residual_rms[l], 0.3);
      EXPECT_LT(t.residual_rms[l], 3.0 * std::sqrt(double(l + 2)));  // grows at most like a random walk
    }
    const Moments lg = moments(t.logits.data(), t.logits.size());
    EXPECT_TRUE(std::isfinite(lg.rms));
    EXPECT_GT(lg.rms, 0.8);
    EXPECT_LT(lg.rms, 5.0);
    experts.insert(t.experts.begin(), t.experts.end());
    argmax.insert(int(std::max_element(t.logits.begin(), t.logits.end()) - t.logits.begin()));
  }
  // 8 tokens pick K = 3 of 8 experts per MoE layer: random routing reaches ~7 distinct experts
  // per layer; a router that always picks the same 3 would give exactly 3.
  EXPECT_GE(experts.size(), 5 * (n_layer - 1));
  EXPECT_GE(argmax.size(), 4u) << "different tokens should predict different next tokens";
}

TEST(SynthValues, TinyForwardStaysSane) {
  ScratchDir dir;
  for (const char* preset : {"tiny", "tiny-lite"}) {
    SCOPED_TRACE(preset);
    SynthOptions o = options(preset, "f32", 2, -1, dir.file("m.gguf"), 2);
    synthesize(o);
    check_forward(o.out_path, 3);
  }
}

// Deep stack, quantized with the float path and with direct blocks: still O(1) at layer 24.
TEST(SynthValues, DeepQuantizedForwardStaysSane) {
  ScratchDir dir;
  for (Generation g : {Generation::Floats, Generation::Blocks}) {
    SynthOptions o = options("tiny", "q4_k_m", 5, 24, dir.file("deep.gguf"), 2, g);
    synthesize(o);
    check_forward(o.out_path, 24);
  }
}

TEST(SynthValues, EveryTensorOfATinyFileHasItsIntendedScale) {
  ScratchDir dir;
  SynthOptions o = options("tiny-lite", "q8_0", 8, -1, dir.file("m.gguf"), 2);
  synthesize(o);
  const Model m = load(o.out_path);
  for (const TensorSpec& s : expected_tensors(m.c)) {
    const ValueDist want = value_dist(s);
    const std::vector<float>& v = m[s.name];
    const Moments mo = moments(v.data(), v.size());
    const double sd = std::sqrt(std::max(0.0, mo.rms * mo.rms - mo.mean * mo.mean));
    const double tol = 5.0 / std::sqrt(double(v.size()));  // relative sampling error, generous
    EXPECT_NEAR(mo.mean, want.mean, 5 * want.stddev / std::sqrt(double(v.size())) + 1e-6) << s.name;
    EXPECT_NEAR(sd, want.stddev, (tol + 0.03) * want.stddev) << s.name;
  }
}

}  // namespace
}  // namespace tessera::synth
