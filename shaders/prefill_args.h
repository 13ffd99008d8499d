// Push-constant structs and flags of the prefill FFN kernels (moe_prefill_route.comp,
// moe_prefill.comp, prefill_util.comp) and their C++ wrappers (runtime/vulkan/kernels_prefill.h).
// Valid GLSL and valid C++: uint/float scalars only, every struct a multiple of 16 bytes.
//
// Buffers of one prefill chunk of at most T tokens (n = step[count_word] live tokens, t < n), K
// routed experts per token, E experts:
//   pair p = t*K + k       routed slot k of token t; the shared slot of token t is pair T*K + t
//                          (a dense FFN: K = 0, so pair t)
//   route  uint [2*T*K + 1] (expert, weight bits) of pair p at 2p, 2p+1; then the arrival counter
//                          (zero it once after allocation; the route kernel leaves it at 0)
//   lists  uint [E + E*T]  count of expert e at e; its pairs, ascending, at E + e*T + j, j < count
//   h      f32 [(T*K + T) x h_stride]  gate-up output of pair p at p*h_stride
//   y      f32 [(T*K + T) x n_embd]    down output of pair p (routing weight applied) at p*n_embd
#ifndef TESSERA_PREFILL_ARGS_H
#define TESSERA_PREFILL_ARGS_H

#ifdef __cplusplus
#include <cstdint>
namespace tessera::gpu {
using uint = uint32_t;
#endif

// moe_prefill_route.comp: workgroup t < n routes token t from logits[t*E ..] (routing.glsl,
// the decode step's routing code; FROM_X: from logits it computes from x) into route; a second
// dispatch, one workgroup per expert, builds lists.
struct PrefillRouteArgs {
  uint n_expert;        // E (<= TS_ROUTE_MAX_E)
  uint n_used;          // K
  uint t_max;           // T: workgroups dispatched, list capacity per expert
  uint count_word;      // step word with n
  uint gating;          // TS_GATING_*
  uint route_flags;     // TS_ROUTER_EXPERT_BIAS | TS_ROUTER_NORM_WEIGHTS
  float weights_scale;  // applied unless 0 or 1
  float norm_eps;       // FROM_X: the RMSNorm's epsilon
};

// PrefillFfnArgs.flags
#define TS_PF_DOWN 1u              // down projection (else gate-up + SiLU * mul)
#define TS_PF_ALL_TOKENS 2u        // every live token, pair pair_base + t, weight 1 (shared expert,
                                   // dense FFN); else expert expert_lo + y's list
#define TS_PF_SEPARATE_GATE_UP 4u  // gate-up: gate and up are two matrices of `width` rows (dense
                                   // FFN) at mat_offset / up_offset; else one interleaved matrix
                                   // of 2*width rows (gate row 2i, up row 2i+1)

// moe_prefill.comp: workgroup (x = tile of ROWS output rows, y = slot) runs over the slot's
// pairs p (TB at a time):
//   gate-up: h[p*out_stride + i] = silu(gate_i . in_p) * (up_i . in_p), i < width, with
//            in_p = in[token(p)*in_stride ..] (token(p) = p / K, or t with TS_PF_ALL_TOKENS)
//   down:    y[p*out_stride + r] = w_p * (down_r . h[p*in_stride ..]), r < n_embd (row length width)
// The matrix of routed expert e starts at byte (e - expert_lo)*slot_stride + mat_offset of the
// weight binding; with TS_PF_ALL_TOKENS at mat_offset.
struct PrefillFfnArgs {
  uint n_embd;       // gate-up row length; down rows
  uint width;        // gate-up rows per matrix (outputs); down row length
  uint n_used;       // K
  uint t_max;        // T
  uint flags;        // TS_PF_*
  uint count_word;   // step word with n
  uint n_expert;     // E (lists layout)
  uint expert_lo;    // first expert of the binding (routed)
  uint slot_stride;  // bytes between routed experts
  uint mat_offset;   // bytes: the matrix (gate-up / down; dense: gate)
  uint up_offset;    // bytes: TS_PF_SEPARATE_GATE_UP only
  uint pair_base;    // TS_PF_ALL_TOKENS: pair of token 0
  uint in_stride;    // floats between input rows
  uint out_stride;   // floats between output rows
  uint pad0, pad1;
};

// prefill_util.comp MODE_SUM: x[t*n_embd + r] += sum_{k<K} y[(t*K+k)*n_embd + r]
//   (+ y[(pair_base + t)*n_embd + r] with has_shared), for t < n, in this order.
// MODE_GATHER: out[i] = x[(n - 1)*n_embd + i] (the last live token's row).
struct PrefillUtilArgs {
  uint n_embd;
  uint n_used;      // K
  uint count_word;  // step word with n
  uint has_shared;  // SUM: add the all-tokens pair
  uint pair_base;   // SUM: pair of token 0's shared slot (T*K)
  uint pad0, pad1, pad2;
};

#ifdef __cplusplus
static_assert(sizeof(PrefillRouteArgs) % 16 == 0 && sizeof(PrefillFfnArgs) % 16 == 0);
static_assert(sizeof(PrefillUtilArgs) % 16 == 0);
}  // namespace tessera::gpu
#endif

#endif  // TESSERA_PREFILL_ARGS_H
