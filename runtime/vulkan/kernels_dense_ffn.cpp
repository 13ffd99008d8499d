// The dense FFN (GLM's and V2-Lite's leading layer) on the MoE kernels: DenseGateUpOp and
// DenseDownOp (kernels_moe.h), one slot of moe_gateup.comp / moe_down.comp over plain or SPLIT1
// matrices.
#include <algorithm>

#include "format/error.h"
#include "runtime/vulkan/kernels_matvec.h"
#include "runtime/vulkan/kernels_moe.h"
#include "runtime/vulkan/kernels_moe_internal.h"
#include "runtime/vulkan/split1.h"
#include "shaders/moe_args.h"

namespace tessera::vk {

using namespace moe_detail;

namespace {

// The gate-up / down kernels' view of a dense matrix: plain or SPLIT1, element aligned.
void check_dense_matrix(const MatrixRef& m, const char* which, const std::string& what) {
  m.validate(cat(what, " ", which).c_str());
  if (m.layout == WeightLayout::Plain ? !is_plain(m.type) : !split1_supported(m.type))
    runtime_error(what, ": ", which, " has type ", type_name(m.type), " in a layout the FFN kernels do not read");
}

}  // namespace

uint64_t DenseGateUpOp::bytes() const {
  const uint64_t in = norm_weight.buffer != VK_NULL_HANDLE ? 8 : 4;
  return gate.read_bytes() + up.read_bytes() + uint64_t(gate.cols) * in + uint64_t(gate.rows) * 4;
}

void DenseGateUpOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const std::string name = cat("dense_gateup.", type_name(gate.type));
  const std::string what = label.empty() ? name : label;
  check_dense_matrix(gate, "gate", what);
  check_dense_matrix(up, "up", what);
  if (gate.buffer != up.buffer || gate.type != up.type || gate.layout != up.layout || gate.rows != up.rows ||
      gate.cols != up.cols)
    runtime_error(what, ": gate (", type_name(gate.type), " ", gate.rows, "x", gate.cols, ") and up (", type_name(up.type),
                  " ", up.rows, "x", up.cols, ") must have one type, shape and buffer");
  if (gate.cols % 4 != 0) runtime_error(what, ": n_embd ", gate.cols, " must be a multiple of 4");
  need(x, uint64_t(gate.cols) * 4, what, "x");
  const bool norm = norm_weight.buffer != VK_NULL_HANDLE;
  if (norm) need(norm_weight, uint64_t(gate.cols) * 4, what, "norm_weight");
  need(h, uint64_t(gate.rows) * 4, what, "h");

  // One binding over both matrices, starting at the first one.
  const uint64_t align = std::max<uint64_t>(ctx.info().min_storage_buffer_offset_alignment, 16);
  const uint64_t start = std::min(gate.offset, up.offset) / align * align;
  const uint64_t end = std::max(gate.offset + gate.bytes(), up.offset + up.bytes());
  if (end - start > ctx.info().max_storage_buffer_range)
    runtime_error(what, ": gate and up span ", end - start, " bytes of buffer '", gate.buffer->name(),
                  "', more than one binding can hold (", ctx.info().max_storage_buffer_range, ")");
  const uint64_t gate_at = gate.offset - start, up_at = up.offset - start;
  const bool plain = gate.layout == WeightLayout::Plain;
  if (plain ? (gate_at % elem_bytes(gate.type) != 0 || up_at % elem_bytes(gate.type) != 0)
            : (gate_at % 256 != 0 || up_at % 256 != 0))
    runtime_error(what, ": gate/up offsets ", gate.offset, "/", up.offset, " are not ",
                  plain ? "element" : "256-byte", " aligned relative to each other");
  const bool vec8 = plain && gate.cols % 8 == 0 && gate_at % (8 * elem_bytes(gate.type)) == 0 &&
                    up_at % (8 * elem_bytes(gate.type)) == 0;
  const MoeTuning t = resolve(tuning);
  const bool q8 = hq.buffer != VK_NULL_HANDLE;
  if (q8) {
    if (plain || gate.rows % 32 != 0 || !q8_activations_usable(ctx, gate.type, gate.cols))
      runtime_error(what, ": hq is set but the int8-activation path does not serve ", type_name(gate.type), " ",
                    gate.rows, "x", gate.cols, " on this device");
    need(hq, dense_hq_bytes(gate.rows), what, "hq");
  }
  const uint32_t q8_blocks = gate.rows / kQ8GateUpOutputs;  // blocks of 32 outputs (int8 path: rows % 32 == 0)
  const uint32_t q8_outs =
      kQ8GateUpOutputs * std::max<uint32_t>(1, (q8_blocks + kQ8DenseGateUpMaxGroups - 1) / kQ8DenseGateUpMaxGroups);
  // The int8 form keeps 16 subgroups a workgroup (q8_gateup_teams' early-started count): its grid
  // is sized for them (at most kQ8DenseGateUpMaxGroups); the experts' 8 behind a barrier was not
  // measured here.
  const uint32_t q8_teams = q8_gateup_teams(t, true, (gate.rows + q8_outs - 1) / q8_outs);
  const Pipeline& pipe = q8 ? gateup_q8_kernel(ctx, gate.type, gate.cols, t, q8_teams, 0, false, false, q8_outs)
                            : gateup_kernel(ctx, gate.type, vec8, t, 0);
  gpu::MoeArgs a{};
  a.n_embd = gate.cols;
  a.flags = TS_MOE_SHARED | TS_MOE_SEPARATE_GATE_UP | (norm ? TS_MOE_NORM_INPUT : 0u);
  a.norm_eps = eps;
  a.h_stride = (gate.rows + 3) / 4 * 4;
  a.w_shared = gate.rows;
  a.shared_offset = uint32_t(gate_at);
  a.shared_up_offset = uint32_t(up_at);
  const BufferSlice bufs[8] = {weight_slice(*gate.buffer, start, end - start), x, norm ? norm_weight : x, x, h, x, x,
                               q8 ? hq : h};
  const uint32_t outs = q8 ? q8_outs : t.gateup_teams;
  const GroupCounts gc = split_workgroups((gate.rows + outs - 1) / outs, ctx.info());
  rec.dispatch(pipe, std::span<const BufferSlice>(bufs, q8 ? 8 : 7), a, gc.x, gc.y, 1, what, bytes());
}

