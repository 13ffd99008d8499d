// SPLIT1 and MOE_TILE1 layouts (docs/FORMAT.md §6).
#include "format/tsr_layout.h"

#include <cstring>

#include "format/error.h"

namespace tessera {

const char* layout_name(TsrLayout l) {
  switch (l) {
    case TsrLayout::Plain: return "plain";
    case TsrLayout::Split1: return "split1";
    case TsrLayout::MoeTile1: return "moe_tile1";
  }
  return "?";
}

std::optional<Split1Block> split1_block(GgmlType t) {
  // {block bytes, elements, offset of the quant bytes, quant bytes}: FORMAT.md §6.2 table.
  switch (t) {
    case GgmlType::Q4_0: return Split1Block{18, 32, 2, 16};    // d | qs[16]
    case GgmlType::Q4_1: return Split1Block{20, 32, 4, 16};    // d m | qs[16]
    case GgmlType::Q5_0: return Split1Block{22, 32, 6, 16};    // d qh[4] | qs[16]
    case GgmlType::Q5_1: return Split1Block{24, 32, 8, 16};    // d m qh[4] | qs[16]
    case GgmlType::Q8_0: return Split1Block{34, 32, 2, 32};    // d | qs[32]
    case GgmlType::Q4_K: return Split1Block{144, 256, 16, 128};  // d dmin scales[12] | qs[128]
    case GgmlType::Q5_K: return Split1Block{176, 256, 48, 128};  // d dmin scales[12] qh[32] | qs[128]
    case GgmlType::Q6_K: return Split1Block{210, 256, 0, 128};   // ql[128] | qh[64] scales[16] d
    default: return std::nullopt;
  }
}

void split1_split_blocks(const Split1Block& b, uint64_t n_blocks, const uint8_t* gguf, uint8_t* q_out, uint8_t* m_out) {
  const uint32_t qs = b.q_start, qn = b.q_bytes, tail = b.block_bytes - qs - qn;
  for (uint64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* blk = gguf + i * b.block_bytes;
    std::memcpy(q_out + i * qn, blk + qs, qn);
    uint8_t* m = m_out + i * b.m_bytes();
    std::memcpy(m, blk, qs);
    std::memcpy(m + qs, blk + qs + qn, tail);
  }
}

void split1_join_blocks(const Split1Block& b, uint64_t n_blocks, const uint8_t* q_in, const uint8_t* m_in, uint8_t* gguf) {
  const uint32_t qs = b.q_start, qn = b.q_bytes, tail = b.block_bytes - qs - qn;
  for (uint64_t i = 0; i < n_blocks; ++i) {
    uint8_t* blk = gguf + i * b.block_bytes;
    const uint8_t* m = m_in + i * b.m_bytes();
    std::memcpy(blk, m, qs);
    std::memcpy(blk + qs, q_in + i * qn, qn);
    std::memcpy(blk + qs + qn, m + qs, tail);
  }
}

uint64_t Split1Geometry::gguf_row_bytes() const { return row_bytes(type, cols); }

Split1Geometry split1_geometry(GgmlType t, uint64_t rows, uint64_t cols) {
  Split1Geometry g;
  g.type = t;
  g.rows = rows;
  g.cols = cols;
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
    g.plain = true;
    g.blocks_per_row = cols;
    g.q_bytes = type_info(t).block_bytes;
    g.m_bytes = 0;
    g.total_bytes = g.m_offset = rows * cols * g.q_bytes;
    return g;
  }
  const auto b = split1_block(t);
  if (!b) bad_input("SPLIT1 layout: type ", type_name(t), " has no split form (expected one of q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k)");
  if (cols % b->block_elems != 0)
    bad_input("SPLIT1 layout: ", cols, " columns is not a multiple of the ", type_name(t), " block of ", b->block_elems);
  g.blocks_per_row = cols / b->block_elems;
  g.q_bytes = b->q_bytes;
  g.m_bytes = b->m_bytes();
  g.m_offset = align_up(rows * g.blocks_per_row * g.q_bytes, kTsrTensorAlign);
  g.total_bytes = g.m_offset + rows * g.blocks_per_row * g.m_bytes;
  return g;
}

