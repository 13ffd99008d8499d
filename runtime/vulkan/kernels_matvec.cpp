#include "runtime/vulkan/kernels_matvec.h"

#include "format/error.h"
#include "shaders/kernel_args.h"
#include "shaders/moe_args.h"

namespace tessera::vk {
namespace {

constexpr uint32_t kGroupsPerWorkgroup = 4;  // subgroups (row groups) per workgroup
constexpr uint32_t kSharedThreadsPerRow = 32;  // row width of the shared-memory reduction path
constexpr uint32_t kMinWorkgroups = 256;       // int8 path: rows per subgroup are lowered to reach this
constexpr uint32_t kFewRows = 2048;            // int8 path, one vector: at most this many rows -> 16 x 1
constexpr uint64_t kQ8StageBytes = 36864;      // int8 path: shared memory for the staged columns
// The early start reads x's blocks after the gate per lane with plain loads (GATE_X 2): the fence
// after the poll orders them, and the teams of a workgroup share them through L1. On the H100,
// GLM tg128 at 512 positions: 300.2 tok/s against 293.4 with one coherent copy per workgroup
// into shared memory (GATE_X 1) and 232 with coherent per-lane loads (GATE_X 0, which go to the
// L2 16 times per block); PERFORMANCE.md session 10.
constexpr uint32_t kAutoGateX = 2;
// The most weight blocks per lane the staged decode kernel loads before staging x by default
// (MatvecTuning::preload_blocks): q_a / kv_a (one row per subgroup, 2 blocks).
constexpr uint32_t kAutoPreloadBlocks = 2;

// matvec_q8.comp GATE_X of a tuning (MatvecTuning::gate_x is that plus one; 0: kAutoGateX).
uint32_t gate_x_of(const MatvecTuning& t) { return t.gate_x ? t.gate_x - 1 : kAutoGateX; }

struct Variant {
  bool plain, vec8, norm, q8, xq8, gated, signals, oq8, xss, heads, res, pf;
};

Variant variant_of(const MatvecOp& op, Context* ctx) {
  const bool plain = op.w.layout == WeightLayout::Plain;
  const uint32_t xs = op.x_stride ? op.x_stride : op.w.cols;
  const bool x_aligned = op.x_offset % 4 == 0 && (op.batch == 1 || xs % 4 == 0);
  // matvec_q8 stages rows of any length in passes: only the type and the device matter.
  const bool q8 = ctx && op.int8_activations && !plain && x_aligned && op.w.cols % 32 == 0 &&
                  q8_activations_type(*ctx, op.w.type);
  const bool norm = op.norm_weight.buffer != VK_NULL_HANDLE;
  const bool xq8 = q8 && op.x_q8.buffer != VK_NULL_HANDLE && op.batch == 1 && !norm && op.x_offset % 32 == 0;
  const bool gated = q8 && op.batch == 1 && op.gate.enabled();
  const bool signals = q8 && op.batch == 1 && op.signal.buffer != VK_NULL_HANDLE;
  const bool oq8 = q8 && op.batch == 1 && op.out_q8.buffer != VK_NULL_HANDLE;
  const bool xss = xq8 && op.x_ss.buffer != VK_NULL_HANDLE;
  const bool heads = xq8 && op.x_head_rows != 0;
  const bool res = q8 && op.batch == 1 && op.accumulate && op.residual.buffer != VK_NULL_HANDLE;
  const bool pf = gated && !op.tuning.gate_late && op.row_prefetch.enabled();
  return {plain, plain && op.w.cols % 8 == 0 && x_aligned, norm, q8, xq8, gated, signals, oq8, xss, heads, res, pf};
}

// The x vectors one column reads: rows / x_head_rows for stacked per-head matrices, else 1.
uint64_t x_vectors(const MatvecOp& op) {
  return op.x_head_rows && op.w.rows % op.x_head_rows == 0 ? op.w.rows / op.x_head_rows : 1;
}

// Subgroups per row of the int8 decode kernel (MatvecTuning::ksplit where it applies, else 1):
// `teams` subgroups per workgroup, rows of more than two loop iterations per lane. Auto: 2 where
// x comes pre-quantized (nothing staged per workgroup, so twice the workgroups cost nothing: H100,
// GLM W_vo with the merge's int8 olat 15.8 -> 13.7 us), else 1 (each workgroup stages the whole
// input: W_vo 17.8 -> 20.7 us with 2; PERFORMANCE.md).
uint32_t ksplit_of(const MatvecOp& op, Context& ctx, uint32_t teams) {
  const Variant v = variant_of(op, &ctx);
  const uint32_t k = op.tuning.ksplit ? op.tuning.ksplit : v.xq8 ? 2u : 1u;
  const uint32_t bpi = op.tuning.blocks_per_iter ? op.tuning.blocks_per_iter : 2u;
  if (k <= 1 || op.batch != 1 || !ctx.pipelines().use_subgroup() || !v.q8 || teams % k != 0) return 1;
  return op.w.cols / 32 > 2 * bpi * ctx.info().subgroup_size ? k : 1u;
}

// Subgroups per workgroup of the int8 decode kernel: 16 for matrices of at most kFewRows rows
// (each workgroup stages the input once for 16 rows), else kGroupsPerWorkgroup.
uint32_t q8_decode_teams(const MatvecOp& op) {
  return op.tuning.teams ? op.tuning.teams : op.w.rows <= kFewRows ? 16u : kGroupsPerWorkgroup;
}

// The int8 decode kernel's work split (batch 1): subgroups per workgroup, rows per team,
// subgroups per row.
struct DecodeSplit {
  uint32_t teams, nrows, ksplit;
};
// Rows the int8 output needs whole per workgroup (OUT_Q8): 32 (blocks), 16 (OUT_HALVES: half
// blocks, MatvecOp::out_q8_halves with the next norm); with_out: as if out_q8 were set.
uint32_t out_granule(const MatvecOp& op, bool with_out) {
  if (!with_out && op.out_q8.buffer == VK_NULL_HANDLE) return 0;
  return op.out_q8_halves && op.out_q8_norm.buffer != VK_NULL_HANDLE ? 16u : 32u;
}

// granule (OUT_Q8, out_granule): that many rows per workgroup where the teams allow it.
DecodeSplit q8_decode_split(const MatvecOp& op, Context& ctx, uint32_t granule) {
  const uint32_t nb = op.w.cols / 32;
  const uint32_t tpr = ctx.pipelines().use_subgroup() ? ctx.info().subgroup_size : kSharedThreadsPerRow;
  const bool few = op.w.rows <= kFewRows;
  uint32_t teams = q8_decode_teams(op);
  uint32_t nrows = op.tuning.rows ? op.tuning.rows : few ? 1u : nb <= 2 * tpr ? 4u : 2u;
  if (!op.tuning.rows)
    while (nrows > 1 && (op.w.rows + teams * nrows - 1) / (teams * nrows) < kMinWorkgroups) nrows /= 2;
  const uint32_t ksplit = ksplit_of(op, ctx, teams);
  // OUT_Q8: whole blocks of 32 rows per workgroup: 32 subgroups of one row where the device
  // allows the workgroup (one row per subgroup keeps q_a's 2 blocks per lane, loaded before the
  // staging), else more rows per subgroup.
  if (granule && ksplit == 1 && (teams * nrows) % granule != 0) {
    if (!op.tuning.teams && 32 * tpr <= ctx.info().max_compute_workgroup_invocations) {
      teams = 32;
      nrows = 1;
    } else if (teams <= 32 && 32 % teams == 0) {
      nrows = 32 / teams;
    }
  }
  return {teams, nrows, ksplit};
}

// Rows of one workgroup of the int8 decode kernel under split `s`.
uint32_t rows_per_workgroup(const DecodeSplit& s) { return s.teams / s.ksplit * s.nrows; }

// Blocks per staging pass of the int8 kernel: a power of two, at most what the columns need and
// what fits kQ8StageBytes of shared memory (48 bytes per block and column).
uint32_t q8_kchunk(uint32_t nb, uint32_t batch) {
  uint32_t kchunk = 1;
  while (kchunk < nb && uint64_t(2 * kchunk) * batch * 48 <= kQ8StageBytes) kchunk *= 2;
  return kchunk;
}

// Weight blocks per lane and row that the early start holds (matvec_q8.comp PRELOAD).
uint32_t gate_preload(const MatvecOp& op, Context& ctx, const DecodeSplit& s) {
  const uint32_t nlanes = s.ksplit * ctx.info().subgroup_size;
  return (op.w.cols / 32 + nlanes - 1) / nlanes;
}

// The weight blocks per lane that the decode kernel loads before staging x (matvec_q8.comp
// PRELOAD_FIRST: no gate, one pass, by default at most two blocks per lane: more held across the
// staging cost occupancy, PERFORMANCE.md session 5), or 0 where it stages first.
uint32_t preload_first_blocks(const MatvecOp& op, Context& ctx, const Variant& v, const DecodeSplit& s, uint32_t kchunk) {
  const int32_t most_held = op.tuning.preload_blocks < 0 ? int32_t(kAutoPreloadBlocks) : op.tuning.preload_blocks;
  if (most_held <= 0 || v.gated || v.xq8 || op.batch != 1 || !ctx.pipelines().use_subgroup() || s.ksplit != 1 ||
      kchunk < op.w.cols / 32)
    return 0;
  const uint32_t preload = gate_preload(op, ctx, s);
  return s.nrows * preload <= uint32_t(most_held) && preload <= MatvecOp::kMaxGatePreload ? preload : 0;
}

}  // namespace

bool MatvecOp::preloads_first(Context& ctx) const {
  const Variant v = variant_of(*this, &ctx);
  if (!v.q8 || batch != 1) return false;
  return preload_first_blocks(*this, ctx, v, q8_decode_split(*this, ctx, out_granule(*this, false)),
                              q8_kchunk(w.cols / 32, 1)) != 0;
}

bool MatvecOp::gate_supported(Context& ctx) const {
  MatvecOp probe = *this;
  probe.gate = {};
  const Variant v = variant_of(probe, &ctx);
  if (!v.q8 || batch != 1 || !ctx.pipelines().use_subgroup()) return false;
  const DecodeSplit s = q8_decode_split(probe, ctx, out_granule(probe, false));
  if (!v.xq8) {  // staged x: one pass over the whole row, one subgroup per row
    if (s.ksplit != 1 || q8_kchunk(w.cols / 32, 1) < w.cols / 32) return false;
  } else if (gate_x_of(tuning) == 1 && (v.heads || !q8_activations_usable(ctx, w.type, w.cols))) {
    return false;  // x's blocks copied into shared memory: they must fit (and be one vector)
  }
  return s.nrows * gate_preload(probe, ctx, s) <= kMaxGatePreload;
}

bool MatvecOp::signal_supported(Context& ctx) const {
  MatvecOp probe = *this;
  probe.signal = {};
  return variant_of(probe, &ctx).q8 && batch == 1;
}

bool MatvecOp::row_prefetch_supported(Context& ctx) const {
  const Variant v = variant_of(*this, &ctx);
  return v.gated && !tuning.gate_late;
}

bool MatvecOp::residual_supported(Context& ctx) const {
  MatvecOp probe = *this;
  probe.residual = {};
  return variant_of(probe, &ctx).q8 && batch == 1 && accumulate;
}

bool MatvecOp::out_q8_supported(Context& ctx) const {
  MatvecOp probe = *this;
  probe.out_q8 = {};
  const Variant v = variant_of(probe, &ctx);
  if (!v.q8 || batch != 1 || !ctx.pipelines().use_subgroup() || w.rows % 32 != 0) return false;
  const DecodeSplit s = q8_decode_split(probe, ctx, out_granule(probe, true));
  return s.ksplit == 1 && (s.teams * s.nrows) % out_granule(probe, true) == 0 && s.nrows <= 4 &&
         row_chunks(w, ctx.info(), max_binding_bytes).size() == 1;
}

bool MatvecOp::head_x_supported(Context& ctx) const {
  if (x_head_rows == 0 || w.rows % x_head_rows != 0 || !variant_of(*this, &ctx).xq8) return false;
  const DecodeSplit s = q8_decode_split(*this, ctx, out_granule(*this, false));
  return x_head_rows % s.nrows == 0;
}

uint32_t MatvecOp::out_parts(Context& ctx) const {
  const uint32_t per_wg = rows_per_workgroup(q8_decode_split(*this, ctx, out_granule(*this, true)));
  return (w.rows + per_wg - 1) / per_wg;
}

uint32_t MatvecOp::signal_count(Context& ctx) const {
  const uint32_t per_wg = rows_per_workgroup(q8_decode_split(*this, ctx, out_granule(*this, false)));
  uint32_t n = 0;
  for (const RowChunk& c : row_chunks(w, ctx.info(), max_binding_bytes)) n += (c.rows + per_wg - 1) / per_wg;
  return n;
}

bool q8_activations_type(Context& ctx, GgmlType t) {
  return (t == GgmlType::Q4_0 || t == GgmlType::Q8_0 || t == GgmlType::Q4_K || t == GgmlType::Q6_K) &&
         ctx.device().enabled().integer_dot_product;
}

bool q8_activations_usable(Context& ctx, GgmlType t, uint64_t cols) {
  if (!q8_activations_type(ctx, t) || cols % 32 != 0) return false;
  return uint64_t(q8_blocks_define(cols)) * 48 + 1024 <= ctx.info().max_compute_shared_memory;
}

uint32_t q8_blocks_define(uint64_t cols) { return uint32_t((cols / 32 + 63) / 64 * 64); }

bool router_fold_supported(Context& ctx) {
  const DeviceFeatures& f = ctx.device().enabled();
  return f.buffer_int64_atomics && f.shader_int64;
}

uint64_t router_fold_acc_bytes(uint32_t n_expert) { return uint64_t(TS_ROUTER_FOLD_SLOTS) * (n_expert + 1) * 8; }

uint32_t MatvecOp::max_batch(Context& ctx) const {
  MatvecOp one = *this;
  one.batch = 1;
  return variant_of(one, &ctx).q8 ? 16u : 8u;
}

std::string MatvecOp::kernel_name(Context* ctx) const {
  const Variant v = variant_of(*this, ctx);
  std::string n = cat("matvec.", type_name(w.type));
  if (batch > 1) n += cat(".b", batch);
  if (v.vec8) n += ".v8";
  if (v.norm) n += ".norm";
  if (v.q8) n += ".q8act";
  if (v.xq8) n += ".xq8";
  if (router_fold.enabled()) n += ".rfold";
  if (v.gated) n += ".gate";
  if (v.signals) n += ".open";
  if (v.oq8) n += out_granule(*this, false) == 16 ? ".oq8h" : ".oq8";
  if (v.xss) n += ".rms";
  if (v.xq8 && x_q8_halves) n += ".xh";
  if (v.heads) n += ".hd";
  if (v.res) n += ".res";
  if (v.pf) n += row_prefetch.l1 ? ".pf.l1" : ".pf";
  if (v.oq8 && out_q8_norm.buffer == VK_NULL_HANDLE) n += ".plain";
  if (ctx && batch == 1) {
    const uint32_t k = ksplit_of(*this, *ctx, q8_decode_teams(*this));
    if (k > 1) n += cat(".ks", k);
  }
  return n;
}

uint64_t MatvecOp::bytes() const {
  uint64_t b = w.read_bytes() + uint64_t(batch) * x_vectors(*this) * w.cols * 4 + uint64_t(batch) * w.rows * 4;
  if (accumulate) b += uint64_t(batch) * w.rows * 4;
  if (norm_weight.buffer != VK_NULL_HANDLE) b += uint64_t(w.cols) * 4;
  if (router_fold.enabled()) b += router_fold.router.read_bytes() + uint64_t(w.rows) * 4;
  return b;
}

void MatvecOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const std::string name = kernel_name(&ctx);
  const std::string what = label.empty() ? name : label;
  w.validate(what.c_str());
  const Variant v = variant_of(*this, &ctx);
  const uint32_t most = max_batch(ctx);
  if (batch < 1 || batch > most) runtime_error(what, ": batch ", batch, " outside 1..", most);
  const uint32_t xs = x_stride ? x_stride : w.cols;
  const uint32_t ys = y_stride ? y_stride : w.rows;
  if (!v.plain && (x_offset % 4 != 0 || (batch > 1 && xs % 4 != 0)))
    runtime_error(what, ": x offset ", x_offset, " and stride ", xs, " must be multiples of 4 for block types");
  if (batch > 1 && (xs < w.cols || ys < w.rows))
    runtime_error(what, ": strides (x ", xs, ", y ", ys, ") smaller than the vectors (", w.cols, ", ", w.rows, ")");
  if (x_head_rows && !head_x_supported(ctx))
    runtime_error(what, ": x of ", x_head_rows, "-row heads needs the int8 kernel with int8 x (x_q8), heads that "
                  "divide the ", w.rows, " rows and whole teams per head");
  const uint64_t n_vec = x_vectors(*this);  // head_x_supported: x_head_rows divides the rows
  const uint64_t x_need = (uint64_t(x_offset) + uint64_t(batch - 1) * xs + n_vec * w.cols) * 4;
  const uint64_t y_need = (uint64_t(batch - 1) * ys + w.rows) * 4;
  if (x.size < x_need) runtime_error(what, ": x binding has ", x.size, " bytes, needs ", x_need);
  if (y.size < y_need) runtime_error(what, ": y binding has ", y.size, " bytes, needs ", y_need);
  const uint64_t xq8_need = (uint64_t(x_offset) + n_vec * w.cols) / 32 * 48;
  if (v.xq8 && x_q8.size < xq8_need) runtime_error(what, ": int8 x binding has ", x_q8.size, " bytes, needs ", xq8_need);
  if (gate.enabled()) {
    if (!gate_supported(ctx))
      runtime_error(what, ": no early start for this matvec here (it needs the int8 kernel, one vector, subgroups, "
                    "x pre-quantized or staged in one pass by one subgroup per row, and at most ", kMaxGatePreload,
                    " weight blocks per lane)");
    if (!gate.valid() || (gate_stats.buffer && gate_stats.size < kGateStatsBytes))
      runtime_error(what, ": early start needs a gate word, an error word and a target above 0");
  }
  if (out_q8.buffer != VK_NULL_HANDLE) {
    if (!out_q8_supported(ctx))
      runtime_error(what, ": no int8 output here (it needs the int8 kernel for one vector, subgroups, rows in "
                    "whole blocks of 32 and one binding)");
    const bool normed = out_q8_norm.buffer != VK_NULL_HANDLE;
    if (out_q8.size < uint64_t(w.rows) / 32 * 48 || (normed && out_q8_norm.size < uint64_t(w.rows) * 4) ||
        (normed && out_ss.size < uint64_t(out_parts(ctx)) * 4))
      runtime_error(what, ": int8 output bindings too small (", w.rows / 32 * 48, " bytes of blocks, ", w.rows * 4,
                    " of norm weight, ", out_parts(ctx) * 4, " of sums)");
  }
  if (x_ss.buffer != VK_NULL_HANDLE) {
    if (!v.xss) runtime_error(what, ": sums of squares of x come with int8 x (x_q8) and no norm weight");
    if (x_ss_parts == 0 || x_ss.size < uint64_t(x_ss_parts) * 4)
      runtime_error(what, ": x's sums of squares: ", x_ss_parts, " parts in ", x_ss.size, " bytes");
  }
  if (residual.buffer != VK_NULL_HANDLE) {
    if (!v.res) runtime_error(what, ": a residual binding needs the int8 kernel for one accumulating vector");
    if (residual.size < y_need) runtime_error(what, ": residual binding has ", residual.size, " bytes, needs ", y_need);
  }
  if (row_prefetch.enabled()) {
    const RowPrefetch& p = row_prefetch;
    if (!v.pf) runtime_error(what, ": a row prefetch needs the early-started int8 kernel that preloads its weights");
    if (p.row_bytes == 0 || p.row_bytes % 32 != 0 || p.max_rows == 0 || p.rows.size < uint64_t(p.max_rows) * p.row_bytes ||
        p.step.size < (p.pos_word + 1) * 4ull)
      runtime_error(what, ": row prefetch of ", p.max_rows, " rows of ", p.row_bytes, " bytes from ", p.rows.size,
                    " bytes, pos word ", p.pos_word, " of ", p.step.size, " bytes");
  }
  if (signal.buffer != VK_NULL_HANDLE) {
    if (!signal_supported(ctx)) runtime_error(what, ": only the int8 kernel for one vector opens a gate");
    if (signal.size < (signal_word + 1) * 4ull) runtime_error(what, ": the gate it opens has no word ", signal_word);
  }
  if (v.norm && norm_weight.size < uint64_t(w.cols) * 4)
    runtime_error(what, ": norm weight has ", norm_weight.size, " bytes, needs ", uint64_t(w.cols) * 4);

