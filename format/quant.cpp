// ggml type table, plain float types and the 32-element "legacy" blocks (Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0): dequantization (gguf.md §7) and llama.cpp's reference quantization (gguf.md §9).
// K-quants (Q4_K, Q5_K, Q6_K) live in quant_kquants.cpp.
//
// Notation in the diagrams: one row per byte range, offsets in bytes, little-endian fields.
// "d" is an IEEE half scale, x[i] is output element i of the block.
#include <algorithm>
#include <array>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "format/error.h"
#include "format/fp16.h"
#include "format/quant.h"
#include "format/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define TESSERA_HAVE_F16C_PATH 1
#endif

namespace tessera {

namespace {

using G = GgmlType;
constexpr G id(uint32_t v) { return static_cast<G>(v); }

// Every id of gguf.md §4 that ggml defines; block sizes from ggml's type traits.
constexpr TypeInfo kTypes[] = {
    {G::F32, "f32", 1, 4, true, true},
    {G::F16, "f16", 1, 2, true, true},
    {G::Q4_0, "q4_0", 32, 18, true, true},
    {G::Q4_1, "q4_1", 32, 20, true, true},
    {G::Q5_0, "q5_0", 32, 22, true, true},
    {G::Q5_1, "q5_1", 32, 24, true, true},
    {G::Q8_0, "q8_0", 32, 34, true, true},
    {G::Q8_1, "q8_1", 32, 36, false, false},
    {G::Q2_K, "q2_K", 256, 84, false, false},
    {G::Q3_K, "q3_K", 256, 110, false, false},
    {G::Q4_K, "q4_K", 256, 144, true, true},
    {G::Q5_K, "q5_K", 256, 176, true, true},
    {G::Q6_K, "q6_K", 256, 210, true, true},
    {G::Q8_K, "q8_K", 256, 292, false, false},
    {id(16), "iq2_xxs", 256, 66, false, false},
    {id(17), "iq2_xs", 256, 74, false, false},
    {id(18), "iq3_xxs", 256, 98, false, false},
    {id(19), "iq1_s", 256, 50, false, false},
    {id(20), "iq4_nl", 32, 18, false, false},
    {id(21), "iq3_s", 256, 110, false, false},
    {id(22), "iq2_s", 256, 82, false, false},
    {id(23), "iq4_xs", 256, 136, false, false},
    {G::I8, "i8", 1, 1, false, false},
    {G::I16, "i16", 1, 2, false, false},
    {G::I32, "i32", 1, 4, false, false},
    {G::I64, "i64", 1, 8, false, false},
    {G::F64, "f64", 1, 8, false, false},
    {id(29), "iq1_m", 256, 56, false, false},
    {G::BF16, "bf16", 1, 2, true, true},
    {id(34), "tq1_0", 256, 54, false, false},
    {id(35), "tq2_0", 256, 66, false, false},
    {id(39), "mxfp4", 32, 17, false, false},
};

constexpr uint32_t kMaxTypeId = 64;

struct TypeIndex {
  std::array<const TypeInfo*, kMaxTypeId> by_id{};
  TypeIndex() {
    for (const TypeInfo& t : kTypes) by_id[uint32_t(t.type)] = &t;
  }
};
const TypeIndex& type_index() {
  static const TypeIndex index;
  return index;
}

// fp16 -> f32 for all 65536 patterns (256 KiB), so F16 rows dequantize with one load per element.
const float* fp16_table() {
  static const std::array<float, 65536>* table = [] {
    auto* t = new std::array<float, 65536>;
    for (uint32_t h = 0; h < 65536; ++h) (*t)[h] = fp16_to_f32(uint16_t(h));
    return t;
  }();
  return table->data();
}

uint16_t load_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// ---------------------------------------------------------------------------------------------
// Plain types.

void dequant_f16(const uint8_t* src, float* dst, int64_t n) {
  const float* table = fp16_table();
  for (int64_t i = 0; i < n; ++i) dst[i] = table[load_u16(src + 2 * i)];
}
void dequant_bf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
}
void quant_f16_scalar(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, f32_to_fp16(src[i]));
}
#ifdef TESSERA_HAVE_F16C_PATH
// Hardware conversion (x86 F16C): round-to-nearest-even, NaN -> quiet NaN keeping the top payload
// bits, subnormals exact: the same bits as f32_to_fp16 (checked by tests/format).
__attribute__((target("avx,f16c"))) void quant_f16_f16c(const float* src, uint8_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  quant_f16_scalar(src + i, dst + 2 * i, n - i);
}
#endif
void quant_f16(const float* src, uint8_t* dst, int64_t n) {
#ifdef TESSERA_HAVE_F16C_PATH
  // F16C from CPUID leaf 1: clang 14 (the fuzz builds) does not know __builtin_cpu_supports("f16c").
  static const bool has_f16c = [] {
    unsigned a, b, c, d;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  }();
  if (has_f16c) return quant_f16_f16c(src, dst, n);
#endif
  quant_f16_scalar(src, dst, n);
}
void quant_bf16(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, f32_to_bf16(src[i]));
}