uint64_t DenseDownOp::bytes() const { return down.read_bytes() + uint64_t(down.cols) * 4 + uint64_t(down.rows) * 8; }

void DenseDownOp::record(CommandRecorder& rec) const {
  Context& ctx = rec.context();
  const std::string name = cat("dense_down.", type_name(down.type));
  const std::string what = label.empty() ? name : label;
  check_dense_matrix(down, "down", what);
  if (down.cols % 4 != 0) runtime_error(what, ": FFN width ", down.cols, " must be a multiple of 4");
  need(h, uint64_t(down.cols) * 4, what, "h");
  need(x, uint64_t(down.rows) * 4, what, "x");
  if (down.bytes() > ctx.info().max_storage_buffer_range)
    runtime_error(what, ": down matrix of ", down.bytes(), " bytes exceeds the binding limit ",
                  ctx.info().max_storage_buffer_range);
  const bool plain = down.layout == WeightLayout::Plain;
  const bool vec8 = plain && down.cols % 8 == 0;
  const MoeTuning t = resolve(tuning);
  const bool q8 = hq.buffer != VK_NULL_HANDLE;
  const uint32_t h_stride = (down.cols + 3) / 4 * 4;
  if (q8) {
    if (plain || down.cols % 32 != 0 || !q8_activations_usable(ctx, down.type, down.cols))
      runtime_error(what, ": hq is set but the int8-activation path does not serve ", type_name(down.type), " ",
                    down.rows, "x", down.cols, " on this device");
    need(hq, dense_hq_bytes(down.cols), what, "hq");
  }
  const uint32_t rows_per_wg = q8 ? q8_down_rows(t, down.type, false) : t.down_rows;
  const Pipeline& pipe =
      q8 ? down_q8_kernel(ctx, down.type, 1, h_stride, down.cols, rows_per_wg, 0, 0, false, false, q8_down_first(t, down.type))
         : down_kernel(ctx, down.type, vec8, 1, t, 0);
  gpu::MoeArgs a{};
  a.n_embd = down.rows;
  a.flags = TS_MOE_SHARED;
  a.h_stride = (down.cols + 3) / 4 * 4;
  a.w_shared = down.cols;
  const BufferSlice bufs[7] = {weight_slice(*down.buffer, down.offset, down.bytes()), h, x, h, h, h, q8 ? hq : h};
  const uint32_t groups = (down.rows + rows_per_wg - 1) / rows_per_wg;
  rec.dispatch(pipe, std::span<const BufferSlice>(bufs, q8 ? 7 : 6), a, groups, 1, 1, what, bytes());
}

}  // namespace tessera::vk
