// Reading weight matrices: SPLIT1 block types and plain F32/F16/BF16 rows
// (layout: docs/FORMAT.md; block math: ../shared/spec/gguf.md section 7).
//
// The including kernel defines, before #include "weights.glsl":
//   WTYPE        ggml type id (TS_TYPE_* in kernel_args.h)
//   W_Q_BINDING  binding of the quant region Q (plain types: the matrix itself)
//   W_M_BINDING  binding of the rest region M (plain types: unused, bind anything)
// Both regions may be one buffer bound twice (a MoE tile): pass the regions' start positions as
// qbase (in 16-byte units from the Q binding start) and mbase (in 32-bit words from the M
// binding start).
//
// SPLIT1 decoding, two granularities (entry = row * blocks_per_row + block, counted from the
// matrix start; off_lo / off_hi are element offsets inside the block):
//  - split1_unit8: unit j < W_UNITS8 of a block = one 32-bit word of quant bytes (two for Q8_0)
//    -> 8 values: lo[i] = element off_lo + i, hi[i] = element off_hi + i (i < 4). Consecutive
//    lanes taking consecutive units read consecutive weight words AND consecutive x elements
//    (coalesced on both sides): the fast path, used by matvec.
//  - split1_unit: unit j < W_UNITS = 16 bytes of quant bytes -> 32 values: lo[i] = element
//    off_lo + i, hi[i] = element off_hi + i (i < 16). 16-byte weight loads, but lanes then read x
//    128 bytes apart.
#ifndef TESSERA_WEIGHTS_GLSL
#define TESSERA_WEIGHTS_GLSL

#include "kernel_args.h"

#if WTYPE == TS_TYPE_F32 || WTYPE == TS_TYPE_F16 || WTYPE == TS_TYPE_BF16
#define W_PLAIN 1
#else
#define W_PLAIN 0
#endif

#if WTYPE == TS_TYPE_Q4_0 || WTYPE == TS_TYPE_Q4_1 || WTYPE == TS_TYPE_Q5_0 || WTYPE == TS_TYPE_Q5_1
#define W_BLOCK 32  // elements per block
#define W_UNITS 1   // 32-value units per block
#define W_QVEC 1    // 16-byte vectors of quant bytes per block
#elif WTYPE == TS_TYPE_Q8_0
#define W_BLOCK 32
#define W_UNITS 1
#define W_QVEC 2
#elif WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q5_K || WTYPE == TS_TYPE_Q6_K
#define W_BLOCK 256
#define W_UNITS 8
#define W_QVEC 8
#elif !W_PLAIN
#error "weights.glsl: unsupported WTYPE"
#endif
#if !W_PLAIN
#define W_UNITS8 (W_BLOCK / 8)  // 8-value units per block (split1_unit8)
#endif

layout(std430, binding = W_Q_BINDING) readonly restrict buffer WeightQ { uvec4 w_q[]; };
layout(std430, binding = W_Q_BINDING) readonly restrict buffer WeightWords { uint w_words[]; };
layout(std430, binding = W_M_BINDING) readonly restrict buffer WeightM { uint w_m[]; };

