// Int8 activations and integer dot products (the Q8ACT path of matvec, moe_gateup, moe_down).
//
// Dequantizing every weight to f32 costs ~5 instructions per weight, which caps a float matvec
// at ~2.5 T weights/s on an H200 (1.4 TB/s of Q4_0). Here the kernel's input vector is
// quantized once per workgroup, in blocks of 32, into shared memory:
//
//   block b (elements 32b .. 32b+31):  q8_lo[b] = int8 q of elements  0..15  (4 words, 4 per word)
//                                      q8_hi[b] = int8 q of elements 16..31
//                                      q8_ds[b] = (d, d * sum(q[0..15]), d * sum(q[16..31]), 0)
//   with d = max|x| / 127, q = roundEven(x * (127 / max|x|)): x ~= d * q.
//
// and a weight block's dot product with it is a handful of packed 4 x int8 dot products
// (OpSDot, SPV_KHR_integer_dot_product; one instruction on GPUs that report it accelerated):
//
//   Q4_0 (qs byte i = element i in the low nibble, element i+16 in the high nibble, value - 8):
//        dot = d_w * (d * sum_i nib_i q_i - 8 * (s_lo + s_hi))
//        word j of qs:  low nibbles . q8_lo[b].j   +   high nibbles . q8_hi[b].j
//   Q8_0 (32 signed bytes in order): dot = d_w * d * (qs[0..15] . q8_lo + qs[16..31] . q8_hi)
//   Q4_K (per 32-element sub-block j: 6-bit scale and min): dot = d sc_j d (q . qx) - dmin min_j sum(x)
//   Q6_K (per 32-element unit: two 16-element sub-blocks with int8 scales sc_a, sc_b; 6-bit q,
//        value d_w sc (q - 32); q as bytes 0..63):
//        dot = d_w * (sc_a * (d * q[0..15] . q8_lo - 32 s_lo) + sc_b * (d * q[16..31] . q8_hi - 32 s_hi))
//
// The rounding of the activations is the only numerical difference from the f32 path (the same
// one llama.cpp's Q8_1 activation path makes): ~0.4 % of |x| per element at most, unbiased.
//
// The including kernel defines Q8_BLOCKS (the most input blocks it stages), includes weights.glsl
// first (WTYPE, w_q, w_m, m_half), and stages its input with q8_stage_block.
#ifndef TESSERA_Q8_ACTIVATIONS_GLSL
#define TESSERA_Q8_ACTIVATIONS_GLSL

#extension GL_EXT_spirv_intrinsics : require

// OpSDot (4450) with PackedVectorFormat4x8Bit (0): sum of the four products of the signed bytes
// of a and b. Capabilities DotProduct (6019), DotProductInput4x8BitPacked (6018).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int ts_sdot4x8(uint a, uint b, spirv_literal int packed_format);
#define SDOT4(a, b) ts_sdot4x8((a), (b), 0)

#if WTYPE == TS_TYPE_Q4_0 || WTYPE == TS_TYPE_Q8_0 || WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q6_K
#define Q8ACT_SUPPORTED 1
#else
#define Q8ACT_SUPPORTED 0
#endif

#include "q8_quantize.glsl"

shared uvec4 q8_lo[Q8_BLOCKS];
shared uvec4 q8_hi[Q8_BLOCKS];
shared vec4 q8_ds[Q8_BLOCKS];

// Quantizes one block of 32 input values into slot i (< Q8_BLOCKS) of the shared copy. Each
// kernel's staging loop reads its own input (its layout, its norm weight) and calls this.
void q8_stage_block(uint i, vec4 v[8]) {
  uvec4 lo, hi;
  vec4 ds;
  q8_quantize32(v, lo, hi, ds);
  q8_lo[i] = lo;
  q8_hi[i] = hi;
  q8_ds[i] = ds;
}