// ---------------------------------------------------------------------------------------------
// Q8_0: 34 bytes, 32 elements.
//
//   0      2                                          34
//   +------+------------------------------------------+
//   | d    | qs[0] qs[1] ... qs[31]   (int8 each)      |
//   +------+------------------------------------------+
//   x[i] = qs[i] * d
void dequant_q8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    const float d = fp16_to_f32(load_u16(src));
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int i = 0; i < 32; ++i) dst[i] = float(qs[i]) * d;
  }
}

// roundf (halves away from zero) for |v| < 2^31 without a libm call: v - trunc(v) is exact.
int round_half_away(float v) {
  int i = int(v);
  const float frac = v - float(i);
  if (frac >= 0.5f) ++i;
  else if (frac <= -0.5f) --i;
  return i;
}

// Reference: d = amax/127, q = roundf(x / d) (halves away from zero), stored after fp16(d).
void quant_q8_0(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 34) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float d = amax / 127.f;
    const float inv = d != 0 ? 1.f / d : 0.f;
    store_u16(dst, f32_to_fp16(d));
    for (int i = 0; i < 32; ++i) dst[2 + i] = uint8_t(int8_t(round_half_away(src[i] * inv)));
  }
}

// ---------------------------------------------------------------------------------------------
// Q4_0: 18 bytes, 32 elements. Low nibbles are elements 0..15, high nibbles 16..31.
//
//   0      2                                   18
//   +------+-----------------------------------+
//   | d    | qs[0] .. qs[15]                   |
//   +------+-----------------------------------+
//   qs[j] = [ 7..4: q(j+16) | 3..0: q(j) ]
//   x[j] = (q(j) - 8) * d
void dequant_q4_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 18, dst += 32) {
    const float d = fp16_to_f32(load_u16(src));
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = float(int(qs[j] & 0x0F) - 8) * d;
      dst[j + 16] = float(int(qs[j] >> 4) - 8) * d;
    }
  }
}

// The signed value of largest magnitude (first one wins ties), as ggml's Q4_0/Q5_0 reference.
float signed_absmax(const float* x) {
  float amax = 0, max = 0;
  for (int i = 0; i < 32; ++i)
    if (amax < std::fabs(x[i])) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  return max;
}

// Reference: d = max / -8, q = min(15, trunc(x/d + 8.5)).
void quant_q4_0(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 18) {
    const float d = signed_absmax(src) / -8.f;
    const float inv = d != 0 ? 1.f / d : 0.f;
    store_u16(dst, f32_to_fp16(d));
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, int(int8_t(src[j] * inv + 8.5f)));
      const int hi = std::min(15, int(int8_t(src[j + 16] * inv + 8.5f)));
      dst[2 + j] = uint8_t(lo | (hi << 4));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Q4_1: 20 bytes, 32 elements; unsigned nibbles plus a block minimum m.
//
//   0      2      4                              20
//   +------+------+------------------------------+
//   | d    | m    | qs[0] .. qs[15]              |
//   +------+------+------------------------------+
//   qs[j] = [ 7..4: q(j+16) | 3..0: q(j) ]
//   x[j] = q(j) * d + m
void dequant_q4_1(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 20, dst += 32) {
    const float d = fp16_to_f32(load_u16(src));
    const float m = fp16_to_f32(load_u16(src + 2));
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = float(qs[j] & 0x0F) * d + m;
      dst[j + 16] = float(qs[j] >> 4) * d + m;
    }
  }
}

