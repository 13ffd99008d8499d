// Shared by every tessera kernel: extensions, the device defines, workgroup reductions.
// Include first, right after #version.
//
// Defines set by the host for every pipeline (runtime/vulkan/pipeline.cpp, device_defines()):
//   SUBGROUP_SIZE  the device's subgroup size
//   USE_SUBGROUP   1 when subgroup arithmetic works in compute shaders (else shared-memory paths)
//   HAS_FLOAT16, HAS_INT8, HAS_INT_DOT   optional device features (0/1)
// Kernels define WG_SIZE (threads per workgroup, a power of two) before including this file when
// they use workgroup_sum().
#ifndef TESSERA_COMMON_GLSL
#define TESSERA_COMMON_GLSL

#extension GL_EXT_control_flow_attributes : require
#if defined(ROUTER_FOLD)
#if ROUTER_FOLD  // the router fold's 64-bit fixed-point accumulators (router_partial.glsl)
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require
#endif
#endif
#if USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

#include "kernel_args.h"
#include "timeline.glsl"  // before the kernel's main(): bench --timeline

// Linear workgroup index of a dispatch whose group count was split over x and y (the host does
// that when a count exceeds maxComputeWorkGroupCount[0]).
uint linear_workgroup_id() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

#if defined(ROUTER_FOLD)
#if ROUTER_FOLD
// v * scale rounded to int64 (the 64-bit fixed-point accumulators of the router fold and the fused
// MoE down): NaN -> 0, clamped to +-2^53 (no out-of-range conversion; up to 1023 workgroups'
// clamped adds do not wrap: the fused down checks its workgroup count).
int64_t rf_fixed(float v, float scale) {
  float f = v * scale;
  f = isnan(f) ? 0.0 : clamp(f, -9007199254740992.0, 9007199254740992.0);
  return int64_t(roundEven(f));
}
#endif
#endif

#ifdef WG_SIZE
shared float ts_wg_sum[WG_SIZE];

// Sum of v over the whole workgroup, returned to every invocation. Must be reached by all
// invocations of the workgroup (uniform control flow).
float workgroup_sum(float v) {
#if USE_SUBGROUP
  v = subgroupAdd(v);
  if (subgroupElect()) ts_wg_sum[gl_SubgroupID] = v;
  barrier();
  float s = 0.0;
  for (uint i = 0; i < gl_NumSubgroups; ++i) s += ts_wg_sum[i];
  barrier();
  return s;
#else
  const uint lid = gl_LocalInvocationIndex;
  ts_wg_sum[lid] = v;
  barrier();
  [[unroll]] for (uint s = WG_SIZE / 2; s > 0; s >>= 1) {
    if (lid < s) ts_wg_sum[lid] += ts_wg_sum[lid + s];
    barrier();
  }
  const float r = ts_wg_sum[0];
  barrier();
  return r;
#endif
}
#endif  // WG_SIZE

#if defined(WG_SIZE) && defined(NUM_COLS)
#if USE_SUBGROUP
shared float ts_wg_cols[NUM_COLS][WG_SIZE / SUBGROUP_SIZE];
#endif
// v[c] summed over the whole workgroup for every c < NUM_COLS, with one round of barriers (the
// kernel must run as full subgroups of SUBGROUP_SIZE); without subgroups, one workgroup_sum per
// column. Uniform control flow.
void workgroup_sum_cols(inout float v[NUM_COLS]) {
#if USE_SUBGROUP
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
    const float s = subgroupAdd(v[c]);
    if (subgroupElect()) ts_wg_cols[c][gl_SubgroupID] = s;
  }
  barrier();
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
    float s = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; ++i) s += ts_wg_cols[c][i];
    v[c] = s;
  }
  barrier();
#else
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) v[c] = workgroup_sum(v[c]);
#endif
}
#endif

#endif  // TESSERA_COMMON_GLSL