#if Q8ACT_SUPPORTED
// One 32-element weight block in registers: a / b = its elements 0..15 / 16..31 as bytes (Q4_0:
// nibbles 0..15; Q8_0: signed bytes; Q4_K: the sub-block's nibbles; Q6_K: the 6-bit values
// 0..63), and its value is d * byte - m: Q4_0 m = 8 d, Q8_0 m = 0, Q4_K d = d * scale_j,
// m = dmin * min_j; Q6_K: d.x * (byte - 32) for elements 0..15, d.y * (byte - 32) for 16..31.
struct Q8W {
  uvec4 a, b;
#if WTYPE == TS_TYPE_Q6_K
  vec2 d;  // d * scales[2u], d * scales[2u + 1] (the two 16-element sub-blocks)
#else
  float d, m;
#endif
};

// Weight block `entry` (counted from the matrix at qbase / mbase, as in weights.glsl); for Q4_K
// and Q6_K `entry` counts 32-element units: super-block entry / 8, elements 32 (entry % 8) + 0..31.
Q8W q8_load_block(uint qbase, uint mbase, uint entry) {
#if WTYPE == TS_TYPE_Q4_0
  const uvec4 q = w_q[qbase + entry];
  const float d = m_half(mbase, entry);
  return Q8W(q & 0x0F0F0F0Fu, (q >> 4) & 0x0F0F0F0Fu, d, 8.0 * d);
#elif WTYPE == TS_TYPE_Q8_0
  return Q8W(w_q[qbase + 2u * entry], w_q[qbase + 2u * entry + 1u], m_half(mbase, entry), 0.0);
#elif WTYPE == TS_TYPE_Q4_K
  // qs[32c + l] holds element l of sub-block 2c (low nibble) and of 2c + 1 (high).
  const uint sb = entry >> 3, j = entry & 7u, c = j >> 1, shift = (j & 1u) * 4u;
  const uvec4 q0 = w_q[qbase + 8u * sb + 2u * c], q1 = w_q[qbase + 8u * sb + 2u * c + 1u];
  const uint mw = mbase + 4u * sb;  // M entry: d, dmin, scales[12]
  const vec2 dm = unpackHalf2x16(w_m[mw]);
  const vec2 sm = kquant_scale_min(uvec3(w_m[mw + 1u], w_m[mw + 2u], w_m[mw + 3u]), j);
  return Q8W((q0 >> shift) & 0x0F0F0F0Fu, (q1 >> shift) & 0x0F0F0F0Fu, dm.x * sm.x, dm.y * sm.y);
#else  // Q6_K (the order of split1_unit8 in weights.glsl)
  // Unit u = entry % 8 of super-block sb: half n = u / 4, quarter g = u % 4. Element
  // 128n + 32g + l (l < 32) has its low 4 bits in ql[64n + 32(g % 2) + l] (low nibble for g < 2,
  // high for g >= 2) and its high 2 bits in qh[32n + l] at bits 2g, 2g + 1.
  const uint sb = entry >> 3, u = entry & 7u, n = u >> 2, g = u & 3u;
  const uint qv = qbase + 8u * sb + 4u * n + 2u * (g & 1u);
  const uvec4 q0 = w_q[qv], q1 = w_q[qv + 1u];
  const uint nshift = (g >> 1) * 4u, hshift = 2u * g;
  // M entry (82 bytes, 41 u16: 2-byte aligned, mid-word for odd sb): qh[64] at byte 0,
  // scales[16] at 64, d at 80. qh[32n .. 32n + 31]: the 9 words from the one holding its first
  // byte, realigned by 16 bits where it starts mid-word.
  const uint e16 = 41u * sb, i16 = 2u * mbase + e16 + 16u * n;
  const uint w0 = i16 >> 1;
  const bool mid = (i16 & 1u) != 0u;
  uint hw[9];
  [[unroll]] for (uint k = 0; k < 9; ++k) hw[k] = w_m[w0 + k];
  uvec4 a, b;
  [[unroll]] for (uint k = 0; k < 4; ++k) {
    // qh[32n + 4k .. +3] (elements 4k + i) and qh[32n + 16 + 4k .. +3] (elements 16 + 4k + i).
    const uint h_lo = mid ? (hw[k] >> 16u) | (hw[k + 1u] << 16u) : hw[k];
    const uint h_hi = mid ? (hw[k + 4u] >> 16u) | (hw[k + 5u] << 16u) : hw[k + 4u];
    a[k] = ((q0[k] >> nshift) & 0x0F0F0F0Fu) | (((h_lo >> hshift) << 4u) & 0x30303030u);
    b[k] = ((q1[k] >> nshift) & 0x0F0F0F0Fu) | (((h_hi >> hshift) << 4u) & 0x30303030u);
  }
  const int sc = int(m_u16(mbase, e16 + 32u + u));  // scales[2u] (low byte), scales[2u + 1] (high)
  const float d = m_half(mbase, e16 + 40u);
  return Q8W(a, b, d * vec2(float(bitfieldExtract(sc, 0, 8)), float(bitfieldExtract(sc, 8, 8))));
#endif
}

