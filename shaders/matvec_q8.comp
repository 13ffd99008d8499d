#version 450
// y = W x (+ y) with int8 activations (q8_activations.glsl): W a Q4_0 / Q8_0 / Q4_K / Q6_K SPLIT1
// matrix, x and y f32, NUM_COLS x vectors at once (decode: 1, prefill: up to 8). The MatvecOp
// wrapper picks this kernel where the device has integer dot products
// (runtime/vulkan/kernels_matvec.h); same arguments and bindings as matvec.comp.
//
// The columns' inputs are staged in passes of KCHUNK blocks (32 elements) of every column:
//   pass: barrier; the workgroup quantizes x[c][32 kb .. 32 (kb + KCHUNK)) of each column c into
//         int8 blocks in shared memory (block b of column c at c * KCHUNK + b); barrier;
//         each team (a subgroup, or THREADS_PER_ROW invocations) adds, for its NUM_ROWS rows, the
//         pass's blocks: each weight block is loaded once (one 16-byte load for Q4_0) and dotted
//         with the NUM_COLS staged blocks by packed 4x8-bit dot products.
// So the staging costs NUM_COLS * cols / 32 block quantizations per workgroup, shared by its
// TEAMS * NUM_ROWS rows, whatever the row length (shared memory: NUM_COLS * KCHUNK * 48 bytes).
// With NORM_INPUT the staged values are x * norm weight; 1/rms scales the finished dot products.
//
// Defines: WTYPE (Q4_0, Q8_0, Q4_K or Q6_K), WG_SIZE, THREADS_PER_ROW (= SUBGROUP_SIZE when
// USE_SUBGROUP), NUM_ROWS (rows per team), NUM_COLS (1..8), NORM_INPUT (0/1), KCHUNK (blocks per
// pass), Q8_BLOCKS (= NUM_COLS * KCHUNK), BLOCKS_PER_ITER (2 or 4: weight blocks per lane and
// loop iteration). With USE_SUBGROUP the workgroup must run as WG_SIZE /
// SUBGROUP_SIZE full subgroups (the host asks for full subgroups).
// KSPLIT (1, 2 or 4; USE_SUBGROUP, one column): KSPLIT subgroups share each row, subgroup p of a
// team taking the blocks of lanes p * SUBGROUP_SIZE .. (the team's invocations act as one wide
// lane set), their sums combined in shared memory in order: long rows (W_vo's 10240 values) take
// fewer dependent load rounds per lane. A team is then KSPLIT subgroups.
// ROUTER_FOLD (0/1): the router fold's epilogue (router_partial.glsl), as in matvec.comp.
// X_Q8 (0/1; one column, no NORM_INPUT): x comes already quantized (binding 2 = int8 blocks, 3
// uvec4 per 32 values, q8_quantize.glsl; e.g. attention_merge.comp's olat_q8): nothing is staged,
// no barrier precedes the weight loads, each lane reads its input blocks beside its weight blocks.
// WAIT_GATE (0/1; subgroups, one column; docs/DECODE.md "Early start"): the dispatch is recorded
// with no barrier after the one that writes x (X_Q8: its int8 blocks), which adds to the gate
// word as its workgroups finish. Each lane first loads all its weight blocks (PRELOAD per row:
// lane + j * nlanes, j < PRELOAD), then invocation 0 polls the gate until it reaches GATE_TARGET
// (a wait of more than kGateSpins polls gives up and sets the error word: a device that did not
// run the producer beside this dispatch), and only then is x read (staged x: in one pass, KSPLIT
// 1). The sums run in the same order as without the gate: the same bits. GATE_X: how x's int8
// blocks are read after the gate: 0 each lane its own, coherent (L2); 1 the workgroup copies them
// once into shared memory (coherent; Q8_BLOCKS >= the row's blocks), the teams read that; 2
// (default) each lane its own, plain loads ordered by the fence after the poll (the teams share
// them through L1). Staged x: 2 plain loads (right where no SM has read x's lines since the last
// barrier: q_a's output for W_qk), 0 / 1 coherent loads (the MoE down's x for the next q_a).
// GATE_LATE (0/1; with WAIT_GATE): the wait comes first and nothing is loaded ahead of it; then
// the ungated kernel runs (the barrier's relaunch saved, no weight stream beside the producer).
// OUT_Q8 (0/1; one column, subgroups, ROWS_PER_WG a multiple of 32): the producer of the next
// matvec's pre-quantized input. Besides y, each workgroup writes its rows times the next norm's
// weight (binding 13) as int8 blocks (binding 12, q8_quantize.glsl layout, block (row_begin +
// row0) / 32 + t) and the sum of its rows' squares, added in row order, to float (row_begin +
// row0) / ROWS_PER_WG of binding 14: q_a for W_qk.
// X_HEAD_ROWS (0 or N; with X_Q8): W is H stacked matrices of N rows each and x holds H vectors
// of `cols` values (blocks h * cols / 32 ..): row r reads vector (row_begin + r) / N (the
// factored value path: o_h = Vb_h olat_h for every head in one dispatch). N % NUM_ROWS == 0, so
// a team's rows share one vector; not with GATE_X 1.
// OUT_NORM (0/1, default 1; with OUT_Q8): 0 writes y's int8 blocks as they are (no norm weight,
// binding 13 unused) and no sums of squares (binding 14 unused): o for attn_output.
// OUT_HALVES (0/1; with OUT_Q8 and OUT_NORM; ROWS_PER_WG a multiple of 16): each workgroup writes
// its rows as half blocks of 16, each with its own scale (q8_quantize.glsl "Halves"), so that q_a
// keeps 16 rows per workgroup (48 workgroups, not 24 of 32 rows: H100 timeline, session 12); the
// consumer is built with X_HALVES (q8_activations.glsl).
// X_SS (0/1; with X_Q8): x_q8 holds x times the norm weight, quantized (OUT_Q8); the finished dot
// products are scaled by 1 / rms(x), from the X_SS_PARTS sums of squares of binding 4 added in
// order (the same in every workgroup) and norm_eps.
// PRELOAD_FIRST (0/1; staged x in one pass, subgroups, one column, no gate): the WAIT_GATE
// path's order without the wait: each lane's weight blocks are loaded before x is staged, so their
// DRAM latency overlaps the staging (q_a / kv_a: one row per subgroup, two blocks per lane).
// INPUT_FIRST (0/1; with PRELOAD_FIRST, the row's blocks <= WG_SIZE): the values of x (and of the
// norm weight) that an invocation stages are loaded before its weight blocks, so that the layer's
// first reads (the norm weight is cold in the L2) do not queue behind the weight stream: H200,
// GLM-4.7-Flash q_a / kv_a, x staged 4.6 -> 3.7 µs after the start (session 39).
// SIGNAL_GATE (0/1; one column): the producer's side of a gate (gate.glsl gate_signal): each
// workgroup that has rows adds 1 to word SIGNAL_WORD of binding 11 after its y rows are stored
// (e.g. q_a opening W_qk's gate); the word reaches the dispatch's workgroups with rows.
// Bindings: 0 = W region Q, 1 = W region M, 2 = x, 3 = y, 4 = norm weight (NORM_INPUT), 5..7 =
// router weight, ffn_norm, fold accumulators (ROUTER_FOLD), 8 = gate word, 9 = error word
// (WAIT_GATE), 10 = gate statistics (GATE_STATS: two counters, see GateStats), 11 = the word
// opened (SIGNAL_GATE), 12..14 = int8 y, its norm weight, the sums of squares (OUT_Q8), 15 = the
// residual (RESIDUAL_IN), 16..17 = the cache rows and the step words (PREFETCH_ROWS); with X_SS
// binding 4 holds x's sums of squares.
// RESIDUAL_IN (0/1; one accumulating column): y = residual + W x with the residual read from
// binding 15, y only written (MatvecOp::residual: the decode step's x in two buffers).

