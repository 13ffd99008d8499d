#include "runtime/vulkan/kernels_moe.h"

#include <algorithm>
#include <vector>

#include "format/error.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe_internal.h"
#include "shaders/gate_args.h"
#include "shaders/moe_args.h"

namespace tessera::vk {
namespace moe_detail {

// Work split: many small independent dot products (one per subgroup), so that many weight loads
// are in flight at once. Alternatives are selectable through MoeTuning (bench: MoeBench.*).
constexpr uint32_t kSharedThreadsPerRow = 32;  // team width of the shared-memory reduction path
constexpr uint32_t kGateUpTeams = 4;           // gate-up: teams per workgroup, one output each
constexpr uint32_t kDownRowsPerWg = 2;         // down: rows per workgroup (one team per slot)
constexpr uint32_t kRouterWgSize = 128;        // router: one workgroup per row
// The int8-activation variants (Q8ACT): bigger workgroups, so that the input each workgroup
// quantizes (gate-up) or copies (down) into shared memory is shared by more rows.
// Measured on an H200 (tg128, bench --tune, docs/PERFORMANCE.md): gate-up 16 subgroups 14.7 us
// per call vs 16.8 with 8 (4, 32: slower). Down behind a barrier: 4 rows (DeepSeek-V2-Lite Q4_0
// 568.7 -> 590.1 tok/s against 2 rows, Q4_K_M 323.3 -> 328.1; 8 rows slower; session 32).
// Early-started down (blocks held across its wait, resident beside the gate-up): Q4_0 2 rows
// (1: -1.8 %, 4: -3 %), K-quants 1 row (GLM Q4_K_M +6.3 % against 4; session 30).
constexpr uint32_t kQ8GateUpTeams = 16;        // subgroups per gate-up workgroup, early-started
constexpr uint32_t kQ8GateUpTeamsAlone = 8;    // ... behind a barrier
constexpr uint32_t kQ8DownRows = 4;            // down rows per workgroup behind a barrier, every type
constexpr uint32_t kQ8DownRowsEarly = 2;       // ... early-started, 32-element block types
constexpr uint32_t kQ8DownRowsKEarly = 1;      // ... early-started, K-quants (256-element blocks)

// MoeTuning with the automatic choices filled in (except q8_down_rows, which depends on the
// weight type: q8_down_rows(), and q8_gateup_teams: q8_gateup_teams()).
MoeTuning resolve(const MoeTuning& t) {
  MoeTuning r = t;
  if (r.unroll == 0) r.unroll = 1;  // H200: 2 was slower (more registers, fewer resident workgroups)
  if (r.gateup_teams == 0) r.gateup_teams = kGateUpTeams;
  if (r.down_rows == 0) r.down_rows = kDownRowsPerWg;
  if (r.q8_gateup_outs > kQ8GateUpLoop)
    runtime_error("MoE kernels: int8 gate-up outputs per pass ", r.q8_gateup_outs, " outside 0..9");
  if (r.q8_fold_overlap > 2) runtime_error("MoE kernels: fold overlap ", r.q8_fold_overlap, " is not 0 (auto), 1 (on) or 2 (off)");
  if (r.down_first_rows != 0 && r.down_first_rows != 1 && r.down_first_rows != 2 && r.down_first_rows != 4 &&
      r.down_first_rows != kQ8DownFirstOff)
    runtime_error("MoE kernels: down rows loaded first ", r.down_first_rows, " is not 0 (auto), 1, 2, 4 or 9 (none)");
  if (r.route_ranks > 2) runtime_error("MoE kernels: route ranks ", r.route_ranks, " is not 0 (auto), 1 (on) or 2 (off)");
  if (r.unroll > 2 || r.gateup_teams > 16 || r.down_rows > 16 || r.q8_gateup_teams > 32 || r.q8_down_rows > 64)
    runtime_error("MoE kernels: tuning (unroll ", r.unroll, ", gate-up teams ", r.gateup_teams, ", down rows ",
                  r.down_rows, ", int8 gate-up teams ", r.q8_gateup_teams, ", int8 down rows ", r.q8_down_rows,
                  ") outside 1..2 / 1..16 / 1..16 / 1..32 / 1..64");
  return r;
}

// Outputs per pass of the int8 gate-up (moe_gateup.comp GU_OUTS) for experts of `type`; 0: the
// two-output loop. Auto: 2 for Q4_0 (H200, GLM-4.7-Flash tg128 422.5 -> 424.8, alternating runs), the loop
// for the K-quants (Q4_K_M 354.8 -> 329.7 with 2; session 31).
uint32_t q8_gateup_outs(const MoeTuning& t, GgmlType type) {
  if (t.q8_gateup_outs == kQ8GateUpLoop) return 0;
  if (t.q8_gateup_outs) return t.q8_gateup_outs;
  return type == GgmlType::Q4_0 ? 2 : 0;
}

// Subgroups per int8 gate-up workgroup (32 outputs each) of a grid of `groups` workgroups,
// early-started (`early`: it waits beside W_vo) or not: the set value; with the outputs a pass set,
// 32 / those; else 16 early (GLM-4.7-Flash: 8 lost 2.9-4.8 %, sessions 16 and 30), 8 behind a
// barrier (DeepSeek-V2-Lite's 352 workgroups in one wave: H200 Q4_0 tg128 601.6 -> 624.9, Q4_K_M
// 327.3 -> 335.0; session 32) and early where the grid has more workgroups than run two to an SM
// (V2-Lite's 352 beside attn_output: 16 started in two waves, 617 against 674; session 33).
uint32_t q8_gateup_teams(const MoeTuning& t, bool early, uint64_t groups) {
  if (t.q8_gateup_teams) return t.q8_gateup_teams;
  if (t.q8_gateup_outs && t.q8_gateup_outs != kQ8GateUpLoop) return std::max<uint32_t>(1, kQ8GateUpOutputs / t.q8_gateup_outs);
  return early && groups <= kQ8DenseGateUpMaxGroups ? kQ8GateUpTeams : kQ8GateUpTeamsAlone;
}

// Rows a pass of the int8 down behind a barrier whose weight blocks are all loaded first
// (moe_down.comp DOWN_FIRST), 0 for none: the set value (kQ8DownFirstOff: none); auto: 1 for Q4_0
// (H200 DeepSeek-V2-Lite Q4_0 tg128 622.3 -> 668.6; 4 rows a pass 640.9, 2 660.2: its lanes had
// waited on each block's load in turn), none otherwise (V2-Lite Q4_K_M, whose Q8_0 / Q6_K downs run
// here, 330.4 -> 326.1 with 4 rows a pass; session 32).
uint32_t q8_down_first(const MoeTuning& t, GgmlType type) {
  if (t.down_first_rows == kQ8DownFirstOff) return 0;
  if (t.down_first_rows) return t.down_first_rows;
  return type == GgmlType::Q4_0 ? 1 : 0;
}

// Rows per workgroup of the int8 down kernel for weights of `type`, early-started (`gated`) or not.
uint32_t q8_down_rows(const MoeTuning& t, GgmlType type, bool gated) {
  if (t.q8_down_rows) return t.q8_down_rows;
  if (!gated) return kQ8DownRows;
  return type_info(type).block_elems == 256 ? kQ8DownRowsKEarly : kQ8DownRowsEarly;
}

bool is_plain(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }
uint32_t elem_bytes(GgmlType t) { return t == GgmlType::F32 ? 4 : 2; }

// Bytes a kernel reads to use a whole tile part / matrix once (without alignment padding).
uint64_t read_bytes(const Split1Geometry& g) { return g.rows * g.blocks_per_row * (g.q_bytes + g.m_bytes); }

// A team reduces one dot product: a subgroup, or kSharedThreadsPerRow invocations reducing
// through shared memory where subgroup arithmetic is missing.
struct TeamShape {
  bool subgroup;
  uint32_t threads_per_row;
};
TeamShape team_shape(Context& ctx) {
  const bool sg = ctx.pipelines().use_subgroup();
  return {sg, sg ? ctx.info().subgroup_size : kSharedThreadsPerRow};
}

// The gate-up / down pipeline for a weight type: `teams` teams per workgroup; `extra` adds the
// kernel's own defines (OUT_PER_WG, or TEAMS and ROWS_PER_WG).
const Pipeline& row_kernel(Context& ctx, const std::string& name, const char* file, GgmlType type, bool vec8,
                           uint32_t teams, uint32_t unroll, const ShaderDefines& extra, uint32_t num_buffers) {
  const TeamShape ts = team_shape(ctx);
  PipelineDesc desc;
  desc.name = name;
  desc.file = file;
  desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(type))},
                  {"WG_SIZE", std::to_string(ts.threads_per_row * teams)},
                  {"THREADS_PER_ROW", std::to_string(ts.threads_per_row)},
                  {"PLAIN_VEC8", vec8 ? "1" : "0"},
                  {"UNROLL", std::to_string(unroll)}};
  for (const auto& [k, v] : extra) desc.defines[k] = v;
  desc.num_buffers = num_buffers;
  desc.push_bytes = sizeof(gpu::MoeArgs);
  desc.full_subgroups = ts.subgroup;
  return ctx.pipelines().get(desc);
}

