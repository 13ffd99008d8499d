// Micro-benchmark: the MoE expert kernels of one block (gate-up with SiLU·mul, then down with the
// routing weights and the residual add; shaders/moe_gateup.comp, moe_down.comp) at
// GLM-4.7-Flash's shape (n_embd 2048, 64 experts of width 1536, 4 used, 1 shared slot of 1536;
// sigmoid routing with selection bias), per weight type. The routing is computed once (RouteOp)
// into the route buffer the expert kernels read, as in the decode graph; the timed work is the
// gate-up and the down. Checked first against the CPU: routing (sigmoid + bias, top-4,
// normalized, scaled) and the whole block's x update, in double.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "bench/micro_util.h"
#include "format/model_config.h"
#include "format/quant.h"
#include "format/tsr_layout.h"
#include "runtime/vulkan/kernels_moe.h"

namespace tessera::microbench {
namespace {

constexpr uint32_t kEmbd = 2048, kExperts = 64, kWidth = 1536, kUsed = 4;

struct HostTile {
  MoeTileGeometry g;
  std::vector<uint8_t> bytes;                       // the tile image
  std::vector<std::vector<float>> gate, up, down;   // per slot, dequantized row-major
};

// Random experts quantized to `type`, written into a tile with the format's own writer.
HostTile build_tile(std::mt19937& rng, GgmlType type) {
  HostTile t;
  t.g = moe_tile_geometry(kExperts, kWidth, kWidth, kEmbd, type, type, type, type);
  t.bytes.assign((t.g.total_bytes + 15) / 16 * 16, 0);
  const uint32_t slots = t.g.n_slots();
  t.gate.resize(slots);
  t.up.resize(slots);
  t.down.resize(slots);
  auto part = [&](uint32_t slot, MoePart p, uint32_t rows, uint32_t cols, std::vector<float>& deq) {
    const uint64_t rb = row_bytes(type, cols);
    std::vector<uint8_t> q(rb * rows);
    deq.resize(size_t(rows) * cols);
    for (uint32_t r = 0; r < rows; ++r) {
      const std::vector<float> v = random_floats(rng, cols, 0.03f);
      quantize_row(type, v.data(), q.data() + r * rb, cols);
      dequantize_row(type, q.data() + r * rb, deq.data() + size_t(r) * cols, cols);
    }
    moe_tile_put_rows(t.g, slot, p, 0, rows, q.data(), t.bytes.data());
  };
  for (uint32_t s = 0; s < slots; ++s) {
    part(s, MoePart::Gate, kWidth, kEmbd, t.gate[s]);
    part(s, MoePart::Up, kWidth, kEmbd, t.up[s]);
    part(s, MoePart::Down, kEmbd, kWidth, t.down[s]);
  }
  return t;
}

// x + the block's expert output, in double: routing as routing.glsl documents it.
std::vector<double> reference(const HostTile& t, const vk::MoeRouting& r, const std::vector<float>& h2,
                              const std::vector<float>& logits, const std::vector<float>& bias,
                              const std::vector<float>& x) {
  std::vector<double> prob(kExperts), key(kExperts);
  for (uint32_t e = 0; e < kExperts; ++e) {
    prob[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
    key[e] = prob[e] + bias[e];
  }
  std::vector<uint32_t> order(kExperts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return key[a] > key[b]; });
  std::vector<double> w(r.n_used);
  double sum = 0;
  for (uint32_t k = 0; k < r.n_used; ++k) sum += (w[k] = prob[order[k]]);
  for (double& v : w) {
    if (r.norm_weights) v /= sum;
    if (r.weights_scale != 0.f && r.weights_scale != 1.f) v *= r.weights_scale;
  }
  std::vector<double> out(x.begin(), x.end());
  auto expert = [&](uint32_t slot, double weight) {
    std::vector<double> h(kWidth);
    for (uint32_t i = 0; i < kWidth; ++i) {
      double g = 0, u = 0;
      for (uint32_t k = 0; k < kEmbd; ++k) {
        g += double(t.gate[slot][size_t(i) * kEmbd + k]) * h2[k];
        u += double(t.up[slot][size_t(i) * kEmbd + k]) * h2[k];
      }
      h[i] = g / (1.0 + std::exp(-g)) * u;
    }
    for (uint32_t row = 0; row < kEmbd; ++row) {
      double s = 0;
      for (uint32_t i = 0; i < kWidth; ++i) s += double(t.down[slot][size_t(row) * kWidth + i]) * h[i];
      out[row] += weight * s;
    }
  };
  for (uint32_t k = 0; k < r.n_used; ++k) expert(order[k], w[k]);
  expert(kExperts, 1.0);  // the shared slot
  return out;
}

void BM_Moe(benchmark::State& state, GgmlType type) {
  Gpu& g = gpu();
  if (!require_gpu(state, g)) return;
  std::mt19937 rng(uint32_t(type) + 11);
  const HostTile t = build_tile(rng, type);
  const ModelConfig cfg = *ModelConfig::preset("glm47flash");
  vk::MoeRouting routing = vk::MoeRouting::from_config(cfg);
  routing.n_used = kUsed;
  const std::vector<float> h2 = random_floats(rng, kEmbd), x = random_floats(rng, kEmbd);
  const std::vector<float> logits = random_floats(rng, kExperts, 0.5f), bias = random_floats(rng, kExperts, 0.05f);

  const uint64_t tile_stride = (t.bytes.size() + 4095) / 4096 * 4096;
  const uint32_t copies = copies_for(g, tile_stride);
  std::vector<vk::Buffer> tiles;
  for (uint32_t c = 0; c < copies; ++c) tiles.push_back(upload(g, t.bytes.data(), t.bytes.size(), "tile"));
  vk::Buffer h2b = upload(g, h2.data(), h2.size() * 4, "h2"), lb = upload(g, logits.data(), logits.size() * 4, "logits");
  vk::Buffer bb = upload(g, bias.data(), bias.size() * 4, "bias"), xb = upload(g, x.data(), x.size() * 4, "x");
  vk::Buffer hb = make_buffer(g, vk::moe_h_floats(t.g, kUsed) * 4, "h");
  // The route buffer as the router leaves it (the decode graph's path): expert ids and weights,
  // computed once here by RouteOp from the logits (its counter word starts at zero).
  const std::vector<uint32_t> zeros(2 * kUsed + 1, 0);
  vk::Buffer route = upload(g, zeros.data(), zeros.size() * 4, "route");
  {
    vk::RouteOp r;
    r.n_expert = kExperts;
    r.routing = routing;
    r.logits = lb.whole();
    r.bias = bb.whole();
    r.route = route.whole();
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    r.record(rec);
    rec.end();
    rec.run();
  }
  auto ops_for = [&](uint32_t c) {
    std::pair<vk::MoeGateUpOp, vk::MoeDownOp> p;
    vk::MoeGateUpOp& gu = p.first;
    gu.tile = {&tiles[c], 0, t.g};
    gu.n_used = kUsed;
    gu.h2 = h2b.whole();
    gu.route = route.whole();
    gu.h = hb.whole();
    vk::MoeDownOp& dn = p.second;
    dn.tile = gu.tile;
    dn.n_used = kUsed;
    dn.h = hb.whole();
    dn.route = route.whole();
    dn.x = xb.whole();
    return p;
  };
  auto record = [&](vk::CommandRecorder& rec, uint32_t c) {
    const auto [gu, dn] = ops_for(c);
    gu.record(rec);
    rec.barrier();
    dn.record(rec);
  };

  {
    vk::CommandRecorder rec(*g.ctx);
    rec.begin();
    rec.fill(hb.whole(), 0x7fc00000u);  // NaN: an unwritten h element poisons x
    rec.barrier();
    record(rec, 0);
    rec.end();
    rec.run();
    // Compare the update (x_out - x), not x_out, so the residual cannot hide an error.
    std::vector<float> delta = download(g, xb, kEmbd);
    std::vector<double> want = reference(t, routing, h2, logits, bias, x);
    for (uint32_t i = 0; i < kEmbd; ++i) {
      delta[i] -= x[i];
      want[i] -= x[i];
    }
    const double err = rel_error(delta, want);
    if (!(err < 1e-3)) {
      state.SkipWithError(("MoE block disagrees with the CPU: relative error " + std::to_string(err)).c_str());
      return;
    }
  }
  TimedOps ops(g, copies, record);
  const auto [gu, dn] = ops_for(0);
  time_loop(state, ops, gu.bytes() + dn.bytes());
}

const bool kRegistered = [] {
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K})
    benchmark::RegisterBenchmark((std::string("moe_block/glm/") + type_name(type)).c_str(), BM_Moe, type)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
}  // namespace tessera::microbench
