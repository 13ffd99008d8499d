#include "runtime/vulkan/kernels_basic.h"

#include "format/error.h"
#include "shaders/kernel_args.h"

namespace tessera::vk {
namespace {
constexpr uint32_t kNormWorkgroup = 256;
constexpr uint32_t kEmbedWorkgroup = 64;
}  // namespace

uint64_t RmsNormOp::bytes() const { return uint64_t(rows) * n * 8 + uint64_t(n) * 4; }

void RmsNormOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  if (n == 0 || rows == 0) runtime_error(label, ": empty norm (n ", n, ", rows ", rows, ")");
  const uint32_t xs = x_stride ? x_stride : n, ys = y_stride ? y_stride : n;
  const uint64_t x_need = (uint64_t(x_offset) + uint64_t(rows - 1) * xs + n) * 4;
  const uint64_t y_need = (uint64_t(y_offset) + uint64_t(rows - 1) * ys + n) * 4;
  if (x.size < x_need) runtime_error(label, ": x binding has ", x.size, " bytes, needs ", x_need);
  if (y.size < y_need) runtime_error(label, ": y binding has ", y.size, " bytes, needs ", y_need);
  if (weight.size < uint64_t(n) * 4) runtime_error(label, ": weight has ", weight.size, " bytes, needs ", n * 4);
  PipelineDesc desc;
  desc.name = "rmsnorm";
  desc.file = "rmsnorm.comp";
  desc.defines = {{"WG_SIZE", std::to_string(kNormWorkgroup)}};
  desc.num_buffers = 3;
  desc.push_bytes = sizeof(gpu::RmsNormArgs);
  desc.full_subgroups = ctx.pipelines().use_subgroup();
  const Pipeline& pipe = ctx.pipeline(desc);
  gpu::RmsNormArgs a{};
  a.n = n;
  a.n_rows = rows;
  a.x_stride = xs;
  a.y_stride = ys;
  a.x_offset = x_offset;
  a.y_offset = y_offset;
  a.eps = eps;
  const BufferSlice bufs[3] = {x, weight, y};
  const GroupCounts g = split_workgroups(rows, ctx.info());
  rec.dispatch(pipe, bufs, a, g.x, g.y, 1, label, bytes());
}

uint64_t EmbedOp::bytes() const {
  const uint64_t row = table.layout == WeightLayout::Split1 ? row_bytes(table.type, table.cols)
                                                            : table.read_bytes() / std::max<uint32_t>(table.rows, 1);
  return uint64_t(n_tokens) * (row + 4 + uint64_t(table.cols) * 4);
}

void EmbedOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const std::string name = cat("embed.", type_name(table.type));
  const std::string what = label.empty() ? name : label;
  table.validate(what.c_str());
  if (n_tokens == 0 || n_tokens > ctx.info().max_workgroup_count[1])
    runtime_error(what, ": ", n_tokens, " tokens outside 1..", ctx.info().max_workgroup_count[1]);
  const uint32_t os = out_stride ? out_stride : table.cols;
  if (os < table.cols) runtime_error(what, ": out stride ", os, " < row length ", table.cols);
  const uint64_t out_need = (uint64_t(out_offset) + uint64_t(n_tokens - 1) * os + table.cols) * 4;
  if (out.size < out_need) runtime_error(what, ": out binding has ", out.size, " bytes, needs ", out_need);
  if (ids.size < (uint64_t(id_offset) + n_tokens) * 4)
    runtime_error(what, ": ids binding has ", ids.size, " bytes, needs ", (uint64_t(id_offset) + n_tokens) * 4);

  PipelineDesc desc;
  desc.name = name;
  desc.file = "embed.comp";
  desc.defines = {{"WTYPE", std::to_string(static_cast<uint32_t>(table.type))},
                  {"WG_SIZE", std::to_string(kEmbedWorkgroup)}};
  desc.num_buffers = 4;
  desc.push_bytes = sizeof(gpu::EmbedArgs);
  const Pipeline& pipe = ctx.pipeline(desc);

  // Threads along a row: one per element (plain), per 32-element block, or per 8-value unit of a
  // K-quant block (embed.comp).
  const uint32_t block = type_info(table.type).block_elems;
  const uint32_t threads = block == 1 ? table.cols : block == 32 ? table.cols / 32 : table.cols / 8;
  const uint32_t gx = (threads + kEmbedWorkgroup - 1) / kEmbedWorkgroup;
  const std::vector<RowChunk> chunks = row_chunks(table, ctx.info(), max_binding_bytes);
  for (const RowChunk& c : chunks) {
    gpu::EmbedArgs a{};
    a.rows = c.rows;
    a.cols = table.cols;
    a.row_begin = c.row_begin;
    a.n_vocab = table.rows;
    a.id_offset = id_offset;
    a.n_tokens = n_tokens;
    a.out_offset = out_offset;
    a.out_stride = os;
    const BufferSlice bufs[4] = {c.q, c.m, ids, out};
    rec.dispatch(pipe, bufs, a, gx, n_tokens, 1, what, c.row_begin == 0 ? bytes() : 0);
  }
}

}  // namespace tessera::vk