// The routing code a MoE kernel carries (routing.glsl), from route_e: 0 where it never routes
// (it reads the route buffer, or has no routed slots: ROUTE_RECOMPUTE 0, no routing code), else
// the most experts it routes among (ROUTE_E; the tile's count rounded up to 32, so that a lane
// holds ROUTE_E / subgroup size entries rather than TS_ROUTE_MAX_E's). Session 13: the 256-expert
// bound and the down's unused routing doubled their code and cost them registers.
uint32_t route_e(uint32_t n_expert, bool recompute) { return recompute ? (n_expert + 31) / 32 * 32 : 0; }
std::string route_code(ShaderDefines& d, uint32_t route_e) {
  d["ROUTE_RECOMPUTE"] = route_e ? "1" : "0";
  if (route_e) d["ROUTE_E"] = std::to_string(route_e);
  return route_e ? cat(".e", route_e) : ".noroute";
}

// fold: the router fold's variant (ROUTER_FOLD 1, binding 8 = the accumulators). re: route_e().
const Pipeline& gateup_kernel(Context& ctx, GgmlType type, bool vec8, const MoeTuning& t, uint32_t re, bool fold) {
  ShaderDefines d = {{"OUT_PER_WG", std::to_string(t.gateup_teams)}, {"Q8ACT", "0"}, {"ROUTER_FOLD", fold ? "1" : "0"}};
  const std::string rc = route_code(d, re);
  return row_kernel(ctx, cat("moe_gateup.", type_name(type), vec8 ? ".v8" : "", fold ? ".rfold" : "", rc),
                    "moe_gateup.comp", type, vec8, t.gateup_teams, t.unroll, d, fold ? 9 : 7);
}

uint32_t route_ranks(Context& ctx, const MoeTuning& t, uint32_t teams, uint32_t re, GatingFunc gating) {
  const TeamShape ts = team_shape(ctx);
  if (!re || t.route_ranks == 2 || !ts.subgroup || ts.threads_per_row < 8 || !ctx.info().features.subgroup_shuffle ||
      ts.threads_per_row * teams < re)
    return 0;
  // Softmax only when asked: DeepSeek-V2-Lite on an H200 ranked as fast as the rounds (Q4_0 tg128
  // 624.9 against 626.4, Q4_K_M 335.0 against 335.7; session 32).
  return gating == GatingFunc::Sigmoid ? 1 : t.route_ranks == 1 ? 2 : 0;
}

