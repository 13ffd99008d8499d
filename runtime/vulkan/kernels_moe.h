// Router, routing and feed-forward kernels of a decoder block (docs/DECODE.md D8-D10 and
// the dense layer; math: shared/spec/forward.md §5). Expert weights are read straight from a
// MOE_TILE1 tile (docs/FORMAT.md §6.3, format/tsr_layout.h MoeTileGeometry). Every op is a plain
// description: record() adds its dispatch(es) to a recording, bytes() is what one call moves
// (the profiler's GB/s). Routing runs on the GPU: no host round trip, no gather copy, no
// separate top-k dispatch.
//
// API — one MoE block (the decode graph records this once per block, barriers as shown):
//
//   RouterOp router;                       // D8: shaders/router.comp, one dispatch
//   router.w      = {&weights, off, GgmlType::F32, WeightLayout::Plain, E, n_embd};  // ffn_gate_inp
//   router.x      = x;          // f32 [n_embd]   residual stream (read)
//   router.norm_weight = ffn_norm;              // f32 [n_embd]
//   router.eps    = cfg.eps;
//   router.routing = MoeRouting::from_config(cfg);
//   router.bias   = exp_probs_b;  // f32 [E], or {} when the model has none
//   router.logits = logits;     // f32 [E]        out: W_router . h2
//   router.h2     = h2;         // f32 [n_embd]   out: RMSNorm(x; ffn_norm), the experts' input
//   router.route  = route;      // uint32 [2K+1]  out: (expert id, f32 weight bits) per routed slot,
//                               //   best first, then an arrival counter: zero it ONCE after
//                               //   allocation; the kernel leaves it at 0 (scratch, per block or shared)
//   router.record(rec);  rec.barrier();
//
//   MoeGateUpOp gu;                        // D9: shaders/moe_gateup.comp
//   gu.tile   = {&weights, tile_offset, tile_geometry};   // blk.L.ffn_moe_tile
//   gu.n_used = K;
//   gu.h2 = h2; gu.route = route;
//   gu.h  = h;             // f32 [moe_h_floats(g, K)]: slot k < K at k*h_stride, shared slot at K*h_stride
//   gu.record(rec);  rec.barrier();
//
//   MoeDownOp down;                        // D10: shaders/moe_down.comp
//   down.tile = gu.tile; down.n_used = K; down.route = route;
//   down.h = h;  down.x = x;   // x[r] += sum_k w_k down_{e_k}[r] . h[k] + down_shared[r] . h[K]
//   down.record(rec);  rec.barrier();
//
//   RouteOp: the routing alone from given logits (one workgroup), e.g. when the logits come
//   from elsewhere; same route output.
//
//   Router fold (docs/ARCHITECTURE.md): no RouterOp; the matvec that writes x carries
//   MatvecOp::router_fold (partial logits into int64 accumulators), then the gate-up takes
//   gu.fold_acc / gu.x / gu.norm_weight / gu.routing / gu.bias / gu.logits and writes gu.route,
//   which the down reads as above.
//
//   Without a route buffer (router.route, gu.route, down.route left empty) every gate-up and
//   down workgroup computes the routing itself from the logits: set gu.routing / gu.logits /
//   gu.bias (same for down) instead. Same results. On an H200 (GLM shapes, Q4_0) the block's
//   wall time is about the same either way (62.7 vs 64.1 us): the router's last workgroup takes
//   ~4 us for the routing, the two expert kernels save about as much.
//
// API — the dense FFN block (layer < leading_dense_block_count): the same kernels, shared-slot only.
//
//   DenseGateUpOp dg;  dg.gate = ffn_gate; dg.up = ffn_up;   // MatrixRefs in ONE buffer (one binding)
//   dg.x = x; dg.norm_weight = ffn_norm; dg.eps = eps; dg.h = h;   // h[i] = silu(gate_i.xn)*(up_i.xn)
//   dg.record(rec);  rec.barrier();
//   DenseDownOp dd;  dd.down = ffn_down; dd.h = h; dd.x = x;      // x += W_down . h
//   dd.record(rec);  rec.barrier();
//   (On an H200 the norm fused into the dense gate-up costs ~18 us more than reading an already
//   normalized input (dg.norm_weight left empty), so an RmsNormOp dispatch before it is likely
//   the faster choice; not measured end to end.)
//
// Dispatch counts: the gate-up is one dispatch and the down one dispatch when the tile fits one
// binding (maxStorageBufferRange: always on a 4 GiB-range GPU) and the shared slot has the routed
// slots' types. Otherwise the op records several dispatches over slot ranges / per type: gate-up
// parts need no barrier between them (disjoint outputs); down parts all add into x, so the op
// records a barrier between consecutive parts (a Q4_K_M DeepSeek-V2-Lite tile, whose routed and
// shared down types differ, costs one extra barrier per block).
//
// Routing (routing.glsl, in the router's last workgroup): probs = sigmoid/softmax(logits), top-K
// of probs + bias (ties: lower expert id), weights = chosen probs, normalized
// (expert_weights_norm) and scaled (expert_weights_scale unless 0/1). E <= 256, K <= 16.
#pragma once
#include <cstdint>
#include <string>

