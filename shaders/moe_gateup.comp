#version 450
// MoE gate-up (decode_plan.md D9): for each slot s handled by this dispatch and each row i of
// its width, h[s*h_stride + i] = silu(gate_i . in) * (up_i . in).
//   routed slot k < n_used: expert e_k = route[2k] (written by router.comp; with
//     TS_MOE_ROUTE_RECOMPUTE the workgroup runs routing.glsl itself), its gate-up matrix
//     (2w rows x n_embd, row 2i gate i, row 2i+1 up i) in a MOE_TILE1 slot;
//   shared slot (h slot n_used): the tile's shared gate-up matrix, or (TS_MOE_SEPARATE_GATE_UP,
//     the dense FFN) separate gate and up matrices of w_shared rows each.
//   in = the h2 buffer (RMSNorm(x; ffn_norm) written by the router), or with TS_MOE_NORM_INPUT
//     RMSNorm(x; norm_w) computed here (dense layers have no router).
// One pass reads a gate row and its up row together (one input load serves both).
// Arguments: MoeArgs (moe_args.h). Wrappers: MoeGateUpOp, DenseGateUpOp (runtime/vulkan/kernels_moe.h).
//
// Defines: WTYPE (gate/up type), WG_SIZE, THREADS_PER_ROW (= SUBGROUP_SIZE when USE_SUBGROUP),
// OUT_PER_WG (outputs i per workgroup), PLAIN_VEC8 (plain types with n_embd % 8 == 0), UNROLL
// (1 or 2 units per loop iteration), Q8ACT (Q4_0 / Q8_0 / Q4_K / Q6_K: the input quantized to
// int8 per workgroup, integer dot products, q8_activations.glsl; Q8_BLOCKS >= n_embd / 32;
// OUT_PER_WG a multiple of 32 and the widths multiples of 32: each workgroup also writes its
// outputs as int8 blocks to hq, the down kernel's input), GU_OUTS and Q8_NB (Q8ACT with
// subgroups: outputs per subgroup pass with every weight load issued first; see gu_multi_dot).
// Work split: workgroup g < n_used*groups_routed (TS_MOE_ROUTED) takes rows
// [(g % groups_routed) * OUT_PER_WG, +OUT_PER_WG) of routed slot g / groups_routed; the
// following workgroups (TS_MOE_SHARED) take the shared slot's rows the same way. With
// OUT_PER_WG = subgroups per workgroup, each subgroup computes one output: many small
// independent dot products keep enough loads in flight to stream the weights.
// Bindings: 0 = weights (tile / slot range / dense span; regions Q and M), 1 = in (h2 or x),
// 2 = norm weight (TS_MOE_NORM_INPUT), 3 = route (uint pairs (expert, weight bits)), 4 = h (out),
// 5 = router logits, 6 = expert bias (both TS_MOE_ROUTE_RECOMPUTE only), 7 = hq (Q8ACT: int8
// blocks of h, 3 uvec4 per block (q8_activations.glsl layout), block b of slot s at s*h_stride/32 + b).
// ROUTER_FOLD (0/1, docs/ARCHITECTURE.md "Router fold"): no router dispatch ran; the matvec that
// wrote x left 64-bit fixed-point partial logits and sum(x^2) in the layer's accumulators (binding
// 8, router_partial.glsl). Every workgroup sums the TS_ROUTER_FOLD_SLOTS copies: 1/rms =
// inversesqrt(ss / n_embd + norm_eps) scales the dot products of in = x * norm weight
// (TS_MOE_NORM_INPUT: h2 = RMSNorm(x; ffn_norm) on the fly); routed workgroups also take
// logits[e] = acc[e] / rms and run routing.glsl; with TS_MOE_ROUTE_WRITE workgroup 0 writes the K
// (expert, weight) pairs to route (binding 3, for the down kernel after the barrier) and the E
// logits to binding 5.
// FOLD_OVERLAP (0/1; ROUTER_FOLD with Q8ACT): the input staging, the accumulator sums and the
// expert bias (into shared memory, for the routing) are read by different invocations in one
// phase with one barrier, instead of the sums, a barrier, then the staging and another barrier.
// FUSED_DOWN (0/1; needs Q8ACT, USE_SUBGROUP and ROUTER_FOLD; the down matrices of the same type
// in the same binding): no down dispatch follows. Each workgroup quantizes its outputs (one int8
// block per 32) into shared memory, multiplies them by the matching columns of its slot's down
// matrix (routed: times the slot's routing weight) for all n_embd rows, and adds the products into
// the 64-bit fixed-point accumulators (binding 9, TS_MOE_DOWN_ACC_SCALE); every workgroup then
// counts itself in the arrival counter after them, and the last one adds the sums to x (binding
// 10, the buffer of binding 1) and zeroes the accumulators and the counter. hq is not written.
// GATE_SIGNAL (0/1; ROUTER_FOLD with Q8ACT, not FUSED_DOWN; docs/DECODE.md "Early start"): the
// down kernel is recorded with no barrier after this dispatch. Workgroup 0 adds 1 to gate word 0
// (binding 11) once the route is written, every workgroup adds 1 to word 1 once its h and hq are.
// WAIT_GATE (0/1; with GATE_SIGNAL; `--tune early_gateup`): recorded with no barrier after the
// matvec that writes x and the fold's accumulators (W_vo / attn_output), whose workgroups count
// word GATE_WORD of binding 12 up to GATE_TARGET; every workgroup waits for it first (a wait that
// gives up sets the error words, binding 13), then reads x and the accumulators with plain loads
// (no SM has read their lines since the last barrier but the writers' own rows). With
// FOLD_OVERLAP and GATEUP_CONSTS (MoeTuning::gateup_consts) it loads what W_vo does not write
// into shared memory before the wait (the norm weight, the expert bias; session 16).
// STAGE_LATE (0/1, with FOLD_OVERLAP, GU_OUTS in one pass, subgroups, 32-element blocks;
// MoeTuning::gateup_stage_late): the prologue's phase reads only the fold's sums (and the bias);
// each workgroup issues its weight loads as soon as it knows its expert, then stages its input
// while they are in flight — one 16-byte word per invocation, 8 invocations a block, the block's
// max and sums by shuffles (stage_spread: the bits of q8_quantize32) — and the loads land before
// the products (their words folded into a store before the barrier, as matvec_q8.comp's
// PRELOAD_FIRST). The staging (1.3 µs on the H200 with the sums, session 38) leaves the path to
// the weight stream. GATEUP_INPUT_FIRST (with STAGE_LATE; MoeTuning::gateup_input_first): each
// invocation's input word is loaded beside the fold's sums, so that it does not queue behind the
// weight loads (as matvec_q8.comp's INPUT_FIRST; session 39).