void split1_put_rows(const Split1Geometry& g, uint64_t row0, uint64_t n_rows, const uint8_t* gguf_rows, uint8_t* matrix) {
  if (g.plain) {
    std::memcpy(matrix + row0 * g.gguf_row_bytes(), gguf_rows, n_rows * g.gguf_row_bytes());
    return;
  }
  split1_split_blocks(*split1_block(g.type), n_rows * g.blocks_per_row, gguf_rows, matrix + g.q_row_offset(row0),
                      matrix + g.m_row_offset(row0));
}

void split1_get_rows(const Split1Geometry& g, const uint8_t* matrix, uint64_t row0, uint64_t n_rows, uint8_t* gguf_rows) {
  if (g.plain) {
    std::memcpy(gguf_rows, matrix + row0 * g.gguf_row_bytes(), n_rows * g.gguf_row_bytes());
    return;
  }
  split1_join_blocks(*split1_block(g.type), n_rows * g.blocks_per_row, matrix + g.q_row_offset(row0),
                     matrix + g.m_row_offset(row0), gguf_rows);
}

Split1Geometry MoeTileGeometry::gateup(uint32_t slot) const {
  return split1_geometry(is_shared(slot) ? shared_gateup_type : gateup_type, 2 * width(slot), n_embd);
}

Split1Geometry MoeTileGeometry::down(uint32_t slot) const {
  return split1_geometry(is_shared(slot) ? shared_down_type : down_type, n_embd, width(slot));
}

uint64_t MoeTileGeometry::gateup_at(uint32_t slot) const {
  return is_shared(slot) ? shared_gateup_offset : uint64_t(slot) * slot_stride;
}

uint64_t MoeTileGeometry::down_at(uint32_t slot) const {
  return is_shared(slot) ? shared_down_offset : uint64_t(slot) * slot_stride + down_offset;
}

const char* moe_part_name(MoePart p) {
  switch (p) {
    case MoePart::Gate: return "gate";
    case MoePart::Up: return "up";
    case MoePart::Down: return "down";
  }
  return "?";
}

void moe_tile_put_rows(const MoeTileGeometry& g, uint32_t slot, MoePart part, uint64_t row0, uint64_t n_rows,
                       const uint8_t* gguf_rows, uint8_t* tile, uint64_t tile_base) {
  if (part == MoePart::Down) {
    split1_put_rows(g.down(slot), row0, n_rows, gguf_rows, tile + (g.down_at(slot) - tile_base));
    return;
  }
  const Split1Geometry gu = g.gateup(slot);
  const uint64_t rb = gu.gguf_row_bytes(), parity = part == MoePart::Up ? 1 : 0;
  for (uint64_t i = 0; i < n_rows; ++i)
    split1_put_rows(gu, 2 * (row0 + i) + parity, 1, gguf_rows + i * rb, tile + (g.gateup_at(slot) - tile_base));
}

void moe_tile_get_rows(const MoeTileGeometry& g, const uint8_t* tile, uint32_t slot, MoePart part, uint64_t row0,
                       uint64_t n_rows, uint8_t* gguf_rows, uint64_t tile_base) {
  if (part == MoePart::Down) {
    split1_get_rows(g.down(slot), tile + (g.down_at(slot) - tile_base), row0, n_rows, gguf_rows);
    return;
  }
  const Split1Geometry gu = g.gateup(slot);
  const uint64_t rb = gu.gguf_row_bytes(), parity = part == MoePart::Up ? 1 : 0;
  for (uint64_t i = 0; i < n_rows; ++i)
    split1_get_rows(gu, tile + (g.gateup_at(slot) - tile_base), 2 * (row0 + i) + parity, 1, gguf_rows + i * rb);
}

namespace {

void check_type_for_tile(uint64_t id, const char* what) {
  const TypeInfo* ti = type_info(uint32_t(id));
  const bool ok = ti && id <= 0xffffffffu &&
                  (split1_block(GgmlType(id)) || id == uint32_t(GgmlType::F32) || id == uint32_t(GgmlType::F16) ||
                   id == uint32_t(GgmlType::BF16));
  if (!ok) bad_input("MOE_TILE1 layout: ", what, " type id ", id, " has no tile form");
}

}  // namespace