#include "common.glsl"
#ifndef X_Q8
#define X_Q8 0
#endif
#ifndef WAIT_GATE
#define WAIT_GATE 0
#endif
#ifndef SIGNAL_GATE
#define SIGNAL_GATE 0
#endif
#ifndef PRELOAD_FIRST
#define PRELOAD_FIRST 0
#endif
#ifndef GATE_LATE
#define GATE_LATE 0
#endif
#ifndef OUT_Q8
#define OUT_Q8 0
#endif
#ifndef X_SS
#define X_SS 0
#endif
#ifndef X_HEAD_ROWS
#define X_HEAD_ROWS 0
#endif
#ifndef OUT_NORM
#define OUT_NORM 1
#endif
#ifndef OUT_HALVES
#define OUT_HALVES 0
#endif
#if OUT_HALVES && (!OUT_Q8 || !OUT_NORM)
#error "matvec_q8.comp: OUT_HALVES is a form of OUT_Q8 with OUT_NORM"
#endif
#if X_HALVES && !X_Q8
#error "matvec_q8.comp: X_HALVES reads int8 x"
#endif
#if X_HEAD_ROWS && (!X_Q8 || X_HEAD_ROWS % NUM_ROWS != 0 || (WAIT_GATE && GATE_X == 1))
#error "matvec_q8.comp: X_HEAD_ROWS takes int8 x, whole teams per vector, and not GATE_X 1"
#endif
#if SIGNAL_GATE && NUM_COLS != 1
#error "matvec_q8.comp: SIGNAL_GATE takes one column"
#endif
#if WAIT_GATE && (!USE_SUBGROUP || NUM_COLS != 1)
#error "matvec_q8.comp: WAIT_GATE needs subgroups and one column"
#endif
#if WAIT_GATE
#extension GL_KHR_memory_scope_semantics : require
#endif

#define W_Q_BINDING 0
#define W_M_BINDING 1
#include "weights.glsl"

#if WTYPE != TS_TYPE_Q4_0 && WTYPE != TS_TYPE_Q8_0 && WTYPE != TS_TYPE_Q4_K && WTYPE != TS_TYPE_Q6_K
#error "matvec_q8.comp: Q4_0, Q8_0, Q4_K and Q6_K weights only"
#endif