// A weight block held across a wait (the early starts' preloads): Q4_0's 16 bytes of nibbles
// and d as loaded (5 registers), unpacked at use (q8_unpack) instead of Q8W's 10; the other types
// as Q8W. Q8_RAW (a process-wide tuning define, bench --tune q8_raw=0; default 1): 0 holds Q8W.
#ifndef Q8_RAW
#define Q8_RAW 1
#endif
#if WTYPE == TS_TYPE_Q4_0 && Q8_RAW
struct Q8WRaw {
  uvec4 q;
  float d;
};
Q8WRaw q8_load_raw(uint qbase, uint mbase, uint entry) { return Q8WRaw(w_q[qbase + entry], m_half(mbase, entry)); }
Q8W q8_unpack(Q8WRaw r) { return Q8W(r.q & 0x0F0F0F0Fu, (r.q >> 4) & 0x0F0F0F0Fu, r.d, 8.0 * r.d); }
// The loaded words folded into a gate's dependence word (gate.glsl gate_wait).
uint q8_raw_dep(Q8WRaw r) { return r.q.x ^ r.q.w ^ floatBitsToUint(r.d); }
#else
#define Q8WRaw Q8W
Q8W q8_load_raw(uint qbase, uint mbase, uint entry) { return q8_load_block(qbase, mbase, entry); }
Q8W q8_unpack(Q8W w) { return w; }
#if WTYPE == TS_TYPE_Q6_K
uint q8_raw_dep(Q8W w) { return w.a.x ^ w.b.w ^ floatBitsToUint(w.d.x); }
#else
uint q8_raw_dep(Q8W w) { return w.a.x ^ w.b.w ^ floatBitsToUint(w.d); }
#endif
#endif

// A loaded weight block dotted with an input block given as (lo, hi, ds):
//   sum_i (d q_i - m) x_i = d * dx * (q . qx) - m * sum(x);
//   Q6_K: d.x * (dx * (a . qx_lo) - 32 sum(x_lo)) + d.y * (dx * (b . qx_hi) - 32 sum(x_hi)).
// X_HALVES (0/1): every input block has a scale per half (q8_quantize.glsl "Halves": dx_lo = ds.x,
// dx_hi = ds.w): d * (dx_lo * (a . qx_lo) + dx_hi * (b . qx_hi)) - m * sum(x).
#ifndef X_HALVES
#define X_HALVES 0
#endif
float q8_dot_loaded(Q8W w, uvec4 xl, uvec4 xh, vec4 ds) {
#if X_HALVES
  int sa = 0, sb = 0;
  [[unroll]] for (uint j = 0; j < 4; ++j) {
    sa += SDOT4(w.a[j], xl[j]);
    sb += SDOT4(w.b[j], xh[j]);
  }
#if WTYPE == TS_TYPE_Q6_K
  return w.d.x * (ds.x * float(sa) - 32.0 * ds.y) + w.d.y * (ds.w * float(sb) - 32.0 * ds.z);
#else
  return w.d * (ds.x * float(sa) + ds.w * float(sb)) - w.m * (ds.y + ds.z);
#endif
#elif WTYPE == TS_TYPE_Q6_K
  int sa = 0, sb = 0;
  [[unroll]] for (uint j = 0; j < 4; ++j) {
    sa += SDOT4(w.a[j], xl[j]);
    sb += SDOT4(w.b[j], xh[j]);
  }
  return w.d.x * (ds.x * float(sa) - 32.0 * ds.y) + w.d.y * (ds.x * float(sb) - 32.0 * ds.z);
#else
  int s = 0;
  [[unroll]] for (uint j = 0; j < 4; ++j) s += SDOT4(w.a[j], xl[j]) + SDOT4(w.b[j], xh[j]);
  return w.d * ds.x * float(s) - w.m * (ds.y + ds.z);
#endif
}