// The int8-activation gate-up: `outs` outputs per workgroup (a multiple of 32), int8 copy of h
// written. fused_down: the down fused in (FUSED_DOWN, 11 bindings). gating: the routing's (route_ranks()).
const Pipeline& gateup_q8_kernel(Context& ctx, GgmlType type, uint32_t n_embd, const MoeTuning& t, uint32_t teams,
                                 uint32_t re, bool fold, bool fused_down, uint32_t outs, bool gate, const GateWait& wait,
                                 GatingFunc gating) {
  const bool overlap = fold && t.q8_fold_overlap != 2;
  const uint32_t ranks = route_ranks(ctx, t, teams, re, gating);
  ShaderDefines d = {{"OUT_PER_WG", std::to_string(outs)},
                     {"Q8ACT", "1"},
                     {"Q8_BLOCKS", std::to_string(q8_blocks_define(n_embd))},
                     {"ROUTER_FOLD", fold ? "1" : "0"},
                     {"FUSED_DOWN", fused_down ? "1" : "0"},
                     {"FOLD_OVERLAP", overlap ? "1" : "0"},
                     {"GATE_SIGNAL", gate ? "1" : "0"}};
  const uint32_t gu_outs = q8_gateup_outs(t, type);
  const bool gu = gu_outs && team_shape(ctx).subgroup;
  if (gu) {
    d["GU_OUTS"] = std::to_string(gu_outs);
    d["Q8_NB"] = std::to_string(n_embd / 32);
  }
  // STAGE_LATE: the GU_OUTS path in one pass, 32-element blocks, shuffles among 8 invocations.
  const bool stage_late = t.gateup_stage_late && gu && overlap && !fused_down && ctx.info().subgroup_size >= 8 &&
                          ctx.info().features.subgroup_shuffle && (type == GgmlType::Q4_0 || type == GgmlType::Q8_0) &&
                          outs <= gu_outs * teams;
  d["STAGE_LATE"] = stage_late ? "1" : "0";
  const std::string rc = route_code(d, re) + (ranks ? ".ranks" : "");
  if (ranks) d["ROUTE_RANKS"] = std::to_string(ranks);
  // GATEUP_CONSTS (the shader's CONSTS_FIRST: with the wait and the overlapped prologue): the norm
  // weight in shared memory too (128 bytes per block beside the staging's 48).
  const bool consts = wait.enabled() && overlap && t.gateup_consts &&
                      uint64_t(q8_blocks_define(n_embd)) * 176 + 4096 <= ctx.info().max_compute_shared_memory;
  // GATEUP_INPUT_FIRST: one input word per invocation, staged with the norm weight in shared memory.
  const bool input_first =
      stage_late && consts && t.gateup_input_first && n_embd / 4 <= teams * ctx.info().subgroup_size;
  d["GATEUP_INPUT_FIRST"] = input_first ? "1" : "0";
  if (wait.enabled()) {  // moe_gateup.comp WAIT_GATE: bindings 12, 13 = the polled words, the error words
    d["WAIT_GATE"] = "1";
    d["GATE_WORD"] = std::to_string(wait.word);
    d["GATE_TARGET"] = std::to_string(wait.target);
    d["GATEUP_CONSTS"] = consts ? "1" : "0";
  }
  return row_kernel(ctx,
                    cat("moe_gateup.", type_name(type), ".q8act", fold ? ".rfold" : "", overlap ? ".ovl" : "",
                        fused_down ? ".fdown" : "", outs != kQ8GateUpOutputs ? cat(".o", outs) : "", gate ? ".gate" : "",
                        wait.enabled() ? ".wait" : "", consts ? ".consts" : "", stage_late ? ".late" : "", input_first ? ".in" : "",
                        gu ? cat(".gu", gu_outs) : "", rc),
                    "moe_gateup.comp", type, false, teams, 1, d,
                    wait.enabled() ? 14 : gate ? 12 : fused_down ? 11 : fold ? 9 : 8);
}

const Pipeline& down_kernel(Context& ctx, GgmlType type, bool vec8, uint32_t slots, const MoeTuning& t, uint32_t re) {
  ShaderDefines d = {{"TEAMS", std::to_string(slots)}, {"ROWS_PER_WG", std::to_string(t.down_rows)}, {"Q8ACT", "0"}};
  const std::string rc = route_code(d, re);
  return row_kernel(ctx, cat("moe_down.", type_name(type), vec8 ? ".v8" : "", ".s", slots, rc), "moe_down.comp", type,
                    vec8, slots, t.unroll, d, 6);
}

// The int8-activation down: reads the gate-up's int8 h (hq_floats: h floats covered, all slots;
// width: the widest slot, whose blocks a lane keeps in registers on the subgroup path).
constexpr uint64_t kMaxGateOwn = 2;  // early start of the down: the widest slot's blocks per lane

uint64_t down_q8_own(Context& ctx, uint64_t width) {
  const TeamShape ts = team_shape(ctx);
  return std::max<uint64_t>((width / 32 + ts.threads_per_row - 1) / ts.threads_per_row, 1);
}

// gate_h_target (0: none): the early start's variant (WAIT_GATE, two bindings more; late: DOWN_LATE).
// first (without the gate, on subgroups): DOWN_FIRST, the rows a pass loaded first (0: none).
const Pipeline& down_q8_kernel(Context& ctx, GgmlType type, uint32_t slots, uint64_t hq_floats, uint64_t width,
                               uint32_t rows, uint32_t re, uint32_t gate_h_target, bool x_signal, bool late, uint32_t first) {
  const TeamShape ts = team_shape(ctx);
  ShaderDefines d = {{"TEAMS", std::to_string(slots)},
                     {"ROWS_PER_WG", std::to_string(rows)},
                     {"Q8ACT", "1"},
                     {"Q8_OWN", std::to_string(down_q8_own(ctx, width))},
                     {"Q8_BLOCKS", std::to_string(ts.subgroup ? 1u : q8_blocks_define(hq_floats))}};
  const std::string rc = route_code(d, re);
  if (gate_h_target) {
    d["WAIT_GATE"] = "1";
    d["GATE_H_TARGET"] = std::to_string(gate_h_target);
    d["DOWN_LATE"] = late && type_info(type).block_elems == 32 ? "1" : "0";  // MoeTuning::down_late
    d["X_SIGNAL"] = x_signal ? "1" : "0";
  }
  if (gate_h_target || !ts.subgroup) first = 0;
  if (first) d["DOWN_FIRST"] = std::to_string(first);
  return row_kernel(ctx, cat("moe_down.", type_name(type), ".s", slots, ".q8act", gate_h_target ? ".gate" : "",
                             x_signal ? ".xsig" : "", first ? cat(".first", first) : "", rc),
                    "moe_down.comp", type, false, slots, 1, d, gate_h_target ? 9 : 7);
}

bool q8_type(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q6_K;
}

