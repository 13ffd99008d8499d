// MatvecOp: y = W x (+ y) on the GPU (shaders/matvec.comp).
//   W: MatrixRef, SPLIT1 (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K) or plain (F32 F16 BF16);
//   x, y: f32; f32 accumulation. Any rows; any cols that are a multiple of the type's block.
// Options: `batch` x vectors at once (weights read once for all; prefill), `accumulate`
// (y += W x: residual add fused), `norm_weight` (x replaced by RMSNorm(x) * norm_weight: the
// norm fused into the matvec, each workgroup recomputing sum(x^2)).
//
//   vk::MatvecOp op;
//   op.w = {&weights, offset, GgmlType::Q4_0, vk::WeightLayout::Split1, rows, cols};
//   op.x = x.whole(); op.y = y.whole();
//   op.record(rec);            // one dispatch (one per row chunk where bindings must be split)
//   op.bytes();                // bytes moved, for the profiler
//
// Router fold (docs/ARCHITECTURE.md "Router fold"): with `router_fold` set, the matvec that adds
// into the residual stream x before a MoE FFN also adds partial router logits and sum(x^2) of its
// new rows into 64-bit fixed-point accumulators (shaders/router_partial.glsl); MoeGateUpOp with
// `fold_acc` routes from them. Needs 64-bit integer buffer atomics (router_fold_supported).
#pragma once
#include <cstdint>
#include <string>

#include "runtime/vulkan/gate.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/split1.h"