// Byte i (0..15) of a 16-byte vector.
uint byte_of(uvec4 v, uint i) { return (v[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }

// 16-bit value number `idx` of region M (little-endian u16 array view).
uint m_u16(uint mbase, uint idx) { return (w_m[mbase + (idx >> 1)] >> ((idx & 1u) * 16u)) & 0xFFFFu; }
float m_half(uint mbase, uint idx) { return unpackHalf2x16(m_u16(mbase, idx)).x; }
// Byte `idx` of region M.
uint m_u8(uint mbase, uint idx) { return (w_m[mbase + (idx >> 2)] >> ((idx & 3u) * 8u)) & 0xFFu; }

#if WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q5_K
// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes s[0..11] (gguf.md section 7.7),
// given as three little-endian words.
vec2 kquant_scale_min(uvec3 s, uint j) {
#define SB(k) ((s[(k) >> 2] >> (((k) & 3u) * 8u)) & 0xFFu)
  uint sc, mn;
  if (j < 4) {
    sc = SB(j) & 63u;
    mn = SB(j + 4) & 63u;
  } else {
    sc = (SB(j + 4) & 0xFu) | ((SB(j - 4) >> 6) << 4);
    mn = (SB(j + 4) >> 4) | ((SB(j) >> 6) << 4);
  }
#undef SB
  return vec2(float(sc), float(mn));
}
#endif

#if !W_PLAIN
// float(q) - offset for 0 <= q < 2^22 without an int -> float conversion instruction (a
// quarter-rate instruction on NVIDIA GPUs, the bottleneck of dequantization): the bits
// 0x4B000000 | q are the float 2^23 + q, exactly.
#define U2F_MINUS(q, offset) (uintBitsToFloat((q) | 0x4B000000u) - (8388608.0 + (offset)))

// split1_unit in two halves, for kernels that load a later step's units before they use the
// current ones (moe_matmul.comp): split1_raw loads the words unit j of `entry` reads and does no
// arithmetic on them; split1_decode turns them into the values. Region M words per type (m[]):
//   Q4_0 / Q8_0: the word holding d (u16 `entry`); Q4_1: d|m; Q5_0: the two words from u16 3 entry
//   (d, qh lo, qh hi); Q5_1: d|m, qh; Q4_K: d|dmin, scales[12]; Q5_K: those + unit j's qh[16]
//   quarter (4 words); Q6_K: the 5 words from the unit's first qh u16, the words of its two
//   scales' u16, the word of d.
#if WTYPE == TS_TYPE_Q4_K
#define W_RAW_M 4
#elif WTYPE == TS_TYPE_Q5_K || WTYPE == TS_TYPE_Q6_K
#define W_RAW_M 8
#elif WTYPE == TS_TYPE_Q5_0 || WTYPE == TS_TYPE_Q5_1
#define W_RAW_M 2
#else
#define W_RAW_M 1
#endif
struct W1Raw {
  uvec4 q;  // the unit's 16 quant bytes (Q8_0: the block's first 16)
#if WTYPE == TS_TYPE_Q8_0
  uvec4 q2;  // Q8_0: the block's last 16
#endif
  uint m[W_RAW_M];
};

// The u16 that starts at bit 16 * (par + k) of the consecutive words a, b (par, k: 0 or 1).
uint raw_u16(uint a, uint b, uint par, uint k) { return ((((par + k) >> 1) == 0u ? a : b) >> (((par + k) & 1u) * 16u)) & 0xFFFFu; }

W1Raw split1_raw(uint qbase, uint mbase, uint entry, uint j) {
  W1Raw r;
#if WTYPE == TS_TYPE_Q8_0
  r.q = w_q[qbase + 2u * entry];
  r.q2 = w_q[qbase + 2u * entry + 1u];
  r.m[0] = w_m[mbase + (entry >> 1)];
#elif W_UNITS == 1
  r.q = w_q[qbase + entry];
#if WTYPE == TS_TYPE_Q4_0
  r.m[0] = w_m[mbase + (entry >> 1)];
#elif WTYPE == TS_TYPE_Q4_1
  r.m[0] = w_m[mbase + entry];
#elif WTYPE == TS_TYPE_Q5_0
  r.m[0] = w_m[mbase + (3u * entry >> 1)];
  r.m[1] = w_m[mbase + (3u * entry >> 1) + 1u];
#else
  r.m[0] = w_m[mbase + 2u * entry];
  r.m[1] = w_m[mbase + 2u * entry + 1u];
#endif
#elif WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q5_K
  r.q = w_q[qbase + 8u * entry + j];
#if WTYPE == TS_TYPE_Q4_K
  const uint mw = mbase + 4u * entry;  // M entry: d, dmin, scales[12] (4 words)
#else
  const uint mw = mbase + 12u * entry;  // M entry: d, dmin, scales[12], qh[32] (12 words)
  [[unroll]] for (uint i = 0; i < 4; ++i) r.m[4 + i] = w_m[mw + 4u + 4u * (j & 1u) + i];
#endif
  [[unroll]] for (uint i = 0; i < 4; ++i) r.m[i] = w_m[mw + i];
#else  // Q6_K: M entry (82 bytes, 41 u16): qh[64] at byte 0, scales[16] (int8) at byte 64, d (f16) at byte 80
  const uint n = j >> 2, jj = j & 3u, e16 = 41u * entry;
  r.q = w_q[qbase + 8u * entry + j];
  const uint h0 = e16 + 16u * n + 8u * (jj & 1u);  // the unit's first qh u16
  [[unroll]] for (uint i = 0; i < 5; ++i) r.m[i] = w_m[mbase + (h0 >> 1) + i];
  r.m[5] = w_m[mbase + ((e16 + 32u + 4u * n + (jj >> 1)) >> 1)];
  r.m[6] = w_m[mbase + ((e16 + 34u + 4u * n + (jj >> 1)) >> 1)];
  r.m[7] = w_m[mbase + ((e16 + 40u) >> 1)];
#endif
  return r;
}

void split1_decode(W1Raw r, uint entry, uint j, out float lo[16], out float hi[16], out uint off_lo, out uint off_hi) {
#if WTYPE == TS_TYPE_Q4_0 || WTYPE == TS_TYPE_Q4_1 || WTYPE == TS_TYPE_Q5_0 || WTYPE == TS_TYPE_Q5_1
  const uvec4 q = r.q;
#if WTYPE == TS_TYPE_Q4_0
  const float d = unpackHalf2x16(r.m[0] >> ((entry & 1u) * 16u)).x, m = 0.0, offset = 8.0;
  const uint qh = 0u;
#elif WTYPE == TS_TYPE_Q4_1
  const vec2 dm = unpackHalf2x16(r.m[0]);
  const float d = dm.x, m = dm.y, offset = 0.0;
  const uint qh = 0u;
#elif WTYPE == TS_TYPE_Q5_0
  const uint par = (3u * entry) & 1u;
  const float d = unpackHalf2x16(raw_u16(r.m[0], r.m[1], par, 0u)).x, m = 0.0, offset = 16.0;
  const uint qh = raw_u16(r.m[0], r.m[1], par, 1u) | (raw_u16(r.m[0], r.m[1], par + 1u, 1u) << 16);
#else
  const vec2 dm = unpackHalf2x16(r.m[0]);
  const float d = dm.x, m = dm.y, offset = 0.0;
  const uint qh = r.m[1];
#endif
  [[unroll]] for (uint i = 0; i < 16; ++i) {
    const uint b = byte_of(q, i);
    lo[i] = U2F_MINUS((b & 15u) | (((qh >> i) & 1u) << 4), offset) * d + m;
    hi[i] = U2F_MINUS((b >> 4) | (((qh >> (i + 16u)) & 1u) << 4), offset) * d + m;
  }
  off_lo = 0;
  off_hi = 16;
#elif WTYPE == TS_TYPE_Q8_0
  // Signed bytes: b ^ 0x80 = b + 128 as an unsigned byte.
  const float d = unpackHalf2x16(r.m[0] >> ((entry & 1u) * 16u)).x;
  [[unroll]] for (uint i = 0; i < 16; ++i) {
    lo[i] = U2F_MINUS(byte_of(r.q, i) ^ 0x80u, 128.0) * d;
    hi[i] = U2F_MINUS(byte_of(r.q2, i) ^ 0x80u, 128.0) * d;
  }
  off_lo = 0;
  off_hi = 16;
#elif WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q5_K
  // Unit j: chunk c = j/2 of 64 elements, half h = j%2: qs[32c + 16h + i] holds element
  // 64c + 16h + i (low nibble, sub-block 2c) and 64c + 32 + 16h + i (high nibble, sub-block 2c+1).
  const uint c = j >> 1, h = j & 1u;
#if WTYPE == TS_TYPE_Q5_K
  const uvec4 qh = uvec4(r.m[4], r.m[5], r.m[6], r.m[7]);
#endif
  const vec2 dm = unpackHalf2x16(r.m[0]);
  const uvec3 sc = uvec3(r.m[1], r.m[2], r.m[3]);
  const vec2 sm_lo = kquant_scale_min(sc, 2u * c), sm_hi = kquant_scale_min(sc, 2u * c + 1u);
  const float d_lo = dm.x * sm_lo.x, m_lo = dm.y * sm_lo.y;
  const float d_hi = dm.x * sm_hi.x, m_hi = dm.y * sm_hi.y;
  [[unroll]] for (uint i = 0; i < 16; ++i) {
    const uint b = byte_of(r.q, i);
    uint vl = b & 15u, vh = b >> 4;
#if WTYPE == TS_TYPE_Q5_K
    const uint hb = byte_of(qh, i);
    vl |= ((hb >> (2u * c)) & 1u) << 4;
    vh |= ((hb >> (2u * c + 1u)) & 1u) << 4;
#endif
    lo[i] = d_lo * U2F_MINUS(vl, 0.0) - m_lo;
    hi[i] = d_hi * U2F_MINUS(vh, 0.0) - m_hi;
  }
  off_lo = 64u * c + 16u * h;
  off_hi = off_lo + 32u;
#elif WTYPE == TS_TYPE_Q6_K
  // Unit j: half n = j/4 (128 elements), jj = j%4: ql[64n + 16jj + i] holds element
  // 128n + 16jj + i (low nibble) and 128n + 64 + 16jj + i (high nibble); their 2 high bits are in
  // qh[32n + 16(jj%2) + i] at bit 0/4 (jj < 2) or bit 2/6 (jj >= 2).
  const uint n = j >> 2, jj = j & 3u, par = entry & 1u;  // par: the parity of u16 41 entry
  const uint shift = jj >= 2u ? 2u : 0u;
  off_lo = 128u * n + 16u * jj;
  off_hi = off_lo + 64u;
  const float d = unpackHalf2x16(r.m[7] >> (par * 16u)).x;
  const uint spar = (par + (jj >> 1)) & 1u;  // the parity of the scales' u16 (41 entry + 32 + 4n + jj / 2)
  const uint sb_lo = raw_u16(r.m[5], 0u, spar, 0u) >> (((off_lo >> 4) & 1u) * 8u);
  const uint sb_hi = raw_u16(r.m[6], 0u, spar, 0u) >> (((off_hi >> 4) & 1u) * 8u);
  const float d_lo = d * float(bitfieldExtract(int(sb_lo), 0, 8));
  const float d_hi = d * float(bitfieldExtract(int(sb_hi), 0, 8));
  [[unroll]] for (uint i = 0; i < 16; i += 2) {
    const uint k = i >> 1;  // qh bytes i, i+1 of this unit: u16 k from the unit's first
    const uint hpair = raw_u16(r.m[k >> 1], r.m[(k >> 1) + 1u], par, k & 1u);
    [[unroll]] for (uint b2 = 0; b2 < 2; ++b2) {
      const uint b = byte_of(r.q, i + b2);
      const uint hb = (hpair >> (8u * b2)) & 0xFFu;
      lo[i + b2] = d_lo * U2F_MINUS((b & 15u) | (((hb >> shift) & 3u) << 4), 32.0);
      hi[i + b2] = d_hi * U2F_MINUS((b >> 4) | (((hb >> (shift + 4u)) & 3u) << 4), 32.0);
    }
  }
#endif
}

// Unit j of `entry`: 32 values, lo[i] = element off_lo + i, hi[i] = element off_hi + i.
void split1_unit(uint qbase, uint mbase, uint entry, uint j, out float lo[16], out float hi[16], out uint off_lo,
                 out uint off_hi) {
  split1_decode(split1_raw(qbase, mbase, entry, j), entry, j, lo, hi, off_lo, off_hi);
}

// The 4 bytes of a word as uvec4 (byte i in component i).
uvec4 word_bytes(uint w) { return (uvec4(w) >> uvec4(0u, 8u, 16u, 24u)) & 0xFFu; }

void split1_unit8(uint qbase, uint mbase, uint entry, uint j, out vec4 lo, out vec4 hi, out uint off_lo,
                  out uint off_hi) {
  const uint qw = 4u * qbase;  // word index of region Q's start
#if WTYPE == TS_TYPE_Q4_0 || WTYPE == TS_TYPE_Q4_1 || WTYPE == TS_TYPE_Q5_0 || WTYPE == TS_TYPE_Q5_1
  // Word j = qs[4j .. 4j+3]: elements 4j + i (low nibbles) and 16 + 4j + i (high nibbles).
  const uint w = w_words[qw + 4u * entry + j];
  uvec4 ql = word_bytes(w & 0x0F0F0F0Fu), qh4 = word_bytes((w >> 4) & 0x0F0F0F0Fu);
#if WTYPE == TS_TYPE_Q5_0 || WTYPE == TS_TYPE_Q5_1
#if WTYPE == TS_TYPE_Q5_0
  const uint qh = m_u16(mbase, 3u * entry + 1u) | (m_u16(mbase, 3u * entry + 2u) << 16);
#else
  const uint qh = w_m[mbase + 2u * entry + 1u];
#endif
  ql |= ((uvec4(qh >> (4u * j)) >> uvec4(0u, 1u, 2u, 3u)) & 1u) << 4;
  qh4 |= ((uvec4(qh >> (16u + 4u * j)) >> uvec4(0u, 1u, 2u, 3u)) & 1u) << 4;
#endif
#if WTYPE == TS_TYPE_Q4_0
  const float d = m_half(mbase, entry);
  lo = U2F_MINUS(ql, 8.0) * d;
  hi = U2F_MINUS(qh4, 8.0) * d;
#elif WTYPE == TS_TYPE_Q5_0
  const float d = m_half(mbase, 3u * entry);
  lo = U2F_MINUS(ql, 16.0) * d;
  hi = U2F_MINUS(qh4, 16.0) * d;
#else
#if WTYPE == TS_TYPE_Q4_1
  const vec2 dm = unpackHalf2x16(w_m[mbase + entry]);
#else
  const vec2 dm = unpackHalf2x16(w_m[mbase + 2u * entry]);
#endif
  lo = U2F_MINUS(ql, 0.0) * dm.x + dm.y;
  hi = U2F_MINUS(qh4, 0.0) * dm.x + dm.y;
#endif
  off_lo = 4u * j;
  off_hi = 16u + 4u * j;
#elif WTYPE == TS_TYPE_Q8_0
  // Words j and j + 4 of qs[32]: elements 4j + i and 16 + 4j + i (signed bytes, b ^ 0x80 = b + 128).
  const float d = m_half(mbase, entry);
  lo = U2F_MINUS(word_bytes(w_words[qw + 8u * entry + j] ^ 0x80808080u), 128.0) * d;
  hi = U2F_MINUS(word_bytes(w_words[qw + 8u * entry + 4u + j] ^ 0x80808080u), 128.0) * d;
  off_lo = 4u * j;
  off_hi = 16u + 4u * j;
#elif WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q5_K
  // Word j = qs[4j .. 4j+3]: chunk c = j/8, l = 4(j%8) + i: element 64c + l (sub-block 2c) and
  // 64c + 32 + l (sub-block 2c+1).
  const uint c = j >> 3, t = j & 7u;
  const uint w = w_words[qw + 32u * entry + j];
  uvec4 ql = word_bytes(w & 0x0F0F0F0Fu), qh4 = word_bytes((w >> 4) & 0x0F0F0F0Fu);
#if WTYPE == TS_TYPE_Q4_K
  const uint mw = mbase + 4u * entry;
#else
  const uint mw = mbase + 12u * entry;
  const uvec4 hb = word_bytes(w_m[mw + 4u + t]);  // qh[4t .. 4t+3]
  ql |= ((hb >> (2u * c)) & 1u) << 4;
  qh4 |= ((hb >> (2u * c + 1u)) & 1u) << 4;
#endif
  const vec2 dm = unpackHalf2x16(w_m[mw]);
  const uvec3 sc = uvec3(w_m[mw + 1u], w_m[mw + 2u], w_m[mw + 3u]);
  const vec2 sm_lo = kquant_scale_min(sc, 2u * c), sm_hi = kquant_scale_min(sc, 2u * c + 1u);
  lo = U2F_MINUS(ql, 0.0) * (dm.x * sm_lo.x) - dm.y * sm_lo.y;
  hi = U2F_MINUS(qh4, 0.0) * (dm.x * sm_hi.x) - dm.y * sm_hi.y;
  off_lo = 64u * c + 4u * t;
  off_hi = off_lo + 32u;
#elif WTYPE == TS_TYPE_Q6_K
  // Word j = ql[4j .. 4j+3]: half n = j/16, jj = (j/8)%2, l = 4(j%8) + i: element
  // 128n + 32jj + l (low nibble, qh bits 2jj) and that + 64 (high nibble, qh bits 2jj + 4);
  // qh byte 32n + l.
  const uint n = j >> 4, jj = (j >> 3) & 1u, t = j & 7u;
  const uint w = w_words[qw + 32u * entry + j];
  const uint e16 = 41u * entry;
  const uint h = m_u16(mbase, e16 + 16u * n + 2u * t) | (m_u16(mbase, e16 + 16u * n + 2u * t + 1u) << 16);
  const uint shift = 2u * jj;
  off_lo = 128u * n + 32u * jj + 4u * t;
  off_hi = off_lo + 64u;
  const float d = m_half(mbase, e16 + 40u);
  const uint sb_lo = m_u16(mbase, e16 + 32u + (off_lo >> 5)) >> (((off_lo >> 4) & 1u) * 8u);
  const uint sb_hi = m_u16(mbase, e16 + 32u + (off_hi >> 5)) >> (((off_hi >> 4) & 1u) * 8u);
  const uvec4 ql = word_bytes((w & 0x0F0F0F0Fu) | (((h >> shift) & 0x03030303u) << 4));
  const uvec4 qh4 = word_bytes(((w >> 4) & 0x0F0F0F0Fu) | (((h >> (shift + 4u)) & 0x03030303u) << 4));
  lo = U2F_MINUS(ql, 32.0) * (d * float(bitfieldExtract(int(sb_lo), 0, 8)));
  hi = U2F_MINUS(qh4, 32.0) * (d * float(bitfieldExtract(int(sb_hi), 0, 8)));
#endif
}
#endif  // !W_PLAIN

// A rows x cols matrix at byte `base` of a binding that holds both its regions (W_Q_BINDING ==
// W_M_BINDING: a MoE tile): SPLIT1 region Q in 16-byte units and region M (at the next 256-byte
// boundary) in 32-bit words; plain: its first element's index (mbase 0).
struct WMat {
  uint qbase;
  uint mbase;
};
WMat w_mat_at(uint base, uint rows, uint cols) {
#if W_PLAIN
  return WMat(base / uint(WTYPE == TS_TYPE_F32 ? 4 : 2), 0u);
#else
  const uint m_off = (rows * (cols / W_BLOCK) * (16u * W_QVEC) + 255u) & ~255u;
  return WMat(base >> 4, (base + m_off) >> 2);
#endif
}

#if W_PLAIN
// Element `idx` of a plain matrix (counted from the Q binding start).
float plain_value(uint idx) {
#if WTYPE == TS_TYPE_F32
  return uintBitsToFloat(w_words[idx]);
#elif WTYPE == TS_TYPE_F16
  return unpackHalf2x16(w_words[idx >> 1] >> ((idx & 1u) * 16u)).x;
#else
  return uintBitsToFloat(((w_words[idx >> 1] >> ((idx & 1u) * 16u)) & 0xFFFFu) << 16);
#endif
}

// Elements 8*g .. 8*g+7 of a plain matrix (needs those 8 elements 16-byte aligned in the binding).
void plain_vec8(uint g, out float v[8]) {
#if WTYPE == TS_TYPE_F32
  const uvec4 a = w_q[2u * g], b = w_q[2u * g + 1u];
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    v[i] = uintBitsToFloat(a[i]);
    v[i + 4] = uintBitsToFloat(b[i]);
  }
#elif WTYPE == TS_TYPE_F16
  const uvec4 a = w_q[g];
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    const vec2 p = unpackHalf2x16(a[i]);
    v[2 * i] = p.x;
    v[2 * i + 1] = p.y;
  }
#else
  const uvec4 a = w_q[g];
  [[unroll]] for (uint i = 0; i < 4; ++i) {
    v[2 * i] = uintBitsToFloat(a[i] << 16);
    v[2 * i + 1] = uintBitsToFloat(a[i] & 0xFFFF0000u);
  }
#endif
}
#endif  // W_PLAIN

#endif  // TESSERA_WEIGHTS_GLSL