layout(local_size_x = WG_SIZE) in;

#ifndef GATE_X
#define GATE_X 2
#endif
#ifndef GATE_WORD
#define GATE_WORD 0  // the gate's word in its binding
#endif
#ifndef GATE_STATS
#define GATE_STATS 0
#endif
#ifndef GATE_CLOCK
#define GATE_CLOCK 0
#endif
#if X_Q8
#if NUM_COLS != 1 || NORM_INPUT
#error "matvec_q8.comp: X_Q8 takes one column and no input norm"
#endif
#if WAIT_GATE && GATE_X != 2
// Written by the producer while this dispatch runs: coherent (no stale L1 lines).
layout(std430, binding = 2) coherent readonly restrict buffer XQ8 { uvec4 xq[]; };
#else
layout(std430, binding = 2) readonly restrict buffer XQ8 { uvec4 xq[]; };
#endif
#elif WAIT_GATE && GATE_X != 2
// Written by the producer while this dispatch runs, whose sectors other SMs may hold in L1 (the
// MoE down reads its old x rows, 32-byte sectors spanning other workgroups' rows): coherent.
// Coherent loads are slow on the H100 (PERFORMANCE.md session 11: W_qk gated with them lost 9 %).
layout(std430, binding = 2) coherent readonly restrict buffer XBuf { float x[]; };
layout(std430, binding = 2) coherent readonly restrict buffer XBuf4 { vec4 x4[]; };
#else
layout(std430, binding = 2) readonly restrict buffer XBuf { float x[]; };
layout(std430, binding = 2) readonly restrict buffer XBuf4 { vec4 x4[]; };
#endif
#if WAIT_GATE
layout(std430, binding = 8) coherent restrict buffer Gate { uint gate[]; };
layout(std430, binding = 9) coherent restrict buffer GateError { uint gate_error[]; };
#if GATE_STATS
// [0] workgroups whose first poll found the gate closed, [1] workgroups that polled; with
// GATE_CLOCK (the device clock, clockRealtimeEXT) the 64-bit words from [2]: the maxima of ~start,
// ~open, open, end over the workgroups (start: the workgroup began; open: its poll saw the gate
// reach its target; end: it finished), i.e. the first start and open, the last open and end.
layout(std430, binding = 10) buffer GateStats { uint gate_stats[]; };
#if GATE_CLOCK
#extension GL_EXT_shader_realtime_clock : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_atomic_int64 : require
layout(std430, binding = 10) buffer GateTimes { uint64_t gate_times[]; };
uint64_t gate_t_start;
void gate_time(uint i, uint64_t t) { atomicMax(gate_times[2u + i], t); }
#endif
#endif
#endif
layout(std430, binding = 3) restrict buffer YBuf { float y[]; };
#ifndef RESIDUAL_IN
#define RESIDUAL_IN 0
#endif
#if RESIDUAL_IN
#if NUM_COLS != 1
#error "matvec_q8.comp: RESIDUAL_IN takes one column"
#endif
layout(std430, binding = 15) readonly restrict buffer ResBuf { float res[]; };
#define Y_BEFORE(i) res[i]  // what the accumulating store adds to
#else
#define Y_BEFORE(i) y[i]
#endif
#if NORM_INPUT
layout(std430, binding = 4) readonly restrict buffer NormBuf4 { vec4 nw4[]; };
#endif
#if X_SS
#if !X_Q8
#error "matvec_q8.comp: X_SS scales pre-quantized x"
#endif
layout(std430, binding = 4) readonly restrict buffer XSumSq { float x_ss[]; };
#endif
#if OUT_Q8
#if NUM_COLS != 1 || !USE_SUBGROUP
#error "matvec_q8.comp: OUT_Q8 takes one column and subgroups"
#endif
// Read by the next matvec beside this one where it starts early: coherent (reaches the L2).
layout(std430, binding = 12) coherent writeonly restrict buffer YQ8 { uvec4 yq[]; };
#if OUT_NORM
layout(std430, binding = 13) readonly restrict buffer OutNorm4 { vec4 onw4[]; };
layout(std430, binding = 14) coherent writeonly restrict buffer YSumSq { float y_ss[]; };
#endif
#endif

layout(push_constant) uniform Push { MatvecArgs args; };

#include "q8_activations.glsl"

#ifndef KSPLIT
#define KSPLIT 1
#endif
#if KSPLIT > 1 && (!USE_SUBGROUP || NUM_COLS != 1)
#error "matvec_q8.comp: KSPLIT > 1 needs subgroups and one column"
#endif
#if PRELOAD_FIRST && (WAIT_GATE || X_Q8 || !USE_SUBGROUP || NUM_COLS != 1 || KSPLIT != 1)
#error "matvec_q8.comp: PRELOAD_FIRST is the ungated staged path, subgroups, one column, KSPLIT 1"
#endif
#ifndef INPUT_FIRST
#define INPUT_FIRST 0
#endif
#if INPUT_FIRST && !PRELOAD_FIRST
#error "matvec_q8.comp: INPUT_FIRST is a variant of PRELOAD_FIRST"
#endif
#if WAIT_GATE && !X_Q8 && KSPLIT != 1
#error "matvec_q8.comp: WAIT_GATE on staged x takes KSPLIT 1"
#endif
#if (WG_SIZE / THREADS_PER_ROW) % KSPLIT != 0
#error "matvec_q8.comp: the subgroups of a workgroup must divide into teams of KSPLIT"
#endif
#define TEAMS (WG_SIZE / THREADS_PER_ROW / KSPLIT)
#define ROWS_PER_WG (TEAMS * NUM_ROWS)

