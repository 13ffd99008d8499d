// Feed-forward blocks (forward.md §5): the dense SwiGLU FFN of the leading layers and the MoE
// block (router, top-K routed experts, shared experts).
#pragma once
#include <cstdint>

#include "runtime/cpu/attention.h"

namespace tessera::cpu {

// out [T x d] = W_down · (silu(W_gate·h) ⊙ (W_up·h)) for each of the T rows of h [T x d].
void dense_ffn(const ForwardContext& ctx, const LayerWeights& lw, const float* h, uint32_t T, float* out);

// out [T x d] = Σ_k w_k · Expert_{idx_k}(h) + Shared(h) per token (route_token picks idx and w).
// Each expert's weights are read once per call for all tokens routed to it.
void moe_ffn(const ForwardContext& ctx, const LayerWeights& lw, const float* h, uint32_t T, float* out);

}  // namespace tessera::cpu
