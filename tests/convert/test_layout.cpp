// SPLIT1 and MOE_TILE1 (docs/FORMAT.md §6): byte positions worked out by hand, round trips for
// every block type, tile offsets by hand and at GLM-4.7-Flash size.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "format/error.h"
#include "format/tsr.h"
#include "format/tsr_layout.h"

namespace tessera {
namespace {

const GgmlType kSplitTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

TEST(TsrSplit1, BlockTableMatchesTheFormatDoc) {
  // {type, quant bytes start, quant bytes, rest}: FORMAT.md §6.2.
  struct Row { GgmlType t; uint32_t q_start, q, m; };
  const Row rows[] = {{GgmlType::Q4_0, 2, 16, 2},    {GgmlType::Q4_1, 4, 16, 4},   {GgmlType::Q5_0, 6, 16, 6},
                      {GgmlType::Q5_1, 8, 16, 8},    {GgmlType::Q8_0, 2, 32, 2},   {GgmlType::Q4_K, 16, 128, 16},
                      {GgmlType::Q5_K, 48, 128, 48}, {GgmlType::Q6_K, 0, 128, 82}};
  for (const Row& r : rows) {
    const auto b = split1_block(r.t);
    ASSERT_TRUE(b) << type_name(r.t);
    EXPECT_EQ(b->block_bytes, type_info(r.t).block_bytes) << type_name(r.t);
    EXPECT_EQ(b->q_start, r.q_start) << type_name(r.t);
    EXPECT_EQ(b->q_bytes, r.q) << type_name(r.t);
    EXPECT_EQ(b->m_bytes(), r.m) << type_name(r.t);
    EXPECT_EQ(b->q_bytes % 16, 0u) << "quant entries must allow 16-byte loads";
  }
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_1}) EXPECT_FALSE(split1_block(t));
}

TEST(TsrSplit1, SplitsOneBlockIntoQuantBytesAndTheRestInOrder) {
  // Block bytes numbered 0..n-1: the Q part is the quant range, M the prefix then the suffix.
  for (GgmlType t : kSplitTypes) {
    const Split1Block b = *split1_block(t);
    std::vector<uint8_t> block(b.block_bytes);
    std::iota(block.begin(), block.end(), 0);
    std::vector<uint8_t> q(b.q_bytes), m(b.m_bytes()), back(b.block_bytes);
    split1_split_blocks(b, 1, block.data(), q.data(), m.data());
    for (uint32_t i = 0; i < b.q_bytes; ++i) ASSERT_EQ(q[i], b.q_start + i) << type_name(t);
    std::vector<uint8_t> rest;
    for (uint32_t i = 0; i < b.block_bytes; ++i)
      if (i < b.q_start || i >= b.q_start + b.q_bytes) rest.push_back(uint8_t(i));
    EXPECT_EQ(m, rest) << type_name(t);
    split1_join_blocks(b, 1, q.data(), m.data(), back.data());
    EXPECT_EQ(back, block) << type_name(t);
  }
  // Spot checks in words: Q4_0 = d | qs, Q6_K = ql | qh scales d.
  const Split1Block q40 = *split1_block(GgmlType::Q4_0);
  EXPECT_EQ(q40.q_start, 2u);
  const Split1Block q6k = *split1_block(GgmlType::Q6_K);
  EXPECT_EQ(q6k.q_start, 0u);
  EXPECT_EQ(q6k.m_bytes(), 64u + 16u + 2u);
}

TEST(TsrSplit1, GeometryByHand) {
  // 3 rows x 64 columns of Q4_0: 2 blocks per row, Q = 3*2*16 = 96 -> M at 256, 3*2*2 = 12 bytes.
  const Split1Geometry g = split1_geometry(GgmlType::Q4_0, 3, 64);
  EXPECT_EQ(g.blocks_per_row, 2u);
  EXPECT_EQ(g.q_bytes, 16u);
  EXPECT_EQ(g.m_bytes, 2u);
  EXPECT_EQ(g.m_offset, 256u);
  EXPECT_EQ(g.total_bytes, 268u);
  EXPECT_EQ(g.q_row_offset(2), 64u);
  EXPECT_EQ(g.m_row_offset(2), 256u + 8u);
  // Q6_K 2 x 512: Q = 2*2*128 = 512 (already aligned), M = 4*82.
  const Split1Geometry k = split1_geometry(GgmlType::Q6_K, 2, 512);
  EXPECT_EQ(k.m_offset, 512u);
  EXPECT_EQ(k.total_bytes, 512u + 4u * 82u);
  // Float types (inside tiles) are plain.
  const Split1Geometry f = split1_geometry(GgmlType::F16, 3, 5);
  EXPECT_TRUE(f.plain);
  EXPECT_EQ(f.total_bytes, 30u);
  EXPECT_THROW(split1_geometry(GgmlType::Q4_K, 2, 96), Error);   // 96 is not a multiple of 256
  EXPECT_THROW(split1_geometry(GgmlType::Q8_1, 2, 32), Error);   // no split form
}