#include "common.glsl"
#include "moe_args.h"

#define W_Q_BINDING 0
#define W_M_BINDING 0
#include "weights.glsl"

layout(local_size_x = WG_SIZE) in;

#ifndef FUSED_DOWN
#define FUSED_DOWN 0
#endif
#ifndef FOLD_OVERLAP
#define FOLD_OVERLAP 0
#endif
#ifndef GATE_SIGNAL
#define GATE_SIGNAL 0
#endif
#if GATE_SIGNAL && (!ROUTER_FOLD || !Q8ACT || FUSED_DOWN)
#error "moe_gateup.comp: GATE_SIGNAL needs ROUTER_FOLD and Q8ACT, without FUSED_DOWN"
#endif
// Outputs read by a consumer that runs beside this dispatch: coherent (they reach the device level).
#ifndef WAIT_GATE
#define WAIT_GATE 0
#endif
#if WAIT_GATE && !GATE_SIGNAL
#error "moe_gateup.comp: WAIT_GATE is built with GATE_SIGNAL"
#endif
#if WAIT_GATE
#extension GL_KHR_memory_scope_semantics : require
#define OUT_QUAL coherent writeonly
layout(std430, binding = 11) coherent restrict buffer DownGate { uint down_gate[]; };  // opened here
layout(std430, binding = 12) coherent restrict buffer Gate { uint gate[]; };          // polled here
layout(std430, binding = 13) coherent restrict buffer GateError { uint gate_error[]; };
#define GATE_SIGNAL_BUFFER down_gate
#define GATE_WAIT 1
#include "gate.glsl"
#elif GATE_SIGNAL
#define OUT_QUAL coherent writeonly
layout(std430, binding = 11) coherent restrict buffer Gate { uint gate[]; };
#include "gate.glsl"
#else
#define OUT_QUAL writeonly restrict
#endif
#ifndef GATEUP_CONSTS
#define GATEUP_CONSTS 0
#endif
#if WAIT_GATE && FOLD_OVERLAP && GATEUP_CONSTS
#define CONSTS_FIRST 1
#else
#define CONSTS_FIRST 0
#endif
#if FOLD_OVERLAP && (!Q8ACT || !ROUTER_FOLD)
#error "moe_gateup.comp: FOLD_OVERLAP needs Q8ACT and ROUTER_FOLD"
#endif
#if FUSED_DOWN
#if !Q8ACT || !USE_SUBGROUP || !ROUTER_FOLD
#error "moe_gateup.comp: FUSED_DOWN needs Q8ACT, USE_SUBGROUP and ROUTER_FOLD"
#endif
#define IN_QUALIFIERS readonly  // x is also written (binding 10), by the last workgroup
#elif WAIT_GATE
#define IN_QUALIFIERS readonly  // written beside this dispatch before the gate opens
#else
#define IN_QUALIFIERS readonly restrict
#endif
layout(std430, binding = 1) IN_QUALIFIERS buffer InBuf { float in_v[]; };
layout(std430, binding = 1) IN_QUALIFIERS buffer InBuf4 { vec4 in4[]; };
layout(std430, binding = 2) readonly restrict buffer NormBuf { float nw[]; };
layout(std430, binding = 2) readonly restrict buffer NormBuf4 { vec4 nw4[]; };
#if ROUTER_FOLD
layout(std430, binding = 3) OUT_QUAL buffer RouteBuf { uint route[]; };
layout(std430, binding = 5) writeonly restrict buffer LogitBuf { float route_logits[]; };
#if WAIT_GATE
layout(std430, binding = 8) readonly buffer RfAccBuf { int64_t rf_acc[]; };  // added to beside this dispatch
#else
layout(std430, binding = 8) readonly restrict buffer RfAccBuf { int64_t rf_acc[]; };
#endif
shared float rf_logit[TS_ROUTE_MAX_E];  // the summed accumulators, before 1/rms
shared float rf_ss;                     // sum(x^2)
float rf_inv_rms;                       // 1/rms of x (every invocation, after fold_read)
#define ROUTE_LOGIT(e) (rf_logit[e] * rf_inv_rms)
#if FOLD_OVERLAP
shared float rf_bias[TS_ROUTE_MAX_E];  // the expert bias, read beside the sums
#define ROUTE_BIAS(e) rf_bias[e]
#endif
#else
layout(std430, binding = 3) readonly restrict buffer RouteBuf { uint route[]; };
layout(std430, binding = 5) readonly restrict buffer LogitBuf { float route_logits[]; };
#endif
layout(std430, binding = 6) readonly restrict buffer BiasBuf { float route_bias[]; };
layout(std430, binding = 4) OUT_QUAL buffer HBuf { float h[]; };

