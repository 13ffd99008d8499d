#include "runtime/vulkan/kernels_basic.h"

#include <algorithm>

#include "format/error.h"
#include "shaders/kernel_args.h"

namespace tessera::vk {
namespace {
constexpr uint32_t kNormWorkgroup = 256;
constexpr uint32_t kEmbedWorkgroup = 64;
constexpr uint32_t kPrefetchWorkgroup = 256;
constexpr uint32_t kPrefetchUnroll = 8;  // sectors per invocation: 64 KiB of weights per workgroup
}  // namespace

uint64_t RmsNormOp::bytes() const {
  const uint64_t sum =
      add.y.buffer != VK_NULL_HANDLE ? uint64_t(rows) * n * 4 * (add.n_used + (add.has_shared ? 1 : 0) + (add.replace ? 0 : 1)) : 0;
  return sum + uint64_t(rows) * n * (f16_out ? 6 : 8) + (normalize ? uint64_t(n) * 4 : 0) +
         (y_q8.buffer != VK_NULL_HANDLE ? uint64_t(rows) * n / 32 * 48 : 0);
}

void RmsNormOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  if (n == 0 || rows == 0) runtime_error(label, ": empty norm (n ", n, ", rows ", rows, ")");
  const uint32_t xs = x_stride ? x_stride : n, ys = y_stride ? y_stride : n;
  const uint64_t x_need = (uint64_t(x_offset) + uint64_t(rows - 1) * xs + n) * 4;
  const uint64_t y_need = (uint64_t(y_offset) + uint64_t(rows - 1) * ys + n) * (f16_out ? 2 : 4);
  if (x.size < x_need) runtime_error(label, ": x binding has ", x.size, " bytes, needs ", x_need);
  if (y.size < y_need) runtime_error(label, ": y binding has ", y.size, " bytes, needs ", y_need);
  if (normalize && weight.size < uint64_t(n) * 4) runtime_error(label, ": weight has ", weight.size, " bytes, needs ", n * 4);
  const bool q8 = y_q8.buffer != VK_NULL_HANDLE;
  if (q8 && (f16_out || !normalize)) runtime_error(label, ": int8 output blocks go with the normalized f32 output");
  if (f16_out && !ctx.device().enabled().shader_float16)
    runtime_error(label, ": f16 output needs shaderFloat16, which ", ctx.info().name, " lacks");
  if (q8 && n % 32 != 0) runtime_error(label, ": int8 output blocks need n a multiple of 32, not ", n);
  if (q8 && x.buffer == y.buffer && x.offset < y.offset + y.size && y.offset < x.offset + x.size)
    runtime_error(label, ": int8 output blocks need y apart from x (they are quantized from x after y is written)");
  if (q8 && y_q8.size < uint64_t(rows) * n / 32 * 48)
    runtime_error(label, ": y_q8 binding has ", y_q8.size, " bytes, needs ", uint64_t(rows) * n / 32 * 48);
  const bool sum_in = add.y.buffer != VK_NULL_HANDLE;
  const uint32_t sum_stride_t = add.stride_t ? add.stride_t : add.n_used;
  if (sum_in) {
    if (q8 || (n | x_offset | xs | y_offset | ys) % 4 != 0)
      runtime_error(label, ": the residual sum needs rows of a multiple of 4 values at offsets and strides of multiples of 4, "
                    "without int8 output blocks (n ", n, ", x offset ", x_offset, ", stride ", xs, ", y offset ", y_offset,
                    ", stride ", ys, ")");
    const uint64_t last = add.n_used ? uint64_t(rows - 1) * sum_stride_t + uint64_t(add.n_used - 1) * add.stride_k + 1 : 0;
    const uint64_t pairs = std::max<uint64_t>(last, add.has_shared ? uint64_t(add.pair_base) + rows : 0);
    if (add.y.size < pairs * n * 4) runtime_error(label, ": residual-sum binding has ", add.y.size, " bytes, needs ", pairs * n * 4);
    if (add.step.size < (uint64_t(add.count_word) + 1) * 4) runtime_error(label, ": step binding too small for word ", add.count_word);
  }
  PipelineDesc desc;
  desc.name = cat(sum_in ? "sum_rmsnorm" : normalize ? "rmsnorm" : "to_f16", q8 ? ".q8out" : f16_out && normalize ? ".f16out" : "");
  desc.file = "rmsnorm.comp";
  desc.defines = {{"WG_SIZE", std::to_string(kNormWorkgroup)},
                  {"Q8_OUT", q8 ? "1" : "0"},
                  {"F16_OUT", f16_out ? "1" : "0"},
                  {"NORMALIZE", normalize ? "1" : "0"},
                  {"SUM_IN", sum_in ? "1" : "0"}};
  desc.num_buffers = sum_in ? 6 : q8 ? 4 : 3;
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
  a.sum_k = add.n_used;
  a.sum_pair_base = add.pair_base;
  a.sum_flags = (add.has_shared ? TS_NORM_SUM_SHARED : 0u) | (add.replace ? TS_NORM_SUM_REPLACE : 0u);
  a.count_word = add.count_word;
  a.sum_stride_t = sum_stride_t;
  a.sum_stride_k = add.stride_k;
  const BufferSlice bufs[6] = {x, normalize ? weight : x, y, q8 ? y_q8 : y, add.y, add.step};
  const GroupCounts g = split_workgroups(rows, ctx.info());
  rec.dispatch(pipe, std::span<const BufferSlice>(bufs, desc.num_buffers), a, g.x, g.y, 1, label, bytes());
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

uint64_t PrefetchOp::bytes() const {
  uint64_t n = 0;
  for (const BufferSlice& s : spans) n += s.size;
  return n;
}

uint32_t PrefetchOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  if (sink.size < 4) runtime_error(label, ": sink binding has ", sink.size, " bytes, needs 4");
  // Pieces start on sector boundaries of their span (both alignments are powers of two).
  const uint64_t align = std::max<uint64_t>(ctx.info().min_storage_buffer_offset_alignment, TS_PREFETCH_SECTOR_BYTES);
  uint64_t range = max_binding_bytes ? max_binding_bytes : ctx.info().max_storage_buffer_range;
  range -= range % align;  // pieces after the first start aligned
  if (range < align) runtime_error(label, ": binding range ", range, " below the offset alignment ", align);
  std::vector<BufferSlice> pieces;
  for (const BufferSlice& s : spans) {
    if (s.size % 4) runtime_error(label, ": span of ", s.size, " bytes is not a multiple of 4");
    for (uint64_t off = 0; off < s.size; off += range) pieces.push_back(s.sub(off, std::min(range, s.size - off)));
  }
  PipelineDesc desc;
  desc.name = "prefetch";
  desc.file = "prefetch.comp";
  desc.defines = {{"WG_SIZE", std::to_string(kPrefetchWorkgroup)}, {"UNROLL", std::to_string(kPrefetchUnroll)}};
  desc.num_buffers = 5;
  desc.push_bytes = sizeof(gpu::PrefetchArgs);
  desc.full_subgroups = ctx.pipelines().use_subgroup();
  const Pipeline& pipe = ctx.pipeline(desc);
  constexpr uint64_t per_group = uint64_t(kPrefetchWorkgroup) * kPrefetchUnroll;
  uint32_t dispatches = 0;
  for (size_t p = 0; p < pieces.size(); p += 4) {
    BufferSlice bufs[5];
    uint32_t sectors[4] = {0, 0, 0, 0}, first[5] = {0, 0, 0, 0, 0};
    uint64_t bytes = 0;
    for (size_t i = 0; i < 4; ++i) {
      // Unused span bindings repeat the first piece (bindings must be valid); they get no groups.
      bufs[i] = p + i < pieces.size() ? pieces[p + i] : pieces[p];
      const uint64_t words = p + i < pieces.size() ? pieces[p + i].size / 4 : 0;
      sectors[i] = uint32_t((words + 7) / 8);
      first[i + 1] = first[i] + uint32_t((sectors[i] + per_group - 1) / per_group);
      bytes += p + i < pieces.size() ? pieces[p + i].size : 0;
    }
    bufs[4] = sink;
    gpu::PrefetchArgs a{};
    a.sectors0 = sectors[0];
    a.sectors1 = sectors[1];
    a.sectors2 = sectors[2];
    a.sectors3 = sectors[3];
    a.first1 = first[1];
    a.first2 = first[2];
    a.first3 = first[3];
    a.n_groups = first[4];
    if (a.n_groups == 0) continue;
    const GroupCounts g = split_workgroups(a.n_groups, ctx.info());
    rec.dispatch(pipe, bufs, a, g.x, g.y, 1, label, bytes);
    ++dispatches;
  }
  return dispatches;
}

}  // namespace tessera::vk