#include "format/model_config.h"
#include "format/tsr_layout.h"
#include "runtime/vulkan/gate.h"
#include "runtime/vulkan/recorder.h"
#include "runtime/vulkan/split1.h"

namespace tessera::vk {

// The routing hyperparameters of a MoE block.
struct MoeRouting {
  uint32_t n_used = 0;                     // K experts per token
  GatingFunc gating = GatingFunc::Softmax;  // Softmax or Sigmoid
  bool norm_weights = false;               // expert_weights_norm
  float weights_scale = 0.f;               // expert_weights_scale (applied unless 0 or 1)

  static MoeRouting from_config(const ModelConfig& c);
};

// Where a MOE_TILE1 tile sits: buffer, byte offset of the tile (a multiple of 256 and of the
// device's minStorageBufferOffsetAlignment), and its geometry from the .tsr directory.
struct MoeTileRef {
  const Buffer* buffer = nullptr;
  uint64_t offset = 0;
  MoeTileGeometry geometry;
};

constexpr uint32_t kQ8GateUpLoop = 9;  // MoeTuning::q8_gateup_outs: the two-output loop
constexpr uint32_t kQ8DownFirstOff = 9;  // MoeTuning::down_first_rows: no loads first

// Work-split choices of the gate-up / down kernels; 0 = automatic. On an H200 the variants tried
// (bench test MoeBench.*) were within 5% of each other: the kernels are latency-bound, see the
// report in tests/vulkan/test_moe_bench.cpp.
struct MoeTuning {
  uint32_t unroll = 0;        // weight units per loop iteration, 1..2; auto 1
  uint32_t gateup_teams = 0;  // gate-up outputs per workgroup (one per subgroup/team), 1..16; auto 4
  uint32_t down_rows = 0;     // down rows per workgroup (one team per slot), 1..16; auto 2
  // The int8-activation kernels (decode):
  uint32_t q8_gateup_teams = 0;  // subgroups per gate-up workgroup (32 outputs each), 1..32; auto 16 early-started, 8 behind a barrier
  // Outputs a gate-up subgroup takes per pass, all their weight loads issued first (moe_gateup.comp
  // GU_OUTS), 1..8; 9 (kQ8GateUpLoop): the loop of two outputs, one round trip per unit; auto (0):
  // 2 for Q4_0 experts (H200 tg128 +0.5 %), the loop otherwise (Q4_K_M lost 7 % with 2; session
  // 31). With 1..8 set the automatic teams are 32 / q8_gateup_outs. Subgroup path only.
  uint32_t q8_gateup_outs = 0;
  uint32_t q8_down_rows = 0;     // down rows per workgroup, 1..64; auto 4 (early-started: 2, K-quants 1)
  // The router fold's gate-up reads its input, the accumulators and the expert bias in one phase
  // (moe_gateup.comp FOLD_OVERLAP): 1 on, 2 off; auto (0): on (H100, GLM: gate-up 17.5 -> 14.9
  // us, tg128 294.1 -> 299.6 / 298.1 tok/s; PERFORMANCE.md).
  uint32_t q8_fold_overlap = 0;
  // The int8 gate-up's routing ranks every expert across the workgroup instead of subgroup 0's K
  // rounds of reductions (routing.glsl ROUTE_RANKS; session 32): 1 on, 2 off; auto (0): on for
  // sigmoid gating (GLM-4.7-Flash +1.5-1.7 %), off for softmax (DeepSeek-V2-Lite: a tie).
  uint32_t route_ranks = 0;
  // The int8 down behind a barrier loads every weight block of N rows before their first product
  // (moe_down.comp DOWN_FIRST; session 32): N = 1, 2 or 4; 9 (kQ8DownFirstOff): passes of 4 rows, a
  // block loaded where it is used; auto (0): q8_down_first().
  uint32_t down_first_rows = 0;
  // The early-started int8 down (32-element block types): a workgroup whose first poll finds every
  // h written loads hq beside its weights instead of after a second wait (moe_down.comp
  // DOWN_LATE; H100 +2.4 %). K-quant downs always wait (their Q4_K_M grid lost 8 % with it).
  bool down_late = true;
  // The early-started gate-up loads the norm weight and the expert bias into shared memory before
  // its wait (moe_gateup.comp GATEUP_CONSTS; session 16).
  bool gateup_consts = true;
  // The router fold's gate-up (overlapped prologue, GU_OUTS in one pass, Q4_0 / Q8_0: by default
  // Q4_0, the type that takes GU_OUTS) issues its weight loads before it stages its input, spread
  // over 8 invocations a block (moe_gateup.comp STAGE_LATE; session 38: H200, GLM-4.7-Flash Q4_0
  // tg128 +0.35 %, +1.2-1.45 % at 1024-4096 positions).
  bool gateup_stage_late = true;
  // With gateup_stage_late: each invocation's word of the input loaded beside the accumulators'
  // sums, before the routing and the weight loads (moe_gateup.comp GATEUP_INPUT_FIRST; session 39:
  // H200, GLM-4.7-Flash Q4_0 tg128 +0.13 %, depth 4096 +0.2 %, two pairs each).
  bool gateup_input_first = true;
};

// Floats between consecutive slots of the h buffer: max(w_routed, w_shared) rounded up to 4.
uint32_t moe_h_stride(const MoeTileGeometry& g);
// Floats of the h buffer for K routed slots plus the shared slot.
uint64_t moe_h_floats(const MoeTileGeometry& g, uint32_t n_used);
// The int8-activation path of the expert kernels (shaders/q8_activations.glsl): gate-up quantizes
// its input per workgroup and writes h also as int8 blocks (hq), which the down kernel reads.
// Usable when every gate-up and down type of the tile is Q4_0 / Q8_0 / Q4_K / Q6_K, widths are
// multiples of 32 and the device has integer dot products. Set MoeGateUpOp::hq and MoeDownOp::hq
// (same buffer, moe_hq_bytes) to use it; leave both empty for the f32 path.
bool moe_q8_usable(Context& ctx, const MoeTileGeometry& g, uint32_t n_used);
uint64_t moe_hq_bytes(const MoeTileGeometry& g, uint32_t n_used);
// The same for the dense FFN (DenseGateUpOp::hq, DenseDownOp::hq; dense_hq_bytes(F)).
bool dense_q8_usable(Context& ctx, const MatrixRef& gate, const MatrixRef& down);
uint64_t dense_hq_bytes(uint32_t width);
// Bytes of the route buffer for K experts: K (id, weight) pairs and the arrival counter.
inline uint64_t moe_route_bytes(uint32_t n_used) { return (2ull * n_used + 1) * 4; }

// D8: logits = W_router . RMSNorm(x; norm_weight), h2 = RMSNorm(x; norm_weight), and the routing.
struct RouterOp {
  MatrixRef w;              // ffn_gate_inp [E][n_embd], plain F32 (F16/BF16 accepted)
  BufferSlice x;            // f32 [n_embd]
  BufferSlice norm_weight;  // f32 [n_embd] ffn_norm
  float eps = 1e-6f;
  MoeRouting routing;
  BufferSlice bias;         // f32 [E] exp_probs_b; empty = no bias
  BufferSlice logits;       // f32 [E] (out)
  BufferSlice h2;           // f32 [n_embd] (out)
  BufferSlice route;        // uint32 [2K+1] (out; counter word zeroed once); empty = logits only
  std::string label;        // empty = "router.<type>"