layout(push_constant) uniform Push { MoeArgs args; };

#include "routing.glsl"

#if ROUTER_FOLD
bool recompute_route() { return ROUTE_RECOMPUTE != 0; }  // from the fold's logits (not in a shared-only part)
uint slot_expert(uint k) { return route_expert(k); }

// Sums the accumulator copies (routed workgroups: the logits too, into rf_logit), on the
// invocations from `first` (modulo the workgroup) on; no barrier.
void fold_sum(bool with_logits, uint first) {
  const uint E = args.n_expert;
  const uint t = (gl_LocalInvocationIndex + WG_SIZE - first % WG_SIZE) % WG_SIZE;
  for (uint e = with_logits ? t : E + t; e <= E; e += WG_SIZE) {
    int64_t s = 0;
    [[unroll]] for (uint k = 0; k < TS_ROUTER_FOLD_SLOTS; ++k) s += rf_acc[k * (E + 1u) + e];
    if (e < E) rf_logit[e] = float(s) * (1.0 / float(TS_ROUTER_FOLD_LOGIT_SCALE));
    else rf_ss = float(s) * (1.0 / float(TS_ROUTER_FOLD_SS_SCALE));
  }
}

// After fold_sum (and whatever else shares its barrier): rf_inv_rms. Uniform control flow.
void fold_finish() {
  barrier();
  rf_inv_rms = inversesqrt(rf_ss / float(args.n_embd) + args.norm_eps);
}
#else
bool recompute_route() { return ROUTE_RECOMPUTE != 0 && (args.flags & TS_MOE_ROUTE_RECOMPUTE) != 0u; }
// Expert and weight of routed slot k: the route buffer, or this workgroup's own routing.
uint slot_expert(uint k) { return recompute_route() ? route_expert(k) : route[2u * k]; }
float slot_weight(uint k) { return recompute_route() ? route_weight(k) : uintBitsToFloat(route[2u * k + 1u]); }
#endif

bool norm_input() { return (args.flags & TS_MOE_NORM_INPUT) != 0u; }

// Input values k..k+3 (k % 4 == 0), times the norm weight with TS_MOE_NORM_INPUT (1/rms is
// applied to the finished dot products).
vec4 in_vec4(uint k) { return norm_input() ? in4[k >> 2] * nw4[k >> 2] : in4[k >> 2]; }
float in_value(uint k) { return norm_input() ? in_v[k] * nw[k] : in_v[k]; }

#if Q8ACT
#include "q8_activations.glsl"
layout(std430, binding = 7) OUT_QUAL buffer HqBuf { uvec4 hq[]; };
shared float h_out[OUT_PER_WG];  // this workgroup's outputs, for the int8 copy

#ifndef STAGE_LATE
#define STAGE_LATE 0
#endif
#if CONSTS_FIRST
// The norm weight, loaded into shared memory before the gate (consts_preload: its DRAM round trip
// off the chain after W_vo), values 4i..4i+3 of block b at [(i % 8) * Q8_BLOCKS + b] (the
// staging's reads without bank conflicts). Registers would hold it across the wait.
shared vec4 nw_sh[8 * Q8_BLOCKS];
#endif

// The input (h2, or x times the norm weight) as int8 blocks in shared memory; no barrier.
void stage_input() {
  for (uint b = gl_LocalInvocationIndex; b < args.n_embd / 32u; b += WG_SIZE) {
    vec4 v[8];
#if CONSTS_FIRST
    if (norm_input()) {
      [[unroll]] for (uint i = 0; i < 8; ++i) v[i] = in4[8u * b + i] * nw_sh[i * Q8_BLOCKS + b];
    } else
#endif
    {
      [[unroll]] for (uint i = 0; i < 8; ++i) v[i] = in_vec4(32u * b + 4u * i);
    }
    q8_stage_block(b, v);
  }
}

// This workgroup's outputs 32t .. 32t + 31, as one block's values.
void h_out_block(uint t, out vec4 v[8]) {
  [[unroll]] for (uint k = 0; k < 8; ++k)
    v[k] = vec4(h_out[32u * t + 4u * k], h_out[32u * t + 4u * k + 1u], h_out[32u * t + 4u * k + 2u], h_out[32u * t + 4u * k + 3u]);
}
#endif

#if FUSED_DOWN
layout(std430, binding = 9) coherent restrict buffer DownAccBuf { int64_t down_acc[]; };
layout(std430, binding = 9) coherent restrict buffer DownCountBuf { uint down_count[]; };
layout(std430, binding = 10) coherent buffer XOutBuf { float x_out[]; };
shared uvec4 fd_lo[OUT_PER_WG / 32], fd_hi[OUT_PER_WG / 32];  // this workgroup's outputs, int8 blocks
shared vec4 fd_ds[OUT_PER_WG / 32];
shared bool fd_last;

// The down matrix of n_embd rows x `cols` at byte `base` of the weight binding: its region Q (in
// 16-byte units) and region M (in words).
uvec2 down_mat(uint base, uint cols) {
  const uint nb = cols / W_BLOCK;
  return uvec2(base >> 4, (base + ((args.n_embd * nb * (16u * W_QVEC) + 255u) & ~255u)) >> 2);
}