void block_min_max(const float* x, float& lo, float& hi) {
  lo = FLT_MAX;
  hi = -FLT_MAX;
  for (int i = 0; i < 32; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
}

// Reference: d = (max - min)/15, q = min(15, trunc((x - min)/d + 0.5)).
void quant_q4_1(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 20) {
    float lo, hi;
    block_min_max(src, lo, hi);
    const float d = (hi - lo) / 15.f;
    const float inv = d != 0 ? 1.f / d : 0.f;
    store_u16(dst, f32_to_fp16(d));
    store_u16(dst + 2, f32_to_fp16(lo));
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, int(int8_t((src[j] - lo) * inv + 0.5f)));
      const int q1 = std::min(15, int(int8_t((src[j + 16] - lo) * inv + 0.5f)));
      dst[4 + j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Q5_0: 22 bytes, 32 elements; 4 low bits in nibbles, the 5th bit of element i is bit i of qh.
//
//   0      2                6                              22
//   +------+----------------+------------------------------+
//   | d    | qh (u32, LE)   | qs[0] .. qs[15]              |
//   +------+----------------+------------------------------+
//   qh    = [ 31..16: bit 4 of q(16..31) | 15..0: bit 4 of q(0..15) ]
//   qs[j] = [ 7..4: low 4 bits of q(j+16) | 3..0: low 4 bits of q(j) ]
//   x[j] = (q(j) - 16) * d
void dequant_q5_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 22, dst += 32) {
    const float d = fp16_to_f32(load_u16(src));
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0F) | int(((qh >> j) & 1) << 4);
      const int hi = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
      dst[j] = float(lo - 16) * d;
      dst[j + 16] = float(hi - 16) * d;
    }
  }
}

// Packs 32 five-bit values into qh (5th bits) and qs (low nibbles).
void pack_5bit(const int* q, uint8_t* qh_out, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = uint8_t((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    qh |= uint32_t((q[j] >> 4) & 1) << j;
    qh |= uint32_t((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh_out, &qh, 4);
}

// Reference: d = max / -16, q = min(31, trunc(x/d + 16.5)).
void quant_q5_0(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 22) {
    const float d = signed_absmax(src) / -16.f;
    const float inv = d != 0 ? 1.f / d : 0.f;
    store_u16(dst, f32_to_fp16(d));
    int q[32];
    for (int i = 0; i < 32; ++i) q[i] = std::min(31, int(int8_t(src[i] * inv + 16.5f)));
    pack_5bit(q, dst + 2, dst + 6);
  }
}

// ---------------------------------------------------------------------------------------------
// Q5_1: 24 bytes, 32 elements; Q5_0's bit layout, unsigned, plus a block minimum m.
//
//   0      2      4                8                              24
//   +------+------+----------------+------------------------------+
//   | d    | m    | qh (u32, LE)   | qs[0] .. qs[15]              |
//   +------+------+----------------+------------------------------+
//   x[j] = q(j) * d + m          (q(j) assembled exactly as in Q5_0)
void dequant_q5_1(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 24, dst += 32) {
    const float d = fp16_to_f32(load_u16(src));
    const float m = fp16_to_f32(load_u16(src + 2));
    uint32_t qh;
    std::memcpy(&qh, src + 4, 4);
    const uint8_t* qs = src + 8;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0F) | int(((qh >> j) & 1) << 4);
      const int hi = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
      dst[j] = float(lo) * d + m;
      dst[j + 16] = float(hi) * d + m;
    }
  }
}