#if ROUTER_FOLD
#if NUM_COLS != 1
#error "matvec_q8.comp: the router fold takes one column"
#endif
#define RF_ROWS ROWS_PER_WG
#define RF_PRELOAD (WAIT_GATE && !GATE_LATE)
#include "router_partial.glsl"
#endif

#if WAIT_GATE
#if GATE_STATS
// The polling invocation, its poll over (GATE_ON_OPEN): the counters and the times.
void gate_stats_open(uint first) {
  if (first < uint(GATE_TARGET)) atomicAdd(gate_stats[0], 1u);
  atomicAdd(gate_stats[1], 1u);
#if GATE_CLOCK
  const uint64_t t_open = clockRealtimeEXT();
  gate_time(0u, ~gate_t_start);
  gate_time(1u, ~t_open);
  gate_time(2u, t_open);
#endif
}
#define GATE_ON_OPEN(first) gate_stats_open(first)
#endif
#define GATE_WAIT 1
#endif  // WAIT_GATE
#if SIGNAL_GATE
#ifndef SIGNAL_WORD
#define SIGNAL_WORD 0
#endif
layout(std430, binding = 11) coherent restrict buffer SignalGate { uint signal_gate[]; };
#define GATE_SIGNAL_BUFFER signal_gate
#endif
#if WAIT_GATE || SIGNAL_GATE
#include "gate.glsl"
#endif
#if WAIT_GATE
// Until the gate word reaches GATE_TARGET (gate.glsl gate_wait), then x is visible; `dep` folds
// the lane's preloaded weight words, the zero mask is the high half of flags (always zero).
void wait_gate(uint dep) { gate_wait(uint(GATE_WORD), uint(GATE_TARGET), dep, args.flags & 0xFFFF0000u); }

// PREFETCH_ROWS (0/1; WAIT_GATE, not GATE_LATE; MatvecOp::row_prefetch, session 35): before the
// wait, the dispatch's invocations read one word of every 32-byte sector of the layer's cache
// rows [0, min(pos, PF_MAX_ROWS)) (binding 16; pos = word PF_POS_WORD of binding 17), so that the
// attention after it finds them in the L2 instead of queueing for DRAM behind the next stage's
// weight stream. Row pos, written beside this dispatch, is not read. The words join the
// preload's dependence (they land before the poll, long before W_qk's gate opens). The loads are
// coherent (the L2 only) unless PF_L1 (MatvecOp::RowPrefetch::l1): with plain loads, which also
// fill the L1 of W_qk's SMs, the attention beside them decoded nondeterministically where its
// mid range was stretched (PERFORMANCE.md session 37).
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 0
#endif
// PRELOAD_EARLY (1..PRELOAD, default PRELOAD; MatvecTuning::preload_early): of a lane's PRELOAD
// blocks per row, the first PRELOAD_EARLY are loaded before the wait, the rest after it.
#ifndef PRELOAD_EARLY
#define PRELOAD_EARLY PRELOAD
#endif
#if PREFETCH_ROWS
#if defined(PF_L1) && PF_L1
layout(std430, binding = 16) readonly buffer PfCache { uint pf_cache[]; };
#else
layout(std430, binding = 16) coherent readonly buffer PfCache { uint pf_cache[]; };
#endif
layout(std430, binding = 17) readonly buffer PfStep { uint pf_step[]; };

uint prefetch_rows() {
  const uint rows = min(pf_step[PF_POS_WORD], uint(PF_MAX_ROWS));
  const uint sectors = rows * uint(PF_ROW_SECTORS);
  const uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * WG_SIZE;
  uint dep = 0u;
  for (uint s = linear_workgroup_id() * WG_SIZE + gl_LocalInvocationIndex; s < sectors; s += stride) dep |= pf_cache[8u * s];
  return dep;
}
#endif

#endif  // WAIT_GATE

#if X_Q8
// The first block of the x vector that bound row `row` reads (X_HEAD_ROWS: its head's).
uint x_block0(uint row) {
#if X_HEAD_ROWS
  return args.x_offset / 32u + (args.row_begin + row) / uint(X_HEAD_ROWS) * (args.cols / 32u);
#else
  return args.x_offset / 32u;
#endif
}