// Adds (weight x the down matrix's columns [i0, i0 + 32 n_blocks) . this workgroup's outputs) for
// every row into the accumulators. The down matrix: n_embd rows x `cols`, at byte `base` of the
// weight binding. Uniform control flow.
void fused_down_add(uint base, uint cols, uint i0, uint n_blocks, float weight) {
  if (gl_LocalInvocationIndex < n_blocks) {
    const uint t = gl_LocalInvocationIndex;
    vec4 v[8];
    h_out_block(t, v);
    q8_quantize32(v, fd_lo[t], fd_hi[t], fd_ds[t]);
  }
  barrier();
  const uvec2 m = down_mat(base, cols);
  const uint qbase = m.x, mbase = m.y;
  const uint units = cols / 32u, u0 = i0 / 32u;
  for (uint r = gl_LocalInvocationIndex; r < args.n_embd; r += WG_SIZE) {
    float d = 0.0;
    for (uint t = 0; t < n_blocks; ++t) d += q8_block_dot_x(qbase, mbase, r * units + u0 + t, fd_lo[t], fd_hi[t], fd_ds[t]);
    atomicAdd(down_acc[r], rf_fixed(weight * d, float(TS_MOE_DOWN_ACC_SCALE)));
  }
}

// Every workgroup of the dispatch, after its work (or none): counts itself; the last one adds the
// accumulated down products to x and leaves the accumulators and the counter at zero.
void fused_down_finish() {
  memoryBarrierBuffer();
  barrier();
  const uint counter = 2u * args.n_embd;
  if (gl_LocalInvocationIndex == 0u) {
    memoryBarrierBuffer();  // the workgroup's adds (made visible by the others' fences) before the count
    fd_last = atomicAdd(down_count[counter], 1u) == gl_NumWorkGroups.x * gl_NumWorkGroups.y - 1u;
  }
  barrier();
  if (!fd_last) return;
  memoryBarrierBuffer();
  for (uint r = gl_LocalInvocationIndex; r < args.n_embd; r += WG_SIZE) {
    const int64_t v = atomicExchange(down_acc[r], int64_t(0));
    x_out[r] += float(v) * (1.0 / float(TS_MOE_DOWN_ACC_SCALE));
  }
  if (gl_LocalInvocationIndex == 0u) atomicExchange(down_count[counter], 0u);
}
#endif

// A matrix of `rows` x n_embd starting at byte `base` of the weight binding.
struct Mat {
  uint qbase;  // SPLIT1: region Q in 16-byte units; plain: first element index
  uint mbase;  // SPLIT1: region M in 32-bit words
};

Mat mat_at(uint base, uint rows) {
#if W_PLAIN
  return Mat(base / uint(WTYPE == TS_TYPE_F32 ? 4 : 2), 0u);
#else
  const uint nb = args.n_embd / W_BLOCK;
  const uint m_off = (rows * nb * (16u * W_QVEC) + 255u) & ~255u;
  return Mat(base >> 4, (base + m_off) >> 2);
#endif
}

// Unit t (block t / W_UNITS, part t % W_UNITS) of gate row gr of g and up row ur of u, dotted
// with the input: acc += (gate part . in, up part . in).
#if !W_PLAIN
void pair_unit(Mat g, uint gr, Mat u, uint ur, uint nb, uint t, inout vec2 acc) {
  const uint b = t / W_UNITS, j = t % W_UNITS;
  float lo[16], hi[16];
  uint off_lo, off_hi;
  // Gate, then up, through the same 32 registers: fewer live registers, more resident workgroups.
  split1_unit(g.qbase, g.mbase, gr * nb + b, j, lo, hi, off_lo, off_hi);
  const uint k_lo = b * W_BLOCK + off_lo, k_hi = b * W_BLOCK + off_hi;
  vec4 xl[4], xh[4];
  [[unroll]] for (uint q = 0; q < 4; ++q) {
    xl[q] = in_vec4(k_lo + 4 * q);
    xh[q] = in_vec4(k_hi + 4 * q);
  }
  vec4 s = vec4(0.0);
  [[unroll]] for (uint q = 0; q < 4; ++q)
    s += vec4(lo[4 * q], lo[4 * q + 1], lo[4 * q + 2], lo[4 * q + 3]) * xl[q] +
         vec4(hi[4 * q], hi[4 * q + 1], hi[4 * q + 2], hi[4 * q + 3]) * xh[q];
  acc.x += (s.x + s.y) + (s.z + s.w);
  split1_unit(u.qbase, u.mbase, ur * nb + b, j, lo, hi, off_lo, off_hi);
  s = vec4(0.0);
  [[unroll]] for (uint q = 0; q < 4; ++q)
    s += vec4(lo[4 * q], lo[4 * q + 1], lo[4 * q + 2], lo[4 * q + 3]) * xl[q] +
         vec4(hi[4 * q], hi[4 * q + 1], hi[4 * q + 2], hi[4 * q + 3]) * xh[q];
  acc.y += (s.x + s.y) + (s.z + s.w);
}
#elif PLAIN_VEC8
void pair_unit(Mat g, uint gr, Mat u, uint ur, uint groups, uint t, inout vec2 acc) {
  float gv[8], uv[8];
  plain_vec8((g.qbase >> 3) + gr * groups + t, gv);
  plain_vec8((u.qbase >> 3) + ur * groups + t, uv);
  const vec4 x0 = in_vec4(8u * t), x1 = in_vec4(8u * t + 4u);
  const vec4 sg = vec4(gv[0], gv[1], gv[2], gv[3]) * x0 + vec4(gv[4], gv[5], gv[6], gv[7]) * x1;
  const vec4 su = vec4(uv[0], uv[1], uv[2], uv[3]) * x0 + vec4(uv[4], uv[5], uv[6], uv[7]) * x1;
  acc += vec2((sg.x + sg.y) + (sg.z + sg.w), (su.x + su.y) + (su.z + su.w));
}
#endif

