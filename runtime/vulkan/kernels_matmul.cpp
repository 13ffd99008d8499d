#include "runtime/vulkan/kernels_matmul.h"

#include <algorithm>
#include <array>

#include "format/error.h"
#include "runtime/vulkan/context.h"
#include "shaders/kernel_args.h"

namespace tessera::vk {

namespace {

constexpr uint32_t kTargetWorkgroups = 1024;  // auto splits: enough workgroups to hide latency
// ... but none where the tiles alone make this many workgroups and each takes at most
// kNoSplitSteps steps: each split writes and re-reads a partial sum per output (H100, 64 tokens,
// W_qk's 11520 x 768, 12 steps: 3 splits 35.2 + 7.2 us for their sum, none 28.8; but W_vo's 2048 x
// 10240 at 512 tokens, 160 steps: 2 splits 371 + 10 us, none 519; docs/PERFORMANCE.md session 24).
constexpr uint32_t kNoSplitWorkgroups = 256;
constexpr uint32_t kNoSplitSteps = 32;
// In chunks of at most kSmallChunk tokens, matrices of at most kSmallMatrixRows rows take 16-row
// tiles (auto): twice the row tiles for half the splits (H100, 64 tokens, with their sums: q_a 768
// x 2048 23.6 -> 20.6 us, kv_a 17.8 -> 16.9, the router's 64 x 2048 19.2 -> 15.5; at 512 tokens
// kv_a lost, 33.3 -> 41.5; session 24).
constexpr uint32_t kSmallMatrixRows = 1024;
constexpr uint32_t kSmallChunk = 64;
// ... and larger matrices that need splits there take 64-row tiles and splits for about two
// workgroups per SM of an H100: B staged once per 64 rows, one wave (W_vo 2048 x 10240 at 64
// tokens, with the sum: 32 row tiles x 8 splits 43.8 + 6.6 us; x 4, 6, 16: 67.4 + 5.7, 54.5 +
// 5.9, 57.1 + 6.8; 64 row tiles x 16 splits 63.5 + 6.8; session 24).
constexpr uint32_t kWideTargetWorkgroups = 256;
constexpr uint32_t kMaxAutoSplits = 32;
constexpr uint32_t kMaxSplits = 64;
constexpr uint32_t kReduceWorkgroup = 256;

struct Split {
  uint32_t mr, kt, tg;
  uint32_t rows_per_wg() const { return 16 * mr; }
  uint32_t tokens_per_wg() const { return 16 * tg; }
  uint64_t shared_bytes() const { return matmul_shared_bytes(mr, tg, kt); }
};

uint32_t step_granule(const MatmulOp& op) { return matmul_step_granule(op.w.type); }
uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Whether `tiles` workgroups of `steps` steps each need no split (kNoSplitWorkgroups).
bool no_split(uint64_t tiles, uint64_t steps) { return tiles >= kNoSplitWorkgroups && steps <= kNoSplitSteps; }
// ... for the matrix in 32-row tiles of 64 tokens and 64-column steps.
bool fills_without_splits(const MatmulOp& op) { return no_split(ceil_div(op.w.rows, 32) * ceil_div(op.n_tokens, 64), ceil_div(op.w.cols, 64)); }
// A short chunk's small matrix (kSmallMatrixRows), or its larger one that would split
// (kWideTargetWorkgroups).
bool small_in_short_chunk(const MatmulOp& op) { return op.n_tokens <= kSmallChunk && op.w.rows <= kSmallMatrixRows; }
bool wide_in_short_chunk(const MatmulOp& op) {
  return op.n_tokens <= kSmallChunk && op.w.rows > kSmallMatrixRows && !fills_without_splits(op);
}

// The tuned fields as given; the automatic ones as the first of a preference list whose shared
// memory fits the device: 32 rows (H100, GLM pp512 1226.6 tok/s against 1199.4 with 64 and 1153.5
// with 16, the splits making up the workgroups), then the most tokens per workgroup, then steps of
// 64 columns (less shared memory per workgroup, more of them resident: 1209 against 1181 with 128).
// In short chunks (kSmallChunk) small matrices prefer 16 rows, larger ones that split 64.
Split split_of(const MatmulOp& op, const DeviceInfo& info) {
  const MatmulTuning& t = op.tuning;
  const uint32_t g = step_granule(op);
  std::array<uint32_t, 3> order{2, 4, 1};
  if (small_in_short_chunk(op)) order = {1, 2, 4};
  if (wide_in_short_chunk(op)) order = {4, 2, 1};
  for (uint32_t mr : order)
    for (uint32_t tg : {4u, 2u, 1u})
      for (uint32_t kt : {64u, 128u, 256u, 32u}) {
        const Split s{t.row_tiles ? t.row_tiles : mr, t.step ? t.step : kt, t.groups ? t.groups : tg};
        if (s.kt % g == 0 && s.kt >= g && s.shared_bytes() <= info.max_compute_shared_memory) return s;
      }
  return {t.row_tiles ? t.row_tiles : 1, t.step ? t.step : g, t.groups ? t.groups : 1};  // record() refuses it
}

// MatmulTuning::prefetch under split s.
// Auto: both (H100 GLM pp512 5222 -> 5417 tok/s with both, 5375 with W alone; session 22).
// In short chunks: the token values are not loaded ahead (fewer registers: H100 pp16 1157 ->
// 1190 tok/s, pp64 a tie; session 24).
bool prefetch_b(const MatmulOp& op, const Split& s) {
  return s.kt <= 128 && (op.tuning.prefetch == 1 || (op.tuning.prefetch == 0 && op.n_tokens > kSmallChunk));
}
bool prefetch_w(const MatmulOp& op) { return op.tuning.prefetch_w != 2 && split1_supported(op.w.type); }
// Steps of W loaded ahead (matmul.comp W_AHEAD): 2 with prefetch_w 3, and by default in chunks
// of more than kSmallChunk tokens (H100 pp512 5757 -> 5872, W_vo 351 -> 324 us; in 64-token
// chunks it lost: pp64 3176 -> 3104, session 25); else 1.
uint32_t w_ahead(const MatmulOp& op) {
  if (!prefetch_w(op)) return 1;
  return op.tuning.prefetch_w == 3 || (op.tuning.prefetch_w == 0 && op.n_tokens > kSmallChunk) ? 2 : 1;
}
bool acc_loop(const MatmulOp& op) { return op.tuning.loop == 2; }

// Workgroups along K and the columns each takes (a multiple of the step).
struct KSplit {
  uint32_t n, cols;
};
KSplit k_split_of(const MatmulOp& op, const Split& s) {
  const uint64_t steps = ceil_div(op.w.cols, s.kt);
  // At most as many splits as kMatmulMaxPartialBytes holds (a tuned count too: one knob serves
  // matrices of every shape).
  const uint64_t most = std::max<uint64_t>(1, kMatmulMaxPartialBytes / std::max<uint64_t>(1, uint64_t(op.n_tokens) * op.w.rows * 4));
  uint64_t n = op.tuning.splits;
  if (!n) {
    const uint64_t tiles = ceil_div(op.w.rows, s.rows_per_wg()) * ceil_div(op.n_tokens, s.tokens_per_wg());
    const uint64_t target = s.mr == 4 && !op.tuning.row_tiles && wide_in_short_chunk(op) ? kWideTargetWorkgroups : kTargetWorkgroups;
    n = no_split(tiles, steps) ? 1 : std::min<uint64_t>(ceil_div(target, tiles), kMaxAutoSplits);
  }
  n = std::clamp<uint64_t>(n, 1, std::min(steps, most));
  const uint64_t cols = ceil_div(steps, n) * s.kt;
  return {uint32_t(ceil_div(op.w.cols, cols)), uint32_t(cols)};
}

}  // namespace

bool matmul_supported(Context& ctx) { return ctx.device().enabled().shader_float16; }

bool matmul_uses_coop(Context& ctx, MatmulKernel kernel) {
  return kernel == MatmulKernel::Coop || (kernel == MatmulKernel::Auto && matmul_coop_supported(ctx));
}

// K-quant units interleave inside their 256-value block (weights.glsl split1_unit): a step holds
// the spans they fill together.
uint32_t matmul_step_granule(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: return 64;
    case GgmlType::Q6_K: return 128;
    default: return 32;
  }
}