  uint64_t bytes() const;   // weights, x, norm weight, bias read; logits, h2, route written
  // Records one dispatch (no barrier). Throws Error(Runtime) naming the label and the problem
  // (shape, layout, buffer sizes, E > 256, K out of range).
  void record(CommandRecorder& rec) const;
};

// The routing alone: route = top-K of the given logits (one workgroup).
struct RouteOp {
  uint32_t n_expert = 0;
  MoeRouting routing;
  BufferSlice logits;  // f32 [E]
  BufferSlice bias;    // f32 [E] or empty
  BufferSlice route;   // uint32 [2K+1] (out; counter word zeroed once)
  std::string label;   // empty = "route"

  uint64_t bytes() const;
  void record(CommandRecorder& rec) const;
};

// D9: h[k][i] = silu(gate_{e_k,i} . h2) * (up_{e_k,i} . h2) for the K routed slots, and the same
// with the shared slot's weights into h[K] (when the tile has one).
struct MoeGateUpOp {
  MoeTileRef tile;
  uint32_t n_used = 0;   // K (0: routing.n_used)
  BufferSlice h2;        // f32 [n_embd] (RouterOp::h2; not read with fold_acc)
  BufferSlice route;     // uint32 [2K] (RouterOp::route); empty: the routing below, per workgroup
  MoeRouting routing;    // routing per workgroup only: its parameters,
  BufferSlice logits;    //   f32 [E] router logits,
  BufferSlice bias;      //   f32 [E] exp_probs_b or empty
  BufferSlice h;         // f32 [moe_h_floats] (out)
  BufferSlice hq;        // int8 blocks of h [moe_hq_bytes] (out); set: the int8-activation path
  std::string label;     // empty = "moe_gateup.<type>"
  uint64_t max_binding_bytes = 0;  // 0 = device maxStorageBufferRange (lower: tests of slot ranges)
  MoeTuning tuning;
  // Router fold (MatvecOp::router_fold wrote the accumulators; docs/ARCHITECTURE.md): set
  // `fold_acc` and the input is RMSNorm(x; norm_weight) with 1/rms from the accumulators (h2 is
  // not read), every routed workgroup routes from the accumulated logits (`routing`, `bias`), and
  // workgroup 0 writes the K (expert, weight) pairs into `route` (out, for MoeDownOp) and the E
  // logits into `logits` (out). Needs router_fold_supported().
  BufferSlice fold_acc;     // int64 [router_fold_acc_bytes(E)]
  BufferSlice x;            // f32 [n_embd] residual stream
  BufferSlice norm_weight;  // f32 [n_embd] ffn_norm
  float eps = 1e-6f;
  // The down projection fused in (no MoeDownOp after it; moe_fused_down_supported() says where):
  // each workgroup adds its outputs' share of the down products into `down_acc` (zero before and
  // after the dispatch), the last one adds the sums to x. Needs the router fold and hq.
  BufferSlice down_acc;     // int64 [n_embd] + arrival counter [moe_down_acc_bytes(n_embd)]
  // Early start of the down (docs/DECODE.md "Early start"; moe_gateup.comp GATE_SIGNAL): set (two
  // words, zero before the dispatch), workgroup 0 adds 1 to word 0 once the route is written and
  // every workgroup adds 1 to word 1 once its h is: MoeDownOp::gate, target gate_h_target().
  // Only where gate_supported().
  BufferSlice gate;
  bool gate_supported(Context& ctx) const;  // the router fold, int8 h, no fused down, one dispatch
  uint32_t gate_h_target(Context& ctx) const;  // the workgroups of the dispatch
  // Early start of this dispatch (with `gate`; moe_gateup.comp WAIT_GATE): recorded with no barrier
  // after the matvec that writes x and the fold's accumulators, whose workgroups count wait's word
  // up to its target; every workgroup waits for it first.
  GateWait wait;

