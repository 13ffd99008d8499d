// The MoE kernels' shared helpers (runtime/vulkan/kernels_moe.cpp), for the dense FFN's ops in
// kernels_dense_ffn.cpp: pipelines of moe_gateup.comp / moe_down.comp, tuning defaults, binding
// checks. Not part of the kernels' interface (kernels_moe.h).
#pragma once
#include <cstdint>
#include <string>

#include "runtime/vulkan/gate.h"
#include "runtime/vulkan/kernels_moe.h"

namespace tessera::vk::moe_detail {

constexpr uint32_t kQ8GateUpOutputs = 32;  // outputs per int8 gate-up workgroup (one int8 block of h)
// The dense FFN's int8 gate-up takes as many blocks of 32 outputs per workgroup as keep its grid
// within this many workgroups: the kernel runs 2 per SM (52 registers x 512 threads on an H100,
// bench --kernel-stats), so GLM's 10240-wide FFN in 320 workgroups of 32 ran in two waves (a
// heuristic from that GPU: 2 x 132 SMs, rounded down; measured 23.1 -> 19.7 us). The same bound
// tells q8_gateup_teams() when an early-started MoE gate-up grid of 16 subgroups a workgroup would
// not start in one wave (DeepSeek-V2-Lite's 352 workgroups; session 33).
constexpr uint32_t kQ8DenseGateUpMaxGroups = 256;

// MoeTuning with the automatic choices filled in (except q8_down_rows and q8_gateup_teams).
MoeTuning resolve(const MoeTuning& t);
// Outputs per pass of the int8 gate-up for experts of `type` (moe_gateup.comp GU_OUTS); 0: the
// two-output loop.
uint32_t q8_gateup_outs(const MoeTuning& t, GgmlType type);
// Rows per workgroup of the int8 down kernel for weights of `type`, early-started (`gated`) or not.
uint32_t q8_down_rows(const MoeTuning& t, GgmlType type, bool gated);
bool is_plain(GgmlType t);       // F32 / F16 / BF16
uint32_t elem_bytes(GgmlType t);  // of a plain type
// Throws Error(Runtime) naming `what` and the binding where s is unset or shorter than `bytes`.
void need(const BufferSlice& s, uint64_t bytes, const std::string& what, const char* binding);
// A byte range [offset, offset + bytes) of `buffer`, rounded up to 16 bytes but not past its end.
BufferSlice weight_slice(const Buffer& buffer, uint64_t offset, uint64_t bytes);

// moe_gateup.comp: the f32-input form; fold: the router fold's variant. re: the routing code's
// expert bound (0: none).
const Pipeline& gateup_kernel(Context& ctx, GgmlType type, bool vec8, const MoeTuning& t, uint32_t re, bool fold = false);
// ... the int8-activation form: `outs` outputs per workgroup (a multiple of 32), the int8 copy of
// h written; fused_down: the down fused in; gate / wait: the early starts' signal and wait;
// gating: the routing's (where re > 0), for route_ranks(). `teams` subgroups a workgroup
// (q8_gateup_teams()).
const Pipeline& gateup_q8_kernel(Context& ctx, GgmlType type, uint32_t n_embd, const MoeTuning& t, uint32_t teams,
                                 uint32_t re, bool fold = false, bool fused_down = false, uint32_t outs = kQ8GateUpOutputs,
                                 bool gate = false, const GateWait& wait = {}, GatingFunc gating = GatingFunc::Softmax);
// Subgroups per int8 gate-up workgroup of a grid of `groups` workgroups, early-started or not.
uint32_t q8_gateup_teams(const MoeTuning& t, bool early, uint64_t groups);
// The experts a MoE kernel routes among (ROUTE_E: n_expert rounded up to 32), 0 where it does not route.
uint32_t route_e(uint32_t n_expert, bool recompute);
// The ROUTE_RANKS define of a routing int8 gate-up of `teams` subgroups (re: route_e();
// routing.glsl): 1 (sigmoid gating) or 2 (softmax, only with MoeTuning::route_ranks 1) where the
// device has subgroups of at least 8 with shuffles, the workgroup holds at least re invocations and
// MoeTuning::route_ranks is not 2; else 0 (the rounds).
uint32_t route_ranks(Context& ctx, const MoeTuning& t, uint32_t teams, uint32_t re, GatingFunc gating);
// moe_down.comp: the f32-input form, `slots` teams per workgroup.
const Pipeline& down_kernel(Context& ctx, GgmlType type, bool vec8, uint32_t slots, const MoeTuning& t, uint32_t re);
// ... the int8-activation form (hq_floats: h floats covered; width: the widest slot); gate_h_target
// (0: none): the early start's variant (late: DOWN_LATE); first: DOWN_FIRST (no gate; q8_down_first()).
const Pipeline& down_q8_kernel(Context& ctx, GgmlType type, uint32_t slots, uint64_t hq_floats, uint64_t width,
                               uint32_t rows, uint32_t re, uint32_t gate_h_target = 0, bool x_signal = false,
                               bool late = false, uint32_t first = 0);
uint32_t q8_down_first(const MoeTuning& t, GgmlType type);

}  // namespace tessera::vk::moe_detail
