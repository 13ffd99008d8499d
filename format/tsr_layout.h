// The GPU weight layouts of the .tsr format (docs/FORMAT.md §6) as plain functions: SPLIT1
// ("split rows": quant bytes and scale bytes of the blocks in two separate regions) and
// MOE_TILE1 (all experts of a MoE block, routed and shared, as slots of [gateup][down]).
// Used by the writer (convert/), the readers (runtime/cpu/tsr_weights, the Vulkan loader) and
// by kernel tests that need SPLIT1 bytes from GGUF bytes.
#pragma once
#include <array>
#include <cstdint>
#include <optional>

#include "format/quant.h"

namespace tessera {

// Layout ids stored in a directory entry (FORMAT.md §6). An id never changes meaning.
enum class TsrLayout : uint32_t {
  Plain = 0,     // the GGUF bytes unchanged
  Split1 = 1,    // quant bytes | align 256 | remaining block bytes
  MoeTile1 = 2,  // one tensor per MoE block: E routed slots + 1 shared slot
};
// "plain", "split1", "moe_tile1"; "?" for an unknown id.
const char* layout_name(TsrLayout l);

inline constexpr uint64_t kTsrTensorAlign = 256;  // every tensor / tile part starts at a multiple
inline constexpr uint64_t kTsrGroupAlign = 4096;  // every decoder block starts at a multiple

inline constexpr uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Where a block type's quant bytes sit inside its GGUF block (FORMAT.md §6.2 table).
struct Split1Block {
  uint32_t block_bytes;  // GGUF block size (18 for Q4_0)
  uint32_t block_elems;  // elements per block (32 or 256)
  uint32_t q_start;      // offset of the quant bytes inside the GGUF block
  uint32_t q_bytes;      // quant bytes per block (16, 32 or 128)
  uint32_t m_bytes() const { return block_bytes - q_bytes; }  // the rest (d, m, qh, scales)
};
// The split of a block type, or nullopt for a type without one (F32/F16/BF16, unreadable types).
std::optional<Split1Block> split1_block(GgmlType t);

// Cut n consecutive GGUF blocks into their quant bytes (q_out, n*q_bytes) and the rest
// (m_out, n*m_bytes), both in block order. Buffers must not overlap.
void split1_split_blocks(const Split1Block& b, uint64_t n_blocks, const uint8_t* gguf, uint8_t* q_out, uint8_t* m_out);
// Inverse of split1_split_blocks: rebuild n GGUF blocks (n*block_bytes) from the two regions.
void split1_join_blocks(const Split1Block& b, uint64_t n_blocks, const uint8_t* q_in, const uint8_t* m_in, uint8_t* gguf);

// One matrix of `rows` x `cols` elements laid out SPLIT1. For a float type (F32/F16/BF16,
// allowed only inside tiles) the matrix is plain: region Q = all row bytes, no region M.
struct Split1Geometry {
  GgmlType type = GgmlType::F32;
  uint64_t rows = 0, cols = 0;
  uint64_t blocks_per_row = 0;  // nb = cols / block_elems (cols for a float type)
  uint64_t q_bytes = 0;         // region Q bytes per block (the element size for a float type)
  uint64_t m_bytes = 0;         // region M bytes per block (0 for a float type)
  uint64_t m_offset = 0;        // start of region M = align(rows*nb*q_bytes, 256)
  uint64_t total_bytes = 0;     // m_offset + rows*nb*m_bytes (unpadded)
  bool plain = false;           // float type: plain row-major bytes