  // Bytes of one call: K routed + the shared gate-up matrices, h2, route, h written (with
  // down_acc: + the down matrices and x).
  uint64_t bytes() const;
  // Records the dispatch(es), no barrier at the end. Validates first (Error(Runtime)).
  void record(CommandRecorder& rec) const;
};

// Where MoeGateUpOp::down_acc may be set: the int8 path with subgroups and 64-bit atomics, the
// whole tile in one binding (max_binding_bytes as MoeGateUpOp's), every part of one weight type.
bool moe_fused_down_supported(Context& ctx, const MoeTileGeometry& g, uint32_t n_used, uint64_t max_binding_bytes = 0);
uint64_t moe_down_acc_bytes(uint64_t n_embd);  // int64 [n_embd] + the counter, rounded to 16

// D10: x[r] += sum_k w_k (down_{e_k} row r . h[k]) + (down_shared row r . h[K]).
struct MoeDownOp {
  MoeTileRef tile;
  uint32_t n_used = 0;  // K (0: routing.n_used)
  BufferSlice h;        // f32 [moe_h_floats] (MoeGateUpOp::h)
  BufferSlice route;    // uint32 [2K]; empty: the routing below, per workgroup
  MoeRouting routing;   // routing per workgroup only (as MoeGateUpOp)
  BufferSlice logits;
  BufferSlice bias;
  BufferSlice x;        // f32 [n_embd] (in/out)
  BufferSlice hq;       // int8 blocks of h written by MoeGateUpOp (set on both, or on neither)
  std::string label;    // empty = "moe_down.<type>"
  uint64_t max_binding_bytes = 0;
  MoeTuning tuning;
  // Early start (MoeGateUpOp::gate): recorded with no barrier after the gate-up, waits on its
  // gate words (route, then gate_h_target arrivals); a wait that gives up writes 1 and the value
  // it saw to gate_error (8 bytes, host-visible). Only where gate_supported().
  BufferSlice gate;
  uint32_t gate_h_target = 0;
  BufferSlice gate_error;
  // With gate: also arrive on gate word 2 once a workgroup's rows of x are written, through group
  // words (TS_DOWN_GATE_WORDS words then; moe_args.h), for the next layer's first matvecs
  // (MatvecOp::gate, target gate_x_target()).
  bool gate_signal_x = false;
  uint32_t gate_x_target() const;
  // The int8 path with subgroups, the route from the buffer, one dispatch, at most 2 blocks per
  // lane of the widest slot and 8 weight blocks per lane in all to hold (registers: PERFORMANCE.md
  // session 10).
  bool gate_supported(Context& ctx) const;