void need(const BufferSlice& s, uint64_t bytes, const std::string& what, const char* binding) {
  if (s.buffer == VK_NULL_HANDLE) runtime_error(what, ": binding '", binding, "' is not set");
  if (s.size < bytes) runtime_error(what, ": binding '", binding, "' has ", s.size, " bytes, needs ", bytes);
}

// A byte range [offset, offset + bytes) of `buffer`, rounded up to 16 bytes but not past its end.
BufferSlice weight_slice(const Buffer& buffer, uint64_t offset, uint64_t bytes) {
  return buffer.slice(offset, std::min<uint64_t>((bytes + 15) / 16 * 16, buffer.size() - offset));
}

uint64_t binding_limit(Context& ctx, uint64_t max_binding_bytes) {
  const uint64_t dev = ctx.info().max_storage_buffer_range;
  return max_binding_bytes ? std::min(max_binding_bytes, dev) : dev;
}

void check_routing(const MoeRouting& r, uint32_t n_expert, const std::string& what) {
  if (n_expert == 0 || n_expert > TS_ROUTE_MAX_E)
    runtime_error(what, ": ", n_expert, " experts; the routing kernels handle 1..", TS_ROUTE_MAX_E);
  if (r.n_used == 0 || r.n_used > n_expert || r.n_used > TS_ROUTE_MAX_K)
    runtime_error(what, ": ", r.n_used, " experts used of ", n_expert, "; expected 1..", std::min(n_expert, TS_ROUTE_MAX_K));
  if (r.gating != GatingFunc::Softmax && r.gating != GatingFunc::Sigmoid)
    runtime_error(what, ": expert gating function ", uint32_t(r.gating), " is not supported (1 softmax, 2 sigmoid)");
}

// One dispatch's share of a MoE tile: a binding over routed slots [expert_lo, expert_hi) and/or
// the shared slot's part, all read with one weight type.
struct TilePart {
  BufferSlice w;
  GgmlType type;
  bool routed = false, shared = false;
  uint32_t expert_lo = 0, expert_hi = 0;
  uint64_t routed_offset = 0;  // from a routed slot's start to the part read
  uint64_t shared_offset = 0;  // from the binding start
};

// Splits the tile into parts whose bindings fit `limit`; `down` selects the down parts.
std::vector<TilePart> tile_parts(const MoeTileRef& t, bool down, uint64_t limit, uint64_t align, const std::string& what) {
  const MoeTileGeometry& g = t.geometry;
  if (t.buffer == nullptr) runtime_error(what, ": the tile buffer is not set");
  if (t.offset % 256 != 0 || t.offset % align != 0)
    runtime_error(what, ": tile offset ", t.offset, " is not a multiple of 256 and of the descriptor alignment ", align);
  if (t.offset + g.total_bytes > t.buffer->size())
    runtime_error(what, ": tile of ", g.total_bytes, " bytes at offset ", t.offset, " overruns buffer '",
                  t.buffer->name(), "' (", t.buffer->size(), " bytes)");
  const GgmlType routed_type = down ? g.down_type : g.gateup_type;
  const GgmlType shared_type = down ? g.shared_down_type : g.shared_gateup_type;
  const uint64_t routed_offset = down ? g.down_offset : 0;
  const uint64_t shared_at = down ? g.shared_down_offset : g.shared_gateup_offset;
  const uint64_t shared_bytes = g.has_shared() ? (down ? g.down(g.n_expert) : g.gateup(g.n_expert)).total_bytes : 0;
  std::vector<TilePart> parts;
  if (g.total_bytes <= limit && (!g.has_shared() || shared_type == routed_type)) {
    TilePart p;
    p.w = weight_slice(*t.buffer, t.offset, g.total_bytes);
    p.type = routed_type;
    p.routed = true;
    p.shared = g.has_shared();
    p.expert_lo = 0;
    p.expert_hi = g.n_expert;
    p.routed_offset = routed_offset;
    p.shared_offset = shared_at;
    parts.push_back(p);
    return parts;
  }
  const uint64_t per = limit / g.slot_stride;
  if (per == 0) runtime_error(what, ": one expert slot of ", g.slot_stride, " bytes exceeds the binding limit ", limit);
  for (uint64_t lo = 0; lo < g.n_expert; lo += per) {
    const uint64_t hi = std::min<uint64_t>(lo + per, g.n_expert);
    TilePart p;
    p.w = weight_slice(*t.buffer, t.offset + lo * g.slot_stride, (hi - lo) * g.slot_stride);
    p.type = routed_type;
    p.routed = true;
    p.expert_lo = uint32_t(lo);
    p.expert_hi = uint32_t(hi);
    p.routed_offset = routed_offset;
    parts.push_back(p);
  }
  if (g.has_shared()) {
    if (shared_bytes > limit)
      runtime_error(what, ": the shared expert's ", down ? "down" : "gate-up", " part (", shared_bytes,
                    " bytes) exceeds the binding limit ", limit);
    TilePart p;
    p.w = weight_slice(*t.buffer, t.offset + shared_at, shared_bytes);
    p.type = shared_type;
    p.shared = true;
    parts.push_back(p);
  }
  return parts;
}

// tile_parts for an op on this device: bindings within max_binding_bytes (0: the device's range),
// at the device's descriptor alignment.
std::vector<TilePart> op_parts(Context& ctx, const MoeTileRef& t, bool down, uint64_t max_binding_bytes,
                               const std::string& what) {
  const uint64_t align = std::max<uint64_t>(ctx.info().min_storage_buffer_offset_alignment, 16);
  return tile_parts(t, down, binding_limit(ctx, max_binding_bytes), align, what);
}

// Workgroups of a gate-up dispatch over a part with the routed slots and/or the shared one, `outs`
// outputs per workgroup.
uint64_t gateup_groups(const MoeTileGeometry& g, uint32_t n_used, uint64_t outs, bool routed, bool shared) {
  return (routed ? n_used * ((g.w_routed + outs - 1) / outs) : 0) + (shared ? (g.w_shared + outs - 1) / outs : 0);
}

// Workgroups of a down dispatch: `rows` rows of x per workgroup.
uint32_t down_groups(const MoeTileGeometry& g, uint32_t rows) { return uint32_t((g.n_embd + rows - 1) / rows); }

