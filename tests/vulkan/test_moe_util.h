// Host side of the MoE kernel tests (test_moe*.cpp): MOE_TILE1 tiles built from random quantized
// experts with the format's own tile writer (format/tsr_layout.h), and the CPU reference of the
// gate-up / down math (forward.md §5.2) in plain double loops, with error bounds.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "format/tsr_layout.h"
#include "runtime/cpu/ops.h"
#include "runtime/vulkan/kernels_prefill.h"
#include "tests/vulkan/vk_test_util.h"

namespace tessera::moetest {

struct TileTypes {
  GgmlType gateup, down, shared_gateup, shared_down;
};

// A tile image and the GGUF bytes it was made from (slot E = the shared expert).
struct HostTile {
  MoeTileGeometry g;
  std::vector<uint8_t> bytes;  // the tile, padded to a multiple of 16
  std::vector<std::vector<uint8_t>> gate, up, down;

  // Row r of one part of a slot, dequantized (gate/up: n_embd values, down: width values).
  std::vector<float> row(uint32_t slot, MoePart part, uint32_t r) const {
    const bool shared = g.is_shared(slot);
    if (part == MoePart::Down)
      return vktest::dequant_row(shared ? g.shared_down_type : g.down_type, down[slot], uint32_t(g.width(slot)), r);
    const GgmlType t = shared ? g.shared_gateup_type : g.gateup_type;
    return vktest::dequant_row(t, part == MoePart::Gate ? gate[slot] : up[slot], uint32_t(g.n_embd), r);
  }
};

inline HostTile build_tile(std::mt19937& rng, uint32_t n_expert, uint32_t w_routed, uint32_t w_shared, uint32_t n_embd,
                           const TileTypes& t) {
  HostTile ht;
  ht.g = moe_tile_geometry(n_expert, w_routed, w_shared, n_embd, t.gateup, t.down, t.shared_gateup, t.shared_down);
  ht.bytes.assign((ht.g.total_bytes + 15) / 16 * 16, 0);
  const uint32_t slots = ht.g.n_slots();
  ht.gate.resize(slots);
  ht.up.resize(slots);
  ht.down.resize(slots);
  for (uint32_t s = 0; s < slots; ++s) {
    const bool shared = ht.g.is_shared(s);
    const uint32_t w = uint32_t(ht.g.width(s));
    const GgmlType gu = shared ? t.shared_gateup : t.gateup, dn = shared ? t.shared_down : t.down;
    ht.gate[s] = vktest::random_matrix(rng, gu, w, n_embd);
    ht.up[s] = vktest::random_matrix(rng, gu, w, n_embd);
    ht.down[s] = vktest::random_matrix(rng, dn, n_embd, w);
    moe_tile_put_rows(ht.g, s, MoePart::Gate, 0, w, ht.gate[s].data(), ht.bytes.data());
    moe_tile_put_rows(ht.g, s, MoePart::Up, 0, w, ht.up[s].data(), ht.bytes.data());
    moe_tile_put_rows(ht.g, s, MoePart::Down, 0, n_embd, ht.down[s].data(), ht.bytes.data());
  }
  return ht;
}

using RowFn = std::function<std::vector<float>(uint32_t)>;

// h[i] = silu(gate_i . in) * (up_i . in) for i < width, in double; tol[i] bounds the f32 kernel's
// error (rounding of the two dot products, propagated through silu * mul).
// rel: the relative error per dot product the tolerance allows (1e-4 for the int8-activation path,
// whose input is rounded the same way on both sides, but a value may land one step off).
inline void ref_gateup(const RowFn& gate, const RowFn& up, uint32_t width, const std::vector<double>& in,
                       std::vector<double>& h, std::vector<double>& tol, double rel = 2e-5) {
  h.assign(width, 0.0);
  tol.assign(width, 0.0);
  for (uint32_t i = 0; i < width; ++i) {
    const std::vector<float> gr = gate(i), ur = up(i);
    double gs = 0, us = 0, ga = 0, ua = 0;
    for (size_t k = 0; k < in.size(); ++k) {
      gs += double(gr[k]) * in[k];
      us += double(ur[k]) * in[k];
      ga += std::fabs(double(gr[k]) * in[k]);
      ua += std::fabs(double(ur[k]) * in[k]);
    }
    const double silu = gs / (1.0 + std::exp(-gs));
    h[i] = silu * us;
    const double eg = rel * ga + 1e-6, eu = rel * ua + 1e-6;
    tol[i] = 1.2 * eg * (std::fabs(us) + eu) + std::fabs(silu) * eu + 1e-6 * (std::fabs(h[i]) + 1e-3);
  }
}

// y[r] += weight * (down row r . hs), abs[r] += |weight| * sum |down[r][j] * hs[j]|, r < rows.
inline void ref_down_add(const RowFn& down, uint32_t rows, double weight, const double* hs, std::vector<double>& y,
                         std::vector<double>& abs) {
  for (uint32_t r = 0; r < rows; ++r) {
    const std::vector<float> dr = down(r);
    double s = 0, a = 0;
    for (size_t j = 0; j < dr.size(); ++j) {
      s += double(dr[j]) * hs[j];
      a += std::fabs(double(dr[j]) * hs[j]);
    }
    y[r] += weight * s;
    abs[r] += std::fabs(weight) * a;
  }
}

// Tolerance of an f32 accumulation whose terms' absolute values sum to abs, onto a value v.
// The prefill tests' two routings of E experts, K a token: GLM's kind (sigmoid, the expert bias
// steering the choice, weights normalized and scaled by 2.5) or a plain softmax.
inline ModelConfig prefill_routing(uint32_t E, uint32_t K, bool sigmoid) {
  ModelConfig cfg;
  cfg.n_expert = E;
  cfg.n_expert_used = K;
  cfg.gating = sigmoid ? GatingFunc::Sigmoid : GatingFunc::Softmax;
  cfg.expert_weights_norm = sigmoid;
  cfg.expert_weights_scale = sigmoid ? 2.5f : 0.f;
  return cfg;
}

// A PrefillRouteOp of a chunk of T tokens over these buffers (bias: the expert bias, or none),
// the live token count in vktest::step_buffer's words.
inline vk::PrefillRouteOp prefill_route_op(const ModelConfig& cfg, uint32_t T, const vk::Buffer& logits,
                                           const vk::Buffer* bias, const vk::Buffer& step, const vk::Buffer& route,
                                           const vk::Buffer& lists) {
  vk::PrefillRouteOp op;
  op.n_expert = cfg.n_expert;
  op.routing = vk::MoeRouting::from_config(cfg);
  op.t_max = T;
  op.logits = logits.whole();
  if (bias) op.bias = bias->whole();
  op.step = step.whole();
  op.count_word = vktest::kStepCountWord;
  op.route = route.whole();
  op.lists = lists.whole();
  return op;
}

inline double sum_tol(double abs, double v, double rel = 2e-5) { return rel * abs + 1e-6 * std::fabs(v) + 1e-6; }

}  // namespace tessera::moetest