uint64_t matmul_shared_bytes(uint32_t mr, uint32_t tg, uint32_t kt) {
  return std::max<uint64_t>(uint64_t(16 * mr + 16 * tg) * (kt + 8) * 2, uint64_t(tg) * mr * 1024);
}

bool matmul_coop_supported(Context& ctx) {
  const DeviceFeatures& f = ctx.device().enabled();
  return f.cooperative_matrix_nv && f.shader_float16 && ctx.pipelines().use_subgroup() && ctx.info().subgroup_size == 32;
}

bool MatmulOp::uses_coop(Context& ctx) const { return matmul_uses_coop(ctx, kernel); }

uint32_t MatmulOp::splits(Context& ctx) const { return k_split_of(*this, split_of(*this, ctx.info())).n; }

uint64_t MatmulOp::partials_bytes(Context& ctx) const {
  const uint32_t n = splits(ctx);
  return n > 1 ? uint64_t(n) * n_tokens * w.rows * 4 : 0;
}

std::string MatmulOp::kernel_name(Context& ctx) const {
  const Split s = split_of(*this, ctx.info());
  std::string name = cat("matmul.", type_name(w.type), uses_coop(ctx) ? ".coop" : ".plain", ".m", s.mr);
  if (s.tg != 4) name += cat(".g", s.tg);
  if (k_split_of(*this, s).n > 1) name += ".splitk";
  if (prefetch_b(*this, s)) name += ".pf";
  if (prefetch_w(*this)) name += w_ahead(*this) == 2 ? ".pw2" : ".pw";
  if (acc_loop(*this)) name += ".loop";
  return name;
}