MoeTileGeometry moe_tile_geometry(uint32_t n_expert, uint64_t w_routed, uint64_t w_shared, uint64_t n_embd,
                                  GgmlType gateup_type, GgmlType down_type, GgmlType shared_gateup_type,
                                  GgmlType shared_down_type) {
  check_type_for_tile(uint64_t(gateup_type), "gate/up");
  check_type_for_tile(uint64_t(down_type), "down");
  check_type_for_tile(uint64_t(shared_gateup_type), "shared gate/up");
  check_type_for_tile(uint64_t(shared_down_type), "shared down");
  if (n_expert == 0 || w_routed == 0 || n_embd == 0)
    bad_input("MOE_TILE1 layout: experts ", n_expert, ", width ", w_routed, ", n_embd ", n_embd, " must all be positive");
  MoeTileGeometry g;
  g.n_expert = n_expert;
  g.w_routed = w_routed;
  g.w_shared = w_shared;
  g.n_embd = n_embd;
  g.gateup_type = gateup_type;
  g.down_type = down_type;
  g.shared_gateup_type = shared_gateup_type;
  g.shared_down_type = shared_down_type;
  g.down_offset = align_up(split1_geometry(gateup_type, 2 * w_routed, n_embd).total_bytes, kTsrTensorAlign);
  g.slot_stride = align_up(g.down_offset + split1_geometry(down_type, n_embd, w_routed).total_bytes, kTsrTensorAlign);
  g.shared_gateup_offset = uint64_t(n_expert) * g.slot_stride;
  if (w_shared == 0) {
    g.shared_down_offset = g.shared_gateup_offset;
    g.total_bytes = g.shared_gateup_offset;
    return g;
  }
  g.shared_down_offset =
      g.shared_gateup_offset + align_up(split1_geometry(shared_gateup_type, 2 * w_shared, n_embd).total_bytes, kTsrTensorAlign);
  g.total_bytes = g.shared_down_offset + split1_geometry(shared_down_type, n_embd, w_shared).total_bytes;
  return g;
}

std::array<uint64_t, 14> MoeTileGeometry::params() const {
  return {n_expert,
          w_routed,
          w_shared,
          n_embd,
          uint64_t(gateup_type),
          uint64_t(down_type),
          uint64_t(shared_gateup_type),
          uint64_t(shared_down_type),
          slot_stride,
          down_offset,
          shared_gateup_offset,
          shared_down_offset,
          0,
          0};
}

MoeTileGeometry MoeTileGeometry::from_params(const std::array<uint64_t, 14>& p, const char* origin, const char* tensor) {
  // Bounds that keep every offset computation far from 64-bit overflow (2^16 experts, 2^20 widths).
  if (p[0] == 0 || p[0] > (uint64_t(1) << 16) || p[1] > (uint64_t(1) << 20) || p[2] > (uint64_t(1) << 20) ||
      p[3] > (uint64_t(1) << 20))
    bad_input(origin, ": tensor '", tensor, "': MOE_TILE1 params out of range: experts ", p[0], ", widths ", p[1], "/",
              p[2], ", n_embd ", p[3]);
  for (int k : {4, 5, 6, 7})
    if (p[k] > 0xffffffffu || !type_info(uint32_t(p[k])))
      bad_input(origin, ": tensor '", tensor, "': MOE_TILE1 params[", k, "] = ", p[k], " is not a ggml type id");
  MoeTileGeometry g;
  try {
    g = moe_tile_geometry(uint32_t(p[0]), p[1], p[2], p[3], GgmlType(p[4]), GgmlType(p[5]), GgmlType(p[6]),
                          GgmlType(p[7]));
  } catch (const Error& e) {
    bad_input(origin, ": tensor '", tensor, "': ", e.what());
  }
  const std::array<uint64_t, 14> expect = g.params();
  static const char* kNames[14] = {"n_expert", "w_routed", "w_shared", "n_embd", "gateup_type", "down_type",
                                   "shared_gateup_type", "shared_down_type", "slot_stride", "down_offset",
                                   "shared_gateup_offset", "shared_down_offset", "reserved", "reserved"};
  for (int k = 0; k < 14; ++k)
    if (p[k] != expect[k])
      bad_input(origin, ": tensor '", tensor, "': MOE_TILE1 params[", k, "] (", kNames[k], ") is ", p[k],
                ", the layout gives ", expect[k]);
  return g;
}

}  // namespace tessera
