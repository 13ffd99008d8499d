// RoPE of the NORMAL kind (interleaved pairs, forward.md section 3) with YaRN folded into a per-pair
// frequency table computed on the host (runtime/vulkan/kernels_attention.cpp, rope_defines()).
//
// Defines:
//   N_ROT           rotated dims per head (even)
//   ROPE_TURNS_HI   N_ROT/2 floats: g_k = theta_k(p) / (2*pi*p), the angle of pair k per position in
//                   turns (YaRN blend included), with the low 12 mantissa bits cleared
//   ROPE_TURNS_LO   N_ROT/2 floats: g_k - ROPE_TURNS_HI[k]
//   ROPE_MSCALE     magnitude applied to cos and sin (YaRN attn_factor correction; 1 without YaRN)
//
// The angle is reduced modulo one turn exactly: p = p_hi + p_lo with p_hi a multiple of 4096 and
// p_lo < 4096 (both <= 12 significant bits), so p_hi*g_hi and p_lo*g_hi are exact float products
// whose fractional parts are exact; p*g_lo is tiny. cos/sin then see an argument in [-pi, pi),
// where GPU sin/cos are accurate, for any position < 2^24.
#ifndef TESSERA_ROPE_GLSL
#define TESSERA_ROPE_GLSL

const float kRopeTurnsHi[N_ROT / 2] = float[](ROPE_TURNS_HI);
const float kRopeTurnsLo[N_ROT / 2] = float[](ROPE_TURNS_LO);

// (cos, sin) * ROPE_MSCALE of the angle of pair k at position pos.
vec2 rope_cos_sin(uint pos, uint k) {
  const float p_hi = float(pos & ~0xFFFu), p_lo = float(pos & 0xFFFu);
  const float g_hi = kRopeTurnsHi[k];
  float turns = fract(p_hi * g_hi) + fract(p_lo * g_hi) + float(pos) * kRopeTurnsLo[k];
  turns = fract(turns);
  if (turns >= 0.5) turns -= 1.0;
  const float angle = turns * 6.28318530717958647;
  return vec2(cos(angle), sin(angle)) * float(ROPE_MSCALE);
}

// Rotates the pair (a, b) = (v[2k], v[2k+1]) by the (cos, sin) of rope_cos_sin.
vec2 rope_rotate(vec2 ab, vec2 cs) {
  return vec2(ab.x * cs.x - ab.y * cs.y, ab.x * cs.y + ab.y * cs.x);
}

#endif  // TESSERA_ROPE_GLSL
