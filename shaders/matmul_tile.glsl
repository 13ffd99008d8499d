// The tiles of the matmul kernels (matmul.comp: dense matrices; moe_matmul.comp: the FFN's slots):
// a workgroup of TG groups of 32 lanes stages BM = 16 MR rows of W and 16 TG input rows per step of
// KT columns in shared memory as f16, each group multiplies them into MR 16 x 16 f32 accumulator
// tiles (its 16 input rows), and the tiles leave through shared memory.
//
//   sh (uvec4, 8 f16 per element): W rows 0 .. BM, then input rows from B0, each KT + 8 values
//   (RS uvec4: 16 bytes of padding per row against bank conflicts); after the last step the
//   groups' accumulator tiles as f32, row-major 16 x 16 (64 uvec4 each), group g's from
//   g * MR * 64. The cooperative-matrix loads and stores take sh with offsets and strides in uvec4.
//
// COOP 1: VK_NV_cooperative_matrix 16 x 16 x 16 f16 products with f32 sums. COOP 0: the same with
// plain FMAs, lane l of a group holding the elements l + 32 i (i < 8) of each tile: row
// (l + 32 i) % 16, input row (l + 32 i) / 16 (the tests' path where no tensor cores are).
//
// The including kernel defines WTYPE, MR (1, 2, 4; moe_matmul.comp also 8), TG (1, 2, 4), KT and COOP, includes
// weights.glsl, and declares its workgroup as WG_SIZE = 32 TG invocations. ACC_DONT_UNROLL (0/1):
// acc_step's slices of 16 columns as a loop the compiler keeps (fewer live registers). RSPLIT (1
// or 2, moe_matmul.comp): the groups split the row tiles too: PG = TG / RSPLIT groups of 16 input
// rows, group g taking input rows 16 (g % PG) .. and the MRL = MR / RSPLIT row tiles from
// (g / PG) MRL (fewer accumulators per group; with RSPLIT 1 each group takes all MR).
#ifndef TESSERA_MATMUL_TILE_GLSL
#define TESSERA_MATMUL_TILE_GLSL

#if WTYPE == TS_TYPE_Q4_K || WTYPE == TS_TYPE_Q5_K
#define UNIT_SPAN 64   // units 2c, 2c + 1 fill columns 64c .. 64c + 64 of their block
#elif WTYPE == TS_TYPE_Q6_K
#define UNIT_SPAN 128  // units 4n .. 4n + 3 fill columns 128n .. 128n + 128
#else
#define UNIT_SPAN 32
#endif
#if KT % UNIT_SPAN != 0
#error "matmul_tile.glsl: KT holds whole unit spans"
#endif
#if (MR != 1 && MR != 2 && MR != 4 && MR != 8) || (TG != 1 && TG != 2 && TG != 4)
#error "matmul_tile.glsl: MR is 1, 2, 4 or 8, TG 1, 2 or 4"
#endif
#ifndef RSPLIT
#define RSPLIT 1
#endif
#if (RSPLIT != 1 && RSPLIT != 2) || TG % RSPLIT != 0 || MR % RSPLIT != 0
#error "matmul_tile.glsl: RSPLIT is 1 or 2 and divides TG and MR"
#endif
#define PG (TG / RSPLIT)   // groups of 16 input rows
#define MRL (MR / RSPLIT)  // row tiles per group
#if COOP && (!USE_SUBGROUP || SUBGROUP_SIZE != 32)
#error "matmul_tile.glsl: COOP needs subgroups of 32"
#endif

#define BM (16 * MR)
#define RS (KT / 8 + 1)  // row stride of the staged tiles in uvec4 (KT + 8 f16)
#define UNITS_PER_ROW (KT / 32)
#define B0 (BM * RS)     // sh index of the first input row
#define MAX_(a, b) ((a) > (b) ? (a) : (b))

shared uvec4 sh[MAX_((BM + 16 * PG) * RS, TG * MRL * 64)];

// 8 values as 8 f16 in a uvec4.
uvec4 pack8(float v0, float v1, float v2, float v3, float v4, float v5, float v6, float v7) {
  return uvec4(packHalf2x16(vec2(v0, v1)), packHalf2x16(vec2(v2, v3)), packHalf2x16(vec2(v4, v5)), packHalf2x16(vec2(v6, v7)));
}
#define PACK8(a, o) pack8(a[o], a[o + 1], a[o + 2], a[o + 3], a[o + 4], a[o + 5], a[o + 6], a[o + 7])

// Unit ju of staged W row r (32 columns from k0 + 32 ju) as zeros.
void stage_zero_unit(uint r, uint ju) {
  [[unroll]] for (uint i = 0; i < 4; ++i) sh[r * uint(RS) + 4u * ju + i] = uvec4(0u);
}

#if W_PLAIN
// Unit ju of staged W row r: the 32 plain values from element e0 of the weight binding.
void stage_plain_unit(uint r, uint ju, uint e0) {
  if (e0 % 8u == 0u) {
    float v[8];
    [[unroll]] for (uint g = 0; g < 4; ++g) {
      plain_vec8(e0 / 8u + g, v);
      sh[r * uint(RS) + 4u * ju + g] = PACK8(v, 0);
    }
  } else {
    [[unroll]] for (uint g = 0; g < 4; ++g) {
      const uint e = e0 + 8u * g;
      sh[r * uint(RS) + 4u * ju + g] = pack8(plain_value(e), plain_value(e + 1u), plain_value(e + 2u), plain_value(e + 3u),
                                             plain_value(e + 4u), plain_value(e + 5u), plain_value(e + 6u), plain_value(e + 7u));
    }
  }
}
#else
// The SPLIT1 entry (row * blocks per row + block) and unit of the unit at column k of row `wrow`
// of a matrix with `cols` columns.
uvec2 block_unit_at(uint wrow, uint cols, uint k) {
  return uvec2(wrow * (cols / uint(W_BLOCK)) + k / uint(W_BLOCK), (k % uint(W_BLOCK)) / 32u);
}