// acc[r][0] += (weight row `row + r`, this lane's blocks) . x, x's blocks read from binding 2.
void global_dot(uint row, uint nvalid, uint nb, uint lane, uint nlanes, inout float acc[NUM_ROWS][NUM_COLS]) {
  const uint b0 = x_block0(row);
  for (uint b = lane; b < nb; b += BLOCKS_PER_ITER * nlanes) {
    uint bi[BLOCKS_PER_ITER];
    [[unroll]] for (uint u = 0; u < BLOCKS_PER_ITER; ++u) bi[u] = b + u * nlanes < nb ? b + u * nlanes : b;
    uvec4 xl[BLOCKS_PER_ITER], xh[BLOCKS_PER_ITER];
    vec4 xd[BLOCKS_PER_ITER];
    [[unroll]] for (uint u = 0; u < BLOCKS_PER_ITER; ++u) {
      xl[u] = xq[3u * (b0 + bi[u])];
      xh[u] = xq[3u * (b0 + bi[u]) + 1u];
      xd[u] = uintBitsToFloat(xq[3u * (b0 + bi[u]) + 2u]);
    }
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
      if (r < nvalid) {
        [[unroll]] for (uint u = 0; u < BLOCKS_PER_ITER; ++u)
          if (u == 0u || b + u * nlanes < nb) acc[r][0] += q8_block_dot_x(0u, 0u, (row + r) * nb + bi[u], xl[u], xh[u], xd[u]);
      }
    }
  }
}
#if WAIT_GATE && !GATE_LATE
// global_dot with the lane's weight blocks loaded before the gate opens (row `row + r` clamped to
// a valid one, blocks past the row repeating its last; neither is added).
shared float gate_y[ROWS_PER_WG];  // y of the workgroup's rows before the add (TS_MATVEC_ACCUMULATE)

// Blocks J0 .. J1 - 1 of the lane's (lane, lane + nlanes, ...) of every row row + r into w[r]
// (rows past nvalid repeat the last valid one, blocks past nb the last block): no branch around a
// load. A macro, so that gated_dot's loads before and after the wait compile as one loop each.
#define GATED_LOAD_BLOCKS(J0, J1)                                                                      \
  [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {                                                     \
    const uint rr = nvalid == 0u ? 0u : row + min(r, nvalid - 1u);                                      \
    [[unroll]] for (uint j = (J0); j < (J1); ++j) w[r][j] = q8_load_raw(0u, 0u, rr * nb + min(lane + j * nlanes, nb - 1u)); \
  }

void gated_dot(uint row, uint nvalid, uint nb, uint lane, uint nlanes, uint row0, uint row_end,
               inout float acc[NUM_ROWS][NUM_COLS]) {
  Q8WRaw w[NUM_ROWS][PRELOAD];  // held across the wait as loaded
  GATED_LOAD_BLOCKS(0, PRELOAD_EARLY)
  uint dep = 0u;  // every loaded word of every block (its scale included)
  [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
    [[unroll]] for (uint j = 0; j < PRELOAD_EARLY; ++j) dep |= q8_raw_dep(w[r][j]);
  }
  // What the epilogue reads and the gate does not change, into shared memory while the gate is
  // closed: y (the residual) and the router fold's weights.
  for (uint i = gl_LocalInvocationIndex; i < row_end - row0; i += WG_SIZE)
    gate_y[i] = (args.flags & TS_MATVEC_ACCUMULATE) != 0u ? Y_BEFORE(args.row_begin + row0 + i) : 0.0;
#if ROUTER_FOLD
  router_preload(args.row_begin + row0, row_end - row0);
#endif
#if PREFETCH_ROWS
  dep |= prefetch_rows();
#endif
  wait_gate(dep);
#if PRELOAD_EARLY < PRELOAD  // the rest of the lane's blocks, after the wait
  GATED_LOAD_BLOCKS(PRELOAD_EARLY, PRELOAD)
#endif
  const uint b0 = x_block0(row);
#if GATE_X == 1
  // x's blocks read once per workgroup into shared memory (every team reads all of them).
  for (uint b = gl_LocalInvocationIndex; b < nb; b += WG_SIZE) {
    q8_lo[b] = xq[3u * (b0 + b)];
    q8_hi[b] = xq[3u * (b0 + b) + 1u];
    q8_ds[b] = uintBitsToFloat(xq[3u * (b0 + b) + 2u]);
  }
  barrier();
#endif
  [[unroll]] for (uint j = 0; j < PRELOAD; ++j) {
    const uint b = lane + j * nlanes;
    if (b < nb) {
#if GATE_X == 1
      const uvec4 xl = q8_lo[b], xh = q8_hi[b];
      const vec4 xd = q8_ds[b];
#else
      const uvec4 xl = xq[3u * (b0 + b)], xh = xq[3u * (b0 + b) + 1u];
      const vec4 xd = uintBitsToFloat(xq[3u * (b0 + b) + 2u]);
#endif
      [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r)
        if (r < nvalid) acc[r][0] += q8_dot_loaded(q8_unpack(w[r][j]), xl, xh, xd);
    }
  }
}
#endif
#else
// The 32 values of block kb + b of column c that stage_block stages, as loaded (stage_load).
struct StageIn {
  vec4 x[8];
#if NORM_INPUT
  vec4 nw[8];  // the norm weight's
#endif
};
void stage_load(uint c, uint kb, uint b, out StageIn s) {
  [[unroll]] for (uint k = 0; k < 8; ++k) {
    const uint e = 32u * (kb + b) + 4u * k;
    s.x[k] = x4[(args.x_offset + c * args.x_stride + e) >> 2];
#if NORM_INPUT
    s.nw[k] = nw4[e >> 2];
#endif
  }
}
// Staged block c * KCHUNK + b from the loaded values (the raw values' squares added to ss[c]).
void stage_block(uint c, uint b, StageIn s, inout float ss[NUM_COLS]) {
  float sq = 0.0;
#if NORM_INPUT
  [[unroll]] for (uint k = 0; k < 8; ++k) {
    sq += dot(s.x[k], s.x[k]);
    s.x[k] *= s.nw[k];
  }
#endif
  [[unroll]] for (uint cc = 0; cc < NUM_COLS; ++cc)
    if (cc == c) ss[cc] += sq;
  q8_stage_block(c * KCHUNK + b, s.x);
}
// Blocks [kb, kb + kn) of every column into shared memory (times the norm weight with
// NORM_INPUT, the raw values' squares added to ss[c] on the way: each element is staged once, so
// after the last pass the workgroup's ss hold the columns' sums of squares). The whole
// workgroup, between barriers.
void stage_pass(uint kb, uint kn, inout float ss[NUM_COLS]) {
  for (uint i = gl_LocalInvocationIndex; i < NUM_COLS * kn; i += WG_SIZE) {
    const uint c = i / kn, b = i % kn;
    StageIn s;
    stage_load(c, kb, b, s);
    stage_block(c, b, s, ss);
  }
}

// acc[r][c] += (weight row `row + r`, blocks kb + b for this lane's b < kn) . staged column c.
// BLOCKS_PER_ITER (2 or 4) blocks per lane and iteration: that many independent weight loads in
// flight (blocks past the pass repeat the lane's first one and are not added).
void pass_dot(uint row, uint nvalid, uint nb, uint kb, uint kn, uint lane, uint nlanes, inout float acc[NUM_ROWS][NUM_COLS]) {
  for (uint b = lane; b < kn; b += BLOCKS_PER_ITER * nlanes) {
    uint bi[BLOCKS_PER_ITER];
    [[unroll]] for (uint u = 0; u < BLOCKS_PER_ITER; ++u) bi[u] = b + u * nlanes < kn ? b + u * nlanes : b;
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
      if (r < nvalid) {
        Q8W w[BLOCKS_PER_ITER];
        [[unroll]] for (uint u = 0; u < BLOCKS_PER_ITER; ++u) w[u] = q8_load_block(0u, 0u, (row + r) * nb + kb + bi[u]);
        [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
          [[unroll]] for (uint u = 0; u < BLOCKS_PER_ITER; ++u) {
            const uint i = c * KCHUNK + bi[u];
            if (u == 0u || b + u * nlanes < kn) acc[r][c] += q8_dot_loaded(w[u], q8_lo[i], q8_hi[i], q8_ds[i]);
          }
        }
      }
    }
  }
}