gpu::MoeArgs base_args(const MoeTileGeometry& g, uint32_t n_used) {
  gpu::MoeArgs a{};
  a.n_embd = uint32_t(g.n_embd);
  a.n_used = n_used;
  a.h_stride = moe_h_stride(g);
  a.w_routed = uint32_t(g.w_routed);
  a.w_shared = uint32_t(g.w_shared);
  a.slot_stride = uint32_t(g.slot_stride);
  return a;
}

void set_part(gpu::MoeArgs& a, const TilePart& p) {
  a.flags |= (p.routed ? TS_MOE_ROUTED : 0u) | (p.shared ? TS_MOE_SHARED : 0u);
  a.expert_lo = p.expert_lo;
  a.expert_hi = p.expert_hi;
  a.routed_offset = uint32_t(p.routed_offset);
  a.shared_offset = uint32_t(p.shared_offset);
}

// How the expert kernels get the routing: the route buffer, or computed per workgroup.
struct RouteSource {
  uint32_t n_used;
  bool recompute, has_bias;
  BufferSlice route, logits, bias;  // bindings (unused ones point at a valid buffer)
};

// The int8-activation path of a gate-up or a down: taken when `hq` is set, which then must suit the
// tile and the device and hold moe_hq_bytes. Returns whether it is taken.
bool check_hq(Context& ctx, const BufferSlice& hq, const MoeTileGeometry& g, uint32_t n_used, const std::string& what) {
  if (hq.buffer == VK_NULL_HANDLE) return false;
  if (!moe_q8_usable(ctx, g, n_used))
    runtime_error(what, ": hq is set but the int8-activation path does not serve this tile or device");
  need(hq, moe_hq_bytes(g, n_used), what, "hq");
  return true;
}

// Checks shared by the gate-up and the down of a tile; resolves where the routing comes from.
RouteSource check_moe_common(const MoeTileRef& tile, uint32_t n_used, const BufferSlice& route, const MoeRouting& routing,
                             const BufferSlice& logits, const BufferSlice& bias, const std::string& what) {
  const MoeTileGeometry& g = tile.geometry;
  RouteSource src{n_used ? n_used : routing.n_used, route.buffer == VK_NULL_HANDLE, bias.buffer != VK_NULL_HANDLE,
                  route, logits, bias};
  if (src.n_used == 0 || src.n_used > g.n_expert || src.n_used > TS_ROUTE_MAX_K)
    runtime_error(what, ": ", src.n_used, " experts used of ", g.n_expert, "; expected 1..",
                  std::min(g.n_expert, TS_ROUTE_MAX_K));
  if (g.n_embd % 4 != 0 || g.n_embd > 0xFFFFFFu) runtime_error(what, ": n_embd ", g.n_embd, " must be a multiple of 4");
  if (g.total_bytes >= (uint64_t(1) << 32)) runtime_error(what, ": tile of ", g.total_bytes, " bytes exceeds 4 GiB");
  if (src.recompute) {
    if (routing.n_used != src.n_used)
      runtime_error(what, ": n_used ", src.n_used, " differs from routing.n_used ", routing.n_used);
    check_routing(routing, g.n_expert, what);
    need(logits, uint64_t(g.n_expert) * 4, what, "logits (no route buffer given)");
    if (bias.buffer != VK_NULL_HANDLE) need(bias, uint64_t(g.n_expert) * 4, what, "bias");
    src.route = logits;
  } else {
    need(route, uint64_t(src.n_used) * 8, what, "route");
    src.logits = route;
  }
  if (!src.recompute || !src.has_bias) src.bias = src.logits;
  return src;
}

void set_routing(gpu::MoeArgs& a, const RouteSource& src, const MoeRouting& r, const MoeTileGeometry& g) {
  if (!src.recompute) return;
  a.flags |= TS_MOE_ROUTE_RECOMPUTE;
  a.n_expert = g.n_expert;
  a.gating = uint32_t(r.gating);
  a.route_flags = (src.has_bias ? TS_ROUTER_EXPERT_BIAS : 0u) | (r.norm_weights ? TS_ROUTER_NORM_WEIGHTS : 0u);
  a.weights_scale = r.weights_scale;
}

// The router / route dispatch shared by RouterOp and RouteOp.
// w: the router matrix (logits computed), or null (logits given). routing: null = logits only.
void record_router(CommandRecorder& rec, const MatrixRef* w, uint32_t n_expert, uint32_t n_embd, const MoeRouting* routing,
                   float eps, const BufferSlice bufs[7], bool has_bias, const std::string& name, const std::string& what,
                   uint64_t bytes) {
  Context& ctx = rec.context();
  const MoeRouting r = routing ? *routing : MoeRouting{};
  if (routing) check_routing(r, n_expert, what);
  else if (n_expert == 0 || n_expert > TS_ROUTE_MAX_E)
    runtime_error(what, ": ", n_expert, " experts; the router handles 1..", TS_ROUTE_MAX_E);
  const GgmlType type = w ? w->type : GgmlType::F32;
  const bool vec4 = w && type == GgmlType::F32 && n_embd % 4 == 0;
  PipelineDesc desc;
  desc.name = name;
  desc.file = "router.comp";
  desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(type))},
                  {"WG_SIZE", std::to_string(kRouterWgSize)},
                  {"VEC4", vec4 ? "1" : "0"}};
  desc.name += route_code(desc.defines, route_e(n_expert, true));
  desc.num_buffers = 7;
  desc.push_bytes = sizeof(gpu::RouterArgs);
  const Pipeline& pipe = ctx.pipelines().get(desc);
  gpu::RouterArgs a{};
  a.n_embd = n_embd;
  a.n_expert = n_expert;
  a.eps = eps;
  a.n_used = r.n_used;
  a.gating = uint32_t(r.gating);
  a.flags = (w ? TS_ROUTER_LOGITS : 0u) | (routing ? TS_ROUTER_ROUTE : 0u) | (has_bias ? TS_ROUTER_EXPERT_BIAS : 0u) |
            (r.norm_weights ? TS_ROUTER_NORM_WEIGHTS : 0u);
  a.weights_scale = r.weights_scale;
  rec.dispatch(pipe, std::span<const BufferSlice>(bufs, 7), a, w ? n_expert : 1, 1, 1, what, bytes);
}

}  // namespace moe_detail

