// Push-constant structs and flags shared by the router / MoE / sampling kernels (router.comp,
// moe_gateup.comp, moe_down.comp, sample.comp, routing.glsl) and their C++ wrappers
// (runtime/vulkan/kernels_moe.h, kernels_sample.h). Valid GLSL and valid C++: uint/float scalars
// only, every struct a multiple of 16 bytes (std430 push-constant layout == C++ layout).
#ifndef TESSERA_MOE_ARGS_H
#define TESSERA_MOE_ARGS_H

#ifdef __cplusplus
#include <cstdint>
namespace tessera::gpu {
using uint = uint32_t;
#endif

// Gating functions (= GGUF expert_gating_func).
#define TS_GATING_SOFTMAX 1u
#define TS_GATING_SIGMOID 2u

// Largest expert count / experts used per token the routing code holds in shared memory.
#define TS_ROUTE_MAX_E 256u
#define TS_ROUTE_MAX_K 16u

// RouterArgs.flags bits.
#define TS_ROUTER_LOGITS 1u       // compute logits = W . RMSNorm(x) (else they are an input)
#define TS_ROUTER_EXPERT_BIAS 2u  // routing: selection score = probs + bias (exp_probs_b)
#define TS_ROUTER_NORM_WEIGHTS 4u // routing: weights /= max(sum of chosen weights, 6.103515625e-5)
#define TS_ROUTER_ROUTE 8u        // compute the routing into the route buffer (else logits only)

// router.comp, one dispatch:
//   with TS_ROUTER_LOGITS (one workgroup per expert): h2 = RMSNorm(x; norm_w, eps),
//     logits[e] = W[e] . h2; the workgroups also write h2, a share each (the gate-up reads it);
//   with TS_ROUTER_ROUTE, the last workgroup to finish (arrival counter route[2*n_used]) computes
//     the routing (routing.glsl) from the logits and writes route[2k] = expert, route[2k+1] =
//     weight bits, k < n_used, best first, and resets the counter. Without TS_ROUTER_LOGITS: one
//     workgroup, routing only (logits given).
struct RouterArgs {
  uint n_embd;
  uint n_expert;
  float eps;
  uint n_used;          // K
  uint gating;          // TS_GATING_*
  uint flags;           // TS_ROUTER_*
  float weights_scale;  // routing weights scale, applied unless 0 or 1
  uint pad0;
};

// MoeArgs.flags bits.
#define TS_MOE_ROUTED 4u          // this dispatch does the routed slots 0..n_used-1
#define TS_MOE_SHARED 8u          // this dispatch does the shared slot (slot n_used of h)
#define TS_MOE_NORM_INPUT 32u     // gate-up: input = RMSNorm(x; norm_w, norm_eps) (dense FFN)
#define TS_MOE_SEPARATE_GATE_UP 64u  // gate-up, shared slot: gate and up are two matrices at
                                     // shared_offset / shared_up_offset (dense FFN), not interleaved
#define TS_MOE_ROUTE_RECOMPUTE 128u  // every workgroup computes the routing itself (routing.glsl)
                                     // from logits + bias, instead of reading the route buffer
#define TS_MOE_ROUTE_WRITE 256u  // gate-up, ROUTER_FOLD: workgroup 0 writes the route buffer and logits

// moe_gateup.comp and moe_down.comp (the weight binding holds a MOE_TILE1 tile, a range of its
// slots, or a dense FFN's matrices; every offset is in bytes from the binding's first byte).
//   gate-up: h[s*h_stride + i] = silu(gate_i . in) * (up_i . in), i < width(s)
//   down:    x[r] += sum_{k<n_used} w_k (down_{e_k} row r . h[k]) + (shared down row r . h[n_used])
// Routed slot k uses expert e_k = route[2k] with weight w_k = route[2k+1] (written by router.comp),
// or with TS_MOE_ROUTE_RECOMPUTE the routing of the logits computed by the workgroup; it is
// skipped unless expert_lo <= e_k < expert_hi; expert e's part starts at
// (e - expert_lo) * slot_stride + routed_offset.
struct MoeArgs {
  uint n_embd;            // model width: gate/up row length, down rows
  uint n_used;            // K: routed slots; the shared slot is slot K of h
  uint flags;             // TS_MOE_*
  float norm_eps;         // TS_MOE_NORM_INPUT
  uint h_stride;          // floats between slots of h (multiple of 4)
  uint w_routed;          // routed slot width (n_ff_exp)
  uint w_shared;          // shared slot width (S * n_ff_exp, or the dense FFN width)
  uint slot_stride;       // bytes between consecutive routed slots
  uint expert_lo;         // first expert whose slot starts the binding
  uint expert_hi;         // one past the last expert whose slot is in the binding
  uint routed_offset;     // bytes from a routed slot's start to the part read (gate-up 0, down down_offset)
  uint shared_offset;     // shared part (gate-up: gateup matrix, or the dense gate matrix; down: down matrix)
  uint shared_up_offset;  // TS_MOE_SEPARATE_GATE_UP: the dense up matrix
  uint groups_routed;     // gate-up: workgroups per routed slot (then groups for the shared slot)
  uint n_expert;          // TS_MOE_ROUTE_RECOMPUTE: logits, and the routing's gating, flags
  uint gating;            //   (TS_ROUTER_EXPERT_BIAS, TS_ROUTER_NORM_WEIGHTS) and weights scale
  uint route_flags;
  float weights_scale;
  uint down_routed_offset;  // FUSED_DOWN gate-up: bytes from a routed slot's start to its down matrix
  uint down_shared_offset;  // FUSED_DOWN gate-up: the shared down matrix (from the binding start)
};

// The MoE down fused into the int8 gate-up (moe_gateup.comp FUSED_DOWN, MoeGateUpOp::down_acc):
// each workgroup multiplies its 32 outputs (one int8 block of h) by the matching 32 columns of its
// slot's down matrix, weighted, and adds the n_embd products into 64-bit fixed-point accumulators
// (round(v * TS_MOE_DOWN_ACC_SCALE)); the last workgroup to arrive adds them to x and zeroes them.
// Accumulator buffer: int64 [n_embd], then the arrival counter (uint32 word 2 * n_embd); all zero
// between dispatches. Integer sums: the same bits in every run whatever the order of the atomics.
#define TS_MOE_DOWN_ACC_SCALE 4294967296.0  // 2^32

// sample.comp flags.
#define TS_SAMPLE_ADVANCE_POS 1u  // step[pos_word] += 1 after writing the token
#define TS_SAMPLE_WRITE_OUT 2u    // tokens_out[step[pos_word] % out_ring] = token
#define TS_SAMPLE_ADVANCE_COUNTS 4u  // the next step's attention group counts (counts_word, rule_word)
#define TS_SAMPLE_INPUT_RING 8u   // forced inputs from the step buffer's ring (input_word)

// Scratch buffer of sample.comp (32-bit words): [0] arrival counter (zero between dispatches;
// the last workgroup resets it), [1..3] unused, [4] token, [5] candidates after top-k, [6] kept
// after top-p/min-p, [7] unused, [8 .. 8+TS_SAMPLE_MAX_K) kept ids (most likely first), then
// per workgroup g and round r < TS_SAMPLE_MAX_K: (logit bits, id) at
// TS_SAMPLE_PARTIALS + 2*(g*TS_SAMPLE_MAX_K + r).
#define TS_SAMPLE_MAX_K 128u
#define TS_SAMPLE_MAX_CAND 3072u  // n_groups * top_k: the merge holds every list in shared memory
#define TS_SAMPLE_STATS 4u
#define TS_SAMPLE_KEPT 8u
#define TS_SAMPLE_PARTIALS (8u + TS_SAMPLE_MAX_K)

// sample.comp: one token from logits[0..n_vocab): top-k (k = top_k, 1..TS_SAMPLE_MAX_K) by logit
// (ties: lower id), then top-p and min-p at temperature 1, then softmax(l / temperature) and a
// draw with u = hash(seed, position) (temperature <= 0 or top_k == 1: the argmax).
struct SampleArgs {
  uint n_vocab;
  uint per_group;    // logits per workgroup (the last one may have fewer)
  uint n_groups;     // workgroups dispatched (<= the kernel's WG_SIZE)
  uint top_k;        // 1..TS_SAMPLE_MAX_K
  float top_p;       // >= 1: off
  float min_p;       // <= 0: off
  float temperature; // <= 0: greedy
  uint seed_lo;      // RNG seed, low / high 32 bits
  uint seed_hi;
  uint token_word;   // step[token_word] = token
  uint pos_word;     // step[pos_word] = position of the step that produced the logits
  uint flags;        // TS_SAMPLE_*
  uint out_ring;     // tokens_out entries (TS_SAMPLE_WRITE_OUT; the input ring's too)
  uint counts_word;  // TS_SAMPLE_ADVANCE_COUNTS: step[counts_word ..+6) <- the next step's
  uint rule_word;    //   attention group counts by the AttnDecodeRule at step[rule_word ..+12)
  uint input_word;   // TS_SAMPLE_INPUT_RING: when step[input_word] != 0, the next step's input is
                     //   step[input_word + 1 + (p + 1) % out_ring] (forced tokens), not the sample
};

#ifdef __cplusplus
static_assert(sizeof(RouterArgs) % 16 == 0 && sizeof(MoeArgs) % 16 == 0 && sizeof(SampleArgs) % 16 == 0);
static_assert(sizeof(MoeArgs) <= 128 && sizeof(SampleArgs) <= 128);
}  // namespace tessera::gpu
#endif

#endif  // TESSERA_MOE_ARGS_H