TEST(TsrSplit1, RowsRoundTripAndLandWhereTheDocSays) {
  for (GgmlType t : kSplitTypes) {
    const uint32_t be = type_info(t).block_elems;
    const uint64_t rows = 5, cols = 3 * be;
    const Split1Geometry g = split1_geometry(t, rows, cols);
    const Split1Block b = *split1_block(t);
    const std::vector<uint8_t> gguf = random_bytes(rows * g.gguf_row_bytes(), 11);
    std::vector<uint8_t> image(g.total_bytes, 0xEE), back(gguf.size());
    split1_put_rows(g, 0, 2, gguf.data(), image.data());  // in two calls, out of order
    split1_put_rows(g, 2, 3, gguf.data() + 2 * g.gguf_row_bytes(), image.data());
    split1_get_rows(g, image.data(), 0, rows, back.data());
    EXPECT_EQ(back, gguf) << type_name(t);
    // block (r, b) = (3, 2): quant bytes at (r*nb + b)*qb, the rest at m_offset + (r*nb + b)*mb.
    const uint64_t k = 3 * 3 + 2;
    const uint8_t* blk = gguf.data() + k * b.block_bytes;
    EXPECT_EQ(0, std::memcmp(image.data() + k * b.q_bytes, blk + b.q_start, b.q_bytes)) << type_name(t);
    EXPECT_EQ(image[g.m_offset + k * b.m_bytes()], b.q_start ? blk[0] : blk[b.q_bytes]) << type_name(t);
  }
}

TEST(TsrMoeTile, GeometryByHand) {
  // E = 2 routed experts of width 32, shared width 64, n_embd 64; gate/up Q4_0, down Q8_0.
  const MoeTileGeometry g = moe_tile_geometry(2, 32, 64, 64, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q8_0);
  // gateup 64 x 64 Q4_0: Q = 64*2*16 = 2048, M = 64*2*2 = 256 -> 2304; down 64 x 32 Q8_0:
  // Q = 64*32 = 2048, M = 64*2 = 128 -> 2176; slot = align(2304 + 2176, 256) = 4608.
  EXPECT_EQ(g.down_offset, 2304u);
  EXPECT_EQ(g.slot_stride, 4608u);
  EXPECT_EQ(g.shared_gateup_offset, 9216u);
  // shared gateup 128 x 64 Q4_0: 4096 + 512 = 4608; shared down 64 x 64 Q8_0: 4096 + 256.
  EXPECT_EQ(g.shared_down_offset, 9216u + 4608u);
  EXPECT_EQ(g.total_bytes, 9216u + 4608u + 4352u);
  EXPECT_EQ(g.gateup_at(1), 4608u);
  EXPECT_EQ(g.down_at(1), 4608u + 2304u);
  EXPECT_EQ(g.down_at(2), g.shared_down_offset);
  EXPECT_EQ(g.slot_end(2), g.total_bytes);
  // params round trip; a changed offset is refused.
  auto p = g.params();
  EXPECT_EQ(MoeTileGeometry::from_params(p, "t", "x").total_bytes, g.total_bytes);
  p[9] += 256;
  EXPECT_THROW(MoeTileGeometry::from_params(p, "t", "x"), Error);
}

TEST(TsrMoeTile, GlmSizeEqualsTheGgufBytes) {
  // GLM-4.7-Flash Q4_0: every part is a whole number of 256-byte units, so the tile holds
  // exactly the bytes of the six GGUF expert tensors (gguf.md §10.1 shapes).
  const MoeTileGeometry g =
      moe_tile_geometry(64, 1536, 1536, 2048, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0, GgmlType::Q4_0);
  EXPECT_EQ(g.slot_stride, 5308416u);
  const uint64_t gguf = (3ull * 2048 * 1536 * 64 + 3ull * 2048 * 1536) / 32 * 18;
  EXPECT_EQ(g.total_bytes, gguf);
}

