#include "runtime/vulkan/kernels_prefill.h"

#include <algorithm>
#include <utility>

#include "format/error.h"
#include "runtime/vulkan/kernels_matmul.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "shaders/moe_args.h"
#include "shaders/prefill_args.h"

namespace tessera::vk {
namespace {

constexpr uint32_t kTeams = 4;              // moe_prefill: rows computed at once (one team each)
constexpr uint32_t kRowsPerWg = 4;          // moe_prefill: rows per workgroup
constexpr uint32_t kSharedThreadsPerRow = 32;  // team width without subgroup arithmetic
constexpr uint32_t kQ8WgSize = 256;         // moe_prefill, int8 path: invocations per workgroup
constexpr uint64_t kQ8StageBytes = 40960;   // shared memory for the staged int8 inputs
constexpr uint32_t kRouteWg = 64;           // moe_prefill_route, the routing (a workgroup per token)
constexpr uint32_t kListWg = 256;           // moe_prefill_route, the lists (a workgroup per expert)
constexpr uint32_t kRouteFromXWg = 1024;    // moe_prefill_route FROM_X (at most the device's limit)
constexpr uint32_t kRouteFromXLanes = 16;   // ... invocations per router row
constexpr uint32_t kRouteFromXBatch = 8;    // ... a lane's router loads issued together
constexpr uint32_t kUtilWg = 256;           // prefill_util

uint32_t ceil_div(uint64_t a, uint64_t b) { return uint32_t((a + b - 1) / b); }

void need(const BufferSlice& s, uint64_t bytes, const std::string& what, const char* binding) {
  if (s.buffer == VK_NULL_HANDLE) runtime_error(what, ": binding '", binding, "' is not set");
  if (s.size < bytes) runtime_error(what, ": binding '", binding, "' has ", s.size, " bytes, needs ", bytes);
}

// An input of `rows` rows of `cols` values as int8 blocks (RmsNormOp::y_q8, 48 bytes per 32 values).
void need_q8_rows(const BufferSlice& s, uint64_t rows, uint32_t cols, const std::string& what, const char* binding) {
  if (cols % 32 != 0) runtime_error(what, ": int8 input blocks of rows of ", cols, " values; expected a multiple of 32");
  need(s, rows * (cols / 32) * 48, what, binding);
}

void check_chunk(uint32_t t_max, const BufferSlice& step, uint32_t count_word, const std::string& what) {
  if (t_max == 0 || t_max > 65535) runtime_error(what, ": chunk of ", t_max, " tokens, expected 1..65535");
  need(step, (uint64_t(count_word) + 1) * 4, what, "step");
}

// The int8 path's split (FfnInt8Tuning) for a dispatch over the experts' lists (routed) or every
// token, and whether team sums use subgroup shuffles.
struct FfnInt8Split {
  uint32_t lanes, rows, outs;
  bool shuffle, unroll;
  uint32_t max_pairs;  // pairs per pass, at most (fewer where the shared memory holds fewer)
};
FfnInt8Split ffn_int8_split(Context& ctx, const FfnInt8Tuning& t, bool routed, bool down) {
  if (t.lanes && t.lanes != 8 && t.lanes != 16 && t.lanes != 32)
    usage_error("moe_prefill int8: ", t.lanes, " lanes per row, expected 8, 16 or 32");
  for (uint32_t r : {t.rows, t.rows_all})
    if (r && r != 32 && r != 64 && r != 128) usage_error("moe_prefill int8: ", r, " rows per workgroup, expected 32, 64 or 128");
  if (t.pairs && t.pairs != 1 && t.pairs != 2 && t.pairs != 4 && t.pairs != 8)
    usage_error("moe_prefill int8: ", t.pairs, " pairs per pass, expected 1, 2, 4 or 8");
  if (t.unroll > 2) usage_error("moe_prefill int8: unroll ", t.unroll, ", expected 1 (unrolled) or 2 (a loop)");
  if (t.outs > 2) usage_error("moe_prefill int8: ", t.outs, " output rows per team at once, expected 1 or 2");
  const uint32_t lanes = t.lanes ? t.lanes : 8, sg = ctx.info().subgroup_size;
  const DeviceFeatures& f = ctx.device().enabled();
  // Teams inside subgroups need every subgroup full and of the size the shader assumes.
  const bool shuffle = ctx.pipelines().use_subgroup() && f.subgroup_shuffle && f.subgroup_size_control &&
                       f.compute_full_subgroups && sg % lanes == 0 && kQ8WgSize % sg == 0;
  const uint32_t rows = routed ? (t.rows ? t.rows : 128) : (t.rows_all ? t.rows_all : 64);
  const uint32_t outs = t.outs ? t.outs : down ? 2 : 1;
  return {lanes, rows, outs, shuffle, t.unroll == 1, t.pairs ? t.pairs : 4};
}

// Pairs per pass of the int8 path for inputs of `in_cols` elements (at most q8.max_pairs, and what
// the staged blocks' shared memory holds beside the team sums' partials where shuffles are not
// used), or 0 where that path does not serve the type / device.
uint32_t q8_pairs_per_pass(Context& ctx, GgmlType type, uint32_t in_cols, const FfnInt8Split& q8) {
  if (in_cols % 32 != 0 || !q8_activations_type(ctx, type)) return 0;
  const uint64_t partials = q8.shuffle ? 0 : uint64_t(kQ8WgSize) * 16;
  const uint64_t room = ctx.info().max_compute_shared_memory - 1024 - partials;
  for (uint32_t tb : {8u, 4u, 2u, 1u})
    if (tb <= q8.max_pairs && uint64_t(tb) * (in_cols / 32) * 48 <= std::min<uint64_t>(kQ8StageBytes, room)) return tb;
  return 0;
}

// The moe_prefill pipeline for a weight type; tb > 0: the int8 path with tb pairs per pass.
// in_q8: the int8 path stages pre-quantized input blocks (FfnDispatch::in_q8).
const Pipeline& ffn_kernel(Context& ctx, GgmlType type, uint32_t tb, uint32_t in_cols, const FfnInt8Split& q8, bool down,
                           bool in_q8) {
  const bool sg = ctx.pipelines().use_subgroup();
  const uint32_t tpr = sg ? ctx.info().subgroup_size : kSharedThreadsPerRow;
  PipelineDesc desc;
  desc.file = "moe_prefill.comp";
  if (tb) {
    desc.name = cat("moe_prefill.", down ? "down." : "gateup.", type_name(type), ".q8act.tb", tb, ".l", q8.lanes, ".r", q8.rows, q8.outs > 1 ? ".o2" : "", q8.unroll ? ".u" : "", in_q8 ? ".xq8" : "");
    desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(type))},
                    {"WG_SIZE", std::to_string(kQ8WgSize)},
                    {"ROWS", std::to_string(q8.rows)},
                    {"Q8ACT", "1"},
                    {"TB", std::to_string(tb)},
                    {"IN_BLOCKS", std::to_string(in_cols / 32)},
                    {"Q8_BLOCKS", std::to_string(tb * (in_cols / 32))},
                    {"Q8_TPR", std::to_string(q8.lanes)},
                    {"Q8_SHUFFLE", q8.shuffle ? "1" : "0"},
                    {"Q8_UNROLL", q8.unroll ? "1" : "0"},
                    {"Q8_OUTS", std::to_string(q8.outs)},
                    {"PF_DOWN", down ? "1" : "0"},
                    {"IN_Q8", in_q8 ? "1" : "0"}};
    desc.full_subgroups = q8.shuffle;
  } else {
    desc.name = cat("moe_prefill.", type_name(type));
    desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(type))},
                    {"THREADS_PER_ROW", std::to_string(tpr)},
                    {"TEAMS", std::to_string(kTeams)},
                    {"WG_SIZE", std::to_string(tpr * kTeams)},
                    {"ROWS", std::to_string(kRowsPerWg)},
                    {"Q8ACT", "0"}};
    desc.full_subgroups = sg;
  }
  desc.num_buffers = 6;
  desc.push_bytes = sizeof(gpu::PrefillFfnArgs);
  return ctx.pipelines().get(desc);
}

