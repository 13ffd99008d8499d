#version 450
// Device ceilings for `tessera bench --roofline` (wrapper: runtime/model/bench_roofline.cpp).
//
// MODE 0 (read): every invocation reads UNROLL 16-byte words of `src` (n_vec4 uvec4 in all),
//   coalesced: workgroup g, step k reads src[g*WG_SIZE*UNROLL + k*WG_SIZE + local id]. The words
//   are folded into one value that is written only when it equals a value the host never stores,
//   so no load can be dropped and almost nothing is written: the time is the read of n_vec4*16 B.
// MODE 1 (tiny): one workgroup writes one word: the cost of a dispatch with no work in it.
// Bindings: 0 = src (uvec4[n_vec4]), 1 = dst (uint[]).

#include "common.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 0) readonly restrict buffer SrcBuf { uvec4 src[]; };
layout(std430, binding = 1) restrict buffer DstBuf { uint dst[]; };

layout(push_constant) uniform Push {
  uint n_vec4;   // 16-byte words in src
  uint never;    // a value no fold of the buffer's contents equals (the host picks it)
  uint pad0, pad1;
} args;

void main() {
#if MODE == 0
  const uint base = linear_workgroup_id() * (WG_SIZE * UNROLL) + gl_LocalInvocationIndex;
  uvec4 acc = uvec4(0);
  [[unroll]] for (uint k = 0; k < UNROLL; ++k) {
    const uint i = base + k * WG_SIZE;
    if (i < args.n_vec4) acc ^= src[i];
  }
  const uint folded = acc.x ^ acc.y ^ acc.z ^ acc.w;
  if (folded == args.never) dst[gl_LocalInvocationIndex] = folded;
#else
  if (gl_LocalInvocationIndex == 0) dst[0] = args.never + gl_WorkGroupID.x;
#endif
}
