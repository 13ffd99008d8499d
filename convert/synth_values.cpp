// Random weight values for synthetic models: per-tensor distributions, a counter-based random
// stream per row chunk, the float path (draw floats, quantize_row) and the direct block drawers
// (draw quantized blocks without a float intermediate, for the full-size presets).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "convert/synth.h"
#include "format/error.h"
#include "format/fp16.h"

namespace tessera::synth {

namespace {

// ---- random streams ----

// SplitMix64 finalizer: a bijective 64-bit mixer with full avalanche.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// SplitMix64 stream: the state advances by the golden-ratio increment and each output is the
// mixed state. Seeded from (seed, tensor name, chunk), so each chunk is an independent stream.
class Rng {
 public:
  Rng(uint64_t seed, std::string_view tensor, uint64_t chunk)
      : state_(mix64(mix64(seed ^ 0x7e55e7a5u) ^ fnv1a(tensor)) + mix64(chunk + 1) * 0x9E3779B97F4A7C15ull) {}
  uint64_t next() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }
  // Approximately standard normal: Irwin-Hall sum of four 16-bit uniforms, rescaled to unit
  // variance (support |z| < 3.47). Cheap and deterministic.
  float normal() {
    const uint64_t r = next();
    const int32_t sum = int32_t(r & 0xffff) + int32_t((r >> 16) & 0xffff) + int32_t((r >> 32) & 0xffff) + int32_t(r >> 48);
    return float(sum - 131070) * kIrwinHallScale;
  }
  // Uniform in [lo, hi] (inclusive) from 16 random bits; hi - lo < 65536.
  static int uniform_int(uint64_t bits16, int lo, int hi) { return lo + int((bits16 & 0xffff) * uint64_t(hi - lo + 1) >> 16); }

