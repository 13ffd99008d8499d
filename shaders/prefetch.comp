#version 450
// L2 prefetch: reads up to four byte spans of weights so that a kernel of a *later* stage finds
// them in the L2 cache instead of DRAM. Recorded beside a latency-bound kernel (attention, q_a):
// it uses the memory bandwidth that stage leaves idle and ends with it, so it costs no barrier.
// Arguments: PrefetchArgs (kernel_args.h). Wrapper: PrefetchOp (runtime/vulkan/kernels_basic.h).
//
// Each invocation reads UNROLL words, one per 32-byte sector (the unit the L2 fetches from DRAM):
// workgroup g of span i reads sectors [g' * WG_SIZE * UNROLL, +WG_SIZE * UNROLL), g' = g minus the
// span's first workgroup, invocation t of step k the sector g' * WG_SIZE * UNROLL + k * WG_SIZE + t
// (a subgroup's loads of one step touch consecutive sectors). The words are XOR-folded: per
// subgroup (or per invocation without subgroup arithmetic) one atomicXor into sink[0].
//
//   span bytes:  | sector 0 (32 B)        | sector 1               | ...
//   word read:   | w0 . . . . . . .       | w8 . . . . . . .       |      (w = 32-bit word)
//
// Defines: WG_SIZE, UNROLL. Bindings: 0..3 = spans (uint words), 4 = sink (uint, read-write).

#include "common.glsl"

layout(local_size_x = WG_SIZE) in;

layout(std430, binding = 0) readonly restrict buffer Span0 { uint span0[]; };
layout(std430, binding = 1) readonly restrict buffer Span1 { uint span1[]; };
layout(std430, binding = 2) readonly restrict buffer Span2 { uint span2[]; };
layout(std430, binding = 3) readonly restrict buffer Span3 { uint span3[]; };
layout(std430, binding = 4) restrict buffer SinkBuf { uint sink[]; };

layout(push_constant) uniform Push { PrefetchArgs args; };

const uint kSectorWords = TS_PREFETCH_SECTOR_BYTES / 4u;

void main() {
  const uint g = linear_workgroup_id();
  if (g >= args.n_groups) return;
  // The span of this workgroup (uniform across it) and its sector count.
  uint span = 0u, first = 0u, sectors = args.sectors0;
  if (g >= args.first3) { span = 3u; first = args.first3; sectors = args.sectors3; }
  else if (g >= args.first2) { span = 2u; first = args.first2; sectors = args.sectors2; }
  else if (g >= args.first1) { span = 1u; first = args.first1; sectors = args.sectors1; }
  const uint base = (g - first) * (WG_SIZE * UNROLL) + gl_LocalInvocationIndex;

  uint words[UNROLL];
  [[unroll]] for (uint k = 0; k < UNROLL; ++k) {
    const uint s = min(base + k * WG_SIZE, sectors - 1u);  // clamped: every load is in range
    const uint i = s * kSectorWords;
    words[k] = span == 0u ? span0[i] : span == 1u ? span1[i] : span == 2u ? span2[i] : span3[i];
  }
  uint folded = 0u;
  [[unroll]] for (uint k = 0; k < UNROLL; ++k)
    if (base + k * WG_SIZE < sectors) folded ^= words[k];
#if USE_SUBGROUP
  folded = subgroupXor(folded);
  if (subgroupElect() && folded != 0u) atomicXor(sink[0], folded);
#else
  if (folded != 0u) atomicXor(sink[0], folded);
#endif
}