// Reference: d = (max - min)/31, q = trunc((x - min)/d + 0.5) (no clamp, as in ggml).
void quant_q5_1(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 32, dst += 24) {
    float lo, hi;
    block_min_max(src, lo, hi);
    const float d = (hi - lo) / 31.f;
    const float inv = d != 0 ? 1.f / d : 0.f;
    store_u16(dst, f32_to_fp16(d));
    store_u16(dst + 2, f32_to_fp16(lo));
    int q[32];
    for (int i = 0; i < 32; ++i) q[i] = int(uint8_t((src[i] - lo) * inv + 0.5f));
    pack_5bit(q, dst + 4, dst + 8);
  }
}

}  // namespace

const TypeInfo* type_info(uint32_t type_id) {
  return type_id < kMaxTypeId ? type_index().by_id[type_id] : nullptr;
}

const TypeInfo& type_info(GgmlType t) {
  if (const TypeInfo* ti = type_info(uint32_t(t))) return *ti;
  bad_input("unknown ggml type id ", uint32_t(t));
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const TypeInfo& t : kTypes) {
    const std::string_view tn = t.name;
    if (tn.size() != name.size()) continue;
    bool same = true;
    for (size_t k = 0; k < tn.size() && same; ++k)
      same = std::tolower(static_cast<unsigned char>(tn[k])) == std::tolower(static_cast<unsigned char>(name[k]));
    if (same) return t.type;
  }
  return std::nullopt;
}

void dequantize_row(GgmlType t, const void* src_v, float* dst, int64_t n) {
  const TypeInfo& ti = type_info(t);
  if (n % ti.block_elems != 0)
    usage_error("dequantize_row(", ti.name, "): ", n, " elements is not a multiple of the block size ", ti.block_elems);
  const uint8_t* src = static_cast<const uint8_t*>(src_v);
  switch (t) {
    case G::F32: if (n > 0) std::memcpy(dst, src, size_t(n) * 4); return;
    case G::F16: dequant_f16(src, dst, n); return;
    case G::BF16: dequant_bf16(src, dst, n); return;
    case G::Q8_0: dequant_q8_0(src, dst, n); return;
    case G::Q4_0: dequant_q4_0(src, dst, n); return;
    case G::Q4_1: dequant_q4_1(src, dst, n); return;
    case G::Q5_0: dequant_q5_0(src, dst, n); return;
    case G::Q5_1: dequant_q5_1(src, dst, n); return;
    case G::Q4_K: quant_detail::dequantize_q4_k(src, dst, n); return;
    case G::Q5_K: quant_detail::dequantize_q5_k(src, dst, n); return;
    case G::Q6_K: quant_detail::dequantize_q6_k(src, dst, n); return;
    default: break;
  }
  bad_input("tensors of type ", ti.name, " cannot be read by tessera (readable: f32, f16, bf16, q8_0, q4_0, q4_1, "
            "q5_0, q5_1, q4_K, q5_K, q6_K)");
}

void quantize_row(GgmlType t, const float* src, void* dst_v, int64_t n) {
  const TypeInfo& ti = type_info(t);
  if (n % ti.block_elems != 0)
    usage_error("quantize_row(", ti.name, "): ", n, " elements is not a multiple of the block size ", ti.block_elems);
  uint8_t* dst = static_cast<uint8_t*>(dst_v);
  switch (t) {
    case G::F32: if (n > 0) std::memcpy(dst, src, size_t(n) * 4); return;
    case G::F16: quant_f16(src, dst, n); return;
    case G::BF16: quant_bf16(src, dst, n); return;
    case G::Q8_0: quant_q8_0(src, dst, n); return;
    case G::Q4_0: quant_q4_0(src, dst, n); return;
    case G::Q4_1: quant_q4_1(src, dst, n); return;
    case G::Q5_0: quant_q5_0(src, dst, n); return;
    case G::Q5_1: quant_q5_1(src, dst, n); return;
    case G::Q4_K: quant_detail::quantize_q4_k(src, dst, n); return;
    case G::Q5_K: quant_detail::quantize_q5_k(src, dst, n); return;
    case G::Q6_K: quant_detail::quantize_q6_k(src, dst, n); return;
    default: break;
  }
  usage_error("tessera cannot quantize to type ", ti.name, " (quantizable: f32, f16, bf16, q8_0, q4_0, q4_1, "
              "q5_0, q5_1, q4_K, q5_K, q6_K)");
}

}  // namespace tessera