 private:
  // 1 / sqrt(4 * var(U{0..65535})) with var = (65536^2 - 1) / 12
  static constexpr float kIrwinHallScale = 2.6429605e-05f;
  uint64_t state_;
};

// ---- direct blocks: integer levels from a discretized normal distribution ----

// 256 equiprobable levels: level[i] = clamp(round(spread * Phi^-1((i + 0.5) / 256)), -max, max),
// so one random byte draws one level. rms = the exact RMS of the 256 entries.
struct LevelTable {
  std::array<int8_t, 256> level{};
  float rms = 0;
};

double inverse_normal_cdf(double p) {
  double lo = -10, hi = 10;  // bisection on Phi(x) = erfc(-x / sqrt 2) / 2
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

LevelTable make_level_table(double spread, int max_level) {
  LevelTable t;
  double sum_sq = 0;
  for (int i = 0; i < 256; ++i) {
    const double v = std::nearbyint(spread * inverse_normal_cdf((i + 0.5) / 256.0));
    const int l = int(std::clamp(v, double(-max_level), double(max_level)));
    t.level[size_t(i)] = int8_t(l);
    sum_sq += double(l) * l;
  }
  t.rms = float(std::sqrt(sum_sq / 256));
  return t;
}

// Symmetric level ranges (so the mean is 0) with a spread that uses the type's resolution.
const LevelTable& levels_q4() { static const LevelTable t = make_level_table(2.6, 7); return t; }      // q-8 of Q4_0/Q4_K
const LevelTable& levels_q5() { static const LevelTable t = make_level_table(5.2, 15); return t; }     // q-16 of Q5_0
const LevelTable& levels_q6() { static const LevelTable t = make_level_table(10.5, 31); return t; }    // q-32 of Q6_K
const LevelTable& levels_q8() { static const LevelTable t = make_level_table(42.0, 127); return t; }   // Q8_0

// Root mean square of the integers lo..hi (uniformly drawn sub-block scales).
double rms_uniform_int(int lo, int hi) {
  double s = 0;
  for (int k = lo; k <= hi; ++k) s += double(k) * k;
  return std::sqrt(s / (hi - lo + 1));
}

// Per-block scale jitter: uniform in [0.75, 1.25], normalized so E[jitter^2] = 1.
float jitter(uint64_t bits16) {
  static const float norm = float(1.0 / std::sqrt(1.0 + 0.25 * 0.25 / 3.0));
  return (0.75f + 0.5f * float(bits16 & 0xffff) / 65535.f) * norm;
}

// Fills `n` levels (n % 8 == 0) from the table, one random byte each.
void draw_levels(Rng& rng, const LevelTable& table, int8_t* out, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = rng.next();
    for (size_t k = 0; k < 8; ++k, r >>= 8) out[i + k] = table.level[r & 0xff];
  }
}

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Q8_0 block (gguf.md §7.2): d fp16, 32 x int8.
void draw_q8_0(Rng& rng, float sigma, uint8_t* dst, uint64_t n_blocks) {
  const LevelTable& t = levels_q8();
  const float base = sigma / t.rms;
  for (uint64_t b = 0; b < n_blocks; ++b, dst += 34) {
    put_u16(dst, f32_to_fp16(base * jitter(rng.next())));
    draw_levels(rng, t, reinterpret_cast<int8_t*>(dst + 2), 32);
  }
}

// Q4_0 block (§7.3): d fp16, 16 bytes; low nibbles elements 0..15, high nibbles 16..31; q = l + 8.
void draw_q4_0(Rng& rng, float sigma, uint8_t* dst, uint64_t n_blocks) {
  const LevelTable& t = levels_q4();
  const float base = sigma / t.rms;
  int8_t l[32];
  for (uint64_t b = 0; b < n_blocks; ++b, dst += 18) {
    put_u16(dst, f32_to_fp16(base * jitter(rng.next())));
    draw_levels(rng, t, l, 32);
    for (int j = 0; j < 16; ++j) dst[2 + j] = uint8_t((l[j] + 8) | ((l[j + 16] + 8) << 4));
  }
}

// Q5_0 block (§7.5): d fp16, qh u32 (bit i = 5th bit of element i), 16 nibble bytes; q = l + 16.
void draw_q5_0(Rng& rng, float sigma, uint8_t* dst, uint64_t n_blocks) {
  const LevelTable& t = levels_q5();
  const float base = sigma / t.rms;
  int8_t l[32];
  for (uint64_t b = 0; b < n_blocks; ++b, dst += 22) {
    put_u16(dst, f32_to_fp16(base * jitter(rng.next())));
    draw_levels(rng, t, l, 32);
    uint32_t qh = 0;
    for (int i = 0; i < 32; ++i) qh |= uint32_t(((l[i] + 16) >> 4) & 1) << i;
    std::memcpy(dst + 2, &qh, 4);
    for (int j = 0; j < 16; ++j) dst[6 + j] = uint8_t(((l[j] + 16) & 15) | (((l[j + 16] + 16) & 15) << 4));
  }
}

// Q4_K super-block (§7.7, §7.8): x = d*sc_j*q - dmin*mn_j. With mn_j = sc_j and dmin = 8d every
// sub-block is centred: x = d*sc_j*(q - 8), q = l + 8. Sub-block scales sc_j uniform in 32..63.
void draw_q4_k(Rng& rng, float sigma, uint8_t* dst, uint64_t n_blocks) {
  const LevelTable& t = levels_q4();
  static const float sc_rms = float(rms_uniform_int(32, 63));
  const float base = sigma / (t.rms * sc_rms);
  int8_t l[256];
  for (uint64_t b = 0; b < n_blocks; ++b, dst += 144) {
    uint64_t r = rng.next();
    const uint16_t d16 = f32_to_fp16(base * jitter(r));
    put_u16(dst, d16);
    put_u16(dst + 2, f32_to_fp16(8.f * fp16_to_f32(d16)));
    uint8_t sc[8];
    r = rng.next();
    for (int j = 0; j < 8; ++j, r >>= 8) sc[j] = uint8_t(Rng::uniform_int((r & 0xff) << 8, 32, 63));
    uint8_t* s = dst + 4;  // inverse of get_scale_min_k4 with mn == sc
    for (int j = 0; j < 4; ++j) {
      s[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      s[j + 4] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      s[j + 8] = uint8_t((sc[j + 4] & 15) | ((sc[j + 4] & 15) << 4));
    }
    draw_levels(rng, t, l, 256);
    uint8_t* qs = dst + 16;
    for (int c = 0; c < 4; ++c)
      for (int k = 0; k < 32; ++k) qs[32 * c + k] = uint8_t((l[64 * c + k] + 8) | ((l[64 * c + 32 + k] + 8) << 4));
  }
}

// Q6_K super-block (§7.10): x = d*scales[e/16]*(q - 32), q = l + 32 split into ql (low 4 bits)
// and qh (high 2 bits); int8 sub-block scales uniform in 64..127.
void draw_q6_k(Rng& rng, float sigma, uint8_t* dst, uint64_t n_blocks) {
  const LevelTable& t = levels_q6();
  static const float sc_rms = float(rms_uniform_int(64, 127));
  const float base = sigma / (t.rms * sc_rms);
  int8_t l[256];
  for (uint64_t b = 0; b < n_blocks; ++b, dst += 210) {
    draw_levels(rng, t, l, 256);
    uint8_t q[256];
    for (int e = 0; e < 256; ++e) q[e] = uint8_t(l[e] + 32);
    for (int n = 0; n < 2; ++n) {
      uint8_t* L = dst + 64 * n;
      uint8_t* H = dst + 128 + 32 * n;
      const uint8_t* Q = q + 128 * n;
      for (int k = 0; k < 32; ++k) {
        L[k] = uint8_t((Q[k] & 15) | ((Q[k + 64] & 15) << 4));
        L[k + 32] = uint8_t((Q[k + 32] & 15) | ((Q[k + 96] & 15) << 4));
        H[k] = uint8_t((Q[k] >> 4) | ((Q[k + 32] >> 4) << 2) | ((Q[k + 64] >> 4) << 4) | ((Q[k + 96] >> 4) << 6));
      }
    }
    for (int i = 0; i < 16; i += 4) {
      uint64_t r = rng.next();
      for (int k = 0; k < 4; ++k, r >>= 16) dst[192 + i + k] = uint8_t(Rng::uniform_int(r, 64, 127));
    }
    put_u16(dst + 208, f32_to_fp16(base * jitter(rng.next())));
  }
}

// The direct drawer of a type, or nullptr where only the float path exists.
using BlockDrawer = void (*)(Rng&, float, uint8_t*, uint64_t);
BlockDrawer block_drawer(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: return draw_q8_0;
    case GgmlType::Q4_0: return draw_q4_0;
    case GgmlType::Q5_0: return draw_q5_0;
    case GgmlType::Q4_K: return draw_q4_k;
    case GgmlType::Q6_K: return draw_q6_k;
    default: return nullptr;
  }
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

ValueDist value_dist(const TensorSpec& spec) {
  const float in = float(spec.ne.empty() ? 1 : spec.ne[0]);
  switch (spec.role) {
    case TensorRole::Norm: return {1.f, 0.1f};              // RMSNorm gains around 1
    case TensorRole::ExpProbsBias: return {0.f, 0.02f};     // small next to sigmoid probs (~0.2 spread)
    case TensorRole::TokenEmbd: return {0.f, 1.f};          // O(1) embeddings
    case TensorRole::Output: return {0.f, 2.f / std::sqrt(in)};  // logits std ~2 after output_norm
    case TensorRole::Router:                                // router logits std ~1: varied experts
    case TensorRole::Matrix:
    case TensorRole::Experts: break;
  }
  // Any other 1-D tensor (biases) stays small; matrices map RMS-1 inputs to RMS-1 outputs.
  if (spec.ne.size() == 1 || !ends_with(spec.name, "weight")) return {0.f, 0.02f};
  return {0.f, 1.f / std::sqrt(in)};
}

uint64_t rows_per_chunk(const PlannedTensor& t) {
  constexpr uint64_t kChunkElems = uint64_t(1) << 20;
  const uint64_t ne0 = t.spec.ne.empty() ? 1 : t.spec.ne[0];
  return std::max<uint64_t>(1, kChunkElems / ne0);
}

uint64_t generate_chunk(const Plan& plan, const PlannedTensor& t, uint64_t chunk, uint64_t seed, void* dst,
                        std::vector<float>& scratch) {
  const uint64_t ne0 = t.spec.ne.empty() ? 1 : t.spec.ne[0];
  uint64_t n_rows = 1;
  for (size_t i = 1; i < t.spec.ne.size(); ++i) n_rows *= t.spec.ne[i];
  const uint64_t rpc = rows_per_chunk(t);
  const uint64_t row0 = chunk * rpc;
  if (row0 >= n_rows)
    runtime_error("synth: chunk ", chunk, " of ", t.spec.name, " is past its ", n_rows, " rows");
  const uint64_t rows = std::min(rpc, n_rows - row0);
  const uint64_t row_size = row_bytes(t.type, ne0);
  auto* out = static_cast<uint8_t*>(dst);

  const ValueDist dist = value_dist(t.spec);
  Rng rng(seed, t.spec.name, chunk);
  if (BlockDrawer draw = block_drawer(t.type); draw && plan.direct_blocks && dist.mean == 0.f) {
    const uint64_t n_blocks = rows * ne0 / type_info(t.type).block_elems;
    draw(rng, dist.stddev, out, n_blocks);
    return rows * row_size;
  }
  scratch.resize(size_t(rows * ne0));
  for (float& v : scratch) v = dist.mean + dist.stddev * rng.normal();
  for (uint64_t r = 0; r < rows; ++r) quantize_row(t.type, scratch.data() + r * ne0, out + r * row_size, int64_t(ne0));
  return rows * row_size;
}

}  // namespace tessera::synth