uint64_t MatmulOp::bytes(Context& ctx) const {
  const uint64_t tiles = ceil_div(n_tokens, split_of(*this, ctx.info()).tokens_per_wg());
  const uint64_t y_bytes = uint64_t(n_tokens) * w.rows * 4;
  return tiles * w.read_bytes() + uint64_t(n_tokens) * w.cols * 2 + (splits(ctx) > 1 ? partials_bytes(ctx) : y_bytes * (accumulate ? 2 : 1));
}

void MatmulOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const std::string what = label.empty() ? kernel_name(ctx) : label;
  w.validate(what.c_str());
  if (w.layout == WeightLayout::MoeTile1) runtime_error(what, ": the matmul reads plain or SPLIT1 matrices, not MoE tiles");
  if (w.cols % 32 != 0) runtime_error(what, ": rows of ", w.cols, " values; the matmul takes multiples of 32");
  if (!matmul_supported(ctx)) runtime_error(what, ": the matmul needs shaderFloat16, which ", ctx.info().name, " lacks");
  const bool coop = uses_coop(ctx);
  if (coop && !matmul_coop_supported(ctx))
    runtime_error(what, ": no 16x16x16 f16 cooperative matrices with subgroups of 32 on ", ctx.info().name);
  const Split s = split_of(*this, ctx.info());
  if ((s.mr != 1 && s.mr != 2 && s.mr != 4) || (s.tg != 1 && s.tg != 2 && s.tg != 4) || s.kt % 32 != 0 || s.kt == 0 ||
      s.kt > 2048 || tuning.splits > kMaxSplits || tuning.prefetch > 2 || tuning.prefetch_w > 3 || tuning.loop > 2)
    usage_error("matmul tuning: ", s.mr, " row tiles (1, 2 or 4), ", s.tg, " token groups (1, 2 or 4), steps of ", s.kt,
                " columns (a multiple of 32 up to 2048), ", tuning.splits, " splits (at most ", kMaxSplits, ")");
  if (s.kt % step_granule(*this) != 0)
    usage_error("matmul tuning: ", type_name(w.type), " steps are multiples of ", step_granule(*this), " columns, not ", s.kt);
  if (s.shared_bytes() > ctx.info().max_compute_shared_memory)
    runtime_error(what, ": ", s.mr, " row tiles, ", s.tg, " token groups and ", s.kt, "-column steps need ", s.shared_bytes(),
                  " bytes of shared memory, the device has ", ctx.info().max_compute_shared_memory);
  if (n_tokens == 0) runtime_error(what, ": no tokens");
  const uint32_t xs = x_stride ? x_stride : w.cols, ys = y_stride ? y_stride : w.rows;
  if (x_offset % 8 != 0 || xs % 8 != 0) runtime_error(what, ": x16 offset ", x_offset, " and stride ", xs, " must be multiples of 8");
  if (xs < w.cols || ys < w.rows)
    runtime_error(what, ": strides (x ", xs, ", y ", ys, ") smaller than the vectors (", w.cols, ", ", w.rows, ")");
  const uint64_t padded = ceil_div(n_tokens, 16) * 16;
  const uint64_t x_need = (uint64_t(x_offset) + (padded - 1) * xs + w.cols) * 2;
  const uint64_t y_need = (uint64_t(n_tokens - 1) * ys + w.rows) * 4;
  if (x16.size < x_need)
    runtime_error(what, ": x16 binding has ", x16.size, " bytes, needs ", x_need, " (", padded, " token rows: the tokens rounded up to 16)");
  if (y.size < y_need) runtime_error(what, ": y binding has ", y.size, " bytes, needs ", y_need);
  const bool live = live_count.buffer != VK_NULL_HANDLE;
  if (live && live_count.size < (uint64_t(count_word) + 1) * 4)
    runtime_error(what, ": the live token count's binding has no word ", count_word);
  const KSplit ks = k_split_of(*this, s);
  if (ks.n > 1 && partials.size < partials_bytes(ctx))
    runtime_error(what, ": ", ks.n, " splits along K need ", partials_bytes(ctx), " bytes of partial sums, the binding has ", partials.size);
  const uint64_t token_tiles = ceil_div(n_tokens, s.tokens_per_wg());
  if (token_tiles > ctx.info().max_workgroup_count[1] || ks.n > ctx.info().max_workgroup_count[2])
    runtime_error(what, ": ", n_tokens, " tokens in ", ks.n, " splits exceed the device's workgroup counts");

  PipelineDesc desc;
  desc.name = kernel_name(ctx);
  desc.file = "matmul.comp";
  desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(w.type))},
                  {"MR", std::to_string(s.mr)},
                  {"TG", std::to_string(s.tg)},
                  {"KT", std::to_string(s.kt)},
                  {"COOP", coop ? "1" : "0"},
                  {"PREFETCH_B", prefetch_b(*this, s) ? "1" : "0"},
                  {"PREFETCH_W", prefetch_w(*this) ? "1" : "0"},
                  {"W_AHEAD", std::to_string(w_ahead(*this))},
                  {"ACC_DONT_UNROLL", acc_loop(*this) ? "1" : "0"}};
  desc.num_buffers = 6;
  desc.push_bytes = sizeof(gpu::MatmulArgs);
  desc.full_subgroups = ctx.pipelines().use_subgroup();
  const Pipeline& pipe = ctx.pipeline(desc);

  const std::vector<RowChunk> chunks = row_chunks(w, ctx.info(), max_binding_bytes);
  for (const RowChunk& c : chunks) {
    const uint64_t row_tiles = ceil_div(c.rows, s.rows_per_wg());
    if (row_tiles > ctx.info().max_workgroup_count[0]) runtime_error(what, ": ", c.rows, " rows exceed the device's workgroup count");
    gpu::MatmulArgs a{};
    a.rows = c.rows;
    a.cols = w.cols;
    a.row_begin = c.row_begin;
    a.flags = (accumulate ? TS_MATVEC_ACCUMULATE : 0u) | (live ? TS_MATMUL_LIVE_COUNT : 0u);
    a.count_word = count_word;
    a.x_stride = xs;
    a.y_stride = ys;
    a.n_tokens = n_tokens;
    a.x_offset = x_offset;
    a.k_split = ks.cols;
    a.n_splits = ks.n;
    a.part_rows = w.rows;
    const BufferSlice bufs[6] = {c.q, c.m, x16, y, ks.n > 1 ? partials : y, live ? live_count : y};
    MatmulOp part = *this;
    part.w.rows = c.rows;
    rec.dispatch(pipe, std::span<const BufferSlice>(bufs, 6), a, uint32_t(row_tiles), uint32_t(token_tiles), ks.n, what,
                 chunks.size() == 1 ? bytes(ctx) : part.bytes(ctx));
  }
}