  const bool fold = router_fold.enabled();
  if (fold) {
    const MatrixRef& r = router_fold.router;
    r.validate(cat(what, " router").c_str());
    if (!router_fold_supported(ctx)) runtime_error(what, ": the router fold needs 64-bit integer buffer atomics");
    if (batch != 1 || !accumulate) runtime_error(what, ": the router fold takes one accumulating column");
    if (r.layout != WeightLayout::Plain || (r.type != GgmlType::F32 && r.type != GgmlType::F16 && r.type != GgmlType::BF16))
      runtime_error(what, ": the router fold reads a plain F32/F16/BF16 router, not ", type_name(r.type));
    if (r.cols != w.rows || r.rows == 0 || r.rows > TS_ROUTE_MAX_E || r.cols % 2 != 0)
      runtime_error(what, ": router ", r.rows, "x", r.cols, " does not fit the matvec's ", w.rows,
                    " rows (E <= ", TS_ROUTE_MAX_E, ", an even row length)");
    if (router_fold.norm_weight.size < uint64_t(w.rows) * 4)
      runtime_error(what, ": fold norm weight has ", router_fold.norm_weight.size, " bytes, needs ", uint64_t(w.rows) * 4);
    if (router_fold.acc.size < router_fold_acc_bytes(r.rows))
      runtime_error(what, ": fold accumulators have ", router_fold.acc.size, " bytes, need ", router_fold_acc_bytes(r.rows));
    if (r.bytes() > ctx.info().max_storage_buffer_range) runtime_error(what, ": router exceeds the binding limit");
  }

