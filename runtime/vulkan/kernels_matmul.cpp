#include "runtime/vulkan/kernels_matmul.h"

#include <algorithm>

#include "format/error.h"
#include "runtime/vulkan/context.h"
#include "shaders/kernel_args.h"

namespace tessera::vk {

namespace {

constexpr uint32_t kMinWorkgroups = 128;  // auto row_tiles: 2 only where this many remain
constexpr uint32_t kAutoStep = 256;
constexpr uint32_t kAutoGroups = 4;

struct Split {
  uint32_t mr, kt, tg;
  uint32_t rows_per_wg() const { return 16 * mr; }
  uint32_t tokens_per_wg() const { return 16 * tg; }
  // a_sh and b_sh (f16, BM and 16 TG rows of KT + 8) and c_sh (TG groups x MR tiles of 256 floats).
  uint64_t shared_bytes() const {
    return uint64_t(rows_per_wg() + tokens_per_wg()) * (kt + 8) * 2 + uint64_t(tg) * mr * 256 * 4;
  }
};

// The columns of one staged unit group: K-quant units interleave inside their 256-value block
// (weights.glsl split1_unit), so a step holds whole blocks.
uint32_t step_granule(const MatmulOp& op) { return std::max<uint32_t>(32, type_info(op.w.type).block_elems); }

Split split_of(const MatmulOp& op, const DeviceInfo& info) {
  Split s{op.tuning.row_tiles, op.tuning.step, op.tuning.groups ? op.tuning.groups : kAutoGroups};
  if (!s.mr) s.mr = (op.w.rows + 31) / 32 >= kMinWorkgroups ? 2u : 1u;
  if (!s.kt) {
    s.kt = kAutoStep;
    while (s.kt > step_granule(op) && s.shared_bytes() > info.max_compute_shared_memory) s.kt /= 2;
  }
  // Still too large (K-quant steps hold 256 columns): fewer token groups.
  if (!op.tuning.groups)
    while (s.tg > 1 && s.shared_bytes() > info.max_compute_shared_memory) s.tg /= 2;
  return s;
}

}  // namespace

bool matmul_supported(Context& ctx) { return ctx.device().enabled().shader_float16; }

bool matmul_coop_supported(Context& ctx) {
  const DeviceFeatures& f = ctx.device().enabled();
  return f.cooperative_matrix_nv && f.shader_float16 && ctx.pipelines().use_subgroup() && ctx.info().subgroup_size == 32;
}

bool MatmulOp::uses_coop(Context& ctx) const {
  return kernel == MatmulKernel::Coop || (kernel == MatmulKernel::Auto && matmul_coop_supported(ctx));
}

std::string MatmulOp::kernel_name(Context& ctx) const {
  const Split s = split_of(*this, ctx.info());
  std::string name = cat("matmul.", type_name(w.type), uses_coop(ctx) ? ".coop" : ".plain");
  if (s.mr != 1) name += cat(".m", s.mr);
  if (s.tg != kAutoGroups) name += cat(".g", s.tg);
  return name;
}

uint64_t MatmulOp::bytes(Context& ctx) const {
  const uint64_t per_wg = split_of(*this, ctx.info()).tokens_per_wg();
  const uint64_t tiles = (uint64_t(n_tokens) + per_wg - 1) / per_wg;
  const uint64_t y_bytes = uint64_t(n_tokens) * w.rows * 4;
  return tiles * w.read_bytes() + uint64_t(n_tokens) * w.cols * 2 + y_bytes * (accumulate ? 2 : 1);
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
  if ((s.mr != 1 && s.mr != 2 && s.mr != 4) || (s.tg != 1 && s.tg != 2 && s.tg != 4) || s.kt % 32 != 0 || s.kt > 2048)
    usage_error("matmul tuning: ", s.mr, " row tiles (1, 2 or 4), ", s.tg, " token groups (1, 2 or 4), steps of ", s.kt,
                " columns (a multiple of 32 up to 2048)");
  if (s.kt % step_granule(*this) != 0)
    usage_error("matmul tuning: ", type_name(w.type), " steps hold whole ", step_granule(*this), "-value blocks, not ", s.kt,
                " columns");
  if (s.shared_bytes() > ctx.info().max_compute_shared_memory)
    runtime_error(what, ": ", s.mr, " row tiles x ", s.kt, " columns need ", s.shared_bytes(),
                  " bytes of shared memory, the device has ", ctx.info().max_compute_shared_memory);
  if (n_tokens == 0) runtime_error(what, ": no tokens");
  const uint32_t xs = x_stride ? x_stride : w.cols, ys = y_stride ? y_stride : w.rows;
  if (x_offset % 8 != 0 || xs % 8 != 0) runtime_error(what, ": x16 offset ", x_offset, " and stride ", xs, " must be multiples of 8");
  if (xs < w.cols || ys < w.rows)
    runtime_error(what, ": strides (x ", xs, ", y ", ys, ") smaller than the vectors (", w.cols, ", ", w.rows, ")");
  const uint64_t padded = (uint64_t(n_tokens) + 15) / 16 * 16;
  const uint64_t x_need = (uint64_t(x_offset) + (padded - 1) * xs + w.cols) * 2;
  const uint64_t y_need = (uint64_t(n_tokens - 1) * ys + w.rows) * 4;
  if (x16.size < x_need)
    runtime_error(what, ": x16 binding has ", x16.size, " bytes, needs ", x_need, " (", padded, " token rows: the tokens rounded up to 16)");
  if (y.size < y_need) runtime_error(what, ": y binding has ", y.size, " bytes, needs ", y_need);
  const uint64_t token_tiles = (uint64_t(n_tokens) + s.tokens_per_wg() - 1) / s.tokens_per_wg();
  if (token_tiles > ctx.info().max_workgroup_count[1])
    runtime_error(what, ": ", n_tokens, " tokens exceed the device's workgroup count");

  PipelineDesc desc;
  desc.name = kernel_name(ctx);
  desc.file = "matmul.comp";
  desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(w.type))},
                  {"MR", std::to_string(s.mr)},
                  {"TG", std::to_string(s.tg)},
                  {"KT", std::to_string(s.kt)},
                  {"COOP", coop ? "1" : "0"}};
  desc.num_buffers = 4;
  desc.push_bytes = sizeof(gpu::MatmulArgs);
  desc.full_subgroups = ctx.pipelines().use_subgroup();
  const Pipeline& pipe = ctx.pipeline(desc);

  const std::vector<RowChunk> chunks = row_chunks(w, ctx.info(), max_binding_bytes);
  for (const RowChunk& c : chunks) {
    const uint64_t row_tiles = (uint64_t(c.rows) + s.rows_per_wg() - 1) / s.rows_per_wg();
    if (row_tiles > ctx.info().max_workgroup_count[0]) runtime_error(what, ": ", c.rows, " rows exceed the device's workgroup count");
    gpu::MatmulArgs a{};
    a.rows = c.rows;
    a.cols = w.cols;
    a.row_begin = c.row_begin;
    a.flags = accumulate ? TS_MATVEC_ACCUMULATE : 0u;
    a.x_stride = xs;
    a.y_stride = ys;
    a.n_tokens = n_tokens;
    a.x_offset = x_offset;
    const BufferSlice bufs[4] = {c.q, c.m, x16, y};
    MatmulOp part = *this;
    part.w.rows = c.rows;
    rec.dispatch(pipe, std::span<const BufferSlice>(bufs, 4), a, uint32_t(row_tiles), uint32_t(token_tiles), 1, what,
                 chunks.size() == 1 ? bytes(ctx) : part.bytes(ctx));
  }
}

}  // namespace tessera::vk