using namespace moe_detail;

MoeRouting MoeRouting::from_config(const ModelConfig& c) {
  return {c.n_expert_used, c.gating, c.expert_weights_norm, c.expert_weights_scale};
}

uint32_t moe_h_stride(const MoeTileGeometry& g) {
  return uint32_t((std::max(g.w_routed, g.w_shared) + 3) / 4 * 4);
}

uint64_t moe_h_floats(const MoeTileGeometry& g, uint32_t n_used) {
  return uint64_t(n_used + (g.has_shared() ? 1 : 0)) * moe_h_stride(g);
}

bool moe_q8_usable(Context& ctx, const MoeTileGeometry& g, uint32_t n_used) {
  const bool types = q8_type(g.gateup_type) && q8_type(g.down_type) &&
                     (!g.has_shared() || (q8_type(g.shared_gateup_type) && q8_type(g.shared_down_type)));
  return types && g.w_routed % 32 == 0 && g.w_shared % 32 == 0 && moe_h_stride(g) % 32 == 0 &&
         q8_activations_usable(ctx, g.gateup_type, g.n_embd) &&
         q8_activations_usable(ctx, g.down_type, uint64_t(n_used + 1) * moe_h_stride(g));
}

uint64_t moe_hq_bytes(const MoeTileGeometry& g, uint32_t n_used) {
  return uint64_t(n_used + 1) * (moe_h_stride(g) / 32) * 48;
}

bool dense_q8_usable(Context& ctx, const MatrixRef& gate, const MatrixRef& down) {
  return gate.layout == WeightLayout::Split1 && down.layout == WeightLayout::Split1 && gate.rows % 32 == 0 &&
         q8_activations_usable(ctx, gate.type, gate.cols) && q8_activations_usable(ctx, down.type, down.cols);
}

uint64_t dense_hq_bytes(uint32_t width) { return uint64_t((width + 31) / 32) * 48; }

// ---------------------------------------------------------------------------------------------
// RouterOp

uint64_t RouterOp::bytes() const {
  if (route.buffer == VK_NULL_HANDLE) return w.read_bytes() + uint64_t(w.cols) * 4 * 3 + uint64_t(w.rows) * 4;
  return w.read_bytes() + uint64_t(w.cols) * 4 * 3 + uint64_t(w.rows) * 4 * (bias.buffer != VK_NULL_HANDLE ? 3 : 2) +
         moe_route_bytes(routing.n_used);
}

void RouterOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const std::string name = cat("router.", type_name(w.type));
  const std::string what = label.empty() ? name : label;
  w.validate(what.c_str());
  if (w.layout != WeightLayout::Plain) runtime_error(what, ": the router weight must be a plain F32/F16/BF16 matrix");
  if (w.offset % elem_bytes(w.type) != 0) runtime_error(what, ": weight offset ", w.offset, " is not element aligned");
  need(x, uint64_t(w.cols) * 4, what, "x");
  need(norm_weight, uint64_t(w.cols) * 4, what, "norm_weight");
  need(logits, uint64_t(w.rows) * 4, what, "logits");
  need(h2, uint64_t(w.cols) * 4, what, "h2");
  const bool with_route = route.buffer != VK_NULL_HANDLE;
  if (with_route) need(route, moe_route_bytes(routing.n_used), what, "route");
  const bool has_bias = with_route && bias.buffer != VK_NULL_HANDLE;
  if (has_bias) need(bias, uint64_t(w.rows) * 4, what, "bias");
  const uint64_t wbytes = w.bytes();
  if (wbytes > ctx.info().max_storage_buffer_range)
    runtime_error(what, ": router weight of ", wbytes, " bytes exceeds the binding limit");
  const BufferSlice bufs[7] = {weight_slice(*w.buffer, w.offset, wbytes), x, norm_weight, logits, h2,
                               has_bias ? bias : logits, with_route ? route : logits};
  record_router(rec, &w, w.rows, w.cols, with_route ? &routing : nullptr, eps, bufs, has_bias, name, what, bytes());
}

uint64_t RouteOp::bytes() const {
  return uint64_t(n_expert) * 4 * (bias.buffer != VK_NULL_HANDLE ? 2 : 1) + moe_route_bytes(routing.n_used);
}

void RouteOp::record(CommandRecorder& rec) const {
  const std::string what = label.empty() ? "route" : label;
  need(logits, uint64_t(n_expert) * 4, what, "logits");
  need(route, moe_route_bytes(routing.n_used), what, "route");
  const bool has_bias = bias.buffer != VK_NULL_HANDLE;
  if (has_bias) need(bias, uint64_t(n_expert) * 4, what, "bias");
  const BufferSlice bufs[7] = {logits, logits, logits, logits, logits, has_bias ? bias : logits, route};
  record_router(rec, nullptr, n_expert, 0, &routing, 0.f, bufs, has_bias, "route", what, bytes());
}

// ---------------------------------------------------------------------------------------------
// MoeGateUpOp

uint64_t MoeGateUpOp::bytes() const {
  const MoeTileGeometry& g = tile.geometry;
  const uint32_t n_used = this->n_used ? this->n_used : routing.n_used;
  uint64_t b = uint64_t(n_used) * read_bytes(g.gateup(0));
  if (g.has_shared()) b += read_bytes(g.gateup(g.n_expert));
  b += g.n_embd * 4 + uint64_t(n_used) * 8;
  b += (uint64_t(n_used) * g.w_routed + g.w_shared) * 4;
  if (down_acc.buffer != VK_NULL_HANDLE) {
    b += uint64_t(n_used) * read_bytes(g.down(0)) + g.n_embd * 8;
    if (g.has_shared()) b += read_bytes(g.down(g.n_expert));
  }
  return b;
}