#if WAIT_GATE || PRELOAD_FIRST
#if PRELOAD_FIRST
shared uint preload_dep[WG_SIZE / SUBGROUP_SIZE];  // zero; keeps the weight loads ahead of the barrier
#endif
// The staged path with the weights loaded first (one column, one pass: KCHUNK >= the row's
// blocks): the lane's weight blocks (lane + j * nlanes, j < PRELOAD) loaded first; then, with the
// gate, the wait and x staged; with PRELOAD_FIRST (no gate), x staged while they are in flight
// (INPUT_FIRST: its loads issued before theirs). Then the dot products, in pass_dot's order: the
// same bits.
void preloaded_staged_dot(uint row, uint nvalid, uint nb, uint lane, uint nlanes, inout float acc[NUM_ROWS][NUM_COLS],
                          inout float ss[NUM_COLS]) {
#if INPUT_FIRST
  // One column, one pass, nb <= WG_SIZE: invocation b stages block b.
  const bool stager = gl_LocalInvocationIndex < nb;
  StageIn early;
  if (stager) stage_load(0u, 0u, gl_LocalInvocationIndex, early);
#endif
  Q8WRaw w[NUM_ROWS][PRELOAD];  // held across the wait / the staging as loaded
  uint dep = 0u;
  [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
    const uint rr = nvalid == 0u ? 0u : row + min(r, nvalid - 1u);
    [[unroll]] for (uint j = 0; j < PRELOAD; ++j) {
      w[r][j] = q8_load_raw(0u, 0u, rr * nb + min(lane + j * nlanes, nb - 1u));
      dep |= q8_raw_dep(w[r][j]);
    }
  }
#if WAIT_GATE
#if PREFETCH_ROWS
  dep |= prefetch_rows();
#endif
  wait_gate(dep);
  stage_pass(0u, nb, ss);
#elif INPUT_FIRST
  if (stager) stage_block(0u, gl_LocalInvocationIndex, early, ss);
#else
  stage_pass(0u, nb, ss);
#endif
#if !WAIT_GATE
  // The loads are used before the barrier (a zero store: the high half of flags is zero), so the
  // compiler cannot sink them past the staging.
  if (subgroupElect()) preload_dep[gl_SubgroupID] = subgroupOr(dep) & (args.flags & 0xFFFF0000u);
#endif
  barrier();
  [[unroll]] for (uint j = 0; j < PRELOAD; ++j) {
    const uint b = lane + j * nlanes;
    if (b < nb) {
      [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r)
        if (r < nvalid) acc[r][0] += q8_dot_loaded(q8_unpack(w[r][j]), q8_lo[b], q8_hi[b], q8_ds[b]);
    }
  }
}
#endif
#endif  // X_Q8