RmsNormOp::ResidualSum MatmulOp::split_parts(Context& ctx) const {
  const uint32_t n = splits(ctx);
  if (n <= 1 || accumulate || live_count.buffer == VK_NULL_HANDLE || (y_stride && y_stride != w.rows))
    runtime_error(label.empty() ? kernel_name(ctx) : label, ": its partial sums go to a norm only where it splits along K, ",
                  "writes y rows of its own width without accumulating and reads a live token count");
  RmsNormOp::ResidualSum parts;  // part z of token t: row z * n_tokens + t of the partials
  parts.y = partials;
  parts.n_used = n;
  parts.has_shared = false;
  parts.stride_t = 1;
  parts.stride_k = n_tokens;
  parts.replace = true;
  parts.step = live_count;
  parts.count_word = count_word;
  return parts;
}

void MatmulOp::record_sum(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const KSplit ks = k_split_of(*this, split_of(*this, ctx.info()));
  if (ks.n <= 1) return;
  PipelineDesc desc;
  desc.name = "matmul.sum";
  desc.file = "matmul.comp";
  desc.defines = {{"REDUCE", "1"}, {"WG_SIZE", std::to_string(kReduceWorkgroup)}};
  desc.num_buffers = 6;
  desc.push_bytes = sizeof(gpu::MatmulArgs);
  const Pipeline& pipe = ctx.pipeline(desc);
  const bool live = live_count.buffer != VK_NULL_HANDLE;
  gpu::MatmulArgs a{};
  a.rows = w.rows;
  a.cols = w.cols;
  a.flags = (accumulate ? TS_MATVEC_ACCUMULATE : 0u) | (live ? TS_MATMUL_LIVE_COUNT : 0u);
  a.count_word = count_word;
  a.y_stride = y_stride ? y_stride : w.rows;
  a.n_tokens = n_tokens;
  a.n_splits = ks.n;
  a.part_rows = w.rows;
  const BufferSlice bufs[6] = {y, y, y, y, partials, live ? live_count : y};
  const GroupCounts g = split_workgroups(ceil_div(uint64_t(w.rows) * n_tokens, kReduceWorkgroup), ctx.info());
  const uint64_t y_bytes = uint64_t(n_tokens) * w.rows * 4;
  rec.dispatch(pipe, std::span<const BufferSlice>(bufs, 6), a, g.x, g.y, 1, (label.empty() ? desc.name : label) + " (sum)",
               partials_bytes(ctx) + y_bytes * (accumulate ? 2 : 1));
}

}  // namespace tessera::vk