  PipelineLibrary& lib = ctx.pipelines();
  const bool sg = lib.use_subgroup();
  const uint32_t tpr = sg ? ctx.info().subgroup_size : kSharedThreadsPerRow;
  PipelineDesc desc;
  desc.name = name;
  uint32_t rows_per_wg = 0;
  if (v.q8) {
    // matvec_q8.comp. Decode (batch 1): matrices of at most kFewRows rows: 16 teams x 1 row (each
    // workgroup stages the whole input once for 16 rows; H200, GLM: W_vo 2048 x 10240 15.8 us vs
    // 20.8 with 4 x 1, q_a / kv_a 7.7 vs 8.2); taller ones: 4 teams, rows per team 4 for rows of
    // <= 2 blocks per lane, else 2, lowered until the matrix gives kMinWorkgroups workgroups (W_qk
    // 11520 x 768: 13.6 us vs 14.5 with 16 x 1; the Q6_K LM head 101 vs 133 us).
    // Batched: 8 teams x 4 rows, so that the staged columns serve 32 rows.
    const uint32_t nb = w.cols / 32;
    if (tuning.teams > 16 || tuning.rows > 4 || tuning.batch_teams > 16 || tuning.batch_rows > 4)
      usage_error("matvec tuning: ", tuning.teams, " / ", tuning.batch_teams, " teams, ", tuning.rows, " / ",
                  tuning.batch_rows, " rows per team outside 1..16 / 1..4");
    if (tuning.blocks_per_iter != 0 && tuning.blocks_per_iter != 2 && tuning.blocks_per_iter != 4)
      usage_error("matvec tuning: ", tuning.blocks_per_iter, " blocks per iteration, expected 2 or 4");
    if (tuning.gate_x > 3) usage_error("matvec tuning: gate_x=", tuning.gate_x, " outside 0..3");
    if (tuning.ksplit > 1 && tuning.ksplit != 2 && tuning.ksplit != 4)
      usage_error("matvec tuning: ", tuning.ksplit, " subgroups per row, expected 1, 2 or 4");
    uint32_t teams = 0, nrows = 0, ksplit = 1;
    if (batch > 1) {
      teams = tuning.batch_teams ? tuning.batch_teams : 8u;
      nrows = tuning.batch_rows ? tuning.batch_rows : batch > 8 ? 2u : 4u;
    } else {
      const DecodeSplit s = q8_decode_split(*this, ctx, out_granule(*this, false));
      teams = s.teams;
      nrows = s.nrows;
      ksplit = s.ksplit;
    }
    const uint32_t kchunk = v.xq8 ? 1u : q8_kchunk(nb, batch);
    rows_per_wg = rows_per_workgroup({teams, nrows, ksplit});
    desc.file = "matvec_q8.comp";
    desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(w.type))},
                    {"WG_SIZE", std::to_string(tpr * teams)},
                    {"THREADS_PER_ROW", std::to_string(tpr)},
                    {"NUM_ROWS", std::to_string(nrows)},
                    {"NUM_COLS", std::to_string(batch)},
                    {"NORM_INPUT", v.norm ? "1" : "0"},
                    {"KCHUNK", std::to_string(kchunk)},
                    {"Q8_BLOCKS", std::to_string(kchunk * batch)},
                    {"BLOCKS_PER_ITER", std::to_string(tuning.blocks_per_iter ? tuning.blocks_per_iter : 2u)},
                    {"X_Q8", v.xq8 ? "1" : "0"},
                    {"KSPLIT", std::to_string(ksplit)}};
    if (v.gated) {
      desc.defines["WAIT_GATE"] = "1";
      const uint32_t preload = gate_preload(*this, ctx, {teams, nrows, ksplit});
      desc.defines["PRELOAD"] = std::to_string(preload);
      desc.defines["GATE_TARGET"] = std::to_string(gate.target);
      desc.defines["GATE_WORD"] = std::to_string(gate.word);
      const uint32_t gx = gate_x_of(tuning);
      desc.defines["GATE_X"] = std::to_string(gx);
      if (tuning.gate_late) {
        desc.defines["GATE_LATE"] = "1";
        desc.name += ".late";
      }
      if (!tuning.gate_late && v.xq8 && tuning.preload_early && tuning.preload_early < preload) {
        desc.defines["PRELOAD_EARLY"] = std::to_string(tuning.preload_early);
        desc.name += cat(".pe", tuning.preload_early);
      }
      if (gate_stats.buffer) {
        desc.defines["GATE_STATS"] = "1";
        const DeviceFeatures& f = ctx.device().enabled();
        desc.defines["GATE_CLOCK"] = f.device_clock && f.buffer_int64_atomics && f.shader_int64 ? "1" : "0";
      }
      if (v.xq8 && gx == 1) desc.defines["Q8_BLOCKS"] = std::to_string(q8_blocks_define(w.cols));
    }
    // Weights loaded before the staging.
    if (const uint32_t preload = preload_first_blocks(*this, ctx, v, {teams, nrows, ksplit}, kchunk)) {
      desc.defines["PRELOAD_FIRST"] = "1";
      desc.defines["PRELOAD"] = std::to_string(preload);
      desc.name += ".pre";
      if (tuning.input_first && nb <= teams * tpr) {  // one staging block per invocation
        desc.defines["INPUT_FIRST"] = "1";
        desc.name += ".in";
      }
    }
    if (v.oq8) {
      desc.defines["OUT_Q8"] = "1";
      desc.defines["OUT_NORM"] = out_q8_norm.buffer != VK_NULL_HANDLE ? "1" : "0";
      desc.defines["OUT_HALVES"] = out_granule(*this, false) == 16 ? "1" : "0";
    }
    if (v.xq8 && x_q8_halves) desc.defines["X_HALVES"] = "1";
    if (v.heads) desc.defines["X_HEAD_ROWS"] = std::to_string(x_head_rows);
    if (v.xss) {
      desc.defines["X_SS"] = "1";
      desc.defines["X_SS_PARTS"] = std::to_string(x_ss_parts);
    }
    if (v.res) desc.defines["RESIDUAL_IN"] = "1";
    if (v.pf) {
      desc.defines["PREFETCH_ROWS"] = "1";
      desc.defines["PF_POS_WORD"] = std::to_string(row_prefetch.pos_word);
      desc.defines["PF_ROW_SECTORS"] = std::to_string(row_prefetch.row_bytes / 32);
      desc.defines["PF_MAX_ROWS"] = std::to_string(row_prefetch.max_rows);
      if (row_prefetch.l1) desc.defines["PF_L1"] = "1";
    }
    if (v.signals) {
      desc.defines["SIGNAL_GATE"] = "1";
      desc.defines["SIGNAL_WORD"] = std::to_string(signal_word);
    }
  } else {
    // Rows per subgroup and unit width, measured on an H200 (bench of 2026-11-22, see report):
    // batch 1: one row, 8-value units for 32-element blocks (Q4_0 154880x2048: 1.43 TB/s vs 0.55
    // with 32-value units) and 32-value units for K-quants (Q4_K: 1.01 TB/s vs 0.52); batched:
    // two rows (x loads shared by both: Q4_0 b4 0.74 TB/s vs 0.52) and 8-value units.
    const uint32_t nrows = sg && batch > 1 ? 2u : 1u;
    const bool unit32 = batch == 1 && type_info(w.type).block_elems == 256;
    rows_per_wg = kGroupsPerWorkgroup * nrows;
    desc.file = "matvec.comp";
    desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(w.type))},
                    {"WG_SIZE", std::to_string(tpr * kGroupsPerWorkgroup)},
                    {"THREADS_PER_ROW", std::to_string(tpr)},
                    {"NUM_ROWS", std::to_string(nrows)},
                    {"NUM_COLS", std::to_string(batch)},
                    {"NORM_INPUT", v.norm ? "1" : "0"},
                    {"PLAIN_VEC8", v.vec8 ? "1" : "0"},
                    {"UNIT32", unit32 ? "1" : "0"}};
  }
  desc.defines["ROUTER_FOLD"] = fold ? "1" : "0";
  if (fold) {
    desc.defines["RF_WTYPE"] = std::to_string(static_cast<uint32_t>(router_fold.router.type));
    desc.defines["RF_N_EXPERT"] = std::to_string(router_fold.router.rows);
    desc.defines["RF_COLS"] = std::to_string(router_fold.router.cols);
  }
  desc.num_buffers = v.pf ? 18 : v.res ? 16 : v.oq8 ? 15 : v.signals ? 12 : v.gated ? (gate_stats.buffer ? 11 : 10) : fold ? 8 : v.norm || v.xss ? 5 : 4;
  desc.push_bytes = sizeof(gpu::MatvecArgs);
  desc.full_subgroups = sg;
  const Pipeline& pipe = lib.get(desc);

  const std::vector<RowChunk> chunks = row_chunks(w, ctx.info(), max_binding_bytes);
  for (const RowChunk& c : chunks) {
    gpu::MatvecArgs a{};
    a.rows = c.rows;
    a.cols = w.cols;
    a.row_begin = c.row_begin;
    a.flags = accumulate ? TS_MATVEC_ACCUMULATE : 0u;
    a.x_stride = xs;
    a.y_stride = ys;
    a.norm_eps = norm_eps;
    a.x_offset = x_offset;
    const BufferSlice rw = fold ? router_fold.router.buffer->slice(router_fold.router.offset, router_fold.router.bytes())
                                : BufferSlice{};
    // Bindings a variant does not declare are filled with x.
    const BufferSlice bufs[18] = {c.q,
                                  c.m,
                                  v.xq8 ? x_q8 : x,
                                  y,
                                  v.norm ? norm_weight : v.xss ? x_ss : x,
                                  fold ? rw : x,
                                  fold ? router_fold.norm_weight : x,
                                  fold ? router_fold.acc : x,
                                  v.gated ? gate.words : x,
                                  v.gated ? gate.error : x,
                                  gate_stats.buffer ? gate_stats : x,
                                  signal.buffer ? signal : x,
                                  v.oq8 ? out_q8 : x,
                                  v.oq8 && out_q8_norm.buffer ? out_q8_norm : x,
                                  v.oq8 && out_q8_norm.buffer ? out_ss : x,
                                  v.res ? residual : x,
                                  v.pf ? row_prefetch.rows : x,
                                  v.pf ? row_prefetch.step : x};
    const GroupCounts g = split_workgroups((c.rows + rows_per_wg - 1) / rows_per_wg, ctx.info());
    MatvecOp part = *this;
    part.w.rows = c.rows;
    rec.dispatch(pipe, std::span<const BufferSlice>(bufs, desc.num_buffers), a, g.x, g.y, 1, what,
                 chunks.size() == 1 ? bytes() : part.bytes());
  }
}

}  // namespace tessera::vk