TEST(TsrMoeTile, PartsRoundTripAndGateUpInterleave) {
  const MoeTileGeometry g =
      moe_tile_geometry(3, 32, 64, 64, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::Q4_1);
  std::vector<uint8_t> tile(g.total_bytes, 0);
  for (uint32_t slot = 0; slot < g.n_slots(); ++slot) {
    const uint64_t w = g.width(slot);
    const uint64_t gate_rb = g.gateup(slot).gguf_row_bytes(), down_rb = g.down(slot).gguf_row_bytes();
    const auto gate = random_bytes(w * gate_rb, 100 + slot), up = random_bytes(w * gate_rb, 200 + slot);
    const auto down = random_bytes(g.n_embd * down_rb, 300 + slot);
    // Each slot built in its own buffer (as the converter does), then copied into the tile.
    std::vector<uint8_t> buf(g.slot_end(slot) - g.gateup_at(slot), 0);
    moe_tile_put_rows(g, slot, MoePart::Gate, 0, w, gate.data(), buf.data(), g.gateup_at(slot));
    moe_tile_put_rows(g, slot, MoePart::Up, 0, w, up.data(), buf.data(), g.gateup_at(slot));
    moe_tile_put_rows(g, slot, MoePart::Down, 0, g.n_embd, down.data(), buf.data(), g.gateup_at(slot));
    std::copy(buf.begin(), buf.end(), tile.begin() + int64_t(g.gateup_at(slot)));
    std::vector<uint8_t> back_gate(gate.size()), back_up(up.size()), back_down(down.size()), row(gate_rb);
    moe_tile_get_rows(g, tile.data(), slot, MoePart::Gate, 0, w, back_gate.data());
    moe_tile_get_rows(g, tile.data(), slot, MoePart::Up, 0, w, back_up.data());
    moe_tile_get_rows(g, tile.data(), slot, MoePart::Down, 0, g.n_embd, back_down.data());
    EXPECT_EQ(back_gate, gate) << slot;
    EXPECT_EQ(back_up, up) << slot;
    EXPECT_EQ(back_down, down) << slot;
    // gateup row 5 is up row 2.
    split1_get_rows(g.gateup(slot), tile.data() + g.gateup_at(slot), 5, 1, row.data());
    EXPECT_EQ(0, std::memcmp(row.data(), up.data() + 2 * gate_rb, gate_rb)) << slot;
  }
}

TEST(TsrEntry, BuildersFillParamsAndRefuseBadShapes) {
  const uint64_t ne[3] = {64, 3, 2};
  const TsrTensor s = TsrTensor::split1("w", GgmlType::Q8_0, ne, 0);
  EXPECT_EQ(s.params[0], 6u);  // rows = 3 * 2
  EXPECT_EQ(s.params[1], 64u);
  EXPECT_EQ(s.params[5], s.split1().m_offset);
  EXPECT_EQ(s.nbytes, s.split1().total_bytes);
  const TsrTensor p = TsrTensor::plain("n", GgmlType::F32, ne, 0);
  EXPECT_EQ(p.nbytes, 64u * 6u * 4u);
  const uint64_t bad[2] = {48, 2};
  EXPECT_THROW(TsrTensor::split1("b", GgmlType::Q4_0, bad, 0), Error);
  EXPECT_THROW(TsrTensor::split1("f", GgmlType::F32, ne, 0), Error);
  EXPECT_THROW(TsrTensor::plain(std::string(64, 'x'), GgmlType::F32, ne, 0), Error);
}

TEST(TsrEntry, PaddingRanges) {
  // 3 x 64 Q4_0: region Q ends at 96, region M starts at 256.
  const uint64_t ne[2] = {64, 3};
  const auto p = TsrTensor::split1("w", GgmlType::Q4_0, ne, 0).padding();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].offset, 96u);
  EXPECT_EQ(p[0].size, 160u);
  EXPECT_TRUE(TsrTensor::plain("n", GgmlType::F32, ne, 0).padding().empty());
  // The hand-computed tile of TsrMoeTile.GeometryByHand: each routed slot ends with 128 bytes of
  // padding after its down part (4480 -> 4608); the shared slot has none.
  const MoeTileGeometry g = moe_tile_geometry(2, 32, 64, 64, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q8_0);
  const auto t = TsrTensor::moe_tile("tile", g, 1).padding();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].offset, 4480u);
  EXPECT_EQ(t[0].size, 128u);
  EXPECT_EQ(t[1].offset, 4608u + 4480u);
}

}  // namespace
}  // namespace tessera