// A byte range of `buffer` starting at `offset`, rounded up to 16 bytes but not past its end.
BufferSlice weight_slice(const Buffer& buffer, uint64_t offset, uint64_t bytes) {
  if (offset >= buffer.size()) runtime_error("weights at byte ", offset, " are outside buffer '", buffer.name(), "'");
  return buffer.slice(offset, std::min<uint64_t>((bytes + 15) / 16 * 16, buffer.size() - offset));
}

// One moe_prefill dispatch: `slots` workgroup rows (experts, or 1 for all tokens).
struct FfnDispatch {
  BufferSlice w;
  GgmlType type;
  gpu::PrefillFfnArgs args;
  uint32_t slots;
  BufferSlice in, out;
  BufferSlice in_f16;  // set: in's rows as f16 (args.in_stride f16 values apart), for the matmul form
  BufferSlice in_q8;   // set: in's rows as int8 blocks (RmsNormOp::y_q8; args.in_stride = the row
                       // length), staged by the int8 path as they are
  std::string label;
  uint64_t bytes;
};

// The matmul form's work split (moe_matmul.comp): 16 x MR staged rows (gate-up: MR / 2 gate and
// MR / 2 up tiles; MR = row_tiles, auto 4, else 2 where 4 does not fit: each workgroup stages its
// pairs' inputs once per step, so 4 row tiles read them half as often: H100, GLM pp512 3191 ->
// 3606 tok/s, session 21), 16 x TG pairs, steps of KT columns: the first of 64 / 128 / 256 that
// the weight type's unit span allows and the shared memory holds; STEP_PREFETCH bits; rsplit 2:
// the workgroup's 2 tg groups of 32 split the row tiles as well (RSPLIT).
struct FfnMatmulSplit {
  uint32_t mr, tg, kt, prefetch, dont_unroll, rsplit;
};
// routed: the dispatch's pairs come from the experts' lists (~T K / E each, so 64-pair workgroups
// are half empty: auto rsplit 2, H100 GLM pp512 5378 -> 5595 with every dispatch split, session
// 22); else every live token (the shared expert, a dense FFN: auto rsplit 1).
// shared_gateup: the shared expert's gate-up (all tokens, one interleaved matrix): auto steps of 32
// columns first (H100 GLM pp512: 107 -> 84 us a layer; its down and the routed parts lose with
// them, session 22).
FfnMatmulSplit ffn_matmul_split(Context& ctx, GgmlType type, const FfnMatmulTuning& t, bool down, bool routed,
                                bool shared_gateup) {
  if (t.row_tiles && t.row_tiles != 2 && t.row_tiles != 4 && t.row_tiles != 8)
    usage_error("moe_matmul: ", t.row_tiles, " row tiles, expected 2, 4 or 8");
  if (t.step && t.step != 32 && t.step != 64 && t.step != 128 && t.step != 256)
    usage_error("moe_matmul: steps of ", t.step, " columns, expected 32, 64, 128 or 256");
  if (t.prefetch > 4) usage_error("moe_matmul: prefetch ", t.prefetch, ", expected 1 (none), 2 (W), 3 (inputs) or 4 (both)");
  if (t.groups && t.groups != 1 && t.groups != 2 && t.groups != 4) usage_error("moe_matmul: ", t.groups, " groups, expected 1, 2 or 4");
  if (t.loop > 2) usage_error("moe_matmul: loop ", t.loop, ", expected 1 (unrolled) or 2 (a loop)");
  if (t.split_rows > 2) usage_error("moe_matmul: split_rows ", t.split_rows, ", expected 1 or 2");
  // Each group's row tiles: the gate-up's in gate / up pairs.
  auto mr_fits = [&](uint32_t mr, uint32_t rsplit) { return mr % rsplit == 0 && (down || (mr / rsplit) % 2 == 0); };
  if (t.groups == 4 && t.split_rows == 2) usage_error("moe_matmul: 4 groups of pairs cannot split their rows (8 groups of 32)");
  if (t.row_tiles && t.split_rows == 2 && !mr_fits(t.row_tiles, 2))
    usage_error("moe_matmul: ", t.row_tiles, " row tiles cannot be split in 2", down ? "" : " (gate and up tiles in pairs)");
  const std::vector<uint32_t> rsplits = t.split_rows ? std::vector<uint32_t>{t.split_rows == 2 ? 2u : 1u}
                                        : routed    ? std::vector<uint32_t>{2, 1}
                                                    : std::vector<uint32_t>{1};
  const uint32_t prefetch = t.prefetch ? t.prefetch - 1 : 3, dont_unroll = t.loop == 1 ? 0 : 1;
  const std::vector<uint32_t> tgs = t.groups ? std::vector<uint32_t>{t.groups} : std::vector<uint32_t>{4, 2, 1};
  const std::vector<uint32_t> mrs = t.row_tiles ? std::vector<uint32_t>{t.row_tiles} : std::vector<uint32_t>{4, 2};
  const std::vector<uint32_t> kts = t.step        ? std::vector<uint32_t>{t.step}
                                    : shared_gateup ? std::vector<uint32_t>{32, 64, 128, 256}
                                                    : std::vector<uint32_t>{64, 128, 256};
  for (uint32_t rsplit : rsplits)
    for (uint32_t mr : mrs)
      for (uint32_t tg : tgs)
        for (uint32_t kt : kts)
          if (mr_fits(mr, rsplit) && tg * rsplit <= 4 && kt % matmul_step_granule(type) == 0 &&
              matmul_shared_bytes(mr, tg, kt) <= ctx.info().max_compute_shared_memory)
            return {mr, tg, kt, prefetch, dont_unroll, rsplit};
  runtime_error("moe_matmul: no work split of ", type_name(type), " fits ", ctx.info().name, "'s shared memory",
                t.step ? cat(" with steps of ", t.step, " columns") : std::string());
}