  uint64_t bytes() const;  // K routed + shared down matrices, h, route, x read and written
  // Records the dispatch(es), with barriers between parts when there are several (see above),
  // none at the end.
  void record(CommandRecorder& rec) const;
};

// Dense FFN gate-up: h[i] = silu(gate_i . xn) * (up_i . xn), i < F, with xn = RMSNorm(x; norm_weight)
// computed by every workgroup, or xn = x when norm_weight is empty (x already normalized).
struct DenseGateUpOp {
  MatrixRef gate, up;       // ffn_gate, ffn_up [F][n_embd], same type and layout, same buffer;
                            // the span covering both must fit one binding
  BufferSlice x;            // f32 [n_embd]
  BufferSlice norm_weight;  // f32 [n_embd] ffn_norm, or empty (x is the normalized input)
  float eps = 1e-6f;
  BufferSlice h;            // f32 [F] (out)
  BufferSlice hq;           // int8 blocks of h [dense_hq_bytes(F)] (out); set: int8-activation path
  std::string label;        // empty = "dense_gateup.<type>"
  MoeTuning tuning;

  uint64_t bytes() const;
  void record(CommandRecorder& rec) const;  // one dispatch, no barrier
};

// Dense FFN down with the residual add: x += W_down . h.
struct DenseDownOp {
  MatrixRef down;  // ffn_down [n_embd][F]
  BufferSlice h;   // f32 [F]
  BufferSlice x;   // f32 [n_embd] (in/out)
  BufferSlice hq;  // int8 blocks of h written by DenseGateUpOp (set on both, or on neither)
  std::string label;  // empty = "dense_down.<type>"
  MoeTuning tuning;

  uint64_t bytes() const;
  void record(CommandRecorder& rec) const;  // one dispatch, no barrier
};

}  // namespace tessera::vk