// The words of the unit at column k of row `wrow` of the SPLIT1 matrix at (qbase, mbase) with
// `cols` columns, as loaded (split1_raw): a kernel may load a later step's units before it stages
// the current ones.
W1Raw load_raw_unit(uint qbase, uint mbase, uint wrow, uint cols, uint k) {
  const uvec2 eu = block_unit_at(wrow, cols, k);
  return split1_raw(qbase, mbase, eu.x, eu.y);
}

// Unit ju of staged W row r, the step at column k0, from `raw` (load_raw_unit of row `wrow`, column
// k0 + 32 ju): its 32 values land at the block's offsets split1_decode reports (multiples of 16,
// inside the step: it holds whole unit spans).
void stage_raw_unit(uint r, uint ju, uint k0, uint wrow, uint cols, W1Raw raw) {
  const uint k = k0 + 32u * ju;
  const uvec2 eu = block_unit_at(wrow, cols, k);
  float lo[16], hi[16];
  uint off_lo, off_hi;
  split1_decode(raw, eu.x, eu.y, lo, hi, off_lo, off_hi);
  const uint block0 = k - k % uint(W_BLOCK);  // the block's first column
  const uint at_lo = r * uint(RS) + (block0 + off_lo - k0) / 8u, at_hi = r * uint(RS) + (block0 + off_hi - k0) / 8u;
  sh[at_lo] = PACK8(lo, 0);
  sh[at_lo + 1u] = PACK8(lo, 8);
  sh[at_hi] = PACK8(hi, 0);
  sh[at_hi + 1u] = PACK8(hi, 8);
}

// The same, loaded and staged at once.
void stage_block_unit(uint r, uint ju, uint qbase, uint mbase, uint wrow, uint cols, uint k0) {
  stage_raw_unit(r, ju, k0, wrow, cols, load_raw_unit(qbase, mbase, wrow, cols, k0 + 32u * ju));
}
#endif

#if COOP
#define MATMUL_ACC(name) fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> name[MRL]
#else
#define MATMUL_ACC(name) float name[MRL][8]
// f16 value k of staged row `row` (W rows from 0, input rows from BM).
float sh_value(uint row, uint k) { return unpackHalf2x16(sh[row * uint(RS) + k / 8u][(k % 8u) / 2u] >> ((k & 1u) * 16u)).x; }
#endif

void acc_zero(out MATMUL_ACC(acc)) {
#if COOP
  [[unroll]] for (uint i = 0; i < MRL; ++i) acc[i] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
#else
  [[unroll]] for (uint i = 0; i < MRL; ++i) {
    [[unroll]] for (uint q = 0; q < 8; ++q) acc[i][q] = 0.0;
  }
#endif
}

// acc[m] += W rows 16 (m0 + m) .. (staged; m0 = (grp / PG) MRL) x input rows 16 (grp % PG) ..,
// over the step's first nk slices of 16 columns. After a barrier that follows the staging.
#ifndef ACC_DONT_UNROLL
#define ACC_DONT_UNROLL 0
#endif
void acc_step(uint nk, uint grp, uint lane, inout MATMUL_ACC(acc)) {
  const uint pg = grp % uint(PG), m0 = grp / uint(PG) * uint(MRL);
#if ACC_DONT_UNROLL
  [[dont_unroll]]
#endif
  for (uint kk = 0; kk < nk; ++kk) {
#if COOP
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b;
    coopMatLoadNV(b, sh, B0 + 16u * pg * uint(RS) + 2u * kk, uint(RS), true);
    [[unroll]] for (uint m = 0; m < MRL; ++m) {
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
      coopMatLoadNV(a, sh, 16u * (m0 + m) * uint(RS) + 2u * kk, uint(RS), false);
      acc[m] = coopMatMulAddNV(a, b, acc[m]);
    }
#else
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      const uint r = (lane + 32u * i) % 16u, t = (lane + 32u * i) / 16u;
      [[unroll]] for (uint m = 0; m < MRL; ++m) {
        float s = acc[m][i];
        for (uint q = 0; q < 16u; ++q) s += sh_value(16u * (m0 + m) + r, 16u * kk + q) * sh_value(BM + 16u * pg + t, 16u * kk + q);
        acc[m][i] = s;
      }
    }
#endif
  }
}

// Group grp's tiles as f32 into sh (after the last step's barrier); read them back with
// acc_value after a barrier.
void acc_store(uint grp, uint lane, MATMUL_ACC(acc)) {
  const uint cb = grp * uint(MRL) * 64u;
#if COOP
  [[unroll]] for (uint m = 0; m < MRL; ++m) coopMatStoreNV(acc[m], sh, cb + 64u * m, 4u, false);
#else
  [[unroll]] for (uint m = 0; m < MRL; ++m) {
    [[unroll]] for (uint i = 0; i < 8; ++i) {
      const uint e = lane + 32u * i, f = (e % 16u) * 16u + e / 16u;  // row-major index of (row, input row)
      sh[cb + 64u * m + f / 4u][f % 4u] = floatBitsToUint(acc[m][i]);
    }
  }
#endif
}

// Element (row r, input row t) of group grp's tile m (of its MRL).
float acc_value(uint grp, uint m, uint r, uint t) {
  const uint f = r * 16u + t;
  return uintBitsToFloat(sh[grp * uint(MRL) * 64u + 64u * m + f / 4u][f % 4u]);
}

#endif  // TESSERA_MATMUL_TILE_GLSL