  uint64_t gguf_row_bytes() const;  // bytes of one row in GGUF layout
  // Byte offsets (from the matrix start) of row r's first quant bytes / first M bytes.
  uint64_t q_row_offset(uint64_t r) const { return r * blocks_per_row * q_bytes; }
  uint64_t m_row_offset(uint64_t r) const { return m_offset + r * blocks_per_row * m_bytes; }
};
// Geometry of a SPLIT1 matrix. Throws Error(BadInput) if the type has no split form (and is not
// a float type), or cols is not a multiple of the type's block.
Split1Geometry split1_geometry(GgmlType t, uint64_t rows, uint64_t cols);

// Write GGUF rows [row0, row0+n_rows) (n_rows * gguf_row_bytes() bytes) into a SPLIT1 image
// `matrix` (total_bytes long, starts at the matrix's first byte).
void split1_put_rows(const Split1Geometry& g, uint64_t row0, uint64_t n_rows, const uint8_t* gguf_rows, uint8_t* matrix);
// Read rows [row0, row0+n_rows) of a SPLIT1 image back into GGUF bytes.
void split1_get_rows(const Split1Geometry& g, const uint8_t* matrix, uint64_t row0, uint64_t n_rows, uint8_t* gguf_rows);

// MOE_TILE1 (FORMAT.md §6.3): slot e < E = routed expert e, slot E = the shared expert(s) as one
// expert of width w_shared. A slot = [gateup: 2w x n_embd, rows 2i gate / 2i+1 up][down: n_embd x w].
struct MoeTileGeometry {
  uint32_t n_expert = 0;     // E routed experts
  uint64_t w_routed = 0;     // n_ff_exp
  uint64_t w_shared = 0;     // S * n_ff_exp (0: no shared slot)
  uint64_t n_embd = 0;
  GgmlType gateup_type = GgmlType::F32, down_type = GgmlType::F32;                // routed
  GgmlType shared_gateup_type = GgmlType::F32, shared_down_type = GgmlType::F32;  // shared
  uint64_t slot_stride = 0;           // routed slot e starts at e * slot_stride
  uint64_t down_offset = 0;           // down part inside a routed slot
  uint64_t shared_gateup_offset = 0;  // from the tile start
  uint64_t shared_down_offset = 0;    // from the tile start
  uint64_t total_bytes = 0;           // tile bytes (unpadded)

  bool has_shared() const { return w_shared > 0; }
  uint32_t n_slots() const { return n_expert + (has_shared() ? 1 : 0); }
  bool is_shared(uint32_t slot) const { return slot == n_expert; }
  uint64_t width(uint32_t slot) const { return is_shared(slot) ? w_shared : w_routed; }
  // Geometry of a slot's parts, and where they start in the tile.
  Split1Geometry gateup(uint32_t slot) const;  // 2w rows x n_embd cols
  Split1Geometry down(uint32_t slot) const;    // n_embd rows x w cols
  uint64_t gateup_at(uint32_t slot) const;
  uint64_t down_at(uint32_t slot) const;
  // End of a slot's bytes incl. padding: the next slot's start, or the tile's end. A slot is
  // the span [gateup_at(slot), slot_end(slot)).
  uint64_t slot_end(uint32_t slot) const { return is_shared(slot) ? total_bytes : uint64_t(slot + 1) * slot_stride; }

  // Directory params[0..11] (FORMAT.md §6.3 table), and back. from_params validates.
  std::array<uint64_t, 14> params() const;
  static MoeTileGeometry from_params(const std::array<uint64_t, 14>& p, const char* origin, const char* tensor);
};
// The three matrices a tile slot holds, in GGUF terms: gate (w x n_embd), up (w x n_embd),
// down (n_embd x w).
enum class MoePart { Gate, Up, Down };
const char* moe_part_name(MoePart p);  // "gate", "up", "down"

// Write GGUF rows [row0, row0+n_rows) of one part of slot `slot` into the tile image `tile`
// (the whole tile, total_bytes long); gate row i lands on gateup row 2i, up row i on 2i+1.
// `tile` points at tile byte `tile_base` (a buffer holding only part of the tile, e.g. one slot).
void moe_tile_put_rows(const MoeTileGeometry& g, uint32_t slot, MoePart part, uint64_t row0, uint64_t n_rows,
                       const uint8_t* gguf_rows, uint8_t* tile, uint64_t tile_base = 0);
// Read rows of one part of slot `slot` back into GGUF bytes (the inverse of moe_tile_put_rows).
void moe_tile_get_rows(const MoeTileGeometry& g, const uint8_t* tile, uint32_t slot, MoePart part, uint64_t row0,
                       uint64_t n_rows, uint8_t* gguf_rows, uint64_t tile_base = 0);

// Computes every offset from the widths and types (FORMAT.md §6.3 formulas). Throws
// Error(BadInput) for a type without a SPLIT1 form or widths not fitting a type's block.
MoeTileGeometry moe_tile_geometry(uint32_t n_expert, uint64_t w_routed, uint64_t w_shared, uint64_t n_embd,
                                  GgmlType gateup_type, GgmlType down_type, GgmlType shared_gateup_type,
                                  GgmlType shared_down_type);

}  // namespace tessera