// Whether the matmul form takes this dispatch: input rows of a multiple of 32 values, 16-byte
// aligned (else the dispatch keeps moe_prefill.comp).
bool ffn_matmul_fits(const FfnDispatch& d) {
  const bool down = (d.args.flags & TS_PF_DOWN) != 0;
  return (down ? d.args.width : d.args.n_embd) % 32 == 0 && d.args.in_stride % 4 == 0;
}

// The matmul form of one dispatch (moe_matmul.comp; same bindings and arguments).
void record_ffn_matmul(CommandRecorder& rec, const FfnDispatch& d, const BufferSlice& lists, const BufferSlice& route,
                       const BufferSlice& step, MatmulKernel kernel, const FfnMatmulTuning& tuning) {
  Context& ctx = rec.context();
  const bool down = (d.args.flags & TS_PF_DOWN) != 0;
  if (!matmul_supported(ctx)) runtime_error(d.label, ": the matmul form needs shaderFloat16, which ", ctx.info().name, " lacks");
  const bool coop = matmul_uses_coop(ctx, kernel);
  if (coop && !matmul_coop_supported(ctx)) runtime_error(d.label, ": no 16x16x16 f16 cooperative matrices on ", ctx.info().name);
  if (!ffn_matmul_fits(d))
    runtime_error(d.label, ": the matmul form takes rows of a multiple of 32 values (", down ? d.args.width : d.args.n_embd,
                  ") and 16-byte input rows");
  const bool routed = (d.args.flags & TS_PF_ALL_TOKENS) == 0;
  const bool shared_gateup = !down && !routed && (d.args.flags & TS_PF_SEPARATE_GATE_UP) == 0;
  const FfnMatmulSplit s = ffn_matmul_split(ctx, d.type, tuning, down, routed, shared_gateup);
  PipelineDesc desc;
  desc.name = cat("moe_matmul.", type_name(d.type), coop ? ".coop" : ".plain");
  desc.file = "moe_matmul.comp";
  desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(d.type))},
                  {"MR", std::to_string(s.mr)},
                  {"TG", std::to_string(s.tg * s.rsplit)},
                  {"RSPLIT", std::to_string(s.rsplit)},
                  {"KT", std::to_string(s.kt)},
                  {"STEP_PREFETCH", std::to_string(s.prefetch)},
                  {"IN_F16", d.in_f16.buffer ? "1" : "0"},
                  {"ACC_DONT_UNROLL", std::to_string(s.dont_unroll)},
                  {"COOP", coop ? "1" : "0"}};
  desc.num_buffers = 6;
  desc.push_bytes = sizeof(gpu::PrefillFfnArgs);
  desc.full_subgroups = ctx.pipelines().use_subgroup();
  const Pipeline& pipe = ctx.pipeline(desc);
  const uint32_t out_rows = down ? d.args.n_embd : d.args.width;
  const uint32_t outs = down ? 16 * s.mr : 8 * s.mr;  // gate-up: a gate and an up tile per 16 outputs
  const BufferSlice in = d.in_f16.buffer ? d.in_f16 : d.in;
  const BufferSlice b[6] = {d.w, in, d.out, lists.buffer ? lists : step, route.buffer ? route : step, step};
  rec.dispatch(pipe, b, d.args, ceil_div(out_rows, outs), d.slots, ceil_div(d.args.t_max, 16 * s.tg), d.label + " matmul", d.bytes);
}