bool moe_fused_down_supported(Context& ctx, const MoeTileGeometry& g, uint32_t n_used, uint64_t max_binding_bytes) {
  const GgmlType t = g.gateup_type;
  const bool one_type = g.down_type == t && (!g.has_shared() || (g.shared_gateup_type == t && g.shared_down_type == t));
  // Each workgroup adds one clamped (<= 2^53) term per row: at most 1023 of them cannot wrap int64.
  const uint64_t groups = uint64_t(n_used) * ((g.w_routed + kQ8GateUpOutputs - 1) / kQ8GateUpOutputs) +
                          (g.w_shared + kQ8GateUpOutputs - 1) / kQ8GateUpOutputs;
  return one_type && groups <= 1023 && team_shape(ctx).subgroup && router_fold_supported(ctx) &&
         moe_q8_usable(ctx, g, n_used) && g.total_bytes <= binding_limit(ctx, max_binding_bytes) &&
         g.total_bytes < (uint64_t(1) << 32);
}

uint64_t moe_down_acc_bytes(uint64_t n_embd) { return (n_embd * 8 + 4 + 15) / 16 * 16; }

void MoeGateUpOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const MoeTileGeometry& g = tile.geometry;
  const std::string name = cat("moe_gateup.", type_name(g.gateup_type));
  const std::string what = label.empty() ? name : label;
  const bool fold = fold_acc.buffer != VK_NULL_HANDLE;
  // The router fold routes per workgroup like TS_MOE_ROUTE_RECOMPUTE, from the accumulators: the
  // common checks see no route buffer (routing, logits and bias checked as for recompute).
  const RouteSource src = check_moe_common(tile, n_used, fold ? BufferSlice{} : route, routing, logits, bias, what);
  const uint32_t n_used = src.n_used;
  if (fold) {
    if (!router_fold_supported(ctx)) runtime_error(what, ": the router fold needs 64-bit integer buffer atomics");
    need(fold_acc, router_fold_acc_bytes(g.n_expert), what, "fold_acc");
    need(route, uint64_t(n_used) * 8, what, "route");
    need(x, g.n_embd * 4, what, "x");
    need(norm_weight, g.n_embd * 4, what, "norm_weight");
  } else {
    need(h2, g.n_embd * 4, what, "h2");
  }
  need(h, moe_h_floats(g, n_used) * 4, what, "h");

  const bool fused = down_acc.buffer != VK_NULL_HANDLE;
  if (fused) {
    if (!fold || hq.buffer == VK_NULL_HANDLE) runtime_error(what, ": the fused down needs the router fold and hq");
    if (!moe_fused_down_supported(ctx, g, n_used, max_binding_bytes))
      runtime_error(what, ": the fused down does not serve this tile or device (moe_fused_down_supported)");
    need(down_acc, moe_down_acc_bytes(g.n_embd), what, "down_acc");
  }

  const std::vector<TilePart> parts = op_parts(ctx, tile, false, max_binding_bytes, what);
  const MoeTuning t = resolve(tuning);
  const bool q8 = check_hq(ctx, hq, g, n_used, what);
  const uint32_t outs = q8 ? kQ8GateUpOutputs : t.gateup_teams;
  const uint32_t teams = q8_gateup_teams(t, wait.enabled(), gateup_groups(g, n_used, outs, true, g.has_shared()));
  const bool gated = gate.buffer != VK_NULL_HANDLE;
  if (gated && (!gate_supported(ctx) || gate.size < 8))
    runtime_error(what, ": no early-start gate here (it needs the router fold, int8 h, no fused down, one dispatch "
                  "and two gate words)");
  if (wait.enabled() && (!gated || !wait.valid()))
    runtime_error(what, ": an early-started gate-up also opens the down's gate and needs a gate word, error words "
                  "and a target above 0");
  const uint32_t groups_routed = uint32_t((g.w_routed + outs - 1) / outs);
  for (size_t i = 0; i < parts.size(); ++i) {
    const TilePart& p = parts[i];
    const bool vec8 = is_plain(p.type) && g.n_embd % 8 == 0;
    const uint32_t re = p.routed ? route_e(g.n_expert, fold || src.recompute) : 0;
    const Pipeline& pipe = q8 ? gateup_q8_kernel(ctx, p.type, uint32_t(g.n_embd), t, teams, re, fold, fused, kQ8GateUpOutputs,
                                                 gated, wait, routing.gating)
                              : gateup_kernel(ctx, p.type, vec8, t, re, fold);
    gpu::MoeArgs a = base_args(g, n_used);
    set_part(a, p);
    set_routing(a, src, routing, g);
    a.groups_routed = groups_routed;
    if (fold) {
      a.flags |= TS_MOE_NORM_INPUT | (i == 0 ? TS_MOE_ROUTE_WRITE : 0u);  // parts[0] is routed
      a.norm_eps = eps;
    }
    if (fused) {  // one part: the whole tile (moe_fused_down_supported)
      a.down_routed_offset = uint32_t(g.down_offset);
      a.down_shared_offset = uint32_t(g.shared_down_offset);
    }
    const uint64_t n_groups = gateup_groups(g, n_used, outs, p.routed, p.shared);
    const BufferSlice bufs[14] = {p.w,
                                 fold ? x : h2,
                                 fold ? norm_weight : h2,
                                 fold ? route : src.route,
                                 h,
                                 src.logits,
                                 src.bias,
                                 q8 ? hq : h,
                                 fold ? fold_acc : h,
                                 fused ? down_acc : h,
                                 x,
                                 gate,
                                 wait.words,
                                 wait.error};
    const GroupCounts gc = split_workgroups(n_groups, ctx.info());
    uint64_t part_bytes = bytes();
    if (parts.size() > 1) {  // this part's expected share: its experts' fraction of K, or the shared slot
      part_bytes = p.routed ? uint64_t(n_used) * read_bytes(g.gateup(0)) * (p.expert_hi - p.expert_lo) / g.n_expert
                            : read_bytes(g.gateup(g.n_expert));
    }
    rec.dispatch(pipe, std::span<const BufferSlice>(bufs, wait.enabled() ? 14 : gated ? 12 : fused ? 11 : fold ? 9 : q8 ? 8 : 7),
                 a, gc.x, gc.y,
                 1, what, part_bytes);
  }
}

// ---------------------------------------------------------------------------------------------
// MoeDownOp