namespace tessera::vk {

// The int8-activation path (shaders/q8_activations.glsl) serves weights of type `t` on this
// device: Q4_0 / Q8_0 / Q4_K / Q6_K SPLIT1 weights on a device with shaderIntegerDotProduct.
bool q8_activations_type(Context& ctx, GgmlType t);
// ... and a kernel that stages its whole input of `cols` elements at once (48 bytes per 32
// elements) finds room for it in shared memory (the MoE kernels; matvec_q8 stages in passes).
bool q8_activations_usable(Context& ctx, GgmlType t, uint64_t cols);
// Q8_BLOCKS for `cols` input elements (rounded up so that few pipeline variants exist).
uint32_t q8_blocks_define(uint64_t cols);

// Work split of the one-vector int8 matvec (matvec_q8.comp, decode); 0 = automatic.
struct MatvecTuning {
  uint32_t teams = 0;  // subgroups per workgroup, 1..16; auto: 16 for <= 2048 rows, else 4
  uint32_t rows = 0;   // rows per subgroup, 1..4; auto: 1 for <= 2048 rows, else 4 for rows of <= 2
                       // blocks per lane, else 2, halved until the matrix gives 256 workgroups
  // Several x vectors (prefill): subgroups per workgroup 1..16 (auto 8), rows per subgroup 1..4
  // (auto 4; 2 above 8 vectors).
  uint32_t batch_teams = 0, batch_rows = 0;
  // The int8-activation kernel's weight blocks per lane and loop iteration (2 or 4; auto 2).
  uint32_t blocks_per_iter = 0;
  // Decode, int8 kernel with subgroups: subgroups per row (1, 2 or 4; auto: 2 where x comes
  // pre-quantized (MatvecOp::x_q8), else 1) for rows that take a lane more than two loop
  // iterations (W_vo: 10240 values); a workgroup then holds teams / ksplit rows (x nrows).
  uint32_t ksplit = 0;
  // Early start (MatvecOp::gate): how x's int8 blocks are read after the gate opens, 1..3 - 1
  // (matvec_q8.comp GATE_X: 0 each lane coherent from L2, 1 copied once per workgroup into shared
  // memory, 2 each lane plain); 0: auto (plain, kernels_matvec.cpp kAutoGateX).
  uint32_t gate_x = 0;
  // Early start: 1 waits first and loads nothing ahead (matvec_q8.comp GATE_LATE: the barrier's
  // relaunch saved without a weight stream beside the producer); 0 loads the weights first.
  uint32_t gate_late = 0;
  // Decode, staged x in one pass: each lane's weight blocks loaded before x is staged
  // (matvec_q8.comp PRELOAD_FIRST) where a lane holds at most this many (rows x blocks); 0 off;
  // -1 auto: 2 (q_a / kv_a; H100, GLM tg128 +1.3-2.5 % at depth 0, H200 +3.5-5 %; PERFORMANCE.md
  // session 11).
  int32_t preload_blocks = -1;
  // With preload_blocks: the values each invocation stages (x and the norm weight) loaded before
  // the weight blocks (matvec_q8.comp INPUT_FIRST). H200, GLM-4.7-Flash q_a / kv_a: Q4_0 tg128
  // +0.7 %, depth 4096 +1-1.6 %, Q4_K_M +1.9 % (session 39; the decode step turns it off beside a
  // stage-1 matvec that stages after its weights, GpuModel::record_step).
  bool input_first = true;
  // Early start on int8 x, weights loaded first: of each lane's blocks per row, this many before
  // the wait and the rest after it (matvec_q8.comp PRELOAD_EARLY); 0: all before. The staged-x
  // kernel always loads them all before.
  uint32_t preload_early = 0;
};

// The router fold's inputs to the matvec that writes x (MatvecOp::router_fold).
struct RouterFold {
  MatrixRef router;         // ffn_gate_inp [E][rows of the matvec], plain F32/F16/BF16, E <= 256
  BufferSlice norm_weight;  // ffn_norm, f32 [rows of the matvec]
  BufferSlice acc;          // int64 accumulators [router_fold_acc_bytes(E)], zero before the matvec
  bool enabled() const { return acc.buffer != VK_NULL_HANDLE; }
};
// The device runs the fold's kernels: 64-bit integer buffer atomics enabled (shaderInt64 and
// shaderBufferInt64Atomics; ContextOptions::no_int64_atomics turns them off).
bool router_fold_supported(Context& ctx);
// Bytes of one layer's accumulators: TS_ROUTER_FOLD_SLOTS copies of E + 1 int64 values.
uint64_t router_fold_acc_bytes(uint32_t n_expert);

struct MatvecOp {
  MatrixRef w;                 // W [rows][cols]
  BufferSlice x;               // x vector c, element k at float x_offset + c * x_stride + k
  BufferSlice y;               // y vector c, row r at float c * y_stride + r
  uint32_t batch = 1;          // x vectors, 1..max_batch() (8; 16 on the int8-activation path)
  uint32_t x_offset = 0;       // floats (block types: multiple of 4)
  uint32_t x_stride = 0;       // floats between x vectors; 0 = cols (block types: multiple of 4)
  uint32_t y_stride = 0;       // floats between y vectors; 0 = rows
  bool accumulate = false;     // y += W x
  bool int8_activations = true;  // where usable (q8_activations_type): x quantized to int8 per
                                 // block of 32, integer dot products (shaders/q8_activations.glsl)
  BufferSlice norm_weight;     // set (non-null buffer): x := x * norm_weight / rms(x); cols floats
  float norm_eps = 1e-6f;      // with norm_weight
  std::string label;           // profile label; empty = pipeline name, e.g. "matvec.q4_0"
  uint64_t max_binding_bytes = 0;  // 0 = device maxStorageBufferRange (lower: tests of chunking)
  MatvecTuning tuning;             // the int8 path's work split (ignored on the f32 path)
  RouterFold router_fold;          // set: the router fold's epilogue (batch 1, accumulate, rows =
                                   // the router's columns)
  // Set: the same x already quantized (int8 blocks of 32, 3 uvec4 each, q8_quantize.glsl; block
  // x_offset / 32 + b = elements 32b..), read instead of x where the int8 kernel runs one column
  // without norm_weight: nothing is staged (matvec_q8.comp X_Q8). x stays bound-checked and is the
  // input of the f32 path. Producer: AttentionOp::record_merge's olat_q8.
  BufferSlice x_q8;
  // Set (with x_q8, on the int8 kernel only): W is H = rows / x_head_rows stacked matrices and x
  // holds H vectors of cols values; row r reads vector r / x_head_rows (matvec_q8.comp
  // X_HEAD_ROWS): the factored value path's o_h = Vb_h olat_h for every head in one dispatch.
  // record() refuses it where the int8 kernel does not run (head_x_supported()).
  uint32_t x_head_rows = 0;
  bool head_x_supported(Context& ctx) const;
  // Early start (docs/DECODE.md "Early start"; matvec_q8.comp WAIT_GATE): set, the int8 kernel is
  // recorded with no barrier after the dispatch that writes x (or x_q8), which counts the gate's
  // word up as its workgroups finish. Each workgroup loads its weight blocks, waits until the
  // word reaches gate.target, then reads x (a wait that gives up writes gate.error). Only where
  // gate_supported(); record() refuses it elsewhere.
  GateWait gate;
  // Set (kGateStatsBytes, zero before the dispatch; with gate): diagnostics the gated kernel adds
  // to: two counters, workgroups whose first poll found the gate closed (they ran beside the
  // producer) and all of them; then, where the device has a shader clock and 64-bit atomics,
  // four 64-bit device times (ns): ~first start, ~first open, last open, last end (max of each;
  // `~` for the minima). matvec_q8.comp GATE_STATS.
  BufferSlice gate_stats;
  static constexpr uint64_t kGateStatsBytes = 48;
  // The early start serves this op on this device: the int8 kernel for one vector with subgroups,
  // x_q8 or x staged in one pass (rows of at most 512 blocks, one subgroup per row), and at most
  // kMaxGatePreload weight blocks per lane to hold while waiting.
  bool gate_supported(Context& ctx) const;
  static constexpr uint32_t kMaxGatePreload = 8;
  // Set: this matvec also writes the next matvec's pre-quantized input (matvec_q8.comp OUT_Q8):
  // y times out_q8_norm (rows floats: the next matvec's input norm) as int8 blocks (3 uvec4 per 32
  // rows, q8_quantize.glsl) into out_q8, and per workgroup the sum of its rows' squares into
  // out_ss (out_parts() floats). The next matvec takes them as x_q8 and x_ss (its norm applied
  // without staging). Without out_q8_norm (and out_ss): y's blocks as they are (OUT_NORM 0), for a
  // next matvec without a norm. Only where out_q8_supported(); its workgroups then hold 32 rows
  // (16 with out_q8_halves).
  BufferSlice out_q8, out_q8_norm, out_ss;
  bool out_q8_supported(Context& ctx) const;
  uint32_t out_parts(Context& ctx) const;
  // With out_q8 and out_q8_norm: the blocks written as halves of 16 rows, each with its own scale
  // (q8_quantize.glsl "Halves"; matvec_q8.comp OUT_HALVES), so the workgroups need only 16 rows
  // (q_a keeps its 48 workgroups of 16). The consumer must read them with x_q8_halves.
  bool out_q8_halves = false;
  // With x_q8: its blocks were written as halves (a producer's out_q8_halves; X_HALVES).
  bool x_q8_halves = false;
  // Set with x_q8: x_q8 holds x times the norm weight, quantized (a producer's out_q8), and x_ss
  // its x_ss_parts sums of squares; the dot products are scaled by 1 / rms(x) (norm_eps).
  BufferSlice x_ss;
  uint32_t x_ss_parts = 0;
  // Set: this matvec opens a gate (matvec_q8.comp SIGNAL_GATE): each workgroup adds 1 to word
  // signal_word of `signal` once its y rows are stored, so the word reaches signal_count(). A
  // consumer recorded after it with no barrier waits on that (W_qk on q_a). Only where
  // signal_supported() (the int8 kernel, one vector); record() refuses it elsewhere.
  BufferSlice signal;
  uint32_t signal_word = 0;
  bool signal_supported(Context& ctx) const;
  uint32_t signal_count(Context& ctx) const;
  // Set (with accumulate): y = residual + W x, the residual read from this binding instead of y,
  // which is only written (matvec_q8.comp RESIDUAL_IN): the decode step's x in two buffers, so
  // that the kernels reading x after it never find lines of x that others read before it in
  // their SMs' L1 (GpuModelOptions::early_qk; session 34). Only where residual_supported() (the
  // int8 kernel, one vector); record() refuses it elsewhere.
  BufferSlice residual;
  bool residual_supported(Context& ctx) const;
  // Set (with gate, the weights loaded before the wait: row_prefetch_supported()): the dispatch
  // also reads one word of every 32-byte sector of the cache rows [0, min(pos, max_rows)) before
  // its wait, so that the attention after it finds them in the L2 (matvec_q8.comp PREFETCH_ROWS;
  // session 35): `rows` the layer's latent cache (row_bytes a row, a multiple of 32), pos = word
  // pos_word of `step`. Coherent loads (the L2 only) unless l1: plain loads, which also fill the
  // L1 of the SMs they run on (the form of sessions 35-36; session 37 traced a race to it).
  // record() refuses it elsewhere.
  struct RowPrefetch {
    BufferSlice rows, step;
    uint32_t pos_word = 0, row_bytes = 0, max_rows = 0;
    bool l1 = false;
    bool enabled() const { return rows.buffer != VK_NULL_HANDLE; }
  };
  RowPrefetch row_prefetch;
  bool row_prefetch_supported(Context& ctx) const;

  // Whether the decode kernel loads its weight blocks before staging x (MatvecTuning::preload_blocks,
  // matvec_q8.comp PRELOAD_FIRST) on this device.
  bool preloads_first(Context& ctx) const;
  // The most x vectors one dispatch takes for this matrix on this device.
  uint32_t max_batch(Context& ctx) const;
  // Bytes moved: weights once, x (batch vectors), y written (and y or the residual read when
  // accumulating), norm weight.
  uint64_t bytes() const;
  // Records the dispatches (no barrier). Validates shapes, strides and buffer sizes first and
  // throws Error(Runtime) naming the label and the problem.
  void record(CommandRecorder& rec) const;
  // Pipeline name for this op's variant, e.g. "matvec.q4_k.b4.norm" (with a device: also
  // ".q8act" when the int8-activation path will run; ".rfold" with the router fold).
  std::string kernel_name(Context* ctx = nullptr) const;
};

}  // namespace tessera::vk