#if OUT_Q8
#if (OUT_HALVES && ROWS_PER_WG % 16 != 0) || (!OUT_HALVES && ROWS_PER_WG % 32 != 0)
#error "matvec_q8.comp: OUT_Q8 needs whole blocks (OUT_HALVES: half blocks) of rows per workgroup"
#endif
shared float oq_y[ROWS_PER_WG];  // the workgroup's outputs (store)

// The workgroup's rows as int8 blocks of y * the next norm's weight, and the sum of their squares
// in row order (rows past the matrix: none, the host checks rows % 32 == 0). Uniform control flow.
void write_out_q8(uint row0, uint nrows) {
  barrier();  // every team's rows stored
#if OUT_HALVES
  // Half h = (row_begin + row0) / 16 + t: the lo (even h) or hi (odd h) words of block h / 2 and
  // its two components of ds; the other half's workgroup writes the rest.
  for (uint t = gl_LocalInvocationIndex; t < nrows / 16u; t += WG_SIZE) {
    vec4 v[4];
    [[unroll]] for (uint k = 0; k < 4; ++k) {
      const uint r = 16u * t + 4u * k;
      v[k] = vec4(oq_y[r], oq_y[r + 1u], oq_y[r + 2u], oq_y[r + 3u]) * onw4[(args.row_begin + row0 + r) >> 2];
    }
    uvec4 q;
    float d, dsum;
    q8_quantize16(v, q, d, dsum);
    const uint h = (args.row_begin + row0) / 16u + t, blk = h >> 1;
    if ((h & 1u) == 0u) {
      yq[3u * blk] = q;
      yq[3u * blk + 2u].x = floatBitsToUint(d);
      yq[3u * blk + 2u].y = floatBitsToUint(dsum);
    } else {
      yq[3u * blk + 1u] = q;
      yq[3u * blk + 2u].z = floatBitsToUint(dsum);
      yq[3u * blk + 2u].w = floatBitsToUint(d);
    }
  }
#else
  const uint first = (args.row_begin + row0) / 32u;
  for (uint t = gl_LocalInvocationIndex; t < nrows / 32u; t += WG_SIZE) {
    vec4 v[8];
    [[unroll]] for (uint k = 0; k < 8; ++k) {
      const uint r = 32u * t + 4u * k;
      v[k] = vec4(oq_y[r], oq_y[r + 1u], oq_y[r + 2u], oq_y[r + 3u]);
#if OUT_NORM
      v[k] *= onw4[(args.row_begin + row0 + r) >> 2];
#endif
    }
    uvec4 lo, hi;
    vec4 ds;
    q8_quantize32(v, lo, hi, ds);
    yq[3u * (first + t)] = lo;
    yq[3u * (first + t) + 1u] = hi;
    yq[3u * (first + t) + 2u] = floatBitsToUint(ds);
  }
#endif
#if OUT_NORM
  if (gl_LocalInvocationIndex == 0u) {
    float ss = 0.0;
    for (uint r = 0u; r < nrows; ++r) ss += oq_y[r] * oq_y[r];
    y_ss[(args.row_begin + row0) / uint(ROWS_PER_WG)] = ss;
  }
#endif
}
#endif

#if X_SS
// 1 / rms(x) from the producer's sums of squares, added in order.
float x_inv_rms() {
  float s = 0.0;
  for (uint p = 0u; p < uint(X_SS_PARTS); ++p) s += x_ss[p];
  return inversesqrt(s / float(args.cols) + args.norm_eps);
}
#endif

// y row `row` (of the bound rows) of column c; row0: the workgroup's first row (the fold's copy).
void store(uint row, uint c, float v, uint row0) {
  const uint i = c * args.y_stride + args.row_begin + row;
#if WAIT_GATE && X_Q8 && !GATE_LATE
  const float r = (args.flags & TS_MATVEC_ACCUMULATE) != 0u ? gate_y[row - row0] + v : v;  // one column
#else
  const float r = (args.flags & TS_MATVEC_ACCUMULATE) != 0u ? Y_BEFORE(i) + v : v;
#endif
  y[i] = r;
#if ROUTER_FOLD
  rf_x[row - row0] = r;
#endif
#if OUT_Q8
  oq_y[row - row0] = r;
#endif
}