// Partial dot products (x: gate row gr of matrix g, y: up row ur of matrix u) over this lane's
// share of the row. UNROLL = 2: two units per iteration, so each lane has twice the loads in flight.
#if Q8ACT
vec2 pair_dot(Mat g, uint gr, Mat u, uint ur, uint lane, uint nlanes) {
  const uint nb = args.n_embd / 32u;
  vec2 acc = vec2(0.0);
#if Q8_PAIRS  // Q4_K: a lane takes both sub-blocks of its quant bytes (q8_activations.glsl)
  const uint np = nb / 2u;
  for (uint p = lane; p < np; p += nlanes)
    acc += vec2(q8_pair_dot(q8_load_pair(g.qbase, g.mbase, gr * np + p), 2u * p),
                q8_pair_dot(q8_load_pair(u.qbase, u.mbase, ur * np + p), 2u * p));
#else
  for (uint b = lane; b < nb; b += nlanes)
    acc += vec2(q8_block_dot(g.qbase, g.mbase, gr * nb + b, b), q8_block_dot(u.qbase, u.mbase, ur * nb + b, b));
#endif
  return acc;
}

// GU_OUTS (0, or 1..8 with USE_SUBGROUP; MoeTuning::q8_gateup_outs, bench --tune gateup_outs):
// each subgroup takes GU_OUTS outputs per pass and loads every weight unit of its lanes' shares
// of their 2 x GU_OUTS rows before the first product, so that a lane has all its loads in flight
// at once (2 x GU_OUTS x GU_PER_LANE, held as loaded: Q8WRaw / Q8WPairRaw) instead of one
// round trip per unit. Needs Q8_NB = n_embd / 32 (the loop bounds as constants).
#ifndef GU_OUTS
#define GU_OUTS 0
#endif
#if GU_OUTS
#ifndef Q8_NB
#error "moe_gateup.comp: GU_OUTS needs Q8_NB"
#endif
#if Q8_PAIRS  // a lane's unit: a pair of Q4_K sub-blocks
#define GU_UNITS (Q8_NB / 2)
#define GU_RAW Q8WPairRaw
#else  // a lane's unit: one 32-element block
#define GU_UNITS Q8_NB
#define GU_RAW Q8WRaw
#endif
#define GU_PER_LANE ((GU_UNITS + THREADS_PER_ROW - 1) / THREADS_PER_ROW)

GU_RAW gu_load(Mat m, uint row, uint unit) {
#if Q8_PAIRS
  return q8_load_pair_raw(m.qbase, m.mbase, row * GU_UNITS + unit);
#else
  return q8_load_raw(m.qbase, m.mbase, row * GU_UNITS + unit);
#endif
}

// Unit `unit` of a row (as loaded) dotted with the staged input.
float gu_dot(GU_RAW w, uint unit) {
#if Q8_PAIRS
  return q8_pair_dot(q8_unpack_pair(w), 2u * unit);
#else
  return q8_dot_loaded(q8_unpack(w), q8_lo[unit], q8_hi[unit], q8_ds[unit]);
#endif
}

// Partial dot products of outputs out_i[k] (gate row gm * i, up row gm * i + ua) over this
// lane's share of the units; every load first. Lanes past the last unit load the last one
// again (a valid address) and add nothing.
void gu_multi_dot(Mat g, Mat u, uint gm, uint ua, uint out_i[GU_OUTS], uint lane, out vec2 acc[GU_OUTS]) {
  GU_RAW wg[GU_OUTS][GU_PER_LANE], wu[GU_OUTS][GU_PER_LANE];
  [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) {
    [[unroll]] for (uint j = 0; j < GU_PER_LANE; ++j) {
      const uint t = min(lane + j * THREADS_PER_ROW, GU_UNITS - 1u);
      wg[k][j] = gu_load(g, gm * out_i[k], t);
      wu[k][j] = gu_load(u, gm * out_i[k] + ua, t);
    }
  }
  [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) {
    acc[k] = vec2(0.0);
    [[unroll]] for (uint j = 0; j < GU_PER_LANE; ++j) {
      const uint t = lane + j * THREADS_PER_ROW;
      if (t < GU_UNITS) acc[k] += vec2(gu_dot(wg[k][j], t), gu_dot(wu[k][j], t));
    }
  }
}

#if STAGE_LATE
#extension GL_KHR_shader_subgroup_shuffle : require
#if !FOLD_OVERLAP || !USE_SUBGROUP || Q8_PAIRS || SUBGROUP_SIZE < 8 || OUT_PER_WG > GU_OUTS * (WG_SIZE / SUBGROUP_SIZE)
#error "moe_gateup.comp: STAGE_LATE needs FOLD_OVERLAP, subgroups of 8 or more, 32-element blocks and one pass"
#endif
shared uint sl_dep[WG_SIZE / SUBGROUP_SIZE];  // zero; the weight loads land before the barrier