// Q4_K pairs: sub-blocks 2c and 2c + 1 share their 32 quant bytes (the low and the high
// nibbles) and their super-block's scale words, so one lane taking both loads each once instead
// of twice. Pair p counts pairs (4 a super-block): units 2p and 2p + 1, counted as
// q8_load_block's entry (p relative to a row gives units relative to it: rows are whole
// super-blocks). KQ_PAIRS (a process-wide tuning define, bench --tune kq_pairs=0|1; default 1):
// 0 keeps one unit per lane and step. (Q6_K's units g and g + 2 share their ql bytes the same
// way; taken in pairs by the early down they lost 3 %, PERFORMANCE.md session 30.)
#ifndef KQ_PAIRS
#define KQ_PAIRS 1
#endif
#if WTYPE == TS_TYPE_Q4_K && KQ_PAIRS
#define Q8_PAIRS 1
struct Q8WPair {
  Q8W w0, w1;  // units 2p, 2p + 1
};
// A pair as loaded (13 registers instead of Q8WPair's 20): its 32 quant bytes and its
// super-block's M entry (d and dmin, the 12 scale bytes), unpacked at use.
struct Q8WPairRaw {
  uvec4 q0, q1;
  uvec4 m;  // M entry words: d | dmin, scales[0..3], scales[4..7], scales[8..11]
  uint c;   // the pair within its super-block (sub-blocks 2c, 2c + 1)
};
Q8WPairRaw q8_load_pair_raw(uint qbase, uint mbase, uint p) {
  const uint sb = p >> 2, c = p & 3u;
  const uint mw = mbase + 4u * sb;
  return Q8WPairRaw(w_q[qbase + 8u * sb + 2u * c], w_q[qbase + 8u * sb + 2u * c + 1u],
                    uvec4(w_m[mw], w_m[mw + 1u], w_m[mw + 2u], w_m[mw + 3u]), c);
}
Q8WPair q8_unpack_pair(Q8WPairRaw r) {
  const vec2 dm = unpackHalf2x16(r.m.x);
  const vec2 s0 = kquant_scale_min(r.m.yzw, 2u * r.c), s1 = kquant_scale_min(r.m.yzw, 2u * r.c + 1u);
  return Q8WPair(Q8W(r.q0 & 0x0F0F0F0Fu, r.q1 & 0x0F0F0F0Fu, dm.x * s0.x, dm.y * s0.y),
                 Q8W((r.q0 >> 4) & 0x0F0F0F0Fu, (r.q1 >> 4) & 0x0F0F0F0Fu, dm.x * s1.x, dm.y * s1.y));
}
Q8WPair q8_load_pair(uint qbase, uint mbase, uint p) { return q8_unpack_pair(q8_load_pair_raw(qbase, mbase, p)); }
// Pair w dotted with input blocks b, b + 1 of the shared-memory copy.
float q8_pair_dot(Q8WPair w, uint b) {
  return q8_dot_loaded(w.w0, q8_lo[b], q8_hi[b], q8_ds[b]) + q8_dot_loaded(w.w1, q8_lo[b + 1u], q8_hi[b + 1u], q8_ds[b + 1u]);
}
#else
#define Q8_PAIRS 0
#endif

// Dot product of weight block `entry` with an input block given as (lo, hi, ds).
float q8_block_dot_x(uint qbase, uint mbase, uint entry, uvec4 xl, uvec4 xh, vec4 ds) {
  return q8_dot_loaded(q8_load_block(qbase, mbase, entry), xl, xh, ds);
}

// The same with input block b of the shared-memory copy.
float q8_block_dot(uint qbase, uint mbase, uint entry, uint b) {
  return q8_block_dot_x(qbase, mbase, entry, q8_lo[b], q8_hi[b], q8_ds[b]);
}
#endif

#endif  // TESSERA_Q8_ACTIVATIONS_GLSL
