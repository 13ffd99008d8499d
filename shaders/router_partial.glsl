// Router fold, matvec side (docs/ARCHITECTURE.md "Router fold"): the epilogue of the matvec that
// writes the residual stream x right before a MoE FFN (matvec.comp / matvec_q8.comp with
// ROUTER_FOLD 1: W_vo composed, attn_output factored). After a workgroup has computed
// x_new[r] = x[r] + W_r . in for its rows r, it adds for each expert e < n_expert
//   acc[e]        += sum_r W_router[e][r] * norm_w[r] * x_new[r]
//   acc[n_expert] += sum_r x_new[r]^2
// into copy (workgroup id % TS_ROUTER_FOLD_SLOTS) of the layer's accumulator array, as 64-bit
// fixed point (TS_ROUTER_FOLD_* in kernel_args.h; one atomicAdd per workgroup and value). The MoE
// gate-up (moe_gateup.comp, ROUTER_FOLD 1) sums the copies after the barrier: logits[e] =
// acc[e] / rms(x) and 1/rms(x) for h2 = RMSNorm(x; norm_w), so no router dispatch and no barrier
// before it. Integer adds commute: the sums are the same bits in every run.
//
// Defines: ROUTER_FOLD (1 here), RF_WTYPE (router weight: TS_TYPE_F32, F16 or BF16), RF_N_EXPERT
// (n_expert <= TS_ROUTE_MAX_E), RF_COLS (the router's row length = the rows of x), RF_ROWS (rows
// per workgroup of the including kernel), WG_SIZE, RF_PRELOAD (0/1: router_preload reads the
// workgroup's router and norm weights into shared memory ahead of the epilogue, e.g. while an
// early-started matvec waits on its gate; the sums stay the same bits).
// Bindings: 5 = router weight [n_expert][RF_COLS] (read as 32-bit words), 6 = norm weight
// (ffn_norm, f32 [RF_COLS]), 7 = the layer's accumulators (int64 [TS_ROUTER_FOLD_SLOTS][n_expert + 1],
// zero before the matvec: the decode step fills them at its start).
#ifndef TESSERA_ROUTER_PARTIAL_GLSL
#define TESSERA_ROUTER_PARTIAL_GLSL

#if RF_WTYPE != TS_TYPE_F32 && RF_WTYPE != TS_TYPE_F16 && RF_WTYPE != TS_TYPE_BF16
#error "router_partial.glsl: the router weight must be F32, F16 or BF16"
#endif

layout(std430, binding = 5) readonly restrict buffer RfWeightBuf { uint rf_w[]; };
layout(std430, binding = 6) readonly restrict buffer RfNormBuf { float rf_nw[]; };
layout(std430, binding = 7) restrict buffer RfAccBuf { int64_t rf_acc[]; };

shared float rf_x[RF_ROWS];  // x_new of the workgroup's rows, written by the kernel's stores
#ifndef RF_PRELOAD
#define RF_PRELOAD 0
#endif

// Router weight element idx (row-major).
float rf_weight(uint idx) {
#if RF_WTYPE == TS_TYPE_F32
  return uintBitsToFloat(rf_w[idx]);
#elif RF_WTYPE == TS_TYPE_F16
  return unpackHalf2x16(rf_w[idx >> 1])[idx & 1u];
#else
  const uint wd = rf_w[idx >> 1];
  return uintBitsToFloat((idx & 1u) != 0u ? (wd & 0xFFFF0000u) : (wd << 16));
#endif
}

#if RF_PRELOAD
shared float rf_wsh[RF_N_EXPERT * RF_ROWS];  // router weight [e][r] of row row0 + r
shared float rf_nwsh[RF_ROWS];               // norm weight of row row0 + r

// The router and norm weights of rows [row0, row0 + n) into shared memory (the workgroup; a
// barrier must follow before router_partial, which then reads them there).
void router_preload(uint row0, uint n) {
  for (uint i = gl_LocalInvocationIndex; i < RF_N_EXPERT * RF_ROWS; i += WG_SIZE) {
    const uint e = i / RF_ROWS, r = i % RF_ROWS;
    rf_wsh[i] = r < n ? rf_weight(e * RF_COLS + row0 + r) : 0.0;
  }
  for (uint r = gl_LocalInvocationIndex; r < RF_ROWS; r += WG_SIZE) rf_nwsh[r] = r < n ? rf_nw[row0 + r] : 0.0;
}
#endif

// Adds the partial logits and sum of squares of rows [row0, row0 + n) (indices into x and into the
// router's columns), whose x_new values are rf_x[0 .. n). Every invocation of the workgroup must
// call it (uniform control flow) after writing its rf_x entries.
void router_partial(uint row0, uint n) {
  barrier();  // rf_x complete
  const uint E = RF_N_EXPERT;
  const uint copy = (linear_workgroup_id() % TS_ROUTER_FOLD_SLOTS) * (E + 1u);
  for (uint e = gl_LocalInvocationIndex; e <= E; e += WG_SIZE) {
    float s = 0.0;
    if (e < E) {
#if RF_PRELOAD
      for (uint r = 0; r < n; ++r) s += rf_wsh[e * RF_ROWS + r] * (rf_nwsh[r] * rf_x[r]);
#else
      for (uint r = 0; r < n; ++r) s += rf_weight(e * RF_COLS + row0 + r) * (rf_nw[row0 + r] * rf_x[r]);
#endif
      atomicAdd(rf_acc[copy + e], rf_fixed(s, float(TS_ROUTER_FOLD_LOGIT_SCALE)));
    } else {
      for (uint r = 0; r < n; ++r) s += rf_x[r] * rf_x[r];
      atomicAdd(rf_acc[copy + E], rf_fixed(s, float(TS_ROUTER_FOLD_SS_SCALE)));
    }
  }
}

#endif  // TESSERA_ROUTER_PARTIAL_GLSL