// The input staged as stage_input does, spread: invocation t reads word t of the input (times the
// norm weight), the 8 invocations of a block (consecutive, in one subgroup) take its max by
// shuffles, each packs its 4 values, and the 4-word halves' sums come by shuffles: q8_quantize32's
// arithmetic, the same bits. No barrier.
// GATEUP_INPUT_FIRST (n_embd / 4 <= WG_SIZE): the invocation's word, loaded before (`first`).
#ifndef GATEUP_INPUT_FIRST
#define GATEUP_INPUT_FIRST 0
#endif
#if GATEUP_INPUT_FIRST && !CONSTS_FIRST
#error "moe_gateup.comp: GATEUP_INPUT_FIRST needs the norm weight in shared memory (CONSTS_FIRST)"
#endif
void stage_spread(vec4 first) {
  for (uint t = gl_LocalInvocationIndex; t < args.n_embd / 4u; t += WG_SIZE) {
#if CONSTS_FIRST
#if GATEUP_INPUT_FIRST
    const vec4 raw = first;  // one word per invocation
#else
    const vec4 raw = in4[t];
#endif
    const vec4 v = norm_input() ? raw * nw_sh[(t % 8u) * Q8_BLOCKS + t / 8u] : raw;
#else
    const vec4 v = in_vec4(4u * t);
#endif
    const vec4 a = abs(v);
    float amax = max(0.0, max(max(a.x, a.y), max(a.z, a.w)));
    amax = max(amax, subgroupShuffleXor(amax, 1u));
    amax = max(amax, subgroupShuffleXor(amax, 2u));
    amax = max(amax, subgroupShuffleXor(amax, 4u));
    const float d = amax / 127.0;
    const float inv_d = amax > 0.0 ? 127.0 / amax : 0.0;
    int s = 0;
    const uint word = q8_pack(v, inv_d, s);
    s += subgroupShuffleXor(s, 1u);
    s += subgroupShuffleXor(s, 2u);  // this half's sum (words 0-3 or 4-7)
    const int s_other = subgroupShuffleXor(s, 4u);
    const uint j = t % 8u, b = t / 8u;
    if (j < 4u) q8_lo[b][j] = word;
    else q8_hi[b][j - 4u] = word;
    if (j == 0u) q8_ds[b] = vec4(d, d * float(s), d * float(s_other), 0.0);
  }
}
#endif  // STAGE_LATE
#endif  // GU_OUTS
#else
vec2 pair_dot(Mat g, uint gr, Mat u, uint ur, uint lane, uint nlanes) {
  const uint n = args.n_embd;
  vec2 acc = vec2(0.0);
#if !W_PLAIN || PLAIN_VEC8
#if !W_PLAIN
  const uint per_row = n / W_BLOCK, units = per_row * W_UNITS;
#else
  const uint per_row = n / 8u, units = per_row;
#endif
  uint t = lane;
#if UNROLL >= 2
  for (; t + nlanes < units; t += 2u * nlanes) {
    pair_unit(g, gr, u, ur, per_row, t, acc);
    pair_unit(g, gr, u, ur, per_row, t + nlanes, acc);
  }
#endif
  for (; t < units; t += nlanes) pair_unit(g, gr, u, ur, per_row, t, acc);
#else
  const uint e_g = g.qbase + gr * n, e_u = u.qbase + ur * n;
  for (uint k = lane; k < n; k += nlanes) {
    const float xv = in_value(k);
    acc += vec2(plain_value(e_g + k), plain_value(e_u + k)) * xv;
  }
#endif
  return acc;
}
#endif  // Q8ACT

float silu(float z) { return z / (1.0 + exp(-z)); }

#if !USE_SUBGROUP
shared vec2 row_partial[WG_SIZE];
#endif

#if ROUTER_FOLD
// This workgroup takes routed rows (it routes, so it needs the logits and the bias).
bool routed_workgroup() {
  return (args.flags & TS_MOE_ROUTED) != 0u && linear_workgroup_id() < args.n_used * args.groups_routed;
}
#endif

#if FOLD_OVERLAP
// The expert bias into shared memory (routed workgroups, where the routing uses it), by the
// invocations after those that stage the input and sum the accumulators; no barrier.
void bias_load(bool with_logits) {
  if (with_logits && (args.route_flags & TS_ROUTER_EXPERT_BIAS) != 0u) {
    const uint t = (gl_LocalInvocationIndex + WG_SIZE - (args.n_embd / 32u + args.n_expert + 1u) % WG_SIZE) % WG_SIZE;
    for (uint e = t; e < args.n_expert; e += WG_SIZE) rf_bias[e] = route_bias[e];
  }
}
#endif

#if CONSTS_FIRST
// Before the gate: what the prologue reads that W_vo does not write (the norm weight, the expert
// bias) into shared memory, so that only x and the accumulators are read after it; gate_wait's
// first barrier orders these stores before the staging.
void consts_preload() {
  if (norm_input()) {
    const uint nb = args.n_embd / 32u;
    for (uint k = gl_LocalInvocationIndex; k < 8u * nb; k += WG_SIZE) nw_sh[(k % 8u) * Q8_BLOCKS + k / 8u] = nw4[k];
  }
  bias_load(routed_workgroup());
}
#endif