#if !USE_SUBGROUP
shared float team_partial[WG_SIZE];
#endif
#if KSPLIT > 1
shared float ks_partial[TEAMS * KSPLIT][NUM_ROWS];  // each subgroup's row sums
#endif

void main() {
  // NORM_INPUT: 1/rms of every column scales the finished dot products, so the sums of squares are
  // gathered while staging and reduced after the main loop: no load round trip and no barrier
  // of theirs precedes the weight loads.
  // (Measured against reducing them first, session 9: W_qk -0.2 µs, the token unchanged.)
  float scale[NUM_COLS];
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) scale[c] = 0.0;
#if GATE_STATS && GATE_CLOCK
  gate_t_start = clockRealtimeEXT();
#endif
  const uint row0 = linear_workgroup_id() * ROWS_PER_WG;
  if (row0 >= args.rows) return;  // uniform per workgroup
  const uint row_end = min(row0 + ROWS_PER_WG, args.rows);

#if USE_SUBGROUP
  const uint team = gl_SubgroupID / KSPLIT;
  const uint lane = (gl_SubgroupID % KSPLIT) * gl_SubgroupSize + gl_SubgroupInvocationID, nlanes = KSPLIT * gl_SubgroupSize;
#else
  const uint team = gl_LocalInvocationIndex / THREADS_PER_ROW, lane = gl_LocalInvocationIndex % THREADS_PER_ROW;
  const uint nlanes = THREADS_PER_ROW;
#endif
  const uint row = row0 + team * NUM_ROWS;
  const uint nvalid = row < row_end ? min(NUM_ROWS, row_end - row) : 0u;
  const uint nb = args.cols / 32u;

  float acc[NUM_ROWS][NUM_COLS];
  [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[r][c] = 0.0;
  }
#if WAIT_GATE && GATE_LATE
  wait_gate(0u);  // nothing loaded ahead: the wait, then the ungated kernel
#endif
#if WAIT_GATE && X_Q8 && !GATE_LATE
  gated_dot(row, nvalid, nb, lane, nlanes, row0, row_end, acc);
#elif (WAIT_GATE && !GATE_LATE) || PRELOAD_FIRST
  preloaded_staged_dot(row, nvalid, nb, lane, nlanes, acc, scale);
#elif X_Q8
  global_dot(row, nvalid, nb, lane, nlanes, acc);
#else
  for (uint kb = 0; kb < nb; kb += KCHUNK) {  // uniform
    const uint kn = min(uint(KCHUNK), nb - kb);
    barrier();  // the previous pass is done with the staged blocks
    stage_pass(kb, kn, scale);
    barrier();
    pass_dot(row, nvalid, nb, kb, kn, lane, nlanes, acc);
  }
#endif
#if NORM_INPUT
  workgroup_sum_cols(scale);
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) scale[c] = inversesqrt(scale[c] / float(args.cols) + args.norm_eps);
#elif X_SS
  scale[0] = x_inv_rms();  // after the dots: with a gate, the sums are the producer's too
#else
  [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) scale[c] = 1.0;
#endif

#if USE_SUBGROUP
  [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) acc[r][c] = subgroupAdd(acc[r][c]);
  }
#if KSPLIT > 1
  // The team's KSPLIT sums, added in order by its first subgroup.
  if (subgroupElect()) {
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) ks_partial[gl_SubgroupID][r] = acc[r][0];
  }
  barrier();
  if (gl_SubgroupID % KSPLIT == 0u) {
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
      float s = ks_partial[gl_SubgroupID][r];
      for (uint p = 1; p < KSPLIT; ++p) s += ks_partial[gl_SubgroupID + p][r];
      acc[r][0] = s;
    }
  }
  if (gl_SubgroupID % KSPLIT == 0u && subgroupElect()) {
#else
  if (subgroupElect()) {
#endif
    [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
      if (r < nvalid) {
        [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) store(row + r, c, acc[r][c] * scale[c], row0);
      }
    }
  }
#else
  // Each (row, column) sum through shared memory in turn.
  const uint lid = gl_LocalInvocationIndex;
  [[unroll]] for (uint r = 0; r < NUM_ROWS; ++r) {
    [[unroll]] for (uint c = 0; c < NUM_COLS; ++c) {
      barrier();
      team_partial[lid] = acc[r][c];
      barrier();
      [[unroll]] for (uint s = THREADS_PER_ROW / 2; s > 0; s >>= 1) {
        if (lane < s) team_partial[lid] += team_partial[lid + s];
        barrier();
      }
      if (lane == 0u && r < nvalid) store(row + r, c, team_partial[lid] * scale[c], row0);
    }
  }
#endif
#if ROUTER_FOLD
  router_partial(args.row_begin + row0, row_end - row0);
#endif
#if GATE_STATS && GATE_CLOCK
  if (gl_LocalInvocationIndex == 0u) gate_time(3u, clockRealtimeEXT());
#endif
#if OUT_Q8
  write_out_q8(row0, row_end - row0);
#endif
#if SIGNAL_GATE
  gate_signal(uint(SIGNAL_WORD), 1u);
#endif
}