// int8: the op's int8_activations choice (the int8 path runs where it serves the type).
void record_ffn(CommandRecorder& rec, const FfnDispatch& d, const BufferSlice& lists, const BufferSlice& route,
                const BufferSlice& step, bool int8, const FfnInt8Tuning& int8_tuning) {
  const bool down = (d.args.flags & TS_PF_DOWN) != 0;
  const uint32_t in_cols = down ? d.args.width : d.args.n_embd;
  const FfnInt8Split q8 = ffn_int8_split(rec.context(), int8_tuning, (d.args.flags & TS_PF_ALL_TOKENS) == 0, down);
  const uint32_t tb = int8 ? q8_pairs_per_pass(rec.context(), d.type, in_cols, q8) : 0;
  const bool in_q8 = tb && d.in_q8.buffer;
  const Pipeline& pipe = ffn_kernel(rec.context(), d.type, tb, in_cols, q8, down, in_q8);
  const uint32_t out_rows = down ? d.args.n_embd : d.args.width;
  // Unused bindings (dense FFN: no lists / route) point at a valid buffer.
  const BufferSlice b[6] = {d.w, in_q8 ? d.in_q8 : d.in, d.out, lists.buffer ? lists : step, route.buffer ? route : step, step};
  // int8 path: z = the slot's passes of tb pairs, one workgroup each (empty ones exit at once).
  rec.dispatch(pipe, b, d.args, ceil_div(out_rows, tb ? q8.rows : kRowsPerWg), d.slots,
               tb ? ceil_div(d.args.t_max, tb) : 1, tb ? d.label + " q8act" : d.label, d.bytes);
}

// How an op records its FFN dispatches: the matmul form where asked and the dispatch fits it, else
// moe_prefill.comp (int8 where asked and served).
void record_ffn_part(CommandRecorder& rec, const FfnDispatch& d, const BufferSlice& lists, const BufferSlice& route,
                     const BufferSlice& step, const FfnForm& form) {
  if (form.matmul && ffn_matmul_fits(d)) record_ffn_matmul(rec, d, lists, route, step, form.matmul_kernel, form.matmul_tuning);
  else record_ffn(rec, d, lists, route, step, form.int8_activations, form.int8_tuning);
}