void gateup_main() {
  // 1/rms of the input (dense FFN path; the router fold: from the accumulators); uniform control
  // flow, before any early exit.
  float scale = 1.0;
#if ROUTER_FOLD
  const bool with_logits = routed_workgroup();
#if FOLD_OVERLAP
  // One phase: invocations [0, n_embd / 32) stage the input, the next E + 1 sum the accumulators,
  // the next E read the expert bias (where the routing uses it).
  const uint nb_in = args.n_embd / 32u;
#if !STAGE_LATE  // else staged while the weights load (stage_spread)
  stage_input();
#elif GATEUP_INPUT_FIRST
  const vec4 x_first = gl_LocalInvocationIndex < args.n_embd / 4u ? in4[gl_LocalInvocationIndex] : vec4(0.0);
#endif
  fold_sum(with_logits, nb_in);
#if !CONSTS_FIRST  // else loaded before the gate (consts_preload)
  bias_load(with_logits);
#endif
#else
  fold_sum(with_logits, 0u);
#endif
  fold_finish();
  TS_MARK_EARLY();  // bench --timeline: the input staged and the accumulators summed
  scale = rf_inv_rms;
#else
  if (norm_input()) {
    float ss = 0.0;
    for (uint k = gl_LocalInvocationIndex; k < args.n_embd / 4u; k += WG_SIZE) ss += dot(in4[k], in4[k]);
    scale = inversesqrt(workgroup_sum(ss) / float(args.n_embd) + args.norm_eps);
  }
#endif
#if Q8ACT && !FOLD_OVERLAP
  stage_input();
  barrier();
#endif

  // Which slot and rows this workgroup does (uniform per workgroup).
  const uint wg = linear_workgroup_id();
  const bool do_routed = (args.flags & TS_MOE_ROUTED) != 0u;
  const uint routed_groups = do_routed ? args.n_used * args.groups_routed : 0u;
  const bool routed = wg < routed_groups;
  uint slot, tile, width;
  if (routed) {
    slot = wg / args.groups_routed;
    tile = wg % args.groups_routed;
    width = args.w_routed;
  } else {
    if ((args.flags & TS_MOE_SHARED) == 0u) return;
    slot = args.n_used;
    tile = wg - routed_groups;
    width = args.w_shared;
  }

  Mat gmat, umat;
  uint gate_mul, up_add;  // gate row = gate_mul * i, up row = gate_mul * i + up_add
  if (routed) {
    if (recompute_route()) route_compute(args.n_expert, args.n_used, args.gating, args.route_flags, args.weights_scale);
#if ROUTER_FOLD
    // The route for the down kernel, and the logits (for tests and tools), from workgroup 0.
    if (recompute_route() && (args.flags & TS_MOE_ROUTE_WRITE) != 0u && wg == 0u) {
      const uint tid = gl_LocalInvocationIndex;
      if (tid < args.n_used) {
        route[2u * tid] = route_expert(tid);
        route[2u * tid + 1u] = floatBitsToUint(route_weight(tid));
      }
      for (uint e = tid; e < args.n_expert; e += WG_SIZE) route_logits[e] = ROUTE_LOGIT(e);
#if GATE_SIGNAL
      gate_signal(0u, 1u);  // the route written
#endif
    }
#endif
    const uint e = slot_expert(slot);
    if (e < args.expert_lo || e >= args.expert_hi) return;  // this expert's slot is bound elsewhere
    gmat = mat_at((e - args.expert_lo) * args.slot_stride + args.routed_offset, 2u * width);
    umat = gmat;
    gate_mul = 2u;
    up_add = 1u;
  } else if ((args.flags & TS_MOE_SEPARATE_GATE_UP) != 0u) {
    gmat = mat_at(args.shared_offset, width);
    umat = mat_at(args.shared_up_offset, width);
    gate_mul = 1u;
    up_add = 0u;
  } else {
    gmat = mat_at(args.shared_offset, 2u * width);
    umat = gmat;
    gate_mul = 2u;
    up_add = 1u;
  }

  const uint i0 = tile * OUT_PER_WG;
  if (i0 >= width) return;
  const uint i_end = min(i0 + OUT_PER_WG, width);
  const uint hbase = slot * args.h_stride;
#if FUSED_DOWN
  const uint fd_base = routed ? (slot_expert(slot) - args.expert_lo) * args.slot_stride + args.down_routed_offset
                              : args.down_shared_offset;
#endif

  TS_MARK();  // bench --timeline: the prologue's end (the route, the staged input)
#if STAGE_LATE
  // One pass (GU_OUTS outputs a subgroup): every weight load, then the staging, then the products
  // in gu_multi_dot's order.
  {
    const uint ns = gl_NumSubgroups, ib = i0 + gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint oi[GU_OUTS];
    [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) oi[k] = min(ib + k * ns, i_end - 1u);
    GU_RAW wg[GU_OUTS][GU_PER_LANE], wu[GU_OUTS][GU_PER_LANE];
    uint dep = 0u;
    [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) {
      [[unroll]] for (uint j = 0; j < GU_PER_LANE; ++j) {
        const uint t = min(lane + j * THREADS_PER_ROW, GU_UNITS - 1u);
        wg[k][j] = gu_load(gmat, gate_mul * oi[k], t);
        wu[k][j] = gu_load(umat, gate_mul * oi[k] + up_add, t);
        dep |= q8_raw_dep(wg[k][j]) ^ q8_raw_dep(wu[k][j]);
      }
    }
#if GATEUP_INPUT_FIRST
    stage_spread(x_first);
#else
    stage_spread(vec4(0.0));
#endif
    if (subgroupElect()) sl_dep[gl_SubgroupID] = subgroupOr(dep) & (args.flags & 0xFFFF0000u);  // zero
    barrier();
    vec2 acc[GU_OUTS];
    [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) {
      acc[k] = vec2(0.0);
      [[unroll]] for (uint j = 0; j < GU_PER_LANE; ++j) {
        const uint t = lane + j * THREADS_PER_ROW;
        if (t < GU_UNITS) acc[k] += vec2(gu_dot(wg[k][j], t), gu_dot(wu[k][j], t));
      }
      acc[k] = subgroupAdd(acc[k]) * scale;
    }
    if (subgroupElect()) {
      [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) {
        if (ib + k * ns < i_end) {
          const float v = silu(acc[k].x) * acc[k].y;
          h[hbase + oi[k]] = v;
          h_out[oi[k] - i0] = v;
        }
      }
    }
  }
#elif USE_SUBGROUP && Q8ACT && GU_OUTS
  // GU_OUTS outputs per pass (the last ones clamped to the range, stored only when valid).
  const uint ns = gl_NumSubgroups;
  for (uint ib = i0 + gl_SubgroupID; ib < i_end; ib += GU_OUTS * ns) {
    uint oi[GU_OUTS];
    [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) oi[k] = min(ib + k * ns, i_end - 1u);
    vec2 acc[GU_OUTS];
    gu_multi_dot(gmat, umat, gate_mul, up_add, oi, gl_SubgroupInvocationID, acc);
    [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) acc[k] = subgroupAdd(acc[k]) * scale;
    if (subgroupElect()) {
      [[unroll]] for (uint k = 0; k < GU_OUTS; ++k) {
        if (ib + k * ns < i_end) {
          const float v = silu(acc[k].x) * acc[k].y;
          h[hbase + oi[k]] = v;
          h_out[oi[k] - i0] = v;
        }
      }
    }
  }
#elif USE_SUBGROUP && Q8ACT
  // Two outputs per iteration (the second clamped to the range, stored only when valid): four
  // independent weight loads per lane and block.
  for (uint i = i0 + gl_SubgroupID; i < i_end; i += 2u * gl_NumSubgroups) {
    const uint i2 = min(i + gl_NumSubgroups, i_end - 1u);
    vec2 a0 = pair_dot(gmat, gate_mul * i, umat, gate_mul * i + up_add, gl_SubgroupInvocationID, gl_SubgroupSize);
    vec2 a1 = pair_dot(gmat, gate_mul * i2, umat, gate_mul * i2 + up_add, gl_SubgroupInvocationID, gl_SubgroupSize);
    a0 = subgroupAdd(a0) * scale;
    a1 = subgroupAdd(a1) * scale;
    if (subgroupElect()) {
      const float v0 = silu(a0.x) * a0.y, v1 = silu(a1.x) * a1.y;
      h[hbase + i] = v0;
      h_out[i - i0] = v0;
      if (i + gl_NumSubgroups < i_end) {
        h[hbase + i2] = v1;
        h_out[i2 - i0] = v1;
      }
    }
  }
#elif USE_SUBGROUP
  for (uint i = i0 + gl_SubgroupID; i < i_end; i += gl_NumSubgroups) {
    vec2 acc = pair_dot(gmat, gate_mul * i, umat, gate_mul * i + up_add, gl_SubgroupInvocationID, gl_SubgroupSize);
    acc = subgroupAdd(acc) * scale;
    if (subgroupElect()) h[hbase + i] = silu(acc.x) * acc.y;
  }
#else
  // THREADS_PER_ROW invocations per output, WG_SIZE / THREADS_PER_ROW outputs at a time.
  const uint lid = gl_LocalInvocationIndex;
  const uint lane = lid % THREADS_PER_ROW;
  for (uint ib = i0; ib < i_end; ib += WG_SIZE / THREADS_PER_ROW) {
    const uint i = ib + lid / THREADS_PER_ROW;
    vec2 acc = vec2(0.0);
    if (i < i_end) acc = pair_dot(gmat, gate_mul * i, umat, gate_mul * i + up_add, lane, THREADS_PER_ROW);
    row_partial[lid] = acc;
    barrier();
    [[unroll]] for (uint s = THREADS_PER_ROW / 2; s > 0; s >>= 1) {
      if (lane < s) row_partial[lid] += row_partial[lid + s];
      barrier();
    }
    if (lane == 0 && i < i_end) {
      const vec2 r = row_partial[lid] * scale;
      h[hbase + i] = silu(r.x) * r.y;
#if Q8ACT
      h_out[i - i0] = silu(r.x) * r.y;
#endif
    }
    barrier();
  }
#endif
#if FUSED_DOWN
  barrier();  // h_out complete
  fused_down_add(fd_base, width, i0, (i_end - i0) / 32u, routed ? route_weight(slot) : 1.0);
#elif Q8ACT
  // The int8 copy of this workgroup's outputs (i0 and the widths are multiples of 32).
  barrier();
  const uint n_out_blocks = (i_end - i0) / 32u;
  if (gl_LocalInvocationIndex < n_out_blocks) {
    const uint t = gl_LocalInvocationIndex;
    vec4 v[8];
    h_out_block(t, v);
    uvec4 lo, hi;
    vec4 ds;
    q8_quantize32(v, lo, hi, ds);
    const uint blk = slot * (args.h_stride / 32u) + i0 / 32u + t;
    hq[3u * blk] = lo;
    hq[3u * blk + 1u] = hi;
    hq[3u * blk + 2u] = floatBitsToUint(ds);
  }
#endif
}

void main() {
#if WAIT_GATE
#if CONSTS_FIRST
  consts_preload();
#endif
  gate_wait(uint(GATE_WORD), uint(GATE_TARGET), 0u, 0u);  // x and the accumulators written
#endif
  gateup_main();
#if FUSED_DOWN
  fused_down_finish();
#endif
#if GATE_SIGNAL
  gate_signal(1u, 1u);  // every workgroup (those that returned early too): its h and hq written
#endif
}