uint64_t MoeDownOp::bytes() const {
  const MoeTileGeometry& g = tile.geometry;
  const uint32_t n_used = this->n_used ? this->n_used : routing.n_used;
  uint64_t b = uint64_t(n_used) * read_bytes(g.down(0));
  if (g.has_shared()) b += read_bytes(g.down(g.n_expert));
  b += (uint64_t(n_used) * g.w_routed + g.w_shared) * 4;
  b += uint64_t(n_used) * 8 + g.n_embd * 8;
  return b;
}

void MoeDownOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const MoeTileGeometry& g = tile.geometry;
  const std::string name = cat("moe_down.", type_name(g.down_type));
  const std::string what = label.empty() ? name : label;
  const RouteSource src = check_moe_common(tile, n_used, route, routing, logits, bias, what);
  const uint32_t n_used = src.n_used;
  need(h, moe_h_floats(g, n_used) * 4, what, "h");
  need(x, g.n_embd * 4, what, "x");

  const std::vector<TilePart> parts = op_parts(ctx, tile, true, max_binding_bytes, what);
  const MoeTuning t = resolve(tuning);
  const bool q8 = check_hq(ctx, hq, g, n_used, what);
  const bool gated = gate.buffer != VK_NULL_HANDLE;
  if (gated && (!gate_supported(ctx) || gate.size < (gate_signal_x ? TS_DOWN_GATE_WORDS * 4 : 8u) || gate_error.size < 8 ||
                gate_h_target == 0))
    runtime_error(what, ": no early-start wait here (it needs the int8 path with subgroups, the route buffer, one "
                  "dispatch, at most 8 weight blocks per lane, two gate words, an error word and a target)");
  for (size_t i = 0; i < parts.size(); ++i) {
    const TilePart& p = parts[i];
    const uint32_t rows_per_wg = q8 ? q8_down_rows(t, p.type, gated) : t.down_rows;
    const uint32_t groups = down_groups(g, rows_per_wg);
    const bool vec8 = is_plain(p.type) && (!p.routed || g.w_routed % 8 == 0) && (!p.shared || g.w_shared % 8 == 0);
    const uint32_t slots = (p.routed ? n_used : 0) + (p.shared ? 1 : 0);
    const uint32_t re = p.routed ? route_e(g.n_expert, src.recompute) : 0;
    const Pipeline& pipe = q8 ? down_q8_kernel(ctx, p.type, slots, uint64_t(n_used + 1) * moe_h_stride(g),
                                               std::max(g.w_routed, g.w_shared), rows_per_wg, re,
                                               gated ? gate_h_target : 0, gated && gate_signal_x, t.down_late,
                                               q8_down_first(t, p.type))
                              : down_kernel(ctx, p.type, vec8, slots, t, re);
    gpu::MoeArgs a = base_args(g, n_used);
    set_part(a, p);
    set_routing(a, src, routing, g);
    const BufferSlice bufs[9] = {p.w, h, x, src.route, src.logits, src.bias, q8 ? hq : h, gate, gate_error};
    uint64_t part_bytes = bytes();
    if (parts.size() > 1) {
      part_bytes = p.routed ? uint64_t(n_used) * read_bytes(g.down(0)) * (p.expert_hi - p.expert_lo) / g.n_expert
                            : read_bytes(g.down(g.n_expert));
      part_bytes += g.n_embd * 8;
    }
    if (i > 0) rec.barrier();  // every part adds into x
    rec.dispatch(pipe, std::span<const BufferSlice>(bufs, gated ? 9 : q8 ? 7 : 6), a, groups, 1, 1, what, part_bytes);
  }
}

bool MoeDownOp::gate_supported(Context& ctx) const {
  const MoeTileGeometry& g = tile.geometry;
  const uint32_t k = n_used ? n_used : routing.n_used;
  if (hq.buffer == VK_NULL_HANDLE || route.buffer == VK_NULL_HANDLE || !team_shape(ctx).subgroup) return false;
  if (!moe_q8_usable(ctx, g, k)) return false;
  const std::vector<TilePart> parts = op_parts(ctx, tile, true, max_binding_bytes, "moe_down");
  if (parts.size() != 1) return false;
  // The preloaded blocks per lane are sized by the widest slot for every slot. DeepSeek-V2-Lite's
  // shared slot (2816 wide: 3 blocks per lane, 6 with its 2 rows) took the gated kernel to 106
  // registers and the token from 457 to 430 tok/s (H100); GLM's 2 per lane gained 1.3-2 %.
  const uint64_t own = down_q8_own(ctx, std::max(g.w_routed, g.w_shared));
  return own <= kMaxGateOwn && uint64_t(q8_down_rows(resolve(tuning), parts[0].type, true)) * own <= 8;
}

uint32_t MoeDownOp::gate_x_target() const {
  // The groups of the one dispatch's workgroups (gate_supported: one part, of the routed down
  // type; moe_down.comp gate_signal_tree).
  return std::min(down_groups(tile.geometry, q8_down_rows(resolve(tuning), tile.geometry.down_type, true)),
                  TS_GATE_TREE_GROUPS);
}

bool MoeGateUpOp::gate_supported(Context& ctx) const {
  const MoeTileGeometry& g = tile.geometry;
  const uint32_t k = n_used ? n_used : routing.n_used;
  if (fold_acc.buffer == VK_NULL_HANDLE || hq.buffer == VK_NULL_HANDLE || down_acc.buffer != VK_NULL_HANDLE) return false;
  if (!moe_q8_usable(ctx, g, k)) return false;
  return op_parts(ctx, tile, false, max_binding_bytes, "moe_gateup").size() == 1;
}

uint32_t MoeGateUpOp::gate_h_target(Context& ctx) const {
  const MoeTileGeometry& g = tile.geometry;
  const uint32_t k = n_used ? n_used : routing.n_used;
  const uint64_t outs = hq.buffer != VK_NULL_HANDLE ? kQ8GateUpOutputs : resolve(tuning).gateup_teams;
  // The one part holds the routed slots and the shared one; every workgroup of the grid arrives.
  const GroupCounts gc = split_workgroups(gateup_groups(g, k, outs, true, g.has_shared()), ctx.info());
  return gc.x * gc.y;
}

}  // namespace tessera::vk