uint64_t split_read_bytes(const Split1Geometry& g) { return g.rows * g.blocks_per_row * (g.q_bytes + g.m_bytes); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// PrefillRouteOp

uint64_t PrefillRouteOp::bytes() const {
  const uint64_t from_x = router.buffer ? router.read_bytes() + uint64_t(t_max) * router.cols * 4 : 0;
  return from_x + uint64_t(t_max) * n_expert * 4 + 2 * prefill_route_bytes(t_max, routing.n_used) + prefill_list_bytes(t_max, n_expert);
}

bool route_from_x_supported(const MatrixRef& router) {
  return router.layout == WeightLayout::Plain && (router.type == GgmlType::F32 || router.type == GgmlType::F16) &&
         router.cols % 4 == 0 && router.cols > 0 && router.cols <= kRouteFromXMaxEmbd;
}

void PrefillRouteOp::record(CommandRecorder& rec) const {
  const std::string what = label.empty() ? "moe_prefill_route" : label;
  check_chunk(t_max, step, count_word, what);
  const uint32_t K = routing.n_used;
  if (n_expert == 0 || n_expert > TS_ROUTE_MAX_E)
    runtime_error(what, ": ", n_expert, " experts; the routing handles 1..", TS_ROUTE_MAX_E);
  if (K == 0 || K > n_expert || K > TS_ROUTE_MAX_K)
    runtime_error(what, ": ", K, " experts used of ", n_expert, "; expected 1..", std::min(n_expert, TS_ROUTE_MAX_K));
  if (routing.gating != GatingFunc::Softmax && routing.gating != GatingFunc::Sigmoid)
    runtime_error(what, ": expert gating function ", uint32_t(routing.gating), " is not supported");
  need(logits, uint64_t(t_max) * n_expert * 4, what, "logits");
  need(route, prefill_route_bytes(t_max, K), what, "route");
  need(lists, prefill_list_bytes(t_max, n_expert), what, "lists");
  const bool has_bias = bias.buffer != VK_NULL_HANDLE;
  if (has_bias) need(bias, uint64_t(n_expert) * 4, what, "bias");

  const bool from_x = router.buffer != nullptr;
  uint32_t x_wg = 0, x_lanes = 0, x_batch = 0;  // FROM_X: invocations per workgroup (a power of two), per row, loads
  if (from_x) {
    if (!route_from_x_supported(router))
      runtime_error(what, ": the router matrix (", type_name(router.type), ", ", router.rows, " x ", router.cols,
                    ") cannot be read by the routing kernel; expected plain f32 / f16 rows of a multiple of 4 values, at most ",
                    kRouteFromXMaxEmbd);
    if (router.rows != n_expert) runtime_error(what, ": router matrix of ", router.rows, " rows for ", n_expert, " experts");
    router.validate(what.c_str());
    need(x, uint64_t(t_max) * router.cols * 4, what, "x");
    need(norm, uint64_t(router.cols) * 4, what, "norm weight");
    const uint32_t limit = rec.context().info().max_compute_workgroup_invocations;
    x_wg = tuning.wg;
    if (!x_wg)
      for (x_wg = kRouteFromXWg; x_wg > limit;) x_wg /= 2;
    x_lanes = tuning.lanes ? tuning.lanes : kRouteFromXLanes;
    x_batch = tuning.batch ? tuning.batch : kRouteFromXBatch;
    if (x_wg < 64 || (x_wg & (x_wg - 1)) != 0 || x_wg > limit || (x_lanes != 4 && x_lanes != 8 && x_lanes != 16 && x_lanes != 32) ||
        (x_batch != 4 && x_batch != 8 && x_batch != 16))
      runtime_error(what, ": routing work split of ", x_wg, " invocations (device limit ", limit, "), ", x_lanes,
                    " lanes per router row, batches of ", x_batch, "; expected a power of two from 64, 4/8/16/32 lanes, 4/8/16 loads");
  }
  auto pipeline = [&](bool lists) -> const Pipeline& {
    PipelineDesc desc;
    const bool fx = from_x && !lists;
    desc.name = lists ? "moe_prefill_route.lists" : fx ? "moe_prefill_route.from_x" : "moe_prefill_route";
    desc.file = "moe_prefill_route.comp";
    // The lists' pair order needs full subgroups of the required size (lanes in invocation order).
    const DeviceFeatures& f = rec.context().device().enabled();
    const bool sg_lists = lists && rec.context().pipelines().use_subgroup() && f.subgroup_size_control && f.compute_full_subgroups;
    desc.defines = {{"WG_SIZE", std::to_string(lists ? kListWg : fx ? x_wg : kRouteWg)},
                    {"N_EXPERT", std::to_string(n_expert)},
                    {"LISTS", lists ? "1" : "0"},
                    {"LISTS_SUBGROUP", sg_lists ? "1" : "0"},
                    {"FROM_X", fx ? "1" : "0"}};
    if (fx) {
      desc.name += cat(".w", x_wg, ".l", x_lanes, ".b", x_batch);
      desc.defines["N_EMBD"] = std::to_string(router.cols);
      desc.defines["LANES"] = std::to_string(x_lanes);
      desc.defines["BATCH"] = std::to_string(x_batch);
      desc.defines["W_F16"] = router.type == GgmlType::F16 ? "1" : "0";
    }
    desc.num_buffers = fx ? 8 : 5;
    desc.push_bytes = sizeof(gpu::PrefillRouteArgs);
    desc.full_subgroups = sg_lists;
    return rec.context().pipelines().get(desc);
  };
  gpu::PrefillRouteArgs a{};
  a.n_expert = n_expert;
  a.n_used = K;
  a.t_max = t_max;
  a.count_word = count_word;
  a.gating = uint32_t(routing.gating);
  a.route_flags = (has_bias ? TS_ROUTER_EXPERT_BIAS : 0u) | (routing.norm_weights ? TS_ROUTER_NORM_WEIGHTS : 0u);
  a.weights_scale = routing.weights_scale;
  a.norm_eps = eps;
  // Bindings 0-4 for both dispatches; FROM_X also reads x, the norm weight and the router.
  const BufferSlice b[8] = {logits, has_bias ? bias : logits, step, route, lists, x, norm,
                            from_x ? weight_slice(*router.buffer, router.offset, router.read_bytes()) : BufferSlice{}};
  const uint64_t lists_bytes = prefill_route_bytes(t_max, K) + prefill_list_bytes(t_max, n_expert);
  rec.dispatch(pipeline(false), std::span<const BufferSlice>(b, from_x ? 8 : 5), a, t_max, 1, 1, what, bytes() - lists_bytes);
  rec.barrier();
  rec.dispatch(pipeline(true), std::span<const BufferSlice>(b, 5), a, n_expert, 1, 1, what + " lists", lists_bytes);
}

// ---------------------------------------------------------------------------------------------
// MoePrefillOp

uint64_t MoePrefillOp::gateup_bytes() const {
  const MoeTileGeometry& g = tile.geometry;
  uint64_t w = uint64_t(g.n_expert) * split_read_bytes(g.gateup(0));
  if (g.has_shared()) w += split_read_bytes(g.gateup(g.n_expert));
  return w + uint64_t(t_max) * g.n_embd * (form.matmul && h2_f16.buffer ? 2 : 4) + prefill_pairs(t_max, n_used) * std::max(g.w_routed, g.w_shared) * 4;
}

uint64_t MoePrefillOp::down_bytes() const {
  const MoeTileGeometry& g = tile.geometry;
  uint64_t w = uint64_t(g.n_expert) * split_read_bytes(g.down(0));
  if (g.has_shared()) w += split_read_bytes(g.down(g.n_expert));
  return w + prefill_pairs(t_max, n_used) * (std::max(g.w_routed, g.w_shared) + g.n_embd) * 4;
}

namespace {

// The dispatches of one MoE part (gate-up or down) over the tile.
std::vector<FfnDispatch> moe_dispatches(const MoePrefillOp& op, bool down, Context& ctx) {
  const MoeTileGeometry& g = op.tile.geometry;
  const std::string what = (op.label.empty() ? std::string("moe_prefill") : op.label) + (down ? " down" : " gateup");
  check_chunk(op.t_max, op.step, op.count_word, what);
  if (op.tile.buffer == nullptr) runtime_error(what, ": the tile buffer is not set");
  const uint32_t K = op.n_used;
  if (K == 0 || K > g.n_expert || K > TS_ROUTE_MAX_K) runtime_error(what, ": ", K, " experts used of ", g.n_expert);
  if (g.n_embd % 4 != 0) runtime_error(what, ": n_embd ", g.n_embd, " must be a multiple of 4");
  if (g.total_bytes >= (uint64_t(1) << 32)) runtime_error(what, ": tile of ", g.total_bytes, " bytes exceeds 4 GiB");
  const uint32_t hs = moe_h_stride(g);
  const uint64_t pairs = prefill_pairs(op.t_max, K);
  need(op.h2, uint64_t(op.t_max) * g.n_embd * 4, what, "h2");
  const bool in_f16 = !down && op.h2_f16.buffer != VK_NULL_HANDLE;
  if (in_f16) {
    if (g.n_embd % 8 != 0) runtime_error(what, ": f16 input rows of ", g.n_embd, " values; expected a multiple of 8");
    need(op.h2_f16, uint64_t(op.t_max) * g.n_embd * 2, what, "h2_f16");
  }
  const bool in_q8 = !down && op.h2_q8.buffer != VK_NULL_HANDLE;
  if (in_q8) need_q8_rows(op.h2_q8, op.t_max, uint32_t(g.n_embd), what, "h2_q8");
  need(op.h, pairs * hs * 4, what, "h");
  need(op.y, pairs * g.n_embd * 4, what, "y");
  need(op.route, prefill_route_bytes(op.t_max, K), what, "route");
  need(op.lists, prefill_list_bytes(op.t_max, g.n_expert), what, "lists");

  gpu::PrefillFfnArgs base{};
  base.n_embd = uint32_t(g.n_embd);
  base.n_used = K;
  base.t_max = op.t_max;
  base.flags = down ? TS_PF_DOWN : 0u;
  base.count_word = op.count_word;
  base.n_expert = g.n_expert;
  base.slot_stride = uint32_t(g.slot_stride);
  base.in_stride = down ? hs : uint32_t(g.n_embd);
  base.out_stride = down ? uint32_t(g.n_embd) : hs;
  const BufferSlice in = down ? op.h : op.h2, out = down ? op.y : op.h;

  std::vector<FfnDispatch> ds;
  const uint64_t dev_limit = ctx.info().max_storage_buffer_range;
  const uint64_t limit = op.max_binding_bytes ? std::min(op.max_binding_bytes, dev_limit) : dev_limit;
  const uint64_t per = limit / g.slot_stride;
  if (per == 0) runtime_error(what, ": one expert slot of ", g.slot_stride, " bytes exceeds the binding limit ", limit);
  const uint64_t routed_w = down ? split_read_bytes(g.down(0)) : split_read_bytes(g.gateup(0));
  for (uint64_t lo = 0; lo < g.n_expert; lo += per) {
    const uint64_t hi = std::min<uint64_t>(lo + per, g.n_expert);
    FfnDispatch d{};
    d.w = weight_slice(*op.tile.buffer, op.tile.offset + lo * g.slot_stride, (hi - lo) * g.slot_stride);
    d.type = down ? g.down_type : g.gateup_type;
    d.args = base;
    d.args.width = uint32_t(g.w_routed);
    d.args.expert_lo = uint32_t(lo);
    d.args.mat_offset = uint32_t(down ? g.down_offset : 0);
    d.slots = uint32_t(hi - lo);
    d.in = in;
    if (in_f16) d.in_f16 = op.h2_f16;
    if (in_q8) d.in_q8 = op.h2_q8;
    d.out = out;
    d.label = what;
    d.bytes = (hi - lo) * routed_w;
    ds.push_back(d);
  }
  if (g.has_shared()) {
    const Split1Geometry sg = down ? g.down(g.n_expert) : g.gateup(g.n_expert);
    FfnDispatch d{};
    d.w = weight_slice(*op.tile.buffer, op.tile.offset + (down ? g.shared_down_offset : g.shared_gateup_offset),
                       sg.total_bytes);
    d.type = down ? g.shared_down_type : g.shared_gateup_type;
    d.args = base;
    d.args.flags |= TS_PF_ALL_TOKENS;
    d.args.width = uint32_t(g.w_shared);
    d.args.pair_base = op.t_max * K;
    d.slots = 1;
    d.in = in;
    if (in_f16) d.in_f16 = op.h2_f16;
    if (in_q8) d.in_q8 = op.h2_q8;
    d.out = out;
    d.label = what + " shared";
    d.bytes = split_read_bytes(sg);
    ds.push_back(d);
  }
  // The declared bytes: weights per dispatch, the activations on the first.
  uint64_t weights = 0;
  for (const FfnDispatch& d : ds) weights += d.bytes;
  ds.front().bytes += (down ? op.down_bytes() : op.gateup_bytes()) - weights;
  return ds;
}

}  // namespace

void MoePrefillOp::record_gateup(CommandRecorder& rec) const {
  for (const FfnDispatch& d : moe_dispatches(*this, false, rec.context()))
    record_ffn_part(rec, d, lists, route, step, form);
}

void MoePrefillOp::record_down(CommandRecorder& rec) const {
  for (const FfnDispatch& d : moe_dispatches(*this, true, rec.context()))
    record_ffn_part(rec, d, lists, route, step, form);
}

// ---------------------------------------------------------------------------------------------
// DensePrefillOp

uint64_t DensePrefillOp::gateup_bytes() const {
  return gate.read_bytes() + up.read_bytes() + uint64_t(t_max) * (gate.cols + gate.rows) * 4;
}
uint64_t DensePrefillOp::down_bytes() const { return down.read_bytes() + uint64_t(t_max) * (down.cols + down.rows) * 4; }

void DensePrefillOp::record_gateup(CommandRecorder& rec) const {
  const std::string what = (label.empty() ? std::string("dense_prefill") : label) + " gateup";
  check_chunk(t_max, step, count_word, what);
  gate.validate(what.c_str());
  up.validate(what.c_str());
  if (gate.buffer != up.buffer || gate.type != up.type || gate.rows != up.rows || gate.cols != up.cols)
    runtime_error(what, ": gate and up must have one buffer, type and shape");
  if (gate.cols % 4 != 0) runtime_error(what, ": n_embd ", gate.cols, " must be a multiple of 4");
  need(h2, uint64_t(t_max) * gate.cols * 4, what, "h2");
  need(h, uint64_t(t_max) * gate.rows * 4, what, "h");
  const uint64_t lo = std::min(gate.offset, up.offset) / 256 * 256;
  const uint64_t hi = std::max(gate.offset + gate.bytes(), up.offset + up.bytes());
  if (hi - lo > rec.context().info().max_storage_buffer_range)
    runtime_error(what, ": gate and up span ", hi - lo, " bytes, more than one binding holds");
  FfnDispatch d{};
  d.w = weight_slice(*gate.buffer, lo, hi - lo);
  d.type = gate.type;
  d.args.n_embd = gate.cols;
  d.args.width = gate.rows;
  d.args.t_max = t_max;
  d.args.flags = TS_PF_ALL_TOKENS | TS_PF_SEPARATE_GATE_UP;
  d.args.count_word = count_word;
  d.args.mat_offset = uint32_t(gate.offset - lo);
  d.args.up_offset = uint32_t(up.offset - lo);
  d.args.in_stride = gate.cols;
  d.args.out_stride = gate.rows;
  d.slots = 1;
  d.in = h2;
  if (h2_q8.buffer) {
    need_q8_rows(h2_q8, t_max, uint32_t(gate.cols), what, "h2_q8");
    d.in_q8 = h2_q8;
  }
  d.out = h;
  d.label = what;
  d.bytes = gateup_bytes();
  record_ffn_part(rec, d, {}, {}, step, form);
}

void DensePrefillOp::record_down(CommandRecorder& rec) const {
  const std::string what = (label.empty() ? std::string("dense_prefill") : label) + " down";
  check_chunk(t_max, step, count_word, what);
  down.validate(what.c_str());
  if (down.rows % 4 != 0 || down.cols % 4 != 0) runtime_error(what, ": down ", down.rows, " x ", down.cols, " must be multiples of 4");
  need(h, uint64_t(t_max) * down.cols * 4, what, "h");
  need(y, uint64_t(t_max) * down.rows * 4, what, "y");
  const uint64_t lo = down.offset / 256 * 256;
  FfnDispatch d{};
  d.w = weight_slice(*down.buffer, lo, down.offset + down.bytes() - lo);
  d.type = down.type;
  d.args.n_embd = down.rows;
  d.args.width = down.cols;
  d.args.t_max = t_max;
  d.args.flags = TS_PF_DOWN | TS_PF_ALL_TOKENS;
  d.args.count_word = count_word;
  d.args.mat_offset = uint32_t(down.offset - lo);
  d.args.in_stride = down.cols;
  d.args.out_stride = down.rows;
  d.slots = 1;
  d.in = h;
  d.out = y;
  d.label = what;
  d.bytes = down_bytes();
  record_ffn_part(rec, d, {}, {}, step, form);
}

// ---------------------------------------------------------------------------------------------
// PrefillSumOp, PrefillGatherOp

namespace {
const Pipeline& util_kernel(Context& ctx, uint32_t mode) {
  PipelineDesc desc;
  desc.name = mode == 1 ? "prefill_sum" : "prefill_gather";
  desc.file = "prefill_util.comp";
  desc.defines = {{"MODE", std::to_string(mode)}, {"WG_SIZE", std::to_string(kUtilWg)}};
  desc.num_buffers = 3;
  desc.push_bytes = sizeof(gpu::PrefillUtilArgs);
  return ctx.pipelines().get(desc);
}
}  // namespace

uint64_t PrefillSumOp::bytes() const {
  return uint64_t(t_max) * n_embd * 4 * (2 + n_used + (has_shared ? 1 : 0));
}

RmsNormOp::ResidualSum PrefillSumOp::residual_sum() const {
  RmsNormOp::ResidualSum add;
  add.y = y;
  add.n_used = n_used;
  add.has_shared = has_shared;
  add.pair_base = t_max * n_used;
  add.step = step;
  add.count_word = count_word;
  return add;
}

void PrefillSumOp::record(CommandRecorder& rec) const {
  check_chunk(t_max, step, count_word, label);
  if (n_embd == 0) runtime_error(label, ": n_embd is 0");
  need(x, uint64_t(t_max) * n_embd * 4, label, "x");
  need(y, prefill_pairs(t_max, n_used) * n_embd * 4 - (has_shared ? 0 : uint64_t(t_max) * n_embd * 4), label, "y");
  gpu::PrefillUtilArgs a{};
  a.n_embd = n_embd;
  a.n_used = n_used;
  a.count_word = count_word;
  a.has_shared = has_shared ? 1u : 0u;
  a.pair_base = t_max * n_used;
  const BufferSlice b[3] = {x, y, step};
  rec.dispatch(util_kernel(rec.context(), 1), b, a, ceil_div(n_embd, kUtilWg), t_max, 1, label, bytes());
}

void PrefillGatherOp::record(CommandRecorder& rec) const {
  need(step, (uint64_t(count_word) + 1) * 4, label, "step");
  need(out, uint64_t(n_embd) * 4, label, "out");
  if (n_embd == 0 || x.size < uint64_t(n_embd) * 4) runtime_error(label, ": x binding too small or n_embd 0");
  gpu::PrefillUtilArgs a{};
  a.n_embd = n_embd;
  a.count_word = count_word;
  const BufferSlice b[3] = {x, out, step};
  rec.dispatch(util_kernel(rec.context(), 2), b, a, ceil_div(n_embd, kUtilWg), 1, 1, label, bytes());
}
}  // namespace tessera::vk
